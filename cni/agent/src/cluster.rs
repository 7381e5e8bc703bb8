//! What the agent knows from Kubernetes, kept in kube-rs reflector caches: its own Node, the
//! pods bound to it (field selector `spec.nodeName`) and every PersistentPodState, reduced to
//! what release decisions read. Watches retry in the background. No Kubernetes-aware decision
//! is made until all three caches have synced, while any watch is relisting after an error,
//! or while the Node named by `--node-name` does not exist: a wrong node name would otherwise
//! make every running pod look gone. The store keeps serving regardless.
//!
//! PersistentPodStates are listed in small pages and decoded one by one through
//! [`LeanPps`] (`ipkeep_daemon::lenient`): one the agent cannot decode is left out and
//! remembered by name, the cache still syncs, and no decision is made for the pods of its
//! namespace (see [`crate::management`] and [`crate::release`]): it might manage any of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use ipkeep_api::PersistentPodState;
use ipkeep_daemon::lenient::{self, Lenient, Undecodables};
use ipkeep_values::keys::{MIRROR_ANNOTATION, POD_INDEX_LABEL, RETENTION_ANNOTATIONS};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

use crate::lean_pps::LeanPps;
use crate::release::{ClusterView, PpsView};

/// Whether Kubernetes-aware release can run, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Caches not synced yet, or a watch is relisting after an error.
    Syncing,
    /// Synced, but no Node has this agent's `--node-name`.
    NodeUnknown,
    /// Decisions run.
    Ready,
}

impl Readiness {
    /// For `/readyz` and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Syncing => "syncing",
            Readiness::NodeUnknown => "node unknown (check --node-name)",
            Readiness::Ready => "synced",
        }
    }
}

/// The three caches.
#[derive(Clone, Debug)]
pub struct Cluster {
    node: String,
    nodes: Store<Node>,
    pods: Store<Pod>,
    pps: Store<PersistentPodState>,
    /// The PersistentPodStates that do not decode (left out of `pps`).
    undecodable: Undecodables,
    synced: Arc<AtomicBool>,
    /// Per watch: false from a watch error until its relist completes. A cache that may have
    /// missed events is never used for a decision (a pod created meanwhile would look gone).
    current: [Arc<AtomicBool>; 3],
    /// Whether the last readiness check found the Node (for a log line when that changes).
    node_seen: Arc<AtomicBool>,
    /// Woken on every change, so a release follows within a pass.
    pub changed: Arc<Notify>,
    /// Counts changes seen by the watches.
    generation: Arc<std::sync::atomic::AtomicU64>,
}

/// The cache writers, for [`watch`].
#[allow(missing_debug_implementations)] // reflector writers are not Debug
pub struct Writers {
    nodes: Writer<Node>,
    pods: Writer<Pod>,
    pps: Writer<PersistentPodState>,
}

impl Cluster {
    /// Empty caches for `node`; `undecodable` counts the PersistentPodStates left out.
    pub fn new(node: &str, undecodable: Gauge) -> (Self, Writers) {
        let (nodes, nodes_writer) = reflector::store();
        let (pods, pods_writer) = reflector::store();
        let (pps, pps_writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        (
            Cluster {
                node: node.to_string(),
                nodes,
                pods,
                pps,
                undecodable: Undecodables::new("PersistentPodState", undecodable)
                    .notifying(changed.clone()),
                synced: Arc::default(),
                current: std::array::from_fn(|_| Arc::new(AtomicBool::new(true))),
                node_seen: Arc::new(AtomicBool::new(true)),
                changed,
                generation: Arc::default(),
            },
            Writers {
                nodes: nodes_writer,
                pods: pods_writer,
                pps: pps_writer,
            },
        )
    }

    /// Whether decisions can run, and if not, why.
    pub fn readiness(&self) -> Readiness {
        let current = self.current.iter().all(|c| c.load(Ordering::Acquire));
        if !self.synced.load(Ordering::Acquire) || !current {
            return Readiness::Syncing;
        }
        let known = self.nodes.state().iter().any(|n| n.name_any() == self.node);
        if self.node_seen.swap(known, Ordering::AcqRel) != known {
            if known {
                tracing::info!(node = %self.node, "found this node's Node object; Kubernetes-aware release is on");
            } else {
                tracing::error!(node = %self.node, hint = "every pod would look gone", "no Node named by --node-name exists; Kubernetes-aware release is off until it does");
            }
        }
        if known {
            Readiness::Ready
        } else {
            Readiness::NodeUnknown
        }
    }

    /// This node's pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`), once its Node is known and
    /// has them.
    pub fn pod_cidrs(&self) -> Option<Vec<String>> {
        let node = self
            .nodes
            .state()
            .into_iter()
            .find(|n| n.name_any() == self.node)?;
        let spec = node.spec.as_ref()?;
        let cidrs = match (&spec.pod_cidrs, &spec.pod_cidr) {
            (Some(all), _) if !all.is_empty() => all.clone(),
            (_, Some(one)) => vec![one.clone()],
            _ => return None,
        };
        Some(cidrs)
    }

    /// Counts the changes the watches have seen: a different value means a different view.
    pub fn generation(&self) -> u64 {
        self.generation
            .load(Ordering::Acquire)
            .wrapping_add(self.undecodable.generation())
    }

    /// Whether decisions can run.
    pub fn synced(&self) -> bool {
        self.readiness() == Readiness::Ready
    }

    /// The pod `namespace`/`name` bound to this node, as far as the cache knows.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// The names of the PersistentPodStates of `namespace` that do not decode.
    pub fn undecodable_in(&self, namespace: &str) -> Vec<String> {
        self.undecodable.names_in(namespace)
    }

    /// The PersistentPodStates of `namespace` (those that decode).
    pub fn states_in(&self, namespace: &str) -> Vec<Arc<PersistentPodState>> {
        self.pps
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    /// The current view, or `None` while decisions cannot run.
    pub fn view(&self) -> Option<ClusterView> {
        if !self.synced() {
            return None;
        }
        let pods = self
            .pods
            .state()
            .iter()
            .map(|p| {
                (
                    (p.namespace().unwrap_or_default(), p.name_any()),
                    runtime_uid(p),
                )
            })
            .collect();
        let pps = self
            .pps
            .state()
            .iter()
            .map(|p| {
                let view = PpsView {
                    statefulset: p.spec.target_ref.workload().map(|(_, s)| s.to_string()),
                    records: p
                        .status
                        .as_ref()
                        .map(|s| {
                            s.pod_states
                                .iter()
                                .map(|(pod, state)| (pod.clone(), state.node_name.clone()))
                                .collect()
                        })
                        .unwrap_or_default(),
                };
                ((p.namespace().unwrap_or_default(), p.name_any()), view)
            })
            .collect();
        Some(ClusterView {
            node: self.node.clone(),
            pps,
            undecodable: self.undecodable.namespaces(),
            pods,
        })
    }
}

/// The UID the container runtime knows a pod by: a mirror Pod's static pod UID, else its own.
pub fn runtime_uid(pod: &Pod) -> Option<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .filter(|uid| !uid.is_empty())
        .cloned()
        .or_else(|| pod.metadata.uid.clone())
}

/// Runs the watches until the process ends, marking the caches synced once all have listed.
pub async fn watch(client: Client, cluster: Cluster, writers: Writers) {
    let nodes = watcher(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", cluster.node)),
    )
    .default_backoff()
    .modify(trim_node)
    .reflect(writers.nodes);
    let pods = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={}", cluster.node)),
    )
    .default_backoff()
    .modify(trim_pod)
    .reflect(writers.pods);
    let pps = lenient::sorted(
        watcher(
            Api::<Lenient<PersistentPodState, LeanPps>>::all(client),
            watcher::Config::default().page_size(lenient::PAGE_SIZE),
        )
        .default_backoff(),
        cluster.pps.clone(),
        cluster.undecodable.clone(),
    )
    .reflect(writers.pps);
    let [nodes_current, pods_current, pps_current] = &cluster.current;
    let nodes = nodes.for_each(|event| {
        track(event, nodes_current, &cluster, "node");
        std::future::ready(())
    });
    let pods = pods.for_each(|event| {
        track(event, pods_current, &cluster, "pod");
        std::future::ready(())
    });
    let pps = pps.for_each(|event| {
        track(event, pps_current, &cluster, "PersistentPodState");
        std::future::ready(())
    });
    let ready = {
        let cluster = cluster.clone();
        async move {
            // Only fails when a writer is dropped, which only happens at shutdown.
            let nodes = cluster.nodes.wait_until_ready().await;
            let pods = cluster.pods.wait_until_ready().await;
            let pps = cluster.pps.wait_until_ready().await;
            if nodes.is_ok() && pods.is_ok() && pps.is_ok() {
                cluster.synced.store(true, Ordering::Release);
                cluster.changed.notify_one();
                tracing::info!(node = %cluster.node, readiness = cluster.readiness().as_str(), "node, pod and PersistentPodState caches synced");
            }
        }
    };
    futures::join!(nodes, pods, pps, ready);
}

/// Marks a watch current again once a relist completes (or a watch event arrives, which only
/// happens after one), not current on an error, and counts every change and wakes the sweep.
fn track<K>(
    event: Result<watcher::Event<K>, watcher::Error>,
    current: &AtomicBool,
    cluster: &Cluster,
    what: &str,
) {
    cluster.generation.fetch_add(1, Ordering::AcqRel);
    let changed = &cluster.changed;
    match event {
        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
        Ok(_) => {
            if !current.swap(true, Ordering::AcqRel) {
                tracing::info!("{what} watch is current again");
            }
            changed.notify_one();
        }
        Err(e) => {
            if current.swap(false, Ordering::AcqRel) {
                tracing::warn!(error = %e, "{what} watch failed; Kubernetes-aware release paused until it relists");
            } else {
                tracing::debug!(error = %e, "{what} watch still failing");
            }
        }
    }
}

/// Keeps a node's name and pod CIDRs only.
fn trim_node(node: &mut Node) {
    let name = node.metadata.name.take();
    let cidrs = node.spec.as_mut().map(|s| NodeSpec {
        pod_cidr: s.pod_cidr.take(),
        pod_cidrs: s.pod_cidrs.take(),
        ..NodeSpec::default()
    });
    *node = Node::default();
    node.metadata.name = name;
    node.spec = cidrs;
}

/// Keeps a pod's identity (name, namespace, UID, a mirror Pod's static pod UID) and what says
/// whether a PersistentPodState manages it ([`crate::management`]): its controlling owner, its
/// ordinal label and its retention annotations.
fn trim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.annotations = meta
        .annotations
        .take()
        .map(|mut a| {
            a.retain(|k, _| k == MIRROR_ANNOTATION || RETENTION_ANNOTATIONS.contains(&k.as_str()));
            a
        })
        .filter(|a| !a.is_empty());
    meta.labels = meta
        .labels
        .take()
        .map(|mut l| {
            l.retain(|k, _| k == POD_INDEX_LABEL);
            l
        })
        .filter(|l| !l.is_empty());
    meta.owner_references = meta
        .owner_references
        .take()
        .map(|mut o| {
            o.retain(|o| o.controller == Some(true));
            o
        })
        .filter(|o| !o.is_empty());
    pod.spec = None;
    pod.status = None;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The sweep's view names a state's StatefulSet for an `apps` one and an OpenKruise Advanced
    /// StatefulSet alike (their pods are named alike), and no other kind.
    #[test]
    fn a_state_names_its_statefulset_of_either_workload() {
        let (cluster, mut writers) = Cluster::new("n1", Gauge::default());
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap();
        writers
            .nodes
            .apply_watcher_event(&watcher::Event::Apply(node));
        for (name, api_version, kind) in [
            ("db", "apps/v1", "StatefulSet"),
            ("kv", "apps.kruise.io/v1beta1", "StatefulSet"),
            ("web", "apps/v1", "Deployment"),
        ] {
            let pps: PersistentPodState = serde_json::from_value(serde_json::json!({
                "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
                "metadata": {"name": name, "namespace": "prod"},
                "spec": {"targetRef": {"apiVersion": api_version, "kind": kind, "name": name}}
            }))
            .unwrap();
            writers.pps.apply_watcher_event(&watcher::Event::Apply(pps));
        }
        cluster.synced.store(true, Ordering::Release);
        let view = cluster.view().unwrap();
        let statefulset = |name: &str| {
            view.pps[&("prod".to_string(), name.to_string())]
                .statefulset
                .clone()
        };
        assert_eq!(statefulset("db").as_deref(), Some("db"));
        assert_eq!(
            statefulset("kv").as_deref(),
            Some("kv"),
            "an Advanced StatefulSet's state"
        );
        assert_eq!(statefulset("web"), None, "another kind");
    }

    #[test]
    fn a_static_pod_is_known_by_its_mirror_annotation() {
        let mut mirror: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "etcd-n1", "namespace": "kube-system", "uid": "mirror-uid",
                "annotations": {"kubernetes.io/config.mirror": "static-uid",
                                "kubernetes.io/config.hash": "static-uid", "other": "x"}}
        }))
        .unwrap();
        trim_pod(&mut mirror);
        assert_eq!(runtime_uid(&mirror).as_deref(), Some("static-uid"));
        assert_eq!(mirror.metadata.annotations.as_ref().unwrap().len(), 1);
        let plain: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-0", "uid": "u1"}
        }))
        .unwrap();
        assert_eq!(runtime_uid(&plain).as_deref(), Some("u1"));
    }
}
