//! ipkeep on a real control plane: kube-apiserver, kube-controller-manager, kube-scheduler and
//! etcd built from upstream, kwok nodes, ipkeep installed from `deploy/` by
//! `scripts/cluster.sh` with each component on its own ServiceAccount's token.
//!
//! One cluster serves the steps below in order (starting one takes tens of seconds); each step
//! names itself in its assertions.

use std::time::Duration;

use ipkeep_tests::cluster::{Cluster, require_go, wait_until};
use serde_json::Value;

const NODES: usize = 6;
const LONG: Duration = Duration::from_secs(90);

fn statefulset(name: &str, replicas: u32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
  namespace: db
  annotations:
    ipkeep.dev/auto-generate-persistent-pod-state: "true"
    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname
    ipkeep.dev/preferred-persistent-topology: topology.kubernetes.io/zone
    ipkeep.dev/ip-retention: "24h"
spec:
  serviceName: {name}
  replicas: {replicas}
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations:
        ipkeep.dev/persistent-pod-state: {name}
    spec:
      terminationGracePeriodSeconds: 0
      tolerations:
        - {{key: kwok.x-k8s.io/node, operator: Exists, effect: NoSchedule}}
      containers:
        - name: db
          image: localhost/ipkeep/busybox:1.35
"#
    )
}

fn pod_states(cluster: &Cluster) -> Option<serde_json::Map<String, Value>> {
    cluster.get(&["pps", "db", "-n", "db"])?["status"]["podStates"]
        .as_object()
        .cloned()
}

#[test]
fn ipkeep_on_a_real_control_plane() {
    if !require_go("ipkeep_on_a_real_control_plane") {
        return;
    }
    let cluster = Cluster::up(NODES);
    crd_is_structural_and_validates(&cluster);
    cluster.run(&["create", "namespace", "db"]);
    statefulset_pods_are_recorded_pinned_and_pruned(&cluster);
    leader_election_hands_over(&cluster);
    pods_pass_while_the_webhook_is_down(&cluster);
    for component in ["controller-0", "controller-1", "scheduler-ext"] {
        let log = cluster.log_tail(component, 100_000);
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "RBAC: {component} was refused something deploy/ should grant:\n{}",
            log.lines()
                .filter(|l| l.to_lowercase().contains("forbidden"))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

fn leader(cluster: &Cluster) -> Option<String> {
    cluster.get(&["lease", "ipkeep-controller", "-n", "ipkeep-system"])?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_string)
}

/// The two controller replicas share one Lease; when the leader is killed, the other takes
/// over and records again.
fn leader_election_hands_over(cluster: &Cluster) {
    let first = wait_until("a controller holds the Lease", LONG, || leader(cluster));
    let pid = cluster.pid(&first).expect("the leader's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the leader");
    let second = wait_until("the standby takes the Lease", LONG, || {
        leader(cluster).filter(|l| *l != first)
    });
    cluster.apply(&statefulset("web", 2));
    wait_until(
        &format!("{second} records the new StatefulSet"),
        LONG,
        || {
            let s = cluster.get(&["pps", "web", "-n", "db"])?["status"]["podStates"]
                .as_object()?
                .len();
            (s == 2).then_some(())
        },
    );
}

/// failurePolicy Ignore: with ipkeep-scheduler-ext gone, pods are still created (unpinned) and
/// scheduled (the extender is ignorable).
fn pods_pass_while_the_webhook_is_down(cluster: &Cluster) {
    let pid = cluster.pid("scheduler-ext").expect("scheduler-ext's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill scheduler-ext");
    let old = cluster.get(&["pod", "web-0", "-n", "db"]).expect("web-0");
    let old_uid = old["metadata"]["uid"].as_str().expect("a uid").to_string();
    cluster.run(&["delete", "pod", "web-0", "-n", "db", "--wait=false"]);
    let pod = wait_until(
        "web-0 re-created and scheduled without ipkeep",
        LONG,
        || {
            let p = cluster.get(&["pod", "web-0", "-n", "db"])?;
            let new = p["metadata"]["uid"].as_str() != Some(old_uid.as_str());
            (new && p["spec"]["nodeName"].is_string()).then_some(p)
        },
    );
    assert!(
        pod["metadata"]["annotations"]
            .get("ipkeep.dev/pinned-by")
            .is_none(),
        "webhook down, yet the pod was pinned: {}",
        pod["metadata"]
    );
}

/// The CRD from deploy/ is accepted as structural; the printer columns show; invalid objects
/// are refused by the real server, naming the field.
fn crd_is_structural_and_validates(cluster: &Cluster) {
    let crd = cluster
        .get(&["crd", "persistentpodstates.ipkeep.dev"])
        .expect("the CRD is installed");
    let conditions = crd["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in &conditions {
        if c["type"] == "NonStructuralSchema" {
            panic!("CRD: the real apiserver calls the schema non-structural: {c}");
        }
    }
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True"),
        "CRD: not established: {conditions:?}"
    );
    let pps = |spec_extra: &str| {
        format!(
            "apiVersion: ipkeep.dev/v1alpha1\nkind: PersistentPodState\nmetadata: {{name: bad, namespace: default}}\nspec:\n  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: x}}\n{spec_extra}"
        )
    };
    let cases = [
        (
            "weight 0",
            "  preferredPersistentTopology:\n    - weight: 0\n      preference: {nodeTopologyKeys: [topology.kubernetes.io/zone]}\n",
            "spec.preferredPersistentTopology[0].weight",
        ),
        (
            "empty keys",
            "  requiredPersistentTopology: {nodeTopologyKeys: []}\n",
            "spec.requiredPersistentTopology.nodeTopologyKeys",
        ),
        (
            "bad ipRetention",
            "  ipRetention: 24 hours\n",
            "spec.ipRetention",
        ),
    ];
    for (what, extra, field) in cases {
        let out = cluster.try_run(&["apply", "-f", "-"], Some(&pps(extra)));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "CRD: {what} was accepted");
        assert!(
            err.contains(field),
            "CRD: {what}: the refusal does not name {field}: {err}"
        );
    }
    cluster.apply(&pps("  ipRetention: 1h30m\n"));
    let table = cluster.run(&["get", "pps", "-n", "default"]);
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "TARGET", "RECORDED", "READY", "AGE"] {
        assert!(
            header.contains(column),
            "CRD: printer column {column} missing: {table}"
        );
    }
    cluster.run(&["delete", "pps", "bad", "-n", "default"]);
}

/// A StatefulSet annotated for auto-generation gets its PersistentPodState from the real
/// controller manager's pods; a deleted pod comes back pinned to its node by the webhook the
/// real apiserver called; scale-down prunes; deleting the StatefulSet lets the real garbage
/// collector remove the PersistentPodState.
fn statefulset_pods_are_recorded_pinned_and_pruned(cluster: &Cluster) {
    cluster.apply(&statefulset("db", 3));
    let states = wait_until("three records with node and IP", LONG, || {
        let s = pod_states(cluster)?;
        let complete = s.values().filter(|r| {
            r["nodeName"].as_str().is_some_and(|n| !n.is_empty())
                && r["podIPs"].as_array().is_some_and(|ips| !ips.is_empty())
        });
        (complete.count() == 3).then_some(s)
    });
    let node_of_1 = states["db-1"]["nodeName"].as_str().expect("a recorded node").to_string();
    let first = cluster.get(&["pod", "db-1", "-n", "db"]).expect("db-1");
    let first_uid = first["metadata"]["uid"].as_str().expect("a uid").to_string();

    cluster.run(&["delete", "pod", "db-1", "-n", "db", "--wait=false"]);
    let rebuilt = wait_until("db-1 rebuilt and scheduled", LONG, || {
        let p = cluster.get(&["pod", "db-1", "-n", "db"])?;
        let new = p["metadata"]["uid"].as_str() != Some(first_uid.as_str());
        (new && p["spec"]["nodeName"].is_string()).then_some(p)
    });
    let required = &rebuilt["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert!(
        required.to_string().contains(&node_of_1),
        "webhook: the rebuilt pod is not pinned to {node_of_1}: {required}"
    );
    assert_eq!(
        rebuilt["spec"]["nodeName"], node_of_1,
        "scheduler: the rebuilt pod left its node"
    );
    assert_eq!(
        rebuilt["metadata"]["annotations"]["ipkeep.dev/ip-retention"], "24h",
        "webhook: retention not stamped"
    );

    cluster.run(&["scale", "statefulset", "db", "-n", "db", "--replicas=1"]);
    wait_until(
        "records of db-1 and db-2 pruned after scale-down",
        LONG,
        || {
            let s = pod_states(cluster)?;
            (s.len() == 1 && s.contains_key("db-0")).then_some(())
        },
    );

    cluster.run(&["delete", "statefulset", "db", "-n", "db"]);
    wait_until(
        "the garbage collector removes the PersistentPodState",
        LONG,
        || {
            cluster
                .get(&["pps", "db", "-n", "db"])
                .is_none()
                .then_some(())
        },
    );
}
