//! PersistentPodStates the controller cannot decode (what kube-apiserver accepted before the
//! CRD's bounds: a status time `"soon"`, an int32 of 3000000000) stall none of its loops: the
//! valid PersistentPodState of the namespace is recorded, each undecodable one gets one
//! `Undecodable` Warning Event, the generate loop never applies over one that bears the name of
//! an auto-generating StatefulSet, and generates once it is deleted. On a real kube-apiserver.
#![allow(clippy::unwrap_used)]

mod support;

use ipkeep_tests::loose_crd;
use ipkeep_values::keys;
use kube::Resource;
use serde_json::{Value, json};
use support::*;

fn pps(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name},
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]}}
    })
}

#[tokio::test]
async fn objects_that_do_not_decode_stall_no_loop() {
    let Some(c) = cluster().await else { return };
    // `kv`: named like the StatefulSet that auto-generation will want its own for.
    loose_crd::with_loose_crd(&c.client, async || {
        for (name, status) in [
            (
                "x",
                json!({"podStates": {"x-0": {"nodeName": "n1", "recordedAt": "soon"}}}),
            ),
            ("kv", json!({"recordedPods": 3_000_000_000u64})),
        ] {
            loose_crd::write(&c.client, pps(&c.ns, name), Some(status)).await;
        }
    })
    .await;
    loose_crd::write(&c.client, pps(&c.ns, "db"), None).await;

    let ctl = start_controller(&c.client, None, "solo");
    let sts = create_sts(&c.client, "db", 1, 0, &annotations(&[])).await;
    run_pod(&c.client, &sts, 0, "n2", "10.1.0.20").await;
    let db = wait_pps(&c.client, "db", "db-0 recorded", |p| !records(p).is_empty()).await;
    assert_eq!(placements(&db), [("db-0".to_string(), "n2".to_string())]);

    for name in ["x", "kv"] {
        let reasons = eventually(&format!("an Undecodable Event on {name}"), || async {
            let reasons = event_reasons(&c.client, name).await;
            reasons
                .contains(&"Undecodable".to_string())
                .then_some(reasons)
        })
        .await;
        assert_eq!(
            reasons.iter().filter(|r| *r == "Undecodable").count(),
            1,
            "{name}: {reasons:?}"
        );
    }
    let note = events(&c.client)
        .await
        .into_iter()
        .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("kv"))
        .and_then(|e| e.note)
        .unwrap();
    assert!(
        note.contains("status.recordedPods: invalid value: integer `3000000000`, expected i32"),
        "{note}"
    );

    // A StatefulSet asking for a generated `kv`: the undecodable `kv` is not applied over.
    let kv = create_sts(
        &c.client,
        "kv",
        1,
        0,
        &annotations(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
        ]),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let dynamic = loose_crd::dynamic(&c.client, &c.ns);
    let stored = dynamic.get("kv").await.unwrap();
    assert!(
        stored.metadata.owner_references.is_none(),
        "applied over: {:?}",
        stored.metadata
    );
    assert_eq!(stored.data["status"]["recordedPods"], 3_000_000_000u64);

    // Deleted, it is generated for the StatefulSet.
    dynamic.delete("kv", &Default::default()).await.unwrap();
    let generated = wait_pps(&c.client, "kv", "kv generated for its StatefulSet", |_| {
        true
    })
    .await;
    assert_eq!(
        generated.meta().owner_references.as_ref().unwrap()[0].uid,
        kv.meta().uid.clone().unwrap()
    );
    ctl.stop().await.unwrap();
}
