//! What the agent reads of a PersistentPodState, and nothing more: its name, namespace, UID,
//! deletion, controlling owner and adoption annotation, its target and the target's UID it
//! recorded, its `ipRetention`, and for each record the node and the pod's UID.
//! Decoded through [`LeanPps`] (`ipkeep_daemon::lenient`), a PersistentPodState costs the agent
//! these fields whatever else its writers put in it, and no other field can make it undecodable
//! for the agent.
//!
//! The decisions read it as a `PersistentPodState` with everything else empty. They run
//! `pin::decide`, the webhook's decision, which also reads the spec's topology and hooks (for
//! the pin) and so finds such a spec invalid; what it says to the agent does not depend on
//! them: whether the state manages the pod (its target, namespace and deletion), and the
//! retention it stamps (`ipRetention`, when it reads, in either case). The tests check that the
//! agent decides the same from a lean and from a whole PersistentPodState.

use std::collections::BTreeMap;

use ipkeep_api::{
    DEFAULT_IP_RETENTION, NodeLossPolicy, PersistentPodState, PersistentPodStateSpec,
    PersistentPodStateStatus, PodState, RecordRetention, TargetReference,
};
use ipkeep_daemon::lenient::LeanMeta;
use ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE;
use serde::Deserialize;

/// A PersistentPodState as the agent decodes it.
#[derive(Deserialize, Debug)]
pub struct LeanPps {
    #[serde(default)]
    metadata: LeanMeta,
    spec: Spec,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Spec {
    target_ref: TargetReference,
    #[serde(default = "default_ip_retention")]
    ip_retention: String,
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
struct Record {
    #[serde(default, rename = "nodeName")]
    node_name: String,
    #[serde(default, rename = "podUID")]
    pod_uid: Option<String>,
}

impl From<LeanPps> for PersistentPodState {
    fn from(lean: LeanPps) -> Self {
        PersistentPodState {
            metadata: lean.metadata.into_meta(&[ADOPT_PERSISTENT_POD_STATE]),
            spec: PersistentPodStateSpec {
                target_ref: lean.spec.target_ref,
                ip_retention: lean.spec.ip_retention,
                persistent_pod_annotations: Vec::new(),
                required_persistent_topology: None,
                preferred_persistent_topology: Vec::new(),
                persistent_pod_state_retention_policy: RecordRetention::default(),
                node_loss_policy: NodeLossPolicy::default(),
                lifecycle: None,
            },
            status: lean.status.map(|s| PersistentPodStateStatus {
                target_uid: s.target_uid,
                pod_states: s
                    .pod_states
                    .into_iter()
                    .map(|(pod, r)| {
                        let state = PodState {
                            node_name: r.node_name,
                            pod_uid: r.pod_uid,
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
