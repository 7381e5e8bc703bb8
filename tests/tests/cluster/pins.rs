//! How the pinning admission (the webhook, or the admission policy where the cluster runs it)
//! and the extender pin rebuilt pods on the real control plane, and how they explain a pin
//! they cannot apply.

use super::{LONG, kill, persistent_pod_state, rebuild, statefulset, uid};
use ipkeep_tests::cluster::{Admission, Cluster, wait_until};
use serde_json::Value;

/// A pod whose own constraints exclude its recorded node is not pinned: a client creating it
/// with kubectl sees the admission warning, the pod carries `ipkeep.dev/pin-skipped`, and the
/// controller records a `PinSkipped` Event on the PersistentPodState naming the pod.
pub fn a_conflicting_pin_is_skipped_and_explained(cluster: &Cluster) {
    let retention = "  persistentPodStateRetentionPolicy: WhenDeleted\n";
    cluster.apply(&persistent_pod_state("db", "cf", retention));
    let sts = statefulset("cf", 2).replace(
        "    ipkeep.dev/auto-generate-persistent-pod-state: \"true\"\n",
        "",
    );
    cluster.apply(&sts);
    let node_of = |pod: &str| -> Option<String> {
        cluster.get(&["pps", "cf", "-n", "db"])?["status"]["podStates"][pod]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(str::to_string)
    };
    let node0 = wait_until("cf-0 recorded", LONG, || node_of("cf-0"));
    let node1 = wait_until("cf-1 recorded", LONG, || node_of("cf-1"));

    // WhenDeleted: the record of cf-1 outlives its pod.
    cluster.run(&["scale", "statefulset", "cf", "-n", "db", "--replicas=1"]);
    wait_until("cf-1 gone", LONG, || {
        cluster
            .get(&["pod", "cf-1", "-n", "db"])
            .is_none()
            .then_some(())
    });
    assert_eq!(
        node_of("cf-1").as_deref(),
        Some(node1.as_str()),
        "WhenDeleted: the record of cf-1 went with its pod"
    );

    // kubectl creates cf-1 (dry run: the StatefulSet controller is not involved) with an
    // affinity that excludes its recorded node; the pod-name label is what the webhook's
    // objectSelector sends to ipkeep, as on every StatefulSet pod.
    let sts_uid = uid(&cluster.get(&["sts", "cf", "-n", "db"]).expect("sts cf"));
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: cf-1
  namespace: db
  labels: {{app: cf, statefulset.kubernetes.io/pod-name: cf-1}}
  annotations: {{ipkeep.dev/persistent-pod-state: cf}}
  ownerReferences:
    - {{apiVersion: apps/v1, kind: StatefulSet, name: cf, uid: "{sts_uid}", controller: true}}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {{key: kubernetes.io/hostname, operator: NotIn, values: [{node1}]}}
  containers: [{{name: db, image: localhost/ipkeep/busybox:1.35}}]
"#
    );
    let out = cluster.try_run(
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&pod),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "conflict: dry-run create failed: {stderr}"
    );
    // The webhook decides on the pod and warns; the policy's pin was decided on the template,
    // which this pod does not follow, so it applies none and says so on the pod.
    if cluster.admission() == Admission::Webhook {
        assert!(
            stderr.contains("Warning: ipkeep: pod cf-1 not pinned, because the pod's own constraints exclude its recorded node"),
            "conflict: kubectl shows no warning: {stderr}"
        );
    }
    let created: Value = serde_json::from_slice(&out.stdout).expect("kubectl printed JSON");
    assert!(
        created["metadata"]["annotations"]["ipkeep.dev/pin-skipped"].is_string(),
        "conflict: the pod is not marked: {}",
        created["metadata"]
    );

    // The StatefulSet controller re-creates cf-0 from a template that excludes its node.
    let patch = format!(
        r#"{{"spec":{{"template":{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"kubernetes.io/hostname","operator":"NotIn","values":["{node0}"]}}]}}]}}}}}}}}}}}}}}"#
    );
    let old = uid(&cluster.get(&["pod", "cf-0", "-n", "db"]).expect("cf-0"));
    cluster.run(&[
        "patch",
        "sts",
        "cf",
        "-n",
        "db",
        "--type=merge",
        "-p",
        &patch,
    ]);
    let rebuilt = wait_until(
        "cf-0 re-created by the rolling update and scheduled",
        LONG,
        || {
            let p = cluster.get(&["pod", "cf-0", "-n", "db"])?;
            (uid(&p) != old && p["spec"]["nodeName"].is_string()).then_some(p)
        },
    );
    let skipped = rebuilt["metadata"]["annotations"]["ipkeep.dev/pin-skipped"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Through the policy, a pod the StatefulSet re-creates within moments of its template's
    // change may come before the controller's plan for the new template: it is then marked as
    // not following the plan's template, and the extender decides on it.
    let undecided = cluster.admission() == Admission::Policy
        && skipped.contains("differ from its StatefulSet's template");
    assert!(
        skipped.contains(&node0) || undecided,
        "conflict: the re-created pod's mark does not name {node0}: {}",
        rebuilt["metadata"]
    );
    assert_ne!(rebuilt["spec"]["nodeName"], node0.as_str());
    let new_uid = uid(&rebuilt);
    let event = wait_until("a PinSkipped Event naming cf-0", LONG, || {
        let events = cluster.get(&[
            "events",
            "-n",
            "db",
            "--field-selector",
            "reason=PinSkipped,involvedObject.name=cf",
        ])?;
        events["items"]
            .as_array()?
            .iter()
            .find(|e| e["message"].as_str().is_some_and(|m| m.contains(&new_uid)))
            .cloned()
    });
    assert_eq!(event["type"], "Warning", "PinSkipped: {event}");
    assert_eq!(event["involvedObject"]["kind"], "PersistentPodState");
    cluster.run(&["delete", "sts", "cf", "-n", "db"]);
    cluster.run(&["delete", "pps", "cf", "-n", "db"]);
}

/// With the pinning admission out of the way (the namespace labelled
/// `ipkeep.dev/webhook=disabled`, which both the webhook and the admission policy skip),
/// kube-scheduler's calls to the extender alone keep rebuilt pods on their nodes; when the
/// recorded node cannot take the pod, `FailedScheduling` gives ipkeep's one refusal reason for
/// every other node, and the pod waits for its node. (Not by deleting the policy's binding:
/// kube-apiserver up to 1.37 stops the ConfigMap parameters' informer for good once no binding
/// names that kind, kubernetes/kubernetes#130887; docs/scheduler-ext.md.)
pub fn the_extender_alone_pins(cluster: &Cluster) {
    let policy = cluster.admission() == Admission::Policy;
    cluster.run(&["label", "namespace", "db", "ipkeep.dev/webhook=disabled"]);
    if policy {
        policy_applies(cluster, false);
    }
    let states =
        cluster.get(&["pps", "web", "-n", "db"]).expect("pps web")["status"]["podStates"].clone();
    let recorded = |pod: &str| {
        states[pod]["nodeName"]
            .as_str()
            .expect("a recorded node")
            .to_string()
    };
    for pod in ["web-0", "web-1"] {
        let rebuilt = rebuild(cluster, pod, false);
        assert!(
            rebuilt["metadata"]["annotations"]
                .get("ipkeep.dev/pinned-by")
                .is_none(),
            "extender: the pinning admission was removed, yet {pod} was mutated"
        );
        assert_eq!(
            rebuilt["spec"]["nodeName"],
            recorded(pod).as_str(),
            "extender: {pod} left its node"
        );
    }
    an_unschedulable_pin_says_why(cluster, "web-1", &recorded("web-1"));
    cluster.run(&["label", "namespace", "db", "ipkeep.dev/webhook-"]);
    if policy {
        policy_applies(cluster, true);
    }
}

/// Waits until kube-apiserver applies the policy's binding (`applies`) or no longer does (its
/// informers are asynchronous): whether a pod of StatefulSet web created as a dry run gets the
/// policy's annotation.
fn policy_applies(cluster: &Cluster, applies: bool) {
    let sts_uid = uid(&cluster.get(&["sts", "web", "-n", "db"]).expect("sts web"));
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: web-99
  namespace: db
  labels: {{app: web, statefulset.kubernetes.io/pod-name: web-99}}
  ownerReferences:
    - {{apiVersion: apps/v1, kind: StatefulSet, name: web, uid: "{sts_uid}", controller: true}}
spec:
  containers: [{{name: db, image: localhost/ipkeep/busybox:1.35}}]
"#
    );
    let what = format!("kube-apiserver applying the policy: {applies}");
    wait_until(&what, LONG, || {
        let out = cluster.try_run(
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&pod),
        );
        let created: Value = serde_json::from_slice(&out.stdout).ok()?;
        let annotated =
            !created["metadata"]["annotations"]["ipkeep.dev/persistent-pod-state"].is_null();
        (annotated == applies).then_some(())
    });
}

fn an_unschedulable_pin_says_why(cluster: &Cluster, pod: &str, node: &str) {
    cluster.run(&["cordon", node]);
    let old = uid(&cluster.get(&["pod", pod, "-n", "db"]).expect("the pod"));
    cluster.run(&["delete", "pod", pod, "-n", "db", "--wait=false"]);
    let new_uid = wait_until(&format!("{pod} re-created"), LONG, || {
        let p = cluster.get(&["pod", pod, "-n", "db"])?;
        Some(uid(&p)).filter(|u| *u != old)
    });
    let message = wait_until(&format!("FailedScheduling for {pod}"), LONG, || {
        let selector = format!("reason=FailedScheduling,involvedObject.uid={new_uid}");
        let events = cluster.get(&["events", "-n", "db", "--field-selector", &selector])?;
        events["items"].as_array()?.first()?["message"]
            .as_str()
            .map(str::to_string)
    });
    let reason = format!("(recorded on node {node}, where its IPs are held)");
    assert_eq!(
        message.matches(&reason).count(),
        1,
        "FailedScheduling: ipkeep's refusal should appear once, grouped: {message}"
    );
    assert!(
        message.contains(&format!("ipkeep: pinned to kubernetes.io/hostname={node}")),
        "FailedScheduling: {message}"
    );
    assert!(
        message.contains("unschedulable"),
        "FailedScheduling: the cordoned node's own reason is missing: {message}"
    );
    cluster.run(&["uncordon", node]);
    wait_until(
        &format!("{pod} placed on {node} once uncordoned"),
        LONG,
        || {
            let p = cluster.get(&["pod", pod, "-n", "db"])?;
            (p["spec"]["nodeName"] == node).then_some(())
        },
    );
}

/// With ipkeep-scheduler-ext gone, pods are still created and scheduled (the extender is
/// ignorable): unpinned through the webhook (failurePolicy Ignore), pinned through the admission
/// policy, which needs no server.
pub fn pods_are_created_while_scheduler_ext_is_down(cluster: &Cluster) {
    kill(cluster, "scheduler-ext");
    let pod = rebuild(cluster, "web-0", false);
    let pinned = pod["metadata"]["annotations"]
        .get("ipkeep.dev/pinned-by")
        .is_some();
    // The policy needs no server: the pod is pinned all the same.
    assert_eq!(
        pinned,
        cluster.admission() == Admission::Policy,
        "{:?}, ipkeep-scheduler-ext down: pinned-by: {}; the plan: {}",
        cluster.admission(),
        pod["metadata"],
        cluster
            .get(&["configmap", "ipkeep-admission-plan", "-n", "db"])
            .map(|p| p["data"].clone())
            .unwrap_or_default()
    );
}
