//! The lifecycle hooks (docs/lifecycle.md) on the real nodes the story left running: the example
//! `deploy/examples/lifecycle.yaml` with its toy operator `deploy/examples/registry-operator.sh`
//! playing the service registry. A new pod is not Ready until registered (and, OrderedReady,
//! holds back the next ordinal); a scale-down waits for the deregistration, with the pod not
//! Ready first; a rebuilt pod keeps its IP and goes through PreNormal again; a rolling update
//! passes both hooks for every pod; a drain's evictions are refused with 429 until the operator
//! is done; a person's deletion waits until they ask through the pod's label; a force deletion
//! and a stopped webhook block nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::{Admission, admission_of, repo_root, wait_until};
use ipkeep_tests::kubectl::Kubectl;
use serde_json::Value;

const NS: &str = "hooks";
const STATE: &str = "ipkeep.dev/lifecycle-state";
const GATE: &str = "ipkeep.dev/lifecycle-ready";
const REGISTERED: &str = "registry.example.com/registered";

/// One line of the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    action: String,
    pod: String,
    uid: String,
    ip: String,
    ready: String,
}

/// `registry-operator.sh`, running until dropped.
struct Operator {
    child: Child,
}

impl Operator {
    fn start(kubectl: &Kubectl, registry: &Path) -> Operator {
        let child = Command::new(repo_root().join("deploy/examples/registry-operator.sh"))
            .args([NS, "app=broker"])
            .arg(registry)
            .arg("0.3")
            .env("KUBECTL", kubectl.bin())
            .env("KUBECONFIG", kubectl.kubeconfig())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Operator { child }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Hooks {
    kubectl: Kubectl,
    registry: PathBuf,
    /// How the cluster's pods get their hooks at CREATE (scripts/cluster.sh --admission).
    admission: Admission,
}

impl Hooks {
    fn entries(&self) -> Vec<Entry> {
        std::fs::read_to_string(&self.registry)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.len() == 6).then(|| Entry {
                    action: f[1].into(),
                    pod: f[2].into(),
                    uid: f[3].into(),
                    ip: f[4].into(),
                    ready: f[5].trim_start_matches("ready=").into(),
                })
            })
            .collect()
    }

    fn pod(&self, name: &str) -> Option<Value> {
        self.kubectl.get(&["pod", name, "-n", NS])
    }

    fn pods(&self) -> Vec<Value> {
        let list = self
            .kubectl
            .get(&["pods", "-n", NS, "-l", "app=broker"])
            .unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until exactly `names` exist, each Ready, Normal and not terminating; returns them.
    fn wait_normal(&self, what: &str, names: &[&str]) -> Vec<Value> {
        wait_until(what, Duration::from_secs(240), || {
            let pods = self.pods();
            let ok = pods.len() == names.len()
                && pods.iter().all(|p| {
                    names.contains(&name(p))
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && condition(p, "Ready") == "True"
                        && p["metadata"]["labels"][STATE] == "Normal"
                });
            ok.then_some(pods)
        })
    }
}

fn name(pod: &Value) -> &str {
    pod["metadata"]["name"].as_str().unwrap_or_default()
}

fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn ip(pod: &Value) -> String {
    pod["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn condition<'p>(pod: &'p Value, type_: &str) -> &'p str {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
}

/// Every step, in order, in namespace `hooks`; it is deleted at the end.
pub fn on_real_nodes(state: &Path) {
    let bin = std::fs::read_to_string(state.join("bin")).unwrap();
    let kubectl = Kubectl::new(
        &Path::new(bin.trim()).join("kubectl"),
        &state.join("admin.kubeconfig"),
    );
    let work = tempfile::tempdir().unwrap();
    let hooks = Hooks {
        kubectl,
        registry: work.path().join("registry"),
        admission: admission_of(state),
    };
    hooks.kubectl.run(&["create", "namespace", NS]);
    // The example as a user applies it; the nodes have no registry, so our own busybox.
    let example = std::fs::read_to_string(repo_root().join("deploy/examples/lifecycle.yaml"))
        .unwrap()
        .replace("busybox:1.36", "localhost/ipkeep/busybox:dev");
    // The whole file at once, as a user applies it: the first pod waits for its hooks' admission
    // plan (docs/lifecycle.md), and `not_ready_until_registered` checks it got them.
    let out = hooks
        .kubectl
        .try_run(&["apply", "-n", NS, "-f", "-"], Some(&example));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let started = Instant::now();
    not_ready_until_registered(&hooks);
    let operator = Operator::start(&hooks.kubectl, &hooks.registry);
    let first = registered_then_ready(&hooks);
    scale_down_waits_for_deregistration(&hooks, &first);
    let rebuilt = a_rebuilt_pod_keeps_its_ip_and_registers_again(&hooks, &first);
    a_rolling_update_passes_both_hooks(&hooks, &rebuilt);
    a_persons_deletion_waits_until_asked_through_the_label(&hooks);
    drop(operator);
    a_drain_waits_for_the_operator(&hooks);
    nothing_blocks_a_force_deletion_or_a_stopped_webhook(&hooks);
    eprintln!("lifecycle steps took {:?}", started.elapsed());
    // Nothing held: the registered labels off, then the namespace.
    hooks.kubectl.run(&[
        "label",
        "pods",
        "--all",
        "-n",
        NS,
        &format!("{REGISTERED}-"),
    ]);
    hooks
        .kubectl
        .run(&["delete", "namespace", NS, "--wait=false"]);
}

/// Without the operator, broker-0 runs (it has its IP) but is PreparingNormal and not Ready,
/// its gate False; OrderedReady, broker-1 is not created.
fn not_ready_until_registered(hooks: &Hooks) {
    let pod = wait_until(
        "broker-0 running, PreparingNormal",
        Duration::from_secs(180),
        || {
            hooks.pod("broker-0").filter(|p| {
                p["status"]["phase"] == "Running"
                    && !ip(p).is_empty()
                    && condition(p, GATE) == "False"
            })
        },
    );
    assert_eq!(pod["metadata"]["labels"][STATE], "PreparingNormal");
    assert!(pod["metadata"]["labels"][REGISTERED].is_null(), "{pod:#}");
    assert_eq!(
        pod["spec"]["readinessGates"][0]["conditionType"], GATE,
        "{pod:#}"
    );
    std::thread::sleep(Duration::from_secs(5));
    let pod = hooks.pod("broker-0").unwrap();
    assert_eq!(condition(&pod, "ContainersReady"), "True", "{pod:#}");
    assert_eq!(
        condition(&pod, "Ready"),
        "False",
        "not Ready while unregistered"
    );
    assert!(
        hooks.pod("broker-1").is_none(),
        "OrderedReady waits for broker-0"
    );
}

/// The operator registers each pod while it is not Ready yet; both become Ready and Normal.
fn registered_then_ready(hooks: &Hooks) -> Vec<Value> {
    let pods = hooks.wait_normal(
        "broker-0 and broker-1 registered",
        &["broker-0", "broker-1"],
    );
    let entries = hooks.entries();
    for pod in &pods {
        let registered: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.action == "register" && e.uid == uid(pod))
            .collect();
        assert_eq!(registered.len(), 1, "{} once: {entries:?}", name(pod));
        assert_eq!(registered[0].ip, ip(pod));
        assert_eq!(registered[0].ready, "False", "registered before Ready");
        assert_eq!(pod["metadata"]["labels"][REGISTERED], "true");
    }
    pods
}

/// Scale to 1: broker-1's deletion is held until the operator deregistered it, and it is not
/// Ready (markPodNotReady) before it goes.
fn scale_down_waits_for_deregistration(hooks: &Hooks, before: &[Value]) {
    let old = before.iter().find(|p| name(p) == "broker-1").unwrap();
    hooks
        .kubectl
        .run(&["scale", "sts", "broker", "-n", NS, "--replicas=1"]);
    let mut held_not_ready = false;
    wait_until("broker-1 gone", Duration::from_secs(120), || {
        match hooks.pod("broker-1") {
            None => Some(()),
            Some(p) => {
                if p["metadata"]["labels"][STATE] == "PreparingDelete"
                    && condition(&p, "Ready") == "False"
                {
                    held_not_ready = true;
                }
                None
            }
        }
    });
    let deregistered: Vec<Entry> = hooks
        .entries()
        .into_iter()
        .filter(|e| e.action == "deregister" && e.uid == uid(old))
        .collect();
    assert_eq!(deregistered.len(), 1, "{:?}", hooks.entries());
    assert_ne!(deregistered[0].ready, "True", "not Ready when deregistered");
    assert!(
        held_not_ready,
        "broker-1 was seen PreparingDelete and not Ready before it went"
    );
}

/// Scale back to 2: broker-1 comes back with its IP (retention) and through PreNormal again,
/// so the registry sees it.
fn a_rebuilt_pod_keeps_its_ip_and_registers_again(hooks: &Hooks, first: &[Value]) -> Vec<Value> {
    hooks
        .kubectl
        .run(&["scale", "sts", "broker", "-n", NS, "--replicas=2"]);
    let pods = hooks.wait_normal("broker-1 back and registered", &["broker-0", "broker-1"]);
    let broker_1 = |ps: &[Value]| ps.iter().find(|p| name(p) == "broker-1").unwrap().clone();
    let (old, new) = (broker_1(first), broker_1(&pods));
    assert_ne!(uid(&old), uid(&new));
    assert_eq!(ip(&new), ip(&old), "the rebuilt pod keeps its IP");
    assert!(
        hooks
            .entries()
            .iter()
            .any(|e| e.action == "register" && e.uid == uid(&new) && e.ip == ip(&old)),
        "{:?}",
        hooks.entries()
    );
    pods
}

/// A rolling update rebuilds each pod through PreDelete then PreNormal: for every pod, the
/// registry saw its old UID deregistered, then its new UID registered with the same IP.
fn a_rolling_update_passes_both_hooks(hooks: &Hooks, before: &[Value]) {
    hooks.kubectl.run(&[
        "patch",
        "sts",
        "broker",
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"metadata":{"labels":{"rollout":"1"}}}}}"#,
    ]);
    let after = wait_until("the rolling update", Duration::from_secs(300), || {
        let pods = hooks.wait_normal("both pods Normal", &["broker-0", "broker-1"]);
        pods.iter()
            .all(|p| p["metadata"]["labels"]["rollout"] == "1")
            .then_some(pods)
    });
    let entries = hooks.entries();
    for old in before {
        let new = after.iter().find(|p| name(p) == name(old)).unwrap();
        let at = |action: &str, u: &str| {
            entries
                .iter()
                .position(|e| e.action == action && e.uid == u)
        };
        let gone = at("deregister", &uid(old))
            .unwrap_or_else(|| panic!("{} deregistered: {entries:?}", name(old)));
        let back = at("register", &uid(new))
            .unwrap_or_else(|| panic!("{} registered: {entries:?}", name(new)));
        assert!(
            gone < back,
            "{}: deregistered before its rebuild registered",
            name(old)
        );
        assert_eq!(ip(new), ip(old), "{} keeps its IP", name(old));
    }
}

/// `kubectl delete pod` of a registered pod is refused and starts nothing (the webhook cannot
/// tell who asks, so it changes nothing); labelled `PreparingDelete` by the person, the pod is
/// held (`request`), the operator deregisters it, and the person's retry passes. ipkeep never
/// deletes it itself.
fn a_persons_deletion_waits_until_asked_through_the_label(hooks: &Hooks) {
    let pod = hooks.pod("broker-1").unwrap();
    let delete = ["delete", "pod", "broker-1", "-n", NS, "--wait=false"];
    let out = hooks.kubectl.try_run(&delete, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the deletion passed");
    assert!(err.contains("is not PreparingDelete yet"), "{err}");
    assert!(
        err.contains("kubectl label pod broker-1 ipkeep.dev/lifecycle-state=PreparingDelete"),
        "{err}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let still = hooks.pod("broker-1").unwrap();
    assert_eq!(uid(&still), uid(&pod));
    assert_eq!(
        still["metadata"]["labels"][STATE], "Normal",
        "a refusal marks nothing"
    );
    assert_eq!(condition(&still, "Ready"), "True");
    hooks.kubectl.run(&[
        "label",
        "pod",
        "broker-1",
        "-n",
        NS,
        &format!("{STATE}=PreparingDelete"),
        "--overwrite",
    ]);
    wait_until(
        "broker-1 deregistered by the operator",
        Duration::from_secs(60),
        || {
            hooks.pod("broker-1").filter(|p| {
                p["metadata"]["labels"][REGISTERED].is_null()
                    && p["metadata"]["annotations"]["ipkeep.dev/lifecycle-held"] == "request"
            })
        },
    );
    assert_eq!(
        hooks.pod("broker-1").map(|p| uid(&p)),
        Some(uid(&pod)),
        "ipkeep does not delete a pod for a person"
    );
    wait_until(
        "the person's deletion passes",
        Duration::from_secs(60),
        || {
            hooks
                .kubectl
                .try_run(&delete, None)
                .status
                .success()
                .then_some(())
        },
    );
    hooks.wait_normal("broker-1 back and registered", &["broker-0", "broker-1"]);
}

/// With the operator stopped, `kubectl drain` of broker-0's node (its broker pods only) cordons
/// the node, which marks the registered pods there PreparingDelete (`drain`) and takes them out
/// of their Services, and their evictions are refused with 429; with the operator back, a drain
/// passes once it deregistered them. Uncordoned, the node takes the rebuilt pods back.
fn a_drain_waits_for_the_operator(hooks: &Hooks) {
    let pod = hooks.pod("broker-0").unwrap();
    let node = pod["spec"]["nodeName"].as_str().unwrap().to_string();
    let drain = |timeout: &str| {
        hooks.kubectl.try_run(
            &[
                "drain",
                &node,
                "--pod-selector=app=broker",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                &format!("--timeout={timeout}"),
            ],
            None,
        )
    };
    let out = drain("8s");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the drain passed without the operator"
    );
    assert!(
        err.contains("429")
            || err.contains("TooManyRequests")
            || err.contains("Too Many Requests")
            || err.contains("waits for its preDelete hook"),
        "{err}"
    );
    let held = wait_until(
        "broker-0 PreparingDelete (drain), not Ready",
        Duration::from_secs(60),
        || {
            hooks.pod("broker-0").filter(|p| {
                p["metadata"]["labels"][STATE] == "PreparingDelete"
                    && p["metadata"]["annotations"]["ipkeep.dev/lifecycle-held"] == "drain"
                    && condition(p, "Ready") == "False"
            })
        },
    );
    assert!(held["metadata"]["annotations"]["ipkeep.dev/lifecycle-since"].is_string());
    let _operator = Operator::start(&hooks.kubectl, &hooks.registry);
    let out = drain("120s");
    assert!(
        out.status.success(),
        "the drain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        hooks
            .entries()
            .iter()
            .any(|e| e.action == "deregister" && e.uid == uid(&held)),
        "{:?}",
        hooks.entries()
    );
    hooks.kubectl.run(&["uncordon", &node]);
    hooks.wait_normal("broker-0 back", &["broker-0", "broker-1"]);
}

/// With the operator stopped: a force deletion of a registered pod passes at once, and so does
/// a plain deletion while ipkeep-scheduler-ext is down (its webhooks fail open); the pod created
/// meanwhile has no hooks at all through the webhook, so it is Ready without the operator, and
/// its hooks through the admission policy (which needs no server), Ready once registered.
fn nothing_blocks_a_force_deletion_or_a_stopped_webhook(hooks: &Hooks) {
    let forced = hooks.pod("broker-1").unwrap();
    assert_eq!(forced["metadata"]["labels"][REGISTERED], "true");
    let started = Instant::now();
    hooks.kubectl.run(&[
        "delete",
        "pod",
        "broker-1",
        "-n",
        NS,
        "--grace-period=0",
        "--force",
    ]);
    wait_until("broker-1 force-deleted", Duration::from_secs(30), || {
        hooks
            .pod("broker-1")
            .is_none_or(|p| uid(&p) != uid(&forced))
            .then_some(())
    });
    eprintln!("force deletion passed in {:?}", started.elapsed());

    let ext = ["-n", "ipkeep-system", "deployment/ipkeep-scheduler-ext"];
    hooks
        .kubectl
        .run(&[&["scale", "--replicas=0"][..], &ext].concat());
    wait_until(
        "ipkeep-scheduler-ext stopped",
        Duration::from_secs(60),
        || {
            let pods = hooks
                .kubectl
                .get(&[
                    "pods",
                    "-n",
                    "ipkeep-system",
                    "-l",
                    "app.kubernetes.io/name=ipkeep-scheduler-ext",
                ])
                .unwrap();
            pods["items"]
                .as_array()
                .is_some_and(Vec::is_empty)
                .then_some(())
        },
    );
    let held = hooks.pod("broker-0").unwrap();
    assert_eq!(held["metadata"]["labels"][REGISTERED], "true");
    hooks
        .kubectl
        .run(&["delete", "pod", "broker-0", "-n", NS, "--wait=false"]);
    // Through the admission policy the pod gets its hooks with no ipkeep server running (and
    // is Ready once registered); through the webhook it gets none and is Ready at once.
    let policy = hooks.admission == Admission::Policy;
    let recreated =
        |p: &Value| uid(p) != uid(&held) && p["metadata"]["deletionTimestamp"].is_null();
    if policy {
        let back = wait_until(
            "broker-0 re-created with its hooks by the admission policy",
            Duration::from_secs(120),
            || hooks.pod("broker-0").filter(|p| recreated(p)),
        );
        assert!(
            back["metadata"]["labels"][STATE].is_string()
                && !back["spec"]["readinessGates"].is_null(),
            "created while ipkeep-scheduler-ext was down, through the policy: no hooks, {back:#}"
        );
        hooks.kubectl.run(&[
            "label",
            "pod",
            "broker-0",
            "-n",
            NS,
            &format!("{REGISTERED}=true"),
            "--overwrite",
        ]);
    }
    let back = wait_until(
        "broker-0 re-created and Ready",
        Duration::from_secs(120),
        || {
            hooks
                .pod("broker-0")
                .filter(|p| recreated(p) && condition(p, "Ready") == "True")
        },
    );
    if !policy {
        assert!(
            back["metadata"]["labels"][STATE].is_null() && back["spec"]["readinessGates"].is_null(),
            "created while the webhook was down: no hooks, {back:#}"
        );
    }
    hooks
        .kubectl
        .run(&[&["scale", "--replicas=2"][..], &ext].concat());
    hooks
        .kubectl
        .run(&[&["rollout", "status", "--timeout=180s"][..], &ext].concat());
    one_replica_per_node(&hooks.kubectl, &ext);
}

/// The later steps power nodes off: as after `cluster.sh up`, the two webhook replicas must not
/// share a node (their anti-affinity is preferred only).
fn one_replica_per_node(kubectl: &Kubectl, deployment: &[&str]) {
    let selector = "app.kubernetes.io/name=ipkeep-scheduler-ext";
    for _ in 0..5 {
        let pods = wait_until(
            "two ipkeep-scheduler-ext replicas Ready",
            Duration::from_secs(180),
            || {
                let list = kubectl
                    .get(&["pods", "-n", "ipkeep-system", "-l", selector])
                    .unwrap();
                let pods: Vec<Value> = list["items"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                    .collect();
                (pods.len() == 2 && pods.iter().all(|p| condition(p, "Ready") == "True"))
                    .then_some(pods)
            },
        );
        let nodes: std::collections::BTreeSet<&str> = pods
            .iter()
            .filter_map(|p| p["spec"]["nodeName"].as_str())
            .collect();
        if nodes.len() == 2 {
            return;
        }
        kubectl.run(&["delete", "pod", "-n", "ipkeep-system", name(&pods[1])]);
    }
    panic!("ipkeep-scheduler-ext's replicas stay on one node ({deployment:?})");
}
