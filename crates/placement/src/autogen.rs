//! The PersistentPodState a StatefulSet asks for (auto-generation): by its own annotations, or
//! by its namespace's label.
//!
//! The StatefulSet's annotation `ipkeep.dev/auto-generate-persistent-pod-state` (or OpenKruise's
//! spelling) decides when it is there: `"true"` turns generation on, any other value (`"false"`)
//! off. Without it, the namespace's label of the same key decides: `"true"` turns it on. In a
//! namespace so labelled, a StatefulSet whose annotations name no topology key is pinned by
//! [`keys::HOSTNAME_LABEL`] (its pods come back to the node they were recorded on); everything
//! else comes from its annotations, with the same defaults either way.

use std::collections::BTreeMap;

use ipkeep_api::{
    DEFAULT_IP_RETENTION, NodeLossAction, NodeLossPolicy, NodeTopologyTerm, PersistentPodStateSpec,
    PreferredTopologyTerm, RecordRetention, TargetReference,
};
use ipkeep_values::keys::{self, lookup};

use crate::label_syntax::split_keys;
use crate::spec::{self, SpecError};

/// The weight of the preferred term generated from the preferred-topology annotation.
pub const GENERATED_PREFERRED_WEIGHT: i32 = 100;

/// What turned auto-generation on for a StatefulSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeneratedBy {
    /// Its own annotation, `"true"`.
    Annotation,
    /// Its namespace's label, `"true"`, with no annotation of its own.
    NamespaceLabel,
}

/// A PersistentPodState to generate, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The spec, checked.
    pub spec: PersistentPodStateSpec,
    /// What asked for it.
    pub by: GeneratedBy,
}

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

/// What StatefulSet `name` with `annotations`, in a namespace with `namespace_labels`, asks for:
/// `Ok(None)` when auto-generation is off for it.
pub fn generated_spec(
    name: &str,
    annotations: Option<&BTreeMap<String, String>>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<Option<Generated>, AutoGenerateError> {
    let namespace_on = namespace_labels
        .and_then(|l| l.get(keys::AUTO_GENERATE))
        .is_some_and(|v| v.trim() == "true");
    let by = match lookup(
        annotations,
        keys::AUTO_GENERATE,
        Some(keys::KRUISE_AUTO_GENERATE),
    ) {
        Some(v) if v.trim() == "true" => GeneratedBy::Annotation,
        Some(_) => return Ok(None),
        None if namespace_on => GeneratedBy::NamespaceLabel,
        None => return Ok(None),
    };
    let mut required = lookup(
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
        if !namespace_on {
            return Err(AutoGenerateError::NoTopology);
        }
        required = vec![keys::HOSTNAME_LABEL.to_string()];
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
        persistent_pod_state_retention_policy: RecordRetention::default(),
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
    Ok(Some(Generated { spec, by }))
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
            assert_eq!(generated_spec("db", Some(&a), None), Ok(None), "{value:?}");
        }
        assert_eq!(generated_spec("db", None, None), Ok(None));
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
        let spec = generated_spec("db", Some(&a), None).unwrap().unwrap().spec;
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
        let spec = generated_spec("db", Some(&a), None).unwrap().unwrap().spec;
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
            generated_spec("db", Some(&a), None),
            Err(AutoGenerateError::NoTopology)
        );
        let a = ann(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "Not A Key"),
        ]);
        assert!(matches!(
            generated_spec("db", Some(&a), None),
            Err(AutoGenerateError::Invalid(SpecError::InvalidKey { .. }))
        ));
        let a = ann(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
            (keys::IP_RETENTION, "a while"),
        ]);
        assert!(matches!(
            generated_spec("db", Some(&a), None),
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
            generated_spec("db", Some(&a), None)
        };
        assert_eq!(
            spec(&[]).unwrap().unwrap().spec.node_loss_policy,
            NodeLossPolicy::default()
        );
        let p = spec(&[
            (keys::NODE_LOSS_ACTION, " Wait "),
            (keys::NODE_LOSS_AFTER, "30s"),
        ])
        .unwrap()
        .unwrap()
        .spec
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

    /// The StatefulSet's annotation decides when it is there, whatever the namespace says; the
    /// namespace's label decides for the others.
    #[test]
    fn the_statefulset_annotation_wins_over_the_namespace_label() {
        let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
        let other_label = ann(&[(keys::AUTO_GENERATE, "false")]);
        let unrelated = ann(&[("team", "payments")]);
        let host = (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname");
        type Case<'a> = (
            &'a str,
            Vec<(&'a str, &'a str)>,
            Option<&'a BTreeMap<String, String>>,
            Option<GeneratedBy>,
        );
        let cases: Vec<Case> = vec![
            ("no annotation, no label", vec![], None, None),
            (
                "no annotation, unrelated labels",
                vec![],
                Some(&unrelated),
                None,
            ),
            (
                "no annotation, label false",
                vec![],
                Some(&other_label),
                None,
            ),
            (
                "no annotation, label true",
                vec![],
                Some(&labelled),
                Some(GeneratedBy::NamespaceLabel),
            ),
            (
                "topology annotations only, label true",
                vec![host],
                Some(&labelled),
                Some(GeneratedBy::NamespaceLabel),
            ),
            (
                "annotation false opts out of the label",
                vec![(keys::AUTO_GENERATE, "false"), host],
                Some(&labelled),
                None,
            ),
            (
                "OpenKruise's spelling false opts out too",
                vec![(keys::KRUISE_AUTO_GENERATE, "false")],
                Some(&labelled),
                None,
            ),
            (
                "any other annotation value opts out",
                vec![(keys::AUTO_GENERATE, "yes")],
                Some(&labelled),
                None,
            ),
            (
                "ipkeep's false beats OpenKruise's true",
                vec![
                    (keys::AUTO_GENERATE, "false"),
                    (keys::KRUISE_AUTO_GENERATE, "true"),
                ],
                Some(&labelled),
                None,
            ),
            (
                "annotation true, no label",
                vec![(keys::AUTO_GENERATE, "true"), host],
                None,
                Some(GeneratedBy::Annotation),
            ),
            (
                "annotation true, label false",
                vec![(keys::AUTO_GENERATE, " true "), host],
                Some(&other_label),
                Some(GeneratedBy::Annotation),
            ),
            (
                "annotation true, label true",
                vec![(keys::AUTO_GENERATE, "true")],
                Some(&labelled),
                Some(GeneratedBy::Annotation),
            ),
        ];
        for (what, annotations, labels, expected) in cases {
            let got = generated_spec("db", Some(&ann(&annotations)), labels)
                .unwrap_or_else(|e| panic!("{what}: {e}"))
                .map(|g| g.by);
            assert_eq!(got, expected, "{what}");
        }
        assert_eq!(
            generated_spec("db", None, Some(&labelled))
                .unwrap()
                .unwrap()
                .by,
            GeneratedBy::NamespaceLabel,
            "a StatefulSet without any annotation"
        );
    }

    /// What a StatefulSet with no annotation gets from its namespace's label: pinned to its node,
    /// and every other field as the annotated path defaults it.
    #[test]
    fn the_namespace_label_alone_pins_by_hostname_with_the_annotation_defaults() {
        let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
        let from_label = generated_spec("db", None, Some(&labelled))
            .unwrap()
            .unwrap()
            .spec;
        let annotated = ann(&[
            (keys::AUTO_GENERATE, "true"),
            (keys::REQUIRED_TOPOLOGY, keys::HOSTNAME_LABEL),
        ]);
        let from_annotations = generated_spec("db", Some(&annotated), None)
            .unwrap()
            .unwrap()
            .spec;
        assert_eq!(from_label, from_annotations);
        assert_eq!(
            from_label
                .required_persistent_topology
                .unwrap()
                .node_topology_keys,
            vec!["kubernetes.io/hostname"]
        );
        assert!(from_label.preferred_persistent_topology.is_empty());
        assert_eq!(from_label.ip_retention, DEFAULT_IP_RETENTION);
        assert_eq!(from_label.node_loss_policy, NodeLossPolicy::default());
        assert_eq!(
            from_label.persistent_pod_state_retention_policy,
            RecordRetention::WhenScaled
        );
        assert_eq!(from_label.lifecycle, None);
    }

    /// In a labelled namespace the StatefulSet's other annotations still shape the spec, and a
    /// topology annotation replaces the default rather than adding to it.
    #[test]
    fn in_a_labelled_namespace_the_annotations_shape_the_spec() {
        let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
        let a = ann(&[
            (keys::PREFERRED_TOPOLOGY, "topology.kubernetes.io/zone"),
            (keys::IP_RETENTION, "forever"),
            (keys::NODE_LOSS_ACTION, "Wait"),
        ]);
        let g = generated_spec("db", Some(&a), Some(&labelled))
            .unwrap()
            .unwrap();
        assert_eq!(g.by, GeneratedBy::NamespaceLabel);
        assert_eq!(
            g.spec.required_persistent_topology, None,
            "no default added"
        );
        assert_eq!(
            g.spec.preferred_persistent_topology[0]
                .preference
                .node_topology_keys,
            vec!["topology.kubernetes.io/zone"]
        );
        assert_eq!(g.spec.ip_retention, "forever");
        assert_eq!(g.spec.node_loss_policy.action, NodeLossAction::Wait);

        // An annotated StatefulSet without a topology key is refused outside a labelled
        // namespace, and pinned by hostname inside one.
        let bare = ann(&[(keys::AUTO_GENERATE, "true")]);
        assert_eq!(
            generated_spec("db", Some(&bare), None),
            Err(AutoGenerateError::NoTopology)
        );
        let g = generated_spec("db", Some(&bare), Some(&labelled))
            .unwrap()
            .unwrap();
        assert_eq!(
            g.spec
                .required_persistent_topology
                .unwrap()
                .node_topology_keys,
            vec![keys::HOSTNAME_LABEL]
        );

        // Invalid annotations are refused on either path.
        let bad = ann(&[(keys::IP_RETENTION, "a while")]);
        assert!(matches!(
            generated_spec("db", Some(&bad), Some(&labelled)),
            Err(AutoGenerateError::Invalid(SpecError::BadRetention(_)))
        ));
    }
}
