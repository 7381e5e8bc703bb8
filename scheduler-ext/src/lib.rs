//! `ipkeep-scheduler-ext`: one HTTP(S) server with two front doors onto one pure decision
//! ([`ipkeep_placement::pin`]).
//!
//! - **Mutating webhook** `/mutate-pods` ([`webhook`]): on pod CREATE, pins a rebuilt
//!   StatefulSet pod to its recorded node/zone (required and preferred node affinity), stamps
//!   `ipkeep.dev/ip-retention` so the CNI plugin keeps its addresses, and marks it
//!   `ipkeep.dev/pinned-by`; a pin the pod's own constraints exclude is skipped and explained
//!   (`ipkeep.dev/pin-skipped` and an admission warning; the controller publishes the
//!   `PinSkipped` Event once the pod exists).
//! - **Validating webhook** `/validate-pods` ([`deletion`]): holds the deletion and eviction of a
//!   pod that carries its PreDelete lifecycle hook. An answer only: the server writes nothing to
//!   the API (it takes requests nobody authenticates, so it holds no write permission).
//! - **Scheduler extender** `/filter`, `/prioritize` ([`extender`]): the same decision at
//!   scheduling time, for pods the webhook did not see.
//!
//! Decisions read PersistentPodStates, nodes and pods with hooks from reflector caches
//! ([`cache`]); a request never waits on the API server. What requests cost in memory is
//! bounded ([`budget`], [`pod`], [`http`], [`server`]). `/healthz`, `/readyz` (caches synced)
//! and `/metrics` are served on the same listener, and optionally on a plain-HTTP probe
//! listener.

pub mod budget;
pub mod cache;
pub mod deletion;
pub mod error;
pub mod extender;
pub mod http;
pub mod metrics;
pub mod pod;
pub mod server;
pub mod tls;
pub mod webhook;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::FutureExt;
use kube::Client;
use tokio::net::TcpListener;

use crate::cache::Caches;
use crate::http::{AppState, Limits};
use crate::metrics::Metrics;
use crate::tls::{CertFiles, ReloadingCert};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The webhook/extender listener.
    pub listen: SocketAddr,
    /// TLS certificate and key; `None` serves plain HTTP.
    pub tls: Option<CertFiles>,
    /// How often the certificate files are checked for changes.
    pub cert_reload_interval: Duration,
    /// An extra plain-HTTP listener for `/healthz`, `/readyz` and `/metrics`.
    pub probe_listen: Option<SocketAddr>,
    /// Request limits.
    pub limits: Limits,
}

/// Runs the server until `shutdown` resolves.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    settings.limits.check().map_err(anyhow::Error::msg)?;
    match ipkeep_api::preflight::check_crd(&client).await {
        Err(e @ ipkeep_api::preflight::PreflightError::CrdMissing) => return Err(e.into()),
        // The watches retry; /readyz stays false until they sync.
        Err(e) => tracing::warn!(error = %e, "preflight failed; starting anyway"),
        Ok(()) => {}
    }
    let metrics = Arc::new(Metrics::default());
    let tls = match &settings.tls {
        None => None,
        Some(files) => {
            let cert = Arc::new(ReloadingCert::load(files.clone())?);
            let config = cert.server_config()?;
            tokio::spawn(cert.watch(settings.cert_reload_interval, metrics.clone()));
            Some(config)
        }
    };
    let (caches, writers) = Caches::new();
    tokio::spawn(cache::watch(client, writers));
    let ready = caches.clone();
    tokio::spawn(async move {
        ready.wait_until_ready().await;
        tracing::info!("PersistentPodState, node and pod caches synced; ready");
    });
    let state = AppState::new(caches, metrics, settings.limits);
    let shutdown = shutdown.shared();
    if let Some(addr) = settings.probe_listen {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("failed to listen on {addr} (--probe-listen)"))?;
        let probes = http::health_routes().with_state(state.clone());
        tokio::spawn(server::serve(listener, probes, None, shutdown.clone()));
    }
    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("failed to listen on {}", settings.listen))?;
    tracing::info!(
        listen = %settings.listen,
        tls = settings.tls.is_some(),
        probe_listen = ?settings.probe_listen,
        "serving /mutate-pods, /validate-pods, /filter, /prioritize"
    );
    server::serve(listener, http::router(state), tls, shutdown).await;
    tracing::info!("stopped");
    Ok(())
}
