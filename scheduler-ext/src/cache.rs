//! What the decisions read, kept in kube-rs reflector caches: every PersistentPodState (without
//! `managedFields`) and every node's name and labels. Requests never call the API server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use ipkeep_api::PersistentPodState;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// The caches.
#[derive(Clone, Debug)]
pub struct Caches {
    pps: Store<PersistentPodState>,
    nodes: Store<Node>,
    synced: Arc<AtomicBool>,
}

/// The writing halves, for [`Caches::watch`] or for tests that fill the caches by hand.
#[allow(missing_debug_implementations)] // reflector writers are not Debug
pub struct Writers {
    /// PersistentPodStates.
    pub pps: Writer<PersistentPodState>,
    /// Nodes.
    pub nodes: Writer<Node>,
}

impl Caches {
    /// Empty caches and their writers.
    pub fn new() -> (Self, Writers) {
        let (pps, pps_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        (
            Self {
                pps,
                nodes,
                synced: Arc::default(),
            },
            Writers {
                pps: pps_writer,
                nodes: nodes_writer,
            },
        )
    }

    /// Both caches have been filled once (and [`Self::wait_until_ready`] noticed).
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Waits until both caches have been filled once, then makes [`Self::ready`] true.
    pub async fn wait_until_ready(&self) {
        // Only fails when a writer is dropped, which only happens at shutdown.
        let pps = self.pps.wait_until_ready().await;
        let nodes = self.nodes.wait_until_ready().await;
        if pps.is_ok() && nodes.is_ok() {
            self.synced.store(true, Ordering::Release);
        }
    }

    /// The PersistentPodState of StatefulSet `statefulset` in `namespace`: the one named after
    /// it (what auto-generation creates), else the first by name that targets it.
    pub fn pps_for(&self, namespace: &str, statefulset: &str) -> Option<Arc<PersistentPodState>> {
        let targets = |p: &PersistentPodState| {
            p.spec.target_ref.name == statefulset && p.spec.target_ref.kind == "StatefulSet"
        };
        if let Some(p) = self
            .pps
            .get(&ObjectRef::new(statefulset).within(namespace))
            .filter(|p| targets(p))
        {
            return Some(p);
        }
        self.pps
            .state()
            .into_iter()
            .filter(|p| p.namespace().as_deref() == Some(namespace) && targets(p))
            .min_by(|a, b| a.name_any().cmp(&b.name_any()))
    }

    /// A node's labels, if the node is known.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }
}

/// A node's labels (empty when it has none).
pub fn labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

/// Keeps both caches in step with the API server until the process ends. Watch errors are
/// retried with backoff (and logged); the caches keep serving what they have meanwhile.
pub async fn watch(client: Client, writers: Writers) {
    let pps = watcher(
        Api::<PersistentPodState>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|p| p.managed_fields_mut().clear())
    .reflect(writers.pps);
    let nodes = watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
        .modify(trim_node)
        .reflect(writers.nodes);
    let pps = pps.for_each(|event| async move {
        if let Err(e) = event {
            tracing::warn!(error = %e, "PersistentPodState watch failed; retrying");
        }
    });
    let nodes = nodes.for_each(|event| async move {
        if let Err(e) = event {
            tracing::warn!(error = %e, "node watch failed; retrying");
        }
    });
    futures::join!(pps, nodes);
}

/// Keeps a node's name and labels only: all a decision reads, and a fraction of the memory.
fn trim_node(node: &mut Node) {
    node.spec = None;
    node.status = None;
    node.metadata.annotations = None;
    node.metadata.managed_fields = None;
    node.metadata.owner_references = None;
}
