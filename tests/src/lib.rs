//! Support for the workspace-level tests and benchmarks: locating the `ipkeep` binary and
//! Debian's reference plugins, running a plugin process with a CNI environment, and throwaway
//! network namespaces that are removed even when a test fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

/// Where Debian's `containernetworking-plugins` installs the reference plugins.
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";

/// The `ipkeep` binary of the profile this test was built with (`IPKEEP_BIN` overrides). It is
/// built on first use if `cargo test` has not built it already.
pub fn ipkeep_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("ipkeep", "IPKEEP_BIN", &["ipkeep-cni"]))
        .clone()
}

/// The `ipkeep-agent` binary, like [`ipkeep_bin`] (`IPKEEP_AGENT_BIN` overrides).
pub fn agent_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("ipkeep-agent", "IPKEEP_AGENT_BIN", &["ipkeep-agent"]))
        .clone()
}

/// The `ipkeep-demo` binary (`IPKEEP_DEMO_BIN` overrides), built together with every binary it
/// starts, so none of them is stale.
pub fn demo_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        workspace_bin(
            "ipkeep-demo",
            "IPKEEP_DEMO_BIN",
            &[
                "ipkeep-e2e",
                "ipkeep-cni",
                "ipkeep-agent",
                "ipkeep-controller",
                "ipkeep-scheduler-ext",
            ],
        )
    })
    .clone()
}

/// Builds `packages`' binaries (so none is stale) with the profile this test runs under, and
/// returns the path of `name`; `override_var` names a variable that overrides the path.
pub fn workspace_bin(name: &str, override_var: &str, packages: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(override_var) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> → target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join(name);
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--bins"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    if release {
        cmd.arg("--release");
    }
    // Cargo sets these for the test process only. Passed on, they make this build differ from
    // the one scripts/test.sh ran (ring's build script reruns when CARGO_MANIFEST_DIR changes),
    // and half the tree would be rebuilt here and again by the next plain cargo command.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let per_test = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
            || key == "CARGO_PRIMARY_PACKAGE"
            || key == "CARGO_TARGET_TMPDIR";
        if per_test {
            cmd.env_remove(key.as_ref());
        }
    }
    let status = cmd.status().expect("run cargo build for an ipkeep binary");
    assert!(status.success(), "cargo build of {name} failed");
    assert!(bin.exists(), "{} missing after build", bin.display());
    bin
}

/// Names the directory of the reference plugins the differential suite and the plugin
/// benchmark compare ipkeep with, instead of Debian's (`scripts/runtime-build.sh` builds the
/// current release's: `DIR/cni`).
pub const REFERENCE_CNI_DIR_VAR: &str = "IPKEEP_REFERENCE_CNI_DIR";

/// A reference plugin from [`REFERENCE_CNI_DIR_VAR`] or Debian, or `None` (with a loud message)
/// when it is not installed. Under CI (`CI` set) a missing plugin is a failure, never a silent
/// skip.
pub fn reference_plugin(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(REFERENCE_CNI_DIR_VAR)
        .map_or_else(|| PathBuf::from(DEBIAN_CNI_DIR), PathBuf::from);
    let path = dir.join(name);
    if path.exists() {
        return Some(path);
    }
    let msg = format!(
        "SKIPPED: {} not found; install Debian's containernetworking-plugins (scripts/install-deps.sh) or build them (scripts/runtime-build.sh, {REFERENCE_CNI_DIR_VAR})",
        path.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{msg}");
    eprintln!("{msg}");
    None
}

/// Whether this process can create network namespaces. Under CI, not being root is a failure.
pub fn require_root(test: &str) -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    let msg = format!("SKIPPED (needs root for network namespaces): {test}");
    assert!(std::env::var_os("CI").is_none(), "{msg}");
    eprintln!("{msg}");
    false
}

/// One CNI invocation.
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    /// `CNI_COMMAND`.
    pub command: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
    /// `CNI_ARGS`.
    pub args: &'a str,
    /// `CNI_NETNS`.
    pub netns: &'a str,
    /// `CNI_PATH`.
    pub path: &'a str,
}

impl<'a> Invocation<'a> {
    /// An invocation with the usual defaults (`eth0`, a dummy netns path).
    pub fn new(command: &'a str, container_id: &'a str) -> Self {
        Invocation {
            command,
            container_id,
            ifname: "eth0",
            args: "",
            netns: "/var/run/netns/ipkeep-test-dummy",
            path: DEBIAN_CNI_DIR,
        }
    }

    /// The same invocation with `CNI_ARGS`.
    pub fn args(mut self, args: &'a str) -> Self {
        self.args = args;
        self
    }

    /// The same invocation on another interface.
    pub fn ifname(mut self, ifname: &'a str) -> Self {
        self.ifname = ifname;
        self
    }

    /// Builds the process (stdin piped) without starting it.
    pub fn command(&self, plugin: &Path) -> Command {
        self.command_in(&[], plugin)
    }

    /// Like [`Self::command`], run through `prefix` (e.g. [`mountns::MountNs::prefix`]).
    pub fn command_in(&self, prefix: &[String], plugin: &Path) -> Command {
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(plugin);
                cmd
            }
            None => Command::new(plugin),
        };
        cmd.env_clear()
            .env("CNI_COMMAND", self.command)
            .env("CNI_CONTAINERID", self.container_id)
            .env("CNI_IFNAME", self.ifname)
            .env("CNI_NETNS", self.netns)
            .env("CNI_PATH", self.path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !self.args.is_empty() {
            cmd.env("CNI_ARGS", self.args);
        }
        cmd
    }

    /// Starts the plugin and writes `config` to its stdin. In a `*_via_agent` test binary,
    /// `ipkeep` is pointed at the shared agent (see [`via_agent`]).
    pub fn spawn(&self, plugin: &Path, config: &str) -> Child {
        let config = if via_agent() && plugin == ipkeep_bin() {
            let agent = agent::for_data_dir(&data_dir_of(config));
            with_agent_socket(config, agent.socket())
        } else {
            config.to_string()
        };
        let mut child = self.command(plugin).spawn().expect("spawn plugin");
        let mut stdin = child.stdin.take().expect("stdin");
        // A plugin that exits early (bad env) may close stdin first; that is its answer.
        let _ = stdin.write_all(config.as_bytes());
        drop(stdin);
        child
    }

    /// Runs the plugin to completion.
    pub fn run(&self, plugin: &Path, config: &str) -> PluginOutput {
        PluginOutput::from(self.spawn(plugin, config).wait_with_output().expect("wait"))
    }
}

/// A finished plugin process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOutput {
    /// Exit code (`None` if killed by a signal).
    pub code: Option<i32>,
    /// Stdout as text.
    pub stdout: String,
    /// Stderr as text.
    pub stderr: String,
}

impl From<Output> for PluginOutput {
    fn from(o: Output) -> Self {
        PluginOutput {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl PluginOutput {
    /// Whether the plugin exited 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Stdout as JSON (panics with the output when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// The addresses of a success result (any version's shape), without prefix.
    pub fn ips(&self) -> Vec<String> {
        let json = self.json();
        let mut out: Vec<String> = json["ips"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["address"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        for key in ["ip4", "ip6"] {
            if let Some(ip) = json[key]["ip"].as_str() {
                out.push(ip.to_string());
            }
        }
        out.into_iter()
            .map(|a| a.split('/').next().unwrap_or_default().to_string())
            .collect()
    }

    /// The CNI error code of a failure.
    pub fn error_code(&self) -> Option<u64> {
        serde_json::from_str::<serde_json::Value>(&self.stdout)
            .ok()?
            .get("code")?
            .as_u64()
    }
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

/// Runs a command and panics with its output when it fails.
pub fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Netns {
    /// Creates `ip netns add <name>` (removing a stale one left by a crashed run).
    pub fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh("ip", &["netns", "add", name]);
        sh("ip", &["-n", name, "link", "set", "lo", "up"]);
        Netns {
            name: name.to_string(),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path runtimes pass as `CNI_NETNS`.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .expect("ip netns exec")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A small deterministic PRNG (xorshift64*) so stress tests can print and replay their seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from `IPKEEP_TEST_SEED` or the clock; the seed is printed.
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var("IPKEEP_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            })
            | 1;
        eprintln!("{test}: IPKEEP_TEST_SEED={seed}");
        Rng(seed)
    }

    /// Next number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// The `ipam.dataDir` a configuration names (the default when it names none or is broken).
pub fn data_dir_of(config: &str) -> PathBuf {
    serde_json::from_str::<serde_json::Value>(config)
        .ok()
        .and_then(|v| v.get("ipam")?.get("dataDir")?.as_str().map(PathBuf::from))
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/var/lib/cni/ipkeep"))
}

/// `ipkeep` run by hand (admin subcommands) on `data_dir`: through its agent in a `*_via_agent`
/// test binary, directly otherwise.
pub fn admin_command(data_dir: &Path) -> Command {
    let mut cmd = Command::new(ipkeep_bin());
    cmd.arg("--agent-socket");
    if via_agent() {
        cmd.arg(agent::for_data_dir(data_dir).socket());
    } else {
        cmd.arg("");
    }
    cmd
}

/// Whether this test binary runs its suite through the node agent: the `differential` and
/// `retention` suites are compiled a second time as `*_via_agent` targets (see Cargo.toml),
/// and then every `ipkeep` invocation and admin command goes through the agent of its data
/// directory. Both paths must give the same answers.
pub fn via_agent() -> bool {
    static VIA: OnceLock<bool> = OnceLock::new();
    *VIA.get_or_init(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .is_some_and(|n| n.contains("_via_agent"))
    })
}

/// `config` with `ipam.agentSocket` set to `socket` (unchanged when it is not a JSON object with
/// an `ipam` object: broken configurations are tested as they are).
pub fn with_agent_socket(config: &str, socket: &Path) -> String {
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(config) else {
        return config.to_string();
    };
    match value.get_mut("ipam").and_then(|i| i.as_object_mut()) {
        Some(ipam) => {
            ipam.insert("agentSocket".into(), socket.display().to_string().into());
            value.to_string()
        }
        None => config.to_string(),
    }
}

/// Reads `ipkeep list --json` for a network.
pub fn list_json(data_dir: &Path, network: &str) -> serde_json::Value {
    let out = admin_command(data_dir)
        .args(["list", "--json", "--network", network, "--data-dir"])
        .arg(data_dir)
        .output()
        .expect("ipkeep list");
    assert!(
        out.status.success(),
        "ipkeep list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("list JSON")
}

/// A loopback port nobody listens on now, below the kernel's ephemeral range (where an
/// outgoing connection could take it first); each call moves on from the last.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = (std::process::id() * 7) % 10_000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 10_000, "no free port between 22000 and 32000");
        let port = u16::try_from(22_000 + (base + n) % 10_000).expect("a port");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// 127.0.0.1 with a [`free_port`].
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
}

pub mod agent;
pub mod apiserver;
pub mod bench;
pub mod cluster;
pub mod demo;
pub mod faults;
pub mod helm;
pub mod kubectl;
pub mod loose_crd;
pub mod mountns;
pub mod pki;
pub mod prometheus;
pub mod promql;
pub mod store;
pub mod workload;
