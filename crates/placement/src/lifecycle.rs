//! `spec.lifecycle` (and the StatefulSet annotation that generates it) read into the hooks'
//! state machine ([`ipkeep_lifecycle::Lifecycle`]), refusing what the webhook could not apply: a
//! pod created with a label the API server rejects would never be created at all.

use std::collections::BTreeMap;

use ipkeep_api::LifecycleSpec;
use ipkeep_api::k8s_openapi::api::apps::v1::StatefulSet;
use ipkeep_api::k8s_openapi::api::core::v1::{Pod, PodReadinessGate, PodSpec, PodStatus};
use ipkeep_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use ipkeep_lifecycle::going::{MaxUnavailable, Member, Rolling, SetFacts, resolve_max_unavailable};
use ipkeep_lifecycle::{Going, Hook, Lifecycle, PodFacts, State, at_create};
use ipkeep_values::keys::{
    HELD_ANNOTATION, HELD_CONDITION, POD_INDEX_LABEL, READINESS_GATE, REVISION_LABEL,
    SINCE_ANNOTATION, STATE_LABEL,
};
use ipkeep_values::ordinal;

use crate::label_syntax::{check_label_key, check_label_value};
use crate::spec_error::SpecError;
use crate::view::terminating;

/// The hooks of `spec` (none when `spec.lifecycle` is absent).
pub fn read(spec: Option<&LifecycleSpec>) -> Result<Lifecycle, SpecError> {
    let Some(spec) = spec else {
        return Ok(Lifecycle::default());
    };
    let pre_normal = spec
        .pre_normal
        .as_ref()
        .map(|h| hook("preNormal", &h.labels_handler, h.mark_pod_not_ready))
        .transpose()?;
    let (pre_delete, timeout) = match &spec.pre_delete {
        None => (None, ipkeep_lifecycle::DEFAULT_PRE_DELETE_TIMEOUT_SECS),
        Some(h) => {
            let timeout = u64::try_from(h.timeout_seconds)
                .ok()
                .filter(|t| *t > 0)
                .ok_or_else(|| {
                    SpecError::InvalidLifecycle(format!(
                        "preDelete.timeoutSeconds is {}; give a positive number of seconds",
                        h.timeout_seconds
                    ))
                })?;
            (
                Some(hook("preDelete", &h.labels_handler, h.mark_pod_not_ready)?),
                timeout,
            )
        }
    };
    Ok(Lifecycle {
        pre_normal,
        pre_delete,
        pre_delete_timeout: timeout,
    })
}

fn hook(name: &str, labels: &BTreeMap<String, String>, mark: bool) -> Result<Hook, SpecError> {
    if labels.is_empty() {
        return Err(SpecError::InvalidLifecycle(format!(
            "{name}.labelsHandler is empty; give at least one label"
        )));
    }
    for (key, value) in labels {
        check_label_key(key).map_err(|why| {
            SpecError::InvalidLifecycle(format!("{name}.labelsHandler key {key:?}: {why}"))
        })?;
        check_label_value(value).map_err(|why| {
            SpecError::InvalidLifecycle(format!(
                "{name}.labelsHandler value {value:?} of {key:?}: {why}"
            ))
        })?;
    }
    Ok(Hook {
        labels: labels.clone(),
        mark_pod_not_ready: mark,
    })
}

/// Writes into a new pod what the hooks give it at creation: the state label and the readiness
/// gate. Applying it twice changes nothing.
pub fn apply_at_create(lifecycle: &Lifecycle, pod: &mut Pod) {
    let got = at_create(lifecycle);
    if let Some(state) = got.state {
        pod.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(STATE_LABEL.to_string(), state.as_str().to_string());
    }
    if got.readiness_gate {
        let gates = pod
            .spec
            .get_or_insert_with(Default::default)
            .readiness_gates
            .get_or_insert_with(Vec::new);
        if !gates.iter().any(|g| g.condition_type == READINESS_GATE) {
            gates.push(PodReadinessGate {
                condition_type: READINESS_GATE.to_string(),
            });
        }
    }
}

/// What the hooks' decisions read of `pod`, for the controller's loop and the webhook's
/// deletion review alike; `node_ready` is whether its node is Ready (false when unbound,
/// NotReady or gone), from the caller's node cache. The hold's start comes from the pod's
/// status (the condition [`HELD_CONDITION`]), which whoever may only patch the pod cannot write.
pub fn pod_facts(pod: &Pod, node_ready: bool) -> PodFacts<'_> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    let annotation = |key: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    PodFacts {
        labels: pod.metadata.labels.as_ref().unwrap_or(&EMPTY),
        held_since: held_since(pod),
        since_annotation: annotation(SINCE_ANNOTATION).and_then(|s| s.trim().parse().ok()),
        terminating: terminating(
            pod.metadata.deletion_timestamp.is_some(),
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        ),
        node_ready,
        gated: gated(pod),
        held: annotation(HELD_ANNOTATION).map(Going::parse),
    }
}

/// When ipkeep-controller began to hold `pod`: the `lastTransitionTime` of its condition
/// [`HELD_CONDITION`] while that is True (a time before 1970 reads as 0).
pub fn held_since(pod: &Pod) -> Option<u64> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == HELD_CONDITION))
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| u64::try_from(t.0.as_second()).unwrap_or(0))
}

/// Whether `pod`'s spec has the readiness gate [`READINESS_GATE`] (only the webhook adds it,
/// at CREATE).
pub fn gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.condition_type == READINESS_GATE))
}

/// Keeps what the hooks' decisions read of a pod, for the caches of the webhook and the
/// controller: identity, labels, owners, the two lifecycle annotations, deletion, node,
/// readiness gates, phase, the gate's condition and the hold's.
pub fn trim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.annotations = meta.annotations.take().map(|a| {
        a.into_iter()
            .filter(|(k, _)| k == SINCE_ANNOTATION || k == HELD_ANNOTATION)
            .collect()
    });
    pod.spec = pod.spec.take().map(|s| PodSpec {
        node_name: s.node_name,
        readiness_gates: s.readiness_gates,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == READINESS_GATE || c.type_ == HELD_CONDITION)
                .collect()
        }),
        ..PodStatus::default()
    });
}

/// What the StatefulSet controller acts on, read from a StatefulSet as the API server has it;
/// `None` while its status has not caught up with its spec (`status.observedGeneration` below
/// `metadata.generation`): which revision it rolls to is not known yet.
pub fn set_facts(sts: &StatefulSet) -> Option<SetFacts> {
    let spec = sts.spec.as_ref()?;
    let status = sts.status.as_ref()?;
    if status.observed_generation.unwrap_or(0) < sts.metadata.generation.unwrap_or(0) {
        return None;
    }
    let count = |n: Option<i32>, default: u32| n.map_or(default, |n| u32::try_from(n).unwrap_or(0));
    let replicas = count(spec.replicas, 1);
    let strategy = spec.update_strategy.as_ref();
    let on_delete = strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete");
    let rolling_update = strategy.and_then(|s| s.rolling_update.as_ref());
    let rolling = status
        .update_revision
        .as_ref()
        .filter(|r| !r.is_empty() && !on_delete)
        .map(|revision| Rolling {
            update_revision: revision.clone(),
            partition: count(rolling_update.and_then(|r| r.partition), 0),
            max_unavailable: resolve_max_unavailable(
                rolling_update
                    .and_then(|r| r.max_unavailable.as_ref())
                    .and_then(max_unavailable)
                    .as_ref(),
                replicas,
            ),
        });
    Some(SetFacts {
        replicas,
        ordinals_start: count(spec.ordinals.as_ref().and_then(|o| o.start), 0),
        parallel: spec.pod_management_policy.as_deref() == Some("Parallel"),
        rolling,
    })
}

/// `maxUnavailable` as written: a number, or `N%` (the API server refuses anything else).
fn max_unavailable(value: &IntOrString) -> Option<MaxUnavailable> {
    match value {
        IntOrString::Int(n) => u32::try_from(*n).ok().map(MaxUnavailable::Count),
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.trim().parse().ok())
            .map(MaxUnavailable::Percent),
    }
}

/// One pod of StatefulSet `statefulset` as [`ipkeep_lifecycle::going`] reads it; `None` for a
/// pod whose name carries no ordinal of it.
pub fn member(
    name: &str,
    statefulset: &str,
    labels: Option<&BTreeMap<String, String>>,
    terminating: bool,
    ready: bool,
) -> Option<Member> {
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    Some(Member {
        ordinal: ordinal::of_pod(name, statefulset, label(POD_INDEX_LABEL))?,
        revision: label(REVISION_LABEL).map(str::to_string),
        terminating,
        ready,
        held: label(STATE_LABEL) == Some(State::PreparingDelete.as_str()),
    })
}

/// The fields `spec.lifecycle` has, by level (a misspelt field in an annotation is refused
/// rather than silently dropped, as the API server would).
const FIELDS: [(&str, &[&str]); 3] = [
    ("", &["preNormal", "preDelete"]),
    ("preNormal", &["labelsHandler", "markPodNotReady"]),
    (
        "preDelete",
        &["labelsHandler", "markPodNotReady", "timeoutSeconds"],
    ),
];

/// Reads the StatefulSet annotation `ipkeep.dev/lifecycle`: `spec.lifecycle` as JSON.
pub fn parse_annotation(text: &str) -> Result<LifecycleSpec, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("it is not JSON: {e}"))?;
    for (at, known) in FIELDS {
        let object = if at.is_empty() {
            Some(&value)
        } else {
            value.get(at)
        };
        let fields = object.and_then(|o| o.as_object());
        if let Some(unknown) = fields
            .into_iter()
            .flat_map(|f| f.keys())
            .find(|k| !known.contains(&k.as_str()))
        {
            let place = if at.is_empty() { "" } else { " in " };
            return Err(format!(
                "unknown field {unknown:?}{place}{at}; the fields are {}",
                known.join(", ")
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_hooks_with_their_defaults() {
        let spec = parse_annotation(
            r#"{"preNormal":{"labelsHandler":{"registry.example.com/registered":"true"}},
                "preDelete":{"labelsHandler":{"registry.example.com/registered":"true"},"markPodNotReady":true}}"#,
        )
        .unwrap();
        let lc = read(Some(&spec)).unwrap();
        let pre_normal = lc.pre_normal.unwrap();
        assert!(
            pre_normal.mark_pod_not_ready,
            "preNormal holds readiness by default"
        );
        assert_eq!(
            pre_normal
                .labels
                .get("registry.example.com/registered")
                .map(String::as_str),
            Some("true")
        );
        assert!(lc.pre_delete.unwrap().mark_pod_not_ready);
        assert_eq!(lc.pre_delete_timeout, 600);
        assert_eq!(read(None).unwrap(), Lifecycle::default());
    }

    #[test]
    fn a_new_pod_gets_its_labels_and_gate_once() {
        let lc = read(Some(
            &parse_annotation(
                r#"{"preNormal":{"labelsHandler":{"r.example.com/registered":"true"}}}"#,
            )
            .unwrap(),
        ))
        .unwrap();
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-0", "labels": {"app": "db"}},
            "spec": {"containers": [], "readinessGates": [{"conditionType": "other"}]}
        }))
        .unwrap();
        apply_at_create(&lc, &mut pod);
        let once = pod.clone();
        apply_at_create(&lc, &mut pod);
        assert_eq!(pod, once, "a reinvocation changes nothing");
        let json = serde_json::to_value(&pod).unwrap();
        assert_eq!(
            json["metadata"]["labels"],
            serde_json::json!({"app": "db", STATE_LABEL: "PreparingNormal"})
        );
        assert_eq!(
            json["spec"]["readinessGates"],
            serde_json::json!([{"conditionType": "other"}, {"conditionType": READINESS_GATE}])
        );
        // No hooks: the pod is left exactly as it is.
        let mut plain: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        apply_at_create(&Lifecycle::default(), &mut plain);
        assert_eq!(
            serde_json::to_value(&plain).unwrap()["metadata"],
            serde_json::json!({"name": "x"})
        );
        assert!(plain.spec.is_none());
    }

    #[test]
    fn refuses_what_the_webhook_could_not_apply() {
        for (text, want) in [
            (
                r#"{"preNormal":{"labelsHandler":{}}}"#,
                "preNormal.labelsHandler is empty",
            ),
            (
                r#"{"preNormal":{"labelsHandler":{"Bad Key":"x"}}}"#,
                "key \"Bad Key\"",
            ),
            (
                r#"{"preDelete":{"labelsHandler":{"a/b":"not ok"}}}"#,
                "value \"not ok\"",
            ),
            (
                r#"{"preDelete":{"labelsHandler":{"a":"b"},"timeoutSeconds":0}}"#,
                "timeoutSeconds is 0",
            ),
        ] {
            let err = read(Some(&parse_annotation(text).unwrap()))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        for (text, want) in [
            (r#"{"preNormal":"#, "not JSON"),
            (r#"{"preNormall":{}}"#, "unknown field \"preNormall\""),
            (
                r#"{"preDelete":{"labelsHandler":{"a":"b"},"timeout":5}}"#,
                "unknown field \"timeout\" in preDelete",
            ),
            (r#"{"preDelete":{"markPodNotReady":true}}"#, "labelsHandler"),
        ] {
            let err = parse_annotation(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
    #[test]
    fn a_statefulset_reads_as_its_controller_reads_it() {
        let sts = |extra: serde_json::Value| -> StatefulSet {
            let mut v = serde_json::json!({
                "metadata": {"name": "db", "generation": 3},
                "spec": {"replicas": 4, "selector": {}, "serviceName": "db", "template": {}},
                "status": {"replicas": 4, "observedGeneration": 3, "updateRevision": "db-2"}
            });
            json_merge(&mut v, extra);
            serde_json::from_value(v).unwrap()
        };
        let facts = set_facts(&sts(serde_json::json!({}))).unwrap();
        assert_eq!(
            facts,
            SetFacts {
                replicas: 4,
                ordinals_start: 0,
                parallel: false,
                rolling: Some(Rolling {
                    update_revision: "db-2".into(),
                    partition: 0,
                    max_unavailable: 1
                }),
            }
        );
        let custom = set_facts(&sts(serde_json::json!({"spec": {
            "podManagementPolicy": "Parallel", "ordinals": {"start": 5},
            "updateStrategy": {"type": "RollingUpdate",
                "rollingUpdate": {"partition": 2, "maxUnavailable": "50%"}}}})))
        .unwrap();
        assert!(custom.parallel);
        assert_eq!(custom.ordinals_start, 5);
        let rolling = custom.rolling.unwrap();
        assert_eq!((rolling.partition, rolling.max_unavailable), (2, 2));
        let on_delete = set_facts(&sts(
            serde_json::json!({"spec": {"updateStrategy": {"type": "OnDelete"}}}),
        ))
        .unwrap();
        assert_eq!(
            on_delete.rolling, None,
            "OnDelete: the controller replaces nothing"
        );
        // The status has not seen the newest spec: which revision it rolls to is not known.
        assert_eq!(
            set_facts(&sts(serde_json::json!({"metadata": {"generation": 4}}))),
            None
        );
        assert_eq!(set_facts(&sts(serde_json::json!({"status": null}))), None);
    }

    /// The facts the controller's loop and the webhook read of a pod: one definition, with
    /// "terminating" covering a finished pod as well as one being deleted.
    #[test]
    fn pod_facts_read_the_state_annotations_gate_and_end() {
        let pod = |extra: serde_json::Value| -> Pod {
            let mut v = serde_json::json!({
                "metadata": {"name": "db-0", "labels": {STATE_LABEL: "PreparingDelete"},
                    "annotations": {SINCE_ANNOTATION: " 100 ", HELD_ANNOTATION: "scale-down"}},
                "spec": {"containers": [], "readinessGates": [{"conditionType": READINESS_GATE}]},
                "status": {"phase": "Running", "conditions": [
                    {"type": READINESS_GATE, "status": "False"},
                    {"type": HELD_CONDITION, "status": "True", "lastTransitionTime": "1970-01-01T00:00:50Z"}]}
            });
            json_merge(&mut v, extra);
            serde_json::from_value(v).unwrap()
        };
        let running = pod(serde_json::json!({}));
        let facts = pod_facts(&running, false);
        assert_eq!(facts.state(), Some(State::PreparingDelete));
        assert_eq!(
            (facts.held_since, facts.since_annotation),
            (Some(50), Some(100)),
            "the start from the status; the annotation read as the pod's claim"
        );
        assert_eq!(facts.hold_start(1000), Some(50));
        for (case, condition) in [
            (
                "a hold that ended",
                serde_json::json!({"type": HELD_CONDITION, "status": "False",
                "lastTransitionTime": "1970-01-01T00:00:50Z"}),
            ),
            (
                "another condition",
                serde_json::json!({"type": "Ready", "status": "True",
                "lastTransitionTime": "1970-01-01T00:00:50Z"}),
            ),
        ] {
            let other = pod(serde_json::json!({"status": {"conditions": [condition]}}));
            assert_eq!(held_since(&other), None, "{case}");
        }
        assert_eq!(facts.held, Some(Going::ScaleDown));
        assert!(facts.gated && !facts.terminating && !facts.node_ready);
        assert!(pod_facts(&running, true).node_ready);
        for (case, extra) in [
            (
                "deleting",
                serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
            (
                "succeeded",
                serde_json::json!({"status": {"phase": "Succeeded"}}),
            ),
            ("failed", serde_json::json!({"status": {"phase": "Failed"}})),
        ] {
            assert!(pod_facts(&pod(extra), true).terminating, "{case}");
        }
        let bare: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        let facts = pod_facts(&bare, true);
        assert!(facts.labels.is_empty() && facts.held.is_none());
        assert!(facts.held_since.is_none() && facts.since_annotation.is_none());
        assert!(!facts.gated && !facts.terminating);
    }

    #[test]
    fn a_member_is_read_from_its_name_labels_and_state() {
        let labels: BTreeMap<String, String> = [
            (REVISION_LABEL.to_string(), "db-1".to_string()),
            (STATE_LABEL.to_string(), "PreparingDelete".to_string()),
        ]
        .into();
        let m = member("db-3", "db", Some(&labels), false, true).unwrap();
        assert_eq!(
            (m.ordinal, m.revision.as_deref(), m.held, m.ready),
            (3, Some("db-1"), true, true)
        );
        assert!(member("db-x", "db", None, false, true).is_none());
        assert!(member("web-3", "db", None, false, true).is_none());
        let relabelled: BTreeMap<String, String> =
            [(POD_INDEX_LABEL.to_string(), "4".to_string())].into();
        assert!(
            member("db-3", "db", Some(&relabelled), false, true).is_none(),
            "name and index label disagree"
        );
    }

    fn json_merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    if v.is_null() {
                        a.remove(&k);
                    } else {
                        json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
            (slot, v) => *slot = v,
        }
    }
}
