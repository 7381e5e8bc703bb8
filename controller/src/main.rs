//! `ipkeep-controller`: the PersistentPodState controller binary. Parses flags, sets up logging,
//! the health/metrics server and the API client, then runs [`ipkeep_controller::run`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ipkeep_controller::http::{self, Health};
use ipkeep_controller::leader::LeaderSettings;
use ipkeep_controller::{Settings, run};
use ipkeep_daemon::{LogArgs, STOP_GRACE, identity, run_until_stopped, shutdown_signal};
use ipkeep_listener::{Limits, Server};

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
struct Args {
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.logs.init()?;
    let client = kube::Client::try_default().await.context(
        "failed to find the cluster (set KUBECONFIG, or run in a pod with a service account)",
    )?;
    let identity = identity(args.identity, "ipkeep-controller");
    let leader = (!args.no_leader_election).then(|| LeaderSettings {
        namespace: args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string()),
        lease_name: args.lease_name.clone(),
        identity: identity.clone(),
        lease_seconds: args.lease_duration.as_secs().max(2),
        renew_before_seconds: (args.lease_duration.as_secs() / 3).max(1),
    });
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("failed to listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, identity, leader_election = leader.is_some(), "starting");
    ipkeep_listener::raise_open_files_limit_logged();
    let probes = Server::new("probes", Limits::probes(), health.metrics.listeners.clone());
    let app = http::router(health.clone());
    tokio::spawn(probes.serve(listener, app, std::future::pending()));
    let settings = Settings {
        concurrency: args.concurrency,
        debounce: args.debounce,
        leader,
        identity,
    };
    run_until_stopped(shutdown_signal(), STOP_GRACE, |stop| {
        run(client, settings, health, stop.requested())
    })
    .await
}
