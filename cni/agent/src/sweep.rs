//! The agent's periodic pass over every open store: free expired holdings, apply what
//! Kubernetes says (see [`crate::release`]), and refresh the per-network gauges. Runs on a
//! timer and soon after any change in the caches.
//!
//! Every pass frees expired holdings (one index range, under the store's lock). Reading every
//! lease, for Kubernetes-aware decisions and the gauges, is done only when there is a reason:
//! with Kubernetes, the caches or the store changed, or a grace period the last reading noted
//! ran out; without, the store changed and the gauges are older than [`GAUGE_REFRESH`]. That reading is a snapshot, read without
//! the lock, so requests never wait for it however many leases there are; only the releases it
//! decides take the lock, and each is re-checked there against the store as it is then. On a
//! store of 60,000 leases a reading is a few hundred milliseconds of disk and CPU, which is why
//! it is not done every pass. One pass frees at most `max_releases` addresses on Kubernetes'
//! word (the rest wait for later passes): a misconfiguration that makes every pod look gone
//! cannot empty a node at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ipkeep_cni::admin::Usage;
use ipkeep_cni::stores::fallback_count;
use ipkeep_ipam::clock;
use ipkeep_ipam::disk::system_reading;
use ipkeep_ipam::{Lease, Reading, StoreError, StoreRead, allocator};
use tracing::{info, warn};

use crate::cluster::Cluster;
use crate::management::ClusterApi;
use crate::metrics::{Metrics, NetworkGauges};
use crate::netns::NetnsView;
use crate::release::{self, ClusterView, Grace, MissedDel, Plan, Planner, Reason};
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
    /// What the last full reading of each network found, by network name.
    pub readings: Arc<Mutex<BTreeMap<String, LastReading>>>,
    /// Which sandboxes' network namespaces the agent can vouch for: a missed DEL is applied
    /// only to a sandbox it saw go.
    pub netns: Arc<NetnsView>,
}

/// A full reading pauses [`PACE_PAUSE`] after every this many leases.
const PACE_EVERY: usize = 500;
/// See [`PACE_EVERY`].
const PACE_PAUSE: Duration = Duration::from_millis(1);

/// How stale the gauges may get while the store changes.
pub const GAUGE_REFRESH: Duration = Duration::from_secs(60);

/// What the last full reading of one store found.
#[derive(Debug, Clone)]
pub struct LastReading {
    /// When it was taken.
    pub at: Instant,
    /// The caches' generation it decided from (`None` without Kubernetes).
    pub cluster: Option<u64>,
    /// The store's generation it read.
    pub store: u64,
    /// The store-clock time at which one of its leases may call for a new decision.
    pub due: Option<u64>,
    /// The gauges it counted.
    pub gauges: NetworkGauges,
}

/// Whether a pass must read every lease of a store again (see the module comment).
pub fn needs_reading(
    last: Option<&LastReading>,
    cluster: Option<u64>,
    store: u64,
    now: u64,
    at: Instant,
) -> bool {
    let Some(last) = last else {
        return true;
    };
    let changed = last.store != store;
    cluster.is_some() && (last.cluster != cluster || changed)
        || last.due.is_some_and(|due| now >= due)
        || changed && at.saturating_duration_since(last.at) >= GAUGE_REFRESH
}

/// What one pass did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Freed or re-held addresses by reason.
    pub by_reason: BTreeMap<Reason, usize>,
    /// Decisions left for later passes by the per-pass bound.
    pub deferred: usize,
}

impl PassReport {
    fn count(&mut self, reason: Reason, n: usize) {
        if n > 0 {
            *self.by_reason.entry(reason).or_default() += n;
        }
    }
}

/// What [`Sweeper::read_or_reuse`] found.
enum Read<'v> {
    /// Nothing calls for a new reading: the last one's gauges.
    Reused(NetworkGauges),
    /// A new reading.
    Fresh(Fresh<'v>),
}

/// A new reading of one store: what to do, and what to remember of it.
struct Fresh<'v> {
    plan: Plan,
    /// The gauges, counted; finished once the plan is applied.
    gauges: GaugeCounter<'v>,
    /// The store's clock when it was read.
    now: u64,
    /// What the next pass sees of it (the gauges come once finished).
    last: LastReading,
}

/// The view without Kubernetes: nothing is decided from it.
static NO_VIEW: ClusterView = ClusterView {
    node: String::new(),
    pps: BTreeMap::new(),
    undecodable: BTreeSet::new(),
    pods: BTreeMap::new(),
};

impl Sweeper {
    /// One pass over every store (blocking).
    pub fn pass(&self) -> PassReport {
        let reading = system_reading();
        // The generation before the view: a change in between makes the next pass read again.
        let generation = self
            .cluster
            .as_ref()
            .filter(|c| c.synced())
            .map(Cluster::generation);
        let view = self.cluster.as_ref().and_then(Cluster::view);
        if let Some(cluster) = &self.cluster {
            self.metrics.kubernetes_synced(cluster.synced());
        }
        let mut report = PassReport::default();
        let mut gauges = Vec::new();
        let mut budget = self.max_releases;
        for slot in self.stores.slots() {
            let kubernetes = view.as_ref().zip(generation);
            match self.pass_one(&slot, kubernetes, &reading, &mut budget, &mut report) {
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
                hint = "the rest follow in later passes",
                "more addresses to release than one pass may free (--max-releases-per-pass)"
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

    /// One store's part of a pass: expire, read (or reuse the last reading), release what
    /// Kubernetes says nobody will use, apply the DELs that never came.
    fn pass_one(
        &self,
        slot: &Slot,
        kubernetes: Option<(&ClusterView, u64)>,
        reading: &Reading,
        budget: &mut usize,
        report: &mut PassReport,
    ) -> Result<NetworkGauges, StoreError> {
        self.expire(slot, reading, report)?;
        let fresh = match self.read_or_reuse(slot, kubernetes, reading)? {
            Read::Reused(gauges) => return Ok(gauges),
            Read::Fresh(fresh) => fresh,
        };
        let Fresh {
            mut plan,
            gauges,
            now,
            last,
        } = fresh;
        let deferred = plan.limit(budget);
        report.deferred += deferred;
        self.apply_release(slot, &plan.release, reading, report)?;
        self.apply_missed_dels(slot, &plan.missed_del, reading, report)?;
        let gauges = gauges.finish(slot);
        let acted = deferred > 0 || !plan.release.is_empty() || !plan.missed_del.is_empty();
        self.readings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                slot.network().to_string(),
                LastReading {
                    // Whatever was decided (or deferred) is looked at again next pass.
                    due: if acted { Some(now) } else { last.due },
                    gauges: gauges.clone(),
                    ..last
                },
            );
        Ok(gauges)
    }

    /// Frees the store's expired holdings: one index range, cheap enough under the lock.
    fn expire(
        &self,
        slot: &Slot,
        reading: &Reading,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        let network = slot.network();
        for lease in self.locked(slot, |store| allocator::release_expired(store, reading))? {
            info!(%network, ip = %lease.ip, pod = %pod_of(&lease), "released an expired holding");
            report.count(Reason::Expired, 1);
        }
        Ok(())
    }

    /// Reads every lease of a snapshot into a plan and the gauges, when there is a reason to
    /// ([`needs_reading`]); else the gauges of the last reading.
    fn read_or_reuse<'v>(
        &self,
        slot: &Slot,
        kubernetes: Option<(&'v ClusterView, u64)>,
        reading: &Reading,
    ) -> Result<Read<'v>, StoreError> {
        let view = kubernetes.map(|(v, _)| v);
        let store_generation = slot.generation();
        let snapshot = slot.snapshot(self.deadline(), self.lock_timeout)?;
        let mark = snapshot.clock()?;
        let now = clock::advance(mark.as_ref(), reading).now;
        slot.note_clock(
            clock::wall_ahead(now, reading),
            clock::doubted_wall(mark.as_ref(), reading),
        );
        let readings = self.readings.lock().unwrap_or_else(PoisonError::into_inner);
        let last = readings.get(slot.network());
        let at = Instant::now();
        let cluster_generation = kubernetes.map(|(_, g)| g);
        if !needs_reading(last, cluster_generation, store_generation, now, at) {
            return Ok(Read::Reused(
                last.map(|l| slot.refresh(l.gauges.clone()))
                    .unwrap_or_default(),
            ));
        }
        drop(readings);
        let api = ClusterApi(self.cluster.as_ref());
        let may_exist = |path: &str| self.netns.may_exist(path);
        let view_or_none = view.unwrap_or(&NO_VIEW);
        let mut planner = Planner::new(view_or_none, &api, now, self.grace, &may_exist);
        let mut gauges = GaugeCounter::new(&snapshot, view_or_none)?;
        let mut read = 0usize;
        snapshot.scan(&mut |lease| {
            if view.is_some() {
                planner.consider(&lease);
            }
            gauges.add(&lease);
            // Paced: a reading of a large store is a background task, and must not take the
            // disk and a core from the requests for its whole length.
            read += 1;
            if read.is_multiple_of(PACE_EVERY) {
                std::thread::sleep(PACE_PAUSE);
            }
            Ok(())
        })?;
        let (plan, due) = planner.finish(&snapshot)?;
        Ok(Read::Fresh(Fresh {
            plan,
            gauges,
            now,
            last: LastReading {
                at,
                cluster: cluster_generation,
                store: store_generation,
                due,
                gauges: NetworkGauges::default(),
            },
        }))
    }

    /// Frees the holdings the plan releases; each is re-checked under the lock against the
    /// store as it is then.
    fn apply_release(
        &self,
        slot: &Slot,
        release: &[(Lease, Reason)],
        reading: &Reading,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        if release.is_empty() {
            return Ok(());
        }
        let network = slot.network();
        let leases: Vec<Lease> = release.iter().map(|(l, _)| l.clone()).collect();
        let freed = self.locked(slot, |store| {
            allocator::release_held(store, &leases, reading)
        })?;
        for (lease, reason) in release {
            if freed.contains(lease) {
                info!(%network, ip = %lease.ip, pod = %pod_of(lease), %reason, "released a holding Kubernetes says nobody will use");
                report.count(*reason, 1);
            }
        }
        Ok(())
    }

    /// Applies the DELs that never came, each to the addresses its attachment still has under
    /// the lock, unless its sandbox came back meanwhile.
    fn apply_missed_dels(
        &self,
        slot: &Slot,
        missed: &[MissedDel],
        reading: &Reading,
        report: &mut PassReport,
    ) -> Result<(), StoreError> {
        let network = slot.network();
        for MissedDel { owner, departure } in missed {
            let outcome = self.locked(slot, |store| {
                let live = store.leases_of_attachment(owner)?.iter().any(|l| {
                    l.is_active() && l.netns.as_deref().is_some_and(|n| self.netns.may_exist(n))
                });
                if live {
                    return Ok(allocator::ReleaseOutcome::default());
                }
                allocator::del(store, owner, departure, reading)
            })?;
            for lease in outcome.held.iter().chain(&outcome.released) {
                info!(%network, ip = %lease.ip, pod = %pod_of(lease), container = %owner, held = !lease.is_active(), hint = "its pod left the node, or a newer sandbox replaced it after the runtime's state was wiped", "the sandbox is gone but its DEL never came: applied DEL");
            }
            report.count(
                Reason::MissedDel,
                outcome.held.len() + outcome.released.len(),
            );
        }
        Ok(())
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
        slot.refresh(NetworkGauges {
            network: slot.network().to_string(),
            active: self.active,
            held: self.held.into_iter().collect(),
            free: self
                .usage
                .report()
                .into_iter()
                .map(|u| (u.ranges, i64::try_from(u.free).unwrap_or(i64::MAX)))
                .collect(),
            fallbacks: 0,
            healthy: true,
            clock_doubted: false,
        })
    }
}

impl Slot {
    /// `gauges` with what is read cheaply every pass: the fallback count, the store's health and
    /// whether it doubts the wall clock.
    fn refresh(&self, gauges: NetworkGauges) -> NetworkGauges {
        NetworkGauges {
            fallbacks: i64::try_from(fallback_count(self.dir())).unwrap_or(i64::MAX),
            healthy: self.health().is_ok(),
            clock_doubted: self.clock_doubted(),
            ..gauges
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(at: Instant, cluster: Option<u64>, store: u64, due: Option<u64>) -> LastReading {
        LastReading {
            at,
            cluster,
            store,
            due,
            gauges: NetworkGauges::default(),
        }
    }

    #[test]
    fn a_store_is_read_again_only_when_there_is_a_reason() {
        let t0 = Instant::now();
        let later = t0 + GAUGE_REFRESH;
        assert!(needs_reading(None, None, 0, 100, t0), "never read");
        let l = last(t0, Some(7), 3, Some(150));
        assert!(
            !needs_reading(Some(&l), Some(7), 3, 100, later),
            "nothing new"
        );
        assert!(
            needs_reading(Some(&l), Some(8), 3, 100, t0),
            "the caches changed"
        );
        assert!(
            needs_reading(Some(&l), Some(7), 3, 150, t0),
            "a grace period ran out"
        );
        assert!(
            needs_reading(Some(&l), Some(7), 4, 100, t0),
            "the store changed"
        );
        let without_kubernetes = last(t0, None, 3, None);
        assert!(!needs_reading(
            Some(&without_kubernetes),
            None,
            3,
            10_000,
            later
        ));
        assert!(
            !needs_reading(Some(&without_kubernetes), None, 4, 100, t0),
            "gauges still fresh"
        );
        assert!(
            needs_reading(Some(&without_kubernetes), None, 4, 100, later),
            "stale gauges of a changed store"
        );
    }
}
