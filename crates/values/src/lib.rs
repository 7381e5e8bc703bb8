//! The values ipkeep's parts exchange through pod annotations, labels and configuration, each
//! with exactly one grammar, so the webhook, the controller, the CNI plugin and the node agent can
//! never disagree about what a value means:
//!
//! * [`retention`]: how long a deleted pod's addresses are held (`30m`, `24h`, `forever`, `0`),
//!   and OpenKruise's whole-minutes spelling;
//! * [`ordinal`]: which ordinal a StatefulSet pod has (`db-2`, or its `apps.kubernetes.io/pod-index`
//!   label);
//! * [`duration`]: durations as the CRD's patterns write them (`nodeLossPolicy.after`);
//! * [`time`]: unix timestamps printed for people, for any value;
//! * [`names`]: Kubernetes names and pod UIDs as the runtime passes them to the node;
//! * [`keys`]: every annotation and label key ipkeep reads or writes.
//!
//! Pure values: no I/O, no clock, no Kubernetes client.

pub mod duration;
pub mod keys;
pub mod names;
pub mod ordinal;
pub mod retention;
pub mod time;

pub use retention::{Retention, RetentionError};
