//! What the scheduler extension reads of a PersistentPodState, and nothing more: its name,
//! namespace, deletion and adoption annotation, its spec but for `persistentPodAnnotations` (the
//! controller's, which records them), and of its status the target's UID and, per record, the
//! node, its topology labels and whether the pin fell back. That is what `pin::decide`, the
//! extender and the preDelete hook read. Decoded through [`LeanPps`] (`ipkeep_daemon::lenient`),
//! a PersistentPodState costs the extension these fields whatever else its writers put in it
//! (record IPs, annotations and timestamps, conditions, anything a status writer adds), and no
//! other field can make it undecodable here. The tests check that the decisions are the same
//! from a lean and from a whole PersistentPodState.

use std::collections::BTreeMap;

use ipkeep_api::{
    DEFAULT_IP_RETENTION, LifecycleSpec, NodeLossPolicy, NodeTopologyTerm, PersistentPodState,
    PersistentPodStateSpec, PersistentPodStateStatus, PodState, PreferredTopologyTerm,
    RecordRetention, TargetReference,
};
use ipkeep_daemon::lenient::LeanMeta;
use ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE;
use serde::Deserialize;

/// A PersistentPodState as the scheduler extension decodes it.
#[derive(Deserialize, Debug)]
pub struct LeanPps {
    #[serde(default)]
    metadata: LeanMeta,
    spec: Spec,
    #[serde(default)]
    status: Option<Status>,
}

/// The spec's fields but `persistentPodAnnotations`, with its defaults.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Spec {
    target_ref: TargetReference,
    #[serde(default)]
    required_persistent_topology: Option<NodeTopologyTerm>,
    #[serde(default)]
    preferred_persistent_topology: Vec<PreferredTopologyTerm>,
    #[serde(default)]
    persistent_pod_state_retention_policy: RecordRetention,
    #[serde(default)]
    node_loss_policy: NodeLossPolicy,
    #[serde(default = "default_ip_retention")]
    ip_retention: String,
    #[serde(default)]
    lifecycle: Option<LifecycleSpec>,
}

fn default_ip_retention() -> String {
    DEFAULT_IP_RETENTION.to_string()
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default, rename = "targetUID")]
    target_uid: Option<String>,
    #[serde(default)]
    pod_states: BTreeMap<String, Record>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Record {
    #[serde(default)]
    node_name: String,
    #[serde(default)]
    node_topology_labels: BTreeMap<String, String>,
    #[serde(default)]
    preferred_only: bool,
}

impl From<LeanPps> for PersistentPodState {
    fn from(lean: LeanPps) -> Self {
        let spec = lean.spec;
        PersistentPodState {
            metadata: lean.metadata.into_meta(&[ADOPT_PERSISTENT_POD_STATE]),
            spec: PersistentPodStateSpec {
                target_ref: spec.target_ref,
                persistent_pod_annotations: Vec::new(),
                required_persistent_topology: spec.required_persistent_topology,
                preferred_persistent_topology: spec.preferred_persistent_topology,
                persistent_pod_state_retention_policy: spec.persistent_pod_state_retention_policy,
                node_loss_policy: spec.node_loss_policy,
                ip_retention: spec.ip_retention,
                lifecycle: spec.lifecycle,
            },
            status: lean.status.map(|s| PersistentPodStateStatus {
                target_uid: s.target_uid,
                pod_states: s
                    .pod_states
                    .into_iter()
                    .map(|(pod, r)| {
                        let state = PodState {
                            node_name: r.node_name,
                            node_topology_labels: r.node_topology_labels,
                            preferred_only: r.preferred_only,
                            ..PodState::default()
                        };
                        (pod, state)
                    })
                    .collect(),
                ..PersistentPodStateStatus::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use ipkeep_daemon::lenient::Lenient;
    use ipkeep_placement::pin;
    use ipkeep_placement::spec;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    use super::*;

    const HOST: &str = "kubernetes.io/hostname";
    const ZONE: &str = "topology.kubernetes.io/zone";

    /// A whole PersistentPodState `db` for StatefulSet `db`, with all the fields the extension
    /// skips filled in.
    fn whole() -> Value {
        json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
            "metadata": {"name": "db", "namespace": "prod", "uid": "u", "resourceVersion": "9",
                "labels": {"team": "a"}, "annotations": {"note": "x"},
                "managedFields": [{"manager": "ipkeep-controller", "operation": "Apply"}]},
            "spec": {
                "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
                "persistentPodAnnotations": [{"key": "example.com/a"}, {"key": "example.com/b"}],
                "requiredPersistentTopology": {"nodeTopologyKeys": [HOST]},
                "preferredPersistentTopology": [{"weight": 60, "preference": {"nodeTopologyKeys": [ZONE]}}],
                "persistentPodStateRetentionPolicy": "WhenDeleted",
                "nodeLossPolicy": {"action": "Wait", "after": "10m"},
                "ipRetention": "2h",
                "lifecycle": {"preDelete": {"labelsHandler": {"example.com/registered": "true"}, "timeoutSeconds": 60}}
            },
            "status": {"observedGeneration": 3, "targetUID": "sts-uid", "recordedPods": 2,
                "podStates": {
                    "db-0": {"nodeName": "n1", "nodeTopologyLabels": {HOST: "n1", ZONE: "a"},
                        "annotations": {"example.com/a": "v"}, "podIPs": ["10.0.0.7"], "podUID": "p0",
                        "recordedAt": "2026-11-28T10:00:00Z"},
                    "db-1": {"nodeName": "n2", "nodeTopologyLabels": {HOST: "n2", ZONE: "b"},
                        "preferredOnly": true, "nodeLostAt": "2026-11-28T10:00:00Z"}
                },
                "conditions": [{"type": "Ready", "status": "True", "reason": "Recording", "message": "m",
                    "lastTransitionTime": "2026-11-28T10:00:00Z"}]}
        })
    }

    /// `base` with the member at `path` (a JSON pointer into objects) set.
    fn with(mut base: Value, path: &str, value: Value) -> Value {
        let (parent, key) = path.rsplit_once('/').unwrap();
        base.pointer_mut(parent).unwrap()[key] = value;
        base
    }

    fn pod(name: &str, owner_uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "prod", "ownerReferences": [{"apiVersion": "apps/v1",
                "kind": "StatefulSet", "name": "db", "uid": owner_uid, "controller": true}]},
            "spec": {"containers": [{"name": "db", "image": "postgres"}]}
        }))
        .unwrap()
    }

    /// Every decision the extension makes from a PersistentPodState is the same from the whole
    /// object and from what [`LeanPps`] keeps of it, across specs that check and do not, and
    /// records that pin, fall back, or belong to an earlier StatefulSet.
    #[test]
    fn decisions_are_the_same_from_a_lean_and_a_whole_object() {
        let states = [
            whole(),
            with(whole(), "/status/targetUID", json!("older-sts")),
            with(
                with(whole(), "/status/targetUID", json!("older-sts")),
                "/metadata/annotations",
                json!({"ipkeep.dev/adopt-persistent-pod-state": "true"}),
            ),
            with(whole(), "/spec/nodeLossPolicy/after", json!("soon")),
            with(whole(), "/spec/ipRetention", json!("later")),
            with(
                whole(),
                "/spec/preferredPersistentTopology",
                json!([{"weight": 0, "preference": {"nodeTopologyKeys": [ZONE]}}]),
            ),
            with(
                whole(),
                "/metadata/deletionTimestamp",
                json!("2026-11-28T11:00:00Z"),
            ),
        ];
        let pods = [
            pod("db-0", "sts-uid"),
            pod("db-1", "sts-uid"),
            pod("db-2", "sts-uid"),
        ];
        for state in states {
            let whole: PersistentPodState = serde_json::from_value(state.clone()).unwrap();
            let lean: PersistentPodState =
                Lenient::<PersistentPodState, LeanPps>::decode(&state.to_string())
                    .decoded
                    .unwrap();
            assert!(lean.spec.persistent_pod_annotations.is_empty());
            for pod in &pods {
                assert_eq!(
                    pin::decide(pod, "prod", Some(&lean)),
                    pin::decide(pod, "prod", Some(&whole)),
                    "{state}"
                );
            }
            assert_eq!(
                spec::check(&lean.spec).map(|c| c.lifecycle),
                spec::check(&whole.spec).map(|c| c.lifecycle),
                "{state}"
            );
            assert_eq!(
                pin::stamped_retention(&lean),
                pin::stamped_retention(&whole)
            );
        }
    }

    /// What a status writer adds that the extension does not read can neither cost it memory
    /// nor make the object undecodable here.
    #[test]
    fn fields_it_does_not_read_cannot_make_it_undecodable() {
        let state = with(
            with(whole(), "/status/podStates/db-0/recordedAt", json!("soon")),
            "/status/recordedPods",
            json!(3_000_000_000u64),
        );
        let lean = Lenient::<PersistentPodState, LeanPps>::decode(&state.to_string());
        let lean = lean.decoded.unwrap();
        let record = &lean.status.unwrap().pod_states["db-0"];
        assert!(record.recorded_at.is_none() && record.pod_ips.is_empty());
        assert!(
            Lenient::<PersistentPodState>::decode(&state.to_string())
                .decoded
                .is_err()
        );
    }
}
