//! Scale benchmark: N StatefulSets × M pods on K nodes in the in-memory API server, with the real
//! `ipkeep-controller` binary as a separate process (leader election on, default flags).
//!
//! `cargo bench -p ipkeep-controller --bench scale` (defaults 1000 × 10 on 100 nodes; override
//! with `IPKEEP_BENCH_STS`, `IPKEEP_BENCH_PODS`, `IPKEEP_BENCH_NODES`).
//!
//! Reports: time from "all pods Ready" to "all records written", per-pod record latency p50/p99
//! (pod Ready → record visible in a watch), the controller's peak RSS (VmHWM), and API writes
//! per recorded pod (PPS writes seen by a watch plus Events written).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use ipkeep_api::PersistentPodState;
use ipkeep_apisim::{ApiServer, ServerConfig};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{CustomResourceExt, ResourceExt};
use serde_json::json;

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (n_sts, n_pods, n_nodes) = (
        env_or("IPKEEP_BENCH_STS", 1000),
        env_or("IPKEEP_BENCH_PODS", 10),
        env_or("IPKEEP_BENCH_NODES", 100),
    );
    let total = n_sts * n_pods;
    let server = ApiServer::start_with(ServerConfig {
        max_history: 200_000,
        ..ServerConfig::default()
    })
    .await
    .unwrap();
    let client = server.client().unwrap();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &PersistentPodState::crd())
        .await
        .unwrap();
    let ns = "bench";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    stream::iter(0..n_nodes)
        .for_each_concurrent(16, |i| {
            let nodes = nodes.clone();
            async move {
                let name = format!("node-{i:03}");
                let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}}})).unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
                let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
                nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&ready)).await.unwrap();
            }
        })
        .await;

    let dir = tempfile_dir();
    let kubeconfig = format!("{dir}/kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig("default")).unwrap();
    // IPKEEP_BENCH_WRAP runs the controller under another program (a heap profiler:
    // `IPKEEP_BENCH_WRAP="heaptrack -o /tmp/controller"`); the peak RSS is then that program's.
    let binary = env!("CARGO_BIN_EXE_ipkeep-controller");
    let wrap = std::env::var("IPKEEP_BENCH_WRAP").unwrap_or_default();
    let mut argv: Vec<&str> = wrap.split_whitespace().collect();
    argv.push(binary);
    let mut controller = Command::new(argv[0])
        .args(&argv[1..])
        .env("KUBECONFIG", &kubeconfig)
        .env("IPKEEP_LISTEN", "127.0.0.1:0")
        .env("IPKEEP_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = controller.id();

    // Watch PPS: per-pod time of first appearance in a record, and the number of PPS writes.
    let first_seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let pps_writes = Arc::new(Mutex::new(0usize));
    let pps_api: Api<PersistentPodState> = Api::namespaced(client.clone(), ns);
    {
        let (first_seen, pps_writes, pps_api) =
            (first_seen.clone(), pps_writes.clone(), pps_api.clone());
        tokio::spawn(async move {
            let mut events = watcher(pps_api, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = events.try_next().await {
                if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = event {
                    *pps_writes.lock().unwrap() += 1;
                    let now = Instant::now();
                    let mut seen = first_seen.lock().unwrap();
                    for pod in p.status.iter().flat_map(|s| s.pod_states.keys()) {
                        seen.entry(pod.clone()).or_insert(now);
                    }
                }
            }
        });
    }

    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let setup = Instant::now();
    let statefulsets: Vec<StatefulSet> = stream::iter(0..n_sts)
        .map(|i| {
            let sts_api = sts_api.clone();
            async move {
                let name = format!("db{i:04}");
                let sts: StatefulSet = serde_json::from_value(json!({
                    "metadata": {"name": name, "annotations": {
                        "ipkeep.dev/auto-generate-persistent-pod-state": "true",
                        "ipkeep.dev/required-persistent-topology": "kubernetes.io/hostname",
                        "ipkeep.dev/preferred-persistent-topology": "topology.kubernetes.io/zone"}},
                    "spec": {"replicas": n_pods, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                             "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "db", "image": "postgres:17"}]}}}
                }))
                .unwrap();
                sts_api.create(&PostParams::default(), &sts).await.unwrap()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    stream::iter(statefulsets.iter().flat_map(|s| (0..n_pods).map(move |o| (s, o))))
        .enumerate()
        .for_each_concurrent(16, |(i, (sts, ordinal))| {
            let pods_api = pods_api.clone();
            async move {
                let name = format!("{}-{ordinal}", sts.name_any());
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"app": sts.name_any(), "statefulset.kubernetes.io/pod-name": name},
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts.name_any(), "uid": sts.uid().unwrap(), "controller": true}]},
                    "spec": {"nodeName": format!("node-{:03}", i % n_nodes), "containers": [{"name": "db", "image": "postgres:17"}]}
                }))
                .unwrap();
                pods_api.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .await;
    // Wait for every PPS to be generated before the pods become Ready.
    loop {
        let n = pps_api.list(&ListParams::default().limit(1)).await.unwrap();
        let count = n.metadata.remaining_item_count.unwrap_or(0) as usize + n.items.len();
        if count >= n_sts {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "setup: {n_sts} StatefulSets, {total} pods, {n_nodes} nodes, {n_sts} PPS generated in {:.1}s",
        setup.elapsed().as_secs_f64()
    );
    let writes_before = *pps_writes.lock().unwrap();

    let ready_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let start = Instant::now();
    stream::iter(statefulsets.iter().flat_map(|s| (0..n_pods).map(move |o| format!("{}-{o}", s.name_any()))).enumerate())
        .for_each_concurrent(16, |(i, name)| {
            let (pods_api, ready_at) = (pods_api.clone(), ready_at.clone());
            async move {
                let patch = json!({"status": {"phase": "Running", "podIP": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                    "podIPs": [{"ip": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)}],
                    "conditions": [{"type": "Ready", "status": "True"}]}});
                pods_api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
                ready_at.lock().unwrap().insert(name, Instant::now());
            }
        })
        .await;
    let all_ready = Instant::now();
    let deadline = all_ready + Duration::from_secs(300);
    while first_seen.lock().unwrap().len() < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = first_seen.lock().unwrap().clone();
    let last_record = seen.values().max().copied().unwrap_or(all_ready);
    let ready = ready_at.lock().unwrap().clone();
    let mut latencies: Vec<f64> = ready
        .iter()
        .filter_map(|(pod, r)| {
            seen.get(pod)
                .map(|s| s.saturating_duration_since(*r).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pps_status_writes = *pps_writes.lock().unwrap() - writes_before;
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    let _ = controller.kill();
    let _ = controller.wait();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "ipkeep-controller scale benchmark: {n_sts} StatefulSets x {n_pods} pods on {n_nodes} nodes"
    );
    println!(
        "  pods marked Ready in            {:.2} s",
        all_ready.duration_since(start).as_secs_f64()
    );
    println!("  records written                 {}/{total}", seen.len());
    println!(
        "  last Ready -> all records       {:.2} s",
        last_record
            .saturating_duration_since(all_ready)
            .as_secs_f64()
    );
    println!(
        "  per-pod record latency          p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        pct(0.50),
        pct(0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "  controller peak RSS (VmHWM)     {:.1} MiB",
        rss_kib as f64 / 1024.0
    );
    println!(
        "  PPS status writes               {pps_status_writes} ({:.3} per recorded pod)",
        pps_status_writes as f64 / seen.len().max(1) as f64
    );
    println!("  Events written (whole run)      {events}");
    println!(
        "  API writes per recorded pod     {:.3}",
        (pps_status_writes + events) as f64 / seen.len().max(1) as f64
    );
    assert_eq!(seen.len(), total, "not every pod was recorded within 300 s");
}

fn tempfile_dir() -> String {
    let dir = std::env::temp_dir().join(format!("ipkeep-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.to_string_lossy().into_owned()
}
