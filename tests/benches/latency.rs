//! Server-side latency and throughput of the scheduler extension on this machine.
//!
//! `cargo bench -p ipkeep-tests --bench latency`
//!
//! 1. Latency, in process (router only, no sockets): a webhook call for a pinned pod; an
//!    extender `filter` with 5,000 full `Nodes` (about 3.5 KB of JSON each); the same with 5,000
//!    `NodeNames`. Reports p50/p90/p99/max.
//! 2. Webhook throughput over loopback HTTP/1.1 with keep-alive: 16 clients for 3 s against the
//!    real accept loop (`ipkeep_listener::Server`).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use ipkeep_api::PersistentPodState;
use ipkeep_scheduler_ext::cache::Caches;
use ipkeep_scheduler_ext::http::{AppState, Limits, router};
use ipkeep_scheduler_ext::metrics::Metrics;
use ipkeep_tests::bench::Summary;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tower::ServiceExt;

const REVIEW: &str =
    include_str!("../../scheduler-ext/tests/fixtures/admission-review-sts-pod-create.json");
const FILTER: &str =
    include_str!("../../scheduler-ext/tests/fixtures/extender-filter-node-names.json");
const NODES: usize = 5_000;

async fn latency(state: &AppState, name: &str, path: &str, body: &str, runs: usize) {
    let app = router(state.clone());
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs + runs / 10 {
        let request = Request::post(path)
            .body(Body::from(body.to_string()))
            .unwrap();
        let started = Instant::now();
        let response = app.clone().oneshot(request).await.unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        samples.push(started.elapsed());
        assert!(!bytes.is_empty());
    }
    let samples = samples.split_off(runs / 10); // warm-up dropped
    let s = Summary::of_ms(&samples).unwrap();
    println!(
        "{name:<42} n={runs:<6} p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms  ({} KiB request)",
        s.median,
        s.p90,
        s.p99,
        s.max,
        body.len() / 1024
    );
}

async fn throughput(state: &AppState, clients: usize, duration: Duration) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let webhook = ipkeep_listener::Server::new(
        "webhook",
        ipkeep_listener::Limits::webhook(),
        Default::default(),
    );
    let server = tokio::spawn(webhook.serve(listener, router(state.clone()), async move {
        let _ = stop_rx.await;
    }));
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            while Instant::now() < deadline {
                let request = Request::post("/mutate-pods")
                    .header("host", "bench")
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(axum::body::Bytes::from_static(
                        REVIEW.as_bytes(),
                    )))
                    .unwrap();
                let response = sender.send_request(request).await.unwrap();
                assert!(response.status().is_success());
                response.into_body().collect().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let _ = stop_tx.send(());
    server.await.unwrap();
    let n = done.load(Ordering::Relaxed);
    println!(
        "webhook throughput, loopback HTTP/1.1, {clients} keep-alive clients: {n} requests in {elapsed:.2?} = {:.0} requests/s (client and server share the 2 cores)",
        n as f64 / elapsed.as_secs_f64()
    );
}

// Nodes and a PersistentPodState as the API server returns them, in caches filled by hand (as
// scheduler-ext's own tests do): what the router reads, with no API server.

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const STS_UID: &str = "9a1f0c4e-2b7d-4e1a-8f3c-5d6e7f8a9b0c";

/// A node as the API server returns it (about 3.5 KB of JSON): zone `z<i % 3>`.
fn node_json(i: usize) -> Value {
    let name = format!("n{i}");
    let images: Vec<Value> = (0..10)
        .map(|k| json!({"names": [format!("registry.example.com/team/app-{k}@sha256:{:064x}", k * 7919 + i), format!("registry.example.com/team/app-{k}:v1.{k}.{i}")], "sizeBytes": 104857600 + k * 1000}))
        .collect();
    let condition = |t: &str, s: &str, reason: &str| json!({"type": t, "status": s, "lastHeartbeatTime": "2026-11-21T09:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z", "reason": reason, "message": format!("kubelet reports {reason}")});
    json!({
        "metadata": {
            "name": name, "uid": format!("00000000-0000-4000-8000-{i:012}"), "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                HOST: name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.2xlarge",
                "topology.kubernetes.io/region": "eu-west-1", ZONE: format!("z{}", i % 3),
                "node-role.example.com/db": "", "disk": if i.is_multiple_of(2) { "nvme" } else { "ssd" }
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"i-{i:017x}\"}}")
            }
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256), "podCIDRs": [format!("10.{}.{}.0/24", i / 256, i % 256)], "providerID": format!("aws:///eu-west-1a/i-{i:017x}")},
        "status": {
            "capacity": {"cpu": "8", "ephemeral-storage": "104845292Ki", "hugepages-2Mi": "0", "memory": "32386500Ki", "pods": "110"},
            "allocatable": {"cpu": "7910m", "ephemeral-storage": "95551679124", "hugepages-2Mi": "0", "memory": "31369668Ki", "pods": "110"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady")
            ],
            "addresses": [{"type": "InternalIP", "address": format!("172.16.{}.{}", i / 256, i % 256)}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("ec2{i:029x}"), "bootID": format!("b{i:031x}"),
                "kernelVersion": "6.1.0-27-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.33.2", "kubeProxyVersion": "v1.33.2", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images
        }
    })
}

/// PersistentPodState `db` in `prod`: required hostname, preferred zone (weight 60), a record
/// of `db-0` on `n1` (zone z1).
fn pps_json() -> Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db", "namespace": "prod", "uid": "pps-uid"},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": [HOST]},
            "preferredPersistentTopology": [{"weight": 60, "preference": {"nodeTopologyKeys": [ZONE]}}]
        },
        "status": {"targetUID": STS_UID, "podStates": {
            "db-0": {"nodeName": "n1", "nodeTopologyLabels": {HOST: "n1", ZONE: "z1"}, "podIPs": ["10.0.1.7"]}
        }}
    })
}

/// Caches holding `pps` and nodes `n0`..`n<nodes-1>`, synced.
async fn caches(pps: &[Value], nodes: usize) -> Caches {
    let (caches, mut writers) = Caches::new();
    writers.pps.apply_watcher_event(&Event::Init);
    for p in pps {
        let p: PersistentPodState = serde_json::from_value(p.clone()).unwrap();
        writers.pps.apply_watcher_event(&Event::InitApply(p));
    }
    writers.pps.apply_watcher_event(&Event::InitDone);
    writers.nodes.apply_watcher_event(&Event::Init);
    for i in 0..nodes {
        let n: Node = serde_json::from_value(node_json(i)).unwrap();
        writers.nodes.apply_watcher_event(&Event::InitApply(n));
    }
    writers.nodes.apply_watcher_event(&Event::InitDone);
    writers.pods.apply_watcher_event(&Event::Init);
    writers.pods.apply_watcher_event(&Event::InitDone);
    caches.wait_until_ready().await;
    caches
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let caches = caches(&[pps_json()], NODES).await;
        // Room for 5,000 full Nodes (about 17 MiB): the default limits are sized for
        // nodeCacheCapable: true.
        let limits = Limits {
            extender_body: 32 << 20,
            in_flight: 64 << 20,
            in_flight_per_source: 64 << 20,
            ..Limits::default()
        };
        let state = AppState::new(caches, Arc::new(Metrics::default()), limits);
        let mut names: Value = serde_json::from_str(FILTER).unwrap();
        names["NodeNames"] = json!((0..NODES).map(|i| format!("n{i}")).collect::<Vec<_>>());
        let mut full = names.clone();
        full["NodeNames"] = Value::Null;
        full["Nodes"] =
            json!({"metadata": {}, "items": (0..NODES).map(node_json).collect::<Vec<_>>()});
        println!("scheduler-ext latency, in process (router, no sockets), {NODES} nodes:");
        latency(
            &state,
            "webhook, pinned pod",
            "/mutate-pods",
            REVIEW,
            20_000,
        )
        .await;
        latency(
            &state,
            "filter, 5,000 NodeNames",
            "/filter",
            &names.to_string(),
            2_000,
        )
        .await;
        latency(
            &state,
            "prioritize, 5,000 NodeNames",
            "/prioritize",
            &names.to_string(),
            2_000,
        )
        .await;
        latency(
            &state,
            "filter, 5,000 full Nodes",
            "/filter",
            &full.to_string(),
            200,
        )
        .await;
        throughput(&state, 16, Duration::from_secs(3)).await;
    });
}
