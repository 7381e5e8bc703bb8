//! What users of IP retention ask for most (docs/retention.md), on the real nodes the story
//! left running: several ordinals rebuilt at once (`maxUnavailable`), ordinal-stable IPs across
//! a scale down and up, the records at a glance, in-place resize, a re-created StatefulSet that
//! adopts what the old one left, a node rebooted with its runtime's state wiped, a node
//! re-registered with another pod CIDR, and every pod keeping its IP from its first rebuild
//! however its StatefulSet came to be managed (`first_rebuild.rs`); on a dual-stack cluster,
//! a rebuilt pod keeping both its addresses (`dual_stack.rs`). Each step checks the outcome on
//! the nodes' stores too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::{NodeLayout, node_layout_of, repo_root, wait_until};
use ipkeep_tests::kubectl::Kubectl;
use serde_json::Value;

mod dual_stack;
mod first_rebuild;

pub const NS: &str = "keep";
/// Pod → (node, IPv4).
pub type Places = BTreeMap<String, (String, String)>;

/// The cluster the story left up, and how to reach it.
pub struct Real {
    pub state: PathBuf,
    pub kubectl: Kubectl,
    /// The CNI network whose leases [`Real::leases`] lists (it names the store).
    pub network: &'static str,
    /// Where the nodes keep their CNI configuration and plugins.
    pub layout: NodeLayout,
}

impl Real {
    pub fn new(state: &Path) -> Real {
        let bin = std::fs::read_to_string(state.join("bin")).unwrap();
        Real {
            state: state.to_path_buf(),
            kubectl: Kubectl::new(
                &Path::new(bin.trim()).join("kubectl"),
                &state.join("admin.kubeconfig"),
            ),
            network: "k8s-pod-network",
            layout: node_layout_of(state),
        }
    }

    pub fn script(&self, args: &[&str]) -> String {
        let out = Command::new(repo_root().join("scripts/cluster.sh"))
            .args(args)
            .arg("--state")
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster.sh {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn on_node(&self, node: &str, command: &[&str]) -> String {
        let out = Command::new(repo_root().join("scripts/cluster.sh"))
            .args(["node", "exec", node, "--state"])
            .arg(&self.state)
            .arg("--")
            .args(command)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command:?} on {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The node's leases: `ipkeep list --json` of [`Real::network`].
    pub fn leases(&self, node: &str) -> Vec<Value> {
        let ipkeep = self.layout.ipkeep();
        let list = [ipkeep.as_str(), "list", "--json", "--network", self.network];
        let text = self.on_node(node, &list);
        let list: Value = serde_json::from_str(&text).unwrap();
        list["leases"].as_array().cloned().unwrap_or_default()
    }

    /// Leases of `pod` on `node`, as (ip, state).
    pub fn leases_of(&self, node: &str, pod: &str) -> Vec<(String, String)> {
        self.leases(node)
            .iter()
            .filter(|l| l["pod"]["namespace"] == NS && l["pod"]["name"] == pod)
            .map(|l| {
                (
                    l["ip"].as_str().unwrap_or_default().to_string(),
                    l["state"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    pub fn pods(&self, selector: &str) -> Vec<Value> {
        let list = self
            .kubectl
            .get(&["pods", "-n", NS, "-l", selector])
            .unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Ready pods matching `selector`, by name, with their node and IP.
    pub fn ready_places(&self, selector: &str) -> Places {
        self.pods(selector)
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null() && ready(p))
            .map(|p| {
                (
                    p["metadata"]["name"].as_str().unwrap().to_string(),
                    (
                        p["spec"]["nodeName"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        p["status"]["podIP"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ),
                )
            })
            .collect()
    }

    /// Waits until exactly the pods `names` of `selector` are Ready, and returns where.
    pub fn wait_ready(&self, what: &str, selector: &str, names: &[String]) -> Places {
        wait_until(what, Duration::from_secs(300), || {
            let places = self.ready_places(selector);
            (places.keys().cloned().collect::<Vec<_>>() == names
                && self.pods(selector).len() == names.len())
            .then_some(places)
        })
    }

    /// The PersistentPodState's records: pod → (node, IPv4).
    fn records(&self, pps: &str) -> Places {
        let p = self.kubectl.get(&["pps", pps, "-n", NS]).unwrap();
        p["status"]["podStates"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(pod, r)| {
                        (
                            pod.clone(),
                            (
                                r["nodeName"].as_str().unwrap_or_default().to_string(),
                                r["podIPs"][0].as_str().unwrap_or_default().to_string(),
                            ),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn events(&self, reason: &str) -> Vec<String> {
        let out = self.kubectl.run(&[
            "get",
            "events",
            "-n",
            NS,
            "--field-selector",
            &format!("reason={reason}"),
            "-o",
            "jsonpath={range .items[*]}{.involvedObject.name}: {.message}{\"\\n\"}{end}",
        ]);
        out.lines().map(str::to_string).collect()
    }
}

pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A StatefulSet of busybox sleepers with retention, as a user writes one.
fn statefulset(name: &str, replicas: usize, extra_annotations: &str, strategy: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
  namespace: {NS}
  annotations:
{extra_annotations}
spec:
  replicas: {replicas}
  serviceName: {name}
  podManagementPolicy: Parallel
  updateStrategy:
{strategy}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations:
        ipkeep.dev/ip-retention: 1h
        ipkeep.dev/persistent-pod-state: {name}
    spec:
      terminationGracePeriodSeconds: 1
{}"#,
        sleeper("      ")
    )
}

/// A pod `name` of [`NS`] (labelled `app: NAME`) sleeping on `node`.
pub fn sleeper_pod(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NS}, labels: {{app: {name}}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
{}"#,
        sleeper("  ")
    )
}

/// A busybox sleeper container list, indented by `indent`, with the resources a resize changes.
fn sleeper(indent: &str) -> String {
    [
        "containers:",
        "- name: sleep",
        "  image: localhost/ipkeep/busybox:dev",
        "  imagePullPolicy: Never",
        "  command: [sleep, '1d']",
        "  resources:",
        "    requests: {cpu: 10m, memory: 16Mi}",
        "    limits: {cpu: 100m, memory: 32Mi}",
    ]
    .iter()
    .map(|l| format!("{indent}{l}\n"))
    .collect()
}

/// Every step, in order; the last one changes a node's pod CIDR for good.
pub fn on_real_nodes(state: &Path) {
    let real = Real::new(state);
    // The reboot step waits for missed DELs: 5 s instead of 2 min (a no-op if already so).
    let agent = ["-n", "ipkeep-system", "daemonset/ipkeep-agent"];
    real.kubectl
        .run(&[&["set", "env"][..], &agent, &["IPKEEP_MISSED_DEL_GRACE=5s"]].concat());
    real.kubectl
        .run(&[&["rollout", "status", "--timeout=180s"][..], &agent].concat());
    real.kubectl.run(&["create", "namespace", NS]);
    if dual_stack::is_dual_stack(state) {
        dual_stack::a_rebuilt_pod_keeps_both_families(&real);
    }
    let kv = several_ordinals_rebuilt_at_once(&real);
    ordinal_stable_across_scale_down_and_up(&real, &kv);
    in_place_resize_keeps_the_sandbox(&real);
    a_recreated_statefulset_adopts_what_the_old_one_left(&real);
    a_reboot_without_del(&real);
    a_new_pod_cidr(&real);
    first_rebuild::first_rebuilds_keep_every_ip(&real);
}

/// The dual-stack step alone (`IPKEEP_STEPS=dual-stack`).
pub fn dual_stack_on_real_nodes(state: &Path) {
    assert!(
        dual_stack::is_dual_stack(state),
        "the cluster is not dual-stack (scripts/cluster.sh up --ip-family dual)"
    );
    let real = Real::new(state);
    if real.kubectl.get(&["namespace", NS]).is_none() {
        real.kubectl.run(&["create", "namespace", NS]);
    }
    dual_stack::a_rebuilt_pod_keeps_both_families(&real);
}

/// The first-rebuild step alone (`IPKEEP_STEPS=first-rebuild`).
pub fn first_rebuilds_on_real_nodes(state: &Path) {
    let real = Real::new(state);
    if real.kubectl.get(&["namespace", NS]).is_none() {
        real.kubectl.run(&["create", "namespace", NS]);
    }
    first_rebuild::first_rebuilds_keep_every_ip(&real);
}

/// `maxUnavailable: 3` rebuilds three ordinals of six together, on two nodes: each comes back
/// to its node with its IP.
fn several_ordinals_rebuilt_at_once(real: &Real) -> Places {
    // WhenDeleted: the records of scaled-down ordinals stay (the next step).
    real.kubectl.apply(&format!(
        r#"apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata: {{name: kv, namespace: {NS}}}
spec:
  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: kv}}
  requiredPersistentTopology: {{nodeTopologyKeys: [kubernetes.io/hostname]}}
  persistentPodStateRetentionPolicy: WhenDeleted
  ipRetention: 1h
"#
    ));
    real.kubectl.apply(&statefulset(
        "kv",
        6,
        "    team: storage",
        "    type: RollingUpdate\n    rollingUpdate: {maxUnavailable: 3}",
    ));
    let sts = real.kubectl.get(&["sts", "kv", "-n", NS]).unwrap();
    assert_eq!(
        sts["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 3,
        "kube-apiserver dropped maxUnavailable (feature gate MaxUnavailableStatefulSet off?)"
    );
    let all = names("kv", 6);
    let before = real.wait_ready("kv's 6 pods Ready", "app=kv", &all);
    wait_until("kv's 6 records", Duration::from_secs(60), || {
        (real.records("kv") == before).then_some(())
    });
    let nodes: std::collections::BTreeSet<&String> = before.values().map(|(n, _)| n).collect();
    eprintln!("kv before the rollout: {before:?}");

    real.kubectl.run(&[
        "patch",
        "sts",
        "kv",
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"metadata":{"labels":{"rollout":"1"}}}}}"#,
    ]);
    // Counted while it runs: how many ordinals were down at once.
    let (mut most_down, started) = (0, Instant::now());
    let after = loop {
        let pods = real.pods("app=kv");
        let up = pods
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null() && ready(p))
            .count();
        most_down = most_down.max(6 - up);
        let updated = pods
            .iter()
            .filter(|p| p["metadata"]["labels"]["rollout"] == "1" && ready(p))
            .count();
        if updated == 6 {
            break real.ready_places("app=kv");
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the rollout did not finish: {pods:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("kv after the rollout: {after:?} (at most {most_down} ordinals down at once)");
    assert!(
        most_down >= 2,
        "maxUnavailable 3 rebuilt one ordinal at a time (at most {most_down} down)"
    );
    assert_eq!(after, before, "every ordinal keeps its node and IP");
    assert!(nodes.len() == 2, "kv ran on one node only: {before:?}");
    before
}

/// WhenDeleted with a retention that covers the gap: 6 → 1 → 6 gives every ordinal its node
/// and IP back; meanwhile the records say where each is kept, and `ipkeep list` until when.
fn ordinal_stable_across_scale_down_and_up(real: &Real, kv: &Places) {
    real.kubectl
        .run(&["scale", "sts", "kv", "-n", NS, "--replicas=1"]);
    real.wait_ready("kv scaled to 1", "app=kv", &names("kv", 1));
    assert_eq!(&real.records("kv"), kv, "WhenDeleted keeps every record");
    // The documented view of the records (docs/retention.md).
    let table = real.kubectl.run(&[
        "get",
        "pps",
        "kv",
        "-n",
        NS,
        "-o",
        "go-template={{range $pod, $r := .status.podStates}}{{$pod}} {{$r.nodeName}} {{range $r.podIPs}}{{.}} {{end}}{{\"\\n\"}}{{end}}",
    ]);
    for (pod, (node, ip)) in kv {
        assert!(
            table
                .lines()
                // The pod, its node, its IPv4 address (then its IPv6 one on a dual-stack cluster).
                .any(|l| l.split_whitespace().take(3).eq([
                    pod.as_str(),
                    node.as_str(),
                    ip.as_str()
                ])),
            "{pod} {node} {ip} missing from:\n{table}"
        );
    }
    for (pod, (node, ip)) in kv.iter().skip(1) {
        let held = wait_until(
            &format!("{pod}'s {ip} held on {node}"),
            Duration::from_secs(60),
            || {
                real.leases(node)
                    .into_iter()
                    .find(|l| l["ip"] == ip.as_str() && l["state"] == "held")
            },
        );
        assert_eq!(held["pod"]["name"], pod.as_str());
        assert!(held["until"].as_u64().is_some(), "held until when? {held}");
    }
    let listing = real.on_node(
        &kv["kv-1"].0,
        &[
            &real.layout.ipkeep(),
            "list",
            "--network",
            "k8s-pod-network",
        ],
    );
    eprintln!("ipkeep list on {}:\n{listing}", kv["kv-1"].0);
    assert!(listing.contains(&kv["kv-1"].1), "{listing}");
    real.kubectl
        .run(&["scale", "sts", "kv", "-n", NS, "--replicas=6"]);
    let back = real.wait_ready("kv scaled back to 6", "app=kv", &names("kv", 6));
    assert_eq!(&back, kv, "every ordinal back on its node with its IP");
}

/// An in-place resize changes the container's CPU without a new sandbox: same IP, no restart,
/// ipkeep not involved.
fn in_place_resize_keeps_the_sandbox(real: &Real) {
    let pod = real.kubectl.get(&["pod", "kv-0", "-n", NS]).unwrap();
    let ip = pod["status"]["podIP"].clone();
    let container = pod["status"]["containerStatuses"][0]["containerID"].clone();
    real.kubectl.run(&[
        "patch",
        "pod",
        "kv-0",
        "-n",
        NS,
        "--subresource",
        "resize",
        "-p",
        r#"{"spec":{"containers":[{"name":"sleep","resources":{"requests":{"cpu":"20m"},"limits":{"cpu":"200m"}}}]}}"#,
    ]);
    let resized = wait_until(
        "kv-0 running with the new CPU limit",
        Duration::from_secs(120),
        || {
            let p = real.kubectl.get(&["pod", "kv-0", "-n", NS])?;
            (p["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"] == "200m")
                .then_some(p)
        },
    );
    assert_eq!(resized["status"]["podIP"], ip);
    assert_eq!(
        resized["status"]["containerStatuses"][0]["containerID"],
        container
    );
    assert_eq!(resized["status"]["containerStatuses"][0]["restartCount"], 0);
}

/// `kubectl delete sts --cascade=orphan` of a StatefulSet annotated for adoption keeps its
/// PersistentPodState and records (a pod rebuilt meanwhile keeps its hold); the re-created
/// StatefulSet takes them over, and the rebuilt pod gets its node and IP back.
fn a_recreated_statefulset_adopts_what_the_old_one_left(real: &Real) {
    let manifest = statefulset(
        "ad",
        2,
        "    ipkeep.dev/auto-generate-persistent-pod-state: \"true\"\n    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname\n    ipkeep.dev/adopt-persistent-pod-state: \"true\"",
        "    type: RollingUpdate",
    );
    real.kubectl.apply(&manifest);
    let before = real.wait_ready("ad's 2 pods Ready", "app=ad", &names("ad", 2));
    wait_until("ad's records", Duration::from_secs(60), || {
        (real.records("ad") == before).then_some(())
    });
    let pps = real.kubectl.get(&["pps", "ad", "-n", NS]).unwrap();
    assert_eq!(
        pps["metadata"]["annotations"]["ipkeep.dev/adopt-persistent-pod-state"], "true",
        "the annotation travels to the generated PersistentPodState"
    );
    real.kubectl
        .run(&["delete", "sts", "ad", "-n", NS, "--cascade=orphan"]);
    wait_until(
        "the PersistentPodState orphaned, kept for adoption",
        Duration::from_secs(60),
        || {
            let p = real.kubectl.get(&["pps", "ad", "-n", NS])?;
            let waiting = p["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["reason"] == "WaitingForAdoption");
            (p["metadata"]["ownerReferences"].is_null() && waiting).then_some(())
        },
    );
    // Rebuilt while no StatefulSet exists: its address is held on its node.
    let (node, ip) = before["ad-1"].clone();
    real.kubectl
        .run(&["delete", "pod", "ad-1", "-n", NS, "--wait=true"]);
    // Every address of it held (one a family): its IP among them.
    let families = if dual_stack::is_dual_stack(&real.state) {
        2
    } else {
        1
    };
    let held = |leases: &[(String, String)]| {
        leases.len() == families
            && leases.iter().all(|(_, state)| state == "held")
            && leases.iter().any(|(i, _)| *i == ip)
    };
    wait_until(
        &format!("ad-1's {ip} held"),
        Duration::from_secs(60),
        || held(&real.leases_of(&node, "ad-1")).then_some(()),
    );
    // The agents' release grace (5 s) and a sweep pass: the hold stays, the records say so.
    std::thread::sleep(Duration::from_secs(15));
    let leases = real.leases_of(&node, "ad-1");
    assert!(
        held(&leases),
        "the hold of a pod whose records wait for adoption stays: {leases:?}"
    );
    assert_eq!(real.records("ad"), before);
    real.kubectl.apply(&manifest);
    let after = real.wait_ready("ad re-created", "app=ad", &names("ad", 2));
    assert_eq!(
        after, before,
        "ad-1 back on {node} with {ip}; ad-0 adopted as it ran"
    );
    let sts_uid = real.kubectl.get(&["sts", "ad", "-n", NS]).unwrap()["metadata"]["uid"].clone();
    wait_until(
        "the PersistentPodState owned by the new StatefulSet",
        Duration::from_secs(60),
        || {
            let p = real.kubectl.get(&["pps", "ad", "-n", NS])?;
            (p["metadata"]["ownerReferences"][0]["uid"] == sts_uid
                && p["status"]["targetUID"] == sts_uid)
                .then_some(())
        },
    );
    for reason in ["PersistentPodStateAdopted", "RecordsAdopted"] {
        let events = real.events(reason);
        assert!(!events.is_empty(), "no {reason} Event");
        eprintln!("{reason}: {events:?}");
    }
}

/// A node powered off and on: every process killed, /run (the sandboxes' network namespaces)
/// and the runtime's records of its sandboxes gone, so no DEL for any sandbox. Every
/// StatefulSet pod comes back with its IP; a pod without retention gets an address in a new
/// sandbox, and its old sandbox's address does not stay in use: every active lease is a running
/// pod's. (Checked to fail with the agents' missed-DEL grace raised to an hour: the old sandbox's
/// address of `loner` stayed in use beside the new one.)
fn a_reboot_without_del(real: &Real) {
    let kv = real.ready_places("app=kv");
    let node = kv["kv-0"].0.clone();
    real.kubectl.apply(&sleeper_pod("loner", &node));
    let loner = real.wait_ready("loner Ready", "app=loner", &["loner".to_string()]);
    let containers = |selector: &str| -> BTreeMap<String, Value> {
        real.pods(selector)
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node.as_str())
            .map(|p| {
                (
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["status"]["containerStatuses"][0]["containerID"].clone(),
                )
            })
            .collect()
    };
    let before = containers("app in (kv, loner)");
    eprintln!("before the reboot of {node}: kv {kv:?}, loner {loner:?}");
    real.script(&["node", "kill", &node]);
    // containerd keeps its sandboxes' records on disk, and after a reboot it would send DEL
    // (without a network namespace) for each; CRI-O wipes them after an unclean shutdown, and
    // some nodes keep runtime state on ephemeral disks. The harder case: no DEL at all. (`node
    // start` imports the images again.)
    let runtime = real
        .state
        .join("nodes")
        .join(&node)
        .join("root/var/lib/containerd");
    std::fs::remove_dir_all(&runtime).unwrap();
    std::fs::create_dir(&runtime).unwrap();
    real.script(&["node", "start", &node]);
    let after = wait_until(
        &format!("kv's pods Ready again in new sandboxes after {node} rebooted"),
        Duration::from_secs(300),
        || {
            let now = containers("app in (kv, loner)");
            let renewed = before
                .iter()
                .all(|(pod, id)| now.get(pod).is_some_and(|n| n != id && !n.is_null()));
            let places = real.ready_places("app=kv");
            (renewed && places.len() == 6).then_some(places)
        },
    );
    assert_eq!(after, kv, "every StatefulSet pod keeps its node and IP");
    let loner_after = real.wait_ready("loner Ready again", "app=loner", &["loner".to_string()]);
    eprintln!("loner after the reboot: {loner_after:?}");
    // Every active lease on the node is a running pod's, once each.
    wait_until(
        &format!("{node}'s active leases are its running pods' addresses"),
        Duration::from_secs(120),
        || {
            let running: std::collections::BTreeSet<(String, String)> = real.kubectl.get(&[
                "pods",
                "-A",
                "--field-selector",
                &format!("spec.nodeName={node}"),
            ])?["items"]
                .as_array()?
                .iter()
                .filter(|p| p["spec"]["hostNetwork"] != true)
                .flat_map(|p| {
                    // Every address (both families on a dual-stack cluster).
                    let name = p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    dual_stack::pod_ips(p)
                        .into_iter()
                        .map(move |ip| (name.clone(), ip))
                })
                .collect();
            let active: Vec<(String, String)> = real
                .leases(&node)
                .iter()
                .filter(|l| l["state"] == "active")
                .map(|l| {
                    (
                        l["pod"]["name"].as_str().unwrap_or_default().to_string(),
                        l["ip"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            let as_set: std::collections::BTreeSet<_> = active.iter().cloned().collect();
            eprintln!("{node}: running {running:?}, active {active:?}");
            (as_set == running && active.len() == running.len()).then_some(())
        },
    );
    real.kubectl
        .run(&["delete", "pod", "loner", "-n", NS, "--wait=true"]);
}

/// The Node deleted and registered again with another pod CIDR, while kv's addresses there are
/// held for its rebuilt pods: they get addresses of the new range, the old holds go, and each
/// pod gets a Warning `IPNotKept` saying why.
fn a_new_pod_cidr(real: &Real) {
    let kv = real.ready_places("app=kv");
    let node = kv["kv-0"].0.clone();
    let on_node: Vec<(String, String)> = kv
        .iter()
        .filter(|(_, (n, _))| *n == node)
        .map(|(p, (_, ip))| (p.clone(), ip.clone()))
        .collect();
    let old_cidr = real.kubectl.get(&["node", &node]).unwrap()["spec"]["podCIDR"]
        .as_str()
        .unwrap()
        .to_string();
    // Every family's (a dual-stack Node has an IPv6 one too).
    let old_cidrs = real.kubectl.get(&["node", &node]).unwrap()["spec"]["podCIDRs"].to_string();
    // The node's daemons stop (its pods run on), its Node goes; pod GC deletes its pods and the
    // StatefulSet re-creates them, pinned to the node, Pending.
    let uids = |pods: &[Value]| -> BTreeMap<String, Value> {
        pods.iter()
            .map(|p| {
                (
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["metadata"]["uid"].clone(),
                )
            })
            .collect()
    };
    let before = uids(&real.pods("app=kv"));
    real.script(&["node", "stop", &node]);
    real.kubectl.run(&["delete", "node", &node]);
    // Pod garbage collection deletes the pods of a Node that is gone (after a quarantine of
    // 40 s) and the StatefulSet re-creates them. A Node registered again before that keeps its
    // running pods, sandboxes and addresses (in the old range): nothing is rebuilt then.
    wait_until(
        &format!("kv's pods on {node} deleted by pod GC and re-created"),
        Duration::from_secs(240),
        || {
            let now = uids(&real.pods("app=kv"));
            on_node
                .iter()
                .all(|(pod, _)| now.get(pod).is_some_and(|uid| Some(uid) != before.get(pod)))
                .then_some(())
        },
    );
    let conflist = format!("{}/10-ipkeep.conflist", real.layout.cni_conf_dir);
    wait_until(
        "the agent removed the deleted Node's CNI configuration",
        Duration::from_secs(60),
        || {
            (real
                .on_node(
                    &node,
                    &["sh", "-c", &format!("test -e {conflist} || echo gone")],
                )
                .contains("gone"))
            .then_some(())
        },
    );
    // Its old CIDR goes to another Node meanwhile (one without a kubelet, which nothing can be
    // scheduled on), as it may on a busy cluster; kube-controller-manager would otherwise hand
    // the freed CIDR straight back.
    real.kubectl.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: cidr-holder}}\n\
         spec:\n  podCIDR: {old_cidr}\n  podCIDRs: {old_cidrs}\n  unschedulable: true\n"
    ));
    // The bridge keeps its old gateway address, and the bridge plugin refuses a new one ("cni0
    // already has an IP address different from …"): as after a reboot, it goes.
    real.on_node(&node, &["ip", "link", "delete", "cni0"]);
    real.script(&["node", "start", &node]);
    let new_cidr = wait_until(
        &format!("{node} registered again with a pod CIDR"),
        Duration::from_secs(120),
        || {
            real.kubectl.get(&["node", &node])?["spec"]["podCIDR"]
                .as_str()
                .map(str::to_string)
        },
    );
    eprintln!("{node}: pod CIDR {old_cidr} -> {new_cidr}");
    assert_ne!(
        new_cidr, old_cidr,
        "kube-controller-manager gave the same CIDR back"
    );
    // The kubelet of a Node registered anew takes a minute to report Ready here.
    let after = real.wait_ready("kv Ready again", "app=kv", &names("kv", 6));
    // The agent publishes Events from a queue after the ADD has answered (events.rs): wait for
    // them a while rather than read once the pods are Ready.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let events = loop {
        let events = real.events("IPNotKept");
        let named = |pod: &String, ip: &String| {
            (events.iter()).any(|e| e.starts_with(&format!("{pod}: ")) && e.contains(ip.as_str()))
        };
        if on_node.iter().all(|(pod, ip)| named(pod, ip)) || std::time::Instant::now() > deadline {
            break events;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!("IPNotKept: {events:?}");
    for (pod, old_ip) in &on_node {
        let (n, ip) = &after[pod];
        assert_eq!(n, &node, "{pod} stays pinned to {node}");
        assert_ne!(ip, old_ip, "{pod} cannot keep {old_ip} outside {new_cidr}");
        // Its addresses (one a family) active, nothing else: the old holds are gone.
        let mut leases = real.leases_of(&node, pod);
        leases.sort();
        let mut want: Vec<(String, String)> =
            dual_stack::pod_ips(&real.kubectl.get(&["pod", pod, "-n", NS]).unwrap())
                .into_iter()
                .map(|ip| (ip, "active".to_string()))
                .collect();
        want.sort();
        assert!(
            want.iter().any(|(i, _)| i == ip),
            "{pod}: {ip} not in its podIPs {want:?}"
        );
        assert_eq!(leases, want, "{pod}: the old hold is gone");
        assert!(
            events
                .iter()
                .any(|e| e.starts_with(&format!("{pod}: ")) && e.contains(old_ip.as_str())),
            "no IPNotKept Event for {pod} naming {old_ip}: {events:?}"
        );
    }
    real.kubectl.run(&["delete", "node", "cidr-holder"]);
}
