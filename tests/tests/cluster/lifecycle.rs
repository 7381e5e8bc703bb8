//! The lifecycle hooks' security on a real API server (docs/lifecycle.md, "Who can cause what"):
//! requests to the webhook that anyone on the pod network can send, and pod labels that anyone
//! who may patch a pod can write, delete nothing and mark nothing; what does start a preDelete
//! hook is the StatefulSet as the API server has it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use ipkeep_tests::cluster::{Cluster, wait_until};

use serde_json::{Value, json};

use crate::hooks::{REGISTERED, STATE, gate};
use crate::persistent_pod_state;

const NS: &str = "guard";
const HELD: &str = "ipkeep.dev/lifecycle-held";
const SINCE: &str = "ipkeep.dev/lifecycle-since";

/// PersistentPodState `guarded` with a preDelete hook, and its StatefulSet: two pods started in
/// order (the default), with a termination grace.
fn persistent_pod_state_with_hooks() -> String {
    let hook = r#"  lifecycle:
    preDelete:
      labelsHandler: {registry.example.com/registered: "true"}
      markPodNotReady: true
      timeoutSeconds: 5
"#;
    persistent_pod_state(NS, "guarded", hook)
}

const STATEFULSET: &str = r#"---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: guarded, namespace: guard}
spec:
  serviceName: guarded
  replicas: 2
  selector: {matchLabels: {app: guarded}}
  template:
    metadata: {labels: {app: guarded}}
    spec:
      # Not 0: with 0, every deletion of the pod is a force deletion, which no hook holds.
      terminationGracePeriodSeconds: 1
      tolerations: [{key: kwok.x-k8s.io/node, operator: Exists, effect: NoSchedule}]
      containers: [{name: c, image: localhost/ipkeep/busybox:1.35}]
"#;

/// A pod outside any StatefulSet, in kube-system, that someone who may patch pods labelled as
/// ipkeep would (the review's "deputy" case).
const BYSTANDER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: bystander
  namespace: kube-system
  labels: {ipkeep.dev/lifecycle-state: PreparingDelete}
  annotations: {ipkeep.dev/lifecycle-held: deletion, ipkeep.dev/lifecycle-since: "0"}
spec:
  nodeName: kwok-0
  terminationGracePeriodSeconds: 0
  tolerations: [{key: kwok.x-k8s.io/node, operator: Exists, effect: NoSchedule}]
  containers: [{name: c, image: localhost/ipkeep/busybox:1.35}]
"#;

fn pod(cluster: &Cluster, namespace: &str, name: &str) -> Option<Value> {
    cluster.get(&["pod", name, "-n", namespace])
}

/// POSTs `review` to the webhook as anyone on the network would. When the cluster's webhook
/// requires client certificates (`--webhook-client-auth`), the request presents the API
/// server's: what matters here is what a request that reaches the server can do, and the
/// default install takes requests from anyone.
fn forge(cluster: &Cluster, review: &Value) -> Value {
    let env = std::fs::read_to_string(cluster.state().join("ipkeep.env")).unwrap_or_default();
    let url = env
        .lines()
        .find_map(|l| l.strip_prefix("IPKEEP_EXT_URL="))
        .expect("the webhook's address");
    let mut curl = Command::new("curl");
    curl.args([
        "-sk",
        "--max-time",
        "5",
        "-H",
        "Content-Type: application/json",
        "-d",
    ])
    .arg(review.to_string())
    .arg(format!("{url}/validate-pods"));
    if env.lines().any(|l| l == "IPKEEP_EXT_CLIENT_AUTH=1") {
        let pki = cluster.state().join("pki");
        curl.arg("--cert")
            .arg(pki.join("apiserver-webhook-client.crt"))
            .arg("--key")
            .arg(pki.join("apiserver-webhook-client.key"));
    }
    let out = curl.output().expect("run curl");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the webhook's answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn review(operation: &str, name: &str, sub: Option<&str>, old: Option<&Value>) -> Value {
    let mut request = json!({
        "uid": "forged", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": NS, "name": name, "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:statefulset-controller"},
    });
    if let Some(sub) = sub {
        request["subResource"] = json!(sub);
        request["object"] = json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": NS}});
    }
    if let Some(old) = old {
        request["oldObject"] = old.clone();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// The step.
pub fn forged_requests_and_pod_labels_delete_nothing(cluster: &Cluster) {
    // The server that takes unauthenticated requests may not write pods at all.
    let sa = "system:serviceaccount:ipkeep-system:ipkeep-scheduler-ext";
    for verb in ["patch", "update", "delete", "create"] {
        let out = cluster.try_run(&["auth", "can-i", verb, "pods", "--as", sa, "-A"], None);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "no",
            "ipkeep-scheduler-ext may {verb} pods"
        );
    }
    cluster.run(&["create", "namespace", NS]);
    // The PersistentPodState and its StatefulSet in one file: the first pod gets its hooks too
    // (its creation waits for the hooks' admission plan; docs/lifecycle.md).
    cluster.apply(&format!(
        "{}{STATEFULSET}",
        persistent_pod_state_with_hooks()
    ));
    for name in ["guarded-0", "guarded-1"] {
        wait_until(
            &format!("{name} Normal with its gate"),
            Duration::from_secs(90),
            || {
                pod(cluster, NS, name)
                    .filter(|p| p["metadata"]["labels"][STATE] == "Normal" && gate(p) == "True")
            },
        );
        cluster.run(&[
            "label",
            "pod",
            name,
            "-n",
            NS,
            &format!("{REGISTERED}=true"),
        ]);
    }
    let before: Vec<Value> = ["guarded-0", "guarded-1"]
        .iter()
        .map(|n| pod(cluster, NS, n).expect("the pod"))
        .collect();

    // Forged reviews: answered (held: the pods carry their hook), nothing else.
    for (what, forged) in [
        (
            "DELETE without oldObject",
            review("DELETE", "guarded-0", None, None),
        ),
        (
            "DELETE with the pod",
            review("DELETE", "guarded-0", None, Some(&before[0])),
        ),
        (
            "eviction",
            review("CREATE", "guarded-1", Some("eviction"), None),
        ),
    ] {
        let answer = forge(cluster, &forged);
        assert_eq!(
            answer["response"]["allowed"],
            json!(false),
            "{what}: the webhook answers as for a real request: {answer}"
        );
    }
    // A pod ipkeep manages, and one it does not, labelled as if a scale-down held them long ago.
    cluster.apply(BYSTANDER);
    cluster.run(&[
        "label",
        "pod",
        "guarded-1",
        "-n",
        NS,
        "--overwrite",
        &format!("{STATE}=PreparingDelete"),
    ]);
    cluster.run(&[
        "annotate",
        "pod",
        "guarded-1",
        "-n",
        NS,
        "--overwrite",
        &format!("{HELD}=scale-down"),
        &format!("{SINCE}=0"),
    ]);
    // Past the hook's timeout (5 s), the moment the controller used to delete forged marks.
    std::thread::sleep(Duration::from_secs(10));
    for old in &before {
        let name = old["metadata"]["name"].as_str().unwrap_or_default();
        let now = pod(cluster, NS, name).unwrap_or_else(|| panic!("{name} was deleted"));
        assert_eq!(
            now["metadata"]["uid"], old["metadata"]["uid"],
            "{name} was rebuilt"
        );
        assert!(
            now["metadata"]["deletionTimestamp"].is_null(),
            "{name} is being deleted"
        );
        assert_eq!(
            now["metadata"]["labels"][STATE], "Normal",
            "{name}: {now:#}"
        );
        assert!(
            now["metadata"]["annotations"][HELD].is_null(),
            "{name}: {now:#}"
        );
        assert_eq!(gate(&now), "True", "{name} was taken out of its Services");
    }
    let bystander = pod(cluster, "kube-system", "bystander").expect("the bystander was deleted");
    assert!(bystander["metadata"]["deletionTimestamp"].is_null());

    // What does start the hook: the StatefulSet scaled down. guarded-1 is held, not Ready,
    // until the operator deregisters it; then ipkeep deletes it.
    let versions = watch_hold(cluster, "guarded-1");
    cluster.run(&["scale", "sts", "guarded", "-n", NS, "--replicas=1"]);
    let held = wait_or_explain(cluster, "guarded-1 held for the scale-down", || {
        pod(cluster, NS, "guarded-1").filter(|p| {
            p["metadata"]["labels"][STATE] == "PreparingDelete"
                && p["metadata"]["annotations"][HELD] == "scale-down"
                && gate(p) == "False"
        })
    });
    // ipkeep holds it in one write: every version of the pod is Normal and Ready by its gate,
    // or held and not (the kubelet syncs a pod once per version it sees, each sync a relist
    // after the last: a hold written in two cost a held pod's deletion up to a second).
    for version in versions() {
        assert!(
            ["Normal||True", "PreparingDelete|scale-down|False"].contains(&version.as_str()),
            "guarded-1 was seen half held (state|held|gate): {version}"
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    let still = pod(cluster, NS, "guarded-1").expect("held while registered");
    assert_eq!(still["metadata"]["uid"], held["metadata"]["uid"]);
    assert!(still["metadata"]["deletionTimestamp"].is_null());
    cluster.run(&[
        "label",
        "pod",
        "guarded-1",
        "-n",
        NS,
        &format!("{REGISTERED}-"),
    ]);
    wait_or_explain(cluster, "guarded-1 deleted once deregistered", || {
        pod(cluster, NS, "guarded-1")
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
            .then_some(())
    });
    cluster.run(&[
        "delete",
        "pod",
        "bystander",
        "-n",
        "kube-system",
        "--wait=false",
    ]);
    cluster.run(&["delete", "namespace", NS, "--wait=false"]);
}

/// Watches `name`'s state label, held annotation and gate (`state|held|gate`, one line per
/// version from now); the returned function stops the watch and gives what it saw.
fn watch_hold(cluster: &Cluster, name: &str) -> impl FnOnce() -> Vec<String> {
    let mut child = cluster
        .command()
        .args([
            "get",
            "pod",
            name,
            "-n",
            NS,
            "-w",
            "-o",
            r#"jsonpath={.metadata.labels.ipkeep\.dev/lifecycle-state}|{.metadata.annotations.ipkeep\.dev/lifecycle-held}|{.status.conditions[?(@.type=="ipkeep.dev/lifecycle-ready")].status}{"\n"}"#,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let out = child.stdout.take().expect("its stdout");
    let lines = std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    // The watch has shown the pod as it is before anything changes.
    std::thread::sleep(Duration::from_secs(1));
    move || {
        // Versions written with the last one arrive within the second.
        std::thread::sleep(Duration::from_secs(1));
        let _ = child.kill();
        let _ = child.wait();
        lines.join().expect("the watch's reader")
    }
}

/// Waits a minute for `f`, else fails with what the controllers said about this namespace and
/// where its pods stand.
fn wait_or_explain<T>(cluster: &Cluster, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        if std::time::Instant::now() > deadline {
            let logs: Vec<String> = ["controller-0", "controller-1", "scheduler-ext"]
                .iter()
                .flat_map(|c| {
                    cluster
                        .log_tail(c, 400)
                        .lines()
                        .map(str::to_string)
                        .collect::<Vec<_>>()
                })
                .filter(|l| l.contains(NS) || l.contains("guarded"))
                .collect();
            let pods = cluster.run(&["get", "pods", "-n", NS, "-o", "wide", "--show-labels"]);
            let events = cluster.run(&["get", "events", "-n", NS]);
            let sts = cluster.run(&[
                "get",
                "sts",
                "guarded",
                "-n",
                NS,
                "-o",
                "jsonpath={.metadata.generation} {.status}",
            ]);
            panic!(
                "timed out waiting for {what}\npods:\n{pods}\nevents:\n{events}\nstatefulset: {sts}\nipkeep:\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
