//! OpenKruise's Advanced StatefulSet (`apps.kruise.io/v1beta1`), run by the real kruise-manager
//! (`scripts/cluster.sh --with-kruise`), on the real nodes the story left running. Two sets of 3
//! on the two nodes: `akv`, annotated (its PersistentPodState generated: `WhenScaled`), and
//! `awd`, with a PersistentPodState written for it (`WhenDeleted`). A pod deleted and one
//! labelled `apps.kruise.io/specified-delete` come back with their node and addresses; reserving
//! ordinal 1 (`spec.reserveOrdinals`) condemns pod 1 and Kruise creates pod 3: `akv-1`'s record
//! goes and its address is freed, `awd-1`'s stay held, and un-reserving it brings `awd-1` back to
//! its node with its addresses; a rolling update with `partition` rebuilds only the pods past it
//! and then every pod, each keeping its node and addresses; an in-place image update
//! (`podUpdatePolicy: InPlaceIfPossible`) keeps the pods themselves; `awd` scaled 3 → 1 → 3 gets
//! every ordinal back where it was. Addresses are compared in full (both families on a
//! dual-stack cluster), and on the nodes' stores.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::wait_until;
use serde_json::Value;

use crate::retention::{NS, Real, ready};

/// kubectl's name for Kruise's StatefulSets (`sts` is the `apps` one's).
const ASTS: &str = "statefulsets.apps.kruise.io";
/// Kruise's label that has its controller delete and re-create a pod.
const SPECIFIED_DELETE: &str = "apps.kruise.io/specified-delete";

/// One pod as these steps compare it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pod {
    uid: String,
    node: String,
    /// status.podIPs: IPv4, then IPv6 on a dual-stack cluster.
    ips: Vec<String>,
    container: String,
    image_id: String,
    restarts: u64,
    labels: Value,
}

impl Pod {
    fn of(p: &Value) -> Pod {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let c = &p["status"]["containerStatuses"][0];
        Pod {
            uid: s(&p["metadata"]["uid"]),
            node: s(&p["spec"]["nodeName"]),
            ips: p["status"]["podIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["ip"].as_str().map(str::to_string))
                .collect(),
            container: s(&c["containerID"]),
            image_id: s(&c["imageID"]),
            restarts: c["restartCount"].as_u64().unwrap_or_default(),
            labels: p["metadata"]["labels"].clone(),
        }
    }

    fn place(&self) -> (String, Vec<String>) {
        (self.node.clone(), self.ips.clone())
    }
}

type Pods = BTreeMap<String, Pod>;
/// Pod → (node, addresses).
type Places = BTreeMap<String, (String, Vec<String>)>;

fn places(pods: &Pods) -> Places {
    pods.iter().map(|(n, p)| (n.clone(), p.place())).collect()
}

fn names(set: &str, ordinals: &[u32]) -> Vec<String> {
    ordinals.iter().map(|o| format!("{set}-{o}")).collect()
}

/// Waits until the pods of `set` are exactly `ordinals`, none terminating, each Ready with its
/// addresses, and `done` holds of them; returns them.
fn wait_pods(
    real: &Real,
    what: &str,
    set: &str,
    ordinals: &[u32],
    done: impl Fn(&Pods) -> bool,
) -> Pods {
    let want = names(set, ordinals);
    wait_until(what, Duration::from_secs(180), || {
        let all = real.pods(&format!("app={set}"));
        let pods: Pods = all
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null() && ready(p))
            .map(|p| {
                (
                    p["metadata"]["name"].as_str().unwrap().to_string(),
                    Pod::of(p),
                )
            })
            .filter(|(_, p)| !p.ips.is_empty())
            .collect();
        (all.len() == want.len() && pods.keys().cloned().collect::<Vec<_>>() == want && done(&pods))
            .then_some(pods)
    })
}

/// The records of PersistentPodState `pps`: pod → (node, addresses).
fn records(real: &Real, pps: &str) -> Places {
    let p = real.kubectl.get(&["pps", pps, "-n", NS]);
    let states = p
        .as_ref()
        .and_then(|p| p["status"]["podStates"].as_object());
    states
        .into_iter()
        .flatten()
        .map(|(pod, r)| {
            let ips = r["podIPs"].as_array().into_iter().flatten();
            let ips = ips.filter_map(|i| i.as_str().map(str::to_string)).collect();
            let node = r["nodeName"].as_str().unwrap_or_default().to_string();
            (pod.clone(), (node, ips))
        })
        .collect()
}

/// Waits until the records of `pps` say `want` of `pods` (and maybe more).
fn wait_recorded(real: &Real, pps: &str, want: &Places) {
    wait_until(
        &format!("{pps}'s records of {:?}", want.keys()),
        Duration::from_secs(60),
        || {
            let got = records(real, pps);
            want.iter()
                .all(|(pod, place)| got.get(pod) == Some(place))
                .then_some(())
        },
    );
}

/// The leases of `pod` on `node`, as (address, state), sorted.
fn leases(real: &Real, node: &str, pod: &str) -> Vec<(String, String)> {
    let mut l = real.leases_of(node, pod);
    l.sort();
    l
}

/// `addresses`, each in `state`, sorted as [`leases`] sorts.
fn each(addresses: &[String], state: &str) -> Vec<(String, String)> {
    let mut l: Vec<_> = addresses
        .iter()
        .map(|ip| (ip.clone(), state.to_string()))
        .collect();
    l.sort();
    l
}

/// A `kubectl patch --type=merge` of the Advanced StatefulSet `set`.
fn patch(real: &Real, set: &str, patch: &str) {
    real.kubectl
        .run(&["patch", ASTS, set, "-n", NS, "--type=merge", "-p", patch]);
}

/// An Advanced StatefulSet of 3 busybox sleepers, one node apart at most (its pods spread
/// over the real nodes), with Kruise's readiness gate for in-place updates, as Kruise's
/// documentation asks of an Advanced StatefulSet that updates in place.
fn advanced_statefulset(name: &str, annotations: &str) -> String {
    format!(
        r#"apiVersion: apps.kruise.io/v1beta1
kind: StatefulSet
metadata:
  name: {name}
  namespace: {NS}
  annotations: {annotations}
spec:
  replicas: 3
  serviceName: {name}
  podManagementPolicy: Parallel
  selector: {{matchLabels: {{app: {name}}}}}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate: {{podUpdatePolicy: ReCreate, maxUnavailable: 1}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: 1
      readinessGates: [{{conditionType: InPlaceUpdateReady}}]
      nodeSelector: {{ipkeep.dev/test-node: real}}
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          nodeTaintsPolicy: Honor
          labelSelector: {{matchLabels: {{app: {name}}}}}
      containers:
        - name: sleep
          image: localhost/ipkeep/busybox:dev
          imagePullPolicy: Never
          command: [sleep, '1d']
"#
    )
}

/// Every step, in order, in namespace [`NS`]; the two Advanced StatefulSets are deleted at the
/// end.
pub fn on_real_nodes(state: &Path) {
    let real = Real::new(state);
    assert!(
        real.kubectl
            .get(&["crd", "statefulsets.apps.kruise.io"])
            .is_some(),
        "the cluster serves no Advanced StatefulSets: bring it up with kruise-manager (scripts/cluster.sh up --with-kruise ARCHIVE, or IPKEEP_WITH_KRUISE=ARCHIVE)"
    );
    if real.kubectl.get(&["namespace", NS]).is_none() {
        real.kubectl.run(&["create", "namespace", NS]);
    }
    let started = Instant::now();
    let (akv, awd) = both_run_on_two_nodes(&real);
    let akv = a_rebuilt_and_a_specified_delete_keep_their_place(&real, &akv);
    let (akv, awd) = a_reserved_ordinal_is_condemned_and_comes_back(&real, &akv, &awd);
    let akv = a_partitioned_rolling_update_keeps_every_place(&real, &akv);
    an_in_place_update_keeps_the_pods(&real, &akv);
    awd_scaled_down_and_up_keeps_every_place(&real, &awd);
    real.kubectl
        .run(&["delete", ASTS, "akv", "awd", "-n", NS, "--wait=false"]);
    real.kubectl
        .run(&["delete", "pps", "awd", "-n", NS, "--wait=false"]);
    eprintln!(
        "the Advanced StatefulSet steps took {:?}",
        started.elapsed()
    );
}

/// `akv` (annotated) and `awd` (its PersistentPodState written, `WhenDeleted`) of 3 each: Ready,
/// on both nodes, each pod recorded where it runs; the generated PersistentPodState targets the
/// Advanced StatefulSet by its group.
fn both_run_on_two_nodes(real: &Real) -> (Pods, Pods) {
    real.kubectl.apply(&format!(
        r#"apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata: {{name: awd, namespace: {NS}}}
spec:
  targetRef: {{apiVersion: apps.kruise.io/v1beta1, kind: StatefulSet, name: awd}}
  requiredPersistentTopology: {{nodeTopologyKeys: [kubernetes.io/hostname]}}
  persistentPodStateRetentionPolicy: WhenDeleted
  ipRetention: 1h
"#
    ));
    real.kubectl.apply(&advanced_statefulset(
        "akv",
        r#"{ipkeep.dev/auto-generate-persistent-pod-state: "true", ipkeep.dev/required-persistent-topology: kubernetes.io/hostname}"#,
    ));
    real.kubectl.apply(&advanced_statefulset("awd", "{}"));
    let mut both = Vec::new();
    for set in ["akv", "awd"] {
        let pods = wait_pods(
            real,
            &format!("{set}'s 3 pods Ready"),
            set,
            &[0, 1, 2],
            |_| true,
        );
        wait_recorded(real, set, &places(&pods));
        let nodes: BTreeSet<&String> = pods.values().map(|p| &p.node).collect();
        assert_eq!(
            nodes.len(),
            2,
            "{set} does not run on both nodes: {pods:#?}"
        );
        eprintln!("{set}: {:?}", places(&pods));
        both.push(pods);
    }
    let pps = real.kubectl.get(&["pps", "akv", "-n", NS]).unwrap();
    assert_eq!(
        pps["spec"]["targetRef"]["apiVersion"], "apps.kruise.io/v1beta1",
        "akv's generated PersistentPodState: {pps}"
    );
    assert_eq!(
        pps["metadata"]["ownerReferences"][0]["apiVersion"],
        "apps.kruise.io/v1beta1"
    );
    let awd = both.pop().unwrap();
    (both.pop().unwrap(), awd)
}

/// `akv-0` deleted and `akv-1` labelled `apps.kruise.io/specified-delete`, at once: Kruise
/// re-creates both (new UIDs, the new `akv-1` without the label), each on its node with its
/// addresses; `akv-2` untouched.
fn a_rebuilt_and_a_specified_delete_keep_their_place(real: &Real, before: &Pods) -> Pods {
    real.kubectl
        .run(&["delete", "pod", "akv-0", "-n", NS, "--wait=false"]);
    real.kubectl.run(&[
        "label",
        "pod",
        "akv-1",
        "-n",
        NS,
        &format!("{SPECIFIED_DELETE}=true"),
    ]);
    let after = wait_pods(
        real,
        "akv-0 and akv-1 re-created and Ready",
        "akv",
        &[0, 1, 2],
        |p| p["akv-0"].uid != before["akv-0"].uid && p["akv-1"].uid != before["akv-1"].uid,
    );
    eprintln!(
        "akv after a delete and a specified-delete: {:?}",
        places(&after)
    );
    assert_eq!(
        places(&after),
        places(before),
        "akv-0 (deleted) and akv-1 (specified-delete) keep their nodes and addresses"
    );
    assert_eq!(after["akv-2"].uid, before["akv-2"].uid, "akv-2 was rebuilt");
    assert!(
        after["akv-1"].labels.get(SPECIFIED_DELETE).is_none(),
        "the re-created akv-1 still has {SPECIFIED_DELETE}: {:?}",
        after["akv-1"].labels
    );
    after
}

/// `reserveOrdinals: [1]` on both: Kruise deletes pod 1 and creates pod 3, the others stay.
/// `akv` (`WhenScaled`): `akv-1`'s record goes and its node frees its addresses. `awd`
/// (`WhenDeleted`): `awd-1`'s record stays and its addresses stay held on its node. Ordinal 1
/// un-reserved: pod 3 goes, pod 1 comes back: `awd-1` on its node with its addresses; `akv-1`
/// recorded anew and `akv-3`'s record pruned in turn.
fn a_reserved_ordinal_is_condemned_and_comes_back(
    real: &Real,
    akv: &Pods,
    awd: &Pods,
) -> (Pods, Pods) {
    for set in ["akv", "awd"] {
        patch(real, set, r#"{"spec":{"reserveOrdinals":[1]}}"#);
    }
    for (set, before) in [("akv", akv), ("awd", awd)] {
        let now = wait_pods(
            real,
            &format!("{set}-1 condemned and {set}-3 created"),
            set,
            &[0, 2, 3],
            |_| true,
        );
        for kept in [0, 2] {
            let pod = format!("{set}-{kept}");
            assert_eq!(now[&pod], before[&pod], "{pod} changed");
        }
        wait_recorded(real, set, &places(&now));
        eprintln!("{set} with ordinal 1 reserved: {:?}", places(&now));
    }
    let (node, ips) = akv["akv-1"].place();
    wait_until(
        "akv-1's record pruned and its addresses freed (WhenScaled)",
        Duration::from_secs(60),
        || {
            (!records(real, "akv").contains_key("akv-1") && leases(real, &node, "akv-1").is_empty())
                .then_some(())
        },
    );
    eprintln!("akv-1's {ips:?} freed on {node}");
    let (node, ips) = awd["awd-1"].place();
    wait_until(
        "awd-1's addresses held (WhenDeleted)",
        Duration::from_secs(60),
        || (leases(real, &node, "awd-1") == each(&ips, "held")).then_some(()),
    );
    assert_eq!(
        records(real, "awd").get("awd-1"),
        Some(&(node.clone(), ips.clone())),
        "awd-1's record is kept (WhenDeleted)"
    );

    for set in ["akv", "awd"] {
        patch(real, set, r#"{"spec":{"reserveOrdinals":null}}"#);
    }
    let awd_back = wait_pods(real, "awd-1 back and awd-3 gone", "awd", &[0, 1, 2], |_| {
        true
    });
    eprintln!("awd with ordinal 1 back: {:?}", places(&awd_back));
    assert_eq!(
        places(&awd_back),
        places(awd),
        "awd-1 back on {node} with {ips:?}, the others where they were"
    );
    assert_ne!(awd_back["awd-1"].uid, awd["awd-1"].uid);
    wait_until(
        "awd-1's addresses active again",
        Duration::from_secs(60),
        || (leases(real, &node, "awd-1") == each(&ips, "active")).then_some(()),
    );
    let akv_back = wait_pods(real, "akv-1 back and akv-3 gone", "akv", &[0, 1, 2], |_| {
        true
    });
    eprintln!("akv with ordinal 1 back: {:?}", places(&akv_back));
    wait_recorded(real, "akv", &places(&akv_back));
    let akv3 = wait_until(
        "akv-3's record pruned (WhenScaled)",
        Duration::from_secs(60),
        || {
            let r = records(real, "akv");
            (!r.contains_key("akv-3")).then_some(r)
        },
    );
    eprintln!("akv's records: {akv3:?}");
    (akv_back, awd_back)
}

/// A template change (a label) with `partition: 2` rebuilds `akv-2` only (Kruise's partition
/// counts the pods left at the old revision); `partition: 0` rebuilds the other two. Every pod
/// is re-created (`podUpdatePolicy: ReCreate`) and keeps its node and addresses.
fn a_partitioned_rolling_update_keeps_every_place(real: &Real, before: &Pods) -> Pods {
    patch(
        real,
        "akv",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}},"template":{"metadata":{"labels":{"rollout":"1"}}}}}"#,
    );
    let updated = |p: &Pod| p.labels["rollout"] == "1";
    let part = wait_pods(
        real,
        "akv-2 updated with partition 2",
        "akv",
        &[0, 1, 2],
        |p| updated(&p["akv-2"]),
    );
    wait_until(
        "akv's status: 1 pod updated",
        Duration::from_secs(60),
        || {
            let s = real.kubectl.get(&[ASTS, "akv", "-n", NS])?;
            (s["status"]["observedGeneration"] == s["metadata"]["generation"]
                && s["status"]["updatedReplicas"] == 1)
                .then_some(())
        },
    );
    let now = wait_pods(
        real,
        "akv as partition 2 leaves it",
        "akv",
        &[0, 1, 2],
        |_| true,
    );
    for kept in ["akv-0", "akv-1"] {
        assert_eq!(
            now[kept].uid, before[kept].uid,
            "{kept} is below the partition"
        );
        assert!(!updated(&now[kept]), "{kept} is below the partition");
    }
    assert_ne!(part["akv-2"].uid, before["akv-2"].uid, "akv-2 re-created");
    assert_eq!(
        places(&now),
        places(before),
        "akv-2 keeps its node and addresses"
    );

    patch(
        real,
        "akv",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
    );
    let after = wait_pods(real, "every akv pod updated", "akv", &[0, 1, 2], |p| {
        p.values().all(updated)
    });
    for (pod, p) in &after {
        assert_ne!(p.uid, before[pod].uid, "{pod} was not re-created");
    }
    eprintln!("akv after the rolling update: {:?}", places(&after));
    assert_eq!(
        places(&after),
        places(before),
        "every ordinal keeps its node and addresses"
    );
    wait_recorded(real, "akv", &places(&after));
    after
}

/// The container's image changed with `podUpdatePolicy: InPlaceIfPossible` (to ipkeep's own
/// image, which the nodes have and which has `sleep`): Kruise updates each pod in place, the
/// kubelet restarts its container with the new image; the pods (UIDs), their sandboxes
/// (addresses) and their active leases stay, and ipkeep has nothing to do.
fn an_in_place_update_keeps_the_pods(real: &Real, before: &Pods) {
    let agent = real
        .kubectl
        .get(&["daemonset", "ipkeep-agent", "-n", "ipkeep-system"])
        .unwrap();
    let image = agent["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string();
    real.kubectl.run(&[
        "patch",
        ASTS,
        "akv",
        "-n",
        NS,
        "--type=json",
        "-p",
        &serde_json::json!([
            {"op": "add", "path": "/spec/updateStrategy/rollingUpdate/podUpdatePolicy",
             "value": "InPlaceIfPossible"},
            {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": image},
        ])
        .to_string(),
    ]);
    let after = wait_pods(
        real,
        &format!("every akv pod updated in place to {image}"),
        "akv",
        &[0, 1, 2],
        |p| {
            p.iter().all(|(pod, p)| {
                p.image_id != before[pod].image_id && p.container != before[pod].container
            })
        },
    );
    for (pod, p) in &after {
        let b = &before[pod];
        assert_eq!(p.uid, b.uid, "{pod} was re-created, not updated in place");
        assert!(
            p.restarts > b.restarts,
            "{pod}'s container restart not counted"
        );
        assert_eq!(
            leases(real, &p.node, pod),
            each(&p.ips, "active"),
            "{pod}'s leases"
        );
        let state = real.kubectl.get(&["pod", pod, "-n", NS]).unwrap();
        assert!(
            state["metadata"]["annotations"]["apps.kruise.io/inplace-update-state"].is_string(),
            "{pod} carries no apps.kruise.io/inplace-update-state: Kruise did not update it in place"
        );
    }
    assert_eq!(places(&after), places(before));
    eprintln!("akv updated in place to {image}: {:?}", places(&after));
}

/// `awd` (`WhenDeleted`) scaled 3 → 1 → 3: the records of `awd-1` and `awd-2` stay, their
/// addresses held, and each comes back to its node with its addresses.
fn awd_scaled_down_and_up_keeps_every_place(real: &Real, before: &Pods) {
    real.kubectl
        .run(&["scale", ASTS, "awd", "-n", NS, "--replicas=1"]);
    wait_pods(real, "awd scaled to 1", "awd", &[0], |_| true);
    for pod in ["awd-1", "awd-2"] {
        let (node, ips) = before[pod].place();
        wait_until(
            &format!("{pod}'s addresses held on {node}"),
            Duration::from_secs(60),
            || (leases(real, &node, pod) == each(&ips, "held")).then_some(()),
        );
    }
    wait_recorded(real, "awd", &places(before));
    real.kubectl
        .run(&["scale", ASTS, "awd", "-n", NS, "--replicas=3"]);
    let after = wait_pods(real, "awd scaled back to 3", "awd", &[0, 1, 2], |_| true);
    eprintln!("awd after 3 → 1 → 3: {:?}", places(&after));
    assert_eq!(
        places(&after),
        places(before),
        "every ordinal back on its node with its addresses"
    );
}
