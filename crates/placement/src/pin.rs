//! The pin decision: what the scheduler extension does to a StatefulSet pod (Kubernetes' or
//! OpenKruise's Advanced StatefulSet's, whose pods get no lifecycle hooks of ipkeep's), from the pod, the
//! PersistentPodState of its StatefulSet and the record kept under the pod's name. The webhook
//! turns a [`Decision`] into a patch ([`crate::affinity::apply`]); the extender turns it into a
//! node filter and scores ([`Pinned::admits`], [`Pinned::score`]). Both front doors make the same
//! decision, so a pod that skipped the webhook is still pinned at scheduling time.

use ipkeep_api::k8s_openapi::api::core::v1::Pod;
use ipkeep_api::statefulset::{self, Workload};
use ipkeep_api::{PersistentPodState, PersistentPodStateSpec, PersistentPodStateStatus, PodState};
use ipkeep_values::keys::POD_INDEX_LABEL;
use ipkeep_values::ordinal;

use crate::affinity;
pub use crate::pinned::{
    MAX_SCORE, Managed, PinOutcome, Pinned, PreferredTerm, Requirement, SkipReason,
    UnrecordedReason,
};
use crate::spec::{self, check_ip_retention};

/// What to do with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not ours: leave the pod exactly as it is.
    Pass(PassReason),
    /// A pod of a StatefulSet that has a PersistentPodState.
    Manage(Managed),
}

/// Why a pod is not ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassReason {
    /// No ownerReference with `controller: true` to a StatefulSet (`apps`, or OpenKruise's
    /// Advanced StatefulSet, `apps.kruise.io`).
    NotStatefulSetPod,
    /// Its StatefulSet has no PersistentPodState.
    NoPersistentPodState,
    /// The PersistentPodState given is in another namespace or targets another StatefulSet.
    OtherWorkload,
    /// The PersistentPodState is being deleted.
    PersistentPodStateDeleting,
}

impl PassReason {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotStatefulSetPod => "not-statefulset-pod",
            Self::NoPersistentPodState => "no-persistentpodstate",
            Self::OtherWorkload => "other-workload",
            Self::PersistentPodStateDeleting => "persistentpodstate-deleting",
        }
    }
}

/// What the decision reads of a PersistentPodState: borrowed from a whole object
/// ([`Source::from`]), or from the parts the status decision has in hand (its new status
/// included), so that nothing is cloned to decide.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.namespace` (`None`: the pod's).
    pub namespace: Option<&'a str>,
    /// The spec.
    pub spec: &'a PersistentPodStateSpec,
    /// The status (the records).
    pub status: Option<&'a PersistentPodStateStatus>,
    /// Its annotations ask the next StatefulSet of the name to adopt the records
    /// ([`crate::view::adopts`]).
    pub adopts: bool,
    /// It is being deleted.
    pub deleting: bool,
}

impl<'a> From<&'a PersistentPodState> for Source<'a> {
    fn from(pps: &'a PersistentPodState) -> Self {
        Self {
            name: pps.metadata.name.as_deref().unwrap_or_default(),
            namespace: pps.metadata.namespace.as_deref(),
            spec: &pps.spec,
            status: pps.status.as_ref(),
            adopts: crate::view::adopts(pps.metadata.annotations.as_ref()),
            deleting: pps.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// Decides what to do with `pod` (in `namespace`: on CREATE the object itself may not say),
/// given the PersistentPodState found for its StatefulSet, if any.
pub fn decide(pod: &Pod, namespace: &str, pps: Option<&PersistentPodState>) -> Decision {
    decide_from(pod, namespace, pps.map(Source::from))
}

/// [`decide`], from what the decision reads of the PersistentPodState.
pub fn decide_from(pod: &Pod, namespace: &str, pps: Option<Source<'_>>) -> Decision {
    let Some(owner) = statefulset_owner(pod) else {
        return Decision::Pass(PassReason::NotStatefulSetPod);
    };
    let Some(pps) = pps else {
        return Decision::Pass(PassReason::NoPersistentPodState);
    };
    if pps.namespace.unwrap_or(namespace) != namespace
        || !pps.spec.target_ref.targets(owner.workload, &owner.name)
    {
        return Decision::Pass(PassReason::OtherWorkload);
    }
    if pps.deleting {
        return Decision::Pass(PassReason::PersistentPodStateDeleting);
    }
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    // `ipRetention` is read once: by the check, or (the spec refused for another reason, or
    // before the check reached it) on its own.
    let (lifecycle, retention, invalid) = match spec::check(pps.spec) {
        // ipkeep's hooks stand aside for an Advanced StatefulSet: it has its own.
        Ok(checked) if owner.workload == Workload::Kruise => {
            (Default::default(), Some(checked.ip_retention), None)
        }
        Ok(checked) => (checked.lifecycle, Some(checked.ip_retention), None),
        Err(e) => (Default::default(), retention_of(pps.spec), Some(e)),
    };
    // Called once, on whichever path decides.
    let managed = |pin| {
        Decision::Manage(Managed {
            pps: pps.name.to_string(),
            pod: pod_name.clone(),
            retention,
            pin,
            lifecycle: Box::new(lifecycle),
        })
    };
    if let Some(e) = invalid {
        return managed(PinOutcome::Skipped(SkipReason::InvalidSpec(e.to_string())));
    }
    // Records of an earlier StatefulSet of this name are not this pod's, unless the PPS says the
    // next StatefulSet of the name adopts them.
    if !of_recorded_statefulset(&owner, pps.status) && !pps.adopts {
        return managed(PinOutcome::Unrecorded(
            UnrecordedReason::RecordsOfEarlierStatefulSet,
        ));
    }
    // `<statefulset>-<ordinal>`, whatever the ordinal (its `apps.kubernetes.io/pod-index` label
    // where it has one): a record under another name is not this pod's.
    let pod_index = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(POD_INDEX_LABEL))
        .map(String::as_str);
    let of_target = ordinal::of_pod(&pod_name, &owner.name, pod_index).is_some();
    let record = pps.status.and_then(|s| s.pod_states.get(&pod_name));
    let Some(record) = record.filter(|_| of_target) else {
        return managed(PinOutcome::Unrecorded(UnrecordedReason::FirstCreation));
    };
    let pinned = pinned_from_record(pps.spec, record);
    if pinned.required.is_empty() && pinned.preferred.is_empty() {
        return managed(PinOutcome::Unrecorded(UnrecordedReason::NoRecordedLabels));
    }
    match pod
        .spec
        .as_ref()
        .and_then(|s| affinity::conflict(s, &pinned))
    {
        Some(why) => managed(PinOutcome::Skipped(SkipReason::Conflict(why))),
        None => managed(PinOutcome::Pinned(pinned)),
    }
}

/// The `ipkeep.dev/ip-retention` a pod `pps` manages is stamped with: `spec.ipRetention`, when
/// it reads (otherwise the CNI plugin falls back to its configured default).
pub fn stamped_retention(pps: &PersistentPodState) -> Option<String> {
    retention_of(&pps.spec)
}

fn retention_of(spec: &PersistentPodStateSpec) -> Option<String> {
    check_ip_retention(&spec.ip_retention)
        .ok()
        .map(|_| spec.ip_retention.trim().to_string())
}

fn pinned_from_record(spec: &PersistentPodStateSpec, record: &PodState) -> Pinned {
    let recorded = |keys: &[String]| -> Vec<Requirement> {
        let mut reqs: Vec<Requirement> = Vec::new();
        for key in keys {
            if let Some(value) = record.node_topology_labels.get(key)
                && !reqs.iter().any(|r| &r.key == key)
            {
                reqs.push(Requirement {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        reqs
    };
    let mut required = spec
        .required_persistent_topology
        .as_ref()
        .map(|term| recorded(&term.node_topology_keys))
        .unwrap_or_default();
    let mut preferred: Vec<PreferredTerm> = Vec::new();
    if record.preferred_only && !required.is_empty() {
        // The node-loss fallback: the required topology becomes the strongest preference, so
        // the pod still returns to its node (or zone) if that comes back first.
        preferred.push(PreferredTerm {
            weight: 100,
            requirements: std::mem::take(&mut required),
        });
    }
    preferred.extend(
        spec.preferred_persistent_topology
            .iter()
            .map(|t| PreferredTerm {
                weight: t.weight.clamp(1, 100),
                requirements: recorded(&t.preference.node_topology_keys),
            })
            .filter(|t| !t.requirements.is_empty()),
    );
    Pinned {
        node: record.node_name.clone(),
        required,
        preferred,
        fallback: record.preferred_only,
    }
}

/// Whether `pod` is controlled by the StatefulSet whose UID `pps` records as its target
/// (`status.targetUID`), or either UID is unknown. The name alone proves nothing: whoever
/// creates a pod writes its owner reference, while the UID is the one object the controller saw.
pub fn controlled_by_recorded_target(pod: &Pod, pps: &PersistentPodState) -> bool {
    statefulset_owner(pod).is_some_and(|owner| of_recorded_statefulset(&owner, pps.status.as_ref()))
}

/// Whether `pps` waits for the next StatefulSet of its target's name to adopt it: it carries
/// [`ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE`] and nothing controls it (its owner was
/// deleted with `--cascade=orphan`, and the controller has not made the new one its owner yet).
/// Until then the new StatefulSet's pods are its pods, whatever their owner's UID. One that
/// another kind controls (an OpenKruise Advanced StatefulSet of the name, say) is not waiting:
/// the controller would not adopt it ([`crate::autogen::adoptable`]).
pub fn awaiting_adoption(pps: &PersistentPodState) -> bool {
    let controlled = pps
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true));
    !controlled && crate::view::adopts(pps.metadata.annotations.as_ref())
}

fn of_recorded_statefulset(owner: &Owner, status: Option<&PersistentPodStateStatus>) -> bool {
    let recorded = status
        .and_then(|s| s.target_uid.as_deref())
        .filter(|uid| !uid.is_empty());
    recorded.is_none_or(|uid| owner.uid.is_empty() || uid == owner.uid)
}

/// The pod's controlling StatefulSet.
struct Owner {
    workload: Workload,
    name: String,
    uid: String,
}

fn statefulset_owner(pod: &Pod) -> Option<Owner> {
    statefulset::controller_workload(pod.metadata.owner_references.iter().flatten()).map(
        |(workload, o)| Owner {
            workload,
            name: o.name.clone(),
            uid: o.uid.clone(),
        },
    )
}

/// Which of `states` (PersistentPodStates of one namespace) is the `workload` StatefulSet
/// `statefulset`'s: the one named after it if it targets it, else the first by name that targets
/// it. The webhook's cache looks it up by the same rule.
pub fn persistent_pod_state_of<'a>(
    states: impl IntoIterator<Item = &'a PersistentPodState>,
    workload: Workload,
    statefulset: &str,
) -> Option<&'a PersistentPodState> {
    states
        .into_iter()
        .filter(|p| p.spec.target_ref.targets(workload, statefulset))
        .min_by_key(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            (name != statefulset, name)
        })
}

/// The workload and name of the StatefulSet controlling `pod`, if one does: where to look for
/// its PersistentPodState.
pub fn statefulset_of(pod: &Pod) -> Option<(Workload, String)> {
    statefulset_owner(pod).map(|o| (o.workload, o.name))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "pin_tests.rs"]
mod tests;
