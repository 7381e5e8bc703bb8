//! The accept loop: HTTP/2 or HTTP/1.1 over TLS (as the client's ALPN chose), HTTP/1.1 over
//! plain TCP, one task per connection, time limits on
//! TLS handshakes, request headers and answers the client stops reading, so a slow or silent
//! client only ever holds its own connection, and a graceful stop that lets requests in flight
//! finish. What connections cost is bounded too: at most [`MAX_CONNECTIONS`] are served at once
//! (more wait in the listen queue), each with at most [`CONNECTION_BUFFER`] of buffered bytes
//! per direction (over HTTP/2: flow-control windows of that size, at most [`H2_STREAMS`]
//! requests at once, [`H2_HEADER_LIST`] of headers and [`H2_SEND_BUFFER`] of answer per request,
//! [`MAX_H2_CONNECTIONS`] of them).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

use crate::tls::ALPN_H2;

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
/// HTTP/2 connections served at once (each also holds one of the [`MAX_CONNECTIONS`]). A
/// kube-apiserver or kube-scheduler needs one, and another per [`H2_STREAMS`] calls at once.
pub const MAX_H2_CONNECTIONS: usize = 16;
/// Requests one HTTP/2 connection may have open at once (the in-flight budget bounds their
/// bodies; this bounds what the streams themselves hold). A client with more to send opens
/// another connection, as kube-apiserver's does.
pub const H2_STREAMS: u32 = 64;
/// The most header bytes an HTTP/2 request may carry, decoded (kube-apiserver sends a few
/// hundred).
pub const H2_HEADER_LIST: u32 = 16 * 1024;
/// The most of its answer an HTTP/2 stream buffers (the rest waits, charged to the in-flight
/// budget). With [`H2_HEADER_LIST`], an HTTP/2 connection holds at most [`H2_STREAMS`] × 24 KiB
/// beside one [`CONNECTION_BUFFER`] window of request bodies: 1.6 MiB, 26 MiB for all.
pub const H2_SEND_BUFFER: usize = 8 * 1024;
/// How often an idle HTTP/2 connection is pinged; one that does not answer within
/// [`HANDSHAKE_TIMEOUT`] is closed.
pub const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);

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
    let h2_slots = Arc::new(Semaphore::new(MAX_H2_CONNECTIONS));
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
        let (app, acceptor, stop, h2_slots) = (
            app.clone(),
            acceptor.clone(),
            stop_rx.clone(),
            h2_slots.clone(),
        );
        // Answers go out as soon as they are written: HTTP/2 writes a response's HEADERS and
        // DATA frames apart, and Nagle's algorithm held the second for the client's delayed ACK.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
        }
        let stream = StallLimit::new(stream, WRITE_STALL_TIMEOUT);
        connections.spawn(async move {
            let _slot = slot;
            match acceptor {
                None => connection(stream, app, stop, false).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) if tls.get_ref().1.alpn_protocol() == Some(ALPN_H2) => {
                            let wait = h2_slots.acquire_owned();
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, wait).await {
                                Ok(Ok(_h2_slot)) => connection(tls, app, stop, true).await,
                                _ => tracing::warn!(
                                    %peer,
                                    "HTTP/2 connection closed: {MAX_H2_CONNECTIONS} others were open for {HANDSHAKE_TIMEOUT:?}"
                                ),
                            }
                        }
                        Ok(Ok(tls)) => connection(tls, app, stop, false).await,
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

async fn connection<IO>(io: IO, app: Router, stop: watch::Receiver<bool>, h2: bool)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (io, service) = (TokioIo::new(io), TowerToHyperService::new(app));
    if h2 {
        let window = u32::try_from(CONNECTION_BUFFER).unwrap_or(u32::MAX);
        let conn = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .max_concurrent_streams(H2_STREAMS)
            .max_header_list_size(H2_HEADER_LIST)
            .initial_stream_window_size(window)
            .initial_connection_window_size(window)
            .max_send_buf_size(H2_SEND_BUFFER)
            .keep_alive_interval(H2_KEEP_ALIVE)
            .keep_alive_timeout(HANDSHAKE_TIMEOUT)
            .serve_connection(io, service);
        until_stopped(conn, stop).await;
    } else {
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HANDSHAKE_TIMEOUT)
            .max_buf_size(CONNECTION_BUFFER)
            .serve_connection(io, service);
        until_stopped(conn, stop).await;
    }
}

/// Serves `conn` to its end, or, once the stop signal comes, lets its requests in flight finish.
async fn until_stopped<C>(conn: C, mut stop: watch::Receiver<bool>)
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
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
