#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use ipkeep_api::PersistentPodState;
use kube::core::{ObjectList, WatchEvent};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::watcher::{self, Event};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;

/// A PersistentPodState `namespace`/`name` at resource version `rv` with `status`.
fn pps(namespace: &str, name: &str, rv: &str, status: Value) -> Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"), "resourceVersion": rv},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name}},
        "status": status,
    })
}

fn good(namespace: &str, name: &str, rv: &str) -> Value {
    pps(
        namespace,
        name,
        rv,
        json!({"recordedPods": 1, "podStates": {format!("{name}-0"): {"nodeName": "n1", "recordedAt": "2026-11-28T10:00:00Z"}}}),
    )
}

/// What kube-apiserver accepts in a status and serde refuses: a time that is not one.
fn bad_time(namespace: &str, name: &str, rv: &str) -> Value {
    pps(
        namespace,
        name,
        rv,
        json!({"podStates": {"x-0": {"nodeName": "n9", "recordedAt": "soon"}}}),
    )
}

/// ... and an int32 that is not one.
fn bad_int(namespace: &str, name: &str, rv: &str) -> Value {
    pps(
        namespace,
        name,
        rv,
        json!({"recordedPods": 3_000_000_000u64}),
    )
}

fn page(items: &[Value]) -> String {
    json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodStateList",
           "metadata": {"resourceVersion": "100"}, "items": items})
    .to_string()
}

#[test]
fn one_bad_item_leaves_the_rest_of_the_page_readable() {
    let text = page(&[
        good("prod", "db", "1"),
        bad_time("tenant-b", "x", "2"),
        bad_int("tenant-b", "y", "3"),
        good("prod", "web", "4"),
    ]);
    // As a typed list, the page does not decode at all: the failure this module exists for.
    let typed = serde_json::from_str::<ObjectList<PersistentPodState>>(&text).unwrap_err();
    assert!(typed.to_string().contains("year"), "{typed}");

    let list: ObjectList<Lenient<PersistentPodState>> = serde_json::from_str(&text).unwrap();
    let names: Vec<(String, Result<(), String>)> = list
        .items
        .iter()
        .map(|l| {
            (
                l.meta().name.clone().unwrap(),
                l.decoded.as_ref().map(|_| ()).map_err(|u| u.error.clone()),
            )
        })
        .collect();
    assert_eq!(names[0], ("db".into(), Ok(())));
    assert_eq!(names[3], ("web".into(), Ok(())));
    let (x, y) = (&names[1], &names[2]);
    assert_eq!(x.0, "x");
    let x_err = x.1.clone().unwrap_err();
    assert!(
        x_err.starts_with("status.podStates.x-0.recordedAt: "),
        "{x_err}"
    );
    assert_eq!(y.0, "y");
    let y_err = y.1.clone().unwrap_err();
    assert!(
        y_err.starts_with("status.recordedPods: invalid value: integer `3000000000`"),
        "{y_err}"
    );
    let bad = list.items[1].decoded.as_ref().unwrap_err();
    assert_eq!(bad.meta.namespace.as_deref(), Some("tenant-b"));
    assert_eq!(bad.meta.uid.as_deref(), Some("uid-x"));
    assert_eq!(bad.meta.resource_version.as_deref(), Some("2"));
}

#[test]
fn a_watch_event_with_a_bad_object_still_decodes_in_either_key_order() {
    let object = bad_int("tenant-b", "y", "7").to_string();
    // As kube-apiserver writes it (`type` first): the object's own text is decoded, and the
    // error says where in it.
    let ours = format!(r#"{{"type":"MODIFIED","object":{object}}}"#);
    // `object` first: serde buffers the object before it knows the variant.
    let other = format!(r#"{{"object":{object},"type":"MODIFIED"}}"#);
    for (line, position) in [(ours, true), (other, false)] {
        let event: WatchEvent<Lenient<PersistentPodState>> = serde_json::from_str(&line).unwrap();
        let WatchEvent::Modified(l) = event else {
            panic!("not a Modified event")
        };
        assert_eq!(l.meta().name.as_deref(), Some("y"));
        let error = l.decoded.unwrap_err().error;
        assert!(error.starts_with("status.recordedPods: "), "{error}");
        assert_eq!(error.contains(" at line 1 column "), position, "{error}");
    }
    let good = good("prod", "db", "8").to_string();
    for line in [
        format!(r#"{{"type":"ADDED","object":{good}}}"#),
        format!(r#"{{"object":{good},"type":"ADDED"}}"#),
    ] {
        let event: WatchEvent<Lenient<PersistentPodState>> = serde_json::from_str(&line).unwrap();
        let WatchEvent::Added(l) = event else {
            panic!("not an Added event")
        };
        assert_eq!(l.decoded.unwrap().status.unwrap().recorded_pods, 1);
    }
}

#[test]
fn the_error_kept_is_bounded_whatever_the_object_holds() {
    // A value serde quotes in its message, and a map key it names in the path, both long.
    let long = "k".repeat(100_000);
    let mut object = good("prod", "db", "1");
    object["spec"]["persistentPodStateRetentionPolicy"] = json!("v".repeat(100_000));
    let l = Lenient::<PersistentPodState>::decode(&object.to_string());
    let error = l.decoded.unwrap_err().error;
    assert!(
        error.len() < 2 * MAX_ERROR_PART + 16,
        "{} bytes",
        error.len()
    );
    assert!(error.starts_with("spec.persistentPodStateRetentionPolicy: unknown variant"));

    let mut object = good("prod", "db", "1");
    object["status"]["podStates"] = json!({long.clone(): {"nodeName": 5}});
    let error = Lenient::<PersistentPodState>::decode(&object.to_string())
        .decoded
        .unwrap_err()
        .error;
    assert!(
        error.len() < 2 * MAX_ERROR_PART + 16,
        "{} bytes",
        error.len()
    );
}

#[test]
fn lean_metadata_keeps_the_annotations_asked_for() {
    let meta: LeanMeta = serde_json::from_value(json!({
        "name": "db", "namespace": "prod", "uid": "u", "resourceVersion": "5", "generation": 2,
        "annotations": {"keep": "1", "drop": "2"}, "labels": {"a": "b"},
        "managedFields": [{"manager": "m"}]
    }))
    .unwrap();
    let meta = meta.into_meta(&["keep"]);
    assert_eq!(meta.annotations.unwrap().len(), 1);
    assert_eq!(meta.name.as_deref(), Some("db"));
    assert_eq!(meta.generation, Some(2));
    assert!(meta.labels.is_none() && meta.managed_fields.is_none());
}

fn event(kind: &str, object: Value) -> Result<Event<Lenient<PersistentPodState>>, watcher::Error> {
    let l = || Lenient::decode(&object.to_string());
    Ok(match kind {
        "Init" => Event::Init,
        "InitApply" => Event::InitApply(l()),
        "InitDone" => Event::InitDone,
        "Apply" => Event::Apply(l()),
        "Delete" => Event::Delete(l()),
        _ => unreachable!(),
    })
}

#[tokio::test]
async fn the_store_holds_what_decodes_and_the_set_what_does_not() {
    let (store, writer) = reflector::store::<PersistentPodState>();
    let gauge = Gauge::default();
    let reported = Arc::new(Mutex::new(VecDeque::new()));
    let undecodables = Undecodables::new("PersistentPodState", gauge.clone()).reported({
        let reported = reported.clone();
        move |r| reported.lock().unwrap().push_back(r)
    });
    let next_report = || reported.lock().unwrap().pop_front();
    let (tx, rx) = mpsc::unbounded_channel();
    let stream = reflector(
        writer,
        sorted(
            futures::stream::poll_fn({
                let mut rx = rx;
                move |cx| rx.poll_recv(cx)
            }),
            store.clone(),
            undecodables.clone(),
        ),
    );
    let mut stream = Box::pin(stream);
    let names = |store: &Store<PersistentPodState>| {
        let mut n: Vec<String> = store
            .state()
            .iter()
            .map(|p| p.meta().name.clone().unwrap())
            .collect();
        n.sort();
        n
    };
    // Sends `events` and waits until each passed (or was left out) before the next.
    let mut feed =
        async |events: Vec<Result<Event<Lenient<PersistentPodState>>, watcher::Error>>| {
            let last = events.len();
            for (i, e) in events.into_iter().enumerate() {
                tx.send(e).unwrap();
                if i + 1 == last {
                    tx.send(event("Apply", good("zz", "marker", "0"))).unwrap();
                }
            }
            // The marker passes last: everything before it was sorted.
            loop {
                match stream.next().await.unwrap().unwrap() {
                    Event::Apply(p) if p.meta().name.as_deref() == Some("marker") => break,
                    _ => {}
                }
            }
        };

    feed(vec![
        event("Init", json!(null)),
        event("InitApply", good("prod", "db", "1")),
        event("InitApply", bad_time("tenant-b", "x", "2")),
        event("InitDone", json!(null)),
    ])
    .await;
    assert_eq!(names(&store), ["db", "marker"]);
    assert!(undecodables.contains("tenant-b", "x"));
    assert_eq!(undecodables.names_in("tenant-b"), ["x"]);
    assert_eq!(gauge.get(), 1);
    let found = |r: Report| match r {
        Report::Found(u) => u.meta.name.unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(found(next_report().unwrap()), "x");

    // A decoded object that turns undecodable leaves the store.
    feed(vec![event("Apply", bad_int("prod", "db", "5"))]).await;
    assert_eq!(names(&store), ["marker"]);
    assert_eq!(undecodables.namespaces().len(), 2);
    assert_eq!(gauge.get(), 2);
    assert_eq!(found(next_report().unwrap()), "db");

    // A relist that finds the same versions reports nothing again.
    feed(vec![
        event("Init", json!(null)),
        event("InitApply", bad_int("prod", "db", "5")),
        event("InitApply", bad_time("tenant-b", "x", "2")),
        event("InitDone", json!(null)),
    ])
    .await;
    assert_eq!(next_report(), None);
    assert_eq!(undecodables.len(), 2);

    // Fixed, it decodes and returns; deleted, it is no longer undecodable.
    let before = undecodables.generation();
    feed(vec![
        event("Apply", good("prod", "db", "6")),
        event("Delete", bad_time("tenant-b", "x", "7")),
    ])
    .await;
    assert_eq!(names(&store), ["db", "marker"]);
    assert!(undecodables.is_empty());
    assert_eq!(gauge.get(), 0);
    assert!(undecodables.generation() > before);
    assert_eq!(
        next_report().unwrap(),
        Report::Gone("prod".into(), "db".into())
    );
    assert_eq!(
        next_report().unwrap(),
        Report::Gone("tenant-b".into(), "x".into())
    );
}
