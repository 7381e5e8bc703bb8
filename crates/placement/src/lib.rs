//! ipkeep's placement decisions, as pure functions of plain values: no kube client, no tokio, no
//! filesystem. The controller feeds them what its caches hold and writes back what they return;
//! the scheduler extension decides pins from the same records.
//!
//! - [`autogen`]: the PersistentPodState a StatefulSet's annotations ask for.
//! - [`spec`]: checking a PersistentPodState spec and reading it into a [`spec::CheckedSpec`]
//!   (or a [`spec_error::SpecError`] that says what to fix); [`label_syntax`]: label keys and
//!   values as the API server accepts them.
//! - [`view`]: the few fields of pods, nodes and StatefulSets the decisions look at;
//!   [`ordinals`]: which ordinals a StatefulSet (or an OpenKruise Advanced StatefulSet) wants.
//! - [`status`]: the whole status of a PersistentPodState (records and conditions) from what
//!   the caches hold, in one pure function; [`record`]: its records (recording Ready pods,
//!   pruning by policy, the node-loss policy); [`condition`]: conditions that keep their
//!   transition time.
//! - [`lifecycle`]: `spec.lifecycle` (and its StatefulSet annotation) read into the hooks'
//!   state machine, [`ipkeep_lifecycle`], and the facts of a pod it reads.
//! - [`pin`]: what the scheduler extension does to a pod: pin it to its record, or why not
//!   ([`pinned`]: the answer's types).
//! - [`admission`]: the pin and the hooks' marks precomputed for the admission policy.
//! - [`affinity`]: whether a pod's own constraints exclude its record, and writing a pin into it.

pub mod admission;
pub mod affinity;
pub mod autogen;
pub mod condition;
pub mod label_syntax;
pub mod lifecycle;
pub mod ordinals;
pub mod pin;
pub mod pinned;
pub mod record;
pub mod spec;
pub mod spec_error;
pub mod status;
pub mod view;

pub use ipkeep_api as api;
pub use ipkeep_lifecycle;
