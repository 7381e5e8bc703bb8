//! The webhook port over TLS as kube-apiserver and kube-scheduler use it: HTTP/2 when the
//! client offers it (kube-apiserver then sends a burst of webhook calls over one connection
//! instead of a new connection and TLS handshake for most of them), HTTP/1.1 for a client that
//! offers only that or whose address has its share of HTTP/2 connections; and, with
//! `--client-ca`, only for clients with a certificate from that CA.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ipkeep_listener::{Limits as ListenerLimits, Server};
use ipkeep_scheduler_ext::http::{AppState, Limits, router};
use ipkeep_scheduler_ext::metrics::Metrics;
use ipkeep_scheduler_ext::tls::{CertFiles, ServingTls};
use ipkeep_tests::pki::client as client_pki;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::{Pki, SERVICE, caches, pki, pps_json};
use tokio_rustls::client::TlsStream;

const REVIEW: &str = include_str!("fixtures/admission-review-sts-pod-create.json");

/// The server on a loopback port with a fresh certificate (and with `client_ca`, requiring
/// client certificates from it); its address, the CA (PEM) and its metrics.
async fn server_with(
    dir: &std::path::Path,
    client_ca: Option<&str>,
) -> (SocketAddr, String, Arc<Metrics>) {
    let pki = pki();
    let files = CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&files.cert, &pki.cert).unwrap();
    std::fs::write(&files.key, &pki.key).unwrap();
    let ca_file = client_ca.map(|ca| {
        let path = dir.join("client-ca.crt");
        std::fs::write(&path, ca).unwrap();
        path
    });
    let tls = ServingTls::load(files, ca_file).unwrap();
    let metrics = Arc::new(Metrics::default());
    tokio::spawn(
        tls.clone()
            .watch(Duration::from_millis(100), metrics.clone()),
    );
    let state = AppState::new(
        caches(&[pps_json()], 6).await,
        metrics.clone(),
        Limits::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new(
        "webhook",
        ListenerLimits::webhook(),
        metrics.listeners.clone(),
    )
    .with_tls(tls);
    tokio::spawn(server.serve(listener, router(state), std::future::pending()));
    (addr, pki.ca, metrics)
}

async fn server(dir: &std::path::Path) -> (SocketAddr, String) {
    let (addr, ca, _) = server_with(dir, None).await;
    (addr, ca)
}

/// A TLS connection from `from` trusting only `ca`, offering `alpn`, presenting `client` (a
/// certificate and key) if given.
async fn try_connect_from(
    from: std::net::IpAddr,
    addr: SocketAddr,
    ca: &str,
    alpn: &[&[u8]],
    client: Option<&Pki>,
) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
    let client = client.map(|pki| (pki.cert.as_bytes(), pki.key.as_bytes()));
    let mut config = ipkeep_tests::pki::client_config(ca.as_bytes(), client);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(addr).await?;
    // As Go's clients (kube-apiserver, kube-scheduler) do.
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(SERVICE).unwrap(), tcp)
        .await
}

async fn connect(addr: SocketAddr, ca: &str, alpn: &[&[u8]]) -> TlsStream<tokio::net::TcpStream> {
    try_connect_from([127, 0, 0, 1].into(), addr, ca, alpn, None)
        .await
        .unwrap()
}

fn review_request() -> hyper::Request<Full<axum::body::Bytes>> {
    hyper::Request::post(format!("https://{SERVICE}/mutate-pods"))
        .header("content-type", "application/json")
        .body(Full::new(axum::body::Bytes::from_static(REVIEW.as_bytes())))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_serves_many_webhook_calls_at_once_over_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca) = server(dir.path()).await;
    let tls = connect(addr, &ca, &[b"h2", b"http/1.1"]).await;
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the server must offer HTTP/2 (kube-apiserver opens a connection per call otherwise)"
    );
    let mut sender = h2(tls).await;
    // One call first: until the server's SETTINGS arrive the client does not know the stream
    // limit, and streams over it are refused (REFUSED_STREAM; Go's client, kube-apiserver's,
    // retries those; hyper's does not). Seen failing 1 in ~10 runs on a busy machine.
    let first = sender.send_request(review_request()).await.unwrap();
    assert_eq!(first.status(), 200);
    first.into_body().collect().await.unwrap();
    // More calls at once than one connection's stream limit: the rest wait their turn.
    let calls = (0..100).map(|_| {
        let mut sender = sender.clone();
        tokio::spawn(async move {
            let response = sender.send_request(review_request()).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            )
        })
    });
    for call in futures::future::join_all(calls).await {
        let (status, review) = call.unwrap();
        assert_eq!(status, 200);
        assert_eq!(review["response"]["allowed"], true, "{review}");
        assert_eq!(review["response"]["patchType"], "JSONPatch", "{review}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_offering_only_http1_gets_http1() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca) = server(dir.path()).await;
    let tls = connect(addr, &ca, &[b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..3 {
        sender.ready().await.unwrap();
        let response = sender.send_request(review_request()).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
}

/// An HTTP/2 connection over `tls`; its request sender (the connection runs in a task).
async fn h2(
    tls: TlsStream<tokio::net::TcpStream>,
) -> hyper::client::conn::http2::SendRequest<Full<axum::body::Bytes>> {
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// HTTP/2 connections hold more than HTTP/1.1 ones: one client address gets a share of them
/// (others keep theirs), and past it the server offers HTTP/1.1, so the client is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_shared_out_per_client_address_and_headers_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca, metrics) = server_with(dir.path(), None).await;
    let share = ListenerLimits::webhook().shares.http2_per_source;
    let mut open = Vec::new();
    for _ in 0..share {
        let tls = connect(addr, &ca, &[b"h2", b"http/1.1"]).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        // A stream that stays open keeps the connection busy (an idle one would give way).
        let (mut body_tx, body) = futures::channel::mpsc::channel::<
            Result<hyper::body::Frame<axum::body::Bytes>, std::convert::Infallible>,
        >(1);
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let request = hyper::Request::post(format!("https://{SERVICE}/mutate-pods"))
            .body(http_body_util::StreamBody::new(body))
            .unwrap();
        let pending =
            tokio::spawn(async move { sender.send_request(request).await.map(|r| r.status()) });
        body_tx
            .try_send(Ok(hyper::body::Frame::data(
                axum::body::Bytes::from_static(b"{"),
            )))
            .unwrap();
        open.push((pending, body_tx));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The same address again: HTTP/1.1, and served.
    let tls = connect(addr, &ca, &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    assert_eq!(
        sender
            .send_request(review_request())
            .await
            .unwrap()
            .status(),
        200
    );
    // Another address still gets HTTP/2.
    let tls = try_connect_from([127, 0, 0, 2].into(), addr, &ca, &[b"h2"], None)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut other = h2(tls).await;
    assert_eq!(
        other.send_request(review_request()).await.unwrap().status(),
        200
    );
    let text = metrics.encode();
    assert!(
        text.contains(r#"ipkeep_scheduler_ext_http2_declined_total{listener="webhook",reason="source-limit"} 1"#),
        "{text}"
    );

    // Headers over the limit are not served.
    let limit = ListenerLimits::webhook().http2_header_list;
    let big = "x".repeat(usize::try_from(limit).unwrap());
    let mut request = review_request();
    request
        .headers_mut()
        .insert("x-padding", big.parse().unwrap());
    let answer = other.send_request(request).await;
    assert!(
        answer.as_ref().map_or(true, |r| r.status() == 431),
        "a request with {limit} bytes of one header was served: {:?}",
        answer.map(|r| r.status())
    );
    // And the connection still serves the next one.
    let response = other.send_request(review_request()).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(open);
}

/// With `--client-ca`, a client with a certificate from that CA is served over both
/// protocols; one without a certificate, or with another CA's, is refused in the handshake
/// and counted; a new CA file takes effect without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_from_the_client_ca_only() {
    let dir = tempfile::tempdir().unwrap();
    let apiserver = client_pki("kube-apiserver");
    let (addr, ca, metrics) = server_with(dir.path(), Some(&apiserver.ca)).await;
    let local = std::net::IpAddr::from([127, 0, 0, 1]);
    for alpn in [&[&b"h2"[..], b"http/1.1"][..], &[b"http/1.1"]] {
        let tls = try_connect_from(local, addr, &ca, alpn, Some(&apiserver))
            .await
            .unwrap();
        let status = if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
            h2(tls)
                .await
                .send_request(review_request())
                .await
                .unwrap()
                .status()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            sender
                .send_request(review_request())
                .await
                .unwrap()
                .status()
        };
        assert_eq!(status, 200);
    }
    // A client without a certificate, or with one from another CA, gets no HTTP at all.
    let stranger = client_pki("kube-apiserver");
    for client in [None, Some(&stranger)] {
        let refused = match try_connect_from(local, addr, &ca, &[b"h2"], client).await {
            // TLS 1.3: the client's handshake ends before the server has checked its
            // certificate; the server's alert comes with the first read.
            Ok(tls) => h2_handshake_fails(tls).await,
            Err(_) => true,
        };
        assert!(
            refused,
            "a client {} was served",
            if client.is_some() {
                "with another CA's certificate"
            } else {
                "without a certificate"
            }
        );
    }
    // The client may see its handshake fail before the server has counted the refusal.
    let refused = r#"ipkeep_scheduler_ext_connections_refused_total{listener="webhook",reason="handshake-failed"} 2"#;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !metrics.encode().contains(refused) {
        assert!(std::time::Instant::now() < deadline, "{}", metrics.encode());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The client CA is replaced: the new client is served, the old one refused.
    std::fs::write(dir.path().join("client-ca.crt"), &stranger.ca).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !metrics
        .encode()
        .contains(r#"file="client-ca",result="ok"} 1"#)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the client CA was not reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tls = try_connect_from(local, addr, &ca, &[b"h2"], Some(&stranger))
        .await
        .unwrap();
    assert_eq!(
        h2(tls)
            .await
            .send_request(review_request())
            .await
            .unwrap()
            .status(),
        200
    );
    let old = try_connect_from(local, addr, &ca, &[b"h2"], Some(&apiserver)).await;
    assert!(match old {
        Ok(tls) => h2_handshake_fails(tls).await,
        Err(_) => true,
    });
}

/// Whether an HTTP/2 request over `tls` fails (the server closed the connection).
async fn h2_handshake_fails(tls: TlsStream<tokio::net::TcpStream>) -> bool {
    let Ok((mut sender, conn)) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await
    else {
        return true;
    };
    tokio::spawn(conn);
    tokio::time::timeout(
        Duration::from_secs(5),
        sender.send_request(review_request()),
    )
    .await
    .map_or(true, |answer| answer.is_err())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_expiry_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, metrics) = server_with(dir.path(), None).await;
    let pem = std::fs::read(dir.path().join("tls.crt")).unwrap();
    let der = CertificateDer::pem_slice_iter(&pem)
        .next()
        .unwrap()
        .unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    let want = cert.validity().not_after.timestamp();
    let line = format!("ipkeep_scheduler_ext_certificate_expiry_timestamp_seconds {want}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !metrics.encode().contains(&line) {
        assert!(std::time::Instant::now() < deadline, "{}", metrics.encode());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
