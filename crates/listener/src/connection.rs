//! One connection, from its TLS handshake to its end: the protocol its share allows, requests
//! counted in its [`Activity`] (so an idle connection can be told from a busy one), and its
//! end, whichever comes first: the client's, the stop signal, an eviction, or (HTTP/2) idleness.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::LazyConfigAcceptor;
use tower::ServiceExt;

use crate::activity::{Activity, RequestGuard};
use crate::stall::StallLimit;
use crate::table::{ConnectionId, Http2};
use crate::{ALPN_H2, Limits, Shared};

/// Serves one admitted connection to its end.
pub(crate) async fn serve(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    id: ConnectionId,
    activity: Arc<Activity>,
    app: Router,
    stop: watch::Receiver<bool>,
) {
    let limits = shared.server.limits;
    // Answers go out as soon as they are written: HTTP/2 writes a response's HEADERS and DATA
    // frames apart, and Nagle's algorithm held the second for the client's delayed ACK.
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
    }
    let stream = StallLimit::new(stream, limits.write_stall);
    let Some(tls) = shared.server.tls.clone() else {
        activity.ready();
        let conn = Conn::new(peer, activity, app, limits, stop);
        return conn.http1(stream).await;
    };
    let deadline = tokio::time::Instant::now() + limits.handshake_timeout;
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    // An eviction (a connection still in its handshake may give way at capacity) ends the
    // handshake too.
    let hello = tokio::select! {
        hello = tokio::time::timeout_at(deadline, acceptor) => hello,
        _ = activity.evicted() => return,
    };
    let start = match hello {
        Err(_) => return shared.turned_away("handshake-timeout", peer.ip(), None),
        Ok(Err(e)) => {
            return shared.turned_away("handshake-failed", peer.ip(), Some(e.to_string()));
        }
        Ok(Ok(start)) => start,
    };
    let offers_h2 = start
        .client_hello()
        .alpn()
        .is_some_and(|mut offered| offered.any(|p| p == ALPN_H2));
    let http2 = offers_h2 && grant_http2(shared, id);
    let handshake = start.into_stream(tls.server_config(http2));
    let tls = tokio::select! {
        tls = tokio::time::timeout_at(deadline, handshake) => tls,
        _ = activity.evicted() => return,
    };
    let tls = match tls {
        Err(_) => return shared.turned_away("handshake-timeout", peer.ip(), None),
        Ok(Err(e)) => {
            return shared.turned_away("handshake-failed", peer.ip(), Some(e.to_string()));
        }
        Ok(Ok(tls)) => tls,
    };
    activity.ready();
    let h2 = tls.get_ref().1.alpn_protocol() == Some(ALPN_H2);
    let conn = Conn::new(peer, activity, app, limits, stop);
    if h2 {
        conn.http2(tls).await;
    } else {
        conn.http1(tls).await;
    }
}

/// Takes an HTTP/2 share for the connection, if its source and the listener have one.
fn grant_http2(shared: &Shared, id: ConnectionId) -> bool {
    let decision = shared.table().want_http2(id);
    match decision {
        Http2::Granted { evicted } => {
            if let Some((victim, why)) = evicted {
                shared.evict(&victim, why);
            }
            true
        }
        Http2::Declined(why) => {
            let metrics = &shared.server.metrics;
            metrics.http2_declined(shared.server.name, why.as_str());
            false
        }
    }
}

/// What serving a connection needs.
struct Conn {
    peer: SocketAddr,
    activity: Arc<Activity>,
    app: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
}

impl Conn {
    fn new(
        peer: SocketAddr,
        activity: Arc<Activity>,
        app: Router,
        limits: Limits,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            peer,
            activity,
            app,
            limits,
            stop,
        }
    }

    async fn http1<IO>(self, io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = service(self.peer, self.activity.clone(), self.app.clone());
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(self.limits.connection_buffer)
            .serve_connection(TokioIo::new(io), service);
        self.drive(conn, None).await;
    }

    async fn http2<IO>(self, io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let l = self.limits;
        let window = u32::try_from(l.connection_buffer).unwrap_or(u32::MAX);
        let service = service(self.peer, self.activity.clone(), self.app.clone());
        let conn = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .max_concurrent_streams(l.http2_streams)
            .max_header_list_size(l.http2_header_list)
            .initial_stream_window_size(window)
            .initial_connection_window_size(l.http2_connection_window.max(window))
            .max_send_buf_size(l.http2_send_buffer)
            .keep_alive_interval(l.http2_keep_alive)
            .keep_alive_timeout(l.http2_ping_timeout)
            .serve_connection(TokioIo::new(io), service);
        self.drive(conn, Some(l.http2_idle_timeout)).await;
    }

    /// Serves `conn` until it ends, or until the stop signal, an eviction or (with
    /// `idle_timeout`) idleness asks it to finish its requests in progress and close.
    async fn drive<C>(mut self, conn: C, idle_timeout: Option<Duration>)
    where
        C: GracefulConnection,
        C::Error: std::fmt::Display,
    {
        tokio::pin!(conn);
        let peer = self.peer;
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            // Only `true` is ever sent; a closed channel means the server is gone too.
            _ = self.stop.changed() => {}
            _ = self.activity.evicted() => {}
            () = idle_for(&self.activity, idle_timeout) => {}
        }
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(self.limits.drain, conn).await;
    }
}

/// `app`, with each request counted in the connection's `activity` and given the client's
/// address.
fn service(
    peer: SocketAddr,
    activity: Arc<Activity>,
    app: Router,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    hyper::service::service_fn(move |mut request: Request<Incoming>| {
        let guard = activity.begin();
        request.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await?;
            Ok(response.map(|body| {
                Body::new(Counted {
                    body,
                    _guard: guard,
                })
            }))
        }
    })
}

/// Resolves once the connection has had no request in progress for `timeout`; never without
/// one.
async fn idle_for(activity: &Activity, timeout: Option<Duration>) {
    let Some(timeout) = timeout else {
        return std::future::pending().await;
    };
    let mut requests = activity.requests();
    loop {
        while *requests.borrow_and_update() != 0 {
            if requests.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
        match tokio::time::timeout(timeout, requests.changed()).await {
            Err(_) => return,
            Ok(Err(_)) => return std::future::pending().await,
            Ok(Ok(())) => {}
        }
    }
}

/// An answer that counts as a request in progress until the connection has taken all of it
/// (or dropped it).
struct Counted {
    body: Body,
    _guard: RequestGuard,
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
