//! `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use ipkeep_api::PersistentPodState;
use kube::runtime::reflector::Store;

use crate::metrics::Metrics;

/// What the endpoints report.
#[derive(Debug, Default)]
pub struct Health {
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// The API is reachable and the CRD installed; as leader, the caches have synced.
    pub ready: AtomicBool,
    /// The PPS cache while this replica leads: the `records` gauge is summed from it.
    pub pps: std::sync::Mutex<Option<Store<PersistentPodState>>>,
}

/// The router.
pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health)
}

async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the API server or the first cache sync",
        )
    }
}

async fn metrics(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let records = health
        .pps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|store| {
            store
                .state()
                .iter()
                .map(|p| p.status.as_ref().map_or(0, |s| s.pod_states.len() as i64))
                .sum()
        });
    health.metrics.records.set(records.unwrap_or(0));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.metrics.encode(),
    )
}
