//! `ipkeep-controller` restarted beside objects that already exist, as every upgrade, crash,
//! drain or leader change restarts it: each of its three loops must pick up what is there, and
//! the process must stop on SIGTERM within its grace.
//!
//! The objects are created while the replicas `scripts/cluster.sh` started run (a StatefulSet
//! with hooks gets its pods once its hooks are in the admission plan); then the replicas are
//! stopped with SIGTERM (a clean stop while they run). Then, [`STARTS`] times: a fresh process starts beside three pods whose
//! preNormal hook waits (their gate's condition reset to `Unknown`) and a StatefulSet whose
//! generated PersistentPodState was deleted meanwhile; one pod is registered once the process
//! is ready. The lifecycle loop must set every gate and make the registered pod `Normal`, the
//! generate loop re-create the PersistentPodState and the record loop record both Ready pods;
//! then SIGTERM must end the process. One start in two or three once left every lifecycle
//! reconcile waiting for ever, and the process then ignored SIGTERM. Last, a fresh
//! `ipkeep-scheduler-ext` (started for this step's webhook calls) must stop on SIGTERM within
//! the same grace while clients hold connections it cannot finish.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::{Cluster, wait_until};
use ipkeep_tests::workspace_bin;
use serde_json::Value;

use crate::hooks::{GATE, REGISTERED, STATE, gate};
use crate::{kwok_statefulset, persistent_pod_state};

const NS: &str = "restarts";
/// Starts: with the failure seen in 1 start of 2 or 3, ten pass together by chance once in
/// about a thousand runs.
const STARTS: usize = 10;
/// How long a stop may take: the documented grace of every ipkeep daemon, and a little.
const STOP_GRACE: Duration = Duration::from_secs(22);

/// PersistentPodState `hooked` with a preNormal hook, its StatefulSet (3 pods, `OnDelete`) and
/// StatefulSet `kept` (2 pods) with a generated PersistentPodState.
const HOOK: &str = r#"  lifecycle:
    preNormal:
      labelsHandler: {registry.example.com/registered: "true"}
"#;

fn objects() -> String {
    let hook = HOOK;
    let kept = r#"  annotations:
    ipkeep.dev/auto-generate-persistent-pod-state: "true"
    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname
"#;
    [
        persistent_pod_state(NS, "hooked", hook),
        kwok_statefulset(
            NS,
            "hooked",
            3,
            "",
            "  updateStrategy: {type: OnDelete}\n",
            "",
        ),
        kwok_statefulset(NS, "kept", 2, kept, "", ""),
    ]
    .join("---\n")
}

/// An ipkeep process of this step; killed on drop if still running.
struct Process {
    child: Child,
    log: std::path::PathBuf,
}

impl Process {
    /// Starts `command` with its stderr in `log`, and waits (30 s at most) until `GET /readyz`
    /// on `probe` answers 200.
    fn start(mut command: Command, log: std::path::PathBuf, probe: &str) -> Process {
        let process = Process {
            child: command
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .unwrap_or_else(|e| panic!("start {command:?}: {e}")),
            log,
        };
        let started = Instant::now();
        while !probe_ok(probe) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{command:?} not ready in 30 s:\n{}",
                process.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        process
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the time it took to exit, or `None` if it was still running after `grace`.
    fn terminate(&mut self, grace: Duration) -> Option<Duration> {
        terminate(self.child.id(), grace, || {
            self.child.try_wait().ok().flatten().is_some()
        })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends SIGTERM to `pid` and waits until `exited` says so, at most `grace`.
fn terminate(pid: u32, grace: Duration, mut exited: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    while started.elapsed() < grace {
        if exited() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn pods(cluster: &Cluster, app: &str) -> Vec<Value> {
    cluster
        .get(&["pods", "-n", NS, "-l", &format!("app={app}")])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
}

/// The step (the cluster's own controllers are stopped by it and stay stopped).
pub fn a_restarted_controller_picks_up_what_exists(cluster: &Cluster) {
    // The objects while a controller runs: a StatefulSet with hooks gets its pods once the
    // controller has put the hooks into the namespace's admission plan (docs/lifecycle.md),
    // through the admission policy or the webhook (the cluster's own scheduler-ext was killed
    // by an earlier step: a fresh one serves this step's webhook calls).
    cluster.run(&["create", "namespace", NS]);
    let (ext, addresses) = start_scheduler_extension(cluster);
    cluster.apply(&objects());
    let deadline = Instant::now() + Duration::from_secs(90);
    let hooked = loop {
        let ps = pods(cluster, "hooked");
        let done = ps.len() == 3
            && ps.iter().all(|p| {
                p["metadata"]["labels"][STATE] == "PreparingNormal"
                    && p["spec"]["readinessGates"][0]["conditionType"] == GATE
                    && p["status"]["podIP"].is_string()
            });
        if done {
            break ps;
        }
        if Instant::now() >= deadline {
            let metrics = cluster.run(&["get", "--raw", "/metrics"]);
            let policy_metrics: Vec<&str> = metrics
                .lines()
                .filter(|l| l.contains("mutating_admission_policy") && !l.starts_with('#'))
                .collect();
            panic!(
                "90 s after the objects: the hooked pods are not running with their state and gate: {:?}\nevents: {}\nplan: {}\ncontrollers: {}\n{}\npolicy metrics: {}\napiserver: {}",
                ps.iter()
                    .map(|p| (&p["metadata"]["name"], &p["metadata"]["labels"]))
                    .collect::<Vec<_>>(),
                cluster.run(&["get", "events", "-n", NS]),
                cluster
                    .get(&["configmap", "ipkeep-admission-plan", "-n", NS])
                    .map(|c| c["data"].clone())
                    .unwrap_or_default(),
                cluster.log_tail("controller-0", 10),
                cluster.log_tail("controller-1", 10),
                policy_metrics.join("\n"),
                cluster.log_tail("kube-apiserver", 30),
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for replica in ["controller-0", "controller-1"] {
        let pid = cluster.pid(replica).expect("the replica's pid");
        let alive = || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive() {
            continue; // the leader an earlier step killed
        }
        let took = terminate(pid.unsigned_abs(), STOP_GRACE, || !alive());
        assert!(
            took.is_some(),
            "{replica} still runs {STOP_GRACE:?} after SIGTERM:\n{}",
            cluster.log_tail(replica, 30)
        );
    }
    let names: Vec<String> = hooked
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap_or_default().into())
        .collect();
    wait_until("kept's pods Ready", Duration::from_secs(90), || {
        let ps = pods(cluster, "kept");
        (ps.len() == 2
            && ps.iter().all(|p| {
                p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            }))
        .then_some(())
    });
    let bin = workspace_bin(
        "ipkeep-controller",
        "IPKEEP_CONTROLLER_BIN",
        &["ipkeep-controller"],
    );
    let env = std::fs::read_to_string(cluster.state().join("ipkeep.env")).unwrap_or_default();
    let probe = env
        .lines()
        .find_map(|l| l.strip_prefix("IPKEEP_CONTROLLER_PROBES=http://"))
        .and_then(|l| l.split(',').next())
        .expect("the controllers' probe addresses")
        .to_string();
    let mut stops = Vec::new();
    for start in 0..STARTS {
        reset(cluster, &names);
        let log = cluster
            .state()
            .join("logs")
            .join(format!("restart-{start}.log"));
        let mut command = Command::new(&bin);
        command
            .env(
                "KUBECONFIG",
                cluster.state().join("ipkeep-controller.kubeconfig"),
            )
            .env("POD_NAME", format!("restart-{start}"))
            .args(["--no-leader-election", "--probe-listen", &probe]);
        let mut controller = Process::start(command, log, &probe);
        let registered = &names[start % names.len()];
        cluster.run(&[
            "label",
            "pod",
            registered,
            "-n",
            NS,
            &format!("{REGISTERED}=true"),
        ]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ps = pods(cluster, "hooked");
            let hooks_done = ps.len() == 3
                && ps.iter().all(|p| {
                    let mine = p["metadata"]["name"] == registered.as_str();
                    let (state, status) = if mine {
                        ("Normal", "True")
                    } else {
                        ("PreparingNormal", "False")
                    };
                    p["metadata"]["labels"][STATE] == state && gate(p) == status
                });
            let recorded = cluster
                .get(&["pps", "kept", "-n", NS])
                .and_then(|p| p["status"]["podStates"].as_object().map(|s| s.len()))
                == Some(2);
            if hooks_done && recorded {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "start {start}: within 20 s of /readyz, lifecycle done: {hooks_done}, kept recorded: {recorded}\npods: {}\ncontroller log:\n{}",
                ps.iter()
                    .map(|p| format!(
                        "{} {} gate={}",
                        p["metadata"]["name"],
                        p["metadata"]["labels"][STATE],
                        gate(p)
                    ))
                    .collect::<Vec<_>>()
                    .join(", "),
                controller.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let took = controller.terminate(STOP_GRACE);
        assert!(
            took.is_some(),
            "start {start}: still running {STOP_GRACE:?} after SIGTERM:\n{}",
            controller.log()
        );
        stops.extend(took);
    }
    stops.sort();
    eprintln!(
        "restarts: {STARTS} starts beside existing objects reconciled; SIGTERM to exit: median {:?}, max {:?}",
        stops[stops.len() / 2],
        stops[stops.len() - 1]
    );
    cluster.run(&["delete", "namespace", NS, "--wait=false"]);
    the_scheduler_extension_stops_within_its_grace(ext, &addresses);
}

/// A fresh `ipkeep-scheduler-ext` on the cluster's webhook address (the cluster's own was
/// killed by an earlier step): the webhook gives the hooked pods their state and gate.
fn start_scheduler_extension(cluster: &Cluster) -> (Process, String) {
    let env = std::fs::read_to_string(cluster.state().join("ipkeep.env")).unwrap_or_default();
    let address = |key: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|l| l.split("//").nth(1))
            .unwrap_or_else(|| panic!("{key} in ipkeep.env"))
            .to_string()
    };
    let (listen, probe) = (address("IPKEEP_EXT_URL="), address("IPKEEP_EXT_PROBE="));
    let bin = workspace_bin(
        "ipkeep-scheduler-ext",
        "IPKEEP_SCHEDULER_EXT_BIN",
        &["ipkeep-scheduler-ext"],
    );
    let pki = cluster.state().join("pki");
    let log = cluster
        .state()
        .join("logs")
        .join("scheduler-ext-restarted.log");
    let mut command = Command::new(&bin);
    command
        .env(
            "KUBECONFIG",
            cluster.state().join("ipkeep-scheduler-ext.kubeconfig"),
        )
        .arg(format!("--webhook-listen={listen}"))
        .arg(format!("--probe-listen={probe}"))
        .arg(format!(
            "--tls-cert={}",
            pki.join("scheduler-ext.crt").display()
        ))
        .arg(format!(
            "--tls-key={}",
            pki.join("scheduler-ext.key").display()
        ));
    let ext = Process::start(command, log, &probe);
    (ext, format!("{listen} {probe}"))
}

/// `ipkeep-scheduler-ext` stops within its grace on SIGTERM while clients hold a TLS
/// connection that never says anything and a request they never finish sending.
fn the_scheduler_extension_stops_within_its_grace(mut ext: Process, addresses: &str) {
    use std::io::Write;
    let (listen, probe) = addresses.split_once(' ').expect("two addresses");
    let _silent = std::net::TcpStream::connect(listen).expect("connect");
    let mut half = std::net::TcpStream::connect(probe).expect("connect");
    half.write_all(b"POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .expect("write");
    let took = ext.terminate(STOP_GRACE);
    assert!(
        took.is_some(),
        "ipkeep-scheduler-ext still runs {STOP_GRACE:?} after SIGTERM:\n{}",
        ext.log()
    );
    eprintln!("ipkeep-scheduler-ext stopped {took:?} after SIGTERM");
}

/// With no controller running: every hooked pod back to waiting (state, no registration, the
/// gate's condition `Unknown`) and `kept`'s generated PersistentPodState gone.
fn reset(cluster: &Cluster, names: &[String]) {
    for name in names {
        cluster.run(&[
            "label",
            "pod",
            name,
            "-n",
            NS,
            "--overwrite",
            &format!("{STATE}=PreparingNormal"),
            &format!("{REGISTERED}-"),
        ]);
        let unknown = format!(
            r#"{{"status":{{"conditions":[{{"type":"{GATE}","status":"Unknown","reason":"TestReset"}}]}}}}"#
        );
        cluster.run(&[
            "patch",
            "pod",
            name,
            "-n",
            NS,
            "--subresource=status",
            "--type=strategic",
            "-p",
            &unknown,
        ]);
    }
    cluster.run(&[
        "delete",
        "pps",
        "kept",
        "-n",
        NS,
        "--ignore-not-found",
        "--wait=true",
    ]);
}

fn probe_ok(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}
