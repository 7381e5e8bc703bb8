//! The plan against the webhook's own edit of the same pods: for each template shape, a pod
//! created under a recorded name gets from the plan what the webhook gives it.

use serde_json::{Value, json};

use ipkeep_api::PersistentPodState;
use ipkeep_api::k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use ipkeep_values::keys::{
    IP_RETENTION, PERSISTENT_POD_STATE, PIN_SKIPPED, PINNED_BY, READINESS_GATE, STATE_LABEL,
};

use super::{
    AdmissionPlan, MAX_DECIDED_ON, PLAN_BUDGET, PlanTarget, PodPlan, encode, node_constraints, plan,
};
use crate::pinned::{PreferredTerm, Requirement};

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
        pps.into(),
        "prod",
        PlanTarget {
            workload: ipkeep_api::statefulset::Workload::Native,
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
    assert_eq!(plan.persistent_pod_state, "db");
    assert_eq!(
        plan.pods["db-0"],
        PodPlan::Pinned {
            required: vec![req(HOST, "n1")],
            preferred: vec![PreferredTerm {
                weight: 60,
                requirements: vec![req(ZONE, "a")]
            }],
        }
    );
    // No zone recorded for db-1: the required pin only.
    assert_eq!(
        plan.pods["db-1"],
        PodPlan::Pinned {
            required: vec![req(HOST, "n2")],
            preferred: vec![],
        }
    );
    assert_eq!(plan.pods.len(), 2);
}

#[test]
fn a_template_that_excludes_the_record_gets_the_skip_said_not_the_pin() {
    let t = template(json!({"spec": {"nodeSelector": {HOST: "n9"}}}));
    let plan = plan_of(&pps(json!({})), &t).unwrap();
    let PodPlan::Skipped(why) = &plan.pods["db-0"] else {
        panic!("{:?}", plan.pods["db-0"]);
    };
    assert!(why.contains("spec.nodeSelector requires"), "{why}");
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
    assert!(
        plan.pods.is_empty(),
        "said once, for every pod: {:?}",
        plan.pods
    );
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
            let entry = plan.pods.get(name);
            let mut annotations = t
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone())
                .unwrap_or_default();
            annotations.extend(plan.annotations.clone());
            match entry {
                Some(PodPlan::Pinned { .. }) => {
                    annotations.insert(PINNED_BY.into(), plan.persistent_pod_state.clone());
                }
                Some(PodPlan::Skipped(why)) => {
                    annotations.insert(PIN_SKIPPED.into(), why.clone());
                }
                None => {}
            }
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
            let in_selector: Vec<(String, String)> = match entry {
                Some(PodPlan::Pinned { required, .. }) => required
                    .iter()
                    .map(|r| (r.key.clone(), r.value.clone()))
                    .collect(),
                _ => vec![],
            };
            assert_eq!(required, in_selector, "{name}");
        }
    }
}

fn req(key: &str, value: &str) -> Requirement {
    Requirement {
        key: key.into(),
        value: value.into(),
    }
}

/// The canonical line of each kind of node constraint, as the policy computes it from a pod.
#[test]
fn node_constraints_have_one_canonical_form() {
    let spec = |t: Value| template(json!({"spec": t})).spec;
    assert_eq!(node_constraints(spec(json!({})).as_ref()), "\n\n");
    assert_eq!(node_constraints(None), "\n\n");
    // Sorted as `key=value` strings (what CEL's sort() of the pairs gives), not by key.
    assert_eq!(
        node_constraints(
            spec(json!({"nodeName": "n1", "nodeSelector": {"a": "x", "a.b": "y"}})).as_ref()
        ),
        "n1\na.b=y,a=x\n"
    );
    let required = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a", "b"]},
                              {"key": "gpu", "operator": "Exists"}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n3"]}]}
    ]}}}});
    assert_eq!(
        node_constraints(spec(required).as_ref()),
        format!("\n\n{ZONE} In a b;gpu Exists#|#metadata.name NotIn n3")
    );
}

/// A template with more node constraints than the policy compares gets the marks every pod
/// gets, no pin, and a condition that says so.
#[test]
fn a_template_with_too_many_node_constraints_gets_no_pins() {
    let values: Vec<String> = (0..500).map(|i| format!("node-{i:04}")).collect();
    let t = template(
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": HOST, "operator": "In", "values": values}]}]}}}}}),
    );
    assert!(node_constraints(t.spec.as_ref()).len() > MAX_DECIDED_ON);
    let plan = plan_of(&pps(json!({})), &t).unwrap();
    assert!(plan.constraints_too_large);
    assert!(plan.pods.is_empty() && plan.decided_on.is_empty());
    assert_eq!(plan.annotations[PERSISTENT_POD_STATE], "db");
}

/// The entries of one StatefulSet's plan, exactly as the policy parses them.
#[test]
fn a_plan_is_encoded_as_the_policy_reads_it() {
    let hooks =
        json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}});
    let mut p = plan_of(&pps(hooks), &template(json!({}))).unwrap();
    p.pods
        .insert("db-2".into(), PodPlan::Skipped("line one\nline two".into()));
    let encoded = encode(&[p], PLAN_BUDGET);
    assert!(encoded.omitted.is_empty());
    let want: std::collections::BTreeMap<String, String> = [
        ("uid.db", "sts-uid"),
        ("pps.db", "db"),
        (
            "ann.db",
            "ipkeep.dev/ip-retention=2h\nipkeep.dev/persistent-pod-state=db",
        ),
        ("lab.db", "ipkeep.dev/lifecycle-state=PreparingNormal"),
        ("gate.db", READINESS_GATE),
        ("on.db", "\n\n"),
        (
            "keys.db",
            "kubernetes.io/hostname,topology.kubernetes.io/zone",
        ),
        ("pod.db-0", "0=n1|60:1=a"),
        ("pod.db-1", "0=n2|"),
        ("pod.db-2", "!line one line two"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(encoded.data, want);
}

/// Over the budget, whole StatefulSets lose their per-pod entries, the largest first, and keep
/// what every pod gets.
#[test]
fn over_the_budget_the_largest_statefulsets_lose_their_pins() {
    let many = |name: &str, pods: usize| AdmissionPlan {
        persistent_pod_state: name.into(),
        stateful_set: name.into(),
        stateful_set_uid: format!("{name}-uid"),
        pods: (0..pods)
            .map(|i| {
                (
                    format!("{name}-{i}"),
                    PodPlan::Pinned {
                        required: vec![req(HOST, &format!("node-{i:05}"))],
                        preferred: vec![],
                    },
                )
            })
            .collect(),
        ..AdmissionPlan::default()
    };
    let plans = [many("big", 200), many("small", 10), many("mid", 50)];
    let all = encode(&plans, PLAN_BUDGET);
    assert!(all.omitted.is_empty());
    let used = |d: &std::collections::BTreeMap<String, String>| -> usize {
        d.iter().map(|(k, v)| k.len() + v.len()).sum()
    };
    let budget = used(&all.data) - 1;
    let cut = encode(&plans, budget);
    assert_eq!(cut.omitted, vec!["big".to_string()]);
    assert!(used(&cut.data) <= budget);
    assert_eq!(cut.data["uid.big"], "big-uid");
    assert!(!cut.data.contains_key("pod.big-0") && cut.data.contains_key("pod.mid-0"));
    let nothing = encode(&plans, 10);
    assert!(nothing.data.is_empty());
    assert_eq!(nothing.omitted.len(), 3);
}

/// The pending label's rule, as the admission policy `ipkeep-admission-pending` has it: a
/// PersistentPodState created with hooks, or whose hooks change.
#[test]
fn hooks_new_or_changed_make_a_persistent_pod_state_pending() {
    let hooks = |v: &str| -> ipkeep_api::LifecycleSpec {
        serde_json::from_value(
            json!({"preNormal": {"labelsHandler": {"example.com/registered": v}}}),
        )
        .unwrap()
    };
    let (a, b) = (hooks("true"), hooks("yes"));
    assert!(super::gets_hooks(true, None, Some(&a)));
    assert!(!super::gets_hooks(true, None, None));
    assert!(super::gets_hooks(false, None, Some(&a)));
    assert!(super::gets_hooks(false, Some(&a), Some(&b)));
    assert!(!super::gets_hooks(false, Some(&a), Some(&a)));
    assert!(!super::gets_hooks(false, Some(&a), None));
}
