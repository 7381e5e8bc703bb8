//! What a listener counts, registered under each binary's own prefix
//! (`ipkeep_scheduler_ext_connections_refused_total`, `ipkeep_controller_…`,
//! `ipkeep_agent_…`), with the listener's name as a label.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A listener and why something happened on it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The listener's name (`webhook`, `probes`, `metrics`).
    pub listener: &'static str,
    /// See the metric.
    pub reason: &'static str,
}

/// A listener.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// The listener's name.
    pub listener: &'static str,
}

/// Why a connection is refused, evicted, or offered HTTP/1.1 only: every value of the `reason`
/// label of each, created at zero when a listener starts.
const REFUSED: [&str; 4] = [
    "source-limit",
    "capacity",
    "handshake-timeout",
    "handshake-failed",
];
const EVICTED: [&str; 3] = ["source-limit", "capacity", "idle"];
const DECLINED: [&str; 2] = ["source-limit", "capacity"];

/// The connection metrics of every listener of one process (clones share the counts).
#[derive(Debug, Clone, Default)]
pub struct ListenerMetrics {
    refused: Family<ReasonLabels, Counter>,
    evicted: Family<ReasonLabels, Counter>,
    http2_declined: Family<ReasonLabels, Counter>,
    open: Family<ListenerLabel, Gauge>,
}

impl ListenerMetrics {
    /// Adds the metrics to `registry` (which carries the binary's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections_refused",
            "Connections closed before any request was served, by listener and reason: source-limit (the source address already held its share), capacity (the listener was full of requests in progress), handshake-timeout (no TLS handshake within the limit), handshake-failed (TLS refused, e.g. no valid client certificate)",
            self.refused.clone(),
        );
        registry.register(
            "connections_evicted",
            "Connections without a request in progress that the server closed, by listener and reason: source-limit or capacity (to make room for a newer connection), idle (HTTP/2 with no open stream for the idle timeout)",
            self.evicted.clone(),
        );
        registry.register(
            "http2_declined",
            "TLS connections that offered HTTP/2 and were offered HTTP/1.1 only, by listener and reason (source-limit, capacity)",
            self.http2_declined.clone(),
        );
        registry.register(
            "connections",
            "Connections open now, by listener",
            self.open.clone(),
        );
    }

    /// Creates `listener`'s series at zero: prometheus-client writes a family only once it has a
    /// series, and alerts and dashboards must find every family from the start.
    pub fn listening(&self, listener: &'static str) {
        for (family, reasons) in [
            (&self.refused, &REFUSED[..]),
            (&self.evicted, &EVICTED[..]),
            (&self.http2_declined, &DECLINED[..]),
        ] {
            for &reason in reasons {
                drop(family.get_or_create(&ReasonLabels { listener, reason }));
            }
        }
        self.open(listener, 0);
    }

    /// Counts a connection closed unserved.
    pub fn refused(&self, listener: &'static str, reason: &'static str) {
        self.refused
            .get_or_create(&ReasonLabels { listener, reason })
            .inc();
    }

    /// Counts an idle connection closed by the server.
    pub fn evicted(&self, listener: &'static str, reason: &'static str) {
        self.evicted
            .get_or_create(&ReasonLabels { listener, reason })
            .inc();
    }

    /// Counts a connection offered HTTP/1.1 instead of HTTP/2.
    pub fn http2_declined(&self, listener: &'static str, reason: &'static str) {
        self.http2_declined
            .get_or_create(&ReasonLabels { listener, reason })
            .inc();
    }

    /// Sets the open connections of `listener`.
    pub fn open(&self, listener: &'static str, connections: usize) {
        self.open
            .get_or_create(&ListenerLabel { listener })
            .set(i64::try_from(connections).unwrap_or(i64::MAX));
    }
}
