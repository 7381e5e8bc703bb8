//! The validating webhook's answer to a pod DELETE or a `pods/eviction` CREATE. It is an answer
//! only: the webhook cannot tell a request from the API server from a forged one, so nothing it
//! decides changes the cluster. While the pod carries its preDelete hook the request is refused
//! (429, retried by the StatefulSet controller, the garbage collector and `kubectl drain`), with
//! a message that says what the pod waits for and how to get past it.

use std::fmt;

use ipkeep_values::keys::STATE_LABEL;

use crate::{Going, Lifecycle, PodFacts};

/// A DELETE of a pod, or a create of its `eviction` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteRequest {
    /// `gracePeriodSeconds: 0` (a force deletion).
    pub force: bool,
    /// An eviction (a drain) rather than a deletion.
    pub eviction: bool,
}

/// Why a deletion passes although the pod carries its hook, for the log and the admission
/// warning.
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
    /// Let it through; `escaped` says which hatch a held pod went through.
    Allow {
        /// Set when the pod carries its hook.
        escaped: Option<Escape>,
    },
    /// Refuse it; the caller retries.
    Deny {
        /// What the pod waits for, and how to get past it.
        message: String,
    },
}

/// Whether a deletion or eviction of `pod` may pass at `now` (unix seconds). The timeout runs
/// from the hold's start that the controller's decision reads too ([`PodFacts::hold_start`]).
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
    let what = if request.eviction {
        "eviction"
    } else {
        "deletion"
    };
    let labels = hook
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let force = "`kubectl delete pod --force --grace-period=0` skips the hook";
    let Some(since) = pod.hold_start(now) else {
        return Admission::Deny {
            message: format!(
                "ipkeep: the {what} of pod {pod_name} waits for its preDelete hook: the pod carries {labels} and is not PreparingDelete yet; \
                 ipkeep starts the hook when its StatefulSet scales it down or replaces it, when its StatefulSet is deleted, or when its node is cordoned (kubectl drain does); \
                 to deregister and delete just this pod, `kubectl label pod {pod_name} {STATE_LABEL}=PreparingDelete --overwrite` and retry once your operator has removed {labels}; {force}"
            ),
        };
    };
    let held_for = now.saturating_sub(since);
    if held_for >= lifecycle.pre_delete_timeout {
        return escaped(Escape::TimedOut);
    }
    let left = lifecycle.pre_delete_timeout - held_for;
    let why = pod.held.unwrap_or(Going::Requested).describe();
    Admission::Deny {
        message: format!(
            "ipkeep: the {what} of pod {pod_name} waits for its preDelete hook: it is PreparingDelete ({why}) until the label {labels} is removed or changed (your operator deregisters the pod first); \
             it goes through then, or in {left} s at the latest; {force}"
        ),
    }
}
