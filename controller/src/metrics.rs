//! Prometheus metrics (`/metrics`, OpenMetrics text). Names start with `ipkeep_controller_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Instant;

/// Every controller loop (the `controller` label).
const LOOPS: [&str; 4] = ["record", "generate", "lifecycle", "admission-plan"];

/// Which controller loop.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoopLabel {
    /// `record` (PersistentPodState), `generate` (StatefulSet), `lifecycle` (pod) or
    /// `admission-plan` (namespace).
    pub controller: &'static str,
}

/// A namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    /// Its name.
    pub namespace: String,
}

/// A failed reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `record`, `generate` or `lifecycle`.
    pub controller: &'static str,
    /// [`crate::Error::kind`].
    pub error: &'static str,
}

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<LoopLabel, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Family<LoopLabel, Histogram>,
    /// Records written (new, moved or refreshed).
    pub records_written: Counter,
    /// Records removed by the retention policy.
    pub records_pruned: Counter,
    /// Pins released to preferred-only by the node-loss policy.
    pub node_loss_fallbacks: Counter,
    /// Pending pods deleted because the pin they were created with fell back.
    pub stranded_pods_deleted: Counter,
    /// Writes of a namespace's admission plan ConfigMap.
    pub admission_plan_writes: Counter,
    /// Per namespace: StatefulSets whose pins did not fit in its admission plan.
    pub admission_plan_omitted: Family<NamespaceLabel, Gauge>,
    /// Records held by all PersistentPodStates in the cache (set at scrape time).
    pub records: Gauge,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
    /// With `--webhook-certificates`: when the webhook's serving certificate expires (Unix
    /// seconds).
    pub webhook_certificate_expiry: Gauge,
    /// With `--webhook-certificates`: when the webhook's CA in use expires (Unix seconds).
    pub webhook_ca_expiry: Gauge,
    /// PersistentPodStates left out of the cache because they do not decode.
    pub undecodable: ipkeep_daemon::lenient::UndecodableMetric,
    /// Connections of the `/healthz`, `/readyz` and `/metrics` listener.
    pub listeners: ipkeep_listener::ListenerMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let registry = ipkeep_daemon::metrics::binary_registry(&mut root, "ipkeep_controller");
        let reconciles = Family::<LoopLabel, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Family::<LoopLabel, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0])
        });
        let m = Self {
            registry: Registry::default(),
            reconciles,
            errors,
            duration,
            records_written: Counter::default(),
            records_pruned: Counter::default(),
            node_loss_fallbacks: Counter::default(),
            stranded_pods_deleted: Counter::default(),
            admission_plan_writes: Counter::default(),
            admission_plan_omitted: Family::default(),
            records: Gauge::default(),
            leader: Gauge::default(),
            webhook_certificate_expiry: Gauge::default(),
            webhook_ca_expiry: Gauge::default(),
            undecodable: Default::default(),
            listeners: Default::default(),
        };
        m.undecodable.register(registry, &["PersistentPodState"]);
        registry.register("reconciles", "Reconciles run", m.reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            m.errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            m.duration.clone(),
        );
        registry.register(
            "records_written",
            "Pod records written (new, moved or refreshed)",
            m.records_written.clone(),
        );
        registry.register(
            "records_pruned",
            "Pod records removed by the retention policy",
            m.records_pruned.clone(),
        );
        registry.register(
            "node_loss_fallbacks",
            "Pins released to preferred-only because their node was lost",
            m.node_loss_fallbacks.clone(),
        );
        registry.register(
            "stranded_pods_deleted",
            "Pending pods deleted because the pin they were created with fell back to preferred terms",
            m.stranded_pods_deleted.clone(),
        );
        registry.register(
            "admission_plan_writes",
            "Writes of a namespace's admission plan (the ConfigMap ipkeep-admission-plan)",
            m.admission_plan_writes.clone(),
        );
        registry.register(
            "admission_plan_omitted_statefulsets",
            "StatefulSets whose pins do not fit in their namespace's admission plan (their pods are pinned by the webhook or the scheduler extender)",
            m.admission_plan_omitted.clone(),
        );
        registry.register(
            "records",
            "Pod records held by all PersistentPodStates",
            m.records.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica is the leader",
            m.leader.clone(),
        );
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "With --webhook-certificates: when the webhook's serving certificate expires",
            m.webhook_certificate_expiry.clone(),
        );
        registry.register(
            "webhook_ca_expiry_timestamp_seconds",
            "With --webhook-certificates: when the webhook's CA in use expires",
            m.webhook_ca_expiry.clone(),
        );
        m.listeners.register(registry);
        // prometheus-client writes a family only once it has a series, and alerts and
        // dashboards must find every family from the start: every loop's series at zero.
        for controller in LOOPS {
            drop(m.reconciles.get_or_create(&LoopLabel { controller }));
            drop(m.duration.get_or_create(&LoopLabel { controller }));
            for error in crate::Error::KINDS {
                drop(m.errors.get_or_create(&ErrorLabels { controller, error }));
            }
        }
        Self {
            registry: root,
            ..m
        }
    }
}

impl Metrics {
    /// Counts a reconcile and times it until the guard drops.
    pub fn reconcile(&self, controller: &'static str) -> ReconcileTimer<'_> {
        self.reconciles
            .get_or_create(&LoopLabel { controller })
            .inc();
        ReconcileTimer {
            histogram: self
                .duration
                .get_or_create(&LoopLabel { controller })
                .clone(),
            start: Instant::now(),
            _metrics: self,
        }
    }

    /// Counts a failed reconcile.
    pub fn error(&self, controller: &'static str, error: &crate::Error) {
        self.errors
            .get_or_create(&ErrorLabels {
                controller,
                error: error.kind(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Observes the reconcile duration when dropped.
#[derive(Debug)]
pub struct ReconcileTimer<'a> {
    histogram: Histogram,
    start: Instant,
    _metrics: &'a Metrics,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}
