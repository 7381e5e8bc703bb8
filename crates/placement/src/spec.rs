//! Reading a PersistentPodState spec into what the decisions need, and refusing what cannot work
//! with a message that says what to fix. The CRD schema already refuses most of this; these
//! checks also cover objects written before a schema change or with validation off.

use std::time::Duration;

use ipkeep_api::{NodeLossAction, PersistentPodStateSpec, RecordRetention};
use ipkeep_lifecycle::Lifecycle;
use ipkeep_values::Retention;

use crate::label_syntax::check_label_key;
pub use crate::spec_error::SpecError;

/// A checked spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedSpec {
    /// Required keys, then every preferred key, without duplicates: the labels recorded.
    pub topology_keys: Vec<String>,
    /// Pod annotation keys recorded with each pod.
    pub annotation_keys: Vec<String>,
    /// When records go.
    pub retention_policy: RecordRetention,
    /// What a lost node does to its pins.
    pub node_loss_action: NodeLossAction,
    /// How long a node is missing or NotReady before the action applies.
    pub node_loss_after: Duration,
    /// The lifecycle hooks.
    pub lifecycle: Lifecycle,
    /// `ipRetention`, trimmed, known to read as a retention: what the webhook stamps on each
    /// pod as `ipkeep.dev/ip-retention`.
    pub ip_retention: String,
}

/// Checks `spec` and reads it into a [`CheckedSpec`].
pub fn check(spec: &PersistentPodStateSpec) -> Result<CheckedSpec, SpecError> {
    let target = &spec.target_ref;
    if target.workload().is_none() {
        return Err(SpecError::UnsupportedTarget {
            api_version: target.api_version.clone(),
            kind: target.kind.clone(),
        });
    }
    if target.name.trim().is_empty() {
        return Err(SpecError::EmptyTargetName);
    }
    let mut topology_keys: Vec<String> = Vec::new();
    let required = spec
        .required_persistent_topology
        .iter()
        .flat_map(|t| t.node_topology_keys.iter());
    for term in &spec.preferred_persistent_topology {
        if !(1..=100).contains(&term.weight) {
            return Err(SpecError::WeightOutOfRange(term.weight));
        }
    }
    let preferred = spec
        .preferred_persistent_topology
        .iter()
        .flat_map(|t| t.preference.node_topology_keys.iter());
    for key in required.chain(preferred) {
        check_label_key(key).map_err(|reason| SpecError::InvalidKey {
            key: key.clone(),
            reason,
        })?;
        if !topology_keys.contains(key) {
            topology_keys.push(key.clone());
        }
    }
    if topology_keys.is_empty() {
        return Err(SpecError::NoTopology);
    }
    check_ip_retention(&spec.ip_retention)?;
    let after = &spec.node_loss_policy.after;
    let node_loss_after =
        ipkeep_values::duration::parse(after).map_err(|_| SpecError::BadDuration {
            field: "nodeLossPolicy.after",
            value: after.clone(),
            extra: "",
        })?;
    Ok(CheckedSpec {
        topology_keys,
        annotation_keys: spec
            .persistent_pod_annotations
            .iter()
            .map(|a| a.key.clone())
            .collect(),
        retention_policy: spec.persistent_pod_state_retention_policy,
        node_loss_action: spec.node_loss_policy.action,
        node_loss_after,
        lifecycle: crate::lifecycle::read(spec.lifecycle.as_ref())?,
        ip_retention: spec.ip_retention.trim().to_string(),
    })
}

/// Checks an `ipRetention` value with the one retention grammar the CNI plugin also reads.
pub fn check_ip_retention(value: &str) -> Result<Retention, SpecError> {
    Ok(Retention::parse("ipRetention", value)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> PersistentPodStateSpec {
        serde_json::from_value(v).unwrap()
    }

    fn base() -> serde_json::Value {
        serde_json::json!({
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
            "preferredPersistentTopology": [{"weight": 50, "preference": {"nodeTopologyKeys": ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]}}],
            "nodeLossPolicy": {"action": "FallbackToPreferred", "after": "5m"},
            "ipRetention": "24h"
        })
    }

    #[test]
    fn reads_keys_in_order_without_duplicates_and_defaults() {
        let config = check(&spec(base())).unwrap();
        assert_eq!(
            config.topology_keys,
            vec!["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
        );
        assert_eq!(config.node_loss_after, Duration::from_secs(300));
        assert_eq!(config.node_loss_action, NodeLossAction::FallbackToPreferred);
        for api_version in ["apps.kruise.io/v1beta1", "apps.kruise.io/v1alpha1"] {
            let mut kruise = base();
            kruise["targetRef"]["apiVersion"] = api_version.into();
            assert!(
                check(&spec(kruise)).is_ok(),
                "an Advanced StatefulSet: {api_version}"
            );
        }
    }

    #[test]
    fn refuses_with_what_to_fix() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            (
                "/spec/targetRef/kind",
                "Deployment".into(),
                "apps/v1 StatefulSet",
            ),
            (
                "/spec/targetRef/apiVersion",
                "apps.kruise.io.example/v1beta1".into(),
                "apps/v1 StatefulSet or an apps.kruise.io/v1beta1 (Advanced) StatefulSet",
            ),
            (
                "/spec/targetRef/name",
                " ".into(),
                "targetRef.name is empty",
            ),
            (
                "/spec/requiredPersistentTopology/nodeTopologyKeys/0",
                "Bad Key".into(),
                "invalid node topology key \"Bad Key\"",
            ),
            (
                "/spec/preferredPersistentTopology/0/weight",
                0.into(),
                "weight 0 is outside 1..100",
            ),
            (
                "/spec/preferredPersistentTopology/0/weight",
                101.into(),
                "outside 1..100",
            ),
            (
                "/spec/ipRetention",
                "soon".into(),
                "invalid ipRetention value \"soon\"",
            ),
            ("/spec/ipRetention", "30".into(), "ipRetention"),
            (
                "/spec/nodeLossPolicy",
                serde_json::json!({"after": "x"}),
                "nodeLossPolicy.after",
            ),
        ];
        for (path, value, want) in cases {
            let mut doc = serde_json::json!({"spec": base()});
            *doc.pointer_mut(path).unwrap() = value;
            let err = check(&spec(doc["spec"].clone())).unwrap_err().to_string();
            assert!(err.contains(want), "{path}: {err}");
        }
        let none = serde_json::json!({"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"}});
        assert_eq!(check(&spec(none)), Err(SpecError::NoTopology));
    }

    #[test]
    fn ip_retention_syntax_matches_the_cni() {
        for ok in ["0", "forever", "30m", "24h", "1h30m", "90s"] {
            assert!(check_ip_retention(ok).is_ok(), "{ok}");
        }
        for bad in ["", "30", "-1h", "later", "00", "2days", "10000y"] {
            assert!(check_ip_retention(bad).is_err(), "{bad}");
        }
    }
}
