//! OpenKruise's Advanced StatefulSets (`apps.kruise.io`) as targets, against a real
//! kube-apiserver serving them through Kruise's own CRD. The CRD is read at test time from
//! Kruise v1.9.0's source archive, named by `IPKEEP_KRUISE_SRC`; no kruise-manager runs, so the
//! test makes the pods as its StatefulSet controller would.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use ipkeep_api::PersistentPodState;
use ipkeep_api::kruise::AdvancedStatefulSet;
use ipkeep_placement::admission::PLAN_CONFIGMAP;
use ipkeep_values::keys;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::*;

/// The environment variable naming Kruise's source archive.
const KRUISE_SRC: &str = "IPKEEP_KRUISE_SRC";

/// Kruise's CRD of its Advanced StatefulSet, from the archive `IPKEEP_KRUISE_SRC` names.
fn kruise_statefulset_crd() -> String {
    let archive = std::env::var(KRUISE_SRC).unwrap_or_else(|_| {
        panic!(
            "set {KRUISE_SRC} to OpenKruise v1.9.0's source archive (for example, fetched from https://github.com/openkruise/kruise/archive/refs/tags/v1.9.0.tar.gz): this test loads Kruise's own CRD of its Advanced StatefulSet from it"
        )
    });
    let out = Command::new("tar")
        .args([
            "-xzOf",
            &archive,
            "--wildcards",
            "*/config/crd/bases/apps.kruise.io_statefulsets.yaml",
        ])
        .output()
        .expect("run tar");
    assert!(
        out.status.success() && !out.stdout.is_empty(),
        "{KRUISE_SRC}={archive} holds no config/crd/bases/apps.kruise.io_statefulsets.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("a YAML file")
}

/// Serves Advanced StatefulSets on the test binary's API server (before any controller starts,
/// so the controller finds them served at its start).
fn serve_advanced_statefulsets(c: &Cluster) {
    let kubectl = c.server.kubectl();
    kubectl.apply(&kruise_statefulset_crd());
    kubectl.run(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/statefulsets.apps.kruise.io",
    ]);
}

fn advanced_api(client: &Client) -> Api<DynamicObject> {
    Api::default_namespaced_with(
        client.clone(),
        &ApiResource::erase::<AdvancedStatefulSet>(&()),
    )
}

/// Creates Advanced StatefulSet `name` of `replicas` with `annotations`.
async fn create_asts(
    client: &Client,
    name: &str,
    replicas: i32,
    annotations: &BTreeMap<String, String>,
) -> DynamicObject {
    let asts: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "db", "image": "postgres:17"}]}}
        }
    }))
    .unwrap();
    advanced_api(client)
        .create(&PostParams::default(), &asts)
        .await
        .expect("create the Advanced StatefulSet")
}

async fn patch_asts(client: &Client, name: &str, patch: serde_json::Value) {
    advanced_api(client)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch the Advanced StatefulSet");
}

/// Runs pod `<asts>-<ordinal>` on `node` with `ip`, as Kruise's StatefulSet controller, the
/// scheduler and the kubelet would make it.
async fn run_asts_pod(client: &Client, asts: &DynamicObject, ordinal: u32, node: &str, ip: &str) {
    let name = format!("{}-{ordinal}", asts.name_any());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name,
                     "labels": {"app": asts.name_any(), "statefulset.kubernetes.io/pod-name": name,
                                "apps.kubernetes.io/pod-index": ordinal.to_string()},
                     "ownerReferences": [{"apiVersion": "apps.kruise.io/v1beta1",
                                          "kind": "StatefulSet", "name": asts.name_any(),
                                          "uid": asts.uid().unwrap(), "controller": true,
                                          "blockOwnerDeletion": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "db", "image": "postgres:17"}]}
    }))
    .unwrap();
    Api::<Pod>::default_namespaced(client.clone())
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the Pod");
    set_pod_ready(client, &name, ip, true).await;
}

fn names(pps: &PersistentPodState) -> Vec<String> {
    records(pps).into_keys().collect()
}

/// Auto-generation, recording and pruning by Kruise's ordinal rules, an `apps` StatefulSet of the
/// same name kept apart, and a reserved ordinal's record kept under `WhenDeleted`.
#[tokio::test]
async fn advanced_statefulsets_are_recorded_by_kruise_ordinal_rules() {
    let Some(c) = cluster().await else { return };
    serve_advanced_statefulsets(&c);
    let ctl = start_controller(&c.client, None, "solo");

    // An `apps` StatefulSet named db beside the Advanced one, with a PersistentPodState of its own.
    let native = create_sts(&c.client, "db", 1, 0, &Default::default()).await;
    let mine: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": {"name": "native-db"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]}}
    }))
    .unwrap();
    pps_api(&c.client)
        .create(&PostParams::default(), &mine)
        .await
        .unwrap();

    let asts = create_asts(
        &c.client,
        "db",
        3,
        &annotations(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
        ]),
    )
    .await;
    let generated = wait_pps(
        &c.client,
        "db",
        "generated for the Advanced StatefulSet",
        |_| true,
    )
    .await;
    let owner = &generated.owner_references()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        (
            "apps.kruise.io/v1beta1",
            asts.uid().unwrap().as_str(),
            Some(true)
        )
    );
    assert_eq!(
        generated.spec.target_ref.api_version,
        "apps.kruise.io/v1beta1"
    );

    for (ordinal, node) in [(0, "n1"), (1, "n2"), (2, "n3")] {
        run_asts_pod(
            &c.client,
            &asts,
            ordinal,
            node,
            &format!("10.7.0.{ordinal}"),
        )
        .await;
    }
    let pps = wait_pps(&c.client, "db", "three records", |p| records(p).len() == 3).await;
    assert_eq!(
        pps.status.as_ref().unwrap().target_uid.as_deref(),
        asts.uid().as_deref()
    );
    assert_eq!(records(&pps)["db-1"].node_name, "n2");
    let theirs = wait_pps(
        &c.client,
        "native-db",
        "the apps StatefulSet's state",
        |p| condition(p, "Ready").is_some_and(|r| r.0 == "True"),
    )
    .await;
    assert!(
        records(&theirs).is_empty(),
        "the Advanced StatefulSet's pods are not the apps StatefulSet's: {:?}",
        names(&theirs)
    );
    assert_eq!(
        theirs.status.as_ref().unwrap().target_uid.as_deref(),
        native.uid().as_deref()
    );

    // Reserving ordinal 1 condemns db-1 without a change of replicas; Kruise makes db-3. Under
    // WhenScaled (the generated default) db-1's record goes once its pod is gone.
    patch_asts(&c.client, "db", json!({"spec": {"reserveOrdinals": [1]}})).await;
    remove_pod(&c.client, "db-1").await;
    run_asts_pod(&c.client, &asts, 3, "n2", "10.7.0.3").await;
    let pps = wait_pps(&c.client, "db", "db-1 pruned, db-3 recorded", |p| {
        names(p) == ["db-0", "db-2", "db-3"]
    })
    .await;
    assert_eq!(records(&pps)["db-3"].pod_ips, ["10.7.0.3"]);

    // WhenDeleted, targeted as v1alpha1 (the same objects): a reserved ordinal keeps its record,
    // and un-reserved it is the same record the returning pod is pinned with.
    let kv = create_asts(&c.client, "kv", 2, &Default::default()).await;
    // It asks for ipkeep's hooks too, and carries the label that holds pods until their plan is
    // in place (as written before this version): the hooks stand aside, so nothing waits.
    let held: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "kv", "labels": {keys::ADMISSION_PENDING_LABEL: "true"}},
        "spec": {"targetRef": {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "StatefulSet", "name": "kv"},
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
                 "persistentPodStateRetentionPolicy": "WhenDeleted",
                 "lifecycle": {"preDelete": {"labelsHandler": {"example.com/drained": "true"}}}}
    }))
    .unwrap();
    pps_api(&c.client)
        .create(&PostParams::default(), &held)
        .await
        .unwrap();
    let standing_aside = wait_pps(&c.client, "kv", "hooks standing aside, nothing held", |p| {
        condition(p, "LifecycleHooks").is_some_and(|h| h.0 == "False")
            && !p.labels().contains_key(keys::ADMISSION_PENDING_LABEL)
    })
    .await;
    assert_eq!(
        condition(&standing_aside, "LifecycleHooks").unwrap().1,
        "AdvancedStatefulSetHasItsOwn"
    );
    run_asts_pod(&c.client, &kv, 0, "n1", "10.8.0.0").await;
    run_asts_pod(&c.client, &kv, 1, "n3", "10.8.0.1").await;
    let before = wait_pps(&c.client, "kv", "two records", |p| records(p).len() == 2).await;
    let kv1 = records(&before)["kv-1"].clone();
    // The admission policy's plan for kv is the Advanced StatefulSet's (db's is the apps
    // StatefulSet's: one plan per name, and the UID keeps the other's pods from it).
    let plans: Api<ConfigMap> = Api::default_namespaced(c.client.clone());
    eventually("kv's admission plan", || async {
        let data = plans.get_opt(PLAN_CONFIGMAP).await.unwrap()?.data?;
        (data.get("uid.kv") == kv.uid().as_ref()
            && data.get("pod.kv-1").is_some_and(|e| !e.starts_with('!'))
            && data.get("uid.db") == native.uid().as_ref())
        .then_some(())
    })
    .await;
    patch_asts(
        &c.client,
        "kv",
        json!({"spec": {"reserveOrdinals": ["1-1"]}}),
    )
    .await;
    remove_pod(&c.client, "kv-1").await;
    run_asts_pod(&c.client, &kv, 2, "n2", "10.8.0.2").await;
    let reserved = wait_pps(&c.client, "kv", "kv-2 recorded", |p| records(p).len() == 3).await;
    assert_eq!(records(&reserved)["kv-1"], kv1, "kept while reserved");
    patch_asts(&c.client, "kv", json!({"spec": {"reserveOrdinals": null}})).await;
    remove_pod(&c.client, "kv-2").await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let back = get_pps(&c.client, "kv").await.unwrap();
    assert_eq!(records(&back)["kv-1"], kv1, "the same record for kv-1");
    assert_eq!(names(&back), ["kv-0", "kv-1", "kv-2"], "nothing pruned");

    ctl.stop().await.unwrap();
}

/// A `reserveOrdinals` entry that does not parse (Kruise's webhook refuses one; written past it,
/// Kruise's controller reserves nothing at all): the PersistentPodState records on, as Kruise
/// counts, and its condition `ReserveOrdinals` says which entry and what to write instead; fixed,
/// the condition goes.
#[tokio::test]
async fn a_malformed_reserve_ordinal_is_reported_on_the_persistent_pod_state() {
    let Some(c) = cluster().await else { return };
    serve_advanced_statefulsets(&c);
    let ctl = start_controller(&c.client, None, "solo");
    let asts = create_asts(
        &c.client,
        "db",
        2,
        &annotations(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
        ]),
    )
    .await;
    patch_asts(
        &c.client,
        "db",
        json!({"spec": {"reserveOrdinals": [1, "5-2"]}}),
    )
    .await;
    // Nothing reserved, as Kruise reads it: db-0 and db-1 are both wanted and recorded.
    run_asts_pod(&c.client, &asts, 0, "n1", "10.9.0.0").await;
    run_asts_pod(&c.client, &asts, 1, "n2", "10.9.0.1").await;
    let pps = wait_pps(&c.client, "db", "ReserveOrdinals False", |p| {
        condition(p, "ReserveOrdinals").is_some_and(|r| r.0 == "False") && records(p).len() == 2
    })
    .await;
    let (_, reason, message) = condition(&pps, "ReserveOrdinals").unwrap();
    assert_eq!(reason, "InvalidReserveOrdinal");
    for said in [
        "reserveOrdinals[1]",
        "\"5-2\"",
        "reserves no ordinal",
        "\"a-b\"",
    ] {
        assert!(message.contains(said), "{said:?} not in: {message}");
    }
    assert_eq!(
        condition(&pps, "Ready").unwrap().0,
        "True",
        "recording goes on"
    );
    patch_asts(
        &c.client,
        "db",
        json!({"spec": {"reserveOrdinals": ["x-y"]}}),
    )
    .await;
    let pps = wait_pps(&c.client, "db", "the other entry named", |p| {
        condition(p, "ReserveOrdinals").is_some_and(|r| r.2.contains("reserveOrdinals[0]"))
    })
    .await;
    let message = condition(&pps, "ReserveOrdinals").unwrap().2;
    assert!(message.contains("\"x-y\""), "{message}");
    patch_asts(
        &c.client,
        "db",
        json!({"spec": {"reserveOrdinals": ["2-5"]}}),
    )
    .await;
    wait_pps(&c.client, "db", "the condition gone once fixed", |p| {
        condition(p, "ReserveOrdinals").is_none()
    })
    .await;
    ctl.stop().await.unwrap();
}
