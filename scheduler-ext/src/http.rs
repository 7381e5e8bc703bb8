//! The HTTP front: routes, body limits and timeouts, the memory budget, metrics and logs per
//! request. The work is in [`crate::webhook`] and [`crate::extender`]; errors become responses
//! in [`crate::error`].
//!
//! A request's bytes are charged to the shared [`Budget`] as they arrive, within its client
//! address's share (small requests may also use a reserve that large ones cannot take), and
//! its answer until it is sent; decisions (parsing included) run
//! [`DECISIONS_AT_ONCE`] at a time. Together these bound what any number of concurrent requests
//! cost (`docs/scheduler-ext.md`, "Memory"), and what one client can hold of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;

use crate::budget::{Budget, Charge, ChargedBody, Sizes};
use crate::cache::Caches;
use crate::error::RequestError;
use crate::metrics::Metrics;
use crate::review::{Outcome, ReviewOut, Reviewed};
use crate::{deletion, extender, pending, webhook};

const MIB: usize = 1 << 20;

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest AdmissionReview accepted: a pod (the API server takes at most 3 MiB) and the
    /// review around it.
    pub webhook_body: usize,
    /// Largest ExtenderArgs accepted: a pod and up to [`extender::MAX_NODES`] node names.
    pub extender_body: usize,
    /// Most request and response body bytes held at once, across all requests.
    pub in_flight: usize,
    /// Most of [`Self::in_flight`] the requests of one client address hold at once.
    pub in_flight_per_source: usize,
    /// The part of [`Self::in_flight`] only small requests may hold (0: none), so that large
    /// bodies, however slow, cannot keep ordinary calls out.
    pub in_flight_reserved: usize,
    /// Most of [`Self::in_flight_reserved`] the requests of one client address hold at once; a
    /// request is small while its body (and then its answer) fits it.
    pub in_flight_reserved_per_source: usize,
    /// Longest wait for a whole request body.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            webhook_body: 4 * MIB,
            extender_body: 6 * MIB,
            in_flight: 24 * MIB,
            in_flight_per_source: 6 * MIB,
            in_flight_reserved: 6 * MIB,
            in_flight_reserved_per_source: MIB / 2,
            body_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// Why these limits cannot work together, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        let largest = self.webhook_body.max(self.extender_body);
        if u32::try_from(self.in_flight).is_err() {
            return Err("--max-in-flight-bytes must be under 4 GiB".into());
        }
        if self.in_flight_reserved > self.in_flight
            || self.in_flight - self.in_flight_reserved < largest
        {
            return Err(format!(
                "--max-in-flight-bytes ({}) must be at least the largest body limit ({largest}) plus --reserved-in-flight-bytes ({}): only small requests may use the reserve, so a request of that size could never be served",
                self.in_flight, self.in_flight_reserved
            ));
        }
        if self.in_flight_per_source < largest || self.in_flight_per_source > self.in_flight {
            return Err(format!(
                "--max-in-flight-bytes-per-source ({}) must be at least the largest body limit ({largest}) and at most --max-in-flight-bytes ({})",
                self.in_flight_per_source, self.in_flight
            ));
        }
        let part = self.in_flight_reserved_per_source;
        if self.in_flight_reserved > 0
            && (part == 0 || part > self.in_flight_reserved || part > self.in_flight_per_source)
        {
            return Err(format!(
                "--reserved-in-flight-bytes-per-source ({part}) must be more than 0 and at most --reserved-in-flight-bytes ({}) and --max-in-flight-bytes-per-source ({}); set --reserved-in-flight-bytes to 0 for no reserve",
                self.in_flight_reserved, self.in_flight_per_source
            ));
        }
        Ok(())
    }

    /// How the budget of these limits is shared out.
    pub fn budget(&self) -> Sizes {
        Sizes {
            total: self.in_flight,
            per_source: self.in_flight_per_source,
            reserved: self.in_flight_reserved,
            reserved_per_source: self.in_flight_reserved_per_source,
        }
    }
}

/// Decisions (parsing, deciding, building the answer) running at once. They are CPU work of a
/// few milliseconds at most; the bound keeps what they cost beyond the bytes the budget counts
/// (parsed fields, an answer being built) to this many requests' worth, and the allocator's
/// per-thread arenas few (two at once measured 10 to 20 MiB more at the peak).
pub const DECISIONS_AT_ONCE: usize = 1;

/// Everything a request needs.
#[derive(Clone, Debug)]
pub struct AppState {
    /// PersistentPodStates and nodes.
    pub caches: Caches,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Request limits.
    pub limits: Limits,
    /// The bytes of requests and answers in flight.
    pub budget: Budget,
    /// Turns for decisions.
    decisions: Arc<Semaphore>,
}

impl AppState {
    /// The state for serving with `limits` (see [`Limits::check`]).
    pub fn new(caches: Caches, metrics: Arc<Metrics>, limits: Limits) -> Self {
        Self {
            caches,
            metrics,
            limits,
            budget: Budget::new(limits.budget()),
            decisions: Arc::new(Semaphore::new(DECISIONS_AT_ONCE)),
        }
    }
}

/// Bodies above this size are parsed on the blocking pool, so one large `Nodes` list does not
/// stall the other requests on this core.
const BLOCKING_ABOVE: usize = 1 << 20;

/// All routes: `/mutate-pods`, `/validate-pods`, `/filter`, `/prioritize`, and
/// [`health_routes`].
pub fn router(state: AppState) -> Router {
    decision_routes().merge(health_routes()).with_state(state)
}

/// The webhook port's routes when a probe listener serves `/metrics`: [`router`] without it,
/// so that the port the Service exposes to the whole cluster does not show the metrics
/// (which the probe port serves to whom the NetworkPolicy admits).
pub fn webhook_router(state: AppState) -> Router {
    decision_routes()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

fn decision_routes() -> Router<AppState> {
    Router::new()
        .route("/mutate-pods", post(mutate_pods))
        .route(
            "/mutate-persistentpodstates",
            post(mutate_persistent_pod_states),
        )
        .route("/validate-pods", post(validate_pods))
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
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
            "not ready: the PersistentPodState, node and pod caches are not synced yet",
        )
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    state.metrics.in_flight(state.budget.in_use());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// The client's address, as the listener gave it (unspecified for requests served in
/// process, as in tests).
type Client = Option<Extension<ConnectInfo<SocketAddr>>>;

fn source(client: &Client) -> IpAddr {
    client
        .as_ref()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.0.ip())
}

/// A body's first allocation, and the least it grows by.
const FIRST_CHUNK: usize = 16 * 1024;

/// Reads a whole body of at most `limit` bytes within the body timeout. Its bytes are charged
/// to the budget as they arrive (in `source`'s share), never on the length the request
/// declares, which costs its client nothing to declare: the buffer grows by doubling as bytes
/// come, never past the declared length, and each size is charged before it is allocated.
async fn read_body(
    state: &AppState,
    source: IpAddr,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<(Vec<u8>, Charge), RequestError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(RequestError::TooLarge { limit });
    }
    let most = declared.unwrap_or(limit);
    let mut charge = state.budget.charge(source);
    let read = async {
        let mut bytes = Vec::new();
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| RequestError::Body(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let need = bytes.len() + data.len();
            if need > limit {
                return Err(RequestError::TooLarge { limit });
            }
            if need > bytes.capacity() {
                let grown = (bytes.capacity() * 2).max(FIRST_CHUNK).min(most).max(need);
                charge.grow(grown.saturating_sub(charge.bytes())).await?;
                bytes.reserve_exact(grown - bytes.len());
            }
            bytes.extend_from_slice(&data);
        }
        Ok(bytes)
    };
    let timeout = state.limits.body_timeout;
    match tokio::time::timeout(timeout, read).await {
        Err(_) => Err(RequestError::SlowBody(timeout)),
        Ok(Err(e)) => Err(e),
        Ok(Ok(bytes)) => Ok((bytes, charge)),
    }
}

/// Runs `work` on the body in a decision turn (on the blocking pool when the body is large).
/// The body is freed when `work` returns.
async fn run<T: Send + 'static>(
    state: &AppState,
    body: Vec<u8>,
    work: fn(&[u8], &Caches) -> Result<T, RequestError>,
) -> Result<T, RequestError> {
    // The semaphore is never closed.
    let _turn = state.decisions.acquire().await;
    if body.len() <= BLOCKING_ABOVE {
        return work(&body, &state.caches);
    }
    let caches = state.caches.clone();
    tokio::task::spawn_blocking(move || work(&body, &caches))
        .await
        .unwrap_or_else(|e| Err(RequestError::Body(format!("request handler failed: {e}"))))
}

/// A JSON answer that holds its bytes of the budget until it is sent.
async fn json_response(body: Vec<u8>, mut charge: Charge) -> Result<Response, RequestError> {
    charge.resize(body.len()).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        ChargedBody::new(body, charge).into_body(),
    )
        .into_response())
}

/// An AdmissionReview's way through: its body read within the limits, `work` run on it, its
/// answer (`answer` of what `work` returned) sent, and `after` (logs, metrics, side effects)
/// given what `work` returned; `after` returns the `outcome` label. Errors become the
/// `metav1.Status` answer, and the API server applies the webhook's `failurePolicy`.
async fn admission<R: Send + 'static>(
    state: &AppState,
    endpoint: &'static str,
    (client, headers, body): (Client, HeaderMap, Body),
    work: fn(&[u8], &Caches) -> Result<R, RequestError>,
    answer: fn(&R) -> &ReviewOut,
    after: impl FnOnce(R) -> Outcome,
) -> Response {
    let result = async {
        let limit = state.limits.webhook_body;
        let (bytes, charge) = read_body(state, source(&client), &headers, body, limit).await?;
        let started = Instant::now();
        let reviewed = run(state, bytes, work).await?;
        let json = serde_json::to_vec(answer(&reviewed)).unwrap_or_default();
        Ok::<_, RequestError>((reviewed, json_response(json, charge).await?, started))
    }
    .await;
    match result {
        Ok((reviewed, response, started)) => {
            let outcome = after(reviewed);
            let seconds = started.elapsed().as_secs_f64();
            state.metrics.request(endpoint, outcome.label(), seconds);
            response
        }
        Err(e) => {
            tracing::warn!(endpoint, error = %e, "admission request refused");
            state.metrics.request(endpoint, e.outcome(), 0.0);
            e.into_webhook_response()
        }
    }
}

/// A pod's namespace and name for a log line, `?` where not known.
fn named(pod: &Option<(String, String)>) -> (&str, &str) {
    pod.as_ref()
        .map_or(("?", "?"), |(ns, name)| (ns.as_str(), name.as_str()))
}

async fn mutate_persistent_pod_states(
    State(state): State<AppState>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let after = |reviewed: Reviewed| {
        if reviewed.outcome == Outcome::Labelled {
            let (namespace, pps) = named(&reviewed.pod);
            tracing::info!(namespace = ?namespace, pps = ?pps, "PersistentPodState with new hooks labelled pending until they are in the admission plan");
        }
        reviewed.outcome
    };
    let request = (client, headers, body);
    let endpoint = "mutate-persistentpodstates";
    admission(
        &state,
        endpoint,
        request,
        pending::review,
        |r| &r.review,
        after,
    )
    .await
}

async fn mutate_pods(
    State(state): State<AppState>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Response {
    const ENDPOINT: &str = "mutate-pods";
    let after = |reviewed: Reviewed| {
        let answer = &reviewed.review.response;
        if reviewed.outcome != Outcome::Passed {
            let (namespace, pod) = named(&reviewed.pod);
            // Request fields with `?`: escaped, so a name cannot forge a log line.
            tracing::info!(
                namespace = ?namespace,
                pod = ?pod,
                uid = ?answer.uid,
                outcome = reviewed.outcome.label(),
                patched = answer.patch.is_some(),
                warnings = ?answer.warnings,
                "pod admitted"
            );
        }
        if reviewed.outcome == Outcome::Pinned {
            state.metrics.pin_applied(ENDPOINT);
        }
        if let Some(reason) = reviewed.skipped {
            state.metrics.pin_skipped(ENDPOINT, reason);
        }
        reviewed.outcome
    };
    let request = (client, headers, body);
    admission(
        &state,
        ENDPOINT,
        request,
        webhook::review,
        |r| &r.review,
        after,
    )
    .await
}

async fn validate_pods(
    State(state): State<AppState>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let after = |reviewed: Reviewed| {
        if matches!(reviewed.outcome, Outcome::Held | Outcome::Escaped) {
            let (namespace, pod) = named(&reviewed.pod);
            let answer = &reviewed.review.response;
            // Request fields with `?`: escaped, so a name cannot forge a log line.
            tracing::info!(
                namespace = ?namespace,
                pod = ?pod,
                uid = ?answer.uid,
                outcome = reviewed.outcome.label(),
                message = ?answer.status.as_ref().map_or("", |s| s.message.as_str()),
                warnings = ?answer.warnings,
                "pod deletion reviewed"
            );
        }
        reviewed.outcome
    };
    let request = (client, headers, body);
    admission(
        &state,
        "validate-pods",
        request,
        deletion::review,
        |r| &r.review,
        after,
    )
    .await
}

async fn extend(
    state: AppState,
    client: Client,
    headers: HeaderMap,
    body: Body,
    endpoint: &'static str,
    work: fn(&[u8], &Caches) -> Result<extender::Served, RequestError>,
) -> Result<Response, RequestError> {
    let refused = |e: &RequestError| {
        tracing::warn!(endpoint, error = %e, "extender request refused");
        state.metrics.request(endpoint, e.outcome(), 0.0);
    };
    let limit = state.limits.extender_body;
    let (bytes, charge) = read_body(&state, source(&client), &headers, body, limit)
        .await
        .inspect_err(refused)?;
    let started = Instant::now();
    let served = run(&state, bytes, work).await.inspect_err(refused)?;
    if served.outcome == Outcome::Pinned && endpoint == "filter" {
        state.metrics.pin_applied(endpoint);
        if !served.pinned_at_admission {
            state.metrics.pin_missed_at_admission();
        }
    }
    if let Some(reason) = served.skipped {
        state.metrics.pin_skipped(endpoint, reason);
    }
    let response = json_response(served.body, charge)
        .await
        .inspect_err(refused)?;
    tracing::debug!(
        endpoint,
        outcome = served.outcome.label(),
        "extender request served"
    );
    state.metrics.request(
        endpoint,
        served.outcome.label(),
        started.elapsed().as_secs_f64(),
    );
    Ok(response)
}

async fn filter(
    State(state): State<AppState>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Response {
    extend(state, client, headers, body, "filter", extender::filter)
        .await
        .unwrap_or_else(RequestError::into_filter_response)
}

async fn prioritize(
    State(state): State<AppState>,
    client: Client,
    headers: HeaderMap,
    body: Body,
) -> Response {
    extend(
        state,
        client,
        headers,
        body,
        "prioritize",
        extender::prioritize,
    )
    .await
    .unwrap_or_else(RequestError::into_prioritize_response)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn limits_that_cannot_work_together_are_refused_with_the_flags_to_change() {
        assert_eq!(Limits::default().check(), Ok(()));
        let no_reserve = Limits {
            in_flight_reserved: 0,
            in_flight_reserved_per_source: 0,
            ..Limits::default()
        };
        assert_eq!(no_reserve.check(), Ok(()));
        let refused = [
            (
                Limits {
                    in_flight_reserved: 19 * MIB,
                    ..Limits::default()
                },
                "--reserved-in-flight-bytes (19922944): only small requests",
            ),
            (
                Limits {
                    in_flight_per_source: 5 * MIB,
                    ..Limits::default()
                },
                "--max-in-flight-bytes-per-source (5242880) must be at least the largest body limit",
            ),
            (
                Limits {
                    in_flight_reserved_per_source: 0,
                    ..Limits::default()
                },
                "--reserved-in-flight-bytes-per-source (0) must be more than 0",
            ),
            (
                Limits {
                    in_flight_reserved_per_source: 7 * MIB,
                    ..Limits::default()
                },
                "--reserved-in-flight-bytes-per-source (7340032) must be more than 0 and at most --reserved-in-flight-bytes (6291456)",
            ),
            (
                Limits {
                    in_flight: 5 << 30,
                    ..Limits::default()
                },
                "under 4 GiB",
            ),
        ];
        for (limits, message) in refused {
            let error = limits.check().unwrap_err();
            assert!(error.contains(message), "{limits:?}: {error}");
        }
    }
}
