//! Lifecycle hooks for the pods of native StatefulSets, as pure decisions (no I/O): the state
//! machine behind a PersistentPodState's `spec.lifecycle`, shaped after OpenKruise's CloneSet
//! `lifecycle` with `labelsHandler`. The scheduler extension's webhooks and the controller's
//! lifecycle loop apply it (docs/lifecycle.md).
//!
//! Middleware that registers pods in a service-discovery centre of its own must register a pod
//! **before** it counts as available, and deregister it **before** it goes. Two hooks, each a
//! set of labels (`labelsHandler`); a pod **carries** a hook while it has every one of the
//! hook's labels with the hook's value (OpenKruise's "hooked"). Usually both hooks name the same
//! label, which the user's operator adds once it registered the pod and removes once it
//! deregistered it:
//!
//! * **PreNormal.** A new pod gets the state [`State::PreparingNormal`] and the readiness gate
//!   [`ipkeep_values::keys::READINESS_GATE`] at CREATE (the webhook adds them): it runs, but the gate's condition
//!   stays False, so it is not Ready and Services and the StatefulSet's ordered rollout wait.
//!   Once the pod carries the hook (the operator registered it and added the labels), it is
//!   [`State::Normal`] and the gate True.
//! * **PreDelete.** While a pod carries the hook, its deletion or eviction is refused with a
//!   message saying what it waits for ([`admission`]). The controller marks the pod
//!   [`State::PreparingDelete`] when something that may delete it wants it gone
//!   ([`going`]: its StatefulSet scales it down or rolls it, its node is cordoned, its
//!   StatefulSet is deleted, or someone who may patch it asked); with `markPodNotReady` its
//!   gate goes False first, so traffic drains. Once the operator deregisters the pod and
//!   removes a label, the deletion proceeds ([`reconcile`]).
//!
//! Nothing a request to the webhook says changes a pod: a forged request gets an answer and
//! nothing else. Escape hatches, so nothing is held for ever: a force deletion (grace period 0)
//! always passes; so does any deletion of a pod whose node is not Ready (its operator cannot act
//! there, and pod garbage collection must proceed), of a pod already terminating, and any
//! deletion once the pod has been `PreparingDelete` for the hook's timeout (a node drain waits
//! at most that long: the hold's start is ipkeep's own record, which no pod label or annotation
//! moves, [`PodFacts::hold_start`]). A pod the webhook never saw (created while it was down: it
//! fails open) has no state and no gate and is treated as `Normal`.

use std::collections::BTreeMap;
use std::fmt;

use ipkeep_values::keys::STATE_LABEL;

/// How long a pod may be held in `PreparingDelete` unless the hook says otherwise.
pub const DEFAULT_PRE_DELETE_TIMEOUT_SECS: u64 = 600;
/// How long past the PreDelete timeout a pod someone asked to delete ([`Going::Requested`]) but
/// nobody deleted returns from `PreparingDelete`: any deletion would have passed since the
/// timeout, so nobody is deleting it.
pub const ABANDONED_AFTER_SECS: u64 = 120;

/// Where a pod stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Created, waiting for the PreNormal hook.
    PreparingNormal,
    /// Available (as far as the hooks go).
    Normal,
    /// A deletion was refused; waiting for the PreDelete hook.
    PreparingDelete,
}

impl State {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            State::PreparingNormal => "PreparingNormal",
            State::Normal => "Normal",
            State::PreparingDelete => "PreparingDelete",
        }
    }

    /// Reads a label value; anything else is no state.
    pub fn parse(text: &str) -> Option<State> {
        match text {
            "PreparingNormal" => Some(State::PreparingNormal),
            "Normal" => Some(State::Normal),
            "PreparingDelete" => Some(State::PreparingDelete),
            _ => None,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One hook.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hook {
    /// `labelsHandler`: the pod carries the hook while it has all of these with these values.
    pub labels: BTreeMap<String, String>,
    /// `markPodNotReady`: the readiness gate is False while the pod is held by this hook
    /// (PreNormal: until it carries the hook; PreDelete: from the first held deletion).
    pub mark_pod_not_ready: bool,
}

impl Hook {
    /// Whether a pod with `pod_labels` carries this hook: it has every label with its value. A
    /// hook without labels is never carried.
    pub fn carried_by(&self, pod_labels: &BTreeMap<String, String>) -> bool {
        !self.labels.is_empty()
            && self
                .labels
                .iter()
                .all(|(k, v)| pod_labels.get(k) == Some(v))
    }
}

/// A PersistentPodState's `spec.lifecycle`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// `preNormal`.
    pub pre_normal: Option<Hook>,
    /// `preDelete`.
    pub pre_delete: Option<Hook>,
    /// How long `PreparingDelete` may hold a pod (seconds).
    pub pre_delete_timeout: u64,
}

impl Lifecycle {
    /// Whether the pods get the readiness gate: a hook that can hold them not Ready.
    pub fn gates_readiness(&self) -> bool {
        [&self.pre_normal, &self.pre_delete]
            .into_iter()
            .flatten()
            .any(|h| h.mark_pod_not_ready)
    }
}

/// What the webhook adds to a new pod at CREATE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AtCreate {
    /// The state label's value, when the pod has hooks.
    pub state: Option<State>,
    /// Whether to add the readiness gate [`ipkeep_values::keys::READINESS_GATE`].
    pub readiness_gate: bool,
}

/// What a new pod gets: `PreparingNormal` with a PreNormal hook (the controller makes it
/// `Normal` once it carries the hook, at once if it was created with the labels), else
/// `Normal`; the gate when a hook can hold the pod not Ready.
pub fn at_create(lifecycle: &Lifecycle) -> AtCreate {
    let state = match (&lifecycle.pre_normal, &lifecycle.pre_delete) {
        (Some(_), _) => Some(State::PreparingNormal),
        (None, Some(_)) => Some(State::Normal),
        (None, None) => None,
    };
    AtCreate {
        state,
        readiness_gate: lifecycle.gates_readiness(),
    }
}

/// What the controller and the webhook read of a pod.
#[derive(Debug, Clone, Copy)]
pub struct PodFacts<'a> {
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// When ipkeep-controller began to hold it: the `lastTransitionTime` of its condition
    /// [`ipkeep_values::keys::HELD_CONDITION`] while that is True. The condition is in the pod's
    /// status, which only the status subresource writes: ipkeep-controller, not whoever may
    /// patch the pod.
    pub held_since: Option<u64>,
    /// Its annotation [`ipkeep_values::keys::SINCE_ANNOTATION`]: a copy of the hold's start that
    /// whoever may patch the pod can change. Read only for a pod marked `PreparingDelete` without
    /// the condition (by a release before it, or by hand), and never as later than now
    /// ([`PodFacts::hold_start`]).
    pub since_annotation: Option<u64>,
    /// It has a deletion timestamp, or it has finished (phase `Succeeded` or `Failed`).
    pub terminating: bool,
    /// Its node is Ready (false when unbound, NotReady or gone).
    pub node_ready: bool,
    /// Its spec has the readiness gate [`ipkeep_values::keys::READINESS_GATE`] (only the webhook adds it, at CREATE).
    pub gated: bool,
    /// Why it is `PreparingDelete`, as its annotation [`ipkeep_values::keys::HELD_ANNOTATION`] says.
    pub held: Option<Going>,
}

impl PodFacts<'_> {
    /// The state its label says; a pod the webhook never saw has none.
    pub fn state(&self) -> Option<State> {
        self.labels.get(STATE_LABEL).and_then(|s| State::parse(s))
    }

    /// When its hold started, as it counts at `now` (unix seconds): ipkeep's condition, whatever
    /// the state label says now; without one, the annotation of a pod labelled
    /// `PreparingDelete`. Never later than `now`, so the timeout runs from the first moment a
    /// hold is seen at the latest, whatever time the pod claims. `None`: not held.
    pub fn hold_start(&self, now: u64) -> Option<u64> {
        let unrecorded = self
            .since_annotation
            .filter(|_| self.state() == Some(State::PreparingDelete));
        self.held_since.or(unrecorded).map(|since| since.min(now))
    }
}

pub mod admission;
pub mod going;
pub mod reconcile;

pub use admission::{Admission, DeleteRequest, Escape, admit_delete};
pub use going::Going;
pub use reconcile::{Fate, Wanted, reconcile};

#[cfg(test)]
mod tests;
