//! A few pods sending large request bodies slowly leave the webhook and the extender enough of
//! the memory budget for ordinary calls: the real TLS listener on loopback, attackers on their
//! own loopback addresses, and a legitimate client calling as kube-apiserver does (a new TLS
//! connection per call, answered within the webhook's 3 s or failing open).
#![allow(clippy::unwrap_used)]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ipkeep_listener::{Limits as ListenerLimits, Server};
use ipkeep_scheduler_ext::budget::Budget;
use ipkeep_scheduler_ext::http::{AppState, Limits, router};
use ipkeep_scheduler_ext::metrics::Metrics;
use ipkeep_scheduler_ext::tls::{CertFiles, ServingTls};
use rustls::pki_types::ServerName;
use support::{SERVICE, caches, pki, pps_json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

const REVIEW: &str = include_str!("fixtures/admission-review-sts-pod-create.json");
const FILTER: &str = include_str!("fixtures/extender-filter-node-names.json");
const MIB: usize = 1 << 20;
/// The webhooks' `timeoutSeconds` (deploy/scheduler-ext/webhook.yaml).
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(3);

/// Pods sending large bodies slowly: from 127.0.0.2, .3, and so on, each address with
/// `bodies` requests at once of `size` bytes.
#[derive(Debug, Clone, Copy)]
struct Attack {
    sources: u8,
    bodies: usize,
    size: usize,
}

/// The server with the default limits on a loopback port; its address, the CA (PEM) and its
/// budget.
async fn server(dir: &std::path::Path) -> (SocketAddr, String, Budget) {
    let pki = pki();
    let files = CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&files.cert, &pki.cert).unwrap();
    std::fs::write(&files.key, &pki.key).unwrap();
    let tls = ServingTls::load(files, None).unwrap();
    let metrics = Arc::new(Metrics::default());
    let state = AppState::new(
        caches(&[pps_json()], 6).await,
        metrics.clone(),
        Limits::default(),
    );
    let budget = state.budget.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new(
        "webhook",
        ListenerLimits::webhook(),
        metrics.listeners.clone(),
    )
    .with_tls(tls);
    tokio::spawn(server.serve(listener, router(state), std::future::pending()));
    (addr, pki.ca, budget)
}

/// A TLS connection from `from` trusting only `ca`, offering `alpn`.
async fn connect_from(
    from: IpAddr,
    addr: SocketAddr,
    ca: &str,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
    let mut config = ipkeep_tests::pki::client_config(ca.as_bytes(), None);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(addr).await?;
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(SERVICE).unwrap(), tcp)
        .await
}

/// One attacking request, for ever: a `POST /filter` declaring `size` bytes, all of them sent
/// but the last, then nothing until the server answers (its body timeout, or a refusal); and
/// again.
async fn hog(from: IpAddr, size: usize, addr: SocketAddr, ca: String) {
    loop {
        let Ok(tls) = connect_from(from, addr, &ca, &[b"http/1.1"]).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (mut read, mut write) = tokio::io::split(tls);
        let send = async {
            let head = format!(
                "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
            );
            write.write_all(head.as_bytes()).await?;
            let chunk = vec![b' '; 64 * 1024];
            let mut left = size - 1;
            while left > 0 {
                let n = left.min(chunk.len());
                write.write_all(&chunk[..n]).await?;
                left -= n;
            }
            write.flush().await?;
            std::future::pending::<std::io::Result<()>>().await
        };
        let mut answer = [0; 512];
        tokio::select! {
            _ = send => {}
            _ = read.read(&mut answer) => {}
        }
    }
}

/// What one legitimate call got: the HTTP status, or why there was none.
async fn call(addr: SocketAddr, ca: &str, path: &str, body: &'static str) -> Result<u16, String> {
    let local = IpAddr::from([127, 0, 0, 1]);
    let exchange = async {
        let tls = connect_from(local, addr, ca, &[b"h2", b"http/1.1"])
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = hyper::Request::post(format!("https://{SERVICE}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(axum::body::Bytes::from_static(body.as_bytes())))
            .unwrap();
        let response = if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            sender.send_request(request).await
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            sender.send_request(request).await
        }
        .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let answer = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        // The extender's refusals are 200 with `Error` set.
        let error = serde_json::from_slice::<serde_json::Value>(&answer)
            .ok()
            .and_then(|v| v.get("Error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_default();
        if error.is_empty() {
            Ok(status)
        } else {
            Err(format!("{status} with Error {error:?}"))
        }
    };
    tokio::time::timeout(WEBHOOK_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {WEBHOOK_TIMEOUT:?}")))
}

/// `attack` while a legitimate client makes `calls` calls (`/mutate-pods` reviews, every
/// fourth a `/filter`): at least 90 % of them are answered 200 within the webhook's timeout.
async fn ordinary_calls_are_answered_while(attack: Attack, calls: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca, budget) = server(dir.path()).await;
    let hogs: Vec<_> = (0..attack.sources)
        .flat_map(|i| std::iter::repeat_n(IpAddr::from([127, 0, 0, 2 + i]), attack.bodies))
        .map(|from| tokio::spawn(hog(from, attack.size, addr, ca.clone())))
        .collect();
    // The attack is in place once two thirds of the budget are held, or all the addresses can
    // hold if less.
    let sources = usize::from(attack.sources);
    let held = (sources * attack.bodies * attack.size).min(16 * MIB) - MIB;
    let deadline = Instant::now() + Duration::from_secs(10);
    while budget.in_use() < held {
        assert!(
            Instant::now() < deadline,
            "{attack:?} holds only {} bytes",
            budget.in_use()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut answers = Vec::new();
    let allowed = calls / 10;
    for i in 0..calls {
        let (path, body) = if i % 4 == 3 {
            ("/filter", FILTER)
        } else {
            ("/mutate-pods", REVIEW)
        };
        let started = Instant::now();
        let answer = call(addr, &ca, path, body).await;
        answers.push(format!("{path}: {answer:?} in {:?}", started.elapsed()));
        if answer != Ok(200) && answers.len() - ok(&answers) > allowed {
            break;
        }
        // Spread over more than the server's wait for budget (1 s), in which the attackers'
        // refused bodies come back.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let still = budget.in_use();
    for hog in hogs {
        hog.abort();
    }
    assert!(
        ok(&answers) + allowed >= calls,
        "with {attack:?}, only {} of {calls} calls were answered 200 within {WEBHOOK_TIMEOUT:?}: {answers:#?}",
        ok(&answers),
    );
    assert!(
        still >= held - 4 * MIB,
        "{attack:?} ended early: {still} bytes held after the calls"
    );
}

fn ok(answers: &[String]) -> usize {
    answers.iter().filter(|a| a.contains("Ok(200)")).count()
}

/// The 2026-11-28 review's M-2: three pods, each with two 4 MiB bodies held until the body
/// timeout, took the whole 24 MiB budget, and 14 of 16 webhook calls got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_addresses_with_slow_large_bodies_leave_room_for_ordinary_calls() {
    let attack = Attack {
        sources: 3,
        bodies: 2,
        size: 4 * MIB,
    };
    ordinary_calls_are_answered_while(attack, 20).await;
}

/// Four pods each filling their share (a quarter of the budget) exactly, with bodies that all
/// arrive and then stall, would hold all of it; the reserve still serves ordinary calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_addresses_filling_their_shares_leave_the_reserve_to_ordinary_calls() {
    let attack = Attack {
        sources: 4,
        bodies: 3,
        size: 2 * MIB,
    };
    ordinary_calls_are_answered_while(attack, 20).await;
}
