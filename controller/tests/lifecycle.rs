//! The preDelete hold on a real kube-apiserver, with Kubernetes' own RBAC: the controller runs
//! in-process, and the webhook's deletion review answers from the caches `ipkeep-scheduler-ext`
//! keeps (fed by the same API server). No hold outlives `timeoutSeconds`, whatever the pod's
//! tenant (Kubernetes' `edit` role) writes on the pod meanwhile (docs/lifecycle.md, "Escape
//! hatches").
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ipkeep_scheduler_ext::cache::{self, Caches};
use ipkeep_scheduler_ext::deletion;
use ipkeep_scheduler_ext::review::Outcome;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use support::*;

/// The hook's `timeoutSeconds`: short, so the test waits for it.
const TIMEOUT: u64 = 3;
const REGISTERED: &str = "registry.example.com/registered";
const STATE: &str = "ipkeep.dev/lifecycle-state";
const SINCE: &str = "ipkeep.dev/lifecycle-since";
const HELD: &str = "ipkeep.dev/lifecycle-held";
/// 2500-01-01T00:00:00Z.
const YEAR_2500: &str = "16725225600";

/// A client that is ServiceAccount `tenant` of the test's namespace, bound there to what
/// Kubernetes' default ClusterRole `edit` is made of, what a namespace's users usually get:
/// `system:aggregate-to-edit` and `system:aggregate-to-view` (`edit` itself only names them;
/// kube-controller-manager, not running here, fills it in from them).
async fn tenant(c: &Cluster) -> Client {
    let accounts: Api<ServiceAccount> = Api::default_namespaced(c.client.clone());
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tenant"}})).unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::default_namespaced(c.client.clone());
    for role in ["edit", "view"] {
        let binding = json!({
            "metadata": {"name": format!("tenant-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": format!("system:aggregate-to-{role}")},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": c.ns}]
        });
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(binding).unwrap(),
            )
            .await
            .unwrap();
    }
    let mut config = c.server.config(&c.ns).await;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:tenant", c.ns));
    Client::try_from(config).unwrap()
}

/// Pod `name` of `sts` on n1, Running, carrying the hook's label, in lifecycle state `state`,
/// with `annotations`.
async fn hooked_pod(
    client: &Client,
    sts: &StatefulSet,
    name: &str,
    state: &str,
    annotations: Value,
) {
    let pod = json!({
        "metadata": {"name": name,
            "labels": {"app": "db", "statefulset.kubernetes.io/pod-name": name, REGISTERED: "true", STATE: state},
            "annotations": annotations,
            "ownerReferences": [sts.controller_owner_ref(&()).unwrap()]},
        "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "db", "image": "postgres:17"}]}
    });
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    set_pod_ready(client, name, "10.0.0.1", true).await;
}

fn eviction(ns: &str, name: &str) -> String {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "e", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "eviction", "name": name, "namespace": ns, "operation": "CREATE",
        "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}}})
    .to_string()
}

fn deletion_of(pod: &Pod) -> String {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "d", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod.name_any(), "namespace": pod.namespace(), "operation": "DELETE",
        "oldObject": pod, "options": {}}})
    .to_string()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The webhook's answer to `body` now.
fn answer(body: &str, caches: &Caches) -> Outcome {
    deletion::review(body.as_bytes(), caches).unwrap().outcome
}

/// db-0 is held by a drain, db-1 by an older release (its `lifecycle-since` already in the year
/// 2500); the tenant keeps writing the year 2500 and `u64::MAX` into both annotations and sets
/// db-0's state back to `Normal`, in a loop. Both evictions pass `timeoutSeconds` after the
/// hold's start (the controller's first sight of it), not before, and were held until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hold_outlives_its_timeout_whatever_the_tenant_writes() {
    let Some(c) = cluster().await else { return };
    let tenant = tenant(&c).await;
    let pps: ipkeep_api::PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": {"name": "db"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
            "lifecycle": {"preDelete": {"labelsHandler": {REGISTERED: "true"}, "timeoutSeconds": TIMEOUT}}}
    }))
    .unwrap();
    pps_api(&c.client)
        .create(&PostParams::default(), &pps)
        .await
        .unwrap();
    let sts = create_sts(&c.client, "db", 2, 0, &annotations(&[])).await;
    // The StatefulSet controller's status: it has seen this spec, both pods are in range.
    Api::<StatefulSet>::default_namespaced(c.client.clone())
        .patch_status(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 1, "replicas": 2}})),
        )
        .await
        .unwrap();
    hooked_pod(&c.client, &sts, "db-0", "Normal", json!({})).await;
    hooked_pod(
        &c.client,
        &sts,
        "db-1",
        "PreparingDelete",
        json!({HELD: "drain", SINCE: YEAR_2500}),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(c.client.clone());

    // The tenant may patch its pods, not their status: Kubernetes' `edit` has no `pods/status`.
    let denied = Api::<Pod>::default_namespaced(tenant.clone())
        .patch_status(
            "db-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": HELD, "status": "True", "lastTransitionTime": "2500-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.code == 403),
        "the tenant wrote pods/status: {denied}"
    );

    // The webhook's caches, filled from the API server.
    let (caches, writers) = Caches::new(Default::default());
    let watching = tokio::spawn(cache::watch(c.client.clone(), writers));
    caches.wait_until_ready().await;

    // n1 is cordoned (a drain), then the controller starts: its first sight of both holds.
    Api::<Node>::all(c.client.clone())
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let (started, started_unix) = (Instant::now(), unix_now());
    let ctl = start_controller(&c.client, None, "solo");
    eventually("db-0 held for the drain", || async {
        let p = pods.get("db-0").await.unwrap();
        (p.labels().get(STATE).map(String::as_str) == Some("PreparingDelete")
            && p.annotations().get(HELD).map(String::as_str) == Some("drain"))
        .then_some(())
    })
    .await;

    // The tenant, in a loop: both annotations to the year 2500 or u64::MAX, db-0 back to Normal.
    let stop = Arc::new(AtomicBool::new(false));
    let tampering = tokio::spawn({
        let (stop, pods) = (stop.clone(), Api::<Pod>::default_namespaced(tenant.clone()));
        async move {
            let mut writes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let since = if writes.is_multiple_of(2) {
                    YEAR_2500.to_string()
                } else {
                    u64::MAX.to_string()
                };
                for name in ["db-0", "db-1"] {
                    let mut patch = json!({"metadata": {"annotations": {SINCE: since}}});
                    if name == "db-0" && writes.is_multiple_of(3) {
                        patch["metadata"]["labels"] = json!({STATE: "Normal"});
                    }
                    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap();
                }
                writes += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            writes
        }
    });

    // Both are held first (the tampering lets neither go), then pass. Polled every 100 ms for
    // up to 15 s past the timeout.
    let mut held = [false; 2];
    let mut passed = [None; 2];
    let give_up = started + Duration::from_secs(TIMEOUT + 15);
    while passed.iter().any(Option::is_none) && Instant::now() < give_up {
        for (i, name) in ["db-0", "db-1"].into_iter().enumerate() {
            if passed[i].is_some() {
                continue;
            }
            match answer(&eviction(&c.ns, name), &caches) {
                Outcome::Held => held[i] = true,
                Outcome::Escaped => passed[i] = Some(unix_now()),
                other => panic!("{name}: the eviction was answered {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let writes = tampering.await.unwrap();
    for (i, name) in ["db-0", "db-1"].into_iter().enumerate() {
        let pod = pods.get(name).await.unwrap();
        let at = passed[i].unwrap_or_else(|| {
            panic!(
                "{name}: the eviction was still held {:.1} s after the controller started (timeoutSeconds {TIMEOUT}), after {writes} writes of the tenant; the pod: {}",
                started.elapsed().as_secs_f64(),
                serde_json::to_string(&pod.metadata.annotations).unwrap()
            )
        });
        assert!(held[i], "{name}: never held");
        // The hold's start as the controller recorded it: its first sight of the hold, after it
        // started (db-1's older release's hold has no start ipkeep can trust).
        let start = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == HELD && c.status == "True"))
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.as_second() as f64)
            .unwrap_or_else(|| panic!("{name}: no hold on record: {:?}", pod.status));
        assert!(
            (started_unix.floor()..=started_unix + 5.0).contains(&start),
            "{name}: held from {start}, the controller started at {started_unix}"
        );
        // Not before the timeout, and at most a second after it (whole seconds, polling).
        let waited = at - start;
        eprintln!(
            "{name}: held from {start} ({:.1} s after the controller started); the eviction passed {waited:.2} s later",
            start - started_unix
        );
        assert!(
            (TIMEOUT as f64..=TIMEOUT as f64 + 1.0).contains(&waited),
            "{name}: the eviction passed {waited:.1} s after the hold's start; timeoutSeconds {TIMEOUT}"
        );
        // The pod's DELETE carries the pod, whose status has the start: it passes too.
        assert_eq!(
            answer(&deletion_of(&pod), &caches),
            Outcome::Escaped,
            "{name}: the deletion is still held"
        );
    }
    assert!(writes >= 5, "the tenant wrote {writes} times");
    ctl.stop().await.unwrap();
    watching.abort();
}
