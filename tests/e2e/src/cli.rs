//! `ipkeep-demo`'s flags and what each mode does: by default the story on a real cluster with
//! real nodes (scripts/cluster.sh), with `--control-plane-only` on the same control plane with
//! kwok nodes (no root), with `--kubeconfig` against another cluster. See docs/demo.md.

use std::path::PathBuf;

use crate::nodes::{RealCluster, Setup};
use crate::report::Report;
use crate::scenario::{self, Target};
use crate::{DEMO_NAMESPACE, repo_root};
use anyhow::{Context as _, Result, bail};
use clap::Parser;

/// Runs ipkeep end to end and checks that a StatefulSet pod keeps its node and its IP.
///
/// By default it starts a real Kubernetes cluster on this machine (scripts/cluster.sh up: etcd,
/// kube-apiserver, kube-controller-manager and kube-scheduler built from upstream, and --nodes
/// real nodes, each with its own containerd, kubelet and kube-proxy) and installs ipkeep there as
/// a user would (from the release bundle: its image imported into the nodes, helm install of
/// its chart). Then a 3-replica StatefulSet: restart every
/// ipkeep component and a node's kubelet and containerd, delete a pod (same node, same IP,
/// reachable from the other node), stop a node (the pod falls back and moves), scale down and
/// up, and audit every node's store against the pods. It prints a timeline and a before/after
/// table and exits non-zero if any expectation fails. Needs root and Go (to build Kubernetes
/// the first time: about 10 minutes).
///
/// --control-plane-only runs the control-plane half of the story without root: the same control
/// plane with kwok nodes (scripts/cluster.sh up --nodes 0 --kwok-nodes N; ipkeep's controller
/// and scheduler-ext as local processes). Pins, records, node loss and scaling are shown; the
/// node side (a rebuilt pod keeping its IP, node stores, agents) is not: kwok nodes run no
/// kubelet and no CNI plugin.
#[derive(Debug, Parser)]
#[command(name = "ipkeep-demo", version)]
pub struct Cli {
    /// The control-plane half of the story on kwok nodes (no root needed), not the whole story
    /// on real nodes (which needs root).
    #[arg(
        long,
        env = "IPKEEP_DEMO_CONTROL_PLANE_ONLY",
        conflicts_with = "kubeconfig"
    )]
    pub control_plane_only: bool,
    /// Leave the cluster running after the scenario, with a kubeconfig for kubectl, until
    /// `scripts/cluster.sh down --state DIR`.
    #[arg(long, env = "IPKEEP_DEMO_KEEP_RUNNING")]
    pub keep_running: bool,
    /// Run the scenario against the cluster of this kubeconfig instead (ipkeep must be
    /// installed there). It creates a namespace `ipkeep-demo-<pid>` with the example
    /// StatefulSet, deletes one of its pods and scales it; it never touches nodes. The namespace
    /// is deleted at the end unless --keep-running.
    #[arg(long, env = "IPKEEP_DEMO_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig or --control-plane-only: the StatefulSet's container image instead of the
    /// example's registry.k8s.io/pause:3.10 (for a cluster that cannot pull it).
    #[arg(long, env = "IPKEEP_DEMO_IMAGE", value_name = "IMAGE")]
    pub image: Option<String>,
    /// Nodes in the cluster, real ones or with --control-plane-only kwok ones (at least 2: a pod
    /// moves to another node when its node is lost).
    #[arg(long, env = "IPKEEP_DEMO_NODES", default_value_t = 2, value_parser = clap::value_parser!(u16).range(2..=8))]
    pub nodes: u16,
    /// The real cluster's IP families (scripts/cluster.sh --ip-family): `dual` gives every pod
    /// an IPv4 and an IPv6 address, and the story then checks that a rebuilt pod gets both back
    /// and answers on both (real nodes only).
    #[arg(long, env = "IPKEEP_DEMO_IP_FAMILY", default_value = "ipv4", value_parser = ["ipv4", "dual"])]
    pub ip_family: String,
    /// The real cluster's first port (scripts/cluster.sh --port-base).
    #[arg(long, env = "IPKEEP_DEMO_PORT_BASE", default_value_t = 16440)]
    pub port_base: u16,
    /// Where the logs, certificates, kubeconfig and node stores go (default: a new temporary
    /// directory, removed after a successful run unless --keep-running).
    #[arg(long, env = "IPKEEP_DEMO_WORK_DIR", value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// The repository (for scripts/cluster.sh and deploy/; default: where this program was
    /// built from).
    #[arg(long, env = "IPKEEP_DEMO_REPO", value_name = "DIR")]
    pub repo: Option<PathBuf>,
}

/// Runs the story where `cli` says; `Ok(false)`: an expectation failed (the report says which).
pub async fn run(cli: &Cli) -> Result<bool> {
    match &cli.kubeconfig {
        Some(path) => real_cluster(cli, path.clone()).await,
        None => this_machine(cli).await,
    }
}

/// Runs the story on `target`, finishes the report, and says whether every expectation held
/// (a step that could not be carried out is said too).
async fn tell(target: Target<'_>, namespace: &str, cli: &Cli, report: &mut Report) -> bool {
    let options = scenario::Options {
        namespace: namespace.to_string(),
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

/// The story on a cluster this program starts on this machine: with real nodes, or with
/// `--control-plane-only` with kwok nodes.
async fn this_machine(cli: &Cli) -> Result<bool> {
    let kwok = cli.control_plane_only;
    if !kwok && !nix::unistd::geteuid().is_root() {
        bail!(
            "real nodes need root (network and mount namespaces, cgroups, containerd); run as root, or pass --control-plane-only for the control-plane half of the story on kwok nodes"
        );
    }
    if kwok && cli.ip_family != "ipv4" {
        bail!(
            "--ip-family {} needs real nodes (kwok nodes run no CNI plugin)",
            cli.ip_family
        );
    }
    let (work, temp) = work_dir(cli)?;
    let repo = cli.repo.clone().unwrap_or_else(repo_root);
    let nodes = usize::from(cli.nodes);
    let mut report = Report::new(Box::new(std::io::stdout()));
    let up = if kwok {
        report.note("ipkeep's control-plane half on a real Kubernetes control plane on this machine, with kwok nodes");
        report.note(
            "NOT SHOWN here: the node side. kwok nodes run no kubelet, no containers and no CNI plugin, so ipkeep's plugin and agent do not run: a rebuilt pod keeping its IP, the node stores and the agents' releases need real nodes, and real nodes need root (run scripts/demo.sh as root)",
        );
        format!("scripts/cluster.sh up --nodes 0 --kwok-nodes {nodes}")
    } else {
        report.note("ipkeep end to end on a real Kubernetes cluster on this machine");
        format!(
            "scripts/cluster.sh up --nodes {nodes} --ip-family {}",
            cli.ip_family
        )
    };
    report.note(&format!(
        "starting it ({up}): the first run builds Kubernetes from its Go modules (about 10 minutes) and ipkeep's release build; progress below"
    ));
    let setup = Setup {
        repo,
        state: work.join("cluster"),
        nodes: if kwok { 0 } else { nodes },
        kwok_nodes: if kwok { nodes } else { 0 },
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
    let seconds = started.elapsed().as_secs_f64();
    let scheduler = if cluster.extender() {
        "kube-scheduler (with ipkeep's extender)"
    } else {
        "kube-scheduler (without ipkeep's extender)"
    };
    report.note(&if kwok {
        format!(
            "running after {seconds:.0} s: etcd, kube-apiserver, kube-controller-manager, {scheduler}, kwok;\n\
             \x20        {nodes} kwok nodes; ipkeep's controller x2 and scheduler-ext as local processes with deploy/'s RBAC"
        )
    } else {
        format!(
            "running after {seconds:.0} s: etcd, kube-apiserver, kube-controller-manager, {scheduler}, kube-proxy;\n\
             \x20        {nodes} nodes, each with containerd, kubelet, kube-proxy; ipkeep with helm install of the release bundle's chart: controller x2, scheduler-ext x2, an agent per node"
        )
    });
    report.note(&format!("state and logs: {}", setup.state.display()));
    let target = if kwok {
        Target::Kwok(&cluster)
    } else {
        Target::Nodes(&cluster)
    };
    let ok = tell(target, DEMO_NAMESPACE, cli, &mut report).await;
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
    if kwok {
        report.note(
            "\nthis was the CONTROL-PLANE HALF of the story (kwok nodes). NOT SHOWN: the node side (a rebuilt pod keeping its IP, the node stores, the agents' releases); run scripts/demo.sh as root for the whole story",
        );
    }
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
