//! Every pod of a managed StatefulSet keeps its IP from its first rebuild, on the real nodes:
//! whether a pod's addresses are held is decided at its DEL by what the API server says then
//! (the node agent's view), not by annotations the webhook stamped when the pod was created.
//! One round of rebuilds checks three StatefulSets side by side, to stay fast:
//!
//! - (a) new, annotated on the StatefulSet only (no pod-template annotation at all), one
//!   `Parallel` and one `OrderedReady`: pods created before the generated PersistentPodState
//!   existed carry no link (the webhook could not stamp them), and used to lose their IP at
//!   their first rebuild;
//! - (b) running without any annotation, then annotated (adopting ipkeep): none of its pods
//!   carries the link, and all used to lose their IP;
//! - (c) unmanaged, in the same namespace, its pod template claiming the link to (b)'s
//!   PersistentPodState and asking for `1h`: it used to be held (the link was believed) and get
//!   its IP back; now it gets nothing beyond `ipam.maxUnmanagedRetention` (0 in the shipped
//!   configuration), so its rebuild gets another IP.

use std::time::Instant;

use super::*;

/// A StatefulSet of sleepers whose pod template carries only `template_annotations`, pinned to
/// `node` when one is given.
fn bare_statefulset(
    name: &str,
    replicas: usize,
    annotations: &str,
    policy: &str,
    template_annotations: &str,
    node: Option<&str>,
) -> String {
    let selector = node.map_or(String::new(), |n| {
        format!("      nodeSelector: {{kubernetes.io/hostname: {n}}}\n")
    });
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
  namespace: {NS}
  annotations:
{annotations}
spec:
  replicas: {replicas}
  serviceName: {name}
  podManagementPolicy: {policy}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{{template_annotations}}}
    spec:
      terminationGracePeriodSeconds: 1
{selector}{}"#,
        sleeper("      ")
    )
}

/// A node that runs pods (a real node, Ready).
fn a_ready_node(real: &Real) -> String {
    let nodes = real.kubectl.get(&["nodes"]).unwrap();
    nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["spec"]["unschedulable"] != true && ready(n))
        .filter_map(|n| n["metadata"]["name"].as_str())
        .min()
        .expect("a Ready node")
        .to_string()
}

/// Whether every node's agent says its view of the API server is synced (`/readyz`).
fn agents_synced(real: &Real, nodes: &[String]) -> bool {
    nodes.iter().all(|node| {
        real.on_node(node, &["sh", "-c", "curl -s 127.0.0.1:9464/readyz || true"])
            .contains("kubernetes: synced")
    })
}

/// (a), (b) and (c) above, in one round of rebuilds.
pub fn first_rebuilds_keep_every_ip(real: &Real) {
    let started = Instant::now();
    let node = a_ready_node(real);
    let annotated = "    ipkeep.dev/auto-generate-persistent-pod-state: \"true\"\n    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname";
    let claimed = r#"ipkeep.dev/persistent-pod-state: late, ipkeep.dev/ip-retention: 1h"#;
    real.kubectl.apply(
        &[
            bare_statefulset("pa", 2, annotated, "Parallel", "", None),
            bare_statefulset("oa", 2, annotated, "OrderedReady", "", None),
            bare_statefulset("late", 2, "    team: storage", "Parallel", "", None),
            bare_statefulset(
                "loose",
                1,
                "    team: web",
                "Parallel",
                claimed,
                Some(&node),
            ),
        ]
        .join("---\n"),
    );
    let managed = "app in (pa, oa, late)";
    let all: Vec<String> = ["late", "oa", "pa"]
        .iter()
        .flat_map(|s| names(s, 2))
        .collect();
    real.wait_ready("pa, oa and late Ready", managed, &all);
    let loose = real.wait_ready("loose Ready", "app=loose", &names("loose", 1));
    // (b): ipkeep adopted on a running StatefulSet.
    real.kubectl.run(&[
        "annotate",
        "sts",
        "late",
        "-n",
        NS,
        "ipkeep.dev/auto-generate-persistent-pod-state=true",
        "ipkeep.dev/required-persistent-topology=kubernetes.io/hostname",
    ]);
    let before = real.ready_places(managed);
    for sts in ["pa", "oa", "late"] {
        wait_until(
            &format!("{sts}'s pods recorded"),
            Duration::from_secs(60),
            || {
                // The controller generates late's PersistentPodState a moment after the
                // annotation.
                real.kubectl.get(&["pps", sts, "-n", NS])?;
                let records = real.records(sts);
                let mine: Places = before
                    .iter()
                    .filter(|(p, _)| p.starts_with(&format!("{sts}-")))
                    .map(|(p, v)| (p.clone(), v.clone()))
                    .collect();
                (records == mine).then_some(())
            },
        );
    }
    let unstamped: Vec<String> = real
        .pods(managed)
        .iter()
        .filter(|p| p["metadata"]["annotations"]["ipkeep.dev/persistent-pod-state"].is_null())
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    eprintln!("first rebuilds: before {before:?}; created without the link: {unstamped:?}");
    assert!(
        unstamped.contains(&"late-0".to_string()) && unstamped.contains(&"late-1".to_string()),
        "late's pods were created before any PersistentPodState: {unstamped:?}"
    );
    let nodes: Vec<String> = before.values().map(|(n, _)| n.clone()).collect();
    wait_until(
        "every agent's view of the API server synced",
        Duration::from_secs(60),
        || agents_synced(real, &nodes).then_some(()),
    );

    // Every part is checked, and what failed is said together at the end.
    let mut failed = Vec::new();
    // (c) first, alone: its DEL comes before its pod object goes, and nothing may be held for
    // it then (the agents' release grace, 5 s, would release a holding only later).
    real.kubectl
        .run(&["delete", "pod", "-n", NS, "loose-0", "--wait=true"]);
    let (loose_node, loose_ip) = loose["loose-0"].clone();
    let kept = real.leases_of(&loose_node, "loose-0");
    if kept.contains(&(loose_ip.clone(), "held".to_string())) {
        failed.push(format!(
            "(c) loose-0's {loose_ip} is held for it on {loose_node}, by a link it claims: {kept:?}"
        ));
    }
    let mut delete = vec!["delete", "pod", "-n", NS, "--wait=true"];
    delete.extend(all.iter().map(String::as_str));
    real.kubectl.run(&delete);

    let after = real.wait_ready("pa, oa and late rebuilt", managed, &all);
    for (part, sts) in [
        ("(a) Parallel", "pa"),
        ("(a) OrderedReady", "oa"),
        ("(b)", "late"),
    ] {
        for pod in names(sts, 2) {
            if after[&pod] != before[&pod] {
                failed.push(format!(
                    "{part}: {pod} was {:?} before its first rebuild and is {:?} after",
                    before[&pod], after[&pod]
                ));
            }
        }
    }
    let loose_after = real.wait_ready("loose rebuilt", "app=loose", &names("loose", 1));
    if loose_after["loose-0"].1 == loose_ip {
        failed.push(format!(
            "(c) loose-0 kept {loose_ip} beyond ipam.maxUnmanagedRetention (0), by a link it claims"
        ));
    }
    real.kubectl.run(&[
        "delete",
        "sts",
        "-n",
        NS,
        "pa",
        "oa",
        "late",
        "loose",
        "--wait=false",
    ]);
    eprintln!("first rebuilds: done in {} s", started.elapsed().as_secs());
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
