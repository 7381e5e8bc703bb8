//! ipkeep as flannel's IPAM on real nodes (`scripts/cluster.sh up --network flannel`): flanneld
//! with the kube subnet manager and vxlan on two nodes, flannel's CNI plugin, and the CNI
//! configuration `deploy/cni/10-ipkeep-flannel.conflist` as docs/install.md tells users to
//! write it.
//!
//! - the example StatefulSet with its PersistentPodState (`deploy/examples`): a rebuilt pod keeps
//!   its node and IP, and a pod on the other node reaches it through flannel's vxlan;
//! - flannel's DEL without its scratch file (`/var/lib/cni/flannel/<sandbox>`) returns success
//!   without calling the IPAM, so ipkeep never hears of the pod's end. The agent repairs it
//!   (missed DELs): a pod without retention gets its address freed, a rebuilt StatefulSet pod
//!   keeps its address once, and a scaled-down one's goes as its PersistentPodState's policy
//!   (`WhenScaled`) says. No leak, no duplicate.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::{repo_root, require_go, wait_until};
use ipkeep_tests::require_root;
use serde_json::Value;

#[allow(dead_code)]
#[path = "e2e/retention.rs"]
mod retention;

use retention::{NS, Real};

/// flannel's network name (`deploy/cni/10-ipkeep-flannel.conflist`): it names the store.
const NETWORK: &str = "cbr0";

#[test]
fn flannel_on_real_nodes() {
    if !require_root("flannel_on_real_nodes") || !require_go("flannel_on_real_nodes") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    // IPKEEP_FLANNEL_STATE keeps the cluster's logs there after the test (`down --keep-logs`).
    let state = std::env::var_os("IPKEEP_FLANNEL_STATE")
        .map_or_else(|| work.path().join("cluster"), PathBuf::from);
    // Ports of its own, below the ephemeral range and apart from the other cluster tests'.
    let port_base = (32000 + (std::process::id() % 50) * 10).to_string();
    let down = Down(state.clone());
    let t = Instant::now();
    let out = Command::new(repo_root().join("scripts/cluster.sh"))
        .args(["up", "--nodes", "2", "--network", "flannel", "--port-base"])
        .arg(&port_base)
        .arg("--state")
        .arg(&state)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/cluster.sh up --network flannel failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("flannel cluster up in {:.0} s", t.elapsed().as_secs_f64());
    let real = Real {
        network: NETWORK,
        ..Real::new(&state)
    };
    flannel_runs_the_nodes(&real);
    real.kubectl.run(&["create", "namespace", NS]);
    let db = a_rebuilt_pod_keeps_node_and_ip_and_is_reached_over_vxlan(&real);
    // Missed DELs are applied 30 s after an address's last change instead of 2 min: long
    // enough to see flannel's DEL skip the IPAM, short enough for a test.
    let agent = ["-n", "ipkeep-system", "daemonset/ipkeep-agent"];
    real.kubectl.run(
        &[
            &["set", "env"][..],
            &agent,
            &["IPKEEP_MISSED_DEL_GRACE=30s"],
        ]
        .concat(),
    );
    real.kubectl
        .run(&[&["rollout", "status", "--timeout=180s"][..], &agent].concat());
    a_pod_whose_del_flannel_skipped_gets_its_address_freed(&real, &db);
    a_rebuilt_pod_whose_del_flannel_skipped_keeps_one_address(&real, &db);
    a_scaled_down_pod_whose_del_flannel_skipped_is_released(&real, &db);
    eprintln!("flannel test done in {:.0} s", t.elapsed().as_secs_f64());
    drop(down);
}

/// Every node runs flanneld with a subnet.env of its Node's pod CIDR, the CNI configuration is
/// the repository's file unchanged (and the agent wrote none), and the other node's pod CIDR is
/// routed through flannel.1 (vxlan).
fn flannel_runs_the_nodes(real: &Real) {
    let conflist =
        std::fs::read_to_string(repo_root().join("deploy/cni/10-ipkeep-flannel.conflist")).unwrap();
    let cidrs = pod_cidrs(real);
    for (node, cidr) in &cidrs {
        let env = real.on_node(node, &["cat", "/run/flannel/subnet.env"]);
        let subnet = env
            .lines()
            .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
            .unwrap_or_else(|| panic!("no FLANNEL_SUBNET in {node}'s subnet.env:\n{env}"));
        // FLANNEL_SUBNET is the bridge's address in the pod CIDR: 10.244.1.1/24 for 10.244.1.0/24.
        assert_eq!(
            network_of(subnet),
            *cidr,
            "{node}: flannel's subnet is not its Node's pod CIDR"
        );
        assert_eq!(
            real.on_node(node, &["ls", "/etc/cni/net.d"]).trim(),
            "10-flannel.conflist",
            "{node}: one CNI configuration, flannel's"
        );
        assert_eq!(
            real.on_node(node, &["cat", "/etc/cni/net.d/10-flannel.conflist"]),
            conflist
        );
        for (other, other_cidr) in &cidrs {
            if other != node {
                let route = real.on_node(node, &["ip", "route", "show", other_cidr]);
                assert!(
                    route.contains("dev flannel.1"),
                    "{node}: {other}'s pod CIDR {other_cidr} is not routed through vxlan: {route}"
                );
            }
        }
        eprintln!("{node}: {}", env.replace('\n', " "));
    }
}

/// The example StatefulSet (deploy/examples/statefulset.yaml): db-0 deleted
/// comes back on its node with its IP, and a pod on the other node pings it, through flannel.1.
fn a_rebuilt_pod_keeps_node_and_ip_and_is_reached_over_vxlan(real: &Real) -> retention::Places {
    let examples = repo_root().join("deploy/examples");
    // As the example says to apply it (its annotations generate the PersistentPodState `db`),
    // in the test's namespace; the nodes have no registry: the pause image from their store.
    let yaml = std::fs::read_to_string(examples.join("statefulset.yaml"))
        .unwrap()
        .replace("registry.k8s.io/pause:3.10", "localhost/ipkeep/pause:dev");
    let out = real
        .kubectl
        .try_run(&["apply", "-n", NS, "-f", "-"], Some(&yaml));
    assert!(out.status.success(), "{out:?}");
    let names: Vec<String> = (0..3).map(|i| format!("db-{i}")).collect();
    let before = real.wait_ready("db's 3 pods Ready", "app=db", &names);
    eprintln!("db: {before:?}");
    // The leases say the pods' IPs, in flannel's store.
    for (pod, (node, ip)) in &before {
        assert_eq!(
            real.leases_of(node, pod),
            [(ip.clone(), "active".to_string())],
            "{pod} on {node}"
        );
    }
    real.kubectl
        .run(&["delete", "pod", "db-0", "-n", NS, "--wait=true"]);
    let after = real.wait_ready("db-0 rebuilt", "app=db", &names);
    assert_eq!(after["db-0"], before["db-0"], "db-0 keeps its node and IP");

    let (node, ip) = after["db-0"].clone();
    let other = pod_cidrs(real)
        .into_keys()
        .find(|n| *n != node)
        .expect("two nodes");
    real.kubectl
        .apply(&retention::sleeper_pod("client", &other));
    real.wait_ready("client Ready", "app=client", &["client".to_string()]);
    let route = real.on_node(&other, &["ip", "route", "get", &ip]);
    assert!(
        route.contains("dev flannel.1"),
        "{other} reaches {ip} another way: {route}"
    );
    // Packets flannel.1 sent (the node's own netns: /sys here is the host's).
    let sent = |n: &str| -> u64 {
        let link: Value = serde_json::from_str(
            &real.on_node(n, &["ip", "-s", "-j", "link", "show", "dev", "flannel.1"]),
        )
        .unwrap();
        link[0]["stats64"]["tx"]["packets"].as_u64().unwrap()
    };
    let tx = sent(&other);
    let ping = real.kubectl.try_run(
        &[
            "exec", "-n", NS, "client", "--", "ping", "-c", "3", "-W", "2", &ip,
        ],
        None,
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );
    assert!(
        ping.status.success(),
        "client on {other} cannot reach db-0 at {ip}: {text}"
    );
    assert!(
        sent(&other) >= tx + 3,
        "the pings did not go through flannel.1"
    );
    eprintln!(
        "client on {other} -> db-0 {ip} on {node}: {}",
        text.lines().last().unwrap_or("")
    );
    after
}

/// A pod without retention: its scratch file removed, then the pod deleted. flannel's DEL
/// returns without the IPAM (the lease stays active), and the agent applies the missed DEL:
/// the address is free again.
fn a_pod_whose_del_flannel_skipped_gets_its_address_freed(real: &Real, db: &retention::Places) {
    let node = db["db-1"].0.clone();
    real.kubectl.apply(&retention::sleeper_pod("loner", &node));
    let ip = real.wait_ready("loner Ready", "app=loner", &["loner".to_string()])["loner"]
        .1
        .clone();
    let t = Instant::now();
    lose_scratch_file(real, &node, "loner");
    real.kubectl
        .run(&["delete", "pod", "loner", "-n", NS, "--wait=true"]);
    assert_eq!(
        real.leases_of(&node, "loner"),
        [(ip.clone(), "active".to_string())],
        "flannel's DEL without its scratch file should not reach ipkeep"
    );
    wait_until(
        &format!("loner's {ip} freed by the agent"),
        Duration::from_secs(150),
        || (!lease_ips(real, &node).contains(&ip)).then_some(()),
    );
    eprintln!(
        "loner's {ip} freed {:.0} s after its DEL was lost",
        t.elapsed().as_secs_f64()
    );
}

/// db-1 rebuilt after flannel skipped its DEL: it comes back on its node with its IP, which is
/// leased once (to the new sandbox), and stays so after the agent's sweeps.
fn a_rebuilt_pod_whose_del_flannel_skipped_keeps_one_address(real: &Real, db: &retention::Places) {
    let (node, ip) = db["db-1"].clone();
    let old = sandbox_of(real, &node, "db-1");
    lose_scratch_file(real, &node, "db-1");
    real.kubectl
        .run(&["delete", "pod", "db-1", "-n", NS, "--wait=true"]);
    let names: Vec<String> = (0..3).map(|i| format!("db-{i}")).collect();
    let after = real.wait_ready("db-1 rebuilt", "app=db", &names);
    assert_eq!(
        after["db-1"],
        (node.clone(), ip.clone()),
        "db-1 keeps its node and IP"
    );
    let new = sandbox_of(real, &node, "db-1");
    assert_ne!(new, old, "db-1 has a new sandbox");
    // Missed-DEL grace (30 s) and sweeps: the running pod keeps its one address.
    std::thread::sleep(Duration::from_secs(45));
    assert_eq!(
        real.leases_of(&node, "db-1"),
        [(ip.clone(), "active".to_string())],
        "db-1: one lease, its own"
    );
    assert_eq!(sandbox_of(real, &node, "db-1"), new);
    assert_eq!(
        lease_ips(real, &node).iter().filter(|i| **i == ip).count(),
        1,
        "{ip} leased twice"
    );
}

/// db-2 scaled away after flannel skipped its DEL: the agent applies the missed DEL (held for
/// 24 h by retention), and the PersistentPodState's `WhenScaled` drops its record, so the hold
/// is released: nothing left of db-2 on its node.
fn a_scaled_down_pod_whose_del_flannel_skipped_is_released(real: &Real, db: &retention::Places) {
    let (node, ip) = db["db-2"].clone();
    lose_scratch_file(real, &node, "db-2");
    let t = Instant::now();
    real.kubectl
        .run(&["scale", "sts", "db", "-n", NS, "--replicas=2"]);
    let names: Vec<String> = (0..2).map(|i| format!("db-{i}")).collect();
    real.wait_ready("db scaled to 2", "app=db", &names);
    wait_until(
        &format!("db-2's {ip} released"),
        Duration::from_secs(150),
        || (!lease_ips(real, &node).contains(&ip)).then_some(()),
    );
    eprintln!(
        "db-2's {ip} released {:.0} s after the scale-down",
        t.elapsed().as_secs_f64()
    );
    assert!(real.leases_of(&node, "db-2").is_empty());
}

/// Removes flannel's scratch file of `pod`'s sandbox on `node`, as a node whose
/// /var/lib/cni/flannel was cleaned (or lost) would have it.
fn lose_scratch_file(real: &Real, node: &str, pod: &str) {
    let sandbox = sandbox_of(real, node, pod);
    let file = format!("/var/lib/cni/flannel/{sandbox}");
    real.on_node(node, &["test", "-f", &file]);
    real.on_node(node, &["rm", &file]);
}

/// The container ID (sandbox) of `pod`'s active lease on `node`.
fn sandbox_of(real: &Real, node: &str, pod: &str) -> String {
    let leases = real.leases(node);
    let active: Vec<&Value> = leases
        .iter()
        .filter(|l| {
            l["pod"]["namespace"] == NS && l["pod"]["name"] == pod && l["state"] == "active"
        })
        .collect();
    assert_eq!(active.len(), 1, "{pod} on {node}: {leases:#?}");
    active[0]["owner"]["containerId"]
        .as_str()
        .unwrap()
        .to_string()
}

fn lease_ips(real: &Real, node: &str) -> Vec<String> {
    real.leases(node)
        .iter()
        .filter_map(|l| l["ip"].as_str().map(str::to_string))
        .collect()
}

/// The real nodes' pod CIDRs, by node.
fn pod_cidrs(real: &Real) -> BTreeMap<String, String> {
    let nodes = real
        .kubectl
        .get(&["nodes", "-l", "ipkeep.dev/test-node=real"])
        .unwrap();
    nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["metadata"]["name"].as_str().unwrap().to_string(),
                n["spec"]["podCIDR"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `10.244.1.1/24` → `10.244.1.0/24` (IPv4).
fn network_of(cidr: &str) -> String {
    let (ip, len) = cidr.split_once('/').unwrap();
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let len: u32 = len.parse().unwrap();
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    format!("{}/{len}", std::net::Ipv4Addr::from(u32::from(ip) & mask))
}

/// Takes the cluster in this state directory down, also when the test fails (logs kept).
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/cluster.sh"))
            .args(["down", "--keep-logs", "--state"])
            .arg(&self.0)
            .stdout(Stdio::null())
            .status();
    }
}
