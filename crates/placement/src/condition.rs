//! Status conditions that keep `lastTransitionTime` while their status does not change, as the
//! API conventions ask.

use ipkeep_api::Condition;
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Condition type: spec valid, target found, recording.
pub const READY: &str = "Ready";
/// Condition type: at least one recorded node is missing or NotReady.
pub const NODE_LOST: &str = "NodeLost";
/// Condition type: set (False) only when the admission policy cannot pin the StatefulSet's pods
/// from the plan (its template's node constraints are too large to compare).
pub const ADMISSION_PLANNED: &str = "AdmissionPlanned";

/// Condition type: set (False) only when `spec.lifecycle` asks for ipkeep's hooks on a target
/// they do not run for (an OpenKruise Advanced StatefulSet, which has hooks of its own).
pub const LIFECYCLE_HOOKS: &str = "LifecycleHooks";

/// Condition type: set (False) only while the target, an OpenKruise Advanced StatefulSet, has a
/// `spec.reserveOrdinals` entry that does not parse (Kruise then reserves nothing).
pub const RESERVE_ORDINALS: &str = "ReserveOrdinals";

/// A condition to set, without its transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredCondition {
    /// The condition type.
    pub type_: &'static str,
    /// `true` → `"True"`.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// Merges `desired` into `current`: a condition whose status is unchanged keeps its transition
/// time; types not in `desired` are kept as they are.
pub fn merge(
    current: &[Condition],
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = current
        .iter()
        .filter(|c| !desired.iter().any(|d| d.type_ == c.type_))
        .cloned()
        .collect();
    for d in desired {
        let status = if d.status { "True" } else { "False" };
        let last_transition_time = current
            .iter()
            .find(|c| c.type_ == d.type_ && c.status == status)
            .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
        out.push(Condition {
            type_: d.type_.to_string(),
            status: status.to_string(),
            reason: d.reason.clone(),
            message: d.message.clone(),
            last_transition_time,
            observed_generation: generation,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(s: i64) -> Time {
        Time(ipkeep_api::k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn keeps_transition_time_while_status_holds() {
        let d = |status| DesiredCondition {
            type_: READY,
            status,
            reason: "Recording".into(),
            message: "m".into(),
        };
        let first = merge(&[], &[d(true)], Some(1), &t(10));
        assert_eq!(first[0].last_transition_time, t(10));
        let same = merge(&first, &[d(true)], Some(2), &t(20));
        assert_eq!(same[0].last_transition_time, t(10));
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = merge(&same, &[d(false)], Some(2), &t(30));
        assert_eq!(flipped[0].last_transition_time, t(30));
        assert_eq!(flipped[0].status, "False");
    }
}
