//! Every StatefulSet of a namespace labelled `ipkeep.dev/auto-generate-persistent-pod-state=true`
//! gets a generated PersistentPodState, unless its own annotation says otherwise or a
//! PersistentPodState written for it exists; removing the label removes what it generated.

use std::collections::BTreeSet;

use super::{LONG, kwok_statefulset, rebuild_in};
use ipkeep_tests::cluster::{Cluster, wait_until};
use serde_json::Value;

const NS: &str = "team";
const LABEL: &str = "ipkeep.dev/auto-generate-persistent-pod-state";

/// A StatefulSet of [`NS`] with `annotations` (YAML lines, indented by four), on kwok nodes.
fn statefulset(name: &str, replicas: u32, annotations: &str) -> String {
    let metadata = format!("  annotations:\n    team.example.com/owner: payments\n{annotations}");
    kwok_statefulset(NS, name, replicas, &metadata, "", "")
}

fn records(cluster: &Cluster, pps: &str) -> Option<serde_json::Map<String, Value>> {
    cluster.get(&["pps", pps, "-n", NS])?["status"]["podStates"]
        .as_object()
        .cloned()
}

/// Records with a node and an IP.
fn complete(records: &serde_json::Map<String, Value>) -> usize {
    records
        .values()
        .filter(|r| {
            r["nodeName"].as_str().is_some_and(|n| !n.is_empty())
                && r["podIPs"].as_array().is_some_and(|ips| !ips.is_empty())
        })
        .count()
}

fn pps_names(cluster: &Cluster) -> BTreeSet<String> {
    let list = cluster.get(&["pps", "-n", NS]).expect("the list");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

fn event_message(cluster: &Cluster, reason: &str, object: &str) -> Option<String> {
    let selector = format!("reason={reason},involvedObject.name={object}");
    let events = cluster.get(&["events", "-n", NS, "--field-selector", &selector])?;
    events["items"].as_array()?.first()?["message"]
        .as_str()
        .map(str::to_string)
}

/// A namespace labelled after its StatefulSets run: `plain` (no ipkeep annotation) gets a
/// PersistentPodState pinning by hostname, and a rebuilt pod comes back to its node as on the
/// annotated path; `optout` (annotated `"false"`) gets none and is rebuilt unpinned; `own`, which
/// has a PersistentPodState written for it under another name, gets none generated. Removing
/// the label deletes `plain`'s and leaves the hand-written one.
pub fn a_labelled_namespace_gets_every_statefulset_pinned(cluster: &Cluster) {
    cluster.run(&["create", "namespace", NS]);
    cluster.apply(&format!(
        r#"apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata: {{name: own-pins, namespace: {NS}}}
spec:
  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: own}}
  requiredPersistentTopology: {{nodeTopologyKeys: [kubernetes.io/hostname]}}
  ipRetention: 1h
"#
    ));
    cluster.apply(&statefulset("plain", 2, ""));
    cluster.apply(&statefulset(
        "optout",
        1,
        &format!("    {LABEL}: \"false\"\n"),
    ));
    cluster.apply(&statefulset("own", 1, ""));
    wait_until("own-0 recorded by the hand-written PPS", LONG, || {
        (complete(&records(cluster, "own-pins")?) == 1).then_some(())
    });
    assert_eq!(
        pps_names(cluster),
        BTreeSet::from(["own-pins".to_string()]),
        "namespace label: generated before the namespace was labelled"
    );

    cluster.run(&["label", "namespace", NS, &format!("{LABEL}=true")]);
    let recorded = wait_until("plain-0 and plain-1 recorded", LONG, || {
        let r = records(cluster, "plain")?;
        (complete(&r) == 2).then_some(r)
    });
    let pps = cluster.get(&["pps", "plain", "-n", NS]).expect("pps plain");
    assert_eq!(
        pps["spec"]["requiredPersistentTopology"]["nodeTopologyKeys"],
        serde_json::json!(["kubernetes.io/hostname"]),
        "namespace label: default topology: {}",
        pps["spec"]
    );
    assert_eq!(
        pps["spec"]["ipRetention"], "24h",
        "namespace label: default retention"
    );
    let owner = &pps["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"], &owner["controller"]),
        (
            &Value::from("StatefulSet"),
            &Value::from("plain"),
            &Value::from(true)
        ),
        "namespace label: owner of the generated PPS"
    );
    let created = wait_until("PersistentPodStateCreated on plain", LONG, || {
        event_message(cluster, "PersistentPodStateCreated", "plain")
    });
    assert!(
        created.contains(LABEL),
        "namespace label: the Event does not say why: {created}"
    );
    // Both StatefulSets' reconciles ran by now: the label took their pods' records above.
    assert_eq!(
        pps_names(cluster),
        BTreeSet::from(["own-pins".to_string(), "plain".to_string()]),
        "namespace label: optout (annotated false) or own (a PPS written for it) got one"
    );

    let node = recorded["plain-1"]["nodeName"]
        .as_str()
        .expect("a node")
        .to_string();
    let rebuilt = rebuild_in(cluster, NS, "plain-1", false);
    let required = ipkeep_tests::cluster::required_placement(&rebuilt);
    assert!(
        required.contains(&node),
        "namespace label: plain-1 is not pinned to {node}: {required}"
    );
    assert_eq!(
        rebuilt["spec"]["nodeName"], node,
        "namespace label: plain-1 left its node"
    );
    let annotations = &rebuilt["metadata"]["annotations"];
    assert_eq!(
        (
            &annotations["ipkeep.dev/ip-retention"],
            &annotations["ipkeep.dev/persistent-pod-state"]
        ),
        (&Value::from("24h"), &Value::from("plain")),
        "namespace label: plain-1 not stamped as managed"
    );
    let unmanaged = rebuild_in(cluster, NS, "optout-0", false);
    assert!(
        unmanaged["metadata"]["annotations"]["ipkeep.dev/persistent-pod-state"].is_null()
            && unmanaged["spec"]["affinity"].is_null(),
        "namespace label: optout-0 (annotated false) was managed: {}",
        unmanaged["metadata"]
    );

    cluster.run(&["label", "namespace", NS, &format!("{LABEL}-")]);
    wait_until("the label's PPS deleted with the label", LONG, || {
        cluster
            .get(&["pps", "plain", "-n", NS])
            .is_none()
            .then_some(())
    });
    assert!(
        event_message(cluster, "PersistentPodStateDeleted", "plain").is_some(),
        "namespace label: no PersistentPodStateDeleted Event on plain"
    );
    assert_eq!(
        pps_names(cluster),
        BTreeSet::from(["own-pins".to_string()]),
        "namespace label removed: the hand-written PPS must stay"
    );
    cluster.run(&["delete", "namespace", NS, "--wait=false"]);
}
