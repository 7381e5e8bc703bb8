//! The accept loop: HTTP/1.1 over TLS or plain TCP, one task per connection, time limits on
//! TLS handshakes, request headers and answers the client stops reading, so a slow or silent
//! client only ever holds its own connection, and a graceful stop that lets requests in flight
//! finish. What connections cost is bounded too: at most [`MAX_CONNECTIONS`] are served at once
//! (more wait in the listen queue), each with at most [`CONNECTION_BUFFER`] of buffered bytes
//! per direction.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

/// How long a client has for its TLS handshake, and for its request headers.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long requests in flight get to finish after the stop signal.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may leave its answer unread before its connection is closed.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once. The API servers and kube-scheduler keep a few each.
pub const MAX_CONNECTIONS: usize = 128;
/// The most a connection buffers of what it reads, and of what it writes.
pub const CONNECTION_BUFFER: usize = 64 * 1024;

/// Serves `app` on `listener` (over TLS when `tls` is set) until `shutdown` resolves, then
/// drains the open connections.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            // The semaphore is never closed; a slot is taken before a connection is accepted.
            (accepted, slot) = async {
                let slot = slots.clone().acquire_owned().await;
                (listener.accept().await, slot)
            } => accepted.map(|a| (a, slot)),
        };
        while connections.try_join_next().is_some() {}
        let ((stream, peer), slot) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "failed to accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (app, acceptor, stop) = (app.clone(), acceptor.clone(), stop_rx.clone());
        let stream = StallLimit::new(stream, WRITE_STALL_TIMEOUT);
        connections.spawn(async move {
            let _slot = slot;
            match acceptor {
                None => connection(stream, app, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => connection(tls, app, stop).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    let _ = stop_tx.send(true);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}

async fn connection<IO>(io: IO, app: Router, mut stop: watch::Receiver<bool>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .max_buf_size(CONNECTION_BUFFER)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        // Only `true` is ever sent; a closed channel means the server is gone too.
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// A TCP stream whose writes fail once the peer has taken nothing for `limit`: a client that
/// stops reading its answer then loses its connection, and the answer (and its share of the
/// memory budget) is let go.
struct StallLimit {
    stream: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl StallLimit {
    fn new(stream: TcpStream, limit: Duration) -> Self {
        Self {
            stream,
            limit,
            stalled: None,
        }
    }

    /// Called when a write is pending: an error once it has been pending for `limit`.
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {limit:?}"),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    fn written<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Pending => self.stall(cx).map(Err),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl AsyncRead for StallLimit {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallLimit {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.written(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.written(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.written(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.written(cx, poll)
    }
}
