//! Records kept by the controller beyond the basic case: OpenKruise's annotation spelling and
//! StatefulSets whose ordinals start above 0.

use super::{LONG, statefulset};
use ipkeep_tests::cluster::{Cluster, wait_until};
use serde_json::Value;

/// A StatefulSet annotated with OpenKruise's `kruise.io/…` spelling gets its PersistentPodState
/// too; with `spec.ordinals.start: 5` its pods are kr-5..kr-7, and a scale-down prunes the
/// ordinals that left the range (kr-6, kr-7), never kr-5.
pub fn kruise_spelling_and_ordinals_start(cluster: &Cluster) {
    let sts = statefulset("kr", 3)
        .replace("ipkeep.dev/auto-generate", "kruise.io/auto-generate")
        .replace(
            "ipkeep.dev/required-persistent-topology",
            "kruise.io/required-persistent-topology",
        )
        .replace(
            "ipkeep.dev/preferred-persistent-topology",
            "kruise.io/preferred-persistent-topology",
        )
        .replace("  replicas: 3\n", "  replicas: 3\n  ordinals: {start: 5}\n");
    cluster.apply(&sts);
    let records = |c: &Cluster| -> Option<serde_json::Map<String, Value>> {
        c.get(&["pps", "kr", "-n", "db"])?["status"]["podStates"]
            .as_object()
            .cloned()
    };
    let recorded = wait_until("kr-5, kr-6, kr-7 recorded", LONG, || {
        let r = records(cluster)?;
        let complete = r
            .values()
            .filter(|s| s["nodeName"].as_str().is_some_and(|n| !n.is_empty()))
            .count();
        (complete == 3).then_some(r)
    });
    let mut names: Vec<&String> = recorded.keys().collect();
    names.sort();
    assert_eq!(
        names,
        ["kr-5", "kr-6", "kr-7"],
        "ordinals.start: wrong records"
    );
    let pps = cluster.get(&["pps", "kr", "-n", "db"]).expect("pps kr");
    assert!(
        pps["spec"]["requiredPersistentTopology"]
            .to_string()
            .contains("kubernetes.io/hostname"),
        "kruise spelling: the required topology was not taken: {}",
        pps["spec"]
    );
    assert!(
        pps["spec"]["preferredPersistentTopology"]
            .to_string()
            .contains("topology.kubernetes.io/zone"),
        "kruise spelling: the preferred topology was not taken: {}",
        pps["spec"]
    );

    cluster.run(&["scale", "statefulset", "kr", "-n", "db", "--replicas=1"]);
    wait_until("kr-6 and kr-7 pruned, kr-5 kept", LONG, || {
        let r = records(cluster)?;
        (r.len() == 1 && r.contains_key("kr-5")).then_some(())
    });
    cluster.run(&["delete", "statefulset", "kr", "-n", "db"]);
}
