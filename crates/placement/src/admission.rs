//! The admission plan: the pin decision ([`crate::pin::decide`]) and the hooks' creation-time
//! marks, precomputed by the controller for every name a new pod of a StatefulSet can be
//! created under, and written into one ConfigMap per namespace ([`PLAN_CONFIGMAP`], encoded by
//! [`encode`]) that the admission policy `ipkeep-pin` (a MutatingAdmissionPolicy evaluated
//! inside the API server) reads: one small object per namespace, of a built-in kind, which the
//! API server wraps lazily, so a pod's admission reads a few entries of it whatever the
//! namespace holds (docs/benchmarks.md, "Where the admission policy's time goes").
//!
//! The decision reads the pod's own constraints (`spec.nodeName`, `spec.nodeSelector`, the
//! required node affinity) and its retention annotation; a StatefulSet creates its pods from its
//! template, so the plan decides on a pod made from the template, and says which constraints it
//! saw ([`AdmissionPlan::decided_on`], in the canonical form [`node_constraints`] writes and the
//! policy computes from the pod): the policy pins no pod whose own constraints differ. What the
//! webhook does to the pod and what the policy does differ in one place only: the required pin
//! goes into `spec.nodeSelector` (ANDed with the pod's node affinity by the scheduler, as the
//! webhook's edit of every required term is), because a map merges key by key where a list is
//! replaced.
//!
//! ## The ConfigMap's entries
//!
//! For each StatefulSet `S` with a plan (`<field>.<S>`; a field name has no dot, so the key of
//! one StatefulSet's field is never another's):
//! - `uid.S`: the StatefulSet's UID: nothing applies to a pod whose controller has another;
//! - `pps.S`: the PersistentPodState (the value of `ipkeep.dev/pinned-by`);
//! - `ann.S`, `lab.S`: annotations and labels every new pod gets, `key=value` lines;
//! - `gate.S`: readiness gates every new pod gets, one per line;
//! - `on.S`: the template's node constraints ([`node_constraints`]);
//! - `keys.S`: the node label keys the pins name, comma-separated.
//!
//! For each recorded pod `P` of `S` that gets more than every pod: `pod.P` is either
//! `REQUIRED|PREFERRED` (pinned: `REQUIRED` is `i=value` pairs, comma-separated, `i` an index
//! into `keys.S`; `PREFERRED` is terms separated by spaces, each `weight:` and pairs), or
//! `!REASON` (the pin was skipped, and why). Label keys and values, node names and weights
//! contain none of `=,:| ` and no line break, so the format needs no escaping; reasons are ours.

use std::collections::BTreeMap;

use ipkeep_api::LifecycleSpec;
use ipkeep_api::k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec,
};
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use ipkeep_api::statefulset::Workload;
use ipkeep_values::keys::{PIN_SKIPPED, POD_INDEX_LABEL};
use ipkeep_values::ordinal;

use crate::pin::{self, Decision, PinOutcome, Source};
use crate::pinned::{PreferredTerm, Requirement};
use crate::{affinity, lifecycle};

/// The name of the ConfigMap the controller writes the plans of a namespace's StatefulSets into.
pub const PLAN_CONFIGMAP: &str = "ipkeep-admission-plan";

/// The label that marks [`PLAN_CONFIGMAP`] (value `"true"`).
pub use ipkeep_values::keys::ADMISSION_PLAN_LABEL as PLAN_LABEL;

/// Most bytes of entries one namespace's ConfigMap holds (keys and values): the API server
/// refuses a ConfigMap of over 1 MiB, and the rest is left for the object's metadata. A
/// StatefulSet whose per-pod entries do not fit gets none (its pods are pinned by the webhook or
/// the scheduler extender), and the controller says so ([`Encoded::omitted`]).
pub const PLAN_BUDGET: usize = 900 * 1024;

/// Longest [`AdmissionPlan::decided_on`]: a template with more node constraints than this gets
/// no per-pod entries (its pods are pinned by the webhook or the scheduler extender), so that
/// what a template holds never grows the plan past a few KiB per StatefulSet.
pub const MAX_DECIDED_ON: usize = 4 * 1024;

/// What every new pod of one StatefulSet gets at creation, and each recorded pod on top: the
/// decision of the scheduler extension, precomputed, so the admission policy copies values and
/// decides nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdmissionPlan {
    /// The PersistentPodState it was decided from.
    pub persistent_pod_state: String,
    /// The StatefulSet's name.
    pub stateful_set: String,
    /// The StatefulSet's UID: a pod of another StatefulSet of the name gets nothing.
    pub stateful_set_uid: String,
    /// Annotations every new pod gets (the managing PersistentPodState, the IP retention).
    pub annotations: BTreeMap<String, String>,
    /// Labels every new pod gets (the lifecycle state).
    pub labels: BTreeMap<String, String>,
    /// Readiness gates (condition types) every new pod gets.
    pub readiness_gates: Vec<String>,
    /// The template's node constraints the per-pod entries were decided on
    /// ([`node_constraints`]); the policy applies an entry only to a pod whose own are these.
    pub decided_on: String,
    /// Per recorded pod name: what a pod created under that name gets on top.
    pub pods: BTreeMap<String, PodPlan>,
    /// The template's node constraints exceed [`MAX_DECIDED_ON`]: no per-pod entries.
    pub constraints_too_large: bool,
}

/// What a pod created under one recorded name gets on top of what every pod gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodPlan {
    /// Pinned to its record (and `ipkeep.dev/pinned-by`): the required pin goes into
    /// `spec.nodeSelector`, the preferred terms into its preferred node affinity.
    Pinned {
        /// Node labels the pod's node must have.
        required: Vec<Requirement>,
        /// Preferred terms, in order.
        preferred: Vec<PreferredTerm>,
    },
    /// Not pinned, and why (`ipkeep.dev/pin-skipped`).
    Skipped(String),
}

/// The StatefulSet a plan is made for.
#[derive(Debug, Clone, Copy)]
pub struct PlanTarget<'a> {
    /// Which StatefulSet it is: its pods' controller ownerReference names that group.
    pub workload: Workload,
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `spec.template` (at least the fields the decision reads).
    pub template: &'a PodTemplateSpec,
}

/// The plan for the pods of `target`, decided from `pps` as it will be once its new status is
/// written; `None` when the webhook would leave them as they are.
pub fn plan(pps: Source<'_>, namespace: &str, target: PlanTarget<'_>) -> Option<AdmissionPlan> {
    // A name the StatefulSet never creates: what a pod without a record gets.
    let every = created(pps, namespace, target, &format!("{}-", target.name))?;
    let template_pod = pod_from_template(target, None);
    let decided_on = node_constraints(target.template.spec.as_ref());
    let constraints_too_large = decided_on.len() > MAX_DECIDED_ON;
    let annotations = added(annotations(&template_pod), annotations(&every.pod));
    let mut plan = AdmissionPlan {
        persistent_pod_state: pps.name.to_string(),
        stateful_set: target.name.to_string(),
        stateful_set_uid: target.uid.to_string(),
        labels: added(labels(&template_pod), labels(&every.pod)),
        readiness_gates: gates(&every.pod)
            .into_iter()
            .filter(|g| !gates(&template_pod).contains(g))
            .collect(),
        pods: BTreeMap::new(),
        decided_on: if constraints_too_large {
            String::new()
        } else {
            decided_on
        },
        constraints_too_large,
        annotations,
    };
    if constraints_too_large {
        return Some(plan);
    }
    let recorded = pps.status.map(|s| s.pod_states.keys());
    for name in recorded.into_iter().flatten() {
        let Some(one) = created(pps, namespace, target, name) else {
            continue;
        };
        let entry = match one.pin {
            PinOutcome::Pinned(pinned) => PodPlan::Pinned {
                required: pinned.required,
                preferred: pinned.preferred,
            },
            PinOutcome::Skipped(why) => {
                let why = one_line(&why);
                // An invalid spec skips every pod alike: said once, for every pod.
                if plan.annotations.get(PIN_SKIPPED) == Some(&why) {
                    continue;
                }
                PodPlan::Skipped(why)
            }
            PinOutcome::Unrecorded(_) => continue,
        };
        plan.pods.insert(name.clone(), entry);
    }
    Some(plan)
}

/// Whether a write of a PersistentPodState gives it lifecycle hooks it did not have (`created`
/// with them, or `old` ones changed to `new`): it is then labelled
/// [`ipkeep_values::keys::ADMISSION_PENDING_LABEL`] until the hooks are in the plan, and its
/// StatefulSet's pods wait (the admission policies `ipkeep-admission-pending` and
/// `ipkeep-hooks-pending`; with the webhook, `/mutate-persistentpodstates` labels it).
pub fn gets_hooks(created: bool, old: Option<&LifecycleSpec>, new: Option<&LifecycleSpec>) -> bool {
    new.is_some() && (created || old != new)
}

/// A pod as the webhook would admit it, and the pin decided for it.
struct Created {
    pod: Pod,
    pin: PinOutcome,
}

fn created(
    pps: Source<'_>,
    namespace: &str,
    target: PlanTarget<'_>,
    name: &str,
) -> Option<Created> {
    let mut pod = pod_from_template(target, Some(name));
    let Decision::Manage(managed) = pin::decide_from(&pod, namespace, Some(pps)) else {
        return None;
    };
    // The webhook's own edit of what every pod gets; the pin is carried by `pin` instead.
    let mut unpinned = managed.clone();
    if let PinOutcome::Pinned(_) = unpinned.pin {
        unpinned.pin = PinOutcome::Unrecorded(crate::pinned::UnrecordedReason::FirstCreation);
    }
    affinity::apply(&unpinned, &mut pod);
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
            api_version: match target.workload {
                Workload::Native => "apps/v1".into(),
                Workload::Kruise => format!(
                    "{}/{}",
                    ipkeep_api::kruise::GROUP,
                    ipkeep_api::kruise::VERSION
                ),
            },
            kind: ipkeep_api::statefulset::KIND.into(),
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

/// A pod's node constraints in one canonical line each, as the admission policy computes them
/// from the pod being created (so the two compare as strings): `spec.nodeName`; the node
/// selector's `key=value` pairs, sorted, comma-separated; the required node affinity's terms,
/// separated by `|`, each its match expressions then `#` then its match fields, separated by
/// `;`, each `key operator value...` separated by spaces. An empty node selector or required
/// term list reads as none (the API server treats them so).
pub fn node_constraints(spec: Option<&PodSpec>) -> String {
    let node_name = spec
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    let mut selector: Vec<String> = spec
        .and_then(|s| s.node_selector.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    selector.sort();
    let terms = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let required: Vec<String> = terms.iter().map(term_line).collect();
    format!(
        "{node_name}\n{}\n{}",
        selector.join(","),
        required.join("|")
    )
}

fn term_line(term: &NodeSelectorTerm) -> String {
    let requirements = |r: Option<&Vec<NodeSelectorRequirement>>| -> String {
        r.into_iter()
            .flatten()
            .map(|e| {
                let values: String = e.values.iter().flatten().map(|v| format!(" {v}")).collect();
                format!("{} {}{values}", e.key, e.operator)
            })
            .collect::<Vec<_>>()
            .join(";")
    };
    format!(
        "{}#{}",
        requirements(term.match_expressions.as_ref()),
        requirements(term.match_fields.as_ref())
    )
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

/// A value on one line (the plan's lines are entries).
fn one_line(text: &impl std::fmt::Display) -> String {
    text.to_string().replace(['\n', '\r'], " ")
}

/// The plans of one namespace as the entries of its ConfigMap ([`PLAN_CONFIGMAP`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoded {
    /// The ConfigMap's `data` (empty: the namespace needs no ConfigMap).
    pub data: BTreeMap<String, String>,
    /// StatefulSets whose per-pod entries did not fit in [`PLAN_BUDGET`], by name: their pods
    /// get what every pod gets, and no pin from the policy.
    pub omitted: Vec<String>,
}

/// Encodes `plans` (at most one per StatefulSet, as [`crate::pin::persistent_pod_state_of`]
/// chooses) into at most `budget` bytes of entries: what every pod gets first, for every
/// StatefulSet (a few hundred bytes each), then the per-pod entries of whole StatefulSets,
/// smallest first, while they fit.
pub fn encode(plans: &[AdmissionPlan], budget: usize) -> Encoded {
    let mut data = BTreeMap::new();
    let mut per_pod: Vec<(&AdmissionPlan, BTreeMap<String, String>)> = Vec::new();
    for plan in plans {
        let sts = &plan.stateful_set;
        let lines = |m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", one_line(v)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        data.insert(format!("uid.{sts}"), plan.stateful_set_uid.clone());
        data.insert(format!("pps.{sts}"), plan.persistent_pod_state.clone());
        if !plan.annotations.is_empty() {
            data.insert(format!("ann.{sts}"), lines(&plan.annotations));
        }
        if !plan.labels.is_empty() {
            data.insert(format!("lab.{sts}"), lines(&plan.labels));
        }
        if !plan.readiness_gates.is_empty() {
            data.insert(format!("gate.{sts}"), plan.readiness_gates.join("\n"));
        }
        if !plan.pods.is_empty() {
            per_pod.push((plan, pod_entries(plan)));
        }
    }
    let size = |entries: &BTreeMap<String, String>| -> usize {
        entries.iter().map(|(k, v)| k.len() + v.len()).sum()
    };
    per_pod.sort_by_key(|(plan, entries)| (size(entries), plan.stateful_set.clone()));
    let mut used = size(&data);
    let mut omitted = Vec::new();
    for (plan, entries) in per_pod {
        if used + size(&entries) > budget {
            omitted.push(plan.stateful_set.clone());
            continue;
        }
        used += size(&entries);
        data.extend(entries);
    }
    if used > budget {
        // Even what every pod gets does not fit (tens of thousands of StatefulSets in one
        // namespace): nothing is better than a ConfigMap the API server refuses.
        let mut all: Vec<String> = plans.iter().map(|p| p.stateful_set.clone()).collect();
        all.sort();
        return Encoded {
            data: BTreeMap::new(),
            omitted: all,
        };
    }
    omitted.sort();
    Encoded { data, omitted }
}

/// `on.S`, `keys.S` and the `pod.P` entries of one plan.
fn pod_entries(plan: &AdmissionPlan) -> BTreeMap<String, String> {
    let sts = &plan.stateful_set;
    let mut keys: Vec<String> = Vec::new();
    let mut index = |key: &str| -> usize {
        keys.iter().position(|k| k == key).unwrap_or_else(|| {
            keys.push(key.to_string());
            keys.len() - 1
        })
    };
    let mut entries = BTreeMap::new();
    for (pod, entry) in &plan.pods {
        let value = match entry {
            PodPlan::Skipped(why) => format!("!{}", one_line(why)),
            PodPlan::Pinned {
                required,
                preferred,
            } => {
                let mut pairs = |reqs: &[Requirement]| -> String {
                    reqs.iter()
                        .map(|r| format!("{}={}", index(&r.key), r.value))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let required = pairs(required);
                let preferred: Vec<String> = preferred
                    .iter()
                    .map(|t| format!("{}:{}", t.weight, pairs(&t.requirements)))
                    .collect();
                format!("{required}|{}", preferred.join(" "))
            }
        };
        entries.insert(format!("pod.{pod}"), value);
    }
    entries.insert(format!("on.{sts}"), plan.decided_on.clone());
    entries.insert(format!("keys.{sts}"), keys.join(","));
    entries
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "admission_tests.rs"]
mod tests;
