//! `ipkeep-demo`: the whole system end to end on this machine: by default on a real cluster with
//! real nodes (scripts/cluster.sh), with `--simulated` on the in-memory simulation, with
//! `--kubeconfig` against another cluster. See docs/demo.md.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use ipkeep_e2e::nodes::{RealCluster, Setup};
use ipkeep_e2e::report::Report;
use ipkeep_e2e::scenario::{self, Target};
use ipkeep_e2e::system::{LocalSystem, Options, default_nodes};
use ipkeep_e2e::{DEMO_NAMESPACE, cni, netns, repo_root};

/// Runs ipkeep end to end and checks that a StatefulSet pod keeps its node and its IP.
///
/// By default it starts a real Kubernetes cluster on this machine (scripts/cluster.sh up: etcd,
/// kube-apiserver, kube-controller-manager and kube-scheduler built from upstream, and --nodes
/// real nodes, each with its own containerd, kubelet and kube-proxy) and installs ipkeep there as
/// a user would (images, kubectl apply -k deploy/). Then a 3-replica StatefulSet: restart every
/// ipkeep component and a node's kubelet and containerd, delete a pod (same node, same IP,
/// reachable from the other node), stop a node (the pod falls back and moves), scale down and
/// up, and audit every node's store against the pods. It prints a timeline and a before/after
/// table and exits non-zero if any expectation fails. Needs root and Go (to build Kubernetes
/// the first time: about 10 minutes).
///
/// --simulated runs the same story on an in-memory simulation instead (no root needed): an
/// in-memory API server, simulators for the StatefulSet controller, scheduler and kubelets, and
/// ipkeep's real binaries as processes.
#[derive(Debug, Parser)]
#[command(name = "ipkeep-demo", version)]
struct Cli {
    /// Run on the in-memory simulation, not on a real cluster (for machines where the real one
    /// cannot run: it needs root).
    #[arg(long, env = "IPKEEP_DEMO_SIMULATED", conflicts_with = "kubeconfig")]
    simulated: bool,
    /// Leave the cluster (or the simulation) running after the scenario, with a kubeconfig for
    /// kubectl. The real cluster stays until `scripts/cluster.sh down --state DIR`; the
    /// simulation until Ctrl-C.
    #[arg(long, env = "IPKEEP_DEMO_KEEP_RUNNING")]
    keep_running: bool,
    /// Run the scenario against the cluster of this kubeconfig instead (ipkeep must be
    /// installed there). It creates a namespace `ipkeep-demo-<pid>` with the example
    /// StatefulSet, deletes one of its pods and scales it; it never touches nodes. The namespace
    /// is deleted at the end unless --keep-running.
    #[arg(long, env = "IPKEEP_DEMO_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig or --simulated: the StatefulSet's container image instead of the
    /// example's registry.k8s.io/pause:3.10 (for a cluster that cannot pull it).
    #[arg(long, env = "IPKEEP_DEMO_IMAGE", value_name = "IMAGE")]
    image: Option<String>,
    /// Real nodes in the cluster (at least 2: a pod moves to another node when its node is
    /// lost).
    #[arg(long, env = "IPKEEP_DEMO_NODES", default_value_t = 2, value_parser = clap::value_parser!(u16).range(2..=8))]
    nodes: u16,
    /// The real cluster's IP families (scripts/cluster.sh --ip-family): `dual` gives every pod
    /// an IPv4 and an IPv6 address, and the story then checks that a rebuilt pod gets both back
    /// and answers on both.
    #[arg(long, env = "IPKEEP_DEMO_IP_FAMILY", default_value = "ipv4", value_parser = ["ipv4", "dual"])]
    ip_family: String,
    /// The real cluster's first port (scripts/cluster.sh --port-base).
    #[arg(long, env = "IPKEEP_DEMO_PORT_BASE", default_value_t = 16440)]
    port_base: u16,
    /// Simulation only: run only the IPAM plugin, without network namespaces, even as root.
    #[arg(long, env = "IPKEEP_DEMO_IPAM_ONLY", requires = "simulated")]
    ipam_only: bool,
    /// Simulation only: also restart every ipkeep component mid-scenario (SIGKILL once,
    /// SIGTERM once). On the real cluster they are always restarted (their pods replaced).
    #[arg(long, env = "IPKEEP_DEMO_RESTARTS")]
    restarts: bool,
    /// Where the logs, certificates, kubeconfig and node stores go (default: a new temporary
    /// directory, removed after a successful run unless --keep-running).
    #[arg(long, env = "IPKEEP_DEMO_WORK_DIR", value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Simulation only: where the ipkeep binaries are (default: next to this program).
    #[arg(long, env = "IPKEEP_DEMO_BIN_DIR", value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// The repository (for scripts/cluster.sh and deploy/; default: where this program was
    /// built from).
    #[arg(long, env = "IPKEEP_DEMO_REPO", value_name = "DIR")]
    repo: Option<PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match (&cli.kubeconfig, cli.simulated) {
        (Some(path), _) => real_cluster(&cli, path.clone()).await,
        (None, true) => local(&cli).await,
        (None, false) => real_nodes(&cli).await,
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ipkeep-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the story on `target`, finishes the report, and says whether every expectation held
/// (a step that could not be carried out is said too).
async fn tell(
    target: Target<'_>,
    namespace: &str,
    restarts: bool,
    cli: &Cli,
    report: &mut Report,
) -> bool {
    let options = scenario::Options {
        namespace: namespace.to_string(),
        restarts,
        image: cli.image.clone(),
    };
    let outcome = scenario::run(target, &options, report).await;
    report.finish();
    if let Err(e) = &outcome {
        report.note(&format!("\nthe scenario stopped: {e:#}"));
    }
    outcome.is_ok() && report.failed.is_empty()
}

/// A work directory: the one given, or a new temporary one (kept unless removed by the
/// caller's success).
fn work_dir(cli: &Cli) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    Ok(match &cli.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new().prefix("ipkeep-demo-").tempdir()?;
            (t.path().to_path_buf(), Some(t))
        }
    })
}

async fn real_nodes(cli: &Cli) -> Result<bool> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the real cluster needs root (network and mount namespaces, cgroups, containerd); run as root, or pass --simulated for the in-memory simulation"
        );
    }
    let (work, temp) = work_dir(cli)?;
    let repo = cli.repo.clone().unwrap_or_else(repo_root);
    let mut report = Report::new(Box::new(std::io::stdout()));
    report.note("ipkeep end to end on a real Kubernetes cluster on this machine");
    report.note(&format!(
        "starting it (scripts/cluster.sh up --nodes {} --ip-family {}): the first run builds Kubernetes from its Go modules (about 10 minutes) and ipkeep's release build; progress below",
        cli.nodes, cli.ip_family
    ));
    let setup = Setup {
        repo,
        state: work.join("cluster"),
        nodes: usize::from(cli.nodes),
        port_base: cli.port_base,
        without_ipkeep: false,
        dual_stack: cli.ip_family == "dual",
    };
    let started = std::time::Instant::now();
    let cluster = match RealCluster::up(&setup).await {
        Ok(c) => c.down_on_drop(!cli.keep_running),
        Err(e) => {
            if let Some(t) = temp {
                let _ = t.keep();
            }
            return Err(e);
        }
    };
    report.note(&format!(
        "running after {:.0} s: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (with ipkeep's extender), kube-proxy;\n\
         \x20        {} nodes, each with containerd, kubelet, kube-proxy; ipkeep from deploy/: controller x2, scheduler-ext x2, an agent per node",
        started.elapsed().as_secs_f64(),
        cli.nodes
    ));
    report.note(&format!("state and logs: {}", setup.state.display()));
    let ok = tell(
        Target::Nodes(&cluster),
        DEMO_NAMESPACE,
        false,
        cli,
        &mut report,
    )
    .await;
    if (!ok || cli.keep_running)
        && let Some(t) = temp
    {
        let _ = t.keep();
    }
    let mut cluster = cluster;
    if !ok {
        cluster.keep_logs();
        report.note(&format!(
            "the cluster's logs (kept): {}/logs (nodes: node-N-kubelet.log, node-N-containerd.log)",
            setup.state.display()
        ));
    }
    if cli.keep_running {
        report.note(&format!(
            "\nthe cluster keeps running:\n  export KUBECONFIG={}\n  kubectl get pods,pps -n {DEMO_NAMESPACE} -o wide\nstop it with: scripts/cluster.sh down --state {}",
            cluster.kubeconfig().display(),
            setup.state.display()
        ));
    } else {
        report.note("taking the cluster down");
    }
    drop(cluster);
    Ok(ok)
}

async fn local(cli: &Cli) -> Result<bool> {
    let bin_dir = match &cli.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("cannot tell where this program is; pass --bin-dir")?
            .to_path_buf(),
    };
    let (work_dir, temp) = self::work_dir(cli)?;
    let bridge = PathBuf::from(cni::DEBIAN_CNI_DIR).join("bridge");
    let namespaces = !cli.ipam_only && netns::can_create() && bridge.exists();
    let mut report = Report::new(Box::new(std::io::stdout()));
    report.note("ipkeep end to end on this machine, SIMULATED (--simulated): an in-memory API server and simulators stand in for Kubernetes");
    if namespaces {
        report.note(
            "network: real network namespaces; Debian's bridge plugin delegates IPAM to ipkeep",
        );
    } else {
        let why = if cli.ipam_only {
            "--ipam-only".to_string()
        } else if !nix::unistd::geteuid().is_root() {
            "not root".to_string()
        } else {
            format!(
                "{} is missing (apt-get install containernetworking-plugins)",
                bridge.display()
            )
        };
        report.note(&format!(
            "network: IPAM ONLY ({why}): the ipkeep plugin runs directly; no interfaces are created"
        ));
    }
    report.note(&format!("work directory: {}", work_dir.display()));
    let options = Options {
        bin_dir,
        work_dir: work_dir.clone(),
        namespaces,
        nodes: default_nodes(),
    };
    let mut system = LocalSystem::start(options).await?;
    report.note(
        "running: in-memory API server; simulated StatefulSet controller, scheduler, pod GC and a kubelet per node;\n\
         \x20        ipkeep-controller x2 (leader election), ipkeep-scheduler-ext (webhook + extender over HTTPS), ipkeep-agent per node",
    );
    let ok = tell(
        Target::Local(&mut system),
        DEMO_NAMESPACE,
        cli.restarts,
        cli,
        &mut report,
    )
    .await;
    if !ok || cli.keep_running {
        report.note(&format!("logs: {}", system.logs().display()));
        if let Some(t) = temp {
            let _ = t.keep();
        }
    }
    if !ok {
        report.note("the end of simulators.log:");
        let text =
            std::fs::read_to_string(system.logs().join("simulators.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        report.note(&lines[lines.len().saturating_sub(30)..].join("\n"));
    }
    if cli.keep_running {
        report.note(&format!(
            "\nthe system keeps running; in another shell:\n  export KUBECONFIG={}\n  kubectl get pods,pps -n {DEMO_NAMESPACE} -o wide\nstop it with Ctrl-C",
            system.kubeconfig().display()
        ));
        tokio::signal::ctrl_c().await?;
    }
    drop(system);
    Ok(ok)
}

async fn real_cluster(cli: &Cli, path: PathBuf) -> Result<bool> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("read the kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("use the kubeconfig")?;
    let client = kube::Client::try_from(config)?;
    let namespace = format!("ipkeep-demo-{}", std::process::id());
    let mut report = Report::new(Box::new(std::io::stdout()));
    report.note(&format!(
        "ipkeep end to end against the cluster of {} in namespace {namespace} (API only: node-level checks and node loss need a cluster this program started)",
        path.display()
    ));
    let ok = tell(
        Target::Cluster(client.clone()),
        &namespace,
        false,
        cli,
        &mut report,
    )
    .await;
    if cli.keep_running {
        report.note(&format!(
            "left namespace {namespace} in place (--keep-running)"
        ));
    } else {
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let _ = api.delete(&namespace, &Default::default()).await;
        report.note(&format!("deleted namespace {namespace}"));
    }
    Ok(ok)
}
