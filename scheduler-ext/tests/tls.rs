//! The accept loop over TLS as kube-apiserver and kube-scheduler use it: HTTP/2 when the client
//! offers it (kube-apiserver then sends a burst of webhook calls over one connection instead of
//! a new connection and TLS handshake for most of them), HTTP/1.1 for a client that offers
//! only that.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ipkeep_scheduler_ext::http::{AppState, Limits, router};
use ipkeep_scheduler_ext::metrics::Metrics;
use ipkeep_scheduler_ext::tls::{CertFiles, ReloadingCert};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::{SERVICE, caches, pki, pps_json};
use tokio_rustls::client::TlsStream;

const REVIEW: &str = include_str!("fixtures/admission-review-sts-pod-create.json");

/// The server on a loopback port with a fresh certificate; the port and the CA (PEM).
async fn server(dir: &std::path::Path) -> (std::net::SocketAddr, String) {
    let pki = pki();
    let files = CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&files.cert, &pki.cert).unwrap();
    std::fs::write(&files.key, &pki.key).unwrap();
    let tls = Arc::new(ReloadingCert::load(files).unwrap())
        .server_config()
        .unwrap();
    let state = AppState::new(
        caches(&[pps_json()], 6).await,
        Arc::new(Metrics::default()),
        Limits::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(ipkeep_scheduler_ext::server::serve(
        listener,
        router(state),
        Some(tls),
        std::future::pending(),
    ));
    (addr, pki.ca)
}

/// A TLS connection trusting only `ca`, offering `alpn`.
async fn connect(
    addr: std::net::SocketAddr,
    ca: &str,
    alpn: &[&[u8]],
) -> TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    // As Go's clients (kube-apiserver, kube-scheduler) do.
    tcp.set_nodelay(true).unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(SERVICE).unwrap(), tcp)
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
    let sender = h2(tls).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_and_headers_are_bounded() {
    use ipkeep_scheduler_ext::server::{H2_HEADER_LIST, MAX_H2_CONNECTIONS};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca) = server(dir.path()).await;
    let mut open = Vec::new();
    for _ in 0..MAX_H2_CONNECTIONS {
        let mut sender = h2(connect(addr, &ca, &[b"h2"]).await).await;
        let response = sender.send_request(review_request()).await.unwrap();
        assert_eq!(response.status(), 200);
        open.push(sender);
    }
    // One more waits until one of them closes.
    let mut late = h2(connect(addr, &ca, &[b"h2"]).await).await;
    let call = tokio::spawn(async move {
        late.send_request(review_request())
            .await
            .map(|r| r.status())
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !call.is_finished(),
        "a connection past {MAX_H2_CONNECTIONS} was served at once"
    );
    drop(open.pop());
    let status = tokio::time::timeout(Duration::from_secs(5), call).await;
    assert_eq!(
        status
            .expect("served once another closed")
            .unwrap()
            .unwrap(),
        200
    );

    // Headers over the limit are not served.
    let big = "x".repeat(usize::try_from(H2_HEADER_LIST).unwrap());
    let mut request = review_request();
    request
        .headers_mut()
        .insert("x-padding", big.parse().unwrap());
    let answer = open[0].send_request(request).await;
    assert!(
        answer.as_ref().map_or(true, |r| r.status() == 431),
        "a request with {H2_HEADER_LIST} bytes of one header was served: {:?}",
        answer.map(|r| r.status())
    );
    // And the connection still serves the next one.
    let response = open[0].send_request(review_request()).await.unwrap();
    assert_eq!(response.status(), 200);
}
