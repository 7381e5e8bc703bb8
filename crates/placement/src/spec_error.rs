//! Why a PersistentPodState spec cannot be acted on, in words that say what to fix. Its own
//! module because both `spec` and `lifecycle` (which reads `spec.lifecycle` for `spec`) return
//! it, and `lifecycle` must not import `spec` back.

use ipkeep_values::RetentionError;

/// A spec the controller cannot act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `targetRef` is neither an `apps` StatefulSet nor an `apps.kruise.io` Advanced
    /// StatefulSet.
    #[error(
        "targetRef must be an apps/v1 StatefulSet or an apps.kruise.io/v1beta1 (Advanced) StatefulSet, not {api_version} {kind}"
    )]
    UnsupportedTarget {
        /// As given.
        api_version: String,
        /// As given.
        kind: String,
    },
    /// `targetRef.name` is empty.
    #[error("targetRef.name is empty; set it to the StatefulSet's name")]
    EmptyTargetName,
    /// Neither required nor preferred topology has a key.
    #[error(
        "no topology keys: set requiredPersistentTopology.nodeTopologyKeys or preferredPersistentTopology (for example kubernetes.io/hostname)"
    )]
    NoTopology,
    /// A topology key is not a valid label key.
    #[error("invalid node topology key {key:?}: {reason}")]
    InvalidKey {
        /// As given.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A preferred weight outside 1..100.
    #[error("preferredPersistentTopology weight {0} is outside 1..100")]
    WeightOutOfRange(i32),
    /// A duration that does not parse.
    #[error("{field} {value:?} is not a duration (expected e.g. 30s, 5m, 24h{extra})")]
    BadDuration {
        /// The spec field.
        field: &'static str,
        /// As given.
        value: String,
        /// Additional accepted words.
        extra: &'static str,
    },
    /// `ipRetention` outside the retention grammar.
    #[error("{0}")]
    BadRetention(#[from] RetentionError),
    /// `lifecycle` cannot be applied.
    #[error("lifecycle: {0}")]
    InvalidLifecycle(String),
}
