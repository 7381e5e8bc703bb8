//! The pin decision: what the scheduler extension does to a StatefulSet pod, from the pod, the
//! PersistentPodState of its StatefulSet and the record kept under the pod's name. The webhook
//! turns a [`Decision`] into a patch ([`crate::affinity::apply`]); the extender turns it into a
//! node filter and scores ([`Pinned::admits`], [`Pinned::score`]). Both front doors make the same
//! decision, so a pod that skipped the webhook is still pinned at scheduling time.

use std::collections::BTreeMap;
use std::fmt;

use ipkeep_api::k8s_openapi::api::core::v1::Pod;
use ipkeep_api::{PersistentPodState, PodState};
use ipkeep_values::keys::POD_INDEX_LABEL;
use ipkeep_values::ordinal;

use crate::affinity;
use crate::spec::{self, check_ip_retention};

/// The node label that names a node; a pin on it pins one node.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

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
    /// No ownerReference with `controller: true` to an `apps` StatefulSet.
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

/// A pod of a StatefulSet with a PersistentPodState.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Managed {
    /// The PersistentPodState's name.
    pub pps: String,
    /// The pod's name.
    pub pod: String,
    /// The `ipkeep.dev/ip-retention` value to stamp on the pod (`spec.ipRetention`); `None` when
    /// the spec's value is invalid, so the CNI plugin falls back to its configured default.
    pub retention: Option<String>,
    /// Whether and how the pod is pinned.
    pub pin: PinOutcome,
    /// The lifecycle hooks a new pod gets (none when the spec does not check: they fail open).
    pub lifecycle: Box<ipkeep_lifecycle::Lifecycle>,
}

/// Whether a managed pod is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinOutcome {
    /// Nothing recorded to pin to (yet); the pod only gets the retention annotation.
    Unrecorded(UnrecordedReason),
    /// Pinned to its recorded topology.
    Pinned(Pinned),
    /// A record exists but is not applied, for this reason (said on the pod and in an Event).
    Skipped(SkipReason),
}

/// Why a managed pod has nothing to pin to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnrecordedReason {
    /// No record under the pod's name: its first creation.
    FirstCreation,
    /// The records belong to an earlier StatefulSet with the same name (another UID).
    RecordsOfEarlierStatefulSet,
    /// The record has a value for none of the topology keys (the node lacked those labels).
    NoRecordedLabels,
}

impl UnrecordedReason {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::FirstCreation => "first-creation",
            Self::RecordsOfEarlierStatefulSet => "records-of-earlier-statefulset",
            Self::NoRecordedLabels => "no-recorded-labels",
        }
    }
}

/// Why a recorded pin is not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// The PersistentPodState's spec cannot be acted on.
    InvalidSpec(String),
    /// The pod's own constraints exclude the recorded topology: pinning would make it
    /// unschedulable.
    Conflict(String),
}

impl SkipReason {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "invalid-spec",
            Self::Conflict(_) => "conflict",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidSpec(why) => write!(f, "PersistentPodState spec is invalid: {why}"),
            Self::Conflict(why) => write!(
                f,
                "not pinned, because the pod's own constraints exclude its recorded node: {why}"
            ),
        }
    }
}

/// One node-label requirement: `key In [value]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Requirement {
    /// The node label key.
    pub key: String,
    /// The recorded value.
    pub value: String,
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// A weighted preferred term: every requirement of it, ANDed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferredTerm {
    /// 1..100.
    pub weight: i32,
    /// ANDed requirements (never empty).
    pub requirements: Vec<Requirement>,
}

/// A pod pinned to its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// The node the pod was Ready on (its addresses are held there).
    pub node: String,
    /// Required requirements (ANDed); empty when pinned by preferred terms only.
    pub required: Vec<Requirement>,
    /// Preferred terms with weights.
    pub preferred: Vec<PreferredTerm>,
    /// The controller's node-loss policy fell back to preferred terms only.
    pub fallback: bool,
}

/// Decides what to do with `pod` (in `namespace`: on CREATE the object itself may not say),
/// given the PersistentPodState found for its StatefulSet, if any.
pub fn decide(pod: &Pod, namespace: &str, pps: Option<&PersistentPodState>) -> Decision {
    let Some(owner) = statefulset_owner(pod) else {
        return Decision::Pass(PassReason::NotStatefulSetPod);
    };
    let Some(pps) = pps else {
        return Decision::Pass(PassReason::NoPersistentPodState);
    };
    if pps.metadata.namespace.as_deref().unwrap_or(namespace) != namespace
        || pps.spec.target_ref.name != owner.name
    {
        return Decision::Pass(PassReason::OtherWorkload);
    }
    if pps.metadata.deletion_timestamp.is_some() {
        return Decision::Pass(PassReason::PersistentPodStateDeleting);
    }
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let retention = stamped_retention(pps);
    let (lifecycle, invalid) = match spec::check(&pps.spec) {
        Ok(config) => (config.lifecycle, None),
        Err(e) => (Default::default(), Some(e)),
    };
    // Called once, on whichever path decides.
    let managed = |pin| {
        Decision::Manage(Managed {
            pps: pps.metadata.name.clone().unwrap_or_default(),
            pod: pod_name.clone(),
            retention,
            pin,
            lifecycle: Box::new(lifecycle),
        })
    };
    if let Some(e) = invalid {
        return managed(PinOutcome::Skipped(SkipReason::InvalidSpec(e.to_string())));
    }
    let status = pps.status.clone().unwrap_or_default();
    // Records of an earlier StatefulSet of this name are not this pod's, unless the PPS says the
    // next StatefulSet of the name adopts them.
    if status
        .target_uid
        .as_ref()
        .is_some_and(|uid| !uid.is_empty() && !owner.uid.is_empty() && *uid != owner.uid)
        && !crate::view::adopts(pps.metadata.annotations.as_ref())
    {
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
    let Some(record) = status.pod_states.get(&pod_name).filter(|_| of_target) else {
        return managed(PinOutcome::Unrecorded(UnrecordedReason::FirstCreation));
    };
    let pinned = pinned_from_record(pps, record);
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
    check_ip_retention(&pps.spec.ip_retention)
        .ok()
        .map(|_| pps.spec.ip_retention.trim().to_string())
}

fn pinned_from_record(pps: &PersistentPodState, record: &PodState) -> Pinned {
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
    let mut required = pps
        .spec
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
        pps.spec
            .preferred_persistent_topology
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

/// The pod's controlling StatefulSet.
struct Owner {
    name: String,
    uid: String,
}

fn statefulset_owner(pod: &Pod) -> Option<Owner> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .filter(|o| o.kind == "StatefulSet" && o.api_version.split('/').next() == Some("apps"))
        .map(|o| Owner {
            name: o.name.clone(),
            uid: o.uid.clone(),
        })
}

/// Which of `states` (PersistentPodStates of one namespace) is StatefulSet `statefulset`'s: the
/// one named after it if it targets it, else the first by name that targets it. The webhook's
/// cache looks it up by the same rule.
pub fn persistent_pod_state_of<'a>(
    states: impl IntoIterator<Item = &'a PersistentPodState>,
    statefulset: &str,
) -> Option<&'a PersistentPodState> {
    states
        .into_iter()
        .filter(|p| {
            p.spec.target_ref.kind == "StatefulSet" && p.spec.target_ref.name == statefulset
        })
        .min_by_key(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            (name != statefulset, name)
        })
}

/// The name of the StatefulSet controlling `pod`, if one does: where to look for its
/// PersistentPodState.
pub fn statefulset_name(pod: &Pod) -> Option<String> {
    statefulset_owner(pod).map(|o| o.name)
}

/// The highest extender score (`MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

impl Pinned {
    /// Whether a node with these labels satisfies the required pin.
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        self.required
            .iter()
            .all(|r| labels.get(&r.key) == Some(&r.value))
    }

    /// Why a node that [`Self::admits`] refuses is refused: one reason for all of them, so the
    /// scheduler's FailedScheduling message counts them under one line.
    pub fn refusal(&self) -> String {
        let pins: Vec<String> = self.required.iter().map(Requirement::to_string).collect();
        format!(
            "ipkeep: pinned to {} (recorded on node {}, where its IPs are held)",
            pins.join(", "),
            self.node
        )
    }

    /// 0..=10: [`MAX_SCORE`] on the recorded node (its addresses are held there), else the
    /// share of preferred weight the node matches, at most 9.
    pub fn score(&self, node_name: &str, labels: &BTreeMap<String, String>) -> i64 {
        if node_name == self.node {
            return MAX_SCORE;
        }
        let total: i64 = self.preferred.iter().map(|t| i64::from(t.weight)).sum();
        if total == 0 {
            return 0;
        }
        let matched: i64 = self
            .preferred
            .iter()
            .filter(|t| {
                t.requirements
                    .iter()
                    .all(|r| labels.get(&r.key) == Some(&r.value))
            })
            .map(|t| i64::from(t.weight))
            .sum();
        (matched * (MAX_SCORE - 1) / total).clamp(0, MAX_SCORE - 1)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "pin_tests.rs"]
mod tests;
