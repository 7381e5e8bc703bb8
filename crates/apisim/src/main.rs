//! `apisim`: serves ipkeep's in-memory Kubernetes API on loopback for demos and manual tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ipkeep_apisim::{ApiServer, ServerConfig};

/// An in-memory Kubernetes API server for ipkeep's tests and demos.
///
/// Serves the subset of the Kubernetes API that ipkeep uses (pods, nodes, namespaces, events,
/// StatefulSets, Leases, CRDs, mutating webhooks) over plain HTTP, so kubectl and kube-rs can
/// talk to it. It is NOT a cluster: no authentication, no RBAC, no controllers, no kubelet.
/// All state is in memory and is LOST when the process exits.
///
/// Test controls: POST /apisim/v1/faults {"verb":"patch","resource":"pods/status","count":2,
/// "code":429,"retryAfterSeconds":1}; DELETE /apisim/v1/faults; POST /apisim/v1/drop-watches;
/// POST /apisim/v1/compact.
#[derive(Debug, Parser)]
#[command(name = "apisim", version)]
struct Args {
    /// Address to listen on (plain HTTP; keep it on loopback).
    #[arg(long, env = "APISIM_LISTEN", default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server to FILE (for kubectl --kubeconfig or KUBECONFIG).
    #[arg(long, env = "APISIM_KUBECONFIG_OUT", value_name = "FILE")]
    kubeconfig_out: Option<PathBuf>,
    /// Default namespace written into the kubeconfig.
    #[arg(long, env = "APISIM_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Changes kept for watches; a watch from an older resourceVersion gets 410 Gone.
    #[arg(long, env = "APISIM_HISTORY", default_value_t = 10_000)]
    history: usize,
    /// Interval between BOOKMARK events on idle watches, e.g. 10s.
    #[arg(long, env = "APISIM_BOOKMARK_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    bookmark_interval: Duration,
    /// Log filter level: error, warn, info, debug, trace.
    #[arg(long, env = "APISIM_LOG", default_value = "info")]
    log: tracing::Level,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_max_level(args.log)
        .with_writer(std::io::stderr)
        .init();
    let server = ApiServer::start_with(ServerConfig {
        listen: args.listen,
        max_history: args.history,
        bookmark_interval: args.bookmark_interval,
        ..ServerConfig::default()
    })
    .await
    .with_context(|| format!("failed to listen on {}", args.listen))?;
    if let Some(path) = &args.kubeconfig_out {
        std::fs::write(path, server.kubeconfig(&args.namespace))
            .with_context(|| format!("failed to write the kubeconfig to {}", path.display()))?;
    }
    tracing::info!(url = %server.url(), kubeconfig = ?args.kubeconfig_out, "apisim serving (in-memory: state is lost on exit)");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("failed to install the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("failed to wait for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    tracing::info!("shutting down; all state is discarded");
    Ok(())
}
