//! `ipkeep-scheduler-ext`: one HTTP(S) server with two front doors onto one pure decision
//! ([`ipkeep_placement::pin`]).
//!
//! - **Mutating webhook** `/mutate-pods` ([`webhook`]): on pod CREATE, pins a rebuilt
//!   StatefulSet pod to its recorded node/zone (required and preferred node affinity), stamps
//!   `ipkeep.dev/ip-retention` so the CNI plugin keeps its addresses, and marks it
//!   `ipkeep.dev/pinned-by`; a pin the pod's own constraints exclude is skipped and explained
//!   (`ipkeep.dev/pin-skipped` and an admission warning; the controller publishes the
//!   `PinSkipped` Event once the pod exists).
//! - **Mutating webhook** `/mutate-persistentpodstates` ([`pending`]): labels a
//!   PersistentPodState that gets lifecycle hooks pending until ipkeep-controller has put them
//!   into the admission plan, so the StatefulSet's first pods wait for them.
//! - **Validating webhook** `/validate-pods` ([`deletion`]): holds the deletion and eviction of a
//!   pod that carries its PreDelete lifecycle hook. An answer only: the server writes nothing to
//!   the API (it takes requests nobody authenticates, so it holds no write permission).
//! - **Scheduler extender** `/filter`, `/prioritize` ([`extender`]): the same decision at
//!   scheduling time, for pods the webhook did not see.
//!
//! Decisions read PersistentPodStates, nodes and pods with hooks from reflector caches
//! ([`cache`]); a request never waits on the API server. What requests cost in memory is
//! bounded ([`budget`], [`pod`], [`http`]), and what connections may hold, per client address
//! and in all, by `ipkeep_listener`. `/healthz` and `/readyz` (caches synced) are served on the
//! same listener, and `/metrics` too unless a plain-HTTP probe listener of its own serves all
//! three, which nothing on the webhook port can starve. With `--client-ca`, the webhook port serves
//! only clients with a certificate from that CA ([`tls::client_ca`]).

mod args;
pub mod budget;
pub mod cache;
pub mod deletion;
pub mod error;
pub mod extender;
pub mod http;
pub mod lean_pps;
pub mod metrics;
pub mod pending;
pub mod pod;
pub mod review;
pub mod tls;
pub mod webhook;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use ipkeep_listener::Server;
use kube::Client;
use tokio::net::TcpListener;

use crate::cache::Caches;
use crate::http::{AppState, Limits};
use crate::metrics::Metrics;
use crate::tls::{CertFiles, ServingTls, TlsError};

pub use args::Args;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The webhook/extender listener.
    pub listen: SocketAddr,
    /// TLS certificate and key; `None` serves plain HTTP.
    pub tls: Option<CertFiles>,
    /// The CA client certificates must chain to (TLS only); `None` asks for none.
    pub client_ca: Option<std::path::PathBuf>,
    /// The webhook listener's bounds (connections in all and per client address).
    pub listener: ipkeep_listener::Limits,
    /// How often the certificate files are checked for changes.
    pub cert_reload_interval: Duration,
    /// An extra plain-HTTP listener for `/healthz`, `/readyz` and `/metrics`.
    pub probe_listen: Option<SocketAddr>,
    /// Request limits.
    pub limits: Limits,
}

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The log flags.
    #[error(transparent)]
    Logs(#[from] ipkeep_daemon::LogError),
    /// No API client.
    #[error(transparent)]
    Client(#[from] ipkeep_daemon::preflight::ClientError),
    /// The CRD is not installed.
    #[error(transparent)]
    Preflight(#[from] ipkeep_daemon::preflight::PreflightError),
    /// `IPKEEP_LISTEN` (renamed `IPKEEP_WEBHOOK_LISTEN`) does not parse.
    #[error(transparent)]
    Renamed(#[from] ipkeep_daemon::renamed::RenamedError),
    /// Request limits that cannot work together.
    #[error("{0}")]
    Limits(String),
    /// The serving certificate or client CA cannot be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A listen address cannot be bound.
    #[error("failed to listen on {addr}{flag}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Which flag gave it, when not --webhook-listen.
        flag: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// Runs the server until `shutdown` resolves.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    settings.limits.check().map_err(StartError::Limits)?;
    match ipkeep_daemon::preflight::check_crd(&client).await {
        Err(e @ ipkeep_daemon::preflight::PreflightError::CrdMissing) => return Err(e.into()),
        // The watches retry; /readyz stays false until they sync.
        Err(e) => tracing::warn!(error = %e, "preflight failed; starting anyway"),
        Ok(()) => {}
    }
    let metrics = Arc::new(Metrics::default());
    let connections = metrics.listeners.clone();
    ipkeep_listener::raise_open_files_limit_logged();
    let mut webhook = Server::new("webhook", settings.listener, connections.clone());
    if let Some(files) = &settings.tls {
        let tls = ServingTls::load(files.clone(), settings.client_ca.clone())?;
        tokio::spawn(
            tls.clone()
                .watch(settings.cert_reload_interval, metrics.clone()),
        );
        webhook = webhook.with_tls(tls);
    }
    let (caches, writers) = Caches::new(metrics.undecodable.gauge("PersistentPodState"));
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
            .map_err(|source| StartError::Listen {
                addr,
                flag: " (--probe-listen)",
                source,
            })?;
        let probes = http::health_routes().with_state(state.clone());
        let server = Server::new("probes", ipkeep_listener::Limits::probes(), connections);
        tokio::spawn(server.serve(listener, probes, shutdown.clone()));
    }
    let listener =
        TcpListener::bind(settings.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: settings.listen,
                flag: " (--webhook-listen)",
                source,
            })?;
    tracing::info!(
        listen = %settings.listen,
        tls = settings.tls.is_some(),
        client_certificates = settings.client_ca.is_some(),
        probe_listen = ?settings.probe_listen,
        "serving /mutate-pods, /validate-pods, /filter, /prioritize"
    );
    // With a probe listener, /metrics is served there only.
    let routes = if settings.probe_listen.is_some() {
        http::webhook_router(state)
    } else {
        http::router(state)
    };
    webhook.serve(listener, routes, shutdown).await;
    tracing::info!("stopped");
    Ok(())
}
