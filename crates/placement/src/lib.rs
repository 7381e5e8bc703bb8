//! ipkeep's placement decisions, as pure functions of plain values: no kube client, no tokio, no
//! filesystem. The controller feeds them what its caches hold and writes back what they return;
//! the scheduler extension decides pins from the same records.
//!
//! - [`autogen`]: the PersistentPodState a StatefulSet's annotations ask for.
//! - [`spec`]: checking a PersistentPodState spec and reading it into a [`spec::PinConfig`].
//! - [`view`]: the few fields of pods, nodes and StatefulSets the decisions look at.
//! - [`record`]: recording Ready pods, pruning by policy, and the node-loss policy.
//! - [`lifecycle`]: `spec.lifecycle` (and its StatefulSet annotation) read into the hooks'
//!   state machine, [`ipkeep_lifecycle`].
//! - [`condition`]: status conditions that keep their transition time.
//! - [`pin`]: what the scheduler extension does to a pod: pin it to its record, or why not.
//! - [`affinity`]: whether a pod's own constraints exclude its record, and writing a pin into it.

pub mod affinity;
pub mod autogen;
pub mod condition;
pub mod keys;
pub mod lifecycle;
pub mod pin;
pub mod record;
pub mod spec;
pub mod view;

pub use ipkeep_api as api;
pub use ipkeep_lifecycle;
