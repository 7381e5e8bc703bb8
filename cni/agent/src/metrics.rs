//! Prometheus metrics (`/metrics`, OpenMetrics text). Names start with `ipkeep_agent_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use ipkeep_cni::plugin::Tally;

use crate::release::Reason;

/// One served request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `ADD`, `DEL`, `CHECK`, `GC`, `STATUS`, `VERSION`, `admin`, or `invalid`.
    pub command: &'static str,
    /// `ok` or `error` (the exit code the plugin process would have had).
    pub outcome: &'static str,
}

/// A command.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    /// As in [`RequestLabels`].
    pub command: &'static str,
}

/// A release.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// See [`Reason::as_str`].
    pub reason: &'static str,
}

/// An allocation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AllocationLabel {
    /// `new`, `retained` (a rebuilt pod got its held address back) or `cooling` (a new pod got
    /// an address freed less than `ipam.reuseCooldown` ago, because no other was free).
    pub kind: &'static str,
}

/// A network.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NetworkLabel {
    /// The CNI network name.
    pub network: String,
}

/// Holdings of one workload.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldingLabels {
    /// The CNI network name.
    pub network: String,
    /// Pod namespace.
    pub namespace: String,
    /// The StatefulSet (or the pod name without its ordinal).
    pub statefulset: String,
}

/// One range set of a network.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RangeLabels {
    /// The CNI network name.
    pub network: String,
    /// The range set, as `start-end,…`.
    pub range_set: String,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Family<CommandLabel, Histogram>,
    lock_wait: Histogram,
    allocations: Family<AllocationLabel, Counter>,
    releases: Family<ReasonLabel, Counter>,
    held: Family<HoldingLabels, Gauge>,
    active: Family<NetworkLabel, Gauge>,
    free: Family<RangeLabels, Gauge>,
    fallbacks: Family<NetworkLabel, Gauge>,
    fallback_commands: Family<NetworkLabel, Counter>,
    store_healthy: Family<NetworkLabel, Gauge>,
    wall_clock_doubted: Family<NetworkLabel, Gauge>,
    kubernetes_synced: Gauge,
    /// PersistentPodStates left out of the cache because they do not decode.
    pub undecodable: ipkeep_daemon::lenient::UndecodableMetric,
    /// Connections of the `/healthz`, `/readyz` and `/metrics` listener.
    pub listeners: ipkeep_listener::ListenerMetrics,
}

fn latency_buckets() -> Histogram {
    Histogram::new([
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0,
    ])
}

/// Every value of the `command` label.
const COMMANDS: [&str; 8] = [
    "ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "admin", "invalid",
];

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let registry = ipkeep_daemon::metrics::binary_registry(&mut root, "ipkeep_agent");
        let m = Self {
            registry: Registry::default(),
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_buckets),
            lock_wait: latency_buckets(),
            allocations: Family::default(),
            releases: Family::default(),
            held: Family::default(),
            active: Family::default(),
            free: Family::default(),
            fallbacks: Family::default(),
            fallback_commands: Family::default(),
            store_healthy: Family::default(),
            wall_clock_doubted: Family::default(),
            kubernetes_synced: Gauge::default(),
            undecodable: Default::default(),
            listeners: Default::default(),
        };
        registry.register(
            "requests",
            "Plugin and admin requests served over the socket, by command and outcome",
            m.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's last byte to its answer, by command",
            m.duration.clone(),
        );
        registry.register(
            "store_lock_wait_seconds",
            "Time a request or sweep waited for its network's store (including opening it)",
            m.lock_wait.clone(),
        );
        registry.register(
            "allocations",
            "Addresses given to pods, new or retained (a rebuilt pod got its address back)",
            m.allocations.clone(),
        );
        registry.register(
            "releases",
            "Addresses freed or re-held by the agent, by reason",
            m.releases.clone(),
        );
        registry.register(
            "held_addresses",
            "Addresses held for deleted pods, by network, namespace and StatefulSet (refreshed every sweep)",
            m.held.clone(),
        );
        registry.register(
            "active_addresses",
            "Addresses in use, by network (refreshed every sweep)",
            m.active.clone(),
        );
        registry.register(
            "free_addresses",
            "Free addresses per range set, as last configured (refreshed every sweep)",
            m.free.clone(),
        );
        registry.register(
            "plugin_fallback_commands",
            "Commands the plugin ran itself because the agent did not answer, by network (read from the network directory; it only grows)",
            m.fallback_commands.clone(),
        );
        // The same count under its name of 0.2.0, as a gauge, for the dashboards and alerts
        // of that release; removed in the next.
        registry.register(
            "plugin_fallbacks",
            "Deprecated, removed in the next release: ipkeep_agent_plugin_fallback_commands_total, the same count as a counter",
            m.fallbacks.clone(),
        );
        registry.register(
            "store_healthy",
            "1 while the network's store commits, 0 after a commit failed (a full disk) until one succeeds",
            m.store_healthy.clone(),
        );
        registry.register(
            "wall_clock_doubted",
            "1 while, after a reboot, the network's store doubts a wall clock far past its last time that the kernel does not report synchronised (holdings end only by the time it can prove)",
            m.wall_clock_doubted.clone(),
        );
        registry.register(
            "kubernetes_synced",
            "1 when the pod and PersistentPodState caches are synced, so Kubernetes-aware release runs",
            m.kubernetes_synced.clone(),
        );
        m.undecodable.register(registry, &["PersistentPodState"]);
        m.listeners.register(registry);
        // prometheus-client writes a family only once it has a series, and alerts and
        // dashboards must find every family from the start: the series every agent has, at
        // zero (the per-network ones appear with the first sweep that sees a network).
        for command in COMMANDS {
            for outcome in ["ok", "error"] {
                drop(
                    m.requests
                        .get_or_create(&RequestLabels { command, outcome }),
                );
            }
            drop(m.duration.get_or_create(&CommandLabel { command }));
        }
        for kind in ["new", "cooling", "retained"] {
            drop(m.allocations.get_or_create(&AllocationLabel { kind }));
        }
        for reason in Reason::ALL {
            drop(m.releases.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            }));
        }
        Self {
            registry: root,
            ..m
        }
    }
}

/// One network's state, as the sweep last saw it.
#[derive(Debug, Clone, Default)]
pub struct NetworkGauges {
    /// Network name.
    pub network: String,
    /// Active leases.
    pub active: i64,
    /// Held leases by `(namespace, statefulset)`.
    pub held: Vec<((String, String), i64)>,
    /// Free addresses by range set.
    pub free: Vec<(String, i64)>,
    /// The network's fallback count.
    pub fallbacks: i64,
    /// Whether its store commits.
    pub healthy: bool,
    /// Whether its store doubts the wall clock after a reboot.
    pub clock_doubted: bool,
}

impl Metrics {
    /// Counts a served request.
    pub fn request(&self, command: &'static str, ok: bool, seconds: f64) {
        let outcome = if ok { "ok" } else { "error" };
        self.requests
            .get_or_create(&RequestLabels { command, outcome })
            .inc();
        self.duration
            .get_or_create(&CommandLabel { command })
            .observe(seconds);
    }

    /// Counts what a CNI command changed; its freed addresses count under `released_by`
    /// ([`Reason::Del`] or [`Reason::Gc`]).
    pub fn tally(&self, tally: &Tally, released_by: Reason) {
        let new = tally
            .allocated
            .saturating_sub(tally.retained)
            .saturating_sub(tally.cooling);
        self.allocations
            .get_or_create(&AllocationLabel { kind: "new" })
            .inc_by(new as u64);
        self.allocations
            .get_or_create(&AllocationLabel { kind: "cooling" })
            .inc_by(tally.cooling as u64);
        self.allocations
            .get_or_create(&AllocationLabel { kind: "retained" })
            .inc_by(tally.retained as u64);
        self.released(released_by, tally.released);
        self.released(Reason::Expired, tally.expired);
        self.released(Reason::Reclaimed, tally.reclaimed);
    }

    /// Counts released (or, for [`Reason::MissedDel`], re-held) addresses.
    pub fn released(&self, reason: Reason, n: usize) {
        if n > 0 {
            self.releases
                .get_or_create(&ReasonLabel {
                    reason: reason.as_str(),
                })
                .inc_by(n as u64);
        }
    }

    /// Records a wait for a store.
    pub fn lock_wait(&self, seconds: f64) {
        self.lock_wait.observe(seconds);
    }

    /// Whether the Kubernetes caches are synced.
    pub fn kubernetes_synced(&self, synced: bool) {
        self.kubernetes_synced.set(i64::from(synced));
    }

    /// Replaces the per-network gauges with what the last sweep saw.
    pub fn networks(&self, networks: &[NetworkGauges]) {
        self.held.clear();
        self.active.clear();
        self.free.clear();
        self.fallbacks.clear();
        self.fallback_commands.clear();
        self.store_healthy.clear();
        self.wall_clock_doubted.clear();
        for n in networks {
            let network = NetworkLabel {
                network: n.network.clone(),
            };
            self.active.get_or_create(&network).set(n.active);
            self.fallbacks.get_or_create(&network).set(n.fallbacks);
            // The count lives in the network's directory (the plugin writes it); the counter
            // takes its value rather than adding to it.
            let count = u64::try_from(n.fallbacks).unwrap_or_default();
            (self.fallback_commands.get_or_create(&network).inner())
                .store(count, std::sync::atomic::Ordering::Relaxed);
            self.store_healthy
                .get_or_create(&network)
                .set(i64::from(n.healthy));
            self.wall_clock_doubted
                .get_or_create(&network)
                .set(i64::from(n.clock_doubted));
            for ((namespace, statefulset), count) in &n.held {
                self.held
                    .get_or_create(&HoldingLabels {
                        network: n.network.clone(),
                        namespace: namespace.clone(),
                        statefulset: statefulset.clone(),
                    })
                    .set(*count);
            }
            for (range_set, free) in &n.free {
                self.free
                    .get_or_create(&RangeLabels {
                        network: n.network.clone(),
                        range_set: range_set.clone(),
                    })
                    .set(*free);
            }
        }
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
