//! The nemesis: carries out one planned fault on the real-node cluster and undoes it. ipkeep's
//! processes are found in the host's `/proc` ([`crate::crash`]) and placed by their cgroup
//! (`/ipkeep-nodes/<node>/…/pod<uid>/…`); nodes are stopped, started and powered off through
//! `scripts/cluster.sh node`; kube-apiserver and etcd are the processes whose pids the
//! cluster's state directory keeps.
//!
//! A node's wall clock cannot be stepped here without stepping the machine's: the nodes are
//! namespaces of this machine, and `CLOCK_REALTIME` has no namespace (time namespaces move only
//! the monotonic and boot clocks). Stepping it would step etcd, kube-apiserver and every other
//! process on the machine, so [`FaultKind::StepClock`] is logged as skipped with that reason.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::schedule::FaultKind;
use crate::SYSTEM_NAMESPACE;
use crate::crash;

/// Why the clock fault is not injected.
pub const CLOCK_SKIPPED: &str = "skipped: a node's wall clock is this machine's (CLOCK_REALTIME has no namespace); stepping it would step the whole control plane";

/// The cluster as the nemesis acts on it.
#[derive(Clone)]
pub struct Target {
    /// `scripts/cluster.sh`.
    pub script: PathBuf,
    /// The cluster's state directory.
    pub state: PathBuf,
    /// The real nodes, by index.
    pub nodes: Vec<String>,
    /// An admin client.
    pub client: Client,
    /// Held by a control-plane restart from its SIGTERM to its new process ([`restart`]).
    pub restarts: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("state", &self.state)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// What a fault did: its target in words, and a note when it could not be done as planned.
#[derive(Debug, Clone, Default)]
pub struct Done {
    /// The target.
    pub target: String,
    /// Said when not done as planned.
    pub note: Option<String>,
}

impl Target {
    fn pid_of(&self, component: &str) -> Result<i32> {
        pid_in(&self.state, component)
    }

    /// `scripts/cluster.sh node VERB NODE`.
    pub async fn node(&self, verb: &str, node: &str) -> Result<()> {
        let out = tokio::process::Command::new(&self.script)
            .args(["node", verb, node, "--state"])
            .arg(&self.state)
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "scripts/cluster.sh node {verb} {node} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Runs `command` in the node's network and mount namespaces (as `cluster.sh node exec`
    /// does, without a shell in between: the observers call it every second).
    pub async fn on_node(&self, node: &str, command: &[&str]) -> Result<String> {
        let holder = self.pid_of(&format!("{node}-holder"))?;
        let out = tokio::process::Command::new("nsenter")
            .args(["-t", &holder.to_string(), "-m", "-n", "--"])
            .args(command)
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "{} on {node} failed: {}",
                command.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Carries out `kind` on `node` (for faults on a node) for `hold`.
    pub async fn inject(
        &self,
        kind: FaultKind,
        node: Option<usize>,
        hold: Duration,
    ) -> Result<Done> {
        let node = node
            .and_then(|n| self.nodes.get(n))
            .cloned()
            .unwrap_or_default();
        match kind {
            FaultKind::KillAgent => {
                self.kill_pod_process("ipkeep-agent", |p| on_node(p, &node))
                    .await
            }
            FaultKind::KillSchedulerExt => {
                self.kill_pod_process("ipkeep-scheduler-ext", |_| true)
                    .await
            }
            FaultKind::KillControllerLeader | FaultKind::KillControllerStandby => {
                let leader = self.leader().await?;
                let want_leader = kind == FaultKind::KillControllerLeader;
                self.kill_pod_process("ipkeep-controller", |p| {
                    (p.name_any() == leader) == want_leader
                })
                .await
            }
            FaultKind::RestartRuntime => {
                self.node("stop", &node).await?;
                tokio::time::sleep(hold).await;
                self.node("start", &node).await?;
                Ok(done(&node))
            }
            FaultKind::PowerCycle => {
                self.node("kill", &node).await?;
                tokio::time::sleep(hold).await;
                self.node("start", &node).await?;
                Ok(done(&node))
            }
            FaultKind::RestartApiserver => {
                restart(&self.state, "kube-apiserver", RESTART_GRACE, &self.restarts).await?;
                Ok(done("kube-apiserver"))
            }
            FaultKind::PauseEtcd => {
                let pid = Pid::from_raw(self.pid_of("etcd")?);
                kill(pid, Signal::SIGSTOP)?;
                tokio::time::sleep(hold).await;
                kill(pid, Signal::SIGCONT)?;
                Ok(done(&format!("etcd for {} s", hold.as_secs())))
            }
            FaultKind::FillStore => self.fill_store(&node, hold).await,
            FaultKind::StepClock => Ok(Done {
                target: node,
                note: Some(CLOCK_SKIPPED.into()),
            }),
        }
    }

    /// The pod name holding the controller's leader Lease.
    async fn leader(&self) -> Result<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let lease = until_answered(|| leases.get("ipkeep-controller")).await?;
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .context("the controller's Lease has no holder")
    }

    /// SIGKILLs the process of `program` in the first ipkeep pod `choose` accepts.
    async fn kill_pod_process(&self, program: &str, choose: impl Fn(&Pod) -> bool) -> Result<Done> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let all = ListParams::default();
        let candidates: Vec<Pod> = until_answered(|| pods.list(&all))
            .await?
            .items
            .into_iter()
            .filter(|p| p.name_any().starts_with(program) && choose(p))
            .collect();
        let processes = crash::in_containers();
        for pod in &candidates {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let found = processes
                .iter()
                .find(|p| p.program == program && process_home(p.pid).is_some_and(|h| h.1 == uid));
            if let Some(p) = found {
                crash::kill_all(std::slice::from_ref(p))?;
                return Ok(done(&format!("{} (pid {})", pod.name_any(), p.pid)));
            }
        }
        Ok(Done {
            target: program.to_string(),
            note: Some(format!(
                "no running {program} process to kill (restarting already?)"
            )),
        })
    }

    /// The command lines of the control-plane processes a supervisor keeps running
    /// ([`SUPERVISED`]), read while they run.
    pub fn supervised_commands(&self) -> Result<Vec<(&'static str, Command)>> {
        SUPERVISED
            .iter()
            .map(|c| {
                let command =
                    Command::of(self.pid_of(c)?).with_context(|| format!("{c}'s command line"))?;
                Ok((*c, command))
            })
            .collect()
    }

    /// Fills the node's store file system (`--cni-data-size`) with one file, holds it full for
    /// `hold`, and removes the file.
    async fn fill_store(&self, node: &str, hold: Duration) -> Result<Done> {
        let dir = self
            .state
            .join("nodes")
            .join(node)
            .join("root/var/lib/cni/ipkeep");
        let file = dir.join("soak-fill");
        let written = {
            let file = file.clone();
            tokio::task::spawn_blocking(move || fill(&file)).await??
        };
        tokio::time::sleep(hold).await;
        std::fs::remove_file(&file).with_context(|| format!("remove {}", file.display()))?;
        Ok(done(&format!("{node} ({} MiB written)", written >> 20)))
    }
}

/// How long a restarted control-plane process may drain after SIGTERM before SIGKILL: the
/// `terminationGracePeriodSeconds` of a kubeadm control plane's static pods. kube-apiserver on
/// its own would wait `--request-timeout` (60 s) for its open watches, with its port closed.
const RESTART_GRACE: Duration = Duration::from_secs(30);

/// Restarts `component` as a rolling restart does: SIGTERM, SIGKILL after `grace`, and once it
/// is gone the same command line and environment again, its new pid in its pid file. Returns
/// the new pid.
///
/// One restart at a time: `turn` is held from the SIGTERM to the new process. Two restarts that
/// overlapped both stopped the same process and both started one; the copy that lost the port
/// exited, its pid in the pid file, and the one serving was known to nobody (every later restart
/// failed, and `scripts/cluster.sh down` left it running).
async fn restart(
    state: &Path,
    component: &str,
    grace: Duration,
    turn: &tokio::sync::Mutex<()>,
) -> Result<i32> {
    let _turn = turn.lock().await;
    let pid = pid_in(state, component)?;
    if !running(pid) {
        bail!(
            "{component} (pid {pid}) is not running; its last error: {}",
            last_error(&state.join(format!("logs/{component}.log")))
        );
    }
    let command = Command::of(pid).with_context(|| format!("{component}'s command line"))?;
    kill(Pid::from_raw(pid), Signal::SIGTERM)?;
    let deadline = tokio::time::Instant::now() + grace;
    let mut killed = false;
    while running(pid) {
        if !killed && tokio::time::Instant::now() > deadline {
            kill(Pid::from_raw(pid), Signal::SIGKILL)?;
            killed = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    respawn(state, component, &command)
}

/// Whether `pid` still runs. The kube-apiserver a restart started is the soak's own child, and
/// stays in /proc as a zombie once it exits unless the soak reaps it (a second restart would
/// wait for it forever); any other exited process is reaped by its parent.
fn running(pid: i32) -> bool {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    // ECHILD when it is not the soak's child: nothing to reap here.
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
    in_proc(pid)
}

/// Whether /proc shows `pid` running (not a zombie), without reaping anything.
fn in_proc(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis: Z (zombie) or X (dead) is gone.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => false,
    }
}

/// The control-plane processes that run under a supervisor on a real control-plane node (the
/// kubelet restarts static pods, systemd its units), which `scripts/cluster.sh` starts as plain
/// processes. kube-scheduler exits on purpose when it finds its cache inconsistent (1.37:
/// "Pod updated on a different node than previously added to", after a relist that replaced a
/// StatefulSet pod by its namesake created while its watch was down) and counts on being
/// restarted; without a supervisor, no pod would be scheduled again.
pub const SUPERVISED: [&str; 2] = ["kube-scheduler", "kube-controller-manager"];

/// A process's command line and environment, to start it again as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Its environment.
    pub env: Vec<(String, String)>,
}

impl Command {
    /// The command line and environment of the running process `pid`.
    pub fn of(pid: i32) -> Result<Command> {
        let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))?
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let env: Vec<(String, String)> = std::fs::read(format!("/proc/{pid}/environ"))?
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect();
        if argv.is_empty() {
            bail!("process {pid} has no command line (it exited?)");
        }
        Ok(Command { argv, env })
    }
}

/// The last error line (klog's `E…` or `F…`) of a log, shortened; "none" without one.
fn last_error(log: &Path) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let tail = &text[text.len().saturating_sub(64 * 1024)..];
    String::from_utf8_lossy(tail)
        .lines()
        .rev()
        .find(|l| l.starts_with('E') || l.starts_with('F'))
        .map_or_else(|| "none".into(), |l| l.chars().take(300).collect())
}

/// Does what a control-plane node's supervisor (the kubelet for static pods, systemd)
/// does: starts each of `commands` that exited again. Returns what it restarted, in words.
pub fn keep_up(state: &Path, commands: &[(&'static str, Command)]) -> Vec<String> {
    let mut out = Vec::new();
    for (component, command) in commands {
        let Ok(pid) = pid_in(state, component) else {
            continue;
        };
        if running(pid) {
            continue;
        }
        let last = last_error(&state.join(format!("logs/{component}.log")));
        match respawn(state, component, command) {
            Ok(new) => out.push(format!(
                "{component} (pid {pid}) exited, started again (pid {new}) as its supervisor would; its last error: {last}"
            )),
            Err(e) => out.push(format!(
                "{component} (pid {pid}) exited and could not be started again: {e:#}"
            )),
        }
    }
    out
}

/// Starts `component` again with `command`, its output appended to its log, and records
/// its new pid where `scripts/cluster.sh` keeps it (so `down` stops it).
fn respawn(state: &Path, component: &str, command: &Command) -> Result<i32> {
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(state.join(format!("logs/{component}.log")))?;
    let (program, args) = command
        .argv
        .split_first()
        .with_context(|| format!("{component} has no command line"))?;
    // Its own process group, so that a signal to the soak's (Ctrl-C) does not reach it. Not
    // `setsid PROGRAM`: setsid forks when it finds itself a process-group leader, and the pid
    // recorded would then be that of a setsid that exited while the program runs on unknown.
    let child = std::process::Command::new(program)
        .args(args)
        .process_group(0)
        .env_clear()
        .envs(command.env.iter().cloned())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("start {component} again"))?;
    std::fs::write(state.join("pids").join(component), child.id().to_string())?;
    Ok(child.id() as i32)
}

/// The pid `scripts/cluster.sh` keeps for `component` in the state directory `state`.
fn pid_in(state: &Path, component: &str) -> Result<i32> {
    let path = state.join("pids").join(component);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    Ok(text.trim().parse()?)
}

/// `call` again every two seconds while the API server does not answer (a kube-apiserver
/// restart keeps it away for up to a minute), for up to [`API_PATIENCE`]: a kill whose target
/// is found through the API happens late rather than not at all.
async fn until_answered<T, F, Fut>(call: F) -> Result<T, kube::Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + API_PATIENCE;
    loop {
        match call().await {
            Err(kube::Error::Api(e)) => return Err(kube::Error::Api(e)),
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            other => return other,
        }
    }
}

/// How long a fault waits for the API server to answer.
const API_PATIENCE: Duration = Duration::from_secs(120);

fn done(target: &str) -> Done {
    Done {
        target: target.to_string(),
        note: None,
    }
}

fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Writes zeros to `file` until the file system is full; how many bytes.
fn fill(file: &Path) -> Result<u64> {
    use std::io::Write as _;
    let mut f = std::fs::File::create(file)?;
    let block = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let _ = f.sync_all();
    Ok(written)
}

/// Where a container's process lives: its node and its pod's UID, from its cgroup path
/// (`…/ipkeep-nodes/<node>/kubepods/…/pod<uid>/<container>`).
pub fn process_home(pid: i32) -> Option<(String, String)> {
    home_in_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
}

fn home_in_cgroup(text: &str) -> Option<(String, String)> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let mut parts = path.split('/').skip_while(|p| *p != "ipkeep-nodes").skip(1);
        let node = parts.next()?.to_string();
        let uid = parts.find_map(|p| p.strip_prefix("pod"))?.replace('_', "-");
        Some((node, uid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_placed_by_its_cgroup() {
        let text = "12:pids:/ipkeep-nodes/node-1/kubepods/besteffort/pod1b2c-33/abcdef\n\
                    11:memory:/ipkeep-nodes/node-1/kubepods/besteffort/pod1b2c-33/abcdef\n";
        assert_eq!(
            home_in_cgroup(text),
            Some(("node-1".into(), "1b2c-33".into()))
        );
        assert_eq!(home_in_cgroup("12:pids:/user.slice\n"), None);
        assert_eq!(
            home_in_cgroup("12:pids:/ipkeep-nodes/node-0/kubelet\n"),
            None
        );
    }

    /// A supervised process that exits is started again with its command line and
    /// environment, its new pid where `scripts/cluster.sh down` finds it; one that runs is left
    /// alone.
    #[test]
    #[allow(clippy::zombie_processes, reason = "keep_up's running() reaps them")]
    fn an_exited_control_plane_process_is_started_again_as_it_was() {
        let state = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(state.path().join("pids")).expect("pids");
        std::fs::create_dir_all(state.path().join("logs")).expect("logs");
        std::fs::write(
            state.path().join("logs/kube-scheduler.log"),
            "I1129 started\nE1129 cache.go:662] Scheduler cache is corrupted\n",
        )
        .expect("log");
        let first = std::process::Command::new("sleep")
            .arg("301")
            .env("SOAK_TEST_MARK", "kept")
            .spawn()
            .expect("spawn sleep");
        let pid = first.id() as i32;
        std::fs::write(state.path().join("pids/kube-scheduler"), pid.to_string()).expect("pid");
        // Right after the spawn the child may not have exec'd `sleep` yet: its command line is
        // empty or the test's own until it has.
        let t = std::time::Instant::now();
        let command = loop {
            match Command::of(pid) {
                Ok(c) if c.argv == ["sleep", "301"] => break c,
                other => {
                    assert!(t.elapsed() < Duration::from_secs(10), "{other:?}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        let commands = [("kube-scheduler", command.clone())];
        assert!(keep_up(state.path(), &commands).is_empty(), "it runs");

        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill");
        let t = std::time::Instant::now();
        while running(pid) {
            assert!(t.elapsed() < Duration::from_secs(10), "{pid} still runs");
            std::thread::sleep(Duration::from_millis(20));
        }
        let said = keep_up(state.path(), &commands);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("kube-scheduler") && said[0].contains("cache is corrupted"),
            "{said:?}"
        );
        let again = pid_in(state.path(), "kube-scheduler").expect("the new pid");
        assert_ne!(again, pid);
        // Until the new process has exec'd the program, /proc shows the test's command line.
        let t = std::time::Instant::now();
        let restarted = loop {
            let now = Command::of(again).expect("the new process");
            if now.argv == command.argv || t.elapsed() > Duration::from_secs(5) {
                break now;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(restarted.argv, command.argv);
        assert!(
            restarted
                .env
                .contains(&("SOAK_TEST_MARK".to_string(), "kept".to_string()))
        );
        kill(Pid::from_raw(again), Signal::SIGKILL).expect("kill the restarted one");
        while running(again) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pids of the processes whose command line has `mark` as an argument.
    fn with_mark(mark: &str) -> Vec<i32> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // Not running(): reaping every pid would take other tests' children from them.
            if in_proc(pid) && Command::of(pid).is_ok_and(|c| c.argv.iter().any(|a| a == mark)) {
                out.push(pid);
            }
        }
        out
    }

    /// Two restarts that overlap (kube-apiserver drains after SIGTERM; faults of the control
    /// plane do not wait for each other) leave one process, the one the pid file names. Before
    /// the restarts took turns, both stopped the same process and both started a new one.
    #[tokio::test]
    #[allow(clippy::zombie_processes, reason = "restart's running() reaps them")]
    async fn overlapping_restarts_leave_one_process_and_its_pid_is_kept() {
        let state = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(state.path().join("pids")).expect("pids");
        std::fs::create_dir_all(state.path().join("logs")).expect("logs");
        let mark = format!("soak-restart-test-{}", std::process::id());
        // Like kube-apiserver: on SIGTERM it takes a moment to drain before it exits.
        let first = std::process::Command::new("sh")
            .args([
                "-c",
                "trap 'sleep 1; exit 0' TERM; while :; do sleep 0.1; done",
            ])
            .arg(&mark)
            .spawn()
            .expect("spawn sh");
        let pid = first.id() as i32;
        std::fs::write(state.path().join("pids/kube-apiserver"), pid.to_string()).expect("pid");
        let t = std::time::Instant::now();
        while with_mark(&mark) != [pid] {
            assert!(t.elapsed() < Duration::from_secs(10), "sh never ran");
            std::thread::sleep(Duration::from_millis(10));
        }

        let turn = tokio::sync::Mutex::new(());
        let grace = Duration::from_secs(20);
        let (a, b) = tokio::join!(
            restart(state.path(), "kube-apiserver", grace, &turn),
            restart(state.path(), "kube-apiserver", grace, &turn)
        );
        let (a, b) = (
            a.expect("the first restart"),
            b.expect("the second restart"),
        );
        let kept = pid_in(state.path(), "kube-apiserver").expect("the pid file");
        // Until it has exec'd sh, the new process shows the test's command line.
        let t = std::time::Instant::now();
        let mut alive = with_mark(&mark);
        while !alive.contains(&kept) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
            alive = with_mark(&mark);
        }
        for p in [a, b] {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        assert_eq!(
            alive,
            [kept],
            "restarts {a} and {b}; the pid file says {kept}"
        );
        assert_eq!(
            kept, b,
            "the second restart stopped the first one's process"
        );
        for p in [a, b] {
            while running(p) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// A child that exited but was not waited for is a zombie in /proc: gone all the same.
    #[test]
    #[allow(clippy::zombie_processes, reason = "running() is what reaps it")]
    fn an_exited_child_is_not_running() {
        let child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id() as i32;
        let t = std::time::Instant::now();
        while running(pid) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{pid} runs after it exited"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} not reaped"
        );
    }
}
