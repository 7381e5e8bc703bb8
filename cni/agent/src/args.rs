//! The agent's flags, and the process they describe: [`Args::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ipkeep_cni::netconf::{DEFAULT_AGENT_SOCKET, DEFAULT_DATA_DIR, parse_lock_timeout};
use ipkeep_daemon::{LogArgs, LogError, STOP_GRACE, run_until_stopped, shutdown_signal};

use crate::release::Grace;
use crate::{Settings, cniconf, run};

/// The ipkeep node agent: owns this node's ipkeep stores and serves the `ipkeep` CNI plugin
/// over a unix socket, so a plugin call skips opening the database (the plugin falls back to
/// opening it itself whenever the agent does not answer). Frees holdings nobody will use
/// again: expired ones on a timer, and at once those of pods whose PersistentPodState record
/// was pruned (scale-down), moved to another node, or deleted with its StatefulSet.
///
/// Runs on every node (DaemonSet, see deploy/agent/). Finds the cluster like kubectl:
/// $KUBECONFIG (or ~/.kube/config), else the in-cluster service account. Every flag can also be
/// set by the environment variable shown.
#[derive(Debug, Parser)]
#[command(name = "ipkeep-agent", version)]
pub struct Args {
    /// This node's name (pods are watched with spec.nodeName=NAME).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The plugins' ipam.dataDir; every network store under it is opened at start.
    #[arg(long, env = "IPKEEP_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// The unix socket the plugin connects to (its ipam.agentSocket).
    #[arg(long, env = "IPKEEP_AGENT_SOCKET", default_value = DEFAULT_AGENT_SOCKET)]
    pub socket: PathBuf,
    /// Serve /healthz, /readyz and /metrics over plain HTTP on this address. Loopback by
    /// default: with hostNetwork, any other address is reachable from every node.
    #[arg(long, env = "IPKEEP_PROBE_LISTEN", default_value = DEFAULT_PROBE_LISTEN)]
    pub probe_listen: SocketAddr,
    /// Also serve /metrics, and nothing else, over plain HTTP on this address, for Prometheus:
    /// the node's own IP (status.hostIP) and a port of its own, or the --probe-listen port
    /// (another address). With hostNetwork it is reachable from wherever the node's IP is;
    /// restrict it with a host firewall (docs/install.md, "Network policy"). Off by default.
    /// An IPv6 address may be written without brackets (`fd00::5:9464`), as `$(NODE_IP):9464`
    /// gives it.
    #[arg(long, env = "IPKEEP_METRICS_LISTEN", value_parser = parse_listen)]
    pub metrics_listen: Option<SocketAddr>,
    /// How often every store is swept (expired holdings, Kubernetes-aware release, gauges).
    #[arg(long, env = "IPKEEP_SWEEP_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,
    /// How long after a holding's last change Kubernetes' word can release it (covers a
    /// cache that is a moment behind the API server).
    #[arg(long, env = "IPKEEP_RELEASE_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub release_grace: Duration,
    /// How long after an address's last change a vanished pod counts as having lost its DEL.
    #[arg(long, env = "IPKEEP_MISSED_DEL_GRACE", default_value = "2m", value_parser = humantime::parse_duration)]
    pub missed_del_grace: Duration,
    /// The most addresses one sweep frees or re-holds on Kubernetes' word; the rest follow in
    /// later passes (a wrong view of the cluster cannot empty a node at once).
    #[arg(long, env = "IPKEEP_MAX_RELEASES_PER_PASS", default_value_t = 32)]
    pub max_releases_per_pass: usize,
    /// Longest wait for a store a falling-back plugin holds.
    #[arg(long, env = "IPKEEP_LOCK_TIMEOUT", default_value = "10s", value_parser = parse_lock_timeout)]
    pub lock_timeout: Duration,
    /// Write this node's CNI configuration list to --cni-conf-out from this template, with every
    /// IPAM range subnet "usePodCidr" ("usePodCidrIPv6") replaced by the Node's IPv4 (IPv6) pod
    /// CIDR from spec.podCIDRs; rewritten when the template or the CIDRs change.
    #[arg(long, env = "IPKEEP_CNI_CONF_TEMPLATE", requires = "cni_conf_out")]
    pub cni_conf_template: Option<PathBuf>,
    /// Where --cni-conf-template's result goes: a file in the container runtime's CNI
    /// configuration directory (for example /etc/cni/net.d/10-ipkeep.conflist).
    #[arg(long, env = "IPKEEP_CNI_CONF_OUT", requires = "cni_conf_template")]
    pub cni_conf_out: Option<PathBuf>,
    /// Serve the stores and sweep expired holdings only, without Kubernetes (no API access).
    #[arg(long, env = "IPKEEP_NO_KUBERNETES")]
    pub no_kubernetes: bool,
    /// Also stop (gracefully) when stdin reaches end of file: for supervisors and tests that
    /// hold a pipe to the agent, so it never outlives them.
    #[arg(long, hide = true)]
    pub exit_on_stdin_close: bool,
    #[command(flatten)]
    pub logs: LogArgs,
}

/// `IP:PORT`, `[IPv6]:PORT`, or an IPv6 address and its port without brackets (the port is
/// what follows the last colon).
fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let bad = || format!("{text:?} is not an address and port (IP:PORT)");
    let (ip, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::IpAddr = ip.parse().map_err(|_| bad())?;
    Ok(SocketAddr::new(ip, port.parse().map_err(|_| bad())?))
}

/// Where the probes listen unless told otherwise.
const DEFAULT_PROBE_LISTEN: &str = "127.0.0.1:9464";

/// SIGTERM/SIGINT, or with `--exit-on-stdin-close` the end of stdin, whichever comes first.
async fn shutdown(stdin_too: bool) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    if stdin_too {
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut sink);
            let _ = tx.send(());
        });
    } else {
        std::mem::forget(tx);
    }
    tokio::select! {
        () = shutdown_signal() => {}
        _ = rx => tracing::info!("stdin closed; stopping"),
    }
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--log` does not parse.
    #[error(transparent)]
    Logs(#[from] LogError),
    /// No kubeconfig and no service account.
    #[error(
        "failed to find the cluster (set KUBECONFIG, run in a pod with a service account, or pass --no-kubernetes)"
    )]
    Cluster(#[source] kube::Error),
}

impl Args {
    /// Runs the agent these flags describe until SIGTERM or SIGINT (or the end of stdin with
    /// `--exit-on-stdin-close`); it then exits the process ([`run_until_stopped`]). Returns only
    /// when the agent could not start.
    pub async fn run(self) -> Result<(), StartError> {
        let Self {
            node_name,
            data_dir,
            socket,
            probe_listen,
            metrics_listen,
            sweep_interval,
            release_grace,
            missed_del_grace,
            max_releases_per_pass,
            lock_timeout,
            cni_conf_template,
            cni_conf_out,
            no_kubernetes,
            exit_on_stdin_close,
            logs,
        } = self;
        logs.init()?;
        let client = if no_kubernetes {
            None
        } else {
            Some(
                kube::Client::try_default()
                    .await
                    .map_err(StartError::Cluster)?,
            )
        };
        let settings = Settings {
            node_name,
            data_dir,
            socket,
            probe_listen: Some(probe_listen),
            metrics_listen,
            sweep_interval,
            grace: Grace {
                release: release_grace.as_secs(),
                missed_del: missed_del_grace.as_secs(),
            },
            lock_timeout,
            max_releases: max_releases_per_pass,
            cni_conf: cni_conf_template
                .zip(cni_conf_out)
                .map(|(template, out)| cniconf::CniConf { template, out }),
        };
        run_until_stopped(shutdown(exit_on_stdin_close), STOP_GRACE, |stop| {
            run(client, settings, stop.requested())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::parse_listen;

    #[test]
    fn a_listen_address_may_be_a_bare_ipv6_address_and_port() {
        for (text, want) in [
            ("10.0.0.5:9464", Some("10.0.0.5:9464")),
            ("[fd00::5]:9464", Some("[fd00::5]:9464")),
            ("fd00::5:9464", Some("[fd00::5]:9464")),
            ("fd00::5", None),
            ("node:9464", None),
            ("10.0.0.5:99999", None),
        ] {
            let got = parse_listen(text).ok().map(|a| a.to_string());
            assert_eq!(got.as_deref(), want, "{text}");
        }
    }
}
