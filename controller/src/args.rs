//! The controller's command line ([`Args`]) and its start: logging, the API client, the
//! health/metrics server, then [`crate::run`] until SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ipkeep_daemon::{LogArgs, LogError, STOP_GRACE, identity, run_until_stopped, shutdown_signal};
use ipkeep_listener::{Limits, Server};

use crate::http::{self, Health};
use crate::leader::LeaderSettings;
use crate::run::{Settings, run};

/// Records where each pod of an annotated StatefulSet ran — node, topology labels, pod IPs — in
/// PersistentPodState objects (ipkeep.dev/v1alpha1), prunes the records by policy, and generates
/// PersistentPodStates from StatefulSet annotations
/// (ipkeep.dev/auto-generate-persistent-pod-state: "true").
///
/// Finds the cluster like kubectl: $KUBECONFIG (or ~/.kube/config), else the in-cluster service
/// account. Needs the CRD from deploy/crd.yaml. Runs with no flags; every flag can also be set
/// by the environment variable shown.
#[derive(Debug, Parser)]
#[command(name = "ipkeep-controller", version)]
pub struct Args {
    /// Address of the /healthz, /readyz and /metrics endpoints (plain HTTP; at most 8
    /// connections per client address and 64 in all, so that no client starves the kubelet's
    /// probes or the process's file descriptors).
    #[arg(long, env = "IPKEEP_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Run without leader election (only safe with a single replica).
    #[arg(long, env = "IPKEEP_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Namespace of the leader Lease [default: the pod's namespace, from the kubeconfig or the
    /// service account].
    #[arg(long, env = "IPKEEP_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, env = "IPKEEP_LEASE_NAME", default_value = "ipkeep-controller")]
    lease_name: String,
    /// How long the leader's lease lasts without renewal; a standby takes over after it.
    #[arg(long, env = "IPKEEP_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// This replica's identity in the Lease and in Events [default: $POD_NAME, else $HOSTNAME].
    #[arg(long, env = "IPKEEP_IDENTITY")]
    identity: Option<String>,
    /// PersistentPodStates reconciled at once.
    #[arg(long, env = "IPKEEP_CONCURRENCY", default_value_t = 8)]
    concurrency: u16,
    /// Coalesces bursts of pod events into one status write per PersistentPodState; records
    /// are written at most this much later.
    #[arg(long, env = "IPKEEP_DEBOUNCE", default_value = "250ms", value_parser = humantime::parse_duration)]
    debounce: Duration,
    #[command(flatten)]
    logs: LogArgs,
}

/// Why the controller could not start (`main` prints it with its causes).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--log` or `--log-format` cannot be used.
    #[error(transparent)]
    Logs(#[from] LogError),
    /// No kubeconfig and no service account.
    #[error("failed to find the cluster (set KUBECONFIG, or run in a pod with a service account)")]
    NoCluster(#[source] kube::Error),
    /// The health/metrics address cannot be bound.
    #[error("failed to listen on {addr}")]
    Listen {
        /// `--listen`.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl Args {
    /// Starts the controller and runs it until SIGTERM (or a lost lease): returns only if it
    /// cannot start; once started, the process exits from here, with 0 after a clean stop and
    /// 1 after an error ([`run_until_stopped`]).
    pub async fn run(self) -> Result<(), StartError> {
        let Self {
            listen,
            no_leader_election,
            lease_namespace,
            lease_name,
            lease_duration,
            identity: given_identity,
            concurrency,
            debounce,
            logs,
        } = self;
        logs.init()?;
        let client = kube::Client::try_default()
            .await
            .map_err(StartError::NoCluster)?;
        let identity = identity(given_identity, "ipkeep-controller");
        let leader = (!no_leader_election).then(|| LeaderSettings {
            namespace: lease_namespace.unwrap_or_else(|| client.default_namespace().to_string()),
            lease_name,
            identity: identity.clone(),
            lease_seconds: lease_duration.as_secs().max(2),
            renew_before_seconds: (lease_duration.as_secs() / 3).max(1),
        });
        let health = Arc::new(Health::default());
        serve_probes(listen, health.clone()).await?;
        tracing::info!(listen = %listen, identity, leader_election = leader.is_some(), "starting");
        let settings = Settings {
            concurrency,
            debounce,
            leader,
            identity,
        };
        run_until_stopped(shutdown_signal(), STOP_GRACE, |stop| {
            run(client, settings, health, stop.requested())
        })
        .await
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `listen`, in the background.
async fn serve_probes(listen: SocketAddr, health: Arc<Health>) -> Result<(), StartError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: listen,
            source,
        })?;
    ipkeep_listener::raise_open_files_limit_logged();
    let probes = Server::new("probes", Limits::probes(), health.metrics.listeners.clone());
    let app = http::router(health);
    tokio::spawn(probes.serve(listener, app, std::future::pending()));
    Ok(())
}
