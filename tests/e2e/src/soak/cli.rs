//! `ipkeep-soak`'s flags, and the cluster it runs on: one it brings up itself
//! (`scripts/cluster.sh up --nodes N --ip-family F --cni-data-size 64m`, taken down after, its
//! logs kept on failure) or, with `--attach`, one already up.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::Parser;

use super::nemesis::Target;
use super::schedule::parse_kinds;
use super::{Options, run};
use crate::nodes::RealCluster;
use crate::repo_root;

/// A randomized chaos soak of ipkeep on a real-node cluster on this machine.
///
/// A workload of StatefulSets (Parallel and OrderedReady, with and without lifecycle hooks
/// answered by an operator stand-in after random delays, WhenScaled and WhenDeleted, one in a
/// namespace with the auto-generation label) scales, rolls and loses pods, while a nemesis
/// injects faults on a schedule drawn from --seed: SIGKILL of an agent, the controller leader,
/// a standby controller, a scheduler-ext; a node's kubelet and containerd restarted; a node
/// powered off and on; kube-apiserver restarted; etcd paused; a node's store file system
/// filled and freed; a node's clock stepped (skipped, with the reason: the nodes share this
/// machine's wall clock). Each fault is logged with its time.
///
/// Invariants are checked every second from the API and every node's store, and again after
/// the faults stop and the cluster settles: no two live pods share an address; a rebuilt pod
/// comes back on its node with every address (unless that node was powered off or its runtime
/// restarted); every address held has a reason; no pod is stuck not Ready past 240 s (its node
/// up); a hooked pod's deletion waits for its operator or its timeout and no longer; every
/// ipkeep component is Ready again after each fault; no component's memory trends upward.
///
/// It prints a table and writes JSON (--json). A failure prints the seed and the faults in
/// order, which reproduce the schedule. Exit status: 0 when every invariant held. Needs root
/// (real nodes) and Go (Kubernetes is built from its modules the first time). docs/soak.md.
#[derive(Debug, Parser)]
#[command(name = "ipkeep-soak", version)]
pub struct Cli {
    /// The seed of the fault schedule and the workload (default: from the clock, printed).
    #[arg(long, env = "IPKEEP_SOAK_SEED")]
    pub seed: Option<u64>,
    /// How long faults are injected (e.g. 5m, 1h); settling and the final checks come after.
    #[arg(long, env = "IPKEEP_SOAK_DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// The fault kinds: `all`, or a comma-separated list of kill-agent, kill-controller-leader,
    /// kill-controller-standby, kill-scheduler-ext, restart-runtime, power-cycle,
    /// restart-apiserver, pause-etcd, fill-store, step-clock.
    #[arg(long, env = "IPKEEP_SOAK_FAULTS", default_value = "all")]
    pub faults: String,
    /// Real nodes.
    #[arg(long, env = "IPKEEP_SOAK_NODES", default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=6))]
    pub nodes: u16,
    /// The cluster's IP families (scripts/cluster.sh --ip-family).
    #[arg(long, env = "IPKEEP_SOAK_IP_FAMILY", default_value = "ipv4", value_parser = ["ipv4", "dual"])]
    pub ip_family: String,
    /// The cluster's first port (scripts/cluster.sh --port-base).
    #[arg(long, env = "IPKEEP_SOAK_PORT_BASE", default_value_t = 16440)]
    pub port_base: u16,
    /// The cluster's state directory (default: a new temporary directory).
    #[arg(long, env = "IPKEEP_SOAK_STATE", value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Run on the cluster already up in --state (brought up with --cni-data-size), and leave it
    /// up.
    #[arg(long, requires = "state")]
    pub attach: bool,
    /// Leave the cluster it brought up running.
    #[arg(long)]
    pub keep_running: bool,
    /// Where the JSON summary goes (default: soak-SEED.json in the state directory's parent).
    #[arg(long, env = "IPKEEP_SOAK_JSON", value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Runs the soak `cli` describes; `Ok(false)` when an invariant failed.
pub async fn main(cli: &Cli) -> Result<bool> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the soak runs real nodes, which need root (network and mount namespaces, cgroups, containerd)"
        );
    }
    let kinds = parse_kinds(&cli.faults)?;
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let repo = repo_root();
    let temp = match &cli.state {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("ipkeep-soak-").tempdir()?),
    };
    let state = match (&cli.state, &temp) {
        (Some(s), _) => s.clone(),
        (None, Some(t)) => t.path().join("cluster"),
        (None, None) => unreachable!("a state directory or a temporary one"),
    };
    if !cli.attach {
        up(cli, &repo, &state).await?;
    }
    let mut cluster = RealCluster::attach(&repo, &state)
        .await?
        .down_on_drop(!cli.attach && !cli.keep_running);
    let nodes: Vec<String> = (0..cli.nodes).map(|i| format!("node-{i}")).collect();
    let target = Target {
        script: repo.join("scripts/cluster.sh"),
        state: state.clone(),
        nodes,
        client: cluster.client(),
        restarts: Default::default(),
    };
    let options = Options {
        seed,
        duration: cli.duration,
        kinds,
    };
    let summary = match run(&target, &options, &cli.ip_family).await {
        Ok(summary) => summary,
        Err(e) => {
            // A soak that stopped short (the workload never Ready, say) is diagnosed from the
            // cluster's logs as much as a failed invariant is.
            cluster.keep_logs();
            if let Some(t) = temp {
                let kept = t.keep();
                eprintln!(
                    "soak: the cluster's logs (kept): {}/cluster/logs",
                    kept.display()
                );
            }
            return Err(e);
        }
    };
    print!("{}", summary.table());
    let json = cli.json.clone().unwrap_or_else(|| {
        state
            .parent()
            .unwrap_or(&state)
            .join(format!("soak-{seed}.json"))
    });
    std::fs::write(&json, serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("write {}", json.display()))?;
    println!("JSON: {}", json.display());
    let passed = summary.passed();
    if passed {
        println!("every invariant held");
    } else {
        print!("{}", summary.reproduce());
        cluster.keep_logs();
        if let Some(t) = temp {
            let kept = t.keep();
            println!("the cluster's logs (kept): {}/cluster/logs", kept.display());
        }
    }
    Ok(passed)
}

async fn up(cli: &Cli, repo: &std::path::Path, state: &std::path::Path) -> Result<()> {
    eprintln!(
        "soak: bringing up {} real nodes ({}) in {}",
        cli.nodes,
        cli.ip_family,
        state.display()
    );
    let status = tokio::process::Command::new(repo.join("scripts/cluster.sh"))
        .arg("up")
        .args(["--nodes", &cli.nodes.to_string()])
        .args(["--ip-family", &cli.ip_family])
        .args(["--port-base", &cli.port_base.to_string()])
        .args(["--cni-data-size", "64m"])
        .arg("--state")
        .arg(state)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .await?;
    if !status.success() {
        bail!(
            "scripts/cluster.sh up failed (its output is above; logs in {}/logs)",
            state.display()
        );
    }
    Ok(())
}
