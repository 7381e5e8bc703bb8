//! The plan against the webhook's own edit of the same pods: for each template shape, a pod
//! created under a recorded name gets from the plan what the webhook gives it.

use serde_json::{Value, json};

use ipkeep_api::k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use ipkeep_api::{AdmissionPlan, PersistentPodState};
use ipkeep_values::keys::{
    IP_RETENTION, PERSISTENT_POD_STATE, PIN_SKIPPED, PINNED_BY, READINESS_GATE, STATE_LABEL,
};

use super::{PlanTarget, plan};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

/// PersistentPodState `db` for StatefulSet `db` (UID `sts-uid`): required hostname, preferred
/// zone (weight 60), records for `db-0` (node n1, zone a) and `db-1` (node n2, no zone label).
fn pps(extra_spec: Value) -> PersistentPodState {
    let mut v = json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db", "namespace": "prod"},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": [HOST]},
            "preferredPersistentTopology": [{"weight": 60, "preference": {"nodeTopologyKeys": [ZONE]}}],
            "ipRetention": "2h"
        },
        "status": {"targetUID": "sts-uid", "podStates": {
            "db-0": {"nodeName": "n1", "nodeTopologyLabels": {HOST: "n1", ZONE: "a"}},
            "db-1": {"nodeName": "n2", "nodeTopologyLabels": {HOST: "n2"}}
        }}
    });
    if let (Value::Object(spec), Value::Object(extra)) = (&mut v["spec"], extra_spec) {
        spec.extend(extra);
    }
    serde_json::from_value(v).unwrap()
}

fn template(t: Value) -> PodTemplateSpec {
    let mut base = json!({"spec": {"containers": [{"name": "db", "image": "postgres"}]}});
    if let (Value::Object(a), Value::Object(b)) = (&mut base, t) {
        for (k, v) in b {
            match (a.get_mut(&k), v) {
                (Some(Value::Object(into)), Value::Object(from)) => into.extend(from),
                (_, v) => {
                    a.insert(k, v);
                }
            }
        }
    }
    serde_json::from_value(base).unwrap()
}

fn plan_of(pps: &PersistentPodState, t: &PodTemplateSpec) -> Option<AdmissionPlan> {
    plan(
        pps,
        "prod",
        PlanTarget {
            name: "db",
            uid: "sts-uid",
            template: t,
        },
    )
}

fn map(v: Value) -> std::collections::BTreeMap<String, String> {
    serde_json::from_value(v).unwrap()
}

#[test]
fn recorded_pods_get_their_pin_and_every_pod_the_retention() {
    let plan = plan_of(&pps(json!({})), &template(json!({}))).unwrap();
    assert_eq!(plan.stateful_set_uid, "sts-uid");
    assert_eq!(
        plan.annotations,
        map(json!({PERSISTENT_POD_STATE: "db", IP_RETENTION: "2h"}))
    );
    assert!(plan.labels.is_empty() && plan.readiness_gates.is_empty());
    let db0 = &plan.pods["db-0"];
    assert_eq!(db0.annotations, map(json!({PINNED_BY: "db"})));
    assert_eq!(db0.node_selector, map(json!({HOST: "n1"})));
    assert_eq!(
        serde_json::to_value(&db0.preferred).unwrap(),
        json!([{"weight": 60, "preference": {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]}}])
    );
    // No zone recorded for db-1: the required pin only.
    let db1 = &plan.pods["db-1"];
    assert_eq!(db1.node_selector, map(json!({HOST: "n2"})));
    assert!(db1.preferred.is_empty());
    assert_eq!(plan.pods.len(), 2);
}

#[test]
fn a_template_that_excludes_the_record_gets_the_skip_said_not_the_pin() {
    let t = template(json!({"spec": {"nodeSelector": {HOST: "n9"}}}));
    let plan = plan_of(&pps(json!({})), &t).unwrap();
    let db0 = &plan.pods["db-0"];
    assert!(db0.node_selector.is_empty() && db0.preferred.is_empty());
    assert!(
        db0.annotations[PIN_SKIPPED].contains("spec.nodeSelector requires"),
        "{:?}",
        db0.annotations
    );
    assert!(!db0.annotations.contains_key(PINNED_BY));
}

#[test]
fn a_readable_retention_of_the_template_is_kept_an_unreadable_one_replaced() {
    let own = plan_of(
        &pps(json!({})),
        &template(json!({"metadata": {"annotations": {IP_RETENTION: "30m"}}})),
    )
    .unwrap();
    assert_eq!(own.annotations, map(json!({PERSISTENT_POD_STATE: "db"})));
    let unreadable = plan_of(
        &pps(json!({})),
        &template(json!({"metadata": {"annotations": {IP_RETENTION: "soon"}}})),
    )
    .unwrap();
    assert_eq!(unreadable.annotations[IP_RETENTION], "2h");
}

#[test]
fn hooks_give_every_pod_the_state_label_and_the_readiness_gate() {
    let hooks =
        json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}});
    let plan = plan_of(&pps(hooks), &template(json!({}))).unwrap();
    assert!(plan.labels.contains_key(STATE_LABEL), "{:?}", plan.labels);
    assert_eq!(plan.readiness_gates, vec![READINESS_GATE.to_string()]);
}

#[test]
fn an_invalid_spec_marks_every_pod_skipped_and_pins_none() {
    let plan = plan_of(&pps(json!({"ipRetention": "soon"})), &template(json!({}))).unwrap();
    assert!(
        plan.annotations[PIN_SKIPPED].contains("invalid"),
        "{:?}",
        plan.annotations
    );
    assert!(plan.pods.values().all(|p| p.node_selector.is_empty()));
}

#[test]
fn no_plan_for_a_persistent_pod_state_being_deleted_or_of_another_statefulset() {
    let mut deleting = pps(json!({}));
    deleting.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2026-11-27T00:00:00Z")).unwrap());
    assert_eq!(plan_of(&deleting, &template(json!({}))), None);
    let other =
        pps(json!({"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web"}}));
    assert_eq!(plan_of(&other, &template(json!({}))), None);
}

/// The pod the webhook admits, for comparison: the plan must give the same annotations, labels
/// and gates, and the same pin (required in the node selector instead of every term).
fn webhook_pod(pps: &PersistentPodState, t: &PodTemplateSpec, name: &str) -> Pod {
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "sts-uid", "controller": true}],
        },
    }))
    .unwrap();
    pod.metadata.labels = t.metadata.as_ref().and_then(|m| m.labels.clone());
    pod.metadata.annotations = t.metadata.as_ref().and_then(|m| m.annotations.clone());
    pod.spec = t.spec.clone();
    let crate::pin::Decision::Manage(managed) = crate::pin::decide(&pod, "prod", Some(pps)) else {
        panic!("not managed");
    };
    crate::affinity::apply(&managed, &mut pod);
    crate::lifecycle::apply_at_create(&managed.lifecycle, &mut pod);
    pod
}

#[test]
fn the_plan_gives_what_the_webhook_gives() {
    let hooks =
        json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}});
    for (spec, t) in [
        (json!({}), json!({})),
        (hooks, json!({"metadata": {"labels": {"app": "db"}}})),
        (json!({}), json!({"spec": {"nodeSelector": {HOST: "n9"}}})),
    ] {
        let pps = pps(spec);
        let t = template(t);
        let plan = plan_of(&pps, &t).unwrap();
        for name in ["db-0", "db-1", "db-7"] {
            let web = webhook_pod(&pps, &t, name);
            let entry = plan.pods.get(name).cloned().unwrap_or_default();
            let mut annotations = t
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone())
                .unwrap_or_default();
            annotations.extend(plan.annotations.clone());
            annotations.extend(entry.annotations.clone());
            assert_eq!(Some(annotations), web.metadata.annotations, "{name}");
            let required: Vec<(String, String)> = web
                .spec
                .as_ref()
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|r| {
                    r.node_selector_terms[0]
                        .match_expressions
                        .iter()
                        .flatten()
                        .map(|e| (e.key.clone(), e.values.clone().unwrap()[0].clone()))
                        .collect()
                })
                .unwrap_or_default();
            let in_selector: Vec<(String, String)> = entry.node_selector.into_iter().collect();
            assert_eq!(required, in_selector, "{name}");
        }
    }
}

#[test]
fn without_its_statefulset_a_plan_marks_every_pod_and_pins_none() {
    let hooks =
        json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}});
    let plan = super::plan_without_target(&pps(hooks), "prod").unwrap();
    assert_eq!(plan.stateful_set_uid, "");
    assert_eq!(plan.annotations, map(json!({PERSISTENT_POD_STATE: "db"})));
    assert_eq!(plan.readiness_gates, vec![READINESS_GATE.to_string()]);
    assert!(plan.pods.is_empty());
}
