//! The whole status of a PersistentPodState, records and conditions, from what the caches hold:
//! one pure function, [`reconcile`]. The controller gathers its [`StatusInput`], calls it, and
//! applies the answer (the status by server-side apply, Events and metrics for the changes, the
//! deletion of stranded pods).
//!
//! `Ready` says whether the PersistentPodState records:
//! - `InvalidSpec` (False): the spec cannot be acted on; records and target are kept as they are;
//! - `WaitingForAdoption` (False): the StatefulSet is gone (or being deleted) and the
//!   PersistentPodState asks to keep its records for the next StatefulSet of the name;
//! - `TargetNotFound` (False): the StatefulSet is gone (or being deleted); its records are
//!   cleared, whatever the retention policy;
//! - `Recording` (True): the records follow the pods ([`crate::record::plan`]).
//!
//! `LifecycleHooks` is written (False) only when `spec.lifecycle` asks for ipkeep's hooks on an
//! OpenKruise Advanced StatefulSet: they stand aside for its own.
//!
//! `ReserveOrdinals` is written (False) only while the target, an Advanced StatefulSet, has a
//! `spec.reserveOrdinals` entry that does not parse: which one, and what to write instead.
//!
//! `NodeLost` is written only while recording; in the three other cases it is removed, since
//! nothing watches the recorded nodes then.
//!
//! The same decision makes the admission plan of the StatefulSet's new pods
//! ([`crate::admission::plan`]) from the status it decides, whenever the StatefulSet exists;
//! `AdmissionPlanned` says when the plan cannot pin (the template's node constraints are too
//! large to compare in the policy).

use std::collections::BTreeMap;
use std::time::Duration;

use ipkeep_api::k8s_openapi::api::core::v1::PodTemplateSpec;
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use ipkeep_api::statefulset::Workload;
use ipkeep_api::{PersistentPodStateSpec, PersistentPodStateStatus, PodState};
use ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE;

use crate::admission::{self, AdmissionPlan, MAX_DECIDED_ON, PlanTarget};
use crate::condition::{
    self, ADMISSION_PLANNED, DesiredCondition, LIFECYCLE_HOOKS, NODE_LOST, READY, RESERVE_ORDINALS,
};
use crate::pin::Source;
use crate::record::{self, RecordChange, RecordInput};
use crate::spec::{self, SpecError};
use crate::view::{NodeView, PodView, TargetView};

/// What the status is decided from.
#[derive(Debug)]
pub struct StatusInput<'a> {
    /// The PersistentPodState's name (the pods it pinned carry it in `ipkeep.dev/pinned-by`).
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its spec.
    pub spec: &'a PersistentPodStateSpec,
    /// Its annotations ask to keep the records for the next StatefulSet of the name
    /// ([`crate::view::adopts`]).
    pub adopts: bool,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The status as last written.
    pub previous: &'a PersistentPodStateStatus,
    /// The StatefulSet `spec.targetRef` names; `None` when it does not exist or is being deleted.
    pub target: Option<&'a TargetView>,
    /// That StatefulSet's pod template (at least what the pin decision reads), for the plan.
    pub template: Option<&'a PodTemplateSpec>,
    /// Pods by name: at least those named by [`record::candidate_pod_names`] that exist.
    pub pods: &'a BTreeMap<String, PodView>,
    /// Nodes by name: at least those the pods and the records name, if they exist.
    pub nodes: &'a BTreeMap<String, NodeView>,
    /// The current time, in whole seconds (as the API server stores it).
    pub now: &'a Time,
}

/// Why `Ready` is what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Recording the pods of the StatefulSet.
    Recording,
    /// The spec cannot be acted on.
    InvalidSpec(SpecError),
    /// No StatefulSet; its records are kept for the next one of the name.
    WaitingForAdoption,
    /// No StatefulSet; its records are cleared.
    TargetNotFound,
}

/// [`reconcile`]'s answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    /// The status to write (equal to the previous one when nothing changed).
    pub status: PersistentPodStateStatus,
    /// Why `Ready` is what it is.
    pub verdict: Verdict,
    /// What changed in the records, for Events, logs and metrics.
    pub changes: Vec<RecordChange>,
    /// Pods left Pending by a pin that has since fallen back ([`record::stranded_pods`]): to be
    /// deleted, each with its UID as a precondition.
    pub stranded: Vec<PodView>,
    /// When to look again without any event (a grace period ending).
    pub requeue: Option<Duration>,
    /// What the admission policy gives the StatefulSet's new pods, decided from `status`;
    /// `None` without a StatefulSet (or when the webhook would leave its pods as they are).
    pub plan: Option<AdmissionPlan>,
}

/// Decides the status and the admission plan. Pure: same input, same answer.
pub fn reconcile(input: &StatusInput<'_>) -> Reconciled {
    let mut decided = decide_status(input);
    let conditions = std::mem::take(&mut decided.status.conditions);
    decided.status.conditions =
        with_condition(conditions, LIFECYCLE_HOOKS, hooks_stand_aside(input), input);
    let conditions = std::mem::take(&mut decided.status.conditions);
    decided.status.conditions = with_condition(
        conditions,
        RESERVE_ORDINALS,
        reserve_ordinals_unreadable(input),
        input,
    );
    let (Some(target), Some(template)) = (input.target, input.template) else {
        return decided;
    };
    let source = Source {
        name: input.name,
        namespace: Some(input.namespace),
        spec: input.spec,
        status: Some(&decided.status),
        adopts: input.adopts,
        deleting: false,
    };
    decided.plan = admission::plan(
        source,
        input.namespace,
        PlanTarget {
            workload: input
                .spec
                .target_ref
                .workload()
                .map_or(Workload::Native, |(w, _)| w),
            name: &target.name,
            uid: &target.uid,
            template,
        },
    );
    let planned = match &decided.plan {
        Some(plan) if plan.constraints_too_large => Some(DesiredCondition {
            type_: ADMISSION_PLANNED,
            status: false,
            reason: "NodeConstraintsTooLarge".into(),
            message: format!(
                "the node constraints of StatefulSet {}'s pod template (nodeName, nodeSelector, required node affinity) take more than {MAX_DECIDED_ON} bytes: the admission policy does not pin its pods; the webhook (admission.mode webhook) or the scheduler extender pins them",
                target.name
            ),
        }),
        _ => None,
    };
    let conditions = std::mem::take(&mut decided.status.conditions);
    decided.status.conditions = with_condition(conditions, ADMISSION_PLANNED, planned, input);
    decided
}

/// `LifecycleHooks` False when `spec.lifecycle` asks for ipkeep's hooks on an Advanced
/// StatefulSet: they stand aside for its own (`spec.lifecycle` of the Advanced StatefulSet).
fn hooks_stand_aside(input: &StatusInput<'_>) -> Option<DesiredCondition> {
    let (Workload::Kruise, name) = input.spec.target_ref.workload()? else {
        return None;
    };
    input.spec.lifecycle.as_ref()?;
    Some(DesiredCondition {
        type_: LIFECYCLE_HOOKS,
        status: false,
        reason: "AdvancedStatefulSetHasItsOwn".into(),
        message: format!(
            "spec.lifecycle asks for ipkeep's lifecycle hooks, but {name} is an OpenKruise Advanced StatefulSet: ipkeep's hooks do not run for its pods (no readiness gate, no held deletion). Use the Advanced StatefulSet's own spec.lifecycle (preDelete, inPlaceUpdate, preNormal) and remove spec.lifecycle here"
        ),
    })
}

/// `ReserveOrdinals` False while the Advanced StatefulSet's `spec.reserveOrdinals` has an entry
/// that does not parse: Kruise's controller then reserves nothing, and the records follow it.
fn reserve_ordinals_unreadable(input: &StatusInput<'_>) -> Option<DesiredCondition> {
    let target = input.target?;
    let invalid = target.invalid_reserve_ordinal.as_ref()?;
    Some(DesiredCondition {
        type_: RESERVE_ORDINALS,
        status: false,
        reason: "InvalidReserveOrdinal".into(),
        message: format!(
            "Advanced StatefulSet {}/{}: {invalid}; ipkeep reads the list as Kruise's controller does, so records are kept and pruned as if no ordinal were reserved. Write each entry as an ordinal (1) or a range \"a-b\" with a <= b (\"2-5\"), as Kruise's webhook requires",
            input.namespace, target.name
        ),
    })
}

/// `conditions` with the condition `type_` set to `wanted` (or removed).
fn with_condition(
    mut conditions: Vec<ipkeep_api::Condition>,
    type_: &str,
    wanted: Option<DesiredCondition>,
    input: &StatusInput<'_>,
) -> Vec<ipkeep_api::Condition> {
    match wanted {
        None => {
            conditions.retain(|c| c.type_ != type_);
            conditions
        }
        Some(w) => condition::merge(&conditions, &[w], input.generation, input.now),
    }
}

fn decide_status(input: &StatusInput<'_>) -> Reconciled {
    let checked = match spec::check(input.spec) {
        Ok(checked) => checked,
        Err(e) => {
            let ready = not_ready("InvalidSpec", format!("{e}; fix the spec"));
            return keeping_records(input, ready, Verdict::InvalidSpec(e));
        }
    };
    let target_name = &input.spec.target_ref.name;
    let namespace = input.namespace;
    // "StatefulSet", or "Advanced StatefulSet (apps.kruise.io)": which one the messages mean.
    let what = input
        .spec
        .target_ref
        .workload()
        .map_or(Workload::Native, |(w, _)| w)
        .describe();
    let Some(target) = input.target else {
        if input.adopts {
            let ready = not_ready(
                "WaitingForAdoption",
                format!(
                    "{what} {namespace}/{target_name} does not exist (or is being deleted); its {} record(s) and held IPs are kept for the next StatefulSet of this name ({ADOPT_PERSISTENT_POD_STATE}: \"true\"). Delete this PersistentPodState if it will not come back",
                    input.previous.pod_states.len()
                ),
            );
            return keeping_records(input, ready, Verdict::WaitingForAdoption);
        }
        // A new StatefulSet with this name starts from nothing.
        let ready = not_ready(
            "TargetNotFound",
            format!(
                "{what} {namespace}/{target_name} does not exist (or is being deleted); records are cleared and recording starts when it exists{}",
                if what == Workload::Kruise.describe() {
                    " (the API server serves Advanced StatefulSets only where OpenKruise is installed)"
                } else {
                    ""
                }
            ),
        );
        return Reconciled {
            status: next_status(input, BTreeMap::new(), None, ready, None),
            verdict: Verdict::TargetNotFound,
            changes: Vec::new(),
            stranded: Vec::new(),
            requeue: None,
            plan: None,
        };
    };
    let target = TargetView {
        adopts_records: input.adopts,
        ..target.clone()
    };
    let plan = record::plan(&RecordInput {
        config: &checked,
        target: &target,
        previous: input.previous,
        pods: input.pods,
        nodes: input.nodes,
        now: input.now,
    });
    let ready = DesiredCondition {
        type_: READY,
        status: true,
        reason: "Recording".into(),
        message: format!("recording the pods of {what} {target_name}"),
    };
    let lost = record::node_lost_condition(&plan.lost, checked.node_loss_after);
    let status = next_status(
        input,
        plan.pod_states,
        Some(lost),
        ready,
        Some(target.uid.clone()),
    );
    let has_required = input
        .spec
        .required_persistent_topology
        .as_ref()
        .is_some_and(|t| !t.node_topology_keys.is_empty());
    let stranded = record::stranded_pods(
        input.name,
        has_required,
        checked.node_loss_after,
        &status.pod_states,
        input.pods,
    )
    .into_iter()
    .cloned()
    .collect();
    Reconciled {
        status,
        verdict: Verdict::Recording,
        changes: plan.changes,
        stranded,
        requeue: plan.requeue_after,
        plan: None,
    }
}

/// A False `Ready` over the records and target as they are.
fn keeping_records(input: &StatusInput<'_>, ready: DesiredCondition, why: Verdict) -> Reconciled {
    Reconciled {
        status: next_status(
            input,
            input.previous.pod_states.clone(),
            None,
            ready,
            input.previous.target_uid.clone(),
        ),
        verdict: why,
        changes: Vec::new(),
        stranded: Vec::new(),
        requeue: None,
        plan: None,
    }
}

fn not_ready(reason: &str, message: String) -> DesiredCondition {
    DesiredCondition {
        type_: READY,
        status: false,
        reason: reason.into(),
        message,
    }
}

/// The status with these records and conditions; without a `NodeLost` condition, the previous
/// one is removed.
fn next_status(
    input: &StatusInput<'_>,
    pod_states: BTreeMap<String, PodState>,
    node_lost: Option<DesiredCondition>,
    ready: DesiredCondition,
    target_uid: Option<String>,
) -> PersistentPodStateStatus {
    let mut current = input.previous.conditions.clone();
    if node_lost.is_none() {
        current.retain(|c| c.type_ != NODE_LOST);
    }
    let desired: Vec<DesiredCondition> = std::iter::once(ready).chain(node_lost).collect();
    PersistentPodStateStatus {
        observed_generation: input.generation,
        target_uid,
        recorded_pods: i32::try_from(pod_states.len()).unwrap_or(i32::MAX),
        pod_states,
        conditions: condition::merge(&current, &desired, input.generation, input.now),
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
