//! The few fields of pods, nodes and StatefulSets that placement decisions read. Building them is
//! the only place that knows where those fields live in the Kubernetes objects.

use std::collections::BTreeMap;

use ipkeep_api::k8s_openapi::api::apps::v1::StatefulSet;
use ipkeep_api::k8s_openapi::api::core::v1::{Node, Pod};
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use ipkeep_values::ordinal;

use ipkeep_api::kruise::AdvancedStatefulSet;

use crate::ordinals::{InvalidReserveOrdinal, ReservedOrdinals, ValidOrdinals};

/// A pod, as recording and pruning see it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct PodView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The UID of its controller (ownerReference with `controller: true`), if any.
    pub controller_uid: Option<String>,
    /// `spec.nodeName`.
    pub node_name: Option<String>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// Being deleted or finished: see [`terminating`].
    pub terminating: bool,
    /// `status.podIPs` (or `status.podIP`).
    pub ips: Vec<String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.creationTimestamp`, in milliseconds since the Unix epoch.
    pub created_ms: Option<i64>,
}

impl PodView {
    /// Reads the fields from a pod.
    pub fn from_pod(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let mut ips: Vec<String> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|ips| ips.iter().map(|ip| ip.ip.clone()).collect())
            .unwrap_or_default();
        if ips.is_empty() {
            ips.extend(status.and_then(|s| s.pod_ip.clone()));
        }
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            controller_uid: pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone()),
            node_name: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            ready,
            terminating: terminating(
                pod.metadata.deletion_timestamp.is_some(),
                status.and_then(|s| s.phase.as_deref()),
            ),
            ips,
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            created_ms: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond()),
        }
    }

    /// Ready, bound, and not being deleted: what a record is taken from.
    pub fn is_recordable(&self) -> bool {
        self.ready && !self.terminating && self.node_name.is_some()
    }
}

/// The one definition of a terminating pod, for recording, the lifecycle hooks and admission:
/// it has a deletion timestamp, or it has finished (phase `Succeeded` or `Failed`), so its
/// containers will not run again under this UID.
pub fn terminating(deletion_timestamp_set: bool, phase: Option<&str>) -> bool {
    deletion_timestamp_set || matches!(phase, Some("Succeeded" | "Failed"))
}

/// A node's health as the node-loss policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeHealth {
    /// `Ready` is `True`.
    Ready,
    /// `Ready` is `False` or `Unknown` (or missing) since this time, if known.
    NotReady {
        /// The condition's `lastTransitionTime`.
        since: Option<Time>,
    },
}

/// A node, as recording and the node-loss policy see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// From the `Ready` condition.
    pub health: NodeHealth,
}

impl NodeView {
    /// Reads the fields from a node.
    pub fn from_node(node: &Node) -> Self {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let health = match ready {
            Some(c) if c.status == "True" => NodeHealth::Ready,
            Some(c) => NodeHealth::NotReady {
                since: c.last_transition_time.clone(),
            },
            None => NodeHealth::NotReady { since: None },
        };
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            health,
        }
    }
}

/// The recorded StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TargetView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The ordinals it wants: from `spec.replicas` (1 when unset, as the API defaults it),
    /// `spec.ordinals.start` (0 when unset) and, for an Advanced StatefulSet,
    /// `spec.reserveOrdinals` ([`crate::ordinals`]).
    pub ordinals: ValidOrdinals,
    /// Records of an earlier StatefulSet with this name are this one's: the PersistentPodState
    /// carries [`ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE`] (see [`adopts`]).
    pub adopts_records: bool,
    /// An Advanced StatefulSet's `spec.reserveOrdinals` entry that does not parse (so nothing is
    /// reserved, as in Kruise): said on the PersistentPodState.
    pub invalid_reserve_ordinal: Option<InvalidReserveOrdinal>,
}

/// Whether an object's annotations ask for adoption
/// ([`ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE`] is `"true"`): on a StatefulSet, to
/// take over the PersistentPodState an earlier one of its name left; on a PersistentPodState,
/// to keep its records when its StatefulSet is deleted, for the next one of that name.
pub fn adopts(annotations: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE))
        .is_some_and(|v| v.trim() == "true")
}

impl TargetView {
    /// Reads the fields from a StatefulSet.
    pub fn from_statefulset(sts: &StatefulSet) -> Self {
        let spec = sts.spec.as_ref();
        Self {
            name: sts.metadata.name.clone().unwrap_or_default(),
            uid: sts.metadata.uid.clone().unwrap_or_default(),
            ordinals: ValidOrdinals::native(
                count(spec.and_then(|s| s.replicas), 1),
                count(
                    spec.and_then(|s| s.ordinals.as_ref()).and_then(|o| o.start),
                    0,
                ),
            ),
            adopts_records: false,
            invalid_reserve_ordinal: None,
        }
    }

    /// Reads the fields from an OpenKruise Advanced StatefulSet: its ordinals follow Kruise's
    /// rules ([`ValidOrdinals::kruise`]); `reserveOrdinals` with an entry that does not parse
    /// reserve nothing, as in Kruise.
    pub fn from_advanced(asts: &AdvancedStatefulSet) -> Self {
        let spec = &asts.spec;
        let (reserved, invalid_reserve_ordinal) =
            match ReservedOrdinals::parse(&spec.reserve_ordinals) {
                Ok(reserved) => (reserved, None),
                Err(e) => (ReservedOrdinals::default(), Some(e)),
            };
        Self {
            name: asts.metadata.name.clone().unwrap_or_default(),
            uid: asts.metadata.uid.clone().unwrap_or_default(),
            ordinals: ValidOrdinals::kruise(
                count(spec.replicas, 1),
                count(spec.ordinals.as_ref().map(|o| o.start), 0),
                &reserved,
            ),
            adopts_records: false,
            invalid_reserve_ordinal,
        }
    }

    /// The pod names the StatefulSet wants now: `<name>-<ordinal>` for each of its
    /// [`Self::ordinals`].
    pub fn wanted_pod_names(&self) -> impl Iterator<Item = String> + '_ {
        self.ordinals.iter().map(|o| format!("{}-{o}", self.name))
    }

    /// Whether `pod_name` is one of [`Self::wanted_pod_names`].
    pub fn wants(&self, pod_name: &str) -> bool {
        ordinal::from_name(pod_name, &self.name).is_some_and(|o| self.ordinals.contains(o))
    }
}

/// A count from the API (`replicas`, `ordinals.start`): `default` when unset, 0 when negative.
fn count(value: Option<i32>, default: u32) -> u32 {
    value.map_or(default, |v| u32::try_from(v).unwrap_or(0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ordinal_range_honours_ordinals_start() {
        let t = TargetView {
            name: "db".into(),
            uid: "u".into(),
            ordinals: ValidOrdinals::native(3, 5),
            adopts_records: false,
            invalid_reserve_ordinal: None,
        };
        assert_eq!(
            t.wanted_pod_names().collect::<Vec<_>>(),
            vec!["db-5", "db-6", "db-7"]
        );
        for (name, want) in [
            ("db-5", true),
            ("db-7", true),
            ("db-4", false),
            ("db-8", false),
            ("db-05", false),
            ("db-+5", false),
            ("dbx-5", false),
            ("db-", false),
            ("other-5", false),
        ] {
            assert_eq!(t.wants(name), want, "{name}");
        }
    }

    #[test]
    fn an_advanced_statefulset_wants_kruise_ordinals() {
        let asts: AdvancedStatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "uid": "u1"},
            "spec": {"replicas": 3, "reserveOrdinals": [1]}
        }))
        .unwrap();
        let t = TargetView::from_advanced(&asts);
        assert_eq!(
            t.wanted_pod_names().collect::<Vec<_>>(),
            ["db-0", "db-2", "db-3"]
        );
        assert_eq!(t.uid, "u1");
        let bad: AdvancedStatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db"},
            "spec": {"replicas": 2, "reserveOrdinals": [0, "1-x"]}
        }))
        .unwrap();
        assert_eq!(
            TargetView::from_advanced(&bad)
                .wanted_pod_names()
                .collect::<Vec<_>>(),
            ["db-0", "db-1"],
            "an entry Kruise cannot parse reserves nothing"
        );
    }

    #[test]
    fn reads_pods_and_nodes_from_api_objects() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-0", "uid": "p1", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s1", "controller": true}]},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let v = PodView::from_pod(&pod);
        assert!(v.is_recordable());
        assert_eq!(v.ips, vec!["10.0.0.5"]);
        assert_eq!(v.controller_uid.as_deref(), Some("s1"));
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        assert!(matches!(
            NodeView::from_node(&node).health,
            NodeHealth::NotReady { since: Some(_) }
        ));
    }
}
