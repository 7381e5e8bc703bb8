//! What the agent knows from Kubernetes, kept in kube-rs reflector caches: the pods bound to
//! its node (field selector `spec.nodeName`) and every PersistentPodState, reduced to what
//! release decisions read. Watches retry in the background; until both caches have synced,
//! no Kubernetes-aware decision is made (the store keeps serving regardless).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use ipkeep_api::PersistentPodState;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;

use crate::release::{ClusterView, PpsView};

/// The two caches.
#[derive(Clone, Debug)]
pub struct Cluster {
    node: String,
    pods: Store<Pod>,
    pps: Store<PersistentPodState>,
    synced: Arc<AtomicBool>,
    /// Per watch: false from a watch error until its relist completes. A cache that may have
    /// missed events is never used for a decision (a pod created meanwhile would look gone).
    pods_current: Arc<AtomicBool>,
    pps_current: Arc<AtomicBool>,
    /// Woken on every change, so a release follows within a pass.
    pub changed: Arc<Notify>,
}

/// The cache writers, for [`watch`].
#[allow(missing_debug_implementations)] // reflector writers are not Debug
pub struct Writers {
    pods: Writer<Pod>,
    pps: Writer<PersistentPodState>,
}

impl Cluster {
    /// Empty caches for `node`.
    pub fn new(node: &str) -> (Self, Writers) {
        let (pods, pods_writer) = reflector::store();
        let (pps, pps_writer) = reflector::store();
        (
            Cluster {
                node: node.to_string(),
                pods,
                pps,
                synced: Arc::default(),
                pods_current: Arc::new(AtomicBool::new(true)),
                pps_current: Arc::new(AtomicBool::new(true)),
                changed: Arc::default(),
            },
            Writers {
                pods: pods_writer,
                pps: pps_writer,
            },
        )
    }

    /// Whether both caches have synced and neither watch has failed since its last relist.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
            && self.pods_current.load(Ordering::Acquire)
            && self.pps_current.load(Ordering::Acquire)
    }

    /// The current view, or `None` before the first sync.
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
                    p.metadata.uid.clone(),
                )
            })
            .collect();
        let pps = self
            .pps
            .state()
            .iter()
            .map(|p| {
                let target = &p.spec.target_ref;
                let view = PpsView {
                    statefulset: (target.kind == "StatefulSet").then(|| target.name.clone()),
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
            pods,
        })
    }
}

/// Runs both watches until the process ends, marking the caches synced once both have listed.
pub async fn watch(client: Client, cluster: Cluster, writers: Writers) {
    let selector = format!("spec.nodeName={}", cluster.node);
    let pods = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields(&selector),
    )
    .default_backoff()
    .modify(trim_pod)
    .reflect(writers.pods);
    let pps = watcher(
        Api::<PersistentPodState>::all(client),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(trim_pps)
    .reflect(writers.pps);
    let pods = pods.for_each(|event| {
        track(event, &cluster.pods_current, &cluster.changed, "pod");
        std::future::ready(())
    });
    let pps = pps.for_each(|event| {
        track(
            event,
            &cluster.pps_current,
            &cluster.changed,
            "PersistentPodState",
        );
        std::future::ready(())
    });
    let ready = {
        let cluster = cluster.clone();
        async move {
            // Only fails when a writer is dropped, which only happens at shutdown.
            let pods = cluster.pods.wait_until_ready().await;
            let pps = cluster.pps.wait_until_ready().await;
            if pods.is_ok() && pps.is_ok() {
                cluster.synced.store(true, Ordering::Release);
                cluster.changed.notify_one();
                tracing::info!(node = %cluster.node, "pod and PersistentPodState caches synced; Kubernetes-aware release is on");
            }
        }
    };
    futures::join!(pods, pps, ready);
}

/// Marks a watch current again once a relist completes (or a watch event arrives, which only
/// happens after one), not current on an error, and wakes the sweep on every change.
fn track<K>(
    event: Result<watcher::Event<K>, watcher::Error>,
    current: &AtomicBool,
    changed: &Notify,
    what: &str,
) {
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

/// Keeps a pod's identity only.
fn trim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    pod.spec = None;
    pod.status = None;
}

/// Keeps a PersistentPodState's target and which node each record names.
fn trim_pps(pps: &mut PersistentPodState) {
    pps.managed_fields_mut().clear();
    pps.annotations_mut().clear();
    if let Some(status) = pps.status.as_mut() {
        status.conditions.clear();
        for state in status.pod_states.values_mut() {
            state.node_topology_labels.clear();
            state.annotations.clear();
            state.pod_ips.clear();
        }
    }
}
