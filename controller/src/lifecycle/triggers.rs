//! Which pods with hooks an event elsewhere concerns. A pod's fate changes with its StatefulSet
//! (replicas, update revision, strategy), with the other pods of that StatefulSet (one becoming
//! Ready lets the rolling update move on), with its Node (cordoned) and with its
//! PersistentPodState (the hooks themselves). The watches of these kinds are tapped ([`Tap`]),
//! and only changes of what the decision reads go through.

use std::hash::{DefaultHasher, Hash, Hasher};

use ipkeep_api::PersistentPodState;
use ipkeep_values::keys::{REVISION_LABEL, STATE_LABEL};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::caches::{CachedPod, Changes};

/// Something that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// StatefulSet `name` in `namespace`: its pods with hooks.
    StatefulSet {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// Node `name`: the pods with hooks on it.
    Node(String),
}

/// The pods with hooks a trigger concerns, from the lifecycle loop's cache.
pub fn pods_for(pods: &Store<Pod>, trigger: &Trigger) -> Vec<ObjectRef<Pod>> {
    pods.state()
        .into_iter()
        .filter(|p| match trigger {
            Trigger::StatefulSet { namespace, name } => {
                p.namespace().as_deref() == Some(namespace.as_str())
                    && p.owner_references().iter().any(|o| {
                        o.controller == Some(true) && o.kind == "StatefulSet" && o.name == *name
                    })
            }
            Trigger::Node(node) => {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
            }
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// What of an object concerns the hooks, and which trigger its change is.
pub trait Concerns: Resource + Sized {
    /// A hash of what the lifecycle decision reads of it.
    fn fingerprint(&self) -> u64;
    /// The trigger for a change of it.
    fn trigger(&self) -> Option<Trigger>;
}

fn hash<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

impl Concerns for StatefulSet {
    fn fingerprint(&self) -> u64 {
        let spec = self.spec.as_ref();
        let strategy = spec.and_then(|s| s.update_strategy.as_ref());
        let status = self.status.as_ref();
        hash(&(
            self.metadata.uid.as_deref(),
            self.metadata.generation,
            self.metadata.deletion_timestamp.is_some(),
            spec.and_then(|s| s.replicas),
            spec.and_then(|s| s.ordinals.as_ref()).and_then(|o| o.start),
            spec.and_then(|s| s.pod_management_policy.as_deref()),
            strategy.and_then(|s| s.type_.as_deref()),
            strategy
                .and_then(|s| s.rolling_update.as_ref())
                .map(|r| (r.partition, format!("{:?}", r.max_unavailable))),
            status.and_then(|s| s.observed_generation),
            status.and_then(|s| s.update_revision.as_deref()),
        ))
    }

    fn trigger(&self) -> Option<Trigger> {
        Some(Trigger::StatefulSet {
            namespace: self.namespace()?,
            name: self.name_any(),
        })
    }
}

impl Concerns for CachedPod {
    fn fingerprint(&self) -> u64 {
        let label = |k: &str| {
            self.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k))
                .cloned()
        };
        hash(&(
            self.metadata.uid.as_deref(),
            self.metadata.deletion_timestamp.is_some(),
            label(REVISION_LABEL),
            label(STATE_LABEL),
            self.status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
        ))
    }

    fn trigger(&self) -> Option<Trigger> {
        let owner = self
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "StatefulSet")?;
        Some(Trigger::StatefulSet {
            namespace: self.namespace()?,
            name: owner.name.clone(),
        })
    }
}

impl Concerns for Node {
    fn fingerprint(&self) -> u64 {
        hash(&self.spec.as_ref().and_then(|s| s.unschedulable))
    }

    fn trigger(&self) -> Option<Trigger> {
        Some(Trigger::Node(self.name_any()))
    }
}

impl Concerns for PersistentPodState {
    fn fingerprint(&self) -> u64 {
        // The hooks are in the spec: a status write (every record) changes nothing here.
        hash(&(
            self.metadata.uid.as_deref(),
            self.metadata.generation,
            self.metadata.deletion_timestamp.is_some(),
        ))
    }

    fn trigger(&self) -> Option<Trigger> {
        Some(Trigger::StatefulSet {
            namespace: self.namespace()?,
            name: self.spec.target_ref.name.clone(),
        })
    }
}

/// Watches a kind for the lifecycle loop: which [`Trigger`] an event is, if it changed what the
/// hooks read of its object (deletions always).
#[derive(Debug)]
pub struct Tap<K>(Changes<K>);

impl<K: Concerns> Tap<K> {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Tap(Changes::new(K::fingerprint))
    }

    /// The trigger of `event`, if any.
    pub fn trigger(&mut self, event: &watcher::Event<K>) -> Option<Trigger> {
        self.0.changed(event).and_then(Concerns::trigger)
    }
}

impl<K: Concerns> Default for Tap<K> {
    fn default() -> Self {
        Self::new()
    }
}
