//! The node agent `ipkeep-agent`: keeps each network's store open and serves the plugin over a
//! unix socket ([`server`], speaking `ipkeep_cni::proto`), sweeps expired holdings on a timer, and releases the
//! holdings Kubernetes says nobody will use again ([`release`], [`cluster`], [`sweep`]).

pub mod args;
pub mod cluster;
pub mod cniconf;
pub mod events;
pub mod lean_pps;
pub mod management;
pub mod metrics;
pub mod netns;
pub mod release;
pub mod server;
pub mod stores;
pub mod sweep;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use futures::FutureExt;
use kube::Client;

use crate::cluster::Cluster;
use crate::metrics::Metrics;
use crate::release::Grace;
use crate::server::Served;
use crate::stores::AgentStores;
use crate::sweep::Sweeper;

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name.
    pub node_name: String,
    /// The plugins' `ipam.dataDir`; every network store under it is opened at start.
    pub data_dir: PathBuf,
    /// The unix socket the plugin connects to.
    pub socket: PathBuf,
    /// `/healthz`, `/readyz` and `/metrics`.
    pub probe_listen: Option<SocketAddr>,
    /// `/metrics` only, for Prometheus (the node's IP).
    pub metrics_listen: Option<SocketAddr>,
    /// How often every store is swept.
    pub sweep_interval: Duration,
    /// Grace periods before Kubernetes-aware decisions.
    pub grace: Grace,
    /// Longest wait for a store a plugin holds.
    pub lock_timeout: Duration,
    /// The most addresses one sweep frees or re-holds on Kubernetes' word.
    pub max_releases: usize,
    /// Write the node's CNI configuration from a template and the Node's pod CIDRs.
    pub cni_conf: Option<cniconf::CniConf>,
}

/// Why the agent stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--data-dir` cannot be created or read.
    #[error("failed to use the data directory {} (--data-dir)", path.display())]
    DataDir {
        /// `--data-dir`.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `--socket` cannot be listened on.
    #[error("failed to listen on the agent socket {} (--socket)", path.display())]
    Socket {
        /// `--socket`.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `--probe-listen` cannot be listened on.
    #[error("failed to listen on {addr} (--probe-listen)")]
    Probes {
        /// `--probe-listen`.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// `--metrics-listen` cannot be listened on.
    #[error("failed to listen on {addr} (--metrics-listen)")]
    Metrics {
        /// `--metrics-listen`.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The probe listener's own address cannot be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A blocking task (opening or closing the stores) panicked.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

#[derive(Clone, Debug)]
struct ProbeState {
    metrics: Arc<Metrics>,
    cluster: Option<Cluster>,
    stores: Arc<AgentStores>,
}

/// Runs the agent until `shutdown` resolves: then it stops accepting, finishes in-flight
/// requests, stops sweeping and closes every store. `client` is `None` with
/// `--no-kubernetes` (store service and timer sweep only).
pub async fn run(
    client: Option<Client>,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let shutdown = shutdown.shared();
    let metrics = Arc::new(Metrics::default());
    let stores = Arc::new(
        AgentStores::new(&settings.data_dir, metrics.clone()).map_err(|source| Error::DataDir {
            path: settings.data_dir.clone(),
            source,
        })?,
    );
    let netns = Arc::new(netns::NetnsView::default());
    let adopted = {
        let (stores, timeout, netns) = (stores.clone(), settings.lock_timeout, netns.clone());
        tokio::task::spawn_blocking(move || {
            let adopted = stores.adopt(timeout);
            let deadline = || std::time::Instant::now() + timeout;
            let snapshots = (stores.slots().into_iter())
                .filter_map(|slot| slot.snapshot(deadline(), timeout).ok());
            netns::survey(&netns, snapshots);
            adopted
        })
        .await?
    };
    tracing::info!(data_dir = %stores.data_dir().display(), networks = ?adopted, "opened the existing stores");
    let listener = server::bind(&settings.socket).map_err(|source| Error::Socket {
        path: settings.socket.clone(),
        source,
    })?;
    let notices = client
        .as_ref()
        .map(|client| events::spawn(client.clone(), &settings.node_name));
    let cluster = client.map(|client| {
        let undecodable = metrics.undecodable.gauge("PersistentPodState");
        let (cluster, writers) = Cluster::new(&settings.node_name, undecodable);
        tokio::spawn(cluster::watch(client, cluster.clone(), writers));
        cluster
    });
    match (&cluster, &settings.cni_conf) {
        (Some(cluster), Some(conf)) => {
            tokio::spawn(cniconf::keep_written(
                cluster.clone(),
                conf.clone(),
                Duration::from_secs(2),
                shutdown.clone(),
            ));
        }
        (None, Some(_)) => {
            tracing::warn!(
                "--cni-conf-template needs Kubernetes (the Node's pod CIDRs): not writing the CNI configuration"
            );
        }
        _ => {}
    }
    if let Some(addr) = settings.probe_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Probes { addr, source })?;
        let state = ProbeState {
            metrics: metrics.clone(),
            cluster: cluster.clone(),
            stores: stores.clone(),
        };
        let app = axum::Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics_text))
            .with_state(state);
        tracing::info!(addr = %listener.local_addr()?, "serving /healthz, /readyz, /metrics");
        ipkeep_listener::raise_open_files_limit_logged();
        let limits = ipkeep_listener::Limits::probes();
        let probes = ipkeep_listener::Server::new("probes", limits, metrics.listeners.clone());
        tokio::spawn(probes.serve(listener, app, shutdown.clone()));
    }
    if let Some(addr) = settings.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Metrics { addr, source })?;
        let state = ProbeState {
            metrics: metrics.clone(),
            cluster: cluster.clone(),
            stores: stores.clone(),
        };
        // Only /metrics: this address is reachable from the network (the node's IP), and the
        // probes have their own listener on loopback.
        let app = axum::Router::new()
            .route("/metrics", get(metrics_text))
            .with_state(state);
        tracing::info!(addr = %listener.local_addr()?, "serving /metrics");
        let limits = ipkeep_listener::Limits::probes();
        let server = ipkeep_listener::Server::new("metrics", limits, metrics.listeners.clone());
        tokio::spawn(server.serve(listener, app, shutdown.clone()));
    }
    let sweeper = Sweeper {
        stores: stores.clone(),
        metrics: metrics.clone(),
        cluster: cluster.clone(),
        grace: settings.grace,
        lock_timeout: settings.lock_timeout,
        max_releases: settings.max_releases,
        readings: Default::default(),
        netns: netns.clone(),
    };
    let sweeping = tokio::spawn(sweeper.run(settings.sweep_interval, shutdown.clone()));
    tracing::info!(
        node = %settings.node_name,
        socket = %settings.socket.display(),
        probe_listen = ?settings.probe_listen,
        metrics_listen = ?settings.metrics_listen,
        kubernetes = cluster.is_some(),
        "serving the ipkeep plugin"
    );
    let served = Arc::new(Served {
        stores: stores.clone(),
        metrics,
        notices,
        netns,
        cluster,
        logs: Default::default(),
    });
    server::serve(listener, served, shutdown).await;
    let _ = sweeping.await;
    tokio::task::spawn_blocking(move || stores.close_all()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Alive while the process serves HTTP. A store that cannot commit (a full disk, a damaged
/// file) is not something a restart fixes, so it shows on `/readyz` and in
/// `ipkeep_agent_store_healthy`, never here.
async fn healthz() -> &'static str {
    "ok"
}

/// Ready once serving (it only runs after the socket is bound) while every store it opened
/// commits; 503 with the reason after a commit or an open failed, until one succeeds. The body
/// also says whether Kubernetes-aware release is on yet, and if not why: the store service
/// never waits for the API server.
async fn readyz(State(state): State<ProbeState>) -> impl IntoResponse {
    let kubernetes = match &state.cluster {
        None => "kubernetes: off".to_string(),
        Some(c) => format!("kubernetes: {}", c.readiness().as_str()),
    };
    match state.stores.health() {
        Ok(()) => (StatusCode::OK, format!("ok ({kubernetes})")),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {why} ({kubernetes})\n"),
        ),
    }
}

async fn metrics_text(State(state): State<ProbeState>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
