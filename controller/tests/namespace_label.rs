//! Auto-generation for every StatefulSet of a namespace labelled
//! `ipkeep.dev/auto-generate-persistent-pod-state: "true"`, against a real kube-apiserver
//! (the real control plane's step is in tests/tests/cluster/namespaces.rs).
#![allow(clippy::unwrap_used)]

mod support;

use ipkeep_api::PersistentPodState;
use ipkeep_values::keys;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::*;

async fn label_namespace(client: &kube::Client, value: Option<&str>) {
    let patch = json!({"metadata": {"labels": {keys::AUTO_GENERATE: value}}});
    Api::<Namespace>::all(client.clone())
        .patch(
            client.default_namespace(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// The namespace's label generates for StatefulSets without the annotation, pinned by hostname;
/// annotated `"false"` opts out, annotated `"true"` keeps its PPS without the label; a PPS
/// written for a StatefulSet later takes over from the one the label generated.
#[tokio::test]
async fn a_labelled_namespace_generates_for_statefulsets_without_their_own_say() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    label_namespace(&c.client, Some("true")).await;
    create_sts(&c.client, "plain", 1, 0, &annotations(&[])).await;
    create_sts(
        &c.client,
        "optout",
        1,
        0,
        &annotations(&[(keys::AUTO_GENERATE, "false")]),
    )
    .await;
    create_sts(
        &c.client,
        "annotated",
        1,
        0,
        &annotations(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::PREFERRED_TOPOLOGY, "topology.kubernetes.io/zone"),
        ]),
    )
    .await;
    let plain = wait_pps(&c.client, "plain", "generated for the label", |_| true).await;
    assert_eq!(
        plain
            .spec
            .required_persistent_topology
            .as_ref()
            .unwrap()
            .node_topology_keys,
        vec!["kubernetes.io/hostname"]
    );
    wait_pps(
        &c.client,
        "annotated",
        "generated for the annotation",
        |_| true,
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(get_pps(&c.client, "optout").await.is_none(), "opted out");

    // A PPS written for plain, under another name: the generated one goes, without a Warning.
    let mine: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "plain-mine"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "plain"},
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["topology.kubernetes.io/zone"]}}
    }))
    .unwrap();
    pps_api(&c.client)
        .create(&PostParams::default(), &mine)
        .await
        .unwrap();
    eventually("the generated PPS gives way to the written one", || async {
        get_pps(&c.client, "plain").await.is_none().then_some(())
    })
    .await;
    let reasons = event_reasons(&c.client, "plain").await;
    assert!(
        reasons.iter().any(|r| r == "PersistentPodStateDeleted"),
        "{reasons:?}"
    );
    assert!(
        !reasons.iter().any(|r| r == "PersistentPodStateNotOwned"),
        "{reasons:?}"
    );
    pps_api(&c.client)
        .delete("plain-mine", &DeleteParams::default())
        .await
        .unwrap();
    wait_pps(
        &c.client,
        "plain",
        "generated again once the written one is gone",
        |_| true,
    )
    .await;

    label_namespace(&c.client, None).await;
    eventually("the label's PPS deleted with the label", || async {
        get_pps(&c.client, "plain").await.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        get_pps(&c.client, "annotated").await.is_some(),
        "the annotation keeps its PPS without the label"
    );
    ctl.stop().await.unwrap();
}
