//! The watches the controller runs and how their events map to PersistentPodStates.
//!
//! Objects are trimmed before they are cached (only the fields decisions read are kept), so
//! 10,000 pods cost a few MiB, not hundreds. Pod and node events that change nothing the
//! decisions read (node heartbeats, container restarts) are filtered out before they trigger
//! a reconcile; deletions always pass. After a watch is re-listed (for example after 410 Gone)
//! every PersistentPodState is reconciled again, because deletions that happened during the gap
//! are never delivered as events.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use futures::{Stream, StreamExt};
use ipkeep_api::PersistentPodState;
use ipkeep_api::annotations::STATEFULSET_POD_NAME_LABEL;
use ipkeep_placement::view::{NodeHealth, NodeView, PodView};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod, PodSpec, PodStatus};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio::sync::mpsc;

/// Read access to every cache.
#[derive(Debug, Clone)]
pub struct Caches {
    /// StatefulSets (trimmed).
    pub statefulsets: Store<StatefulSet>,
    /// Pods that carry [`STATEFULSET_POD_NAME_LABEL`] (trimmed).
    pub pods: Store<Pod>,
    /// Nodes (trimmed).
    pub nodes: Store<Node>,
    /// PersistentPodStates.
    pub pps: Store<PersistentPodState>,
}

impl Caches {
    /// Waits until every cache has its first full list.
    pub async fn wait_until_ready(&self) -> Result<(), crate::Error> {
        self.statefulsets
            .wait_until_ready()
            .await
            .map_err(|_| crate::Error::CacheGone("statefulset"))?;
        self.pods
            .wait_until_ready()
            .await
            .map_err(|_| crate::Error::CacheGone("pod"))?;
        self.nodes
            .wait_until_ready()
            .await
            .map_err(|_| crate::Error::CacheGone("node"))?;
        self.pps
            .wait_until_ready()
            .await
            .map_err(|_| crate::Error::CacheGone("persistentpodstate"))
    }

    /// The PersistentPodStates in `namespace` that target StatefulSet `name`.
    pub fn pps_targeting(&self, namespace: &str, name: &str) -> Vec<ObjectRef<PersistentPodState>> {
        self.pps
            .state()
            .iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && p.spec.target_ref.name == name
                    && p.spec.target_ref.kind == "StatefulSet"
            })
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect()
    }

    /// The PersistentPodStates a pod event concerns: those targeting its controller.
    pub fn pps_for_pod(&self, pod: &Pod) -> Vec<ObjectRef<PersistentPodState>> {
        let Some(namespace) = pod.namespace() else {
            return Vec::new();
        };
        pod.owner_references()
            .iter()
            .filter(|o| o.controller == Some(true) && o.kind == "StatefulSet")
            .flat_map(|o| self.pps_targeting(&namespace, &o.name))
            .collect()
    }

    /// The PersistentPodStates a node event concerns: those with a record on the node, and
    /// those whose pods run there (a pod can become Ready before its node is cached).
    pub fn pps_for_node(&self, node: &Node) -> Vec<ObjectRef<PersistentPodState>> {
        let name = node.name_any();
        let mut out: Vec<ObjectRef<PersistentPodState>> = self
            .pps
            .state()
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.pod_states.values().any(|r| r.node_name == name))
            })
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect();
        for pod in self.pods.state() {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()) {
                out.extend(self.pps_for_pod(&pod));
            }
        }
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out.dedup();
        out
    }
}

/// Watch configuration for pods: StatefulSet pods only.
pub fn pod_watch_config() -> watcher::Config {
    watcher::Config::default()
        .labels(STATEFULSET_POD_NAME_LABEL)
        .any_semantic()
}

/// Keeps what recording reads of a pod: metadata (without managed fields), node name, the Ready
/// condition and the IPs.
pub fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(PodSpec {
        node_name,
        ..PodSpec::default()
    });
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            conditions: status
                .conditions
                .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            ..PodStatus::default()
        });
    }
}

/// Keeps a node's metadata (without managed fields) and its Ready condition.
pub fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.spec = None;
    if let Some(status) = node.status.take() {
        node.status = Some(NodeStatus {
            conditions: status
                .conditions
                .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
            ..NodeStatus::default()
        });
    }
}

/// Keeps a StatefulSet's metadata (without managed fields), replicas and ordinals.
pub fn trim_statefulset(sts: &mut StatefulSet) {
    sts.metadata.managed_fields = None;
    if let Some(spec) = sts.spec.take() {
        sts.spec = Some(StatefulSetSpec {
            replicas: spec.replicas,
            ordinals: spec.ordinals,
            persistent_volume_claim_retention_policy: None,
            service_name: spec.service_name,
            ..StatefulSetSpec::default()
        });
    }
    sts.status = None;
}

/// What of a pod decides recording: a change elsewhere triggers nothing.
pub fn pod_fingerprint(pod: &Pod) -> u64 {
    fingerprint(&PodView::from_pod(pod))
}

/// What of a StatefulSet decides recording: identity, replicas, ordinals, deletion.
pub fn statefulset_fingerprint(sts: &StatefulSet) -> u64 {
    let view = ipkeep_placement::view::TargetView::from_statefulset(sts);
    fingerprint(&(
        view.uid,
        view.replicas,
        view.ordinals_start,
        sts.metadata.deletion_timestamp.is_some(),
    ))
}

/// What of a node decides recording and node loss: labels and readiness.
pub fn node_fingerprint(node: &Node) -> u64 {
    let view = NodeView::from_node(node);
    fingerprint(&(view.labels, matches!(view.health, NodeHealth::Ready)))
}

fn fingerprint<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// Turns a reflector's event stream into the objects whose decision-relevant fields changed
/// (plus every deletion), and signals `relisted` after each completed re-list.
pub fn changed_objects<K, S>(
    events: S,
    fingerprint: fn(&K) -> u64,
    relisted: mpsc::UnboundedSender<()>,
) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut seen: HashMap<(Option<String>, String), u64> = HashMap::new();
    events.flat_map(move |event| {
        let out: Vec<Result<K, watcher::Error>> = match event {
            Err(e) => vec![Err(e)],
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                let key = (
                    obj.meta().namespace.clone(),
                    obj.meta().name.clone().unwrap_or_default(),
                );
                let print = fingerprint(&obj);
                if seen.insert(key, print) == Some(print) {
                    Vec::new()
                } else {
                    vec![Ok(obj)]
                }
            }
            Ok(watcher::Event::Delete(obj)) => {
                seen.remove(&(
                    obj.meta().namespace.clone(),
                    obj.meta().name.clone().unwrap_or_default(),
                ));
                vec![Ok(obj)]
            }
            Ok(watcher::Event::Init) => Vec::new(),
            Ok(watcher::Event::InitDone) => {
                let _ = relisted.send(());
                Vec::new()
            }
        };
        futures::stream::iter(out)
    })
}
