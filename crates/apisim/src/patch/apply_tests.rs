//! Tests for server-side apply and managedFields bookkeeping.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::patch::BuiltinLists;
use serde_json::json;

const T1: &str = "2024-01-01T00:00:00Z";
const T2: &str = "2024-01-02T00:00:00Z";

fn req(manager: &str) -> ApplyRequest<'_> {
    ApplyRequest {
        manager,
        force: false,
        api_version: "apps/v1",
        subresource: None,
        time: T1,
    }
}

fn apply(live: Option<&Value>, applied: Value, req: &ApplyRequest) -> Result<Value, PatchError> {
    server_side_apply(live, &applied, req, &BuiltinLists)
}

fn sts(spec: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "s", "namespace": "ns"}, "spec": spec})
}

fn entry<'a>(obj: &'a Value, manager: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager)
}

fn owned(obj: &Value, manager: &str) -> Vec<String> {
    entry(obj, manager)
        .map(|e| FieldSet::from_fields_v1(&e["fieldsV1"]).unwrap().paths())
        .unwrap_or_default()
}

#[test]
fn create_by_apply() {
    let obj = apply(None, sts(json!({"replicas": 2})), &req("ctl")).unwrap();
    assert_eq!(obj["spec"]["replicas"], 2);
    assert_eq!(obj["metadata"]["name"], "s");
    assert_eq!(
        obj["metadata"]["managedFields"],
        json!([{"manager": "ctl", "operation": "Apply", "apiVersion": "apps/v1", "time": T1,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}])
    );
}

#[test]
fn reapply_same_is_a_no_op() {
    let cfg = sts(json!({"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}}}));
    let first = apply(None, cfg.clone(), &req("ctl")).unwrap();
    let again = apply(
        Some(&first),
        cfg,
        &ApplyRequest {
            time: T2,
            ..req("ctl")
        },
    )
    .unwrap();
    assert_eq!(again, first);
}

#[test]
fn apply_removes_fields_it_dropped() {
    let cfg = sts(json!({"replicas": 2, "serviceName": "x"}));
    let mut cfg_with_label = cfg.clone();
    cfg_with_label["metadata"]["labels"] = json!({"a": "1", "b": "2"});
    let first = apply(None, cfg_with_label, &req("ctl")).unwrap();
    let mut next_cfg = sts(json!({"serviceName": "x"}));
    next_cfg["metadata"]["labels"] = json!({"a": "1"});
    let next = apply(
        Some(&first),
        next_cfg,
        &ApplyRequest {
            time: T2,
            ..req("ctl")
        },
    )
    .unwrap();
    assert!(next["spec"].get("replicas").is_none(), "{next}");
    assert_eq!(next["metadata"]["labels"], json!({"a": "1"}));
    assert_eq!(
        owned(&next, "ctl"),
        vec![".metadata.labels.a", ".spec.serviceName"]
    );
    assert_eq!(entry(&next, "ctl").unwrap()["time"], T2);
    let gone = apply(Some(&next), sts(json!({"serviceName": "x"})), &req("ctl")).unwrap();
    assert!(
        gone["metadata"].get("labels").is_none(),
        "emptied labels pruned: {gone}"
    );
}

#[test]
fn a_map_applied_empty_then_with_entries_keeps_them() {
    let mut empty = sts(json!({"serviceName": "x"}));
    empty["metadata"]["labels"] = json!({});
    let first = apply(None, empty, &req("ctl")).unwrap();
    let mut filled = sts(json!({"serviceName": "x"}));
    filled["metadata"]["labels"] = json!({"a": "1"});
    let next = apply(Some(&first), filled, &req("ctl")).unwrap();
    assert_eq!(next["metadata"]["labels"], json!({"a": "1"}), "{next}");
}

#[test]
fn two_managers_share_a_field() {
    let a = apply(None, sts(json!({"replicas": 3})), &req("a")).unwrap();
    let b = apply(
        Some(&a),
        sts(json!({"replicas": 3, "serviceName": "x"})),
        &req("b"),
    )
    .unwrap();
    assert_eq!(owned(&b, "a"), vec![".spec.replicas"]);
    assert_eq!(owned(&b, "b"), vec![".spec.replicas", ".spec.serviceName"]);
    // `a` stops applying replicas: `b` still owns it, so it stays.
    let a2 = apply(Some(&b), sts(json!({"minReadySeconds": 1})), &req("a")).unwrap();
    assert_eq!(a2["spec"]["replicas"], 3);
    assert_eq!(owned(&a2, "a"), vec![".spec.minReadySeconds"]);
    // Changing a shared field conflicts with the other applier (no "using" for appliers).
    let err = apply(Some(&b), sts(json!({"replicas": 4})), &req("a")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"b\": .spec.replicas"
    );
}

fn created_by_update() -> Value {
    let mut obj = sts(json!({"replicas": 1, "serviceName": "svc"}));
    record_update(
        None,
        &mut obj,
        "kubectl-client-side-apply",
        "apps/v1",
        None,
        T1,
        &BuiltinLists,
    );
    obj
}

#[test]
fn conflict_with_update_manager() {
    let live = created_by_update();
    let err = apply(Some(&live), sts(json!({"replicas": 2})), &req("ssa")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
    );
    let PatchError::Conflict { conflicts } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        conflicts[0].cause_message(),
        "conflict with \"kubectl-client-side-apply\" using apps/v1"
    );
    let err = apply(
        Some(&live),
        sts(json!({"replicas": 2, "serviceName": "o"})),
        &req("ssa"),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 2 conflicts: conflicts with \"kubectl-client-side-apply\" using apps/v1:\n- .spec.replicas\n- .spec.serviceName"
    );
    // Same value: no conflict, shared ownership.
    let shared = apply(Some(&live), sts(json!({"replicas": 1})), &req("ssa")).unwrap();
    assert_eq!(
        owned(&shared, "kubectl-client-side-apply"),
        vec![".spec.replicas", ".spec.serviceName"]
    );
}

#[test]
fn force_takes_ownership() {
    let live = created_by_update();
    let forced = ApplyRequest {
        force: true,
        time: T2,
        ..req("ssa")
    };
    let obj = apply(Some(&live), sts(json!({"replicas": 2})), &forced).unwrap();
    assert_eq!(obj["spec"]["replicas"], 2);
    assert_eq!(owned(&obj, "ssa"), vec![".spec.replicas"]);
    assert_eq!(
        owned(&obj, "kubectl-client-side-apply"),
        vec![".spec.serviceName"]
    );
    let ops: Vec<&Value> = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["operation"])
        .collect();
    assert_eq!(ops, vec!["Apply", "Update"], "apply entries sort first");
}

#[test]
fn status_subresource_apply_leaves_spec_alone() {
    let live = apply(None, sts(json!({"replicas": 1})), &req("ctl")).unwrap();
    let mut cfg = sts(json!({"replicas": 9}));
    cfg["status"] = json!({"readyReplicas": 1});
    let status_req = ApplyRequest {
        subresource: Some("status"),
        ..req("ctrl")
    };
    let obj = apply(Some(&live), cfg.clone(), &status_req).unwrap();
    assert_eq!(obj["spec"]["replicas"], 1);
    assert_eq!(obj["status"]["readyReplicas"], 1);
    let e = entry(&obj, "ctrl").unwrap();
    assert_eq!(e["subresource"], "status");
    assert_eq!(e["fieldsV1"], json!({"f:status": {"f:readyReplicas": {}}}));
    assert!(entry(&obj, "ctl").unwrap().get("subresource").is_none());
    // The main resource ignores status in the applied configuration.
    let main = apply(Some(&obj), cfg, &req("ctl2")).unwrap_err();
    assert_eq!(
        main.to_string(),
        "Apply failed with 1 conflict: conflict with \"ctl\": .spec.replicas"
    );
    let bad = ApplyRequest {
        subresource: Some("scale"),
        ..req("x")
    };
    assert_eq!(
        apply(Some(&obj), json!({}), &bad),
        Err(PatchError::UnsupportedSubresource("scale".into()))
    );
}

#[test]
fn conditions_owned_per_element() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let status = |conds: Value| {
        let mut p = pod.clone();
        p["status"] = json!({"conditions": conds});
        p
    };
    let sub = |m| ApplyRequest {
        subresource: Some("status"),
        api_version: "v1",
        ..req(m)
    };
    let a = apply(
        Some(&pod),
        status(json!([{"type": "Ready", "status": "True"}])),
        &sub("kubelet"),
    )
    .unwrap();
    let b = apply(
        Some(&a),
        status(json!([{"type": "Synced", "status": "False"}])),
        &sub("ctrl"),
    )
    .unwrap();
    assert_eq!(
        b["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}])
    );
    assert_eq!(
        owned(&b, "ctrl"),
        vec![
            ".status.conditions[type=\"Synced\"]",
            ".status.conditions[type=\"Synced\"].status",
            ".status.conditions[type=\"Synced\"].type"
        ]
    );
    let err = apply(
        Some(&b),
        status(json!([{"type": "Ready", "status": "False"}])),
        &sub("ctrl"),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains(".status.conditions[type=\"Ready\"].status"),
        "{err}"
    );
    // kubelet drops its condition: only that element goes away.
    let c = apply(Some(&b), status(json!([])), &sub("kubelet")).unwrap();
    assert_eq!(
        c["status"]["conditions"],
        json!([{"type": "Synced", "status": "False"}])
    );
    assert!(entry(&c, "kubelet").is_none(), "empty entry dropped");
}

#[test]
fn containers_shared_by_two_appliers() {
    let spec = |c: Value| sts(json!({"template": {"spec": {"containers": [c]}}}));
    let a = apply(
        None,
        spec(json!({"name": "app", "image": "i:1"})),
        &req("a"),
    )
    .unwrap();
    let b = apply(
        Some(&a),
        spec(json!({"name": "app", "env": [{"name": "X", "value": "1"}]})),
        &req("b"),
    )
    .unwrap();
    let c = &b["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        c,
        &json!([{"name": "app", "image": "i:1", "env": [{"name": "X", "value": "1"}]}])
    );
    // `a` stops applying the container: its image goes, the element `b` still uses stays.
    let a2 = apply(Some(&b), sts(json!({})), &req("a")).unwrap();
    let c = &a2["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        c,
        &json!([{"name": "app", "env": [{"name": "X", "value": "1"}]}])
    );
}

#[test]
fn list_merge_order_follows_smd() {
    let spec = |names: &[&str]| {
        let cs: Vec<Value> = names.iter().map(|n| json!({"name": n})).collect();
        sts(json!({"template": {"spec": {"containers": cs}}}))
    };
    let mut live = spec(&["a", "b", "c"]);
    record_update(None, &mut live, "other", "apps/v1", None, T1, &BuiltinLists);
    let obj = apply(Some(&live), spec(&["c", "new", "a"]), &req("me")).unwrap();
    let names: Vec<&Value> = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["name"])
        .collect();
    assert_eq!(names, vec!["b", "c", "new", "a"]);
}

#[test]
fn record_update_moves_ownership() {
    let live = apply(
        None,
        sts(json!({"replicas": 1, "serviceName": "x"})),
        &req("ssa"),
    )
    .unwrap();
    let mut edited = live.clone();
    edited["spec"]["replicas"] = json!(5);
    record_update(
        Some(&live),
        &mut edited,
        "kubectl-edit",
        "apps/v1",
        None,
        T2,
        &BuiltinLists,
    );
    assert_eq!(owned(&edited, "ssa"), vec![".spec.serviceName"]);
    assert_eq!(owned(&edited, "kubectl-edit"), vec![".spec.replicas"]);
    let e = entry(&edited, "kubectl-edit").unwrap();
    assert_eq!(
        (&e["operation"], &e["time"]),
        (&json!("Update"), &json!(T2))
    );
    // Taking the last field of a manager drops its entry; removed fields are disowned.
    let mut again = edited.clone();
    again["spec"]["serviceName"] = json!("y");
    again["spec"].as_object_mut().unwrap().remove("replicas");
    record_update(
        Some(&edited),
        &mut again,
        "kubectl-edit",
        "apps/v1",
        None,
        T2,
        &BuiltinLists,
    );
    assert!(entry(&again, "ssa").is_none());
    assert_eq!(owned(&again, "kubectl-edit"), vec![".spec.serviceName"]);
    // No change: managedFields untouched.
    let mut same = again.clone();
    record_update(
        Some(&again),
        &mut same,
        "other",
        "apps/v1",
        None,
        T1,
        &BuiltinLists,
    );
    assert_eq!(same, again);
}

#[test]
fn record_update_on_create_owns_everything_but_server_fields() {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    record_update(
        None,
        &mut pod,
        "kubectl-create",
        "v1",
        None,
        T1,
        &BuiltinLists,
    );
    assert_eq!(
        entry(&pod, "kubectl-create").unwrap()["fieldsV1"],
        json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:containers": {
            "k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}}}})
    );
    let mut not_obj = json!(3);
    record_update(None, &mut not_obj, "x", "v1", None, T1, &BuiltinLists);
    assert_eq!(not_obj, json!(3));
}

#[test]
fn apply_input_errors() {
    assert!(matches!(
        apply(None, json!([1]), &req("x")),
        Err(PatchError::NotAnObject {
            what: "applied configuration",
            ..
        })
    ));
    assert!(apply(Some(&json!("s")), json!({}), &req("x")).is_err());
    // Broken managedFields entries are dropped, not fatal.
    let mut live = sts(json!({"replicas": 1}));
    live["metadata"]["managedFields"] = json!([{"manager": "m", "fieldsV1": {"bogus": {}}}, 7]);
    let obj = apply(Some(&live), sts(json!({"replicas": 2})), &req("x")).unwrap();
    assert_eq!(
        obj["metadata"]["managedFields"].as_array().unwrap().len(),
        1
    );
}

#[test]
fn crd_schema_map_list_per_element_ownership() {
    let lists = crate::patch::SchemaLists(json!({"openAPIV3Schema": {"type": "object",
        "properties": {"spec": {"type": "object", "properties": {"pools": {
            "type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["id"], "items": {"type": "object"}}}}}}}));
    let cr = |pools: Value| {
        json!({"apiVersion": "ipkeep.io/v1", "kind": "Pool", "metadata": {"name": "p"},
            "spec": {"pools": pools}})
    };
    let r = |m| ApplyRequest {
        api_version: "ipkeep.io/v1",
        ..req(m)
    };
    let a = server_side_apply(
        None,
        &cr(json!([{"id": 1, "cidr": "10.0.0.0/8"}])),
        &r("a"),
        &lists,
    )
    .unwrap();
    let b = server_side_apply(
        Some(&a),
        &cr(json!([{"id": 2, "cidr": "fd00::/8"}])),
        &r("b"),
        &lists,
    )
    .unwrap();
    assert_eq!(b["spec"]["pools"].as_array().unwrap().len(), 2);
    assert_eq!(owned(&b, "b")[0], ".spec.pools[id=2]");
}
