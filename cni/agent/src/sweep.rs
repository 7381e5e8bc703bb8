//! The agent's periodic pass over every open store: free expired holdings, apply what
//! Kubernetes says (see [`super::release`]), and refresh the per-network gauges. Runs on a
//! timer and soon after any change in the caches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipkeep_ipam::{Lease, Store, StoreError, allocator};
use tracing::{info, warn};

use crate::cluster::Cluster;
use crate::metrics::{Metrics, NetworkGauges};
use crate::release::{self, ClusterView, Grace, Reason};
use crate::stores::{AgentStores, Slot};
use ipkeep_cni::admin::range_set_usage;
use ipkeep_cni::stores::fallback_count;

/// Everything a pass needs.
#[derive(Debug, Clone)]
pub struct Sweeper {
    /// The stores.
    pub stores: Arc<AgentStores>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The Kubernetes caches (`None` with `--no-kubernetes`).
    pub cluster: Option<Cluster>,
    /// Grace periods.
    pub grace: Grace,
    /// Longest wait for a store held by a plugin.
    pub lock_timeout: Duration,
}

/// What one pass did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Freed or re-held addresses by reason.
    pub by_reason: BTreeMap<Reason, usize>,
}

impl Sweeper {
    /// One pass over every store (blocking).
    pub fn pass(&self) -> PassReport {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let view = self.cluster.as_ref().and_then(Cluster::view);
        if let Some(cluster) = &self.cluster {
            self.metrics.kubernetes_synced(cluster.synced());
        }
        let mut report = PassReport::default();
        let mut gauges = Vec::new();
        for slot in self.stores.slots() {
            let (waited, result) = slot.with(self.lock_timeout, |store| {
                pass_one(&slot, store, view.as_ref(), now, self.grace, &mut report)
            });
            self.metrics.lock_wait(waited.as_secs_f64());
            match result {
                Ok(g) => gauges.push(g),
                Err(e) => warn!(network = %slot.network(), error = %e, "sweep failed; will retry"),
            }
        }
        for (reason, n) in &report.by_reason {
            self.metrics.released(*reason, *n);
        }
        self.metrics.networks(&gauges);
        report
    }

    /// Runs passes every `interval`, and about a second after the caches change, until
    /// `shutdown` completes.
    pub async fn run(self, interval: Duration, shutdown: impl std::future::Future<Output = ()>) {
        let changed = self.cluster.as_ref().map(|c| c.changed.clone());
        tokio::pin!(shutdown);
        loop {
            let this = self.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || this.pass()).await {
                warn!(error = %e, "sweep pass failed");
            }
            let woken = async {
                match &changed {
                    Some(n) => {
                        n.notified().await;
                        // Let a burst of watch events settle into one pass.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(interval) => {}
                () = woken => {}
            }
        }
    }
}

fn pass_one(
    slot: &Slot,
    store: &mut ipkeep_ipam::DiskStore,
    view: Option<&ClusterView>,
    now: u64,
    grace: Grace,
    report: &mut PassReport,
) -> Result<NetworkGauges, StoreError> {
    let network = slot.network();
    let mut count = |reason: Reason, n: usize| {
        if n > 0 {
            *report.by_reason.entry(reason).or_default() += n;
        }
    };
    for lease in allocator::release_expired(store, now)? {
        info!(%network, ip = %lease.ip, pod = %pod_of(&lease), "released an expired holding");
        count(Reason::Expired, 1);
    }
    if let Some(view) = view {
        let plan = release::plan(&store.all()?, view, now, grace);
        let leases: Vec<Lease> = plan.release.iter().map(|(l, _)| l.clone()).collect();
        let freed = allocator::release_held(store, &leases)?;
        for (lease, reason) in &plan.release {
            if freed.contains(lease) {
                info!(%network, ip = %lease.ip, pod = %pod_of(lease), %reason, "released a holding Kubernetes says nobody will use");
                count(*reason, 1);
            }
        }
        for owner in &plan.missed_del {
            let outcome = allocator::del(store, owner, None, now)?;
            for lease in outcome.held.iter().chain(&outcome.released) {
                info!(%network, ip = %lease.ip, pod = %pod_of(lease), container = %owner, held = lease.pod.is_some() && !lease.is_active(), "the pod is gone but its DEL never came; applied DEL");
            }
            count(
                Reason::MissedDel,
                outcome.held.len() + outcome.released.len(),
            );
        }
    }
    let leases = store.all()?;
    Ok(gauges(slot, store, view, &leases))
}

fn pod_of(lease: &Lease) -> String {
    lease
        .pod
        .as_ref()
        .map_or_else(|| "-".to_string(), ToString::to_string)
}

fn gauges(
    slot: &Slot,
    store: &ipkeep_ipam::DiskStore,
    view: Option<&ClusterView>,
    leases: &[Lease],
) -> NetworkGauges {
    let empty = ClusterView::default();
    let view = view.unwrap_or(&empty);
    let mut held: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut active = 0;
    for lease in leases {
        if lease.is_active() {
            active += 1;
        } else {
            let namespace = lease
                .pod
                .as_ref()
                .map(|p| p.namespace.clone())
                .unwrap_or_default();
            *held
                .entry((namespace, release::workload(lease, view)))
                .or_default() += 1;
        }
    }
    let free = range_set_usage(store, leases)
        .map(|sets| {
            sets.into_iter()
                .map(|u| (u.ranges, i64::try_from(u.free).unwrap_or(i64::MAX)))
                .collect()
        })
        .unwrap_or_default();
    NetworkGauges {
        network: slot.network().to_string(),
        active,
        held: held.into_iter().collect(),
        free,
        fallbacks: i64::try_from(fallback_count(slot.dir())).unwrap_or(i64::MAX),
    }
}
