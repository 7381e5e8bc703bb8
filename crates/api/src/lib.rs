//! ipkeep's Kubernetes API: the `PersistentPodState` custom resource (`ipkeep.dev/v1alpha1`),
//! types only (no client, no I/O). The annotation and label keys are `ipkeep_values::keys`.
//!
//! The spec and status keep OpenKruise's v1alpha1 JSON shape (`targetRef`,
//! `requiredPersistentTopology.nodeTopologyKeys`, `preferredPersistentTopology[]`,
//! `persistentPodStateRetentionPolicy`, `status.podStates[pod]{nodeName, nodeTopologyLabels}`), so
//! a user migrates by changing the group. Additions are documented field by field.
//!
//! [`statefulset`] is the one rule for "this owner reference or `targetRef` is that
//! StatefulSet" (group `apps`, not only the kind); [`kruise`] the fields ipkeep reads of
//! OpenKruise's Advanced StatefulSet.
//!
//! `kube` and `k8s-openapi` are re-exported so every ipkeep crate uses the same versions.

pub mod kruise;
mod pps;
pub mod statefulset;

pub use k8s_openapi;
pub use kube;
pub use pps::*;
