//! What the lifecycle hooks add to a pod rebuild, the handshake excluded
//! (`scripts/bench-lifecycle.sh`; docs/benchmarks.md, "What the lifecycle hooks cost").
//!
//! ```sh
//! IPKEEP_CLUSTER_STATE=DIR [IPKEEP_ROUNDS=10] cargo bench -p ipkeep-tests --bench lifecycle
//! ```
//!
//! `IPKEEP_CLUSTER_STATE` names a running cluster with real nodes (`scripts/cluster.sh up`;
//! `scripts/bench-lifecycle.sh` brings one up), `IPKEEP_ROUNDS` the rebuilds of each
//! StatefulSet (default 10), `IPKEEP_OPERATOR_DELAY_MS` how long the operator takes to answer a
//! hook (default 0; a registry's latency, part of the handshake). Does nothing unless cargo
//! passes `--bench`.
//!
//! Two StatefulSets of one pod on the same real node (node-0), in the same run, rebuilt in turn
//! as a person rebuilds one pod: `plain` (a PersistentPodState with retention, no hooks: the
//! baseline) by `kubectl delete pod`, and `hooked` (both hooks on one label, `markPodNotReady`)
//! the way docs/lifecycle.md says: `kubectl label pod … ipkeep.dev/lifecycle-state=PreparingDelete`,
//! then `kubectl delete pod` once the operator deregistered it. A watch on the pods timestamps
//! every change as it arrives; an operator in this process acts on the hooked pod the moment
//! the watch shows what it waits for, and the time from that moment to its `kubectl label`
//! returning, plus the person's `kubectl delete`, is the handshake, which is subtracted.
//! Reported per rebuild: the first command → new pod Ready time of each, the hooked one without
//! the handshake, and the hooks' own steps: asked → pod not Ready (traffic leaves),
//! deregistered → deletion under way, registered → pod Ready. `IPKEEP_TRACE=1` prints every
//! change the watch saw.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ipkeep_tests::bench::Summary;
use ipkeep_tests::kubectl::Kubectl;

const NS: &str = "hook-cost";
const REGISTERED: &str = "registry.example.com/registered";

/// One pod as the watch showed it, and when.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    name: String,
    uid: String,
    state: String,
    ip: String,
    registered: bool,
    ready: bool,
    /// The readiness gate's condition (`True`, `False`, or empty before ipkeep set it).
    gate: String,
    deleting: bool,
    /// The pod's resource version: one per write the API server took.
    version: String,
}

fn manifests() -> String {
    let mut out = String::new();
    for (name, lifecycle) in [
        ("plain", ""),
        (
            "hooked",
            r#"  lifecycle:
    preNormal: {labelsHandler: {registry.example.com/registered: "true"}}
    preDelete: {labelsHandler: {registry.example.com/registered: "true"}, markPodNotReady: true}
"#,
        ),
    ] {
        out.push_str(&format!(
            r#"apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata: {{name: {name}, namespace: {NS}}}
spec:
  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: {name}}}
  requiredPersistentTopology: {{nodeTopologyKeys: [kubernetes.io/hostname]}}
  ipRetention: 1h
{lifecycle}---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {name}, namespace: {NS}}}
spec:
  replicas: 1
  serviceName: {name}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}, bench: lifecycle}}}}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {{kubernetes.io/hostname: node-0}}
      containers:
      - {{name: sleep, image: localhost/ipkeep/busybox:dev, command: [sleep, 1d]}}
---
"#
        ));
    }
    out
}

/// `kubectl get pods -w`, one line per change, timestamped on arrival.
fn watch(kubectl: &Kubectl) -> (Child, mpsc::Receiver<Seen>) {
    let mut child = kubectl
        .command()
        .args([
            "get", "pods", "-n", NS, "-l", "bench=lifecycle", "-w", "-o",
            r#"jsonpath={.metadata.name}|{.metadata.uid}|{.metadata.labels.ipkeep\.dev/lifecycle-state}|{.status.podIP}|{.metadata.labels.registry\.example\.com/registered}|{.status.conditions[?(@.type=="Ready")].status}|{.metadata.deletionTimestamp}|{.status.conditions[?(@.type=="ipkeep.dev/lifecycle-ready")].status}|{.metadata.resourceVersion}{"\n"}"#,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let f: Vec<&str> = line.split('|').collect();
            if f.len() != 9 {
                continue;
            }
            let seen = Seen {
                at: Instant::now(),
                name: f[0].into(),
                uid: f[1].into(),
                state: f[2].into(),
                ip: f[3].into(),
                registered: f[4] == "true",
                ready: f[5] == "True",
                deleting: !f[6].is_empty(),
                gate: f[7].into(),
                version: f[8].into(),
            };
            if tx.send(seen).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// One rebuild's timings (milliseconds).
#[derive(Debug, Default, Clone, Copy)]
struct Rebuild {
    total: f64,
    handshake: f64,
    not_ready: f64,
    deletion_under_way: f64,
    ready_after_registration: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// With `IPKEEP_TRACE`, a line for a command of the rebuild, on the watch lines' clocks.
fn trace_command(started: Instant, at: Instant, what: &str) {
    if std::env::var_os("IPKEEP_TRACE").is_some() {
        eprintln!(
            "  {:>6.0} ms  {}  -- {what}",
            ms(at.saturating_duration_since(started)),
            wall_clock(at)
        );
    }
}

/// `at` as unix seconds with milliseconds, to line the trace up with the kubelet's and the
/// controller's logs.
fn wall_clock(at: Instant) -> String {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(at.elapsed());
    format!("{}.{:03}", wall.as_secs(), wall.subsec_millis())
}

/// Rebuilds `name`-0 once; the operator answers the hooked pod's hooks `operator_delay` after
/// they show.
fn rebuild(
    kubectl: &Kubectl,
    events: &mpsc::Receiver<Seen>,
    name: &str,
    operator_delay: Duration,
) -> Rebuild {
    let pod = format!("{name}-0");
    while events.try_recv().is_ok() {}
    let current = kubectl.get(&["pod", &pod, "-n", NS]).unwrap();
    let old_uid = current["metadata"]["uid"].as_str().unwrap().to_string();
    let hooked = name == "hooked";
    let delete = ["delete", "pod", pod.as_str(), "-n", NS, "--wait=false"];
    let started = Instant::now();
    trace_command(started, started, "the first command");
    if hooked {
        let asked = "ipkeep.dev/lifecycle-state=PreparingDelete";
        kubectl.run(&["label", "pod", pod.as_str(), "-n", NS, "--overwrite", asked]);
    } else {
        kubectl.run(&delete);
    }
    let asked = Instant::now();
    let mut r = Rebuild::default();
    let (mut deregistered, mut registered) = (None::<Instant>, None::<Instant>);
    // The operator's answer: the label change, timed from the moment the watch showed why.
    let label = |arg: String, seen_at: Instant, r: &mut Rebuild| {
        std::thread::sleep(operator_delay);
        kubectl.run(&["label", "pod", pod.as_str(), "-n", NS, &arg]);
        let done = Instant::now();
        trace_command(
            started,
            done,
            &format!("the operator's label {arg} returned"),
        );
        r.handshake += ms(done - seen_at);
        done
    };
    loop {
        let seen = events
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{pod} was not rebuilt within 120 s"));
        if seen.name != pod {
            continue;
        }
        if std::env::var_os("IPKEEP_TRACE").is_some() {
            eprintln!(
                "  {:>6.0} ms  {}  {} {} rv={} state={} ip={} registered={} gate={} ready={} deleting={}",
                ms(seen.at.saturating_duration_since(started)),
                wall_clock(seen.at),
                seen.name,
                &seen.uid[..8.min(seen.uid.len())],
                seen.version,
                seen.state,
                seen.ip,
                seen.registered,
                seen.gate,
                seen.ready,
                seen.deleting
            );
        }
        if seen.uid == old_uid {
            if hooked && seen.state == "PreparingDelete" && !seen.ready && seen.registered {
                if r.not_ready == 0.0 {
                    r.not_ready = ms(seen.at - asked);
                }
                if deregistered.is_none() {
                    let done = label(format!("{REGISTERED}-"), seen.at, &mut r);
                    deregistered = Some(done);
                    // The person deletes it now that the operator is done.
                    kubectl.run(&delete);
                    trace_command(started, Instant::now(), "the person's delete returned");
                    r.handshake += ms(Instant::now() - done);
                }
            }
            if seen.deleting
                && r.deletion_under_way == 0.0
                && let Some(at) = deregistered
            {
                r.deletion_under_way = ms(seen.at.saturating_duration_since(at));
            }
            continue;
        }
        if hooked
            && seen.state == "PreparingNormal"
            && !seen.ip.is_empty()
            && !seen.registered
            && registered.is_none()
        {
            registered = Some(label(format!("{REGISTERED}=true"), seen.at, &mut r));
        }
        if seen.ready && !seen.deleting {
            if let Some(at) = registered {
                r.ready_after_registration = ms(seen.at.saturating_duration_since(at));
            }
            r.total = ms(seen.at - started);
            return r;
        }
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(state) = std::env::var_os("IPKEEP_CLUSTER_STATE") else {
        eprintln!(
            "SKIPPED: the lifecycle benchmark needs a running cluster with real nodes: IPKEEP_CLUSTER_STATE=DIR (scripts/bench-lifecycle.sh brings one up)"
        );
        return;
    };
    let rounds = std::env::var("IPKEEP_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    let operator_delay = Duration::from_millis(
        std::env::var("IPKEEP_OPERATOR_DELAY_MS")
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
    );
    measure(Path::new(&state), rounds, operator_delay);
}

/// Runs `rounds` rebuilds of each, alternating, and prints the report.
fn measure(state: &Path, rounds: usize, operator_delay: Duration) {
    let bin = std::fs::read_to_string(state.join("bin")).unwrap();
    let kubectl = Kubectl::new(
        &Path::new(bin.trim()).join("kubectl"),
        &state.join("admin.kubeconfig"),
    );
    // A run just before this one leaves its namespace terminating for a few seconds.
    let gone_by = Instant::now() + Duration::from_secs(120);
    while kubectl.get(&["namespace", NS]).is_some() && Instant::now() < gone_by {
        std::thread::sleep(Duration::from_secs(1));
    }
    kubectl.run(&["create", "namespace", NS]);
    kubectl.apply(&manifests());
    let (mut watcher, events) = watch(&kubectl);
    // First creations: the hooked pod needs its registration once.
    let first = Instant::now();
    let mut pending = vec!["plain-0", "hooked-0"];
    while !pending.is_empty() {
        let seen = events
            .recv_timeout(Duration::from_secs(180))
            .expect("the first pods");
        if seen.name == "hooked-0"
            && seen.state == "PreparingNormal"
            && !seen.ip.is_empty()
            && !seen.registered
        {
            kubectl.run(&[
                "label",
                "pod",
                "hooked-0",
                "-n",
                NS,
                &format!("{REGISTERED}=true"),
            ]);
        }
        if seen.ready && !seen.deleting {
            pending.retain(|p| *p != seen.name);
        }
    }
    eprintln!("both pods Ready in {:?}", first.elapsed());
    let (mut plain, mut hooked) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let p = rebuild(&kubectl, &events, "plain", operator_delay);
        let h = rebuild(&kubectl, &events, "hooked", operator_delay);
        eprintln!("round {round}: plain {p:?}\n         hooked {h:?}");
        plain.push(p);
        hooked.push(h);
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    kubectl.run(&["delete", "namespace", NS, "--wait=false"]);

    let column = |rs: &[Rebuild], f: fn(&Rebuild) -> f64| -> (f64, f64) {
        let v: Vec<f64> = rs.iter().map(f).collect();
        let s = Summary::of(&v).expect("at least one round");
        (s.median, s.p90)
    };
    let base = column(&plain, |r| r.total);
    let with = column(&hooked, |r| r.total);
    let own = column(&hooked, |r| r.total - r.handshake);
    let handshake = column(&hooked, |r| r.handshake);
    let not_ready = column(&hooked, |r| r.not_ready);
    let completed = column(&hooked, |r| r.deletion_under_way);
    let ready = column(&hooked, |r| r.ready_after_registration);
    println!(
        "lifecycle hook cost, {rounds} rebuilds each, the operator answering after {} ms (ms, median / p90):",
        operator_delay.as_millis()
    );
    println!(
        "  rebuild without hooks (baseline)          {:>7.0} / {:>7.0}",
        base.0, base.1
    );
    println!(
        "  rebuild with hooks, handshake included    {:>7.0} / {:>7.0}",
        with.0, with.1
    );
    println!(
        "  handshake (2 labels, the person's delete) {:>7.0} / {:>7.0}",
        handshake.0, handshake.1
    );
    println!(
        "  rebuild with hooks, handshake excluded    {:>7.0} / {:>7.0}  ({:.2}x the baseline at the median)",
        own.0,
        own.1,
        own.0 / base.0
    );
    println!(
        "  added by the hooks (difference of medians) {:>6.0}",
        own.0 - base.0
    );
    println!(
        "  asked -> pod not Ready                    {:>7.0} / {:>7.0}",
        not_ready.0, not_ready.1
    );
    println!(
        "  deregistered -> deletion under way        {:>7.0} / {:>7.0}",
        completed.0, completed.1
    );
    println!(
        "  registered -> pod Ready                   {:>7.0} / {:>7.0}",
        ready.0, ready.1
    );
}
