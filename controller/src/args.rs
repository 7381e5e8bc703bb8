//! The controller's command line ([`Args`]) and its start: logging, the API client, the
//! health/metrics server, then [`crate::run`] until SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ipkeep_daemon::{
    LogArgs, LogError, STOP_GRACE, identity, renamed, run_until_stopped, shutdown_signal,
};
use ipkeep_listener::{Limits, Server};

use crate::certificates::{self, CertSettings};
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
    /// probes or the process's file descriptors) [default: 0.0.0.0:8080]. Formerly --listen
    /// (IPKEEP_LISTEN), still taken in this release.
    #[arg(long, alias = "listen", env = "IPKEEP_PROBE_LISTEN")]
    probe_listen: Option<SocketAddr>,
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
    webhook: WebhookCertArgs,
    #[command(flatten)]
    logs: LogArgs,
}

/// The webhook server's certificates, kept by the controller.
#[derive(Debug, clap::Args)]
struct WebhookCertArgs {
    /// Generate and renew the webhook server's CA and serving certificate: keep them in the
    /// Secret --webhook-secret (in the controller's namespace) and put the CA in the caBundle
    /// of the webhook configurations --webhook-configurations. Renewal starts when a third of a
    /// certificate's lifetime is left; a new CA is trusted beside the old one until the old one
    /// expires. Every replica does it (writes are conflict-checked). Off: the certificates come
    /// from cert-manager or by hand (docs/install.md).
    #[arg(long, env = "IPKEEP_WEBHOOK_CERTIFICATES")]
    webhook_certificates: bool,
    /// The webhook Service: the serving certificate is for NAME.NAMESPACE.svc and
    /// NAME.NAMESPACE.svc.cluster.local.
    #[arg(
        long,
        env = "IPKEEP_WEBHOOK_SERVICE",
        default_value = "ipkeep-scheduler-ext"
    )]
    webhook_service: String,
    /// The Secret the webhook server mounts.
    #[arg(
        long,
        env = "IPKEEP_WEBHOOK_SECRET",
        default_value = "ipkeep-scheduler-ext-tls"
    )]
    webhook_secret: String,
    /// The Mutating- and ValidatingWebhookConfigurations that get the caBundle (comma-separated
    /// names; each name of either kind).
    #[arg(
        long,
        env = "IPKEEP_WEBHOOK_CONFIGURATIONS",
        default_value = "ipkeep-scheduler-ext",
        value_delimiter = ','
    )]
    webhook_configurations: Vec<String>,
    /// A new serving certificate's lifetime.
    #[arg(long, env = "IPKEEP_WEBHOOK_CERTIFICATE_VALIDITY", default_value = "365days", value_parser = humantime::parse_duration)]
    webhook_certificate_validity: Duration,
    /// A new CA's lifetime.
    #[arg(long, env = "IPKEEP_WEBHOOK_CA_VALIDITY", default_value = "3650days", value_parser = humantime::parse_duration)]
    webhook_ca_validity: Duration,
}

impl WebhookCertArgs {
    /// The certificate keeper's settings, if it runs.
    fn settings(self, namespace: &str) -> Option<CertSettings> {
        let service = &self.webhook_service;
        self.webhook_certificates.then(|| CertSettings {
            namespace: namespace.to_string(),
            secret: self.webhook_secret,
            configurations: self.webhook_configurations,
            certs: ipkeep_certs::Settings {
                dns_names: vec![
                    format!("{service}.{namespace}.svc"),
                    format!("{service}.{namespace}.svc.cluster.local"),
                ],
                ca_validity: self.webhook_ca_validity,
                cert_validity: self.webhook_certificate_validity,
            },
        })
    }
}

/// Where the probes listen unless told otherwise.
const DEFAULT_PROBE_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    8080,
));

/// Why the controller could not start (`main` prints it with its causes).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--log` or `--log-format` cannot be used.
    #[error(transparent)]
    Logs(#[from] LogError),
    /// `IPKEEP_LISTEN` (renamed `IPKEEP_PROBE_LISTEN`) does not parse.
    #[error(transparent)]
    Renamed(#[from] renamed::RenamedError),
    /// No kubeconfig and no service account.
    #[error("failed to find the cluster (set KUBECONFIG, or run in a pod with a service account)")]
    NoCluster(#[source] kube::Error),
    /// The health/metrics address cannot be bound.
    #[error("failed to listen on {addr} (--probe-listen)")]
    Listen {
        /// `--probe-listen`.
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
            probe_listen,
            no_leader_election,
            lease_namespace,
            lease_name,
            lease_duration,
            identity: given_identity,
            concurrency,
            debounce,
            webhook,
            logs,
        } = self;
        logs.init()?;
        renamed::warn_flags(std::env::args_os(), &[("--listen", "--probe-listen")]);
        let listen = match probe_listen {
            Some(addr) => addr,
            None => renamed::env("IPKEEP_LISTEN", "IPKEEP_PROBE_LISTEN")?
                .unwrap_or(DEFAULT_PROBE_LISTEN),
        };
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
        if let Some(certs) = webhook.settings(client.default_namespace()) {
            tracing::info!(secret = %certs.secret, configurations = ?certs.configurations, "keeping the webhook certificates");
            tokio::spawn(certificates::keep(client.clone(), certs, health.clone()));
        }
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
