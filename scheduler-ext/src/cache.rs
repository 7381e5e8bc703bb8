//! What the decisions read, kept in kube-rs reflector caches: every PersistentPodState (the
//! fields the decisions read, [`crate::lean_pps`]), every node's name, labels and Ready
//! condition, and the pods that have lifecycle hooks (those labelled `ipkeep.dev/lifecycle-state`;
//! an eviction names its pod without carrying it). Requests never call the API server.
//!
//! PersistentPodStates are listed in small pages and decoded one by one
//! (`ipkeep_daemon::lenient`): one that does not decode is left out of the cache, counted and
//! logged, and the caches still sync. The pods of its StatefulSet are then treated as having
//! no PersistentPodState (not pinned, no preDelete hook), as when the extension is down: the
//! webhooks fail open for them, and the controller puts a Warning Event on the object.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use ipkeep_api::PersistentPodState;
use ipkeep_api::statefulset::Workload;
use ipkeep_daemon::lenient::{self, Lenient, Undecodables};
use ipkeep_placement::ipkeep_lifecycle::Lifecycle;
use ipkeep_values::keys::STATE_LABEL;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;

use crate::lean_pps::LeanPps;

/// The caches.
#[derive(Clone, Debug)]
pub struct Caches {
    pps: Store<PersistentPodState>,
    /// The PersistentPodStates that do not decode (left out of `pps`).
    undecodable: Undecodables,
    nodes: Store<Node>,
    pods: Store<Pod>,
    synced: Arc<AtomicBool>,
}

/// The writing halves, for [`Caches::watch`] or for tests that fill the caches by hand.
#[allow(missing_debug_implementations)] // reflector writers are not Debug
pub struct Writers {
    /// PersistentPodStates.
    pub pps: Writer<PersistentPodState>,
    /// Where the PersistentPodState watch keeps those that do not decode.
    pub undecodable: Undecodables,
    /// Nodes.
    pub nodes: Writer<Node>,
    /// Pods with lifecycle hooks.
    pub pods: Writer<Pod>,
}

impl Caches {
    /// Empty caches and their writers; `undecodable` counts the PersistentPodStates left out.
    pub fn new(undecodable: Gauge) -> (Self, Writers) {
        let (pps, pps_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        let (pods, pods_writer) = reflector::store();
        let undecodable = Undecodables::new("PersistentPodState", undecodable);
        (
            Self {
                pps,
                undecodable: undecodable.clone(),
                nodes,
                pods,
                synced: Arc::default(),
            },
            Writers {
                pps: pps_writer,
                undecodable,
                nodes: nodes_writer,
                pods: pods_writer,
            },
        )
    }

    /// Every cache has been filled once (and [`Self::wait_until_ready`] noticed).
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Waits until every cache has been filled once, then makes [`Self::ready`] true.
    pub async fn wait_until_ready(&self) {
        // Only fails when a writer is dropped, which only happens at shutdown.
        let pps = self.pps.wait_until_ready().await;
        let nodes = self.nodes.wait_until_ready().await;
        let pods = self.pods.wait_until_ready().await;
        if pps.is_ok() && nodes.is_ok() && pods.is_ok() {
            self.synced.store(true, Ordering::Release);
        }
    }

    /// Whether PersistentPodState `namespace`/`name` exists but does not decode.
    pub fn undecodable(&self, namespace: &str, name: &str) -> bool {
        self.undecodable.contains(namespace, name)
    }

    /// The PersistentPodState of the `workload` StatefulSet `statefulset` in `namespace`: the
    /// one named after it (what auto-generation creates), else the first by name that targets
    /// it. None when the one named after it does not decode: what it targets is unknown, so no
    /// other is taken for it.
    pub fn pps_for(
        &self,
        namespace: &str,
        workload: Workload,
        statefulset: &str,
    ) -> Option<Arc<PersistentPodState>> {
        if self.undecodable(namespace, statefulset) {
            return None;
        }
        let targets = |p: &PersistentPodState| p.spec.target_ref.targets(workload, statefulset);
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

    /// The lifecycle hooks of the `workload` StatefulSet `statefulset`'s PersistentPodState
    /// ([`Self::pps_for`]); `None` without one, or when its spec does not check (hooks then
    /// fail open), or for an Advanced StatefulSet (ipkeep's hooks stand aside for its own).
    pub fn lifecycle_for(
        &self,
        namespace: &str,
        workload: Workload,
        statefulset: &str,
    ) -> Option<Lifecycle> {
        if workload == Workload::Kruise {
            return None;
        }
        self.pps_for(namespace, workload, statefulset)
            .and_then(|p| ipkeep_placement::spec::check(&p.spec).ok())
            .map(|c| c.lifecycle)
    }

    /// A node's labels, if the node is known.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// Whether node `name` is known and its Ready condition is True.
    pub fn node_ready(&self, name: &str) -> bool {
        self.node(name).is_some_and(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    }

    /// A pod with lifecycle hooks, if it is known.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
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
    let pps = lenient::sorted(
        watcher(
            Api::<Lenient<PersistentPodState, LeanPps>>::all(client.clone()),
            watcher::Config::default().page_size(lenient::PAGE_SIZE),
        )
        .default_backoff(),
        writers.pps.as_reader(),
        writers.undecodable,
    )
    .reflect(writers.pps);
    let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(trim_node)
        .reflect(writers.nodes);
    let pods = watcher(
        Api::<Pod>::all(client),
        watcher::Config::default().labels(STATE_LABEL),
    )
    .default_backoff()
    .modify(ipkeep_placement::lifecycle::trim_pod)
    .reflect(writers.pods);
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
    let pods = pods.for_each(|event| async move {
        if let Err(e) = event {
            tracing::warn!(error = %e, "pod watch failed; retrying");
        }
    });
    futures::join!(pps, nodes, pods);
}

/// Keeps a node's name, labels and Ready condition only: all a decision reads, and a fraction
/// of the memory.
fn trim_node(node: &mut Node) {
    node.spec = None;
    node.status = node.status.take().map(|s| NodeStatus {
        conditions: s
            .conditions
            .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
        ..NodeStatus::default()
    });
    node.metadata.annotations = None;
    node.metadata.managed_fields = None;
    node.metadata.owner_references = None;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A StatefulSet's PersistentPodState targets an `apps` StatefulSet of its name: one that
    /// targets OpenKruise's Advanced StatefulSet of the name (same kind, same pod names) is not
    /// taken for it.
    #[test]
    fn a_statefulsets_state_targets_an_apps_statefulset() {
        let (caches, mut writers) = Caches::new(Default::default());
        for (name, api_version) in [("db", "apps.kruise.io/v1beta1"), ("web", "apps/v1")] {
            let pps: PersistentPodState = serde_json::from_value(serde_json::json!({
                "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
                "metadata": {"name": name, "namespace": "prod"},
                "spec": {"targetRef": {"apiVersion": api_version, "kind": "StatefulSet", "name": name}}
            }))
            .unwrap();
            writers.pps.apply_watcher_event(&watcher::Event::Apply(pps));
        }
        assert_eq!(
            caches
                .pps_for("prod", Workload::Native, "web")
                .map(|p| p.name_any())
                .as_deref(),
            Some("web")
        );
        assert_eq!(
            caches
                .pps_for("prod", Workload::Native, "db")
                .map(|p| p.name_any()),
            None,
            "a state targeting an Advanced StatefulSet"
        );
    }
}
