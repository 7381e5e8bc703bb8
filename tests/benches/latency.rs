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
use ipkeep_scheduler_ext::http::{AppState, Limits, router};
use ipkeep_scheduler_ext::metrics::Metrics;
use ipkeep_tests::bench::Summary;
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

// Nodes and a PersistentPodState as the API server returns them, in caches filled by hand:
// the fixtures scheduler-ext's own tests use, so the bench measures what they check.
#[path = "../../scheduler-ext/tests/support/mod.rs"]
mod support;
use support::{caches, node_json, pps_json};

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
