//! The fields of a pod that a decision reads, taken from a request's JSON without copying the
//! rest: `metadata.name`, `generateName`, `namespace`, `uid`, `deletionTimestamp`, the labels
//! (the lifecycle hooks read them), the controlling ownerReference, the annotations in
//! [`KEPT_ANNOTATIONS`], `spec.nodeName`, `spec.nodeSelector`, `spec.affinity.nodeAffinity` and
//! `spec.readinessGates`, `status.phase`, and the condition [`HELD_CONDITION`] (the start of a
//! preDelete hold). Containers, volumes, the rest of the status, managed fields and every other
//! annotation are skipped as they are read.
//!
//! The result is a [`Pod`] holding only those fields: what `pin::decide` and `affinity::apply`
//! look at, and what the webhook's patch is the diff of (so the patch can only touch them).
//! Node selector and node affinity are the only parts that grow in memory when parsed, so together
//! they are refused above [`MAX_CONSTRAINTS`] bytes of JSON (real pods use a few hundred).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use ipkeep_values::keys::{
    HELD_ANNOTATION, HELD_CONDITION, IP_RETENTION, KRUISE_RESERVED_IP, PERSISTENT_POD_STATE,
    PIN_SKIPPED, PINNED_BY, SINCE_ANNOTATION,
};
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, Pod, PodCondition, PodReadinessGate, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The annotations a decision reads or writes; all others are skipped.
pub const KEPT_ANNOTATIONS: [&str; 7] = [
    IP_RETENTION,
    KRUISE_RESERVED_IP,
    PERSISTENT_POD_STATE,
    PINNED_BY,
    PIN_SKIPPED,
    SINCE_ANNOTATION,
    HELD_ANNOTATION,
];

/// The most JSON `spec.nodeSelector` and `spec.affinity.nodeAffinity` may take together.
pub const MAX_CONSTRAINTS: usize = 64 * 1024;

/// A pod object the decision cannot read.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// Not JSON of a pod's shape.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// Node constraints over [`MAX_CONSTRAINTS`].
    #[error(
        "its spec.nodeSelector and spec.affinity.nodeAffinity take {0} bytes of JSON, over the {MAX_CONSTRAINTS} bytes ipkeep reads"
    )]
    TooLarge(usize),
}

/// Reads the decision's fields of the pod in `json`.
pub fn read(json: &str) -> Result<Pod, PodError> {
    let pod: PodIn<'_> = serde_json::from_str(json)?;
    let meta = pod.metadata.unwrap_or_default();
    let spec = match pod.spec {
        None => None,
        Some(spec) => {
            let affinity = spec.affinity.map(|a| a.node_affinity);
            let size = spec.node_selector.map_or(0, |r| r.get().len())
                + affinity.flatten().map_or(0, |r| r.get().len());
            if size > MAX_CONSTRAINTS {
                return Err(PodError::TooLarge(size));
            }
            let node_selector = spec
                .node_selector
                .map(|r| serde_json::from_str::<Option<BTreeMap<String, String>>>(r.get()))
                .transpose()?
                .flatten();
            let affinity = match affinity {
                None => None,
                Some(node_affinity) => Some(Affinity {
                    node_affinity: node_affinity
                        .map(|r| serde_json::from_str::<Option<NodeAffinity>>(r.get()))
                        .transpose()?
                        .flatten(),
                    ..Affinity::default()
                }),
            };
            Some(PodSpec {
                node_name: spec.node_name.map(|n| n.0.into_owned()),
                node_selector,
                affinity,
                readiness_gates: spec.readiness_gates,
                ..PodSpec::default()
            })
        }
    };
    Ok(Pod {
        metadata: ObjectMeta {
            name: meta.name.map(|n| n.0.into_owned()),
            generate_name: meta.generate_name.map(|n| n.0.into_owned()),
            namespace: meta.namespace.map(|n| n.0.into_owned()),
            uid: meta.uid.map(|n| n.0.into_owned()),
            deletion_timestamp: meta.deletion_timestamp,
            labels: meta.labels,
            owner_references: meta.owner_references.map(|c| c.0.into_iter().collect()),
            annotations: meta.annotations.map(|a| a.0),
            ..ObjectMeta::default()
        },
        spec,
        status: pod
            .status
            .map(|s| PodStatus {
                phase: s.phase.map(|p| p.0.into_owned()),
                conditions: s.conditions.and_then(|c| c.0).map(|c| vec![c]),
                ..PodStatus::default()
            })
            .filter(|s| s.phase.is_some() || s.conditions.is_some()),
    })
}

#[derive(Deserialize)]
struct PodIn<'a> {
    #[serde(default, borrow)]
    metadata: Option<MetaIn<'a>>,
    #[serde(default, borrow)]
    spec: Option<SpecIn<'a>>,
    #[serde(default, borrow)]
    status: Option<StatusIn<'a>>,
}

#[derive(Deserialize)]
struct StatusIn<'a> {
    #[serde(default, borrow)]
    phase: Option<Text<'a>>,
    #[serde(default)]
    conditions: Option<HeldConditionIn>,
}

/// The condition [`HELD_CONDITION`] of `status.conditions`, if there is one; the others are
/// skipped (their times are not even parsed).
struct HeldConditionIn(Option<PodCondition>);

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConditionIn<'a> {
    #[serde(default, borrow, rename = "type")]
    type_: Text<'a>,
    #[serde(default, borrow)]
    status: Text<'a>,
    #[serde(default, borrow)]
    last_transition_time: Option<&'a RawValue>,
}

/// A string, borrowed from the request unless it has escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaIn<'a> {
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    generate_name: Option<Text<'a>>,
    #[serde(default, borrow)]
    namespace: Option<Text<'a>>,
    #[serde(default, borrow)]
    uid: Option<Text<'a>>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    owner_references: Option<Controller>,
    #[serde(default)]
    annotations: Option<KeptAnnotations>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecIn<'a> {
    #[serde(default, borrow)]
    node_name: Option<Text<'a>>,
    #[serde(default, borrow)]
    node_selector: Option<&'a RawValue>,
    #[serde(default, borrow)]
    affinity: Option<AffinityIn<'a>>,
    #[serde(default)]
    readiness_gates: Option<Vec<PodReadinessGate>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AffinityIn<'a> {
    #[serde(default, borrow)]
    node_affinity: Option<&'a RawValue>,
}

/// The first ownerReference with `controller: true` (the only one a decision looks at).
struct Controller(Option<OwnerReference>);

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OwnerIn<'a> {
    #[serde(default, borrow)]
    api_version: Text<'a>,
    #[serde(default, borrow)]
    kind: Text<'a>,
    #[serde(default, borrow)]
    name: Text<'a>,
    #[serde(default, borrow)]
    uid: Text<'a>,
    #[serde(default)]
    controller: Option<bool>,
}

impl Default for Text<'_> {
    fn default() -> Self {
        Self(Cow::Borrowed(""))
    }
}

impl<'de> Deserialize<'de> for Controller {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct References;
        impl<'de> Visitor<'de> for References {
            type Value = Controller;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of ownerReferences")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Controller, S::Error> {
                let mut controller = None;
                while let Some(owner) = seq.next_element::<OwnerIn<'de>>()? {
                    if controller.is_none() && owner.controller == Some(true) {
                        controller = Some(OwnerReference {
                            api_version: owner.api_version.0.into_owned(),
                            kind: owner.kind.0.into_owned(),
                            name: owner.name.0.into_owned(),
                            uid: owner.uid.0.into_owned(),
                            controller: Some(true),
                            block_owner_deletion: None,
                        });
                    }
                }
                Ok(Controller(controller))
            }
        }
        deserializer.deserialize_seq(References)
    }
}

impl<'de> Deserialize<'de> for HeldConditionIn {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Conditions;
        impl<'de> Visitor<'de> for Conditions {
            type Value = HeldConditionIn;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of pod conditions")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<HeldConditionIn, S::Error> {
                let mut held = None;
                while let Some(c) = seq.next_element::<ConditionIn<'de>>()? {
                    if held.is_some() || c.type_.0 != HELD_CONDITION {
                        continue;
                    }
                    let time = c
                        .last_transition_time
                        .map(|t| serde_json::from_str::<Option<Time>>(t.get()))
                        .transpose()
                        .map_err(serde::de::Error::custom)?
                        .flatten();
                    held = Some(PodCondition {
                        type_: HELD_CONDITION.to_string(),
                        status: c.status.0.into_owned(),
                        last_transition_time: time,
                        ..PodCondition::default()
                    });
                }
                Ok(HeldConditionIn(held))
            }
        }
        deserializer.deserialize_seq(Conditions)
    }
}

/// The annotations in [`KEPT_ANNOTATIONS`]; present (maybe empty) when the pod has annotations
/// at all, so that a patch adds keys to them rather than replacing them.
struct KeptAnnotations(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for KeptAnnotations {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Annotations;
        impl<'de> Visitor<'de> for Annotations {
            type Value = KeptAnnotations;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<KeptAnnotations, M::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    if KEPT_ANNOTATIONS.contains(&key.0.as_ref()) {
                        let value: Text<'de> = map.next_value()?;
                        kept.insert(key.0.into_owned(), value.0.into_owned());
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(KeptAnnotations(kept))
            }
        }
        deserializer.deserialize_map(Annotations)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use ipkeep_api::PersistentPodState;
    use ipkeep_placement::{affinity, pin};
    use serde_json::{Value, json};

    use super::*;

    fn full_pod() -> Value {
        json!({
            "metadata": {
                "name": "db-0", "namespace": "prod", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "db", "statefulset.kubernetes.io/pod-name": "db-0"},
                "annotations": {"team": "pay\nments", IP_RETENTION: "6h", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "c"},
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s1", "controller": true, "blockOwnerDeletion": true},
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "other", "uid": "s2", "controller": true}
                ],
                "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {
                "containers": [{"name": "db", "image": "postgres:17", "env": [{"name": "A", "value": "b"}]}],
                "nodeSelector": {"disk": "nvme"},
                "affinity": {
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]},
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme", "ssd"]}]}]}}
                },
                "tolerations": [{"operator": "Exists"}]
            },
            "status": {"phase": "Pending"}
        })
    }

    fn pps() -> PersistentPodState {
        serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "prod"},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
                "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]}},
            "status": {"targetUID": "s1", "podStates": {"db-0": {"nodeName": "n1",
                "nodeTopologyLabels": {"kubernetes.io/hostname": "n1"}}}}
        }))
        .unwrap()
    }

    #[test]
    fn decides_and_applies_as_the_whole_pod_would() {
        let whole: Pod = serde_json::from_value(full_pod()).unwrap();
        let read = read(&full_pod().to_string()).unwrap();
        let pps = pps();
        let decision = pin::decide(&whole, "prod", Some(&pps));
        assert_eq!(pin::decide(&read, "prod", Some(&pps)), decision);
        let pin::Decision::Manage(managed) = decision else {
            panic!("managed")
        };
        let (mut a, mut b) = (whole.clone(), read.clone());
        affinity::apply(&managed, &mut a);
        affinity::apply(&managed, &mut b);
        let spec = |p: &Pod| {
            p.spec
                .as_ref()
                .unwrap()
                .affinity
                .clone()
                .unwrap()
                .node_affinity
        };
        assert_eq!(spec(&a), spec(&b));
        for key in KEPT_ANNOTATIONS {
            assert_eq!(
                a.metadata.annotations.as_ref().unwrap().get(key),
                b.metadata.annotations.as_ref().unwrap().get(key),
                "{key}"
            );
        }
        // Only the kept fields are there.
        assert_eq!(
            serde_json::to_value(&read).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "db-0", "namespace": "prod", "uid": "u1",
                    "labels": full_pod()["metadata"]["labels"],
                    "annotations": {IP_RETENTION: "6h"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s1", "controller": true}]},
                "spec": {"containers": [], "nodeSelector": {"disk": "nvme"}, "affinity": {"nodeAffinity": full_pod()["spec"]["affinity"]["nodeAffinity"]}},
                "status": {"phase": "Pending"}
            })
        );
    }

    /// A DELETE's `oldObject` carries the hold's start in the pod's status: the deletion review
    /// reads it from there, as the controller does, and nothing else of the conditions.
    #[test]
    fn reads_the_hold_condition_and_skips_the_others() {
        let mut pod = full_pod();
        pod["status"]["conditions"] = json!([
            {"type": "Ready", "status": "False", "lastTransitionTime": "not a time"},
            {"type": HELD_CONDITION, "status": "True", "reason": "PreparingDelete",
                "lastTransitionTime": "2026-11-28T10:00:00Z"},
            {"type": "ipkeep.dev/lifecycle-ready", "status": "False"}
        ]);
        let held = read(&pod.to_string()).unwrap();
        assert_eq!(
            ipkeep_placement::lifecycle::held_since(&held),
            Some(1_795_860_000)
        );
        assert_eq!(
            serde_json::to_value(held.status.unwrap()).unwrap(),
            json!({"phase": "Pending", "conditions": [{"type": HELD_CONDITION, "status": "True",
                "lastTransitionTime": "2026-11-28T10:00:00Z"}]})
        );
        pod["status"] = json!({"conditions": [{"type": HELD_CONDITION, "status": "False"}]});
        let ended = read(&pod.to_string()).unwrap();
        assert_eq!(ipkeep_placement::lifecycle::held_since(&ended), None);
        pod["status"] = json!({"conditions": [{"type": HELD_CONDITION, "status": "True",
            "lastTransitionTime": 5}]});
        assert!(matches!(read(&pod.to_string()), Err(PodError::Json(_))));
    }

    #[test]
    fn absent_null_and_empty_fields_stay_what_they_were() {
        let bare = read(r#"{"metadata": {"name": "a", "annotations": {"x": "y"}}}"#).unwrap();
        assert_eq!(bare.metadata.annotations, Some(BTreeMap::new()));
        assert!(bare.spec.is_none());
        let nulls = read(
            r#"{"metadata": null, "spec": {"nodeSelector": null, "affinity": {"nodeAffinity": null}}}"#,
        )
        .unwrap();
        let spec = nulls.spec.unwrap();
        assert_eq!(spec.node_selector, None);
        assert_eq!(spec.affinity, Some(Affinity::default()));
    }

    #[test]
    fn refuses_what_is_not_a_pod_or_too_large() {
        for bad in [
            "\"pod\"",
            r#"{"metadata": {"name": 5}}"#,
            r#"{"metadata": {"annotations": {"ipkeep.dev/ip-retention": 5}}}"#,
            r#"{"spec": {"nodeSelector": {"a": 1}}}"#,
            r#"{"metadata": {"ownerReferences": {}}}"#,
        ] {
            assert!(matches!(read(bad), Err(PodError::Json(_))), "{bad}");
        }
        let values: Vec<String> = (0..MAX_CONSTRAINTS / 4).map(|i| i.to_string()).collect();
        let huge = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": values}]}]}}}}});
        assert!(matches!(
            read(&huge.to_string()),
            Err(PodError::TooLarge(n)) if n > MAX_CONSTRAINTS
        ));
    }
}
