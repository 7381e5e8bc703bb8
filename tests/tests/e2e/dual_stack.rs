//! On a dual-stack cluster (`scripts/cluster.sh --ip-family dual`): a rebuilt StatefulSet pod
//! gets both its addresses back, IPv4 and IPv6 (status.podIPs and its node's store), and answers
//! on both from a pod on the other node.

use super::*;

/// `cluster.sh --ip-family` of the cluster in `state`.
pub fn is_dual_stack(state: &Path) -> bool {
    std::fs::read_to_string(state.join("ip-family")).is_ok_and(|f| f.trim() == "dual")
}

/// status.podIPs of a pod.
pub fn pod_ips(pod: &Value) -> Vec<String> {
    pod["status"]["podIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["ip"].as_str().map(str::to_string))
        .collect()
}

/// The pod `name` once Ready with two addresses (and not `not_uid`): (uid, node, podIPs).
fn ready_with_two(real: &Real, name: &str, not_uid: &str) -> (String, String, Vec<String>) {
    wait_until(
        &format!("{name} Ready with two addresses"),
        Duration::from_secs(120),
        || {
            let pod = real.kubectl.get(&["pod", name, "-n", NS])?;
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let ips = pod_ips(&pod);
            (ready(&pod) && uid != not_uid && ips.len() == 2).then(|| {
                let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
                (uid, node.to_string(), ips)
            })
        },
    )
}

/// Pings `ip` from `probe` (a pod in NS): whether it answered.
fn pings(real: &Real, probe: &str, ip: &str) -> bool {
    real.kubectl
        .try_run(
            &[
                "-n", NS, "exec", probe, "--", "ping", "-c", "1", "-W", "3", ip,
            ],
            None,
        )
        .status
        .success()
}

/// A one-replica StatefulSet's pod, deleted: it comes back on its node with the same IPv4 and
/// IPv6 addresses, both active in its node's store, and a pod on the other node pings each.
pub fn a_rebuilt_pod_keeps_both_families(real: &Real) {
    real.kubectl.apply(&statefulset(
        "ds",
        1,
        "    ipkeep.dev/auto-generate-persistent-pod-state: \"true\"\n    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname",
        "    type: RollingUpdate",
    ));
    let (uid, node, ips) = ready_with_two(real, "ds-0", "");
    assert!(
        ips[0].contains('.') && ips[1].contains(':'),
        "ds-0's podIPs are not IPv4 then IPv6: {ips:?}"
    );
    let held_by_store = |pod_ips: &[String]| {
        let mut leases: Vec<String> = real
            .leases_of(&node, "ds-0")
            .into_iter()
            .filter(|(_, state)| state == "active")
            .map(|(ip, _)| ip)
            .collect();
        leases.sort();
        let mut want = pod_ips.to_vec();
        want.sort();
        leases == want
    };
    wait_until(
        "ds-0's two addresses in its node's store",
        Duration::from_secs(30),
        || held_by_store(&ips).then_some(()),
    );
    eprintln!("ds-0 on {node} with {ips:?}");

    real.kubectl
        .run(&["delete", "pod", "ds-0", "-n", NS, "--wait=false"]);
    let (_, node_after, ips_after) = ready_with_two(real, "ds-0", &uid);
    eprintln!("ds-0 rebuilt on {node_after} with {ips_after:?}");
    assert_eq!(node_after, node, "ds-0 came back on another node");
    assert_eq!(ips_after, ips, "ds-0 did not get both its addresses back");
    wait_until(
        "the rebuilt ds-0's two addresses in its node's store",
        Duration::from_secs(30),
        || held_by_store(&ips_after).then_some(()),
    );

    // A probe pod on the other node reaches it over both families.
    let other = real
        .kubectl
        .get(&["nodes", "-l", "ipkeep.dev/test-node=real"])
        .unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .find(|n| *n != node)
        .expect("a second real node")
        .to_string();
    real.kubectl.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: ds-probe, namespace: {NS}}}
spec:
  nodeName: {other}
  terminationGracePeriodSeconds: 0
{}"#,
        sleeper("  ")
    ));
    wait_until("ds-probe Ready", Duration::from_secs(60), || {
        real.kubectl
            .get(&["pod", "ds-probe", "-n", NS])
            .filter(ready)
            .map(drop)
    });
    for ip in &ips_after {
        assert!(
            pings(real, "ds-probe", ip),
            "ds-0 at {ip} does not answer a ping from a pod on {other}"
        );
    }
    eprintln!("ds-0 answers on {ips_after:?} from a pod on {other}");
    real.kubectl.run(&[
        "delete",
        "pod",
        "ds-probe",
        "-n",
        NS,
        "--grace-period=0",
        "--wait=false",
    ]);
    real.kubectl
        .run(&["delete", "sts", "ds", "-n", NS, "--wait=false"]);
}
