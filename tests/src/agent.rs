//! Running the real `ipkeep-agent` for tests: started without Kubernetes unless told
//! otherwise, on a private socket, stopped when dropped (or, for the shared one, when the test
//! process exits: the agent stops when its stdin closes).

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::agent_bin;

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    child: Child,
    // Held open: the agent stops when it closes.
    _stdin: ChildStdin,
    socket: PathBuf,
    data_dir: PathBuf,
    options: AgentOptions,
    probe: Option<std::net::SocketAddr>,
    log: std::sync::Arc<Mutex<Vec<String>>>,
    _dir: Option<tempfile::TempDir>,
}

/// How to start an agent.
#[derive(Debug, Default, Clone)]
pub struct AgentOptions {
    /// Extra flags (e.g. `--node-name n1`, grace periods). Without `--node-name`, the agent
    /// runs with `--no-kubernetes --node-name test`.
    pub args: Vec<String>,
    /// Extra environment (e.g. `KUBECONFIG`).
    pub envs: Vec<(String, String)>,
    /// Run through this command prefix (e.g. `nsenter` into a mount namespace).
    pub prefix: Vec<String>,
}

impl AgentOptions {
    /// An agent of node `node` that watches the API server of `kubeconfig`, sweeping every
    /// second, with a release grace of a second and a missed-DEL grace of `missed_del_grace`.
    pub fn kubernetes(kubeconfig: &Path, node: &str, missed_del_grace: &str) -> AgentOptions {
        AgentOptions {
            args: [
                "--node-name",
                node,
                "--sweep-interval",
                "1s",
                "--release-grace",
                "1s",
                "--missed-del-grace",
                missed_del_grace,
            ]
            .map(String::from)
            .to_vec(),
            envs: vec![("KUBECONFIG".into(), kubeconfig.display().to_string())],
            prefix: Vec::new(),
        }
    }
}

impl Agent {
    /// Starts an agent serving `data_dir` on a socket in a fresh temporary directory.
    pub fn start(data_dir: &Path, options: AgentOptions) -> Agent {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("agent.sock");
        let mut agent = Self::spawn(socket, data_dir.to_path_buf(), options, Some(dir));
        agent.wait_ready();
        agent
    }

    fn spawn(
        socket: PathBuf,
        data_dir: PathBuf,
        options: AgentOptions,
        dir: Option<tempfile::TempDir>,
    ) -> Agent {
        let AgentOptions {
            args: extra,
            envs,
            prefix,
        } = options;
        let mut cmd = match prefix.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(agent_bin());
                cmd
            }
            None => Command::new(agent_bin()),
        };
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--data-dir")
            .arg(&data_dir)
            // Port 0: the kernel picks a free port and the agent logs it (a port picked here
            // and passed on could be taken by another test in between).
            .arg("--probe-listen")
            .arg("127.0.0.1:0")
            .arg("--exit-on-stdin-close")
            .args(&extra)
            .env_remove("KUBECONFIG")
            .env("IPKEEP_LOG", "info")
            .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !extra.iter().any(|a| a == "--node-name") {
            cmd.args(["--no-kubernetes", "--node-name", "test"]);
        }
        let mut child = cmd.spawn().expect("spawn ipkeep-agent");
        let stdin = child.stdin.take().expect("stdin");
        let log = std::sync::Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("IPKEEP_TEST_AGENT_LOG").is_some() {
                    eprintln!("agent: {line}");
                }
                if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        });
        Agent {
            child,
            _stdin: stdin,
            socket,
            data_dir,
            options: AgentOptions {
                args: extra,
                envs,
                prefix,
            },
            probe: None,
            log,
            _dir: dir,
        }
    }

    /// Waits until the agent listens on its socket and has logged its probe address.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        self.probe = None;
        loop {
            let listening = UnixStream::connect(&self.socket).is_ok();
            if listening {
                self.probe = self.log().iter().find_map(|line| probe_address(line));
                if self.probe.is_some() {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "ipkeep-agent exited with {status}:\n{}",
                    self.log().join("\n")
                );
            }
            let what = if listening {
                "log its probe address".to_string()
            } else {
                format!("listen on {}", self.socket.display())
            };
            assert!(
                Instant::now() < deadline,
                "ipkeep-agent did not {what} within 30 s:\n{}",
                self.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The agent's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The socket the plugin should use (`ipam.agentSocket`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The agent's stderr so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// `(ip, pod name, state)` of every lease of `network`, asked through this agent
    /// (`ipkeep list`).
    pub fn leases(&self, network: &str) -> Vec<(String, String, String)> {
        let out = Command::new(crate::ipkeep_bin())
            .arg("--agent-socket")
            .arg(&self.socket)
            .args(["list", "--json", "--network", network, "--data-dir"])
            .arg(&self.data_dir)
            .output()
            .expect("run ipkeep list");
        assert!(out.status.success(), "{out:?}");
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list JSON");
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
        list["leases"]
            .as_array()
            .expect("leases")
            .iter()
            .map(|l| {
                let pod = text(&l["pod"]["name"]).unwrap_or_default();
                (
                    text(&l["ip"]).expect("ip"),
                    pod,
                    text(&l["state"]).expect("state"),
                )
            })
            .collect()
    }

    /// The address of its probe port (`/healthz`, `/readyz`, `/metrics`), once it serves.
    pub fn probe_address(&self) -> Option<std::net::SocketAddr> {
        self.probe
    }

    /// `/metrics`, as text.
    pub fn metrics(&self) -> String {
        self.get("/metrics")
    }

    /// One plain-HTTP GET of the probe port (`/healthz`, `/readyz`, `/metrics`): the status
    /// line, headers and body.
    pub fn get(&self, path: &str) -> String {
        let Some(addr) = self.probe else {
            return String::new();
        };
        let mut stream = std::net::TcpStream::connect(addr).expect("connect to the probe port");
        std::io::Write::write_all(
            &mut stream,
            format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .expect("send");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stream, &mut text).expect("read the answer");
        text
    }

    /// SIGKILL, no clean-up: the socket file stays, as after a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// SIGTERM, then waits for a graceful exit; returns whether it exited 0.
    pub fn terminate(&mut self) -> bool {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        self.child.wait().is_ok_and(|s| s.success())
    }

    /// Starts it again on the same socket and data directory.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = self._dir.take();
        let mut next = Self::spawn(
            self.socket.clone(),
            self.data_dir.clone(),
            self.options.clone(),
            dir,
        );
        next.wait_ready();
        *self = next;
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in the agent's `serving /healthz, /readyz, /metrics addr=…` line.
fn probe_address(line: &str) -> Option<std::net::SocketAddr> {
    if !line.contains("serving /healthz") {
        return None;
    }
    let rest = &line[line.find("addr=")? + "addr=".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The agent serving `data_dir` in a `*_via_agent` test binary: one per data directory (an
/// agent serves its own `--data-dir` only), started on first use and stopped when the test
/// process exits.
pub fn for_data_dir(data_dir: &Path) -> &'static Agent {
    static AGENTS: OnceLock<Mutex<std::collections::HashMap<PathBuf, &'static Agent>>> =
        OnceLock::new();
    let key = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let mut agents = AGENTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    agents
        .entry(key)
        .or_insert_with(|| Box::leak(Box::new(Agent::start(data_dir, AgentOptions::default()))))
}

/// Guards a `*_via_agent` suite: its commands really reach the shared agent (a plugin that
/// silently fell back would pass the suite too).
pub fn assert_commands_reach_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"probe","ipam":{{"type":"ipkeep","dataDir":"{}","ranges":[[{{"subnet":"10.77.0.0/29"}}]]}}}}"#,
        dir.path().display()
    );
    let out = crate::Invocation::new("ADD", "probe-1").run(&crate::ipkeep_bin(), &conf);
    assert!(out.ok(), "{out:?}");
    let metrics = for_data_dir(dir.path()).metrics();
    assert!(
        metrics.contains(r#"ipkeep_agent_requests_total{command="ADD",outcome="ok"}"#),
        "{metrics}"
    );
    assert!(
        !dir.path().join("probe").join("fallbacks").exists(),
        "the plugin fell back instead of using the agent"
    );
}
