//! Prometheus metrics (`/metrics`, OpenMetrics text). Names start with `ipkeep_scheduler_ext_`.

use ipkeep_listener::ListenerMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// One request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `mutate-pods`, `validate-pods`, `filter` or `prioritize`.
    pub endpoint: &'static str,
    /// What came of it: `pinned`, `unrecorded`, `skipped`, `passed`, `held`, `escaped`,
    /// `allowed`, `invalid`, `not-ready`, `busy`.
    pub outcome: &'static str,
}

/// An endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// `mutate-pods`, `validate-pods`, `filter` or `prioritize`.
    pub endpoint: &'static str,
}

/// Why a pin was not applied.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    /// `mutate-pods` or `filter`.
    pub endpoint: &'static str,
    /// `conflict` or `invalid-spec`.
    pub reason: &'static str,
}

/// A certificate reload.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabel {
    /// `certificate` (the serving certificate and key) or `client-ca` (`--client-ca`).
    pub file: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Every endpoint, and the outcomes any of them can have (an error's).
const ENDPOINTS: [&str; 5] = [
    "mutate-pods",
    "mutate-persistentpodstates",
    "validate-pods",
    "filter",
    "prioritize",
];
const ERROR_OUTCOMES: [&str; 3] = ["invalid", "not-ready", "busy"];

/// Every metric the scheduler extension exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Family<EndpointLabel, Histogram>,
    pins_applied: Family<EndpointLabel, Counter>,
    pins_skipped: Family<SkipLabels, Counter>,
    pins_missed_at_admission: Counter,
    cert_reloads: Family<ReloadLabel, Counter>,
    cert_expiry: Gauge,
    in_flight: Gauge,
    /// PersistentPodStates left out of the cache because they do not decode.
    pub undecodable: ipkeep_daemon::lenient::UndecodableMetric,
    /// Connections of the webhook and probe listeners.
    pub listeners: ListenerMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let registry = ipkeep_daemon::metrics::binary_registry(&mut root, "ipkeep_scheduler_ext");
        let m = Self {
            registry: Registry::default(),
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new([
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
                ])
            }),
            pins_applied: Family::default(),
            pins_skipped: Family::default(),
            pins_missed_at_admission: Counter::default(),
            cert_reloads: Family::default(),
            cert_expiry: Gauge::default(),
            in_flight: Gauge::default(),
            undecodable: Default::default(),
            listeners: ListenerMetrics::default(),
        };
        registry.register(
            "requests",
            "Requests served, by endpoint and outcome",
            m.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's last body byte to its response, by endpoint",
            m.duration.clone(),
        );
        registry.register(
            "pins_applied",
            "Pods pinned to their record (webhook: affinity written; filter: nodes filtered)",
            m.pins_applied.clone(),
        );
        registry.register(
            "pins_missed_at_admission",
            "Pods the extender pinned that admission had not (no ipkeep.dev/pinned-by): neither the webhook nor the admission policy pinned them",
            m.pins_missed_at_admission.clone(),
        );
        registry.register(
            "pins_skipped",
            "Recorded pins not applied, by reason",
            m.pins_skipped.clone(),
        );
        registry.register(
            "certificate_reloads",
            "TLS certificate (or --client-ca) reloads after the files changed, by file and result",
            m.cert_reloads.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the serving certificate in use expires (notAfter), in seconds since the Unix epoch",
            m.cert_expiry.clone(),
        );
        m.listeners.register(registry);
        m.undecodable.register(registry, &["PersistentPodState"]);
        registry.register(
            "in_flight_bytes",
            "Request and response body bytes held now, out of --max-in-flight-bytes",
            m.in_flight.clone(),
        );
        m.create_series();
        Self {
            registry: root,
            ..m
        }
    }
}

impl Metrics {
    /// Creates the series every endpoint can have at zero: prometheus-client writes a family
    /// only once it has a series, and alerts and dashboards must find every family from the
    /// start. Series of the other outcomes appear with their first request.
    fn create_series(&self) {
        for endpoint in ENDPOINTS {
            for outcome in ERROR_OUTCOMES {
                drop(
                    self.requests
                        .get_or_create(&RequestLabels { endpoint, outcome }),
                );
            }
            drop(self.duration.get_or_create(&EndpointLabel { endpoint }));
        }
        for endpoint in ["mutate-pods", "filter"] {
            drop(self.pins_applied.get_or_create(&EndpointLabel { endpoint }));
            for reason in ["conflict", "invalid-spec"] {
                drop(
                    self.pins_skipped
                        .get_or_create(&SkipLabels { endpoint, reason }),
                );
            }
        }
        for file in ["certificate", "client-ca"] {
            for result in ["ok", "error"] {
                drop(
                    self.cert_reloads
                        .get_or_create(&ReloadLabel { file, result }),
                );
            }
        }
    }

    /// Counts a request and its duration.
    pub fn request(&self, endpoint: &'static str, outcome: &'static str, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels { endpoint, outcome })
            .inc();
        self.duration
            .get_or_create(&EndpointLabel { endpoint })
            .observe(seconds);
    }

    /// Counts a pin applied.
    pub fn pin_applied(&self, endpoint: &'static str) {
        self.pins_applied
            .get_or_create(&EndpointLabel { endpoint })
            .inc();
    }

    /// Counts a pod the extender pinned that admission had not.
    pub fn pin_missed_at_admission(&self) {
        self.pins_missed_at_admission.inc();
    }

    /// Counts a pin skipped.
    pub fn pin_skipped(&self, endpoint: &'static str, reason: &'static str) {
        self.pins_skipped
            .get_or_create(&SkipLabels { endpoint, reason })
            .inc();
    }

    /// Sets the bytes in flight (at scrape time).
    pub fn in_flight(&self, bytes: usize) {
        self.in_flight.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts a reload of `file` (`certificate` or `client-ca`).
    pub fn cert_reload(&self, file: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.cert_reloads
            .get_or_create(&ReloadLabel { file, result })
            .inc();
    }

    /// Sets when the serving certificate expires (seconds since the Unix epoch).
    pub fn certificate_expiry(&self, not_after: i64) {
        self.cert_expiry.set(not_after);
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
