//! The API conventions, exercised with the real `kube::Client` over HTTP.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use ipkeep_apisim::{ApiServer, Fault, ServerConfig};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use serde_json::{Value, json};

async fn server() -> ApiServer {
    ApiServer::start_with(ServerConfig {
        bookmark_interval: Duration::from_millis(200),
        ..ServerConfig::default()
    })
    .await
    .unwrap()
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "postgres:17"}]}
    }))
    .unwrap()
}

fn api_error(err: kube::Error) -> Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn sts(name: &str, replicas: i32) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas, "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": "postgres:17"}]}}
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn create_get_update_with_optimistic_concurrency() {
    let server = server().await;
    let pods: Api<Pod> = Api::namespaced(server.client().unwrap(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("pg-0", json!({"app": "pg"})))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));

    let again = pods
        .create(&PostParams::default(), &pod("pg-0", json!({})))
        .await
        .unwrap_err();
    let again = api_error(again);
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));

    let mut fresh = pods.get("pg-0").await.unwrap();
    fresh
        .metadata
        .labels
        .get_or_insert_default()
        .insert("role".into(), "primary".into());
    let updated = pods
        .replace("pg-0", &PostParams::default(), &fresh)
        .await
        .unwrap();
    let rv2: u64 = updated
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1, "resourceVersion must increase");

    // The old copy is stale now.
    let stale = api_error(
        pods.replace("pg-0", &PostParams::default(), &fresh)
            .await
            .unwrap_err(),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));

    let missing = api_error(pods.get("nope").await.unwrap_err());
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert_eq!(missing.message, "pods \"nope\" not found");

    // A write that changes nothing commits nothing.
    let same = pods
        .replace("pg-0", &PostParams::default(), &updated)
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        updated.metadata.resource_version
    );

    // Invalid objects are refused with 422 and the field.
    let bad: Pod = serde_json::from_value(
        json!({"metadata": {"name": "bad"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .unwrap();
    let bad = api_error(pods.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((bad.code, bad.reason.as_str()), (422, "Invalid"));
    assert!(
        bad.message.contains("spec.containers[0].image"),
        "{}",
        bad.message
    );

    // Objects cannot be created in a namespace that does not exist.
    let elsewhere: Api<Pod> = Api::namespaced(server.client().unwrap(), "nowhere");
    let err = api_error(
        elsewhere
            .create(&PostParams::default(), &pod("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn generate_name_gives_unique_names() {
    let server = server().await;
    let pods: Api<Pod> = Api::namespaced(server.client().unwrap(), "default");
    let mut template = pod("", json!({}));
    template.metadata.name = None;
    template.metadata.generate_name = Some("worker-".into());
    let a = pods
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let b = pods
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let (a, b) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(
        a.starts_with("worker-") && a.len() == "worker-".len() + 5,
        "{a}"
    );
    assert_ne!(a, b);
}

#[tokio::test]
async fn list_filters_by_label_and_field_and_pages() {
    let server = server().await;
    let client = server.client().unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        let app = if i % 2 == 0 { "pg" } else { "kafka" };
        pods.create(
            &PostParams::default(),
            &pod(&format!("p{i}"), json!({"app": app})),
        )
        .await
        .unwrap();
    }
    let bound = pods.get("p2").await.unwrap();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p2"}, "target": {"kind": "Node", "name": "n1"}});
    let request = http::Request::post("/api/v1/namespaces/default/pods/p2/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&binding).unwrap())
        .unwrap();
    let _: Value = client.request(request).await.unwrap();
    assert_ne!(
        pods.get("p2").await.unwrap().metadata.resource_version,
        bound.metadata.resource_version
    );

    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    };
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app=pg"))
                .await
                .unwrap()
        ),
        ["p0", "p2", "p4", "p6"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("app in (kafka),app!=pg"))
                .await
                .unwrap()
        ),
        ["p1", "p3", "p5"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("spec.nodeName=n1"))
                .await
                .unwrap()
        ),
        ["p2"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("metadata.name=p3"))
                .await
                .unwrap()
        ),
        ["p3"]
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("status.phase=Pending"))
            .await
            .unwrap()
            .items
            .len(),
        7
    );
    let err = api_error(
        pods.list(&ListParams::default().fields("spec.hostname=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.message.as_str()),
        (400, "field label not supported: spec.hostname")
    );
    let err = api_error(
        pods.list(&ListParams::default().labels("app in pg"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);

    // Paging: a consistent snapshot even when objects change between pages.
    let first = pods.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(names(first.clone()), ["p0", "p1", "p2"]);
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    pods.delete("p4", &DeleteParams::default()).await.unwrap();
    pods.create(&PostParams::default(), &pod("p9", json!({})))
        .await
        .unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    let second = pods
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        names(second.clone()),
        ["p3", "p4", "p5"],
        "the snapshot still has p4 and not p9"
    );
    let third = pods
        .list(
            &ListParams::default()
                .limit(3)
                .continue_token(second.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(third.clone()), ["p6"]);
    assert!(third.metadata.continue_.is_none());

    // An expired continue token is 410.
    server.compact();
    let gone = api_error(
        pods.list(&ListParams::default().limit(3).continue_token(&token))
            .await
            .unwrap_err(),
    );
    assert_eq!((gone.code, gone.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn status_subresource_is_separate_and_generation_tracks_spec() {
    let server = server().await;
    let sets: Api<StatefulSet> = Api::namespaced(server.client().unwrap(), "default");
    let created = sets
        .create(&PostParams::default(), &sts("pg", 3))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    // Status written through the main resource is ignored …
    let ignored = sets
        .patch(
            "pg",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyReplicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(ignored.status.as_ref().and_then(|s| s.ready_replicas), None);
    // … and spec written through /status is ignored, with no generation bump.
    let status = sets
        .patch_status(
            "pg",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"replicas": 9}, "status": {"readyReplicas": 2, "replicas": 3}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(status.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(status.status.as_ref().unwrap().ready_replicas, Some(2));
    assert_eq!(status.metadata.generation, Some(1));

    let scaled = sets
        .patch(
            "pg",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.metadata.generation, Some(2));
    let labelled = sets
        .patch(
            "pg",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(2),
        "metadata changes do not bump generation"
    );

    // Scale subresource.
    let scale = sets.get_scale("pg").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(5));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=pg"));
    sets.patch_scale(
        "pg",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    assert_eq!(
        sets.get("pg").await.unwrap().spec.unwrap().replicas,
        Some(1)
    );

    // Immutable fields.
    let err = api_error(
        sets.patch(
            "pg",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"serviceName": "other"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
}

#[tokio::test]
async fn patches_json_merge_strategic_and_server_side_apply() {
    let server = server().await;
    let sets: Api<StatefulSet> = Api::namespaced(server.client().unwrap(), "default");
    sets.create(&PostParams::default(), &sts("db", 2))
        .await
        .unwrap();

    // JSON patch, with a failing test op changing nothing.
    let patch: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}}]),
    )
    .unwrap();
    let patched = sets
        .patch("db", &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .unwrap();
    assert_eq!(patched.metadata.annotations.unwrap()["a"], "1");
    let failing: json_patch::Patch = serde_json::from_value(json!([{"op": "test", "path": "/spec/replicas", "value": 7}, {"op": "replace", "path": "/spec/replicas", "value": 8}])).unwrap();
    let err = api_error(
        sets.patch("db", &PatchParams::default(), &Patch::Json::<()>(failing))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert_eq!(
        sets.get("db").await.unwrap().spec.unwrap().replicas,
        Some(2)
    );

    // Strategic merge: containers merge by name, env by name.
    let smp = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "env": [{"name": "MODE", "value": "primary"}]}, {"name": "sidecar", "image": "busybox"}]}}}});
    let merged = sets
        .patch("db", &PatchParams::default(), &Patch::Strategic(smp))
        .await
        .unwrap();
    let containers = merged.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers.len(), 2);
    assert_eq!(
        containers[0].image.as_deref(),
        Some("postgres:17"),
        "the existing container kept its image"
    );
    assert_eq!(
        containers[0].env.as_ref().unwrap()[0].value.as_deref(),
        Some("primary")
    );

    // Merge patch with a stale resourceVersion is a conflict.
    let stale = json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 4}});
    let err = api_error(
        sets.patch("db", &PatchParams::default(), &Patch::Merge(stale))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);

    // Server-side apply of status by two field managers, and a conflict on a shared field.
    let ours = PatchParams::apply("ipkeep-controller");
    let status = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "status": {"replicas": 2, "readyReplicas": 1}});
    let applied = sets
        .patch_status("db", &ours, &Patch::Apply(&status))
        .await
        .unwrap();
    assert_eq!(applied.status.as_ref().unwrap().ready_replicas, Some(1));
    let managers: Vec<(String, Option<String>)> = applied
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|m| (m.manager.unwrap(), m.subresource))
        .collect();
    assert!(
        managers.contains(&("ipkeep-controller".to_string(), Some("status".to_string()))),
        "{managers:?}"
    );
    let theirs = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "status": {"replicas": 2, "readyReplicas": 2}});
    let err = api_error(
        sets.patch_status("db", &PatchParams::apply("other"), &Patch::Apply(&theirs))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("ipkeep-controller") && err.message.contains(".status.readyReplicas"),
        "{}",
        err.message
    );
    let forced = sets
        .patch_status(
            "db",
            &PatchParams::apply("other").force(),
            &Patch::Apply(&theirs),
        )
        .await
        .unwrap();
    assert_eq!(forced.status.unwrap().ready_replicas, Some(2));
    // Dropping a field from our apply removes it when nobody else owns it.
    let less = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "status": {"replicas": 2}});
    sets.patch_status(
        "db",
        &PatchParams::apply("other").force(),
        &Patch::Apply(&less),
    )
    .await
    .unwrap();
    let after = sets
        .patch_status("db", &ours, &Patch::Apply(&less))
        .await
        .unwrap();
    assert_eq!(after.status.unwrap().ready_replicas, None);

    // Apply creates.
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}});
    let leases: Api<Lease> = Api::namespaced(server.client().unwrap(), "default");
    let created = leases
        .patch("leader", &PatchParams::apply("ctl"), &Patch::Apply(&lease))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert_eq!(created.spec.unwrap().holder_identity.as_deref(), Some("a"));
}

#[tokio::test]
async fn delete_waits_for_finalizers_and_collects_dependents() {
    let server = server().await;
    let client = server.client().unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let owner = sets
        .create(&PostParams::default(), &sts("pg", 1))
        .await
        .unwrap();
    let owner_ref = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "pg", "uid": owner.metadata.uid, "controller": true, "blockOwnerDeletion": true}]);
    let mut dependent = pod("pg-0", json!({"app": "pg"}));
    dependent.metadata.owner_references = serde_json::from_value(owner_ref.clone()).unwrap();
    dependent.metadata.finalizers = Some(vec!["ipkeep.dev/test".into()]);
    pods.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    let mut orphan = pod("pg-1", json!({"app": "pg"}));
    orphan.metadata.owner_references = serde_json::from_value(owner_ref.clone()).unwrap();
    pods.create(&PostParams::default(), &orphan).await.unwrap();

    // Background: the owner goes at once; dependents are deleted (pg-0 waits for its finalizer).
    sets.delete("pg", &DeleteParams::background())
        .await
        .unwrap();
    assert_eq!(api_error(sets.get("pg").await.unwrap_err()).code, 404);
    assert_eq!(api_error(pods.get("pg-1").await.unwrap_err()).code, 404);
    let terminating = pods.get("pg-0").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    // No new finalizer once deleting; removing the last one removes the object.
    let err = api_error(
        pods.patch(
            "pg-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["ipkeep.dev/test", "x/y"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    pods.patch(
        "pg-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(pods.get("pg-0").await.unwrap_err()).code, 404);

    // Orphan: dependents stay without the owner reference.
    let owner = sets
        .create(&PostParams::default(), &sts("kafka", 1))
        .await
        .unwrap();
    let mut kept = pod("kafka-0", json!({}));
    kept.metadata.owner_references = serde_json::from_value(json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "kafka", "uid": owner.metadata.uid}])).unwrap();
    pods.create(&PostParams::default(), &kept).await.unwrap();
    sets.delete(
        "kafka",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    assert!(
        pods.get("kafka-0")
            .await
            .unwrap()
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // Foreground: the owner waits, with foregroundDeletion, until its dependents are gone.
    let owner = sets
        .create(&PostParams::default(), &sts("zk", 1))
        .await
        .unwrap();
    let mut blocking = pod("zk-0", json!({}));
    blocking.metadata.owner_references = serde_json::from_value(json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "zk", "uid": owner.metadata.uid, "blockOwnerDeletion": true}])).unwrap();
    blocking.metadata.finalizers = Some(vec!["ipkeep.dev/test".into()]);
    pods.create(&PostParams::default(), &blocking)
        .await
        .unwrap();
    sets.delete("zk", &DeleteParams::foreground())
        .await
        .unwrap();
    let waiting = sets.get("zk").await.unwrap();
    assert_eq!(waiting.metadata.finalizers.unwrap(), ["foregroundDeletion"]);
    pods.patch(
        "zk-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_error(sets.get("zk").await.unwrap_err()).code, 404);

    // Preconditions.
    sets.create(&PostParams::default(), &sts("etcd", 1))
        .await
        .unwrap();
    let err = api_error(
        sets.delete(
            "etcd",
            &DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: Some("wrong".into()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 409);
}

#[tokio::test]
async fn bound_pods_terminate_gracefully_and_namespaces_empty_before_going() {
    let server = server().await;
    let client = server.client().unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "db"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "db");
    let mut running = pod("pg-0", json!({}));
    running.spec.as_mut().unwrap().node_name = Some("n1".into());
    pods.create(&PostParams::default(), &running).await.unwrap();

    pods.delete("pg-0", &DeleteParams::default()).await.unwrap();
    let terminating = pods.get("pg-0").await.unwrap();
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    // The kubelet confirms with grace 0.
    pods.delete("pg-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert_eq!(api_error(pods.get("pg-0").await.unwrap_err()).code, 404);

    pods.create(&PostParams::default(), &pod("x", json!({})))
        .await
        .unwrap();
    namespaces
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(pods.get("x").await.unwrap_err()).code, 404);
    assert_eq!(api_error(namespaces.get("db").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn watcher_lists_watches_and_relists_after_410() {
    // No idle bookmarks here, so the watcher's resourceVersion stays where its last event was.
    let server = ApiServer::start_with(ServerConfig {
        bookmark_interval: Duration::from_secs(3600),
        ..ServerConfig::default()
    })
    .await
    .unwrap();
    let client = server.client().unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("a", json!({"app": "pg"})))
        .await
        .unwrap();

    let (reader, writer) = reflector::store::<Pod>();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(pods.clone(), watcher::Config::default().labels("app=pg"))
            .default_backoff(),
    )
    .applied_objects();
    tokio::spawn(async move {
        let mut stream = stream.boxed();
        while let Some(item) = stream.next().await {
            if let Ok(pod) = item {
                let _ = seen_tx.send(pod.metadata.name.unwrap());
            }
        }
    });
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), seen_rx.recv())
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(next().await, "a");
    pods.create(&PostParams::default(), &pod("b", json!({"app": "pg"})))
        .await
        .unwrap();
    assert_eq!(next().await, "b");
    // A change the watcher does not see, then compaction past it, then the watch drops: the
    // watcher resumes from "b", gets 410 Gone, and must relist (seeing "a" and "b" again).
    pods.create(
        &PostParams::default(),
        &pod("ignored", json!({"app": "web"})),
    )
    .await
    .unwrap();
    server.compact();
    server.drop_watches();
    let mut relisted = Vec::new();
    while relisted.len() < 2 {
        relisted.push(next().await);
    }
    relisted.sort();
    assert_eq!(relisted, ["a", "b"], "the relist re-applies every object");
    pods.create(&PostParams::default(), &pod("c", json!({"app": "pg"})))
        .await
        .unwrap();
    assert_eq!(next().await, "c");
    let mut cached: Vec<String> = reader
        .state()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    cached.sort();
    assert_eq!(cached, ["a", "b", "c"]);
}

#[tokio::test]
async fn raw_watch_gives_bookmarks_initial_events_410_and_selector_transitions() {
    let server = server().await;
    let client = server.client().unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("a", json!({"app": "pg"})))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();

    let params = kube::api::WatchParams::default()
        .labels("app=pg")
        .timeout(5);
    let mut events = pods.watch(&params, &rv).await.unwrap().boxed();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "pg"}}})),
    )
    .await
    .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 3 {
        match events.try_next().await.unwrap().unwrap() {
            kube::api::WatchEvent::Added(_) => kinds.push("ADDED"),
            kube::api::WatchEvent::Modified(_) => kinds.push("MODIFIED"),
            kube::api::WatchEvent::Deleted(_) => kinds.push("DELETED"),
            kube::api::WatchEvent::Bookmark(_) => kinds.push("BOOKMARK"),
            kube::api::WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        kinds,
        ["DELETED", "ADDED", "BOOKMARK"],
        "leaving and re-entering the selector, then an idle bookmark"
    );

    // The stream ends at timeoutSeconds.
    let short = kube::api::WatchParams::default().timeout(1);
    let mut ended = pods.watch(&short, "0").await.unwrap().boxed();
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        while ended.try_next().await.unwrap().is_some() {}
    })
    .await;
    assert!(drained.is_ok(), "watch must end after timeoutSeconds");

    // Too old: 410 as a status.
    server.compact();
    let err = pods.watch(&kube::api::WatchParams::default(), &rv).await;
    match err {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 410),
        Ok(stream) => {
            let first = stream.boxed().try_next().await.unwrap().unwrap();
            assert!(
                matches!(first, kube::api::WatchEvent::Error(ref e) if e.code == 410),
                "{first:?}"
            );
        }
        Err(other) => panic!("{other:?}"),
    }

    // Streaming lists: initial ADDED events, then a bookmark marking their end.
    let streaming = watcher::watcher(pods.clone(), watcher::Config::default().streaming_lists());
    let first = tokio::time::timeout(Duration::from_secs(5), streaming.boxed().try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(first, Some(Event::Init)), "{first:?}");
}

#[tokio::test]
async fn injected_faults_reach_the_client() {
    let server = server().await;
    let pods: Api<Pod> = Api::namespaced(server.client().unwrap(), "default");
    // kube's client retries 429 after Retry-After: the create lands once the faults are spent.
    server.inject(Fault::new("create", "pods", 2, 429).retry_after(1));
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    assert_eq!(
        server.cluster().faults.pending(),
        0,
        "both 429s were served"
    );
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    server.inject(Fault::new("patch", "pods/status", 2, 500));
    for _ in 0..2 {
        let err = api_error(
            pods.patch_status(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running"}})),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(err.code, 500);
    }
    let ok = pods
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(ok.status.unwrap().phase.as_deref(), Some("Running"));
}

#[tokio::test]
async fn events_v1_and_core_events_share_storage_and_nodes_are_cluster_scoped() {
    let server = server().await;
    let client = server.client().unwrap();
    let recorder = kube::runtime::events::Recorder::new(client.clone(), "ipkeep-test".into());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let p = pods
        .create(&PostParams::default(), &pod("pg-0", json!({})))
        .await
        .unwrap();
    recorder
        .publish(
            &kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Normal,
                reason: "Pinned".into(),
                note: Some("pinned to n1".into()),
                action: "Pin".into(),
                secondary: None,
            },
            &kube::Resource::object_ref(&p, &()),
        )
        .await
        .unwrap();
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let listed = core
        .list(&ListParams::default().fields("involvedObject.name=pg-0"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].message.as_deref(), Some("pinned to n1"));
    assert_eq!(listed.items[0].reason.as_deref(), Some("Pinned"));

    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    )
    .unwrap();
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(
        created.status.unwrap().conditions.unwrap()[0].status,
        "True",
        "nodes keep their status on create"
    );
    assert_eq!(
        nodes
            .list(&ListParams::default().labels("topology.kubernetes.io/zone=a"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

/// A webhook server that labels every pod it sees, answering AdmissionReview v1 with a JSONPatch.
async fn labelling_webhook() -> std::net::SocketAddr {
    use base64::Engine as _;
    async fn review(axum::Json(review): axum::Json<Value>) -> axum::Json<Value> {
        let patch = json!([{"op": "add", "path": "/metadata/labels/admitted", "value": "yes"}]);
        let encoded = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
        axum::Json(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": true, "patchType": "JSONPatch", "patch": encoded}
        }))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            axum::Router::new().route("/mutate", axum::routing::post(review)),
        )
        .await
        .unwrap();
    });
    address
}

#[tokio::test]
async fn mutating_webhooks_are_called_on_matching_writes() {
    let server = server().await;
    let client = server.client().unwrap();
    let webhook = labelling_webhook().await;
    let configs: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(client.clone());
    let config = json!({
        "metadata": {"name": "ipkeep"},
        "webhooks": [{
            "name": "pods.ipkeep.dev",
            "clientConfig": {"url": format!("http://{webhook}/mutate")},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {"app": "pg"}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 5
        }]
    });
    configs
        .create(
            &PostParams::default(),
            &serde_json::from_value(config).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let admitted = pods
        .create(&PostParams::default(), &pod("pg-0", json!({"app": "pg"})))
        .await
        .unwrap();
    assert_eq!(admitted.metadata.labels.unwrap()["admitted"], "yes");
    let skipped = pods
        .create(&PostParams::default(), &pod("web-0", json!({"app": "web"})))
        .await
        .unwrap();
    assert!(
        !skipped.metadata.labels.unwrap().contains_key("admitted"),
        "objectSelector excludes it"
    );

    // An unreachable webhook with failurePolicy Fail refuses the write with 500 and names it.
    let broken = json!({"webhooks": [{"name": "pods.ipkeep.dev", "clientConfig": {"url": "http://127.0.0.1:1/mutate"},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 2}]});
    configs
        .patch("ipkeep", &PatchParams::default(), &Patch::Merge(broken))
        .await
        .unwrap();
    let err = api_error(
        pods.create(&PostParams::default(), &pod("pg-1", json!({"app": "pg"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 500);
    assert!(err.message.contains("pods.ipkeep.dev"), "{}", err.message);
    assert_eq!(
        api_error(pods.get("pg-1").await.unwrap_err()).code,
        404,
        "nothing was stored"
    );
}
