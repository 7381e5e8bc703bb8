//! The command line ([`Args`]) and what starting from it does ([`Args::run`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser};
use ipkeep_daemon::{LogArgs, STOP_GRACE, renamed, run_until_stopped, shutdown_signal};
use ipkeep_listener::{Limits as ListenerLimits, Shares};

use crate::http::Limits;
use crate::tls::CertFiles;
use crate::{Settings, StartError, run};

/// Where the webhooks and the extender listen unless told otherwise.
const DEFAULT_WEBHOOK_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    8443,
));

/// The webhook listener's default bounds.
const WEBHOOK: ListenerLimits = ListenerLimits::webhook();

/// Pins a rebuilt StatefulSet pod to the node (or zone) its PersistentPodState recorded, so it
/// finds its local disk and, through the ipkeep CNI plugin, its old IP.
///
/// Serves a mutating admission webhook (POST /mutate-pods, AdmissionReview v1), the mutating
/// webhook that holds a StatefulSet's pods until the admission plan has their lifecycle hooks
/// (POST /mutate-persistentpodstates), the lifecycle hooks' validating webhook (POST
/// /validate-pods: pod DELETE and pods/eviction), and a
/// kube-scheduler extender (POST /filter and /prioritize, with nodeCacheCapable: true or
/// false), plus /healthz, /readyz and /metrics. See deploy/ for the webhook configurations and
/// the KubeSchedulerConfiguration extender stanza.
///
/// Finds the cluster like kubectl: $KUBECONFIG (or ~/.kube/config), else the in-cluster
/// service account. Every flag can also be set by the environment variable shown.
#[derive(Debug, Parser)]
#[command(name = "ipkeep-scheduler-ext", version)]
#[command(group(ArgGroup::new("transport").required(true).args(["tls_cert", "insecure_http"])))]
pub struct Args {
    /// Address of the webhook and extender listener [default: 0.0.0.0:8443]. Formerly --listen
    /// (IPKEEP_LISTEN), still taken in this release.
    #[arg(long, alias = "listen", env = "IPKEEP_WEBHOOK_LISTEN")]
    pub webhook_listen: Option<SocketAddr>,
    /// PEM certificate chain for HTTPS (reloaded when the file changes).
    #[arg(long, env = "IPKEEP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for HTTPS (reloaded when the file changes).
    #[arg(long, env = "IPKEEP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require a client certificate signed by a CA in this PEM file on the HTTPS listener
    /// (reloaded when the file changes): kube-apiserver presents one through its
    /// AdmissionConfiguration, kube-scheduler through the extender's tlsConfig (see
    /// docs/install.md). A client without one is refused during the TLS handshake. The plain
    /// --probe-listen port asks for none.
    #[arg(long, env = "IPKEEP_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS: for tests and local runs only (the API server calls
    /// webhooks over HTTPS).
    #[arg(long, env = "IPKEEP_INSECURE_HTTP", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub insecure_http: bool,
    /// How often the certificate files are checked for changes.
    #[arg(long, env = "IPKEEP_CERT_RELOAD_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub cert_reload_interval: Duration,
    /// Also serve /healthz, /readyz and /metrics over plain HTTP on this address (for probes
    /// and Prometheus without TLS), with an accept loop of its own and small per-client limits
    /// (8 connections per client address, 64 in all), so that nothing on the webhook port, nor
    /// one client here, keeps the kubelet's probes from being answered.
    #[arg(long, env = "IPKEEP_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,
    /// Largest AdmissionReview body accepted, in bytes (a pod of at most 3 MiB and the review
    /// around it).
    #[arg(long, env = "IPKEEP_MAX_WEBHOOK_BODY", default_value_t = Limits::default().webhook_body)]
    pub max_webhook_body: usize,
    /// Largest extender request body accepted, in bytes: a pod and up to 10,000 node names
    /// (nodeCacheCapable: true). Full Node objects take about 3 to 20 KiB each: raise it, and
    /// --max-in-flight-bytes, --max-in-flight-bytes-per-source and the memory limit with it,
    /// to use them.
    #[arg(long, env = "IPKEEP_MAX_EXTENDER_BODY", default_value_t = Limits::default().extender_body)]
    pub max_extender_body: usize,
    /// Most request and response body bytes held at once, across all requests (at least the
    /// largest body limit plus --reserved-in-flight-bytes). A request that cannot get its share
    /// within 1 s gets 503. Bytes are counted as they arrive, not as a request declares them.
    #[arg(long, env = "IPKEEP_MAX_IN_FLIGHT_BYTES", default_value_t = Limits::default().in_flight)]
    pub max_in_flight_bytes: usize,
    /// Most of --max-in-flight-bytes that the requests of one client address hold at once (at
    /// least the largest body limit), so that one client sending large bodies slowly leaves
    /// room for the others.
    #[arg(long, env = "IPKEEP_MAX_IN_FLIGHT_BYTES_PER_SOURCE", default_value_t = Limits::default().in_flight_per_source)]
    pub max_in_flight_bytes_per_source: usize,
    /// The part of --max-in-flight-bytes that only small requests may hold (those whose body
    /// and answer fit --reserved-in-flight-bytes-per-source), so that large bodies sent slowly
    /// from a few addresses cannot keep ordinary webhook and extender calls out. 0: no reserve.
    #[arg(long, env = "IPKEEP_RESERVED_IN_FLIGHT_BYTES", default_value_t = Limits::default().in_flight_reserved)]
    pub reserved_in_flight_bytes: usize,
    /// Most of --reserved-in-flight-bytes that the requests of one client address hold at once
    /// (more than 0, at most --reserved-in-flight-bytes): a request is small while it fits
    /// this, and filling the reserve takes as many addresses as it has parts of this size.
    #[arg(long, env = "IPKEEP_RESERVED_IN_FLIGHT_BYTES_PER_SOURCE", default_value_t = Limits::default().in_flight_reserved_per_source)]
    pub reserved_in_flight_bytes_per_source: usize,
    /// Connections one client address may hold on the webhook listener (of 256 in all; at
    /// most 4 of them HTTP/2, further ones are offered HTTP/1.1). A new connection beyond it
    /// takes the place of that client's oldest idle one, or is refused. Raise it if the API
    /// servers reach the webhook through one address (a proxy or konnectivity) and the log
    /// says their connections are turned away.
    #[arg(long, env = "IPKEEP_MAX_CONNECTIONS_PER_SOURCE", default_value_t = ListenerLimits::WEBHOOK_CONNECTIONS_PER_SOURCE, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub max_connections_per_source: u16,
    /// Longest wait for a whole request body; a slower client gets 408.
    #[arg(long, env = "IPKEEP_BODY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub body_timeout: Duration,
    #[command(flatten)]
    pub logs: LogArgs,
}

impl Args {
    /// Sets up logging and the API client, then serves until SIGTERM; exits the process when
    /// stopped ([`run_until_stopped`]). Returns only if it cannot start.
    pub async fn run(self) -> Result<(), StartError> {
        let Self {
            webhook_listen,
            tls_cert,
            tls_key,
            client_ca,
            insecure_http: _,
            cert_reload_interval,
            probe_listen,
            max_webhook_body,
            max_extender_body,
            max_in_flight_bytes,
            max_in_flight_bytes_per_source,
            reserved_in_flight_bytes,
            reserved_in_flight_bytes_per_source,
            max_connections_per_source,
            body_timeout,
            logs,
        } = self;
        logs.init()?;
        renamed::warn_flags(std::env::args_os(), &[("--listen", "--webhook-listen")]);
        let listen = match webhook_listen {
            Some(addr) => addr,
            None => renamed::env("IPKEEP_LISTEN", "IPKEEP_WEBHOOK_LISTEN")?
                .unwrap_or(DEFAULT_WEBHOOK_LISTEN),
        };
        let client = ipkeep_daemon::preflight::client().await?;
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(CertFiles { cert, key }),
            _ => None,
        };
        let shares = Shares {
            per_source: usize::from(max_connections_per_source),
            ..WEBHOOK.shares
        };
        let settings = Settings {
            listen,
            tls,
            client_ca,
            listener: ListenerLimits { shares, ..WEBHOOK },
            cert_reload_interval,
            probe_listen,
            limits: Limits {
                webhook_body: max_webhook_body,
                extender_body: max_extender_body,
                in_flight: max_in_flight_bytes,
                in_flight_per_source: max_in_flight_bytes_per_source,
                in_flight_reserved: reserved_in_flight_bytes,
                in_flight_reserved_per_source: reserved_in_flight_bytes_per_source,
                body_timeout,
            },
        };
        run_until_stopped(shutdown_signal(), STOP_GRACE, |stop| {
            run(client, settings, stop.requested())
        })
        .await
    }
}
