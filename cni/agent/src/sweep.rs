//! The agent's periodic pass over every open store: free expired holdings, apply what
//! Kubernetes says (see [`crate::release`]), and refresh the per-network gauges. Runs on a
//! timer and soon after any change in the caches.
//!
//! A pass reads each store from a snapshot, without its lock, so requests never wait for it
//! however many leases there are; only the releases it decides take the lock, and each is
//! re-checked there against the store as it is then. One pass frees at most
//! `max_releases` addresses on Kubernetes' word (the rest wait for later passes): a
//! misconfiguration that makes every pod look gone cannot empty a node at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipkeep_cni::admin::Usage;
use ipkeep_cni::files::netns_exists;
use ipkeep_cni::stores::fallback_count;
use ipkeep_ipam::clock;
use ipkeep_ipam::disk::system_reading;
use ipkeep_ipam::{Lease, Reading, StoreError, StoreRead, allocator};
use tracing::{info, warn};

use crate::cluster::Cluster;
use crate::metrics::{Metrics, NetworkGauges};
use crate::release::{self, ClusterView, Grace, Planner, Reason};
use crate::stores::{AgentStores, Slot};

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
    /// The most addresses one pass frees or re-holds on Kubernetes' word.
    pub max_releases: usize,
}

/// What one pass did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Freed or re-held addresses by reason.
    pub by_reason: BTreeMap<Reason, usize>,
    /// Decisions left for later passes by the per-pass bound.
    pub deferred: usize,
}

impl Sweeper {
    /// One pass over every store (blocking).
    pub fn pass(&self) -> PassReport {
        let reading = system_reading();
        let view = self.cluster.as_ref().and_then(Cluster::view);
        if let Some(cluster) = &self.cluster {
            self.metrics.kubernetes_synced(cluster.synced());
        }
        let mut report = PassReport::default();
        let mut gauges = Vec::new();
        let mut budget = self.max_releases;
        for slot in self.stores.slots() {
            match self.pass_one(&slot, view.as_ref(), &reading, &mut budget, &mut report) {
                Ok(g) => gauges.push(g),
                Err(e) => warn!(network = %slot.network(), error = %e, "sweep failed; will retry"),
            }
        }
        for (reason, n) in &report.by_reason {
            self.metrics.released(*reason, *n);
        }
        if report.deferred > 0 {
            warn!(
                deferred = report.deferred,
                max = self.max_releases,
                "more addresses to release than one pass may free (--max-releases-per-pass); the rest follow in later passes"
            );
        }
        self.metrics.networks(&gauges);
        report
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.lock_timeout
    }

    /// Runs `f` on the slot's store under its lock.
    fn locked<R>(
        &self,
        slot: &Slot,
        f: impl FnOnce(&mut ipkeep_ipam::DiskStore) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let (waited, result) = slot.with(self.deadline(), self.lock_timeout, f);
        self.metrics.lock_wait(waited.as_secs_f64());
        result?
    }

    fn pass_one(
        &self,
        slot: &Slot,
        view: Option<&ClusterView>,
        reading: &Reading,
        budget: &mut usize,
        report: &mut PassReport,
    ) -> Result<NetworkGauges, StoreError> {
        let network = slot.network();
        let count = |report: &mut PassReport, reason: Reason, n: usize| {
            if n > 0 {
                *report.by_reason.entry(reason).or_default() += n;
            }
        };
        // Expiry reads one index range: cheap enough to do under the lock.
        for lease in self.locked(slot, |store| allocator::release_expired(store, reading))? {
            info!(%network, ip = %lease.ip, pod = %pod_of(&lease), "released an expired holding");
            count(report, Reason::Expired, 1);
        }
        let snapshot = slot.snapshot(self.deadline(), self.lock_timeout)?;
        let now = clock::advance(snapshot.clock()?.as_ref(), reading).now;
        slot.note_clock(clock::wall_ahead(now, reading));
        let empty = ClusterView::default();
        let mut planner = Planner::new(view.unwrap_or(&empty), now, self.grace, &netns_exists);
        let mut gauges = GaugeCounter::new(&snapshot, view.unwrap_or(&empty))?;
        snapshot.scan(&mut |lease| {
            if view.is_some() {
                planner.consider(&lease);
            }
            gauges.add(&lease);
            Ok(())
        })?;
        drop(snapshot);
        let mut plan = planner.plan;
        report.deferred += plan.limit(budget);
        if !plan.release.is_empty() {
            let leases: Vec<Lease> = plan.release.iter().map(|(l, _)| l.clone()).collect();
            let freed = self.locked(slot, |store| {
                allocator::release_held(store, &leases, reading)
            })?;
            for (lease, reason) in &plan.release {
                if freed.contains(lease) {
                    info!(%network, ip = %lease.ip, pod = %pod_of(lease), %reason, "released a holding Kubernetes says nobody will use");
                    count(report, *reason, 1);
                }
            }
        }
        for owner in &plan.missed_del {
            let outcome = self.locked(slot, |store| {
                // Re-checked under the lock: only addresses the attachment still has, and not
                // if its sandbox came back meanwhile.
                let live = store
                    .leases_of_attachment(owner)?
                    .into_iter()
                    .any(|l| l.is_active() && l.netns.as_deref().is_some_and(netns_exists));
                if live {
                    return Ok(allocator::ReleaseOutcome::default());
                }
                allocator::del(store, owner, None, reading)
            })?;
            for lease in outcome.held.iter().chain(&outcome.released) {
                info!(%network, ip = %lease.ip, pod = %pod_of(lease), container = %owner, held = !lease.is_active(), "the pod is gone but its DEL never came; applied DEL");
            }
            count(
                report,
                Reason::MissedDel,
                outcome.held.len() + outcome.released.len(),
            );
        }
        Ok(gauges.finish(slot))
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

fn pod_of(lease: &Lease) -> String {
    lease
        .pod
        .as_ref()
        .map_or_else(|| "-".to_string(), ToString::to_string)
}

/// The per-network gauges, counted lease by lease.
struct GaugeCounter<'v> {
    view: &'v ClusterView,
    held: BTreeMap<(String, String), i64>,
    active: i64,
    usage: Usage,
}

impl<'v> GaugeCounter<'v> {
    fn new(store: &dyn StoreRead, view: &'v ClusterView) -> Result<Self, StoreError> {
        Ok(GaugeCounter {
            view,
            held: BTreeMap::new(),
            active: 0,
            usage: Usage::of(store).unwrap_or_default(),
        })
    }

    fn add(&mut self, lease: &Lease) {
        self.usage.add(lease);
        if lease.is_active() {
            self.active += 1;
        } else {
            let namespace = lease
                .pod
                .as_ref()
                .map(|p| p.namespace.clone())
                .unwrap_or_default();
            *self
                .held
                .entry((namespace, release::workload(lease, self.view)))
                .or_default() += 1;
        }
    }

    fn finish(self, slot: &Slot) -> NetworkGauges {
        NetworkGauges {
            network: slot.network().to_string(),
            active: self.active,
            held: self.held.into_iter().collect(),
            free: self
                .usage
                .report()
                .into_iter()
                .map(|u| (u.ranges, i64::try_from(u.free).unwrap_or(i64::MAX)))
                .collect(),
            fallbacks: i64::try_from(fallback_count(slot.dir())).unwrap_or(i64::MAX),
            healthy: slot.health().is_ok(),
        }
    }
}
