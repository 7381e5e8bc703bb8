//! Whether a PersistentPodState manages the pod of an ADD or DEL, and what that makes of its
//! retention.
//!
//! The node agent watches the PersistentPodStates and the pods of its node through the API
//! server. A command that runs in the agent asks it ([`ApiView`]), and decides from what the API
//! says at that moment: a pod a PersistentPodState manages is held by that state's rules
//! whether or not the webhook stamped it when it was created (it cannot stamp a pod created
//! before its PersistentPodState existed), and a pod none manages gets at most
//! `ipam.maxUnmanagedRetention`, whatever link its annotations claim. What the agent said is
//! recorded with the addresses as *confirmed*.
//!
//! Without that view (the plugin runs alone, the agent runs without Kubernetes, or its caches
//! are not synced) the pod's annotations decide, as they always did: the link
//! `ipkeep.dev/persistent-pod-state` the webhook stamps makes the retention annotations count
//! in full. The command's log says so. Such a link is recorded unconfirmed, and protects
//! nothing when a full range needs an address.
//!
//! What is recorded also decides who gets a held address back: only a pod tied to the
//! PersistentPodState it was held for ([`ipkeep_ipam::PodRef::succeeds`]).

use std::collections::BTreeMap;
use std::fmt;

use ipkeep_ipam::{Confirmed, PodRef, Resolved, RetentionPolicy, StateRef};
use ipkeep_values::keys::PERSISTENT_POD_STATE;
use tracing::{info, warn};

/// What the API server says about a pod, as the node agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Management {
    /// PersistentPodState `persistent_pod_state` manages the pod now. `annotations` are the
    /// pod's retention annotations as the webhook stamps them on such a pod (the link, and the
    /// state's `spec.ipRetention` unless the pod sets a readable retention of its own).
    Managed {
        /// The PersistentPodState.
        persistent_pod_state: StateRef,
        /// The annotations that decide the pod's retention.
        annotations: BTreeMap<String, String>,
        /// Whether this was judged by the pod's name alone: the API no longer shows the pod
        /// (a DEL that came after it went), and the state does not record this very pod.
        judged_by_name: bool,
    },
    /// No PersistentPodState manages the pod now.
    Unmanaged,
    /// Nobody can say: the pod's annotations decide.
    Unknown(Unavailable),
    /// The node agent's view of the API server is not synced yet (it just started, or a watch
    /// is relisting after an error), and will be. An ADD follows the pod's annotations, as with
    /// [`Management::Unknown`]; a DEL leaves the addresses as they are (the agent applies the
    /// DEL once its view is synced, as one that never came), because the annotations alone
    /// would free the address of a pod the webhook did not stamp that a PersistentPodState
    /// manages.
    Syncing(Unavailable),
}

/// Why the API server's view is not available to a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// Said in the log.
    pub why: String,
    /// Whether a view was expected (an agent that failed, refused or is not synced): said as a
    /// warning. A plugin configured without an agent, or an agent without Kubernetes, says it
    /// at info level.
    pub expected: bool,
}

/// The pod a sandbox belongs to, as the runtime names it in a command.
#[derive(Debug, Clone, Copy)]
pub struct SandboxPod<'a> {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: &'a str,
    /// `K8S_POD_NAME`.
    pub name: &'a str,
    /// `K8S_POD_UID`, when the runtime passes it: which pod of that name the sandbox is for (a
    /// pod of the same name created since is another pod).
    pub uid: Option<&'a str>,
    /// Whether the command is an ADD: the pod exists in the API server then, where a DEL may
    /// come after it is gone.
    pub adding: bool,
    /// The annotations the runtime passed (what the pod had when its sandbox was created).
    pub annotations: Option<&'a BTreeMap<String, String>>,
}

/// Answers, for the pod of a command, whether a PersistentPodState manages it now.
pub trait ApiView: fmt::Debug {
    /// Who manages `pod` now.
    fn management(&self, pod: &SandboxPod<'_>) -> Management;
}

/// No view of the API server: the plugin running alone, or an agent without Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoApiView(pub Unavailable);

impl ApiView for NoApiView {
    fn management(&self, _: &SandboxPod<'_>) -> Management {
        Management::Unknown(self.0.clone())
    }
}

impl NoApiView {
    /// The plugin running on its own, for `why`; `expected` as in [`Unavailable`].
    pub fn new(why: impl Into<String>, expected: bool) -> Self {
        NoApiView(Unavailable {
            why: why.into(),
            expected,
        })
    }
}

/// What the API server's view makes of a pod's retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The retention, and how it was arrived at.
    pub resolved: Resolved,
    /// The agent's word to record with the addresses; `None` without a view.
    pub confirmed: Option<Confirmed>,
    /// Whether the agent judged by the pod's name alone ([`Management::Managed`]).
    pub judged_by_name: bool,
}

/// Resolves a pod's retention by `policy` from `management`; `annotations` are what the runtime
/// passed. Logs what an operator needs to know: a pod held although it lacks the link, a link
/// no PersistentPodState stands behind, a retention limited, no view at all.
pub fn decide(
    management: &Management,
    policy: &RetentionPolicy,
    annotations: Option<&BTreeMap<String, String>>,
) -> Decided {
    let link = annotations
        .and_then(|a| a.get(PERSISTENT_POD_STATE))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty());
    let decided = match management {
        Management::Managed {
            persistent_pod_state,
            annotations: stamped,
            judged_by_name,
        } => {
            if link != Some(persistent_pod_state.name.as_str()) {
                info!(
                    persistent_pod_state = %persistent_pod_state,
                    link = link.unwrap_or(""),
                    hint = "the node agent's view of the API server says so: retention by that state's rules",
                    "PersistentPodState {persistent_pod_state} manages this pod although its {PERSISTENT_POD_STATE} annotation does not say so"
                );
            }
            Decided {
                resolved: policy.resolve(Some(stamped)),
                confirmed: Some(Confirmed::By(persistent_pod_state.clone())),
                judged_by_name: *judged_by_name,
            }
        }
        Management::Unmanaged => {
            if let Some(link) = link {
                warn!(
                    link,
                    hint = "the node agent's view of the API server: the pod is not managed",
                    "the pod's {PERSISTENT_POD_STATE} annotation names {link:?}, but no PersistentPodState manages this pod"
                );
            }
            let mut without_link = annotations.cloned().unwrap_or_default();
            without_link.remove(PERSISTENT_POD_STATE);
            Decided {
                resolved: policy.resolve(annotations.map(|_| &without_link)),
                confirmed: Some(Confirmed::Nobody),
                judged_by_name: false,
            }
        }
        Management::Unknown(unavailable) | Management::Syncing(unavailable) => {
            let text = "no view of the API server: whether a PersistentPodState manages this pod follows its annotations";
            if unavailable.expected {
                warn!(why = %unavailable.why, linked = link.is_some(), "{text}");
            } else {
                info!(why = %unavailable.why, linked = link.is_some(), "{text}");
            }
            Decided {
                resolved: policy.resolve(annotations),
                confirmed: None,
                judged_by_name: false,
            }
        }
    };
    if let Some(why) = &decided.resolved.adjusted {
        warn!("{why}");
    }
    decided
}

impl Decided {
    /// Records the agent's word, if any, in `pod`.
    pub fn record(&self, pod: &mut PodRef) {
        if let Some(word) = &self.confirmed {
            pod.confirm(word);
        }
    }
}
