//! `ipkeep-demo`: the whole system end to end on this machine (or, with `--kubeconfig`, the same
//! story against a real cluster where ipkeep is installed). See docs/demo.md.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser;
use ipkeep_e2e::report::Report;
use ipkeep_e2e::scenario::{self, Target};
use ipkeep_e2e::system::{LocalSystem, Options, default_nodes};
use ipkeep_e2e::{DEMO_NAMESPACE, cni, netns};

/// Runs ipkeep end to end and checks that a StatefulSet pod keeps its node and its IP.
///
/// Locally (the default) it starts an in-memory Kubernetes API server, simulators for a
/// StatefulSet controller, a scheduler (calling ipkeep's extender over HTTPS) and a kubelet per
/// node (running the real CNI plugins), plus ipkeep's real binaries as processes: two
/// controllers, the scheduler extension (called by the API server as a webhook) and an agent per
/// node. Then it deletes a pod, loses a node, scales down and up, prints a timeline and a
/// before/after table, and exits non-zero if any expectation fails.
#[derive(Debug, Parser)]
#[command(name = "ipkeep-demo", version)]
struct Cli {
    /// Leave the local system running after the scenario, with a kubeconfig for kubectl; stop
    /// it with Ctrl-C.
    #[arg(long, env = "IPKEEP_DEMO_KEEP_RUNNING")]
    keep_running: bool,
    /// Run the scenario against the real cluster of this kubeconfig instead (ipkeep must be
    /// installed there). It creates a namespace `ipkeep-demo-<pid>` with the example
    /// StatefulSet, deletes one of its pods and scales it; it never touches nodes. The namespace
    /// is deleted at the end unless --keep-running.
    #[arg(long, env = "IPKEEP_DEMO_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Run only the IPAM plugin, without network namespaces, even as root.
    #[arg(long, env = "IPKEEP_DEMO_IPAM_ONLY")]
    ipam_only: bool,
    /// Also restart every ipkeep component mid-scenario (SIGKILL once, SIGTERM once).
    #[arg(long, env = "IPKEEP_DEMO_RESTARTS")]
    restarts: bool,
    /// Where the logs, certificates, kubeconfig and node stores go (default: a new temporary
    /// directory, removed after a successful run unless --keep-running).
    #[arg(long, env = "IPKEEP_DEMO_WORK_DIR", value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Where the ipkeep binaries are (default: next to this program).
    #[arg(long, env = "IPKEEP_DEMO_BIN_DIR", value_name = "DIR")]
    bin_dir: Option<PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.kubeconfig {
        Some(path) => real_cluster(&cli, path.clone()).await,
        None => local(&cli).await,
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

async fn local(cli: &Cli) -> Result<bool> {
    let bin_dir = match &cli.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("cannot tell where this program is; pass --bin-dir")?
            .to_path_buf(),
    };
    let temp = match &cli.work_dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("ipkeep-demo-").tempdir()?),
    };
    let work_dir = cli
        .work_dir
        .clone()
        .or_else(|| temp.as_ref().map(|t| t.path().to_path_buf()))
        .context("no work directory")?;
    let bridge = PathBuf::from(cni::DEBIAN_CNI_DIR).join("bridge");
    let namespaces = !cli.ipam_only && netns::can_create() && bridge.exists();
    let mut report = Report::new(Box::new(std::io::stdout()));
    report.note("ipkeep end to end on this machine");
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
    let outcome = scenario::run(
        Target::Local(&mut system),
        &scenario::Options {
            namespace: DEMO_NAMESPACE.into(),
            restarts: cli.restarts,
        },
        &mut report,
    )
    .await;
    report.finish();
    let ok = outcome.is_ok() && report.failed.is_empty();
    if let Err(e) = &outcome {
        report.note(&format!("\nthe scenario stopped: {e:#}"));
    }
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
        "ipkeep end to end against the cluster of {} in namespace {namespace} (node-level checks and node loss are local-only)",
        path.display()
    ));
    let outcome = scenario::run(
        Target::Cluster(client.clone()),
        &scenario::Options {
            namespace: namespace.clone(),
            restarts: false,
        },
        &mut report,
    )
    .await;
    report.finish();
    if let Err(e) = &outcome {
        report.note(&format!("\nthe scenario stopped: {e:#}"));
    }
    if cli.keep_running {
        report.note(&format!(
            "left namespace {namespace} in place (--keep-running)"
        ));
    } else {
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let _ = api.delete(&namespace, &Default::default()).await;
        report.note(&format!("deleted namespace {namespace}"));
    }
    Ok(outcome.is_ok() && report.failed.is_empty())
}
