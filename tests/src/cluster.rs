//! A real Kubernetes control plane for tests: `scripts/cluster.sh up` (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok built from their upstream modules, ipkeep
//! installed from `deploy/`), driven with the kubectl built beside them, and `down` on drop.
//! `IPKEEP_K8S_VERSION` (e.g. `v1.35.4`) picks the Kubernetes release; unset, the script's
//! default.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::kubectl::Kubectl;

/// A running cluster; dropping it stops every process and removes its state.
#[derive(Debug)]
pub struct Cluster {
    repo: PathBuf,
    state: PathBuf,
    kubectl: Kubectl,
    _dir: tempfile::TempDir,
}

/// Whether the cluster tests can run here (Go to build the components). Without it they are
/// skipped loudly, and under CI that is a failure.
pub fn require_go(test: &str) -> bool {
    let found = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    let msg = format!("SKIPPED (needs Go to build the Kubernetes components): {test}");
    assert!(std::env::var_os("CI").is_none(), "{msg}");
    eprintln!("{msg}");
    false
}

/// OpenKruise's source archive (`IPKEEP_KRUISE_SRC`: what `scripts/kruise-src.sh` prints, set by
/// `scripts/test.sh`), for a cluster with kruise-manager (`scripts/cluster.sh --with-kruise`).
/// Without it `what` is skipped loudly, and under CI that is a failure.
pub fn require_kruise_src(what: &str) -> Option<PathBuf> {
    let archive = std::env::var_os("IPKEEP_KRUISE_SRC")
        .filter(|a| !a.is_empty())
        .map(PathBuf::from);
    let problem = match &archive {
        Some(a) if a.is_file() => return archive,
        Some(a) => format!("IPKEEP_KRUISE_SRC names {}, which is no file", a.display()),
        None => "IPKEEP_KRUISE_SRC is not set".to_string(),
    };
    let msg = format!(
        "SKIPPED {what}: {problem}; set it to OpenKruise v1.9.0's source archive (scripts/kruise-src.sh fetches and checks it: IPKEEP_KRUISE_SRC=$(scripts/kruise-src.sh))"
    );
    assert!(std::env::var_os("CI").is_none(), "{msg}");
    eprintln!("{msg}");
    None
}

/// The Kubernetes release the tests were asked to run (`IPKEEP_K8S_VERSION`), if any; unset,
/// `scripts/cluster.sh` runs its default. The script reads the variable too (so do the real-node
/// clusters `ipkeep-demo` starts); the control-plane clusters also pass it as `--k8s-version`.
pub fn k8s_version_wanted() -> Option<String> {
    std::env::var("IPKEEP_K8S_VERSION")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The Kubernetes release of the cluster whose state is in `state` (`scripts/cluster.sh` writes
/// it to `k8s-version`).
pub fn k8s_version_of(state: &Path) -> String {
    std::fs::read_to_string(state.join("k8s-version"))
        .expect("the state names its Kubernetes release")
        .trim()
        .to_string()
}

/// How new StatefulSet pods get their pin on a cluster (`scripts/cluster.sh --admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The MutatingAdmissionPolicy `ipkeep-pin`: the required pin in `spec.nodeSelector`.
    Policy,
    /// The mutating webhook: the required pin in every required node affinity term.
    Webhook,
}

/// The pinning path of the cluster whose state is in `state` (`DIR/admission`).
pub fn admission_of(state: &Path) -> Admission {
    match std::fs::read_to_string(state.join("admission"))
        .expect("the state names its admission path (scripts/cluster.sh --admission)")
        .trim()
    {
        "policy" => Admission::Policy,
        _ => Admission::Webhook,
    }
}

/// Where the real nodes of a cluster keep their CNI configuration and plugins, as the
/// distribution it imitates lays a node out (`scripts/cluster.sh --node-layout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    /// `kubeadm`, `k3s` or `kind`.
    pub name: String,
    /// The container runtime's CNI configuration directory on the nodes.
    pub cni_conf_dir: String,
    /// The container runtime's CNI plugin directory on the nodes (where `ipkeep` is).
    pub cni_bin_dir: String,
}

impl NodeLayout {
    /// The `ipkeep` binary on the nodes.
    pub fn ipkeep(&self) -> String {
        format!("{}/ipkeep", self.cni_bin_dir)
    }
}

/// The node layout of the cluster whose state is in `state` (`DIR/node-layout`; kubeadm's
/// directories when the cluster has none written).
pub fn node_layout_of(state: &Path) -> NodeLayout {
    let text = std::fs::read_to_string(state.join("node-layout")).unwrap_or_default();
    let field = |key: &str, default: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or(default)
            .to_string()
    };
    NodeLayout {
        name: field("layout", "kubeadm"),
        cni_conf_dir: field("cni_conf_dir", "/etc/cni/net.d"),
        cni_bin_dir: field("cni_bin_dir", "/opt/cni/bin"),
    }
}

/// Whether kube-scheduler of the cluster whose state is in `state` calls ipkeep's extender
/// (`DIR/extender`; `scripts/cluster.sh --without-extender` writes 0).
pub fn extender_of(state: &Path) -> bool {
    std::fs::read_to_string(state.join("extender")).map_or(true, |e| e.trim() != "0")
}

/// What requires `pod` (JSON) onto nodes: its required node affinity and its node selector,
/// as text (a pin shows there as the recorded node's name, whichever path wrote it).
pub fn required_placement(pod: &serde_json::Value) -> String {
    format!(
        "{} {}",
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        pod["spec"]["nodeSelector"]
    )
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

impl Cluster {
    /// `scripts/cluster.sh up --kwok-nodes <nodes>` on ports of its own. Panics with the
    /// script's output if it fails.
    pub fn up(nodes: usize) -> Cluster {
        Self::up_with(nodes, &[])
    }

    /// [`Cluster::up`] with more options of `scripts/cluster.sh up` (`--webhook-client-auth`).
    pub fn up_with(nodes: usize, options: &[&str]) -> Cluster {
        let repo = repo_root();
        let dir = tempfile::Builder::new()
            .prefix("ipkeep-cluster-")
            .tempdir()
            .expect("tempdir");
        let state = dir.path().join("state");
        // Nine ports from P; spread by process so that parallel test binaries do not collide,
        // and below the kernel's ephemeral range (from 32768), where outgoing connections
        // could take them first.
        let base = 20000 + (std::process::id() % 1200) * 10;
        let t = Instant::now();
        let out = Command::new(repo.join("scripts/cluster.sh"))
            .arg("up")
            .arg("--state")
            .arg(&state)
            .args(["--port-base", &base.to_string()])
            .args(["--nodes", "0", "--kwok-nodes", &nodes.to_string()])
            .args(
                k8s_version_wanted()
                    .iter()
                    .flat_map(|v| ["--k8s-version", v.as_str()]),
            )
            .args(options)
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/cluster.sh");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "scripts/cluster.sh up failed: {stdout}"
        );
        eprintln!("cluster up in {:.1} s", t.elapsed().as_secs_f64());
        let bin = std::fs::read_to_string(state.join("bin")).expect("the state names its binaries");
        Cluster {
            kubectl: Kubectl::new(
                &Path::new(bin.trim()).join("kubectl"),
                &state.join("admin.kubeconfig"),
            ),
            repo,
            state,
            _dir: dir,
        }
    }

    /// The repository the cluster was started from.
    pub fn repo(&self) -> &Path {
        &self.repo
    }

    /// How new StatefulSet pods get their pin on it.
    pub fn admission(&self) -> Admission {
        admission_of(&self.state)
    }

    /// The Kubernetes release it runs (`v1.37.2`, …).
    pub fn k8s_version(&self) -> String {
        k8s_version_of(&self.state)
    }

    /// The cluster's state directory (logs in `logs/`, pids in `pids/`).
    pub fn state(&self) -> &Path {
        &self.state
    }

    /// The last `lines` lines of a component's log (`kube-scheduler`, `controller-0`, …).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.state.join("logs").join(format!("{component}.log")))
                .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Starts `node` (labels like the script's kwok nodes, in `zone`) under a kwok process of
    /// its own, and waits for it to be Ready. Killing the returned process makes the node stop
    /// heartbeating, as a lost node does.
    pub fn lossable_node(&self, node: &str, zone: &str) -> Kwok {
        let bin =
            std::fs::read_to_string(self.state.join("bin")).expect("the state names its binaries");
        let log = std::fs::File::create(self.state.join("logs").join(format!("kwok-{node}.log")))
            .expect("kwok log");
        let child = Command::new(Path::new(bin.trim()).join("kwok"))
            .arg(format!("--kubeconfig={}", self.kubeconfig().display()))
            .arg(format!(
                "--config={}",
                self.state.join("kwok.yaml").display()
            ))
            .arg("--manage-all-nodes=false")
            .arg(format!(
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node={node}"
            ))
            .args([
                "--node-lease-duration-seconds=8",
                "--cidr=10.1.0.0/16",
                "--node-ip=10.255.0.2",
            ])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start kwok");
        self.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  annotations: {{kwok.x-k8s.io/node: {node}}}\n  labels: {{kubernetes.io/hostname: {node}, topology.kubernetes.io/zone: {zone}, type: kwok}}\nstatus:\n  allocatable: {{cpu: \"32\", memory: 256Gi, pods: \"110\"}}\n  capacity: {{cpu: \"32\", memory: 256Gi, pods: \"110\"}}\n"
        ));
        wait_until(&format!("{node} Ready"), Duration::from_secs(60), || {
            let n = self.get(&["node", node])?;
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        });
        Kwok(child)
    }

    /// The pid of a process the script started.
    pub fn pid(&self, component: &str) -> Option<i32> {
        std::fs::read_to_string(self.state.join("pids").join(component))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// kubectl as the cluster's admin (`kubeconfig()`, `run`, `apply`, `get`, …).
impl Deref for Cluster {
    type Target = Kubectl;

    fn deref(&self) -> &Kubectl {
        &self.kubectl
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(self.repo.join("scripts/cluster.sh"))
            .arg("down")
            .arg("--state")
            .arg(&self.state)
            .status();
    }
}

/// A kwok process started by a test; killed on drop.
#[derive(Debug)]
pub struct Kwok(std::process::Child);

impl Kwok {
    /// SIGKILL: its nodes stop heartbeating.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Kwok {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` every 250 ms until it returns `Some`, at most `timeout`; panics naming `what`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
