//! Recording, pruning and the node-loss policy: from what the caches hold now and the previous
//! status, the records a PersistentPodState should hold and what changed.
//!
//! Promises:
//! - a record is taken only from a pod that is Ready, bound, not terminating and controlled by
//!   the target StatefulSet (by UID), and only if its node is known (for the topology values);
//! - a record is never removed because its pod is terminating or absent while its ordinal is in
//!   range: that is exactly the rebuild the record exists for;
//! - `WhenScaled` removes a record once its ordinal is out of range *and* no pod holds the name;
//!   `WhenDeleted` removes nothing (the caller clears everything when the StatefulSet is gone);
//! - records of a previous StatefulSet with the same name (another UID) are dropped;
//! - a pin whose node is missing or NotReady is reported, and after `nodeLossPolicy.after` is
//!   either released to preferred-only (`FallbackToPreferred`) or kept (`Wait`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use ipkeep_api::{
    MAX_RECORDED_ANNOTATION_LENGTH, NodeLossAction, PersistentPodStateStatus, PodState,
    RecordRetention,
};
use ipkeep_values::keys::PINNED_BY;

use crate::condition::{DesiredCondition, NODE_LOST};
use crate::spec::CheckedSpec;
use crate::view::{NodeHealth, NodeView, PodView, TargetView};

/// What the planner reads.
#[derive(Debug)]
pub struct RecordInput<'a> {
    /// The checked spec.
    pub config: &'a CheckedSpec,
    /// The StatefulSet.
    pub target: &'a TargetView,
    /// The status as last written.
    pub previous: &'a PersistentPodStateStatus,
    /// Pods by name: at least those named by [`candidate_pod_names`] that exist.
    pub pods: &'a BTreeMap<String, PodView>,
    /// Nodes by name: at least those the candidate pods and the records name, if they exist.
    pub nodes: &'a BTreeMap<String, NodeView>,
    /// The current time.
    pub now: &'a Time,
}

/// One change to the records, for Events, logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordChange {
    /// A first record for the pod.
    Recorded {
        /// Pod name.
        pod: String,
        /// Node name.
        node: String,
    },
    /// Same node; its topology values, the pod's IPs or UID changed.
    Refreshed {
        /// Pod name.
        pod: String,
        /// Node name.
        node: String,
    },
    /// The pod became Ready on another node: the pin moved.
    Moved {
        /// Pod name.
        pod: String,
        /// Previous node.
        from: String,
        /// New node.
        to: String,
    },
    /// Removed by the retention policy.
    Pruned {
        /// Pod name.
        pod: String,
    },
    /// Records of an earlier StatefulSet with the same name were dropped.
    TargetReplaced {
        /// How many records were dropped.
        dropped: usize,
    },
    /// Records of an earlier StatefulSet with the same name were kept for this one, which asked
    /// to adopt them.
    Adopted {
        /// How many records were kept.
        records: usize,
    },
    /// The node-loss policy released the pin to preferred-only.
    FellBack {
        /// Pod name.
        pod: String,
        /// The lost node.
        node: String,
    },
    /// A node that was lost is Ready again; the pin is whole again.
    NodeRecovered {
        /// Pod name.
        pod: String,
        /// Node name.
        node: String,
    },
}

/// Where a pin on a lost node stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostPinState {
    /// Lost for less than `after`; the action applies in `remaining`.
    Grace {
        /// Time until the action applies.
        remaining: Duration,
    },
    /// Policy `Wait`: still pinned.
    Waiting,
    /// Policy `FallbackToPreferred`: pinned by preferred terms only.
    FellBack,
}

/// A record whose node is missing or NotReady.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostPin {
    /// Pod name.
    pub pod: String,
    /// Node name.
    pub node: String,
    /// The node object is gone (rather than NotReady).
    pub missing: bool,
    /// Where the policy stands.
    pub state: LostPinState,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordPlan {
    /// The records to write.
    pub pod_states: BTreeMap<String, PodState>,
    /// What changed, in pod-name order.
    pub changes: Vec<RecordChange>,
    /// Pins on lost nodes.
    pub lost: Vec<LostPin>,
    /// When to look again without any event (a grace period ending).
    pub requeue_after: Option<Duration>,
}

/// Pod names whose pods the planner needs: the wanted ordinals and the recorded names.
pub fn candidate_pod_names(
    target: &TargetView,
    previous: &PersistentPodStateStatus,
) -> BTreeSet<String> {
    target
        .wanted_pod_names()
        .chain(previous.pod_states.keys().cloned())
        .collect()
}

/// Computes the records and changes. Pure: same input, same plan.
///
/// Four phases, each over what the one before left: the records carried over from the previous
/// status (`carried_over`: all of them, none when the StatefulSet was replaced, or all when
/// the new one adopts them), the Ready pods recorded (`record_ready`), the records the
/// retention policy prunes (`prune`), and the node-loss policy on the pins whose pod is not
/// Ready (`node_loss`).
pub fn plan(input: &RecordInput<'_>) -> RecordPlan {
    let mut changes = Vec::new();
    let mut records = carried_over(input, &mut changes);
    let ready = record_ready(input, &mut records, &mut changes);
    prune(input, &mut records, &mut changes);
    let (lost, requeue_after) = node_loss(input, &mut records, &ready, &mut changes);
    changes.sort_by(|a, b| change_pod(a).cmp(change_pod(b)));
    RecordPlan {
        pod_states: records,
        changes,
        lost,
        requeue_after,
    }
}

/// The previous records this plan starts from: all of them for the same StatefulSet (by UID),
/// or for a new one of the name that adopts them; none for a new one that does not.
fn carried_over(
    input: &RecordInput<'_>,
    changes: &mut Vec<RecordChange>,
) -> BTreeMap<String, PodState> {
    let previous = &input.previous.pod_states;
    let same_target = input
        .previous
        .target_uid
        .as_deref()
        .is_none_or(|uid| uid == input.target.uid);
    if same_target {
        return previous.clone();
    }
    if input.target.adopts_records {
        if !previous.is_empty() {
            changes.push(RecordChange::Adopted {
                records: previous.len(),
            });
        }
        return previous.clone();
    }
    if !previous.is_empty() {
        changes.push(RecordChange::TargetReplaced {
            dropped: previous.len(),
        });
    }
    BTreeMap::new()
}

/// Records each recordable pod of the StatefulSet whose node is known (first record, moved,
/// refreshed, or a lost node that recovered); returns the names of the pods recorded.
fn record_ready(
    input: &RecordInput<'_>,
    records: &mut BTreeMap<String, PodState>,
    changes: &mut Vec<RecordChange>,
) -> BTreeSet<String> {
    let mut ready = BTreeSet::new();
    for pod in input.pods.values() {
        if pod.controller_uid.as_deref() != Some(input.target.uid.as_str()) || !pod.is_recordable()
        {
            continue;
        }
        let Some(node_name) = pod.node_name.as_deref() else {
            continue;
        };
        let Some(node) = input.nodes.get(node_name) else {
            continue; // its labels arrive with the node; the node's event triggers us again
        };
        ready.insert(pod.name.clone());
        let fresh = fresh_record(input, pod, node_name, node);
        let (pod, node) = (pod.name.clone(), node_name.to_string());
        match records.get_mut(&pod) {
            Some(old) if same_place(old, &fresh) => {
                if old.node_lost_at.is_some() || old.preferred_only {
                    changes.push(RecordChange::NodeRecovered { pod, node });
                    old.node_lost_at = None;
                    old.preferred_only = false;
                }
            }
            Some(old) => {
                changes.push(if old.node_name == fresh.node_name {
                    RecordChange::Refreshed { pod, node }
                } else {
                    RecordChange::Moved {
                        pod,
                        from: old.node_name.clone(),
                        to: node,
                    }
                });
                *old = fresh;
            }
            None => {
                changes.push(RecordChange::Recorded {
                    pod: pod.clone(),
                    node,
                });
                records.insert(pod, fresh);
            }
        }
    }
    ready
}

/// The record of Ready `pod` on `node` (named `node_name`), taken now.
fn fresh_record(
    input: &RecordInput<'_>,
    pod: &PodView,
    node_name: &str,
    node: &NodeView,
) -> PodState {
    PodState {
        node_name: node_name.to_string(),
        node_topology_labels: pick(&node.labels, &input.config.topology_keys),
        annotations: pick(&pod.annotations, &input.config.annotation_keys)
            .into_iter()
            // The schema's bound: a longer value (any pod author's) is not recorded.
            .filter(|(_, v)| v.chars().count() <= MAX_RECORDED_ANNOTATION_LENGTH)
            .collect(),
        pod_ips: pod.ips.clone(),
        pod_uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
        recorded_at: Some(input.now.clone()),
        node_lost_at: None,
        preferred_only: false,
    }
}

/// `WhenScaled`: removes the records whose ordinal is out of range and whose pod is gone.
fn prune(
    input: &RecordInput<'_>,
    records: &mut BTreeMap<String, PodState>,
    changes: &mut Vec<RecordChange>,
) {
    if input.config.retention_policy != RecordRetention::WhenScaled {
        return;
    }
    records.retain(|name, _| {
        let keep = input.target.wants(name) || input.pods.contains_key(name);
        if !keep {
            changes.push(RecordChange::Pruned { pod: name.clone() });
        }
        keep
    });
}

/// The node-loss policy on each record whose pod is not `ready`: a Ready node clears a loss; a
/// missing or NotReady one starts (or continues) it, and once `nodeLossPolicy.after` has passed
/// the pin waits or falls back to preferred terms. Returns the lost pins and when the nearest
/// grace period ends.
fn node_loss(
    input: &RecordInput<'_>,
    records: &mut BTreeMap<String, PodState>,
    ready: &BTreeSet<String>,
    changes: &mut Vec<RecordChange>,
) -> (Vec<LostPin>, Option<Duration>) {
    let mut lost = Vec::new();
    let mut requeue_after: Option<Duration> = None;
    for (name, record) in records.iter_mut() {
        if ready.contains(name) {
            continue;
        }
        let node = input.nodes.get(&record.node_name);
        let since = match node.map(|n| &n.health) {
            Some(NodeHealth::Ready) => {
                if record.node_lost_at.is_some() || record.preferred_only {
                    changes.push(RecordChange::NodeRecovered {
                        pod: name.clone(),
                        node: record.node_name.clone(),
                    });
                    record.node_lost_at = None;
                    record.preferred_only = false;
                }
                continue;
            }
            Some(NodeHealth::NotReady { since }) => {
                earliest(record.node_lost_at.as_ref(), since.as_ref())
            }
            None => record.node_lost_at.clone(),
        }
        .unwrap_or_else(|| input.now.clone());
        record.node_lost_at = Some(since.clone());
        let elapsed = millis_between(&since, input.now);
        let after = input.config.node_loss_after;
        let state = if elapsed < after {
            let remaining = after - elapsed;
            requeue_after = Some(requeue_after.map_or(remaining, |r| r.min(remaining)));
            LostPinState::Grace { remaining }
        } else if input.config.node_loss_action == NodeLossAction::Wait {
            LostPinState::Waiting
        } else {
            if !record.preferred_only {
                record.preferred_only = true;
                changes.push(RecordChange::FellBack {
                    pod: name.clone(),
                    node: record.node_name.clone(),
                });
            }
            LostPinState::FellBack
        };
        lost.push(LostPin {
            pod: name.clone(),
            node: record.node_name.clone(),
            missing: node.is_none(),
            state,
        });
    }
    (lost, requeue_after)
}

/// Pods left Pending by a pin the node-loss policy has since released.
///
/// A pod created while its record still pinned it to the lost node carries that required affinity
/// in its (immutable) spec, so it stays Pending even after the record falls back to preferred
/// terms. Such a pod is stranded when it is unbound, not terminating, pinned by this
/// PersistentPodState (`pinned_by`), its record is preferred-only, the spec has required topology
/// and the pod was created before the fallback (`node_lost_at + after`). Deleting it lets the
/// StatefulSet controller create it again, and the webhook then pins it by preferred terms only.
/// A pod created after the fallback is never listed, so this cannot loop.
pub fn stranded_pods<'a>(
    pinned_by: &str,
    has_required: bool,
    after: Duration,
    records: &BTreeMap<String, PodState>,
    pods: &'a BTreeMap<String, PodView>,
) -> Vec<&'a PodView> {
    if !has_required {
        return Vec::new();
    }
    records
        .iter()
        .filter(|(_, r)| r.preferred_only)
        .filter_map(|(name, record)| {
            let pod = pods.get(name)?;
            let lost_at = record.node_lost_at.as_ref()?;
            let created_ms = pod.created_ms?;
            let fell_back_ms = lost_at
                .0
                .as_millisecond()
                .saturating_add(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
            let stranded = pod.node_name.is_none()
                && !pod.terminating
                && pod.annotations.get(PINNED_BY).map(String::as_str) == Some(pinned_by)
                && created_ms < fell_back_ms;
            stranded.then_some(pod)
        })
        .collect()
}

/// The `NodeLost` condition for a plan.
pub fn node_lost_condition(lost: &[LostPin], after: Duration) -> DesiredCondition {
    if lost.is_empty() {
        return DesiredCondition {
            type_: NODE_LOST,
            status: false,
            reason: "NodesReady".into(),
            message: "every recorded node is present and Ready".into(),
        };
    }
    let describe = |p: &LostPin| {
        let what = if p.missing { "is gone" } else { "is NotReady" };
        let then = match &p.state {
            LostPinState::Grace { remaining } => format!(
                "still pinned; the node-loss policy applies in {}",
                humantime::format_duration(Duration::from_secs(remaining.as_secs()))
            ),
            LostPinState::Waiting => "policy Wait keeps it pinned, so a rebuilt pod stays Pending until the node returns or the record is removed".to_string(),
            LostPinState::FellBack => "pinned by preferred terms only (policy FallbackToPreferred): a rebuilt pod may start on another node with a new IP".to_string(),
        };
        format!("{}: node {} {what}; {then}", p.pod, p.node)
    };
    let reason = if lost.iter().any(|p| p.state == LostPinState::Waiting) {
        "WaitingForNode"
    } else if lost.iter().any(|p| p.state == LostPinState::FellBack) {
        "FellBackToPreferred"
    } else {
        "InGracePeriod"
    };
    let shown: Vec<String> = lost.iter().take(5).map(describe).collect();
    let more = lost.len().saturating_sub(shown.len());
    let mut message = format!(
        "{} recorded node(s) lost (policy after {}): {}",
        lost.len(),
        humantime::format_duration(after),
        shown.join("; ")
    );
    if more > 0 {
        message.push_str(&format!("; and {more} more"));
    }
    DesiredCondition {
        type_: NODE_LOST,
        status: true,
        reason: reason.into(),
        message,
    }
}

fn change_pod(c: &RecordChange) -> &str {
    match c {
        RecordChange::Recorded { pod, .. }
        | RecordChange::Refreshed { pod, .. }
        | RecordChange::Moved { pod, .. }
        | RecordChange::Pruned { pod }
        | RecordChange::FellBack { pod, .. }
        | RecordChange::NodeRecovered { pod, .. } => pod,
        RecordChange::TargetReplaced { .. } | RecordChange::Adopted { .. } => "",
    }
}

/// Same node, topology values, annotations, IPs and pod: nothing to rewrite.
fn same_place(old: &PodState, fresh: &PodState) -> bool {
    old.node_name == fresh.node_name
        && old.node_topology_labels == fresh.node_topology_labels
        && old.annotations == fresh.annotations
        && old.pod_ips == fresh.pod_ips
        && old.pod_uid == fresh.pod_uid
}

fn pick(from: &BTreeMap<String, String>, keys: &[String]) -> BTreeMap<String, String> {
    keys.iter()
        .filter_map(|k| from.get(k).map(|v| (k.clone(), v.clone())))
        .collect()
}

fn earliest(a: Option<&Time>, b: Option<&Time>) -> Option<Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a.clone() } else { b.clone() }),
        (a, b) => a.or(b).cloned(),
    }
}

fn millis_between(since: &Time, now: &Time) -> Duration {
    let ms = now
        .0
        .as_millisecond()
        .saturating_sub(since.0.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
