//! The controller's decision for one pod: its state, why it is held, its readiness gate's
//! condition, and whether ipkeep deletes it. Inputs are the pod as the API server has it and
//! what wants it gone ([`crate::going`]), never a webhook request.

use crate::{ABANDONED_AFTER_SECS, Going, Hook, Lifecycle, PodFacts, State};

/// What the cluster says of a pod's future, from state only authorised principals write
/// ([`crate::going`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Something that may delete it wants it gone.
    Going(Going),
    /// Nothing wants it gone.
    Staying,
    /// Not known right now (its StatefulSet's status has not caught up with its spec): a hold
    /// stays as it is, none starts, nothing is deleted.
    Unknown,
}

/// How soon a pod whose fate is unknown is looked at again (seconds).
pub const UNKNOWN_RECHECK_SECS: u64 = 5;

/// Where the controller should bring a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// The state label (`None`: leave the pod unlabelled, it has no hooks).
    pub state: Option<State>,
    /// When its hold started, while it is `PreparingDelete` (the condition
    /// [`ipkeep_values::keys::HELD_CONDITION`] and its copy
    /// [`ipkeep_values::keys::SINCE_ANNOTATION`]; `None`: not held). Never later than `now`.
    pub held_since: Option<u64>,
    /// Why it is `PreparingDelete` ([`ipkeep_values::keys::HELD_ANNOTATION`]; `None`: no annotation).
    pub held: Option<Going>,
    /// The readiness gate's condition (`None`: the pod has no gate to set).
    pub ready: Option<bool>,
    /// When to look at the pod again although nothing changes (unix seconds): when a held
    /// deletion times out, or a requested one counts as abandoned.
    pub recheck_at: Option<u64>,
    /// Delete the pod: the StatefulSet controller wants it gone and the hook now lets it go
    /// (or timed out).
    pub delete: bool,
}

/// The controller's decision for one pod at `now` (unix seconds), whenever the pod, its
/// PersistentPodState, its StatefulSet or its node changes. `fate` comes from the cluster
/// ([`crate::going`]; it is never [`Going::Requested`], which only the pod's own label says). A
/// gated pod's condition follows its state even when its PersistentPodState or hooks are gone,
/// so no pod is left not Ready by a gate nobody sets. A hold keeps its start
/// ([`PodFacts::hold_start`]) until its reason goes (or the hook is removed, or a request is
/// abandoned), whatever the pod's labels and annotations say meanwhile: whoever may patch the
/// pod cannot restart the timeout.
pub fn reconcile(lifecycle: &Lifecycle, pod: &PodFacts<'_>, fate: Fate, now: u64) -> Wanted {
    let gate = |r: bool| pod.gated.then_some(r);
    let Some(labelled) = pod.state() else {
        // Never labelled (created while the webhook was down, or before the hooks): it fails
        // open, and never gets a state after the fact.
        return Wanted {
            state: None,
            held_since: pod.held_since,
            held: pod.held,
            ready: gate(true),
            recheck_at: None,
            delete: false,
        };
    };
    let carries = |h: &Option<Hook>| h.as_ref().is_some_and(|h| h.carried_by(pod.labels));
    let holds_deletion = carries(&lifecycle.pre_delete);
    let drains = lifecycle
        .pre_delete
        .as_ref()
        .is_some_and(|h| h.mark_pod_not_ready);
    // Where a pod stands when nothing holds its deletion: waiting for PreNormal, or Normal. A
    // pod that leaves PreparingDelete without going (the scale-down was undone, the node
    // uncordoned) was deregistered by then, so it goes through PreNormal again.
    let settled = |from: State| -> Wanted {
        let waiting = lifecycle
            .pre_normal
            .as_ref()
            .filter(|h| !h.carried_by(pod.labels));
        let (state, ready) = match waiting {
            Some(hook) if from != State::Normal => {
                (State::PreparingNormal, !hook.mark_pod_not_ready)
            }
            _ => (State::Normal, true),
        };
        Wanted {
            state: Some(state),
            held_since: None,
            held: None,
            ready: gate(ready),
            recheck_at: None,
            delete: false,
        }
    };
    let held = |why: Going, since: u64| Wanted {
        state: Some(State::PreparingDelete),
        held_since: Some(since),
        held: Some(why),
        ready: gate(!drains),
        recheck_at: None,
        delete: false,
    };
    // The start of a hold already on record.
    let since = pod.hold_start(now);
    let going = match fate {
        Fate::Going(why) => Some(why),
        Fate::Staying => None,
        Fate::Unknown
            if (labelled == State::PreparingDelete || pod.held_since.is_some())
                && !pod.terminating =>
        {
            return Wanted {
                held_since: since,
                held: pod.held,
                recheck_at: Some(now.saturating_add(UNKNOWN_RECHECK_SECS)),
                ..held(Going::Requested, now)
            };
        }
        Fate::Unknown => None,
    };
    match labelled {
        // A hold on record goes on while its reason does, whatever the labels say meanwhile:
        // ending it on a label would let whoever may patch the pod restart its timeout.
        State::PreparingNormal | State::Normal => match going {
            Some(why) if (holds_deletion || pod.held_since.is_some()) && !pod.terminating => {
                held(why, since.unwrap_or(now))
            }
            _ => settled(labelled),
        },
        State::PreparingDelete if pod.terminating => {
            // Going anyway: keep what it shows until it is gone.
            Wanted {
                held_since: since,
                held: pod.held,
                ..held(Going::Requested, now)
            }
        }
        State::PreparingDelete => {
            // A reason read from the cluster wins; without one, a mark ipkeep made for a reason
            // that has gone lets go at once, and any other mark is a request.
            let why = going.or(match pod.held {
                None | Some(Going::Requested) => Some(Going::Requested),
                Some(_) => None,
            });
            let Some(why) = why.filter(|_| lifecycle.pre_delete.is_some()) else {
                return settled(State::PreparingDelete);
            };
            let since = since.unwrap_or(now);
            let timed_out_at = since.saturating_add(lifecycle.pre_delete_timeout);
            if why == Going::Requested {
                let abandoned_at = timed_out_at.saturating_add(ABANDONED_AFTER_SECS);
                if now >= abandoned_at {
                    return settled(State::PreparingDelete);
                }
                return Wanted {
                    recheck_at: Some(abandoned_at),
                    ..held(why, since)
                };
            }
            if !why.completes() {
                return held(why, since);
            }
            if !holds_deletion || now >= timed_out_at {
                return Wanted {
                    delete: true,
                    ..held(why, since)
                };
            }
            Wanted {
                recheck_at: Some(timed_out_at),
                ..held(why, since)
            }
        }
    }
}
