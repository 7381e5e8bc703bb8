//! ipkeep on a real control plane: kube-apiserver, kube-controller-manager, kube-scheduler and
//! etcd built from upstream, kwok nodes, ipkeep installed from `deploy/` by
//! `scripts/cluster.sh` with each component on its own ServiceAccount's token, and the webhook
//! port requiring client certificates (`--webhook-client-auth`: kube-apiserver and
//! kube-scheduler present theirs, as docs/install.md sets them up).
//!
//! One cluster serves the steps below in order (starting one takes tens of seconds); each step
//! names itself in its assertions.

#[path = "cluster/client_auth.rs"]
mod client_auth;
#[path = "cluster/hooks.rs"]
mod hooks;
#[path = "cluster/lifecycle.rs"]
mod lifecycle;
#[path = "cluster/namespaces.rs"]
mod namespaces;
#[path = "cluster/pins.rs"]
mod pins;
#[path = "cluster/records.rs"]
mod records;
#[path = "cluster/restarts.rs"]
mod restarts;

use std::time::Duration;

use ipkeep_tests::cluster::{
    Cluster, k8s_version_wanted, require_go, required_placement, wait_until,
};
use serde_json::Value;

/// Enough for placement to mean something: a rebuilt pod finds its node among 50.
const NODES: usize = 50;
const LONG: Duration = Duration::from_secs(90);

/// A StatefulSet `name` in `namespace` of `replicas` busybox pods on the kwok nodes (which they
/// tolerate), labelled `app: NAME`, started in parallel and deleted without grace. `metadata`,
/// `spec` and `pod_metadata` are more YAML lines of its metadata, its spec (both indented by two)
/// and its pods' metadata (indented by six).
fn kwok_statefulset(
    namespace: &str,
    name: &str,
    replicas: u32,
    metadata: &str,
    spec: &str,
    pod_metadata: &str,
) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {name}
  namespace: {namespace}
{metadata}spec:
  serviceName: {name}
  replicas: {replicas}
  podManagementPolicy: Parallel
{spec}  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
{pod_metadata}    spec:
      terminationGracePeriodSeconds: 0
      tolerations:
        - {{key: kwok.x-k8s.io/node, operator: Exists, effect: NoSchedule}}
      containers:
        - name: c
          image: localhost/ipkeep/busybox:1.35
"#
    )
}

/// A PersistentPodState `name` in `namespace` for the StatefulSet of that name, its pods kept
/// on their node; `spec` is more YAML lines of its spec (indented by two).
fn persistent_pod_state(namespace: &str, name: &str, spec: &str) -> String {
    format!(
        r#"apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: {name}}}
  requiredPersistentTopology: {{nodeTopologyKeys: [kubernetes.io/hostname]}}
{spec}"#
    )
}

/// A StatefulSet of [`kwok_statefulset`] in `db`, with a generated PersistentPodState (24 h IP
/// retention) that its pods name.
fn statefulset(name: &str, replicas: u32) -> String {
    let metadata = r#"  annotations:
    ipkeep.dev/auto-generate-persistent-pod-state: "true"
    ipkeep.dev/required-persistent-topology: kubernetes.io/hostname
    ipkeep.dev/preferred-persistent-topology: topology.kubernetes.io/zone
    ipkeep.dev/ip-retention: "24h"
"#;
    let pod = format!("      annotations:\n        ipkeep.dev/persistent-pod-state: {name}\n");
    kwok_statefulset("db", name, replicas, metadata, "", &pod)
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
    let cluster = Cluster::up_with(NODES, &["--webhook-client-auth"]);
    the_chosen_kubernetes_runs(&cluster);
    crd_is_structural_and_validates(&cluster);
    cluster.run(&["create", "namespace", "db"]);
    statefulset_pods_are_recorded_pinned_and_pruned(&cluster);
    records::kruise_spelling_and_ordinals_start(&cluster);
    namespaces::a_labelled_namespace_gets_every_statefulset_pinned(&cluster);
    pins::a_conflicting_pin_is_skipped_and_explained(&cluster);
    leader_election_hands_over(&cluster);
    a_lost_node_lets_its_pod_go_after_the_policy(&cluster);
    lifecycle::forged_requests_and_pod_labels_delete_nothing(&cluster);
    pins::the_extender_alone_pins(&cluster);
    client_auth::the_webhook_port_serves_only_client_certificates_from_its_ca(&cluster);
    pins::pods_are_created_while_scheduler_ext_is_down(&cluster);
    restarts::a_restarted_controller_picks_up_what_exists(&cluster);
    for component in ["controller-0", "controller-1", "scheduler-ext"] {
        // Refused by RBAC: not an Event refused because the steps delete their namespaces.
        let refused: Vec<String> = cluster
            .log_tail(component, 100_000)
            .lines()
            .filter(|l| {
                l.to_lowercase().contains("forbidden") && !l.contains("NamespaceTerminating")
            })
            .map(str::to_string)
            .collect();
        assert!(
            refused.is_empty(),
            "RBAC: {component} was refused something deploy/ should grant:\n{}",
            refused[..refused.len().min(5)].join("\n")
        );
    }
    down_stops_a_process_its_pid_files_lost(cluster);
}

/// `down` stops a process that runs with the cluster's certificates though no pid file names it
/// (a soak's kube-apiserver restart once left one so, serving the cluster's port after `down`).
fn down_stops_a_process_its_pid_files_lost(cluster: Cluster) {
    let mut stray = std::process::Command::new("sh")
        .args(["-c", "while :; do sleep 1; done"])
        .arg(format!(
            "--client-ca-file={}/pki/ca.crt",
            cluster.state().display()
        ))
        .spawn()
        .expect("spawn sh");
    drop(cluster);
    let t = std::time::Instant::now();
    while stray.try_wait().expect("try_wait").is_none() {
        if t.elapsed() > Duration::from_secs(20) {
            let _ = stray.kill();
            let _ = stray.wait();
            panic!(
                "scripts/cluster.sh down left running a process with the cluster's certificates on its command line"
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// kube-apiserver, and the kubectl the steps drive, are the release asked for
/// (`IPKEEP_K8S_VERSION`; CI runs this suite on the newest and the oldest supported release).
fn the_chosen_kubernetes_runs(cluster: &Cluster) {
    let chosen = cluster.k8s_version();
    if let Some(wanted) = k8s_version_wanted() {
        assert_eq!(chosen, wanted, "version: the cluster runs another release");
    }
    let version: Value =
        serde_json::from_str(&cluster.run(&["version", "-o", "json"])).expect("kubectl's JSON");
    for side in ["serverVersion", "clientVersion"] {
        assert_eq!(
            version[side]["gitVersion"], chosen,
            "version: {side} is not {chosen}: {version}"
        );
    }
    eprintln!("the control plane runs Kubernetes {chosen}");
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
    // Both replicas started together: exactly one of them may have led since (two did while
    // they shared one field manager for the Lease).
    let led: Vec<&str> = ["controller-0", "controller-1"]
        .into_iter()
        .filter(|c| cluster.log_tail(c, 100_000).contains("became the leader"))
        .collect();
    assert_eq!(
        led,
        [first.as_str()],
        "leader election: more than one leader"
    );
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

fn kill(cluster: &Cluster, component: &str) {
    let pid = cluster.pid(component).expect("the component's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
}

fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().expect("a uid").to_string()
}

/// Deletes `pod` of namespace `db` (forcibly if `force`) and waits for the StatefulSet
/// controller's new one to be scheduled.
fn rebuild(cluster: &Cluster, pod: &str, force: bool) -> Value {
    rebuild_in(cluster, "db", pod, force)
}

/// [`rebuild`] in `namespace`.
fn rebuild_in(cluster: &Cluster, namespace: &str, pod: &str, force: bool) -> Value {
    let old = uid(&cluster
        .get(&["pod", pod, "-n", namespace])
        .expect("the pod exists"));
    let mut args = vec!["delete", "pod", pod, "-n", namespace, "--wait=false"];
    if force {
        args.extend(["--force", "--grace-period=0"]);
    }
    cluster.run(&args);
    wait_until(&format!("{pod} rebuilt and scheduled"), LONG, || {
        let p = cluster.get(&["pod", pod, "-n", namespace])?;
        (uid(&p) != old && p["spec"]["nodeName"].is_string()).then_some(p)
    })
}

/// A node stops heartbeating (kwok lets go of it): the real node lifecycle controller marks it
/// NotReady, the controller marks the record lost, and after `nodeLossPolicy.after` a rebuilt
/// pod is pinned by preference only and starts elsewhere.
fn a_lost_node_lets_its_pod_go_after_the_policy(cluster: &Cluster) {
    cluster.apply(&persistent_pod_state(
        "db",
        "lost",
        r#"  preferredPersistentTopology:
    - weight: 50
      preference: {nodeTopologyKeys: [topology.kubernetes.io/zone]}
  nodeLossPolicy: {action: FallbackToPreferred, after: 5s}
"#,
    ));
    // The pod starts on a node of its own kwok: every other node is cordoned meanwhile.
    let mut kwok = cluster.lossable_node("lossy-0", "zone-0");
    let others = "type=kwok,kubernetes.io/hostname!=lossy-0";
    cluster.run(&["cordon", "-l", others]);
    let sts = statefulset("lost", 1).replace(
        "    ipkeep.dev/auto-generate-persistent-pod-state: \"true\"\n",
        "",
    );
    cluster.apply(&sts);
    let record = |c: &Cluster| -> Option<Value> {
        c.get(&["pps", "lost", "-n", "db"])?["status"]["podStates"]["lost-0"]
            .as_object()
            .map(|o| Value::Object(o.clone()))
    };
    let node = wait_until("lost-0 recorded", LONG, || {
        record(cluster)?["nodeName"].as_str().map(str::to_string)
    });
    assert_eq!(
        node, "lossy-0",
        "node loss: the pod did not start on the lossable node"
    );
    cluster.run(&["uncordon", "-l", others]);
    kwok.kill();
    wait_until("the record falls back to preferred placement", LONG, || {
        (record(cluster)?["preferredOnly"] == true).then_some(())
    });
    let pps = cluster.get(&["pps", "lost", "-n", "db"]).expect("pps");
    let lost = pps["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "NodeLost" && c["status"] == "True");
    assert!(lost, "node loss: no NodeLost condition: {}", pps["status"]);
    // The old pod cannot finish terminating on a node nobody runs: an operator force-deletes it.
    let rebuilt = rebuild(cluster, "lost-0", true);
    let affinity = &rebuilt["spec"]["affinity"]["nodeAffinity"];
    assert!(
        !required_placement(&rebuilt).contains(&node),
        "node loss: still required on {node}: {}",
        required_placement(&rebuilt)
    );
    assert!(
        affinity["preferredDuringSchedulingIgnoredDuringExecution"]
            .to_string()
            .contains(&node),
        "node loss: the lost node is no longer even preferred: {affinity}"
    );
    assert_ne!(
        rebuilt["spec"]["nodeName"],
        node.as_str(),
        "node loss: placed on the lost node"
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
    let node_of_1 = states["db-1"]["nodeName"]
        .as_str()
        .expect("a recorded node")
        .to_string();
    let rebuilt = rebuild(cluster, "db-1", false);
    let required = required_placement(&rebuilt);
    assert!(
        required.contains(&node_of_1),
        "{:?}: the rebuilt pod is not pinned to {node_of_1}: {required}; its annotations {}; the namespace's admission plan: {}",
        cluster.admission(),
        rebuilt["metadata"]["annotations"],
        cluster
            .get(&["configmap", "ipkeep-admission-plan", "-n", "db"])
            .map(|c| c["data"].clone())
            .unwrap_or_default()
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
