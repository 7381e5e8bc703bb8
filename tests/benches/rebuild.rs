//! StatefulSet pod rebuild time on real nodes: from `kubectl delete pod` to the re-created pod
//! Ready, with ipkeep (the address held and handed back) and on the same cluster without it
//! (bridge with host-local, from the CNI plugins the nodes run), in one run.
//!
//! ```sh
//! cargo bench -p ipkeep-tests --bench rebuild                      # 60 rebuilds per mode
//! IPKEEP_BENCH_REBUILDS=10 cargo bench -p ipkeep-tests --bench rebuild
//! ```
//!
//! For each mode a fresh cluster (`scripts/cluster.sh up`, two real nodes; needs root and the
//! Kubernetes build) gets a StatefulSet of two replicas (one per node, busybox that exits on
//! SIGTERM, annotated for ipkeep as `deploy/examples/statefulset.yaml` is), then its pods are
//! deleted one at a time, alternating, each timed until a pod with a new UID is Ready (polled
//! every 20 ms), and whether it has the old IP is counted. Prints the percentiles and a
//! markdown table (docs/benchmarks.md). Does nothing unless cargo passes `--bench`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use ipkeep_e2e::nodes::{RealCluster, Setup};
use ipkeep_e2e::repo_root;
use ipkeep_tests::bench::{Summary, Table, ratio};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NAMESPACE: &str = "rebuild";
const REPLICAS: usize = 2;

#[derive(Debug)]
struct Sample {
    wall: Duration,
    same_ip: bool,
}

fn ready(pod: &Pod) -> bool {
    ipkeep_e2e::objects::is_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn statefulset() -> Result<StatefulSet> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "rb", "annotations": {
            "ipkeep.dev/auto-generate-persistent-pod-state": "true",
            "ipkeep.dev/required-persistent-topology": "kubernetes.io/hostname",
            "ipkeep.dev/ip-retention": "24h",
        }},
        "spec": {
            "serviceName": "rb",
            "replicas": REPLICAS,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "rb"}},
            "template": {
                "metadata": {"labels": {"app": "rb"}, "annotations": {
                    "ipkeep.dev/ip-retention": "24h",
                    "ipkeep.dev/persistent-pod-state": "rb",
                }},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname",
                         "labelSelector": {"matchLabels": {"app": "rb"}}}]}},
                    "containers": [{
                        "name": "rb",
                        "image": "localhost/ipkeep/busybox:dev",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"],
                    }],
                },
            },
        },
    }))?)
}

async fn run_mode(client: &Client, with_ipkeep: bool, rebuilds: usize) -> Result<Vec<Sample>> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &statefulset()?)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..REPLICAS {
        let name = format!("rb-{i}");
        wait_for(
            &format!("{name} Ready"),
            Duration::from_secs(120),
            || async { Ok(pods.get_opt(&name).await?.filter(ready).map(drop)) },
        )
        .await?;
    }
    if with_ipkeep {
        let pps: Api<ipkeep_api::PersistentPodState> = Api::namespaced(client.clone(), NAMESPACE);
        wait_for("every pod recorded", Duration::from_secs(60), || async {
            let n = pps
                .get_opt("rb")
                .await?
                .and_then(|p| p.status)
                .map_or(0, |s| s.pod_states.len());
            Ok((n == REPLICAS).then_some(()))
        })
        .await?;
    }
    let mut samples = Vec::with_capacity(rebuilds);
    for i in 0..rebuilds {
        let name = format!("rb-{}", i % REPLICAS);
        let before = pods.get(&name).await?;
        let (uid, ip) = (
            before.uid().unwrap_or_default(),
            before.status.as_ref().and_then(|s| s.pod_ip.clone()),
        );
        // The kubelet removes a terminated pod's object on its 1 s sync tick, and this loop
        // deletes the next pod a fixed time after the last one came back: without a spread
        // start, every rebuild of a mode hits the tick at the same phase, and a few ms of
        // difference between the modes turns into up to a second. The pause spreads the
        // deletions evenly over the tick (golden-ratio steps over 1 s), the same in both modes.
        tokio::time::sleep(Duration::from_secs_f64((i as f64 * 0.618_034) % 1.0)).await;
        let t = Instant::now();
        pods.delete(&name, &DeleteParams::default()).await?;
        let after = wait_for(
            &format!("{name} re-created and Ready"),
            Duration::from_secs(120),
            || async {
                Ok(pods
                    .get_opt(&name)
                    .await?
                    .filter(|p| p.uid().as_deref() != Some(uid.as_str()) && ready(p)))
            },
        )
        .await?;
        let wall = t.elapsed();
        let same_ip = after.status.as_ref().and_then(|s| s.pod_ip.clone()) == ip;
        eprintln!(
            "  {:>3}/{rebuilds} {name}: {:>6.0} ms{}",
            i + 1,
            wall.as_secs_f64() * 1e3,
            if same_ip { ", same IP" } else { ", new IP" }
        );
        samples.push(Sample { wall, same_ip });
    }
    Ok(samples)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    if !nix::unistd::geteuid().is_root() {
        let msg = "SKIPPED: the rebuild benchmark needs root (real nodes)";
        if std::env::var_os("CI").is_some() {
            bail!("{msg}");
        }
        eprintln!("{msg}");
        return Ok(());
    }
    let rebuilds: usize = std::env::var("IPKEEP_BENCH_REBUILDS")
        .ok()
        .map(|v| v.parse().context("IPKEEP_BENCH_REBUILDS must be a number"))
        .transpose()?
        .unwrap_or(60);
    let work = tempfile::Builder::new()
        .prefix("ipkeep-bench-rebuild-")
        .tempdir()?;
    let mut results = Vec::new();
    for (label, with_ipkeep) in [("host-local", false), ("ipkeep", true)] {
        eprintln!(
            "== {label}: a cluster with two real nodes{}",
            if with_ipkeep {
                ", ipkeep installed"
            } else {
                ", bridge with host-local"
            }
        );
        let setup = Setup {
            repo: repo_root(),
            state: work.path().join(label),
            nodes: 2,
            kwok_nodes: 0,
            port_base: 16440,
            without_ipkeep: !with_ipkeep,
            dual_stack: false,
        };
        let cluster = RealCluster::up(&setup).await?;
        let samples = run_mode(&cluster.client(), with_ipkeep, rebuilds).await?;
        drop(cluster);
        let walls: Vec<Duration> = samples.iter().map(|s| s.wall).collect();
        let summary = Summary::of_ms(&walls).context("no rebuilds")?;
        let same_ip = samples.iter().filter(|s| s.same_ip).count();
        results.push((label, summary, same_ip));
    }
    let mut table = Table::new(&[
        "mode",
        ">rebuilds",
        ">median ms",
        ">p90 ms",
        ">p99 ms",
        ">min ms",
        ">max ms",
        ">same IP",
        ">median vs host-local",
    ]);
    let base = results.first().map(|r| r.1.median);
    for (label, s, same_ip) in &results {
        let mut row = vec![label.to_string()];
        row.extend(s.cells(&["n", "median", "p90", "p99", "min", "max"], 0));
        row.extend([format!("{same_ip}/{}", s.n), ratio(s.median, base)]);
        table.row(row);
    }
    println!("\n{table}");
    Ok(())
}
