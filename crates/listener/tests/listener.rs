//! The listener in process, with small limits so that each bound shows in a second: an idle
//! HTTP/2 connection is closed however it pings, a full listener makes room by closing an idle
//! connection of the source holding the most, a TLS handshake that does not come is cut short,
//! and the client's address reaches the handler.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use ipkeep_listener::{Limits, ListenerMetrics, Server, Shares, TlsConfigs};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
struct Tls {
    http2: Arc<rustls::ServerConfig>,
    http1: Arc<rustls::ServerConfig>,
}

impl TlsConfigs for Tls {
    fn server_config(&self, http2: bool) -> Arc<rustls::ServerConfig> {
        if http2 {
            self.http2.clone()
        } else {
            self.http1.clone()
        }
    }
}

/// A self-signed certificate for `localhost`: the server's TLS, and the client's roots.
fn tls() -> (Arc<Tls>, rustls::RootCertStore) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = |alpn: &[&[u8]]| {
        let mut c = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
            )
            .unwrap();
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(c)
    };
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap())
        .unwrap();
    let tls = Tls {
        http2: config(&[b"h2", b"http/1.1"]),
        http1: config(&[b"http/1.1"]),
    };
    (Arc::new(tls), roots)
}

fn app() -> Router {
    Router::new().route(
        "/who",
        get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }),
    )
}

/// `server` on a loopback port; its address.
async fn serve(server: Server) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server.serve(listener, app(), std::future::pending()));
    addr
}

async fn connect_from(source: IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source, 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

/// `GET /who` over plain HTTP/1.1 on `stream`; the body, or `None` if the connection was
/// closed first.
async fn who(mut stream: TcpStream) -> Option<String> {
    stream
        .write_all(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// Whether the server closed `stream` within `within`.
async fn closed_within(stream: &mut (impl AsyncReadExt + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_however_it_pings() {
    let (tls, roots) = tls();
    let limits = Limits {
        http2_idle_timeout: Duration::from_millis(600),
        ..Limits::webhook()
    };
    let metrics = ListenerMetrics::default();
    let addr = serve(Server::new("test", limits, metrics.clone()).with_tls(tls)).await;
    let mut client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut send, mut connection) = h2::client::handshake(tls).await.unwrap();
    let mut pings = connection.ping_pong().unwrap();
    let started = Instant::now();
    let driven = tokio::spawn(connection);
    // A request first: the idle time counts from its end.
    send = send.ready().await.unwrap();
    let (answer, _) = send
        .send_request(
            http::Request::get("https://localhost/who")
                .body(())
                .unwrap(),
            true,
        )
        .unwrap();
    assert_eq!(answer.await.unwrap().status(), 200);
    // Pings every 100 ms do not keep it open.
    let pinging = async {
        while pings.ping(h2::Ping::opaque()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            _ = driven => {}
            () = pinging => {}
        }
    })
    .await;
    assert!(ended.is_ok(), "the idle connection was not closed");
    assert!(started.elapsed() >= Duration::from_millis(600));
    drop(send);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_closes_an_idle_connection_of_the_source_holding_the_most() {
    let limits = Limits {
        shares: Shares {
            total: 4,
            per_source: 3,
            http2_total: 0,
            http2_per_source: 0,
        },
        ..Limits::probes()
    };
    let metrics = ListenerMetrics::default();
    let addr = serve(Server::new("test", limits, metrics.clone())).await;
    let attacker = IpAddr::from([127, 0, 0, 1]);
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(connect_from(attacker, addr).await);
    }
    // The source's share is full: a fourth is refused.
    let mut refused = connect_from(attacker, addr).await;
    assert!(closed_within(&mut refused, Duration::from_secs(2)).await);
    // Another source takes the last place, and a third one takes the place of the oldest
    // idle connection of the first.
    let second = connect_from([127, 0, 0, 2].into(), addr).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = connect_from([127, 0, 0, 3].into(), addr).await;
    assert!(closed_within(&mut idle[0], Duration::from_secs(2)).await);
    assert_eq!(who(third).await.as_deref(), Some("127.0.0.3"));
    assert_eq!(who(second).await.as_deref(), Some("127.0.0.2"));
    let text = {
        let mut registry = prometheus_client::registry::Registry::with_prefix("x");
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    };
    assert!(
        text.contains(r#"x_connections_refused_total{listener="test",reason="source-limit"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"x_connections_evicted_total{listener="test",reason="capacity"} 1"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_that_does_not_come_is_cut_short() {
    let (tls, _) = tls();
    let limits = Limits {
        handshake_timeout: Duration::from_millis(300),
        ..Limits::webhook()
    };
    let addr = serve(Server::new("test", limits, ListenerMetrics::default()).with_tls(tls)).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(3)).await);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(250),
        "closed after {elapsed:?}"
    );
}
