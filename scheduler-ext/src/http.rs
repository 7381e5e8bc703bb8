//! The HTTP front: routes, body limits and timeouts, metrics and logs per request. The work is
//! in [`crate::webhook`] and [`crate::extender`]; errors become responses in [`crate::error`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::sync::mpsc;

use crate::cache::Caches;
use crate::error::RequestError;
use crate::metrics::Metrics;
use crate::webhook::SkippedPin;
use crate::{extender, webhook};

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest AdmissionReview accepted.
    pub webhook_body: usize,
    /// Largest ExtenderArgs accepted (full `Nodes` lists are big).
    pub extender_body: usize,
    /// Longest wait for a whole request body.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            webhook_body: 4 << 20,
            extender_body: 128 << 20,
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// Everything a request needs.
#[derive(Clone, Debug)]
pub struct AppState {
    /// PersistentPodStates and nodes.
    pub caches: Caches,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Where skipped pins go to become Events (none in tests that do not look).
    pub events: Option<mpsc::Sender<SkippedPin>>,
    /// Request limits.
    pub limits: Limits,
}

/// Bodies above this size are parsed on the blocking pool, so one large `Nodes` list does not
/// stall the other requests on this core.
const BLOCKING_ABOVE: usize = 1 << 20;

/// All routes: `/mutate-pods`, `/filter`, `/prioritize`, and [`health_routes`].
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/mutate-pods", post(mutate_pods))
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .merge(health_routes())
        .with_state(state)
}

/// `/healthz`, `/readyz` and `/metrics` only (for a separate plain-HTTP probe port).
pub fn health_routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.caches.ready() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the PersistentPodState and node caches are not synced yet",
        )
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

async fn read_body(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, RequestError> {
    let collect = Limited::new(body, limit).collect();
    match tokio::time::timeout(timeout, collect).await {
        Err(_) => Err(RequestError::SlowBody(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(RequestError::TooLarge { limit })
        }
        Ok(Err(e)) => Err(RequestError::Body(e.to_string())),
    }
}

/// Runs `work` on the body, on the blocking pool when the body is large.
async fn run<T: Send + 'static>(
    state: &AppState,
    body: Bytes,
    work: fn(&[u8], &Caches) -> Result<T, RequestError>,
) -> Result<T, RequestError> {
    if body.len() <= BLOCKING_ABOVE {
        return work(&body, &state.caches);
    }
    let caches = state.caches.clone();
    tokio::task::spawn_blocking(move || work(&body, &caches))
        .await
        .unwrap_or_else(|e| Err(RequestError::Body(format!("request handler failed: {e}"))))
}

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn mutate_pods(State(state): State<AppState>, body: Body) -> Response {
    const ENDPOINT: &str = "mutate-pods";
    let limits = state.limits;
    let result = match read_body(body, limits.webhook_body, limits.body_timeout).await {
        Ok(bytes) => {
            let started = Instant::now();
            run(&state, bytes, webhook::review)
                .await
                .map(|r| (r, started))
        }
        Err(e) => Err(e),
    };
    match result {
        Ok((reviewed, started)) => {
            let response = &reviewed.review.response;
            if reviewed.outcome != "passed" {
                tracing::info!(
                    pod = reviewed.pod.as_deref().unwrap_or("?"),
                    uid = %response.uid,
                    outcome = reviewed.outcome,
                    patched = response.patch.is_some(),
                    warnings = ?response.warnings,
                    "pod admitted"
                );
            }
            if reviewed.outcome == "pinned" {
                state.metrics.pin_applied(ENDPOINT);
            }
            if let Some((reason, skipped)) = reviewed.skipped {
                state.metrics.pin_skipped(ENDPOINT, reason);
                if let Some(events) = &state.events
                    && events.try_send(skipped).is_err()
                {
                    tracing::warn!("event queue full; a pin-skipped Event was dropped");
                }
            }
            let body = serde_json::to_vec(&reviewed.review).unwrap_or_default();
            state
                .metrics
                .request(ENDPOINT, reviewed.outcome, started.elapsed().as_secs_f64());
            json_response(body)
        }
        Err(e) => {
            tracing::warn!(error = %e, "admission request refused");
            state.metrics.request(ENDPOINT, e.outcome(), 0.0);
            e.into_webhook_response()
        }
    }
}

async fn extend(
    state: AppState,
    body: Body,
    endpoint: &'static str,
    work: fn(&[u8], &Caches) -> Result<extender::Served, RequestError>,
) -> Result<Response, RequestError> {
    let limits = state.limits;
    let bytes = read_body(body, limits.extender_body, limits.body_timeout)
        .await
        .inspect_err(|e| state.metrics.request(endpoint, e.outcome(), 0.0))?;
    let started = Instant::now();
    let served = run(&state, bytes, work).await.inspect_err(|e| {
        tracing::warn!(endpoint, error = %e, "extender request refused");
        state.metrics.request(endpoint, e.outcome(), 0.0);
    })?;
    if served.outcome == "pinned" && endpoint == "filter" {
        state.metrics.pin_applied(endpoint);
    }
    if let Some(reason) = served.skipped {
        state.metrics.pin_skipped(endpoint, reason);
    }
    tracing::debug!(
        endpoint,
        outcome = served.outcome,
        "extender request served"
    );
    state
        .metrics
        .request(endpoint, served.outcome, started.elapsed().as_secs_f64());
    Ok(json_response(served.body))
}

async fn filter(State(state): State<AppState>, body: Body) -> Response {
    extend(state, body, "filter", extender::filter)
        .await
        .unwrap_or_else(RequestError::into_filter_response)
}

async fn prioritize(State(state): State<AppState>, body: Body) -> Response {
    extend(state, body, "prioritize", extender::prioritize)
        .await
        .unwrap_or_else(RequestError::into_prioritize_response)
}
