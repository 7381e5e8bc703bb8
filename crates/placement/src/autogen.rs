//! The PersistentPodState a StatefulSet's annotations ask for (auto-generation).

use std::collections::BTreeMap;

use ipkeep_api::annotations::{self as keys, lookup};
use ipkeep_api::{
    DEFAULT_IP_RETENTION, NodeLossAction, NodeLossPolicy, NodeTopologyTerm, PersistentPodStateSpec,
    PreferredTopologyTerm, RetentionPolicy, TargetReference,
};

use crate::keys::split_keys;
use crate::spec::{self, SpecError};

/// The weight of the preferred term generated from the preferred-topology annotation.
pub const GENERATED_PREFERRED_WEIGHT: i32 = 100;

/// Annotations that turn auto-generation on but cannot produce a usable spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AutoGenerateError {
    /// Auto-generation is on but no topology annotation has a key.
    #[error(
        "{auto} is \"true\" but neither {required} nor {preferred} lists a node label key; add one (for example kubernetes.io/hostname)",
        auto = keys::AUTO_GENERATE, required = keys::REQUIRED_TOPOLOGY, preferred = keys::PREFERRED_TOPOLOGY
    )]
    NoTopology,
    /// The resulting spec is invalid (a bad key or retention value).
    #[error(
        "{key} is {0:?}; use FallbackToPreferred or Wait",
        key = keys::NODE_LOSS_ACTION
    )]
    NodeLossAction(String),
    /// The lifecycle annotation does not read as `spec.lifecycle`.
    #[error("{key} cannot be read as spec.lifecycle: {0}", key = keys::LIFECYCLE)]
    Lifecycle(String),
    #[error("the annotations give an invalid PersistentPodState: {0}")]
    Invalid(#[from] SpecError),
}

/// What the annotations of StatefulSet `name` ask for: `Ok(None)` when auto-generation is off.
pub fn generated_spec(
    name: &str,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<PersistentPodStateSpec>, AutoGenerateError> {
    let on = lookup(
        annotations,
        keys::AUTO_GENERATE,
        Some(keys::KRUISE_AUTO_GENERATE),
    )
    .is_some_and(|v| v.trim() == "true");
    if !on {
        return Ok(None);
    }
    let required = lookup(
        annotations,
        keys::REQUIRED_TOPOLOGY,
        Some(keys::KRUISE_REQUIRED_TOPOLOGY),
    )
    .map(split_keys)
    .unwrap_or_default();
    let preferred = lookup(
        annotations,
        keys::PREFERRED_TOPOLOGY,
        Some(keys::KRUISE_PREFERRED_TOPOLOGY),
    )
    .map(split_keys)
    .unwrap_or_default();
    if required.is_empty() && preferred.is_empty() {
        return Err(AutoGenerateError::NoTopology);
    }
    let spec = PersistentPodStateSpec {
        target_ref: TargetReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: name.to_string(),
        },
        persistent_pod_annotations: Vec::new(),
        required_persistent_topology: (!required.is_empty()).then_some(NodeTopologyTerm {
            node_topology_keys: required,
        }),
        preferred_persistent_topology: if preferred.is_empty() {
            Vec::new()
        } else {
            vec![PreferredTopologyTerm {
                weight: GENERATED_PREFERRED_WEIGHT,
                preference: NodeTopologyTerm {
                    node_topology_keys: preferred,
                },
            }]
        },
        persistent_pod_state_retention_policy: RetentionPolicy::default(),
        node_loss_policy: node_loss_policy(annotations)?,
        ip_retention: lookup(annotations, keys::IP_RETENTION, None)
            .map_or(DEFAULT_IP_RETENTION, str::trim)
            .to_string(),
        lifecycle: lookup(annotations, keys::LIFECYCLE, None)
            .map(crate::lifecycle::parse_annotation)
            .transpose()
            .map_err(AutoGenerateError::Lifecycle)?,
    };
    spec::check(&spec)?;
    Ok(Some(spec))
}

/// `spec.nodeLossPolicy` from the node-loss annotations; each one absent takes its default.
fn node_loss_policy(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<NodeLossPolicy, AutoGenerateError> {
    let mut policy = NodeLossPolicy::default();
    if let Some(action) = lookup(annotations, keys::NODE_LOSS_ACTION, None).map(str::trim) {
        policy.action = match action {
            "FallbackToPreferred" => NodeLossAction::FallbackToPreferred,
            "Wait" => NodeLossAction::Wait,
            other => return Err(AutoGenerateError::NodeLossAction(other.to_string())),
        };
    }
    if let Some(after) = lookup(annotations, keys::NODE_LOSS_AFTER, None) {
        policy.after = after.trim().to_string();
    }
    Ok(policy)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn off_unless_exactly_true() {
        for value in [None, Some("false"), Some("yes"), Some("True")] {
            let mut a = ann(&[(keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname")]);
            if let Some(v) = value {
                a.insert(keys::AUTO_GENERATE.into(), v.into());
            }
            assert_eq!(generated_spec("db", Some(&a)), Ok(None), "{value:?}");
        }
        assert_eq!(generated_spec("db", None), Ok(None));
    }

    #[test]
    fn builds_trimmed_required_and_weight_100_preferred() {
        let a = ann(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, " kubernetes.io/hostname "),
            (
                keys::PREFERRED_TOPOLOGY,
                "topology.kubernetes.io/zone, topology.kubernetes.io/region",
            ),
            (keys::IP_RETENTION, "2h"),
        ]);
        let spec = generated_spec("db", Some(&a)).unwrap().unwrap();
        assert_eq!(spec.target_ref.name, "db");
        assert_eq!(spec.target_ref.kind, "StatefulSet");
        assert_eq!(
            spec.required_persistent_topology
                .unwrap()
                .node_topology_keys,
            vec!["kubernetes.io/hostname"]
        );
        assert_eq!(spec.preferred_persistent_topology[0].weight, 100);
        assert_eq!(
            spec.preferred_persistent_topology[0]
                .preference
                .node_topology_keys,
            vec![
                "topology.kubernetes.io/zone",
                "topology.kubernetes.io/region"
            ]
        );
        assert_eq!(spec.ip_retention, "2h");
    }

    #[test]
    fn kruise_spellings_work_and_ipkeep_wins() {
        let a = ann(&[
            (keys::KRUISE_AUTO_GENERATE, "true"),
            (keys::KRUISE_PREFERRED_TOPOLOGY, "kubernetes.io/hostname"),
            (keys::KRUISE_REQUIRED_TOPOLOGY, "zone-a"),
            (keys::REQUIRED_TOPOLOGY, "topology.kubernetes.io/zone"),
        ]);
        let spec = generated_spec("db", Some(&a)).unwrap().unwrap();
        assert_eq!(
            spec.required_persistent_topology
                .unwrap()
                .node_topology_keys,
            vec!["topology.kubernetes.io/zone"]
        );
        assert_eq!(spec.ip_retention, DEFAULT_IP_RETENTION);
    }

    #[test]
    fn refuses_incomplete_or_invalid_annotations() {
        let a = ann(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, " , "),
        ]);
        assert_eq!(
            generated_spec("db", Some(&a)),
            Err(AutoGenerateError::NoTopology)
        );
        let a = ann(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "Not A Key"),
        ]);
        assert!(matches!(
            generated_spec("db", Some(&a)),
            Err(AutoGenerateError::Invalid(SpecError::InvalidKey { .. }))
        ));
        let a = ann(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
            (keys::IP_RETENTION, "a while"),
        ]);
        assert!(matches!(
            generated_spec("db", Some(&a)),
            Err(AutoGenerateError::Invalid(SpecError::BadRetention(_)))
        ));
    }

    #[test]
    fn node_loss_policy_from_annotations() {
        let base = [
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
        ];
        let spec = |extra: &[(&str, &str)]| {
            let mut a = ann(&base);
            a.extend(ann(extra));
            generated_spec("db", Some(&a))
        };
        assert_eq!(
            spec(&[]).unwrap().unwrap().node_loss_policy,
            NodeLossPolicy::default()
        );
        let p = spec(&[
            (keys::NODE_LOSS_ACTION, " Wait "),
            (keys::NODE_LOSS_AFTER, "30s"),
        ])
        .unwrap()
        .unwrap()
        .node_loss_policy;
        assert_eq!((p.action, p.after.as_str()), (NodeLossAction::Wait, "30s"));
        let err = spec(&[(keys::NODE_LOSS_ACTION, "wait")]).unwrap_err();
        assert!(
            err.to_string().contains("FallbackToPreferred or Wait"),
            "{err}"
        );
        assert!(matches!(
            spec(&[(keys::NODE_LOSS_AFTER, "soon")]),
            Err(AutoGenerateError::Invalid(_))
        ));
    }
}
