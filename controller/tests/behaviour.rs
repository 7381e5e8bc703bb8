//! The controller's behaviours against a real kube-apiserver: auto-generation,
//! recording, rebuilds, pruning, re-created StatefulSets, node loss, bad input.
#![allow(clippy::unwrap_used)]

mod support;

use ipkeep_api::PersistentPodState;
use ipkeep_values::keys;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use support::*;

fn auto(required: &str, preferred: &str) -> std::collections::BTreeMap<String, String> {
    annotations(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, required),
        (keys::PREFERRED_TOPOLOGY, preferred),
    ])
}

#[tokio::test]
async fn generates_records_follows_rebuilds_and_annotation_changes() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    let sts = create_sts(
        &c.client,
        "pg",
        2,
        0,
        &auto(" kubernetes.io/hostname ", "topology.kubernetes.io/zone"),
    )
    .await;

    let pps = wait_pps(&c.client, "pg", "generated PPS", |_| true).await;
    let owner = &pps.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("StatefulSet", sts.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(pps.spec.target_ref.name, "pg");
    assert_eq!(
        pps.spec
            .required_persistent_topology
            .as_ref()
            .unwrap()
            .node_topology_keys,
        vec!["kubernetes.io/hostname"]
    );
    assert_eq!(pps.spec.preferred_persistent_topology[0].weight, 100);

    run_pod(&c.client, &sts, 0, "n1", "10.1.0.10").await;
    run_pod(&c.client, &sts, 1, "n3", "10.1.0.11").await;
    let pps = wait_pps(&c.client, "pg", "both pods recorded", |p| {
        records(p).len() == 2
    })
    .await;
    let r0 = &records(&pps)["pg-0"];
    assert_eq!(r0.node_name, "n1");
    assert_eq!(r0.pod_ips, vec!["10.1.0.10"]);
    assert_eq!(
        r0.node_topology_labels
            .get("kubernetes.io/hostname")
            .map(String::as_str),
        Some("n1")
    );
    assert_eq!(
        r0.node_topology_labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("a")
    );
    assert!(r0.recorded_at.is_some());
    let status = pps.status.as_ref().unwrap();
    assert_eq!(status.recorded_pods, 2);
    assert_eq!(status.target_uid.as_deref(), sts.uid().as_deref());
    assert_eq!(condition(&pps, "Ready").unwrap().0, "True");

    // Rebuild pg-0: Terminating, then gone, then Ready again on another node.
    terminate_pod(&c.client, "pg-0").await;
    remove_pod(&c.client, "pg-0").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let pps = get_pps(&c.client, "pg").await.unwrap();
    assert_eq!(
        records(&pps)["pg-0"].node_name,
        "n1",
        "a rebuilding pod keeps its record"
    );
    run_pod(&c.client, &sts, 0, "n2", "10.1.0.20").await;
    let pps = wait_pps(&c.client, "pg", "pin moved to n2", |p| {
        records(p)["pg-0"].node_name == "n2"
    })
    .await;
    assert_eq!(records(&pps)["pg-0"].pod_ips, vec!["10.1.0.20"]);
    eventually("PinMoved event", || async {
        event_reasons(&c.client, "pg")
            .await
            .iter()
            .any(|r| r == "PinMoved")
            .then_some(())
    })
    .await;

    // Annotation change updates the generated spec.
    patch_sts(&c.client, "pg", json!({"metadata": {"annotations": {keys::REQUIRED_TOPOLOGY: "topology.kubernetes.io/zone", keys::IP_RETENTION: "2h"}}})).await;
    let pps = wait_pps(&c.client, "pg", "spec follows the annotations", |p| {
        p.spec.ip_retention == "2h"
    })
    .await;
    assert_eq!(
        pps.spec
            .required_persistent_topology
            .unwrap()
            .node_topology_keys,
        vec!["topology.kubernetes.io/zone"]
    );

    // Removing auto-generation deletes the PPS we own.
    patch_sts(
        &c.client,
        "pg",
        json!({"metadata": {"annotations": {keys::AUTO_GENERATE: null}}}),
    )
    .await;
    eventually("generated PPS deleted", || async {
        get_pps(&c.client, "pg").await.is_none().then_some(())
    })
    .await;
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn hand_written_pps_is_neither_overwritten_nor_deleted() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    let mine: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "kafka"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "kafka"},
                 "preferredPersistentTopology": [{"weight": 40, "preference": {"nodeTopologyKeys": ["kubernetes.io/hostname"]}}]}
    }))
    .unwrap();
    pps_api(&c.client)
        .create(&PostParams::default(), &mine)
        .await
        .unwrap();
    let sts = create_sts(
        &c.client,
        "kafka",
        1,
        0,
        &auto("kubernetes.io/hostname", ""),
    )
    .await;
    run_pod(&c.client, &sts, 0, "n2", "10.2.0.1").await;
    let pps = wait_pps(
        &c.client,
        "kafka",
        "recorded by the hand-written PPS",
        |p| records(p).len() == 1,
    )
    .await;
    assert_eq!(
        pps.spec.preferred_persistent_topology[0].weight, 40,
        "not overwritten"
    );
    assert!(pps.owner_references().is_empty());
    eventually("warning on the StatefulSet", || async {
        event_reasons(&c.client, "kafka")
            .await
            .iter()
            .any(|r| r == "PersistentPodStateNotOwned")
            .then_some(())
    })
    .await;
    patch_sts(
        &c.client,
        "kafka",
        json!({"metadata": {"annotations": {keys::AUTO_GENERATE: "false"}}}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        get_pps(&c.client, "kafka").await.is_some(),
        "a PPS we do not own is never deleted"
    );
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn scale_down_prunes_out_of_range_records_and_honours_ordinals_start() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    let sts = create_sts(&c.client, "zk", 3, 5, &auto("kubernetes.io/hostname", "")).await;
    for (i, node) in [(5, "n1"), (6, "n2"), (7, "n3")] {
        run_pod(&c.client, &sts, i, node, &format!("10.3.0.{i}")).await;
    }
    wait_pps(&c.client, "zk", "three records", |p| records(p).len() == 3).await;

    // Scale to 1: zk-6 is gone at once, zk-7 is still terminating.
    patch_sts(&c.client, "zk", json!({"spec": {"replicas": 1}})).await;
    remove_pod(&c.client, "zk-6").await;
    terminate_pod(&c.client, "zk-7").await;
    let pps = wait_pps(&c.client, "zk", "zk-6 pruned", |p| {
        !records(p).contains_key("zk-6")
    })
    .await;
    assert!(
        records(&pps).contains_key("zk-7"),
        "its pod still exists (terminating)"
    );
    assert!(records(&pps).contains_key("zk-5"));
    remove_pod(&c.client, "zk-7").await;
    let pps = wait_pps(&c.client, "zk", "zk-7 pruned", |p| records(p).len() == 1).await;
    assert_eq!(
        placements(&pps),
        vec![("zk-5".to_string(), "n1".to_string())]
    );
    eventually("RecordsPruned event", || async {
        event_reasons(&c.client, "zk")
            .await
            .iter()
            .any(|r| r == "RecordsPruned")
            .then_some(())
    })
    .await;

    // Rebuild of the in-range pod while scaled down: never pruned.
    remove_pod(&c.client, "zk-5").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(records(&get_pps(&c.client, "zk").await.unwrap()).len(), 1);

    // Scale up again: the new pod is recorded.
    patch_sts(&c.client, "zk", json!({"spec": {"replicas": 2}})).await;
    run_pod(&c.client, &sts, 6, "n3", "10.3.0.66").await;
    wait_pps(&c.client, "zk", "zk-6 recorded again", |p| {
        records(p).get("zk-6").is_some_and(|r| r.node_name == "n3")
    })
    .await;
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn when_deleted_keeps_records_through_scale_to_zero() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    let pps: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": {"name": "mq"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "mq"},
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
                 "persistentPodStateRetentionPolicy": "WhenDeleted"}
    }))
    .unwrap();
    pps_api(&c.client)
        .create(&PostParams::default(), &pps)
        .await
        .unwrap();
    let sts = create_sts(&c.client, "mq", 2, 0, &Default::default()).await;
    run_pod(&c.client, &sts, 0, "n1", "10.4.0.1").await;
    run_pod(&c.client, &sts, 1, "n2", "10.4.0.2").await;
    wait_pps(&c.client, "mq", "two records", |p| records(p).len() == 2).await;
    patch_sts(&c.client, "mq", json!({"spec": {"replicas": 0}})).await;
    remove_pod(&c.client, "mq-0").await;
    remove_pod(&c.client, "mq-1").await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        records(&get_pps(&c.client, "mq").await.unwrap()).len(),
        2,
        "WhenDeleted keeps them"
    );

    // The StatefulSet is deleted and re-created with the same name: nothing leaks.
    Api::<StatefulSet>::default_namespaced(c.client.clone())
        .delete("mq", &DeleteParams::default())
        .await
        .unwrap();
    let pps = wait_pps(
        &c.client,
        "mq",
        "records cleared with the StatefulSet",
        |p| records(p).is_empty(),
    )
    .await;
    assert_eq!(condition(&pps, "Ready").unwrap().1, "TargetNotFound");
    let sts2 = create_sts(&c.client, "mq", 1, 0, &Default::default()).await;
    run_pod(&c.client, &sts2, 0, "n3", "10.4.0.9").await;
    let pps = wait_pps(&c.client, "mq", "new StatefulSet recorded", |p| {
        records(p).len() == 1
    })
    .await;
    assert_eq!(
        placements(&pps),
        vec![("mq-0".to_string(), "n3".to_string())]
    );
    assert_eq!(pps.status.unwrap().target_uid, sts2.uid());
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn generated_pps_of_a_deleted_statefulset_does_not_leak_into_its_successor() {
    // The generated PPS goes with its StatefulSet by owner reference: the garbage collector.
    let Some(c) = cluster_with_gc().await else {
        return;
    };
    let ctl = start_controller(&c.client, None, "solo");
    let sts = create_sts(&c.client, "etcd", 1, 0, &auto("kubernetes.io/hostname", "")).await;
    run_pod(&c.client, &sts, 0, "n1", "10.5.0.1").await;
    let old = wait_pps(&c.client, "etcd", "recorded", |p| records(p).len() == 1).await;
    Api::<StatefulSet>::default_namespaced(c.client.clone())
        .delete("etcd", &DeleteParams::default())
        .await
        .unwrap();
    remove_pod(&c.client, "etcd-0").await;
    let sts2 = create_sts(&c.client, "etcd", 1, 0, &auto("kubernetes.io/hostname", "")).await;
    let new = wait_pps(
        &c.client,
        "etcd",
        "regenerated for the new StatefulSet",
        |p| p.uid() != old.uid(),
    )
    .await;
    assert!(records(&new).is_empty(), "{:?}", records(&new));
    assert_eq!(new.owner_references()[0].uid, sts2.uid().unwrap());
    run_pod(&c.client, &sts2, 0, "n2", "10.5.0.2").await;
    wait_pps(&c.client, "etcd", "recorded on n2", |p| {
        placements(p) == vec![("etcd-0".to_string(), "n2".to_string())]
    })
    .await;
    ctl.stop().await.unwrap();
}

async fn hand_pps(client: &kube::Client, name: &str, node_loss: serde_json::Value) {
    let pps: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": {"name": name},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name},
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
                 "nodeLossPolicy": node_loss}
    }))
    .unwrap();
    pps_api(client)
        .create(&PostParams::default(), &pps)
        .await
        .unwrap();
}

#[tokio::test]
async fn node_loss_falls_back_after_the_grace_period_or_waits() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    hand_pps(
        &c.client,
        "fb",
        json!({"action": "FallbackToPreferred", "after": "1s"}),
    )
    .await;
    hand_pps(&c.client, "wt", json!({"action": "Wait", "after": "1s"})).await;
    let fb = create_sts(&c.client, "fb", 1, 0, &Default::default()).await;
    let wt = create_sts(&c.client, "wt", 1, 0, &Default::default()).await;
    run_pod(&c.client, &fb, 0, "n3", "10.6.0.1").await;
    run_pod(&c.client, &wt, 0, "n3", "10.6.0.2").await;
    wait_pps(&c.client, "fb", "recorded", |p| records(p).len() == 1).await;
    wait_pps(&c.client, "wt", "recorded", |p| records(p).len() == 1).await;

    // n3 dies: NotReady, its pods are evicted (deleted); then the Node object is deleted.
    set_node_ready(&c.client, "n3", false).await;
    remove_pod(&c.client, "fb-0").await;
    remove_pod(&c.client, "wt-0").await;
    let pps = wait_pps(&c.client, "fb", "fallback to preferred", |p| {
        records(p)["fb-0"].preferred_only
    })
    .await;
    let (status, reason, message) = condition(&pps, "NodeLost").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "FellBackToPreferred"),
        "{message}"
    );
    assert!(message.contains("fb-0: node n3 is NotReady"), "{message}");
    let pps = wait_pps(&c.client, "wt", "waiting condition", |p| {
        condition(p, "NodeLost").is_some_and(|c| c.1 == "WaitingForNode")
    })
    .await;
    assert!(!records(&pps)["wt-0"].preferred_only, "Wait keeps the pin");
    assert!(
        condition(&pps, "NodeLost")
            .unwrap()
            .2
            .contains("stays Pending")
    );
    eventually("FellBackToPreferred event", || async {
        event_reasons(&c.client, "fb")
            .await
            .iter()
            .any(|r| r == "FellBackToPreferred")
            .then_some(())
    })
    .await;

    Api::<k8s_openapi::api::core::v1::Node>::all(c.client.clone())
        .delete("n3", &DeleteParams::default())
        .await
        .unwrap();
    let pps = wait_pps(&c.client, "wt", "node reported gone", |p| {
        condition(p, "NodeLost").is_some_and(|c| c.2.contains("n3 is gone"))
    })
    .await;
    assert!(!records(&pps)["wt-0"].preferred_only);

    // The node comes back: full pin again.
    add_node(&c.client, "n3", "b").await;
    let pps = wait_pps(&c.client, "fb", "recovered", |p| {
        !records(p)["fb-0"].preferred_only
    })
    .await;
    assert_eq!(condition(&pps, "NodeLost").unwrap().0, "False");
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn bad_input_gets_a_clear_condition_not_a_crash_loop() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    let cases = [
        (
            "badkey",
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "x"}),
            json!(["Not A Label Key"]),
            "InvalidSpec",
            "invalid node topology key",
        ),
        (
            "deploy",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"}),
            json!(["kubernetes.io/hostname"]),
            "InvalidSpec",
            "apps/v1 StatefulSet",
        ),
        (
            "missing",
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "nope"}),
            json!(["kubernetes.io/hostname"]),
            "TargetNotFound",
            "does not exist",
        ),
    ];
    for (name, target, keys, _, _) in &cases {
        let pps: PersistentPodState = serde_json::from_value(json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": {"name": name},
            "spec": {"targetRef": target, "requiredPersistentTopology": {"nodeTopologyKeys": keys}}
        }))
        .unwrap();
        pps_api(&c.client)
            .create(&PostParams::default(), &pps)
            .await
            .unwrap();
    }
    for (name, _, _, reason, text) in &cases {
        let pps = wait_pps(&c.client, name, reason, |p| {
            condition(p, "Ready").is_some_and(|c| c.1 == *reason)
        })
        .await;
        let (status, _, message) = condition(&pps, "Ready").unwrap();
        assert_eq!(status, "False");
        assert!(message.contains(text), "{name}: {message}");
    }
    // The schema refuses what it can: weight out of range, empty key, incomplete targetRef.
    for spec in [
        json!({"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "x"}, "preferredPersistentTopology": [{"weight": 0, "preference": {"nodeTopologyKeys": ["k"]}}]}),
        json!({"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "x"}, "requiredPersistentTopology": {"nodeTopologyKeys": [""]}}),
        json!({"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet"}}),
        json!({"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "x"}, "persistentPodStateRetentionPolicy": "Sometimes"}),
    ] {
        let body = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": {"name": "refused"}, "spec": spec});
        let raw: Api<DynamicObject> = Api::namespaced_with(
            c.client.clone(),
            &c.ns,
            &ApiResource::erase::<PersistentPodState>(&()),
        );
        let err = raw
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, kube::Error::Api(ref s) if s.code == 422),
            "{spec}: {err:?}"
        );
    }
    // Fixing the spec brings it to Ready.
    let sts = create_sts(&c.client, "x", 1, 0, &Default::default()).await;
    pps_api(&c.client)
        .patch("badkey", &PatchParams::default(), &Patch::Merge(json!({"spec": {"requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]}}})))
        .await
        .unwrap();
    run_pod(&c.client, &sts, 0, "n1", "10.7.0.1").await;
    wait_pps(&c.client, "badkey", "fixed and recording", |p| {
        records(p).len() == 1 && condition(p, "Ready").unwrap().0 == "True"
    })
    .await;
    assert!(!ctl.is_finished());
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn a_record_removed_by_hand_stays_removed() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    let sts = create_sts(&c.client, "mq", 2, 0, &auto("kubernetes.io/hostname", "")).await;
    run_pod(&c.client, &sts, 0, "n1", "10.5.0.1").await;
    run_pod(&c.client, &sts, 1, "n2", "10.5.0.2").await;
    wait_pps(&c.client, "mq", "two records", |p| records(p).len() == 2).await;

    // mq-1 is gone and its record kept for the rebuild; the operator removes it by hand (what
    // the WaitingForNode message tells them to do when a node will not come back).
    remove_pod(&c.client, "mq-1").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    pps_api(&c.client)
        .patch_status(
            "mq",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"podStates": {"mq-1": null}}})),
        )
        .await
        .unwrap();
    // Another change makes the controller write the status again: the edit must survive it,
    // not be overwritten by the controller's remembered copy.
    set_pod_ready(&c.client, "mq-0", "10.5.0.9", true).await;
    let pps = wait_pps(&c.client, "mq", "mq-0 refreshed", |p| {
        records(p)
            .get("mq-0")
            .is_some_and(|r| r.pod_ips == ["10.5.0.9"])
    })
    .await;
    assert!(
        !records(&pps).contains_key("mq-1"),
        "the hand edit was overwritten: {:?}",
        records(&pps).keys()
    );
    ctl.stop().await.unwrap();
}

/// The webhook only marks a pod whose recorded pin it skipped; the controller, which sees the
/// pods that exist, publishes the `PinSkipped` Warning on the PersistentPodState, once per pod.
#[tokio::test]
async fn a_pod_marked_pin_skipped_gets_one_event_on_its_pps() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    hand_pps(&c.client, "db", json!({})).await;
    let sts = create_sts(&c.client, "db", 2, 0, &Default::default()).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::default_namespaced(c.client.clone());
    let why = "not pinned, because the pod's own constraints exclude its recorded node: spec.nodeSelector requires kubernetes.io/hostname=n2, the record says kubernetes.io/hostname=n1";
    let pod = |name: &str, node: &str, annotations: serde_json::Value| {
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(json!({
            "metadata": {"name": name, "annotations": annotations,
                "labels": {"app": "db", "statefulset.kubernetes.io/pod-name": name},
                "ownerReferences": [sts.controller_owner_ref(&()).unwrap()]},
            "spec": {"nodeName": node, "containers": [{"name": "db", "image": "postgres:17"}]}
        }))
        .unwrap()
    };
    pods.create(
        &PostParams::default(),
        &pod("db-0", "n2", json!({keys::PIN_SKIPPED: why})),
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &pod("db-1", "n1", json!({})))
        .await
        .unwrap();
    let pin_skipped = || async {
        events(&c.client)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("PinSkipped"))
            .collect::<Vec<_>>()
    };
    let event = eventually("the PinSkipped event", || async {
        pin_skipped().await.into_iter().next()
    })
    .await;
    let regarding = event.regarding.clone().unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("PersistentPodState"), Some("db"))
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.clone().unwrap();
    assert!(note.starts_with("pod db-0 (uid "), "{note}");
    assert!(note.ends_with(why), "{note}");

    // The pod changes (it becomes Ready): still one Event, published once.
    set_pod_ready(&c.client, "db-0", "10.9.0.1", true).await;
    set_pod_ready(&c.client, "db-1", "10.9.0.2", true).await;
    wait_pps(&c.client, "db", "both recorded", |p| records(p).len() == 2).await;
    let events = pin_skipped().await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert!(events[0].series.is_none(), "published once: {events:#?}");
    ctl.stop().await.unwrap();
}

/// Whatever is logged of an object a user wrote has its newlines escaped: a PersistentPodState
/// whose `targetRef.kind` carries a log line of its own still logs one line.
#[tokio::test]
async fn object_text_cannot_forge_log_lines() {
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    // The binaries' plain format (ipkeep_daemon::init_logging), without colours. A
    // current-thread runtime: every task the controller spawns logs through this subscriber.
    let _logs = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_env_filter("warn")
            .with_ansi(false)
            .fmt_fields(ipkeep_daemon::OneLineFields::default())
            .with_writer(move || writer.clone())
            .finish(),
    );
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    // Within the schema's 63 characters for a kind.
    let forged = "D\n1999-01-01T00:00:00Z WARN ipkeep_controller: forged=true";
    let pps: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": {"name": "forged"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": forged, "name": "x"},
            "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]}}
    }))
    .unwrap();
    pps_api(&c.client)
        .create(&PostParams::default(), &pps)
        .await
        .unwrap();
    wait_pps(&c.client, "forged", "InvalidSpec", |p| {
        condition(p, "Ready").is_some_and(|c| c.1 == "InvalidSpec")
    })
    .await;
    ctl.stop().await.unwrap();
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let spec_lines: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("forged=true"))
        .collect();
    assert!(
        !spec_lines.is_empty(),
        "the invalid spec is logged: {logged}"
    );
    for line in logged.lines() {
        assert!(!line.starts_with("1999-01-01"), "a forged line:\n{logged}");
    }
    for line in spec_lines {
        assert!(line.contains("invalid spec"), "{line}");
    }
}
