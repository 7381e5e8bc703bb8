//! PersistentPodStates that kube-apiserver serves and ipkeep's types refuse (a status time
//! `"soon"`, an int32 `recordedPods` of 3000000000, both accepted by the CRD before its bounds,
//! and a record whose `nodeName` is a number, as a looser CRD would have let through) stall
//! neither the node agent's view nor the scheduler extension's cache: both sync, decide for the
//! valid PersistentPodState, and know which one they could not read. On a real kube-apiserver.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ipkeep_agent::cluster::{self, Cluster, Readiness};
use ipkeep_agent::management::ClusterApi;
use ipkeep_cni::management::{ApiView, Management, SandboxPod};
use ipkeep_placement::pin::{self, Decision, PinOutcome};
use ipkeep_scheduler_ext::cache::{self, Caches};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// The namespace of the objects ipkeep cannot read (test namespaces are `t-<n>-…`).
const BAD: &str = "tenant-bad";
const NATIVE: ipkeep_api::statefulset::Workload = ipkeep_api::statefulset::Workload::Native;

fn pps(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name},
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
                 "ipRetention": "2h"}
    })
}

/// The valid `db` of `namespace` (recording `db-0` on n1), and in [`BAD`]: `x` (a record's
/// `recordedAt` is "soon"), `y` (`recordedPods` is 3000000000) and `z` (a record's `nodeName`
/// is 7).
async fn write_objects(client: &kube::Client, namespace: &str) {
    let good_status = json!({"targetUID": "sts-uid", "recordedPods": 1, "podStates": {"db-0": {
        "nodeName": "n1", "nodeTopologyLabels": {"kubernetes.io/hostname": "n1"},
        "recordedAt": "2026-11-28T10:00:00Z"}}});
    ipkeep_tests::loose_crd::write(client, pps(namespace, "db"), Some(good_status)).await;
    ipkeep_tests::loose_crd::with_loose_crd(client, async || {
        for (name, status) in [
            (
                "x",
                json!({"recordedPods": 1, "podStates": {"x-0": {"nodeName": "n9", "recordedAt": "soon"}}}),
            ),
            ("y", json!({"recordedPods": 3_000_000_000u64})),
            ("z", json!({"podStates": {"z-0": {"nodeName": 7}}})),
        ] {
            ipkeep_tests::loose_crd::write(client, pps(BAD, name), Some(status)).await;
        }
    })
    .await;
}

async fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not within 30 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod(namespace: &str, name: &str, sts: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts,
                             "uid": "sts-uid", "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_that_do_not_decode_stall_no_cache() {
    let Some(ns) =
        ipkeep_tests::apiserver::namespace("objects_that_do_not_decode_stall_no_cache", "ok").await
    else {
        return;
    };
    let client = ns.client.clone();
    ns.create_namespace(BAD, json!({})).await;
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    write_objects(&client, &ns.name).await;

    // The node agent: its view becomes usable, decides for the valid state, and knows the
    // namespace whose state it cannot read (only `z`: it reads neither times nor counts).
    let (agent, writers) = Cluster::new("n1", Default::default());
    tokio::spawn(cluster::watch(client.clone(), agent.clone(), writers));
    wait("the node agent's view is usable", || {
        (agent.readiness() == Readiness::Ready).then_some(())
    })
    .await;
    let view = agent.view().unwrap();
    let recorded = &view.pps[&(ns.name.clone(), "db".to_string())].records;
    assert_eq!(recorded.get("db-0").map(String::as_str), Some("n1"));
    for name in ["x", "y"] {
        assert!(view.pps.contains_key(&(BAD.to_string(), name.to_string())));
    }
    assert_eq!(view.undecodable, [BAD.to_string()].into());
    assert_eq!(agent.undecodable_in(BAD), ["z"]);
    // A DEL of a pod the API no longer shows: judged by its name's record.
    let gone = |namespace, name| SandboxPod {
        namespace,
        name,
        uid: None,
        adding: false,
        annotations: None,
    };
    let said = ClusterApi(Some(&agent)).management(&gone(&ns.name, "db-5"));
    assert!(
        matches!(&said, Management::Managed { persistent_pod_state, .. } if persistent_pod_state.name == "db"),
        "{said:?}"
    );
    let said = ClusterApi(Some(&agent)).management(&gone(BAD, "x-0"));
    assert!(
        matches!(&said, Management::Unknown(u) if u.why.contains("tenant-bad/z")),
        "{said:?}"
    );

    // The scheduler extension: its caches sync and it pins the valid state's pod.
    let (caches, writers) = Caches::new(Default::default());
    tokio::spawn(cache::watch(client.clone(), writers));
    tokio::time::timeout(Duration::from_secs(30), caches.wait_until_ready())
        .await
        .expect("the scheduler extension's caches did not sync within 30 s");
    let db = caches.pps_for(&ns.name, NATIVE, "db");
    let decision = pin::decide(&pod(&ns.name, "db-0", "db"), &ns.name, db.as_deref());
    let Decision::Manage(managed) = decision else {
        panic!("db-0 is not managed: {decision:?}")
    };
    assert!(
        matches!(&managed.pin, PinOutcome::Pinned(p) if p.node == "n1"),
        "{managed:?}"
    );
    assert!(
        caches.pps_for(BAD, NATIVE, "x").is_some() && caches.pps_for(BAD, NATIVE, "y").is_some()
    );
    assert!(caches.undecodable(BAD, "z") && caches.pps_for(BAD, NATIVE, "z").is_none());
    // A pod of `z`'s StatefulSet passes unpinned, and its creator is told why.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u1", "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "operation": "CREATE", "namespace": BAD, "object": pod(BAD, "z-0", "z")}});
    let reviewed =
        ipkeep_scheduler_ext::webhook::review(review.to_string().as_bytes(), &caches).unwrap();
    let warnings = &reviewed.review.response.warnings;
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("PersistentPodState z cannot be decoded")),
        "{warnings:?}"
    );
    assert!(reviewed.review.response.patch.is_none());
}

/// The start-up check that the CRD is installed lists one PersistentPodState: the first one
/// may be one that does not decode, and the check still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preflight_check_reads_no_spec_or_status() {
    let Some(ns) =
        ipkeep_tests::apiserver::namespace("the_preflight_check_reads_no_spec_or_status", "pre")
            .await
    else {
        return;
    };
    // Listed first: namespaces sort before `t-…`.
    ns.create_namespace("a-first", json!({})).await;
    ipkeep_tests::loose_crd::with_loose_crd(&ns.client, async || {
        let status = json!({"recordedPods": 3_000_000_000u64});
        ipkeep_tests::loose_crd::write(&ns.client, pps("a-first", "a"), Some(status)).await;
    })
    .await;
    ipkeep_daemon::preflight::check_crd(&ns.client)
        .await
        .expect("the preflight check");
}
