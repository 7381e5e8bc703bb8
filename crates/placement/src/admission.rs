//! The admission plan (`status.admission`): the pin decision ([`crate::pin::decide`]) and the
//! hooks' creation-time marks, precomputed by the controller for every name a new pod of the
//! StatefulSet can be created under, so that the admission policy `ipkeep-pin` (a
//! MutatingAdmissionPolicy evaluated inside the API server) only copies values into the pod.
//!
//! The decision reads the pod's own constraints (`spec.nodeName`, `spec.nodeSelector`, the
//! required node affinity) and its retention annotation; a StatefulSet creates its pods from its
//! template, so the plan decides on a pod made from the template, and says which constraints it
//! saw (`decidedOn`): the policy pins no pod whose own constraints differ. What the webhook does
//! to the pod and what the policy does differ in one place only: the required pin goes into
//! `spec.nodeSelector` (ANDed with the pod's node affinity by the scheduler, as the webhook's
//! edit of every required term is), because a map merges key by key where a list is replaced.

use std::collections::BTreeMap;

use ipkeep_api::k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use ipkeep_api::{
    AdmissionPlan, DecidedOn, NodePreference, NodeRequirement, PersistentPodState, PodAdmission,
    PreferredNodeTerm,
};
use ipkeep_values::keys::{IP_RETENTION, POD_INDEX_LABEL};
use ipkeep_values::ordinal;

use crate::pin::{self, Decision, PinOutcome};
use crate::pinned::PreferredTerm;
use crate::{affinity, lifecycle};

/// The StatefulSet a plan is made for.
#[derive(Debug, Clone, Copy)]
pub struct PlanTarget<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `spec.template` (at least the fields the decision reads).
    pub template: &'a PodTemplateSpec,
}

/// The plan for the pods of `target`, decided from `pps` as it will be once its new status is
/// written (`pps.status` is that status); `None` when the webhook would leave them as they are.
pub fn plan(
    pps: &PersistentPodState,
    namespace: &str,
    target: PlanTarget<'_>,
) -> Option<AdmissionPlan> {
    // A name the StatefulSet never creates: what a pod without a record gets.
    let every = created(pps, namespace, target, &format!("{}-", target.name))?;
    let template_pod = pod_from_template(target, None);
    let mut plan = AdmissionPlan {
        stateful_set_uid: target.uid.to_string(),
        annotations: added(annotations(&template_pod), annotations(&every.pod)),
        labels: added(labels(&template_pod), labels(&every.pod)),
        readiness_gates: gates(&every.pod)
            .into_iter()
            .filter(|g| !gates(&template_pod).contains(g))
            .collect(),
        pods: BTreeMap::new(),
        decided_on: decided_on(target.template),
    };
    let recorded = pps.status.as_ref().map(|s| s.pod_states.keys());
    for name in recorded.into_iter().flatten() {
        let Some(one) = created(pps, namespace, target, name) else {
            continue;
        };
        let mut entry = PodAdmission {
            annotations: added(annotations(&every.pod), annotations(&one.pod)),
            ..PodAdmission::default()
        };
        if let PinOutcome::Pinned(pinned) = &one.pin {
            entry.node_selector = pinned
                .required
                .iter()
                .map(|r| (r.key.clone(), r.value.clone()))
                .collect();
            entry.preferred = pinned.preferred.iter().map(preferred_term).collect();
        }
        if entry != PodAdmission::default() {
            plan.pods.insert(name.clone(), entry);
        }
    }
    Some(plan)
}

/// The plan of a PersistentPodState whose StatefulSet does not exist (yet): what every new pod
/// gets (the hooks' marks, the managing PersistentPodState), so that a PersistentPodState
/// created before its StatefulSet has its plan in place when the first pods are created. No
/// retention is stamped (the template, which may set its own, is unknown; the node agent
/// applies the PersistentPodState's retention at the pod's ADD and DEL anyway) and no pod is
/// pinned (no StatefulSet UID matches).
pub fn plan_without_target(pps: &PersistentPodState, namespace: &str) -> Option<AdmissionPlan> {
    let template = PodTemplateSpec::default();
    let target = PlanTarget {
        name: &pps.spec.target_ref.name,
        uid: "",
        template: &template,
    };
    let mut plan = plan(pps, namespace, target)?;
    plan.annotations.remove(IP_RETENTION);
    plan.pods.clear();
    Some(plan)
}

/// A pod as the webhook would admit it, and the pin decided for it.
struct Created {
    pod: Pod,
    pin: PinOutcome,
}

fn created(
    pps: &PersistentPodState,
    namespace: &str,
    target: PlanTarget<'_>,
    name: &str,
) -> Option<Created> {
    let mut pod = pod_from_template(target, Some(name));
    let Decision::Manage(managed) = pin::decide(&pod, namespace, Some(pps)) else {
        return None;
    };
    // The webhook's own edit, so that the plan is the difference it makes; the required pin it
    // writes into the node affinity is carried by `pin` instead.
    let mut unpinned = managed.clone();
    if let PinOutcome::Pinned(_) = unpinned.pin {
        unpinned.pin = PinOutcome::Unrecorded(crate::pinned::UnrecordedReason::FirstCreation);
    }
    affinity::apply(&unpinned, &mut pod);
    if let PinOutcome::Pinned(_) = managed.pin {
        affinity::mark_pinned(&managed.pps, &mut pod);
    }
    lifecycle::apply_at_create(&managed.lifecycle, &mut pod);
    Some(Created {
        pod,
        pin: managed.pin,
    })
}

/// The pod the StatefulSet creates from its template under `name` (its ordinal in the
/// `apps.kubernetes.io/pod-index` label, as the StatefulSet controller sets it); with no name,
/// the template alone.
fn pod_from_template(target: PlanTarget<'_>, name: Option<&str>) -> Pod {
    let template = target.template;
    let mut metadata = ObjectMeta {
        labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
        annotations: template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.clone()),
        ..ObjectMeta::default()
    };
    if let Some(name) = name {
        metadata.name = Some(name.to_string());
        metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: target.name.to_string(),
            uid: target.uid.to_string(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        if let Some(index) = ordinal::of_pod(name, target.name, None) {
            metadata
                .labels
                .get_or_insert_default()
                .insert(POD_INDEX_LABEL.to_string(), index.to_string());
        }
    }
    Pod {
        metadata,
        spec: template.spec.clone(),
        status: None,
    }
}

fn decided_on(template: &PodTemplateSpec) -> DecidedOn {
    let spec = template.spec.as_ref();
    DecidedOn {
        node_name: spec.and_then(|s| s.node_name.clone()),
        node_selector: spec.and_then(|s| s.node_selector.clone()),
        required: spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .and_then(|r| serde_json::to_value(r).ok()),
    }
}

fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

fn labels(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .map(|g| g.iter().map(|g| g.condition_type.clone()).collect())
        .unwrap_or_default()
}

/// The entries of `after` that `before` lacks or holds another value for.
fn added(
    before: BTreeMap<String, String>,
    after: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    after
        .into_iter()
        .filter(|(k, v)| before.get(k) != Some(v))
        .collect()
}

fn preferred_term(term: &PreferredTerm) -> PreferredNodeTerm {
    PreferredNodeTerm {
        weight: term.weight,
        preference: NodePreference {
            match_expressions: term
                .requirements
                .iter()
                .map(|r| NodeRequirement {
                    key: r.key.clone(),
                    operator: "In".into(),
                    values: vec![r.value.clone()],
                })
                .collect(),
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "admission_tests.rs"]
mod tests;
