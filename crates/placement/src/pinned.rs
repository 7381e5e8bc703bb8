//! What the pin decision (`pin::decide`) answers for a managed pod, and what a pin is: the
//! types both the decision and the pod's affinity (`affinity`) read. They live apart from both
//! so that neither module imports the other's types back.

use std::collections::BTreeMap;
use std::fmt;

/// A pod of a StatefulSet with a PersistentPodState.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Managed {
    /// The PersistentPodState's name.
    pub pps: String,
    /// The pod's name.
    pub pod: String,
    /// The `ipkeep.dev/ip-retention` value to stamp on the pod (`spec.ipRetention`); `None` when
    /// the spec's value is invalid, so the CNI plugin falls back to its configured default.
    pub retention: Option<String>,
    /// Whether and how the pod is pinned.
    pub pin: PinOutcome,
    /// The lifecycle hooks a new pod gets (none when the spec does not check: they fail open).
    pub lifecycle: Box<ipkeep_lifecycle::Lifecycle>,
}

/// Whether a managed pod is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinOutcome {
    /// Nothing recorded to pin to (yet); the pod only gets the retention annotation.
    Unrecorded(UnrecordedReason),
    /// Pinned to its recorded topology.
    Pinned(Pinned),
    /// A record exists but is not applied, for this reason (said on the pod and in an Event).
    Skipped(SkipReason),
}

/// Why a managed pod has nothing to pin to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnrecordedReason {
    /// No record under the pod's name: its first creation.
    FirstCreation,
    /// The records belong to an earlier StatefulSet with the same name (another UID).
    RecordsOfEarlierStatefulSet,
    /// The record has a value for none of the topology keys (the node lacked those labels).
    NoRecordedLabels,
}

impl UnrecordedReason {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::FirstCreation => "first-creation",
            Self::RecordsOfEarlierStatefulSet => "records-of-earlier-statefulset",
            Self::NoRecordedLabels => "no-recorded-labels",
        }
    }
}

/// Why a recorded pin is not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// The PersistentPodState's spec cannot be acted on.
    InvalidSpec(String),
    /// The pod's own constraints exclude the recorded topology: pinning would make it
    /// unschedulable.
    Conflict(String),
}

impl SkipReason {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "invalid-spec",
            Self::Conflict(_) => "conflict",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidSpec(why) => write!(f, "PersistentPodState spec is invalid: {why}"),
            Self::Conflict(why) => write!(
                f,
                "not pinned, because the pod's own constraints exclude its recorded node: {why}"
            ),
        }
    }
}

/// One node-label requirement: `key In [value]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Requirement {
    /// The node label key.
    pub key: String,
    /// The recorded value.
    pub value: String,
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// A weighted preferred term: every requirement of it, ANDed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferredTerm {
    /// 1..100.
    pub weight: i32,
    /// ANDed requirements (never empty).
    pub requirements: Vec<Requirement>,
}

/// A pod pinned to its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// The node the pod was Ready on (its addresses are held there).
    pub node: String,
    /// Required requirements (ANDed); empty when pinned by preferred terms only.
    pub required: Vec<Requirement>,
    /// Preferred terms with weights.
    pub preferred: Vec<PreferredTerm>,
    /// The controller's node-loss policy fell back to preferred terms only.
    pub fallback: bool,
}

/// The highest extender score (`MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

impl Pinned {
    /// Whether a node with these labels satisfies the required pin.
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        self.required
            .iter()
            .all(|r| labels.get(&r.key) == Some(&r.value))
    }

    /// Why a node that [`Self::admits`] refuses is refused: one reason for all of them, so the
    /// scheduler's FailedScheduling message counts them under one line.
    pub fn refusal(&self) -> String {
        let pins: Vec<String> = self.required.iter().map(Requirement::to_string).collect();
        format!(
            "ipkeep: pinned to {} (recorded on node {}, where its IPs are held)",
            pins.join(", "),
            self.node
        )
    }

    /// 0..=10: [`MAX_SCORE`] on the recorded node (its addresses are held there), else the
    /// share of preferred weight the node matches, at most 9.
    pub fn score(&self, node_name: &str, labels: &BTreeMap<String, String>) -> i64 {
        if node_name == self.node {
            return MAX_SCORE;
        }
        let total: i64 = self.preferred.iter().map(|t| i64::from(t.weight)).sum();
        if total == 0 {
            return 0;
        }
        let matched: i64 = self
            .preferred
            .iter()
            .filter(|t| {
                t.requirements
                    .iter()
                    .all(|r| labels.get(&r.key) == Some(&r.value))
            })
            .map(|t| i64::from(t.weight))
            .sum();
        (matched * (MAX_SCORE - 1) / total).clamp(0, MAX_SCORE - 1)
    }
}
