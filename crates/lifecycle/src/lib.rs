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
//!   [`READINESS_GATE`] at CREATE (the webhook adds them): it runs, but the gate's condition
//!   stays False, so it is not Ready and Services and the StatefulSet's ordered rollout wait.
//!   Once the pod carries the hook (the operator registered it and added the labels), it is
//!   [`State::Normal`] and the gate True.
//! * **PreDelete.** While a pod carries the hook, its deletion or eviction is refused with a
//!   message saying what it waits for, and the pod is marked [`State::PreparingDelete`]; with
//!   `markPodNotReady` its gate goes False first, so traffic drains. Once the operator
//!   deregisters the pod and removes a label, the deletion proceeds.
//!
//! A held **deletion** is completed by ipkeep once the hook lets the pod go (the controller
//! deletes it), because its deleter may never retry: the StatefulSet controller with
//! `OrderedReady` waits for every pod to be Ready before it acts again. A held **eviction** is
//! left to the drain that retries it.
//!
//! Escape hatches, so nothing is held for ever: a force deletion (grace period 0) always passes;
//! so does any deletion of a pod whose node is not Ready (its operator cannot act there, and pod
//! garbage collection must proceed), of a pod already terminating, and any deletion once the pod
//! has been `PreparingDelete` for the hook's timeout (a node drain waits at most that long). A
//! pod the webhook never saw (created while it was down: it fails open) has no state and no gate
//! and is treated as `Normal`. A pod still `PreparingDelete` [`ABANDONED_AFTER_SECS`] past the
//! timeout after a held eviction nobody retried (a drain cancelled) returns to `Normal`, so
//! nothing stays not Ready for ever.

use std::collections::BTreeMap;
use std::fmt;

/// The pod label that shows where a pod stands.
pub const STATE_LABEL: &str = "ipkeep.dev/lifecycle-state";
/// The pod annotation with the unix second the pod entered its state.
pub const SINCE_ANNOTATION: &str = "ipkeep.dev/lifecycle-since";
/// The pod annotation that says what was held when the pod became `PreparingDelete`
/// ([`Held`]).
pub const HELD_ANNOTATION: &str = "ipkeep.dev/lifecycle-held";
/// The readiness gate (condition type) ipkeep sets on pods of a StatefulSet with hooks.
pub const READINESS_GATE: &str = "ipkeep.dev/lifecycle-ready";
/// How long a pod may be held in `PreparingDelete` unless the hook says otherwise.
pub const DEFAULT_PRE_DELETE_TIMEOUT_SECS: u64 = 600;
/// How long past the PreDelete timeout a pod still in `PreparingDelete` returns to `Normal`: any
/// deletion would have passed since the timeout, so nobody is deleting it.
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

/// What was held when a pod became `PreparingDelete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A deletion (the StatefulSet controller, a user, the garbage collector): ipkeep completes
    /// it once the hook lets the pod go. The StatefulSet controller would not retry it in every
    /// case: with `OrderedReady` it waits for a not-Ready pod to be Ready again first, which
    /// `markPodNotReady` prevents.
    Deletion,
    /// An eviction (a drain): whoever evicts retries, and an eviction is not turned into a
    /// deletion (that would skip the pod's disruption budgets).
    Eviction,
}

impl Held {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Deletion => "deletion",
            Held::Eviction => "eviction",
        }
    }

    /// Reads an annotation value.
    pub fn parse(text: &str) -> Option<Held> {
        match text {
            "deletion" => Some(Held::Deletion),
            "eviction" => Some(Held::Eviction),
            _ => None,
        }
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

    fn describe(&self) -> String {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
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
    /// Whether to add the readiness gate [`READINESS_GATE`].
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

/// What the controller reads of a pod.
#[derive(Debug, Clone, Copy)]
pub struct PodFacts<'a> {
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// When it entered its state ([`SINCE_ANNOTATION`]), if known.
    pub since: Option<u64>,
    /// It has a deletion timestamp, or it has finished (phase `Succeeded` or `Failed`).
    pub terminating: bool,
    /// Its node is Ready (false when unbound, NotReady or gone).
    pub node_ready: bool,
    /// Its spec has the readiness gate [`READINESS_GATE`] (only the webhook adds it, at CREATE).
    pub gated: bool,
    /// What was held when it became `PreparingDelete` ([`HELD_ANNOTATION`]).
    pub held: Option<Held>,
}

impl PodFacts<'_> {
    /// The state its label says; a pod the webhook never saw has none.
    pub fn state(&self) -> Option<State> {
        self.labels.get(STATE_LABEL).and_then(|s| State::parse(s))
    }
}

/// Where the controller should bring a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// The state label (`None`: leave the pod unlabelled, it has no hooks).
    pub state: Option<State>,
    /// The readiness gate's condition (`None`: the pod has no gate to set).
    pub ready: Option<bool>,
    /// When to look at the pod again although nothing changes (unix seconds): when a held
    /// deletion times out, or a `PreparingDelete` pod counts as abandoned.
    pub recheck_at: Option<u64>,
    /// Delete the pod: a deletion was held and the hook now lets it go (or timed out).
    pub delete: bool,
}

/// The controller's decision for one pod at `now` (unix seconds), whenever the pod or the
/// configuration changes. A gated pod's condition follows its state even when its
/// PersistentPodState or hooks are gone, so no pod is left not Ready by a gate nobody sets.
pub fn reconcile(lifecycle: &Lifecycle, pod: &PodFacts<'_>, now: u64) -> Wanted {
    let ready = |r: bool| pod.gated.then_some(r);
    let wanted = |state: Option<State>, r: bool| Wanted {
        state,
        ready: ready(r),
        recheck_at: None,
        delete: false,
    };
    match pod.state() {
        // Never labelled (created while the webhook was down, or before the hooks): it fails
        // open, and never becomes PreparingNormal after the fact.
        None => wanted(None, true),
        Some(State::PreparingNormal) => match &lifecycle.pre_normal {
            Some(hook) if !hook.carried_by(pod.labels) => {
                wanted(Some(State::PreparingNormal), !hook.mark_pod_not_ready)
            }
            _ => wanted(Some(State::Normal), true),
        },
        Some(State::Normal) => wanted(Some(State::Normal), true),
        Some(State::PreparingDelete) => {
            if pod.terminating {
                // Going anyway: keep what it shows until it is gone.
                return wanted(Some(State::PreparingDelete), !drains(lifecycle));
            }
            let since = pod.since.unwrap_or(now);
            let timed_out_at = since.saturating_add(lifecycle.pre_delete_timeout);
            let released = !lifecycle
                .pre_delete
                .as_ref()
                .is_some_and(|h| h.carried_by(pod.labels));
            let held = wanted(Some(State::PreparingDelete), !drains(lifecycle));
            if pod.held == Some(Held::Deletion) {
                if released || now >= timed_out_at {
                    return Wanted {
                        delete: true,
                        ..held
                    };
                }
                return Wanted {
                    recheck_at: Some(timed_out_at),
                    ..held
                };
            }
            let abandoned_at = timed_out_at.saturating_add(ABANDONED_AFTER_SECS);
            if now >= abandoned_at {
                return wanted(Some(State::Normal), true);
            }
            Wanted {
                recheck_at: Some(abandoned_at),
                ..held
            }
        }
    }
}

/// Whether the PreDelete hook takes a held pod out of its Services.
fn drains(lifecycle: &Lifecycle) -> bool {
    lifecycle
        .pre_delete
        .as_ref()
        .is_some_and(|h| h.mark_pod_not_ready)
}

/// A DELETE of a pod, or a create of its `eviction` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteRequest {
    /// `gracePeriodSeconds: 0` (a force deletion).
    pub force: bool,
    /// An eviction (a drain) rather than a deletion.
    pub eviction: bool,
    /// A dry run: decide, but mark nothing.
    pub dry_run: bool,
}

/// Why a deletion passes although the pod is blocked, for the log and the admission warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// A force deletion.
    Force,
    /// The pod's node is not Ready.
    NodeNotReady,
    /// Held for the hook's timeout already.
    TimedOut,
}

impl fmt::Display for Escape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Escape::Force => "a force deletion skips the preDelete hook",
            Escape::NodeNotReady => "the pod's node is not Ready, so the preDelete hook cannot run",
            Escape::TimedOut => "the pod was held in PreparingDelete for the hook's timeout",
        })
    }
}

/// The admission decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Let it through; `escaped` says which hatch a blocked pod went through.
    Allow {
        /// Set when the pod was blocked.
        escaped: Option<Escape>,
    },
    /// Refuse it; the caller retries.
    Deny {
        /// What the pod waits for, and how to get past it.
        message: String,
        /// Mark the pod `PreparingDelete` since this unix second (`None`: it already is, or a
        /// dry run).
        mark_since: Option<u64>,
    },
}

/// Whether a deletion or eviction of `pod` may pass at `now` (unix seconds).
pub fn admit_delete(
    lifecycle: &Lifecycle,
    pod: &PodFacts<'_>,
    request: DeleteRequest,
    now: u64,
    pod_name: &str,
) -> Admission {
    let allow = Admission::Allow { escaped: None };
    let Some(hook) = &lifecycle.pre_delete else {
        return allow;
    };
    if pod.terminating || !hook.carried_by(pod.labels) {
        return allow;
    }
    let escaped = |e| Admission::Allow { escaped: Some(e) };
    if request.force {
        return escaped(Escape::Force);
    }
    if !pod.node_ready {
        return escaped(Escape::NodeNotReady);
    }
    let preparing = pod.state() == Some(State::PreparingDelete);
    let since = if preparing { pod.since } else { None };
    if since.is_some_and(|s| now.saturating_sub(s) >= lifecycle.pre_delete_timeout) {
        return escaped(Escape::TimedOut);
    }
    let left = since.map_or(lifecycle.pre_delete_timeout, |s| {
        lifecycle
            .pre_delete_timeout
            .saturating_sub(now.saturating_sub(s))
    });
    let what = if request.eviction {
        "eviction"
    } else {
        "deletion"
    };
    Admission::Deny {
        message: format!(
            "ipkeep: the {what} of pod {pod_name} waits for its preDelete hook: it is PreparingDelete until the label {} is removed or changed (your operator deregisters the pod first); it goes through then, or in {left} s at the latest; `kubectl delete pod --force --grace-period=0` skips the hook",
            hook.describe()
        ),
        mark_since: (!preparing && !request.dry_run).then_some(now),
    }
}

#[cfg(test)]
mod tests;
