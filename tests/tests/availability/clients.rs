//! Clients by source address on loopback: the attacker (127.0.0.1), the legitimate caller
//! (127.0.0.2: kube-apiserver, kube-scheduler or the kubelet) and an observer reading metrics
//! (127.0.0.3). The legitimate caller does what an API server does after its idle connection
//! was closed: a new TLS connection per request, and the webhook's 3 s timeout for all of it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::servers::SERVICE;

/// The API server's timeout for a webhook call (deploy/scheduler-ext/webhook.yaml), and the
/// kubelet's for a probe (the Deployments' timeoutSeconds).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Who connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Attacker,
    Legit,
    Observer,
}

impl Source {
    pub fn ip(self) -> IpAddr {
        match self {
            Self::Attacker => [127, 0, 0, 1].into(),
            Self::Legit => [127, 0, 0, 2].into(),
            Self::Observer => [127, 0, 0, 3].into(),
        }
    }
}

/// A TCP connection from `source` to `addr`.
pub async fn connect_from(source: Source, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.ip(), 0))?;
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A TLS connection from `source` trusting `ca`, offering `alpn`.
pub async fn tls_from(
    source: Source,
    addr: SocketAddr,
    ca: &str,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut config = ipkeep_tests::pki::client_config(ca.as_bytes(), None);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = connect_from(source, addr).await?;
    let name = ServerName::try_from(SERVICE).map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// What the API server sends: an AdmissionReview of a StatefulSet pod's CREATE.
pub const REVIEW: &str =
    include_str!("../../../scheduler-ext/tests/fixtures/admission-review-sts-pod-create.json");

fn review() -> hyper::Request<Full<Bytes>> {
    hyper::Request::post(format!("https://{SERVICE}/mutate-pods"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(REVIEW.as_bytes())))
        .expect("request")
}

/// The protocol the legitimate caller speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 only, as kube-apiserver's webhook client negotiates it.
    Http2,
    /// HTTP/1.1 only.
    Http1,
}

/// One webhook call on a new connection: whether a 200 answer with a whole body came within
/// [`CALL_TIMEOUT`].
pub async fn webhook_call(addr: SocketAddr, ca: &str, protocol: Protocol) -> bool {
    let call = async {
        let alpn: &[&[u8]] = match protocol {
            Protocol::Http2 => &[b"h2"],
            Protocol::Http1 => &[b"http/1.1"],
        };
        let tls = tls_from(Source::Legit, addr, ca, alpn).await.ok()?;
        let response = match protocol {
            Protocol::Http2 => {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                        .await
                        .ok()?;
                tokio::spawn(conn);
                sender.send_request(review()).await.ok()?
            }
            Protocol::Http1 => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .ok()?;
                tokio::spawn(conn);
                sender.send_request(review()).await.ok()?
            }
        };
        let status = response.status();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        (status == 200 && body.starts_with(b"{")).then_some(())
    };
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .ok()
        .flatten()
        .is_some()
}

/// A plain HTTP/1.1 GET with `Connection: close`, as the kubelet probes: the status and body,
/// if they came within `timeout`.
pub async fn plain_get(
    source: Source,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Option<(u16, String)> {
    let get = async {
        let mut stream = connect_from(source, addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text.get(9..12)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((status, body))
    };
    tokio::time::timeout(timeout, get).await.ok().flatten()
}

/// How many calls were answered in time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub answered: usize,
    pub total: usize,
}

impl Tally {
    pub fn all_answered(&self) -> bool {
        self.total > 0 && self.answered == self.total
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.answered, self.total)
    }
}

/// Calls `call` again and again for `window` (a pause of `pause` after each), counting the
/// answers.
pub async fn measure<F, Fut>(window: Duration, pause: Duration, mut call: F) -> Tally
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut tally = Tally::default();
    let end = Instant::now() + window;
    while Instant::now() < end {
        tally.total += 1;
        if call().await {
            tally.answered += 1;
        }
        tokio::time::sleep(pause).await;
    }
    tally
}
