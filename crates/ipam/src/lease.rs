//! What the store records for one address: who owns it now, which pod it belongs to, and
//! whether it is in use or held for a deleted pod.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::retention::Retention;

/// The CNI attachment that owns an address: `(CNI_CONTAINERID, CNI_IFNAME)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// The sandbox container ID.
    pub container_id: String,
    /// The interface name inside the sandbox.
    pub ifname: String,
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.container_id, self.ifname)
    }
}

/// The Kubernetes pod behind an attachment, from `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID`, when the runtime passes it: a new sandbox of the same pod names the same
    /// one, a rebuilt pod (or any other pod of the name) another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The PersistentPodState that manages the pod, from its
    /// [`ipkeep_values::keys::PERSISTENT_POD_STATE`] (set by ipkeep's webhook). The node agent releases a
    /// holding at once when that PersistentPodState is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_pod_state: Option<String>,
    /// The UID of [`Self::persistent_pod_state`], when the node agent confirmed it: a name comes
    /// back when a PersistentPodState is deleted and created again, a UID never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_pod_state_uid: Option<String>,
    /// Whether [`Self::persistent_pod_state`] is the node agent's word, read from the API server
    /// at the pod's last ADD or DEL through the agent ([`Self::confirm`]), rather than only the
    /// pod's annotation, which whoever creates a pod can write. Only a confirmed link protects a
    /// holding when a full range needs an address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirmed: bool,
}

/// Which PersistentPodState manages a pod, in the node agent's word from the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmed {
    /// This PersistentPodState manages the pod.
    By(StateRef),
    /// No PersistentPodState manages the pod.
    Nobody,
}

/// A PersistentPodState of the pod's namespace, as the node agent names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRef {
    /// Its name.
    pub name: String,
    /// Its UID, when the agent's view has one.
    pub uid: Option<String>,
}

impl From<&str> for StateRef {
    fn from(name: &str) -> Self {
        StateRef {
            name: name.to_string(),
            uid: None,
        }
    }
}

impl From<String> for StateRef {
    fn from(name: String) -> Self {
        StateRef { name, uid: None }
    }
}

impl fmt::Display for StateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl PodRef {
    /// Records the node agent's word on who manages the pod, in place of its annotation.
    pub fn confirm(&mut self, word: &Confirmed) {
        (self.persistent_pod_state, self.persistent_pod_state_uid) = match word {
            Confirmed::By(state) => (Some(state.name.clone()), state.uid.clone()),
            Confirmed::Nobody => (None, None),
        };
        self.confirmed = true;
    }

    /// The PersistentPodState the node agent confirmed manages the pod, if it did.
    pub fn confirmed_manager(&self) -> Option<&str> {
        self.persistent_pod_state
            .as_deref()
            .filter(|_| self.confirmed)
    }

    /// What the node agent said about the pod when this was recorded, if it was asked.
    pub fn word(&self) -> Option<Confirmed> {
        self.confirmed.then(|| match &self.persistent_pod_state {
            Some(name) => Confirmed::By(StateRef {
                name: name.clone(),
                uid: self.persistent_pod_state_uid.clone(),
            }),
            None => Confirmed::Nobody,
        })
    }

    /// This pod as an address it takes over from `earlier` records it: when nobody asked the
    /// agent about it this time but it is the same pod (the same pod UID), the tie recorded for
    /// it before stays (the agent's word from an earlier command outweighs an annotation, and
    /// no word is no reason to forget one); a pod the agent judged now is recorded as judged.
    pub fn keeping_tie(&self, earlier: Option<&PodRef>) -> PodRef {
        match earlier {
            Some(e) if !self.confirmed && self.uid.is_some() && self.uid == e.uid => PodRef {
                persistent_pod_state: e.persistent_pod_state.clone(),
                persistent_pod_state_uid: e.persistent_pod_state_uid.clone(),
                confirmed: e.confirmed,
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// Whether this pod may take over the addresses kept for `earlier`, a pod of the same
    /// identity: the same pod may (the runtime names the same pod UID: a new sandbox of a pod
    /// that still exists, after a reboot); any pod may, when no PersistentPodState was tied to
    /// `earlier` (they are kept by `ipam.retention` for whatever pod comes next under the
    /// name); otherwise only a pod tied to that same state: the same name, and the same UID
    /// where both are known. A tie is the agent's word, or without its view the webhook's link
    /// annotation; a pod the agent says nothing manages has none.
    pub fn succeeds(&self, earlier: &PodRef) -> bool {
        if self.uid.is_some() && self.uid == earlier.uid {
            return true;
        }
        let Some(state) = earlier.persistent_pod_state.as_deref() else {
            return true;
        };
        let same_uid = match (
            earlier.persistent_pod_state_uid.as_deref(),
            self.persistent_pod_state_uid.as_deref(),
        ) {
            (Some(then), Some(now)) => then == now,
            _ => true,
        };
        self.persistent_pod_state.as_deref() == Some(state) && same_uid
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A pod's retention identity within one network: `(namespace, pod name, ifname)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodIdentity {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name (stable across StatefulSet rebuilds).
    pub name: String,
    /// Interface name.
    pub ifname: String,
}

impl fmt::Display for PodIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.ifname)
    }
}

/// Whether an address is in use or held for a deleted pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum LeaseState {
    /// Configured in a live sandbox.
    Active,
    /// The sandbox was deleted; kept for the same pod identity until `until` (unix seconds;
    /// `None` = forever).
    Held {
        /// When the holding ends.
        until: Option<u64>,
    },
}

/// One allocated or held address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The address.
    pub ip: IpAddr,
    /// The attachment that owns it (for a held lease: the last one that did).
    pub owner: Attachment,
    /// The pod, when the runtime said which one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// Retention resolved when the address was last added.
    pub retention: Retention,
    /// In use or held.
    #[serde(flatten)]
    pub state: LeaseState,
    /// Unix seconds (by the store's clock) of the last change of owner or state.
    pub since: u64,
    /// The owning sandbox's network namespace (`CNI_NETNS` at ADD), while the lease is active:
    /// a rebuilt pod takes the address over only once this no longer exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
}

impl Lease {
    /// The retention identity, if the lease belongs to a named pod.
    pub fn identity(&self) -> Option<PodIdentity> {
        self.pod.as_ref().map(|p| PodIdentity {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            ifname: self.owner.ifname.clone(),
        })
    }

    /// Whether the lease is configured in a live sandbox.
    pub fn is_active(&self) -> bool {
        self.state == LeaseState::Active
    }

    /// Whether the lease is a holding whose time has come.
    pub fn is_expired(&self, now: u64) -> bool {
        matches!(self.state, LeaseState::Held { until: Some(until) } if until <= now)
    }
}
