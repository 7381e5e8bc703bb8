//! What, in the cluster, wants a pod gone: the only thing that starts a preDelete hook. It is
//! read from state that only authorised principals write, never from a request the webhook
//! receives (anyone who can reach the webhook can send one):
//!
//! - the StatefulSet's spec and status: [`statefulset_wants_gone`] says which pods the
//!   StatefulSet controller deletes next, as it would choose them (a scale-down, a rolling
//!   update; anyone who can change them can already delete these pods through it);
//! - a cordoned Node (`kubectl drain` cordons before it evicts);
//! - the StatefulSet being deleted (the garbage collector then deletes its pods);
//! - the pod's own state label set to `PreparingDelete` by someone who may patch the pod: a
//!   one-off deletion they asked for ([`Going::Requested`]).
//!
//! Only the first two kinds ([`Going::completes`]) let ipkeep delete a pod itself once its hook
//! lets go: the StatefulSet controller with `OrderedReady` never retries the deletion of a pod
//! that is not Ready, which `markPodNotReady` made it. Everyone else who deletes retries: a
//! drain, the garbage collector, a person.

use std::collections::BTreeMap;
use std::fmt;

/// Why a pod is held in `PreparingDelete` (the annotation [`ipkeep_values::keys::HELD_ANNOTATION`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Going {
    /// Its ordinal is outside the StatefulSet's range: a scale-down deletes it.
    ScaleDown,
    /// It is on an outdated revision and the rolling update deletes it next.
    Update,
    /// Its StatefulSet is being deleted (or is gone): the garbage collector deletes it.
    OwnerDeleted,
    /// Its node is cordoned: a drain evicts it.
    Drain,
    /// Someone who may patch the pod labelled it `PreparingDelete`: they delete it once the
    /// hook lets go (ipkeep never does).
    Requested,
}

impl Going {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Going::ScaleDown => "scale-down",
            Going::Update => "update",
            Going::OwnerDeleted => "owner-deleted",
            Going::Drain => "drain",
            Going::Requested => "request",
        }
    }

    /// Reads an annotation value. Anything else (a value written by hand, or `deletion` and
    /// `eviction` of ipkeep's first lifecycle release) is a request: it never lets ipkeep
    /// delete anything.
    pub fn parse(text: &str) -> Going {
        match text {
            "scale-down" => Going::ScaleDown,
            "update" => Going::Update,
            "owner-deleted" => Going::OwnerDeleted,
            "drain" => Going::Drain,
            _ => Going::Requested,
        }
    }

    /// Whether ipkeep completes the deletion once the hook lets the pod go: only for the
    /// StatefulSet controller, which may never retry it.
    pub fn completes(self) -> bool {
        matches!(self, Going::ScaleDown | Going::Update)
    }

    /// What it means, for messages and the gate's condition.
    pub fn describe(self) -> &'static str {
        match self {
            Going::ScaleDown => "its StatefulSet scales it down",
            Going::Update => "its StatefulSet's rolling update replaces it",
            Going::OwnerDeleted => "its StatefulSet is deleted",
            Going::Drain => "its node is cordoned (drained)",
            Going::Requested => "its deletion was asked for by labelling it PreparingDelete",
        }
    }
}

impl fmt::Display for Going {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the StatefulSet controller acts on: a StatefulSet's spec and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetFacts {
    /// `spec.replicas`.
    pub replicas: u32,
    /// `spec.ordinals.start`.
    pub ordinals_start: u32,
    /// `spec.podManagementPolicy: Parallel` (else `OrderedReady`).
    pub parallel: bool,
    /// The rolling update in progress; `None` with `OnDelete`, or while the status has not
    /// caught up with the spec (`status.observedGeneration` < `metadata.generation`).
    pub rolling: Option<Rolling>,
}

/// A `RollingUpdate` strategy and where the StatefulSet's status says it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rolling {
    /// `status.updateRevision`.
    pub update_revision: String,
    /// `rollingUpdate.partition`: pods with an ordinal index below it are not updated.
    pub partition: u32,
    /// `rollingUpdate.maxUnavailable`, resolved against `replicas` (at least 1).
    pub max_unavailable: u32,
}

/// One pod of the StatefulSet (its controller owner has the StatefulSet's UID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its ordinal.
    pub ordinal: u32,
    /// Its `controller-revision-hash` label.
    pub revision: Option<String>,
    /// It has a deletion timestamp.
    pub terminating: bool,
    /// Its Ready condition is True.
    pub ready: bool,
    /// ipkeep holds it in `PreparingDelete` (which may have made it not Ready).
    pub held: bool,
}

/// The pods the StatefulSet controller deletes next, by ordinal, chosen as it chooses them
/// (Kubernetes' `stateful_set_control.go`): condemned ordinals (outside `[start, start +
/// replicas)`) first, all at once with `Parallel`, else the highest one, after every pod in
/// range is Ready; then, with nothing condemned left (`OrderedReady`), the outdated pods from
/// the highest ordinal down to the partition, as many as `maxUnavailable` allows once the
/// unavailable pods in range are counted. A pod ipkeep holds for the update counts as
/// available: the hold is what made it not Ready.
pub fn statefulset_wants_gone(set: &SetFacts, members: &[Member]) -> BTreeMap<u32, Going> {
    let start = set.ordinals_start;
    let end = start.saturating_add(set.replicas);
    let in_range = |o: u32| o >= start && o < end;
    let outdated = |m: &Member| {
        set.rolling
            .as_ref()
            .is_some_and(|r| m.revision.as_deref() != Some(r.update_revision.as_str()))
    };
    let available = |m: &Member| !m.terminating && (m.ready || (m.held && outdated(m)));
    let mut wanted = BTreeMap::new();

    let mut condemned: Vec<&Member> = members.iter().filter(|m| !in_range(m.ordinal)).collect();
    condemned.sort_by_key(|m| std::cmp::Reverse(m.ordinal));
    let by_ordinal: BTreeMap<u32, &Member> = members
        .iter()
        .filter(|m| in_range(m.ordinal))
        .map(|m| (m.ordinal, m))
        .collect();
    let unavailable = (start..end)
        .filter(|o| !by_ordinal.get(o).is_some_and(|m| available(m)))
        .count();
    let all_available = unavailable == 0;

    if set.parallel {
        for m in condemned.iter().filter(|m| !m.terminating) {
            wanted.insert(m.ordinal, Going::ScaleDown);
        }
    } else if all_available && let Some(top) = condemned.first().filter(|m| !m.terminating) {
        wanted.insert(top.ordinal, Going::ScaleDown);
    }

    let Some(rolling) = &set.rolling else {
        return wanted;
    };
    // With OrderedReady the StatefulSet controller updates only once nothing is condemned and
    // every pod in range is available.
    let ordered_waits = !set.parallel && (!condemned.is_empty() || !all_available);
    if ordered_waits {
        return wanted;
    }
    let budget = usize::try_from(rolling.max_unavailable.max(1))
        .unwrap_or(usize::MAX)
        .saturating_sub(unavailable);
    let first_updated = start.saturating_add(rolling.partition);
    by_ordinal
        .values()
        .rev()
        .filter(|m| m.ordinal >= first_updated && outdated(m) && !m.terminating)
        .take(budget)
        .for_each(|m| {
            wanted.insert(m.ordinal, Going::Update);
        });
    wanted
}

/// `maxUnavailable` as the StatefulSet controller resolves it: a number, or a percentage of
/// `replicas` rounded up; at least 1; 1 when unset.
pub fn resolve_max_unavailable(value: Option<&MaxUnavailable>, replicas: u32) -> u32 {
    match value {
        None => 1,
        Some(MaxUnavailable::Count(n)) => (*n).max(1),
        Some(MaxUnavailable::Percent(p)) => {
            let scaled = u64::from(*p) * u64::from(replicas);
            u32::try_from(scaled.div_ceil(100))
                .unwrap_or(u32::MAX)
                .max(1)
        }
    }
}

/// `rollingUpdate.maxUnavailable` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnavailable {
    /// A number of pods.
    Count(u32),
    /// A percentage of `replicas`.
    Percent(u32),
}

#[cfg(test)]
#[path = "going_tests.rs"]
mod tests;
