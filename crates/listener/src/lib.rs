//! The one HTTP(S) listener every ipkeep server runs (the scheduler extension's webhook and
//! probe ports, the controller's and the node agent's probe and metrics ports), built so that
//! nobody who can open connections to it can keep others from being served:
//!
//! - **It never stops accepting.** Each new connection is admitted or refused at once by the
//!   [`table`]: a source address gets its share ([`Shares`]), and a full listener makes room by
//!   closing a connection that has no request in progress, from the source holding the most.
//!   A refused connection is closed with a reset, costing nothing after.
//! - **What a connection may hold is short.** The TLS handshake has
//!   [`Limits::handshake_timeout`] (2 s on the webhook port), request headers
//!   [`Limits::header_timeout`], an answer the client does not read [`Limits::write_stall`]
//!   ([`stall`]), and an HTTP/2 connection with no open stream is closed after
//!   [`Limits::http2_idle_timeout`] whatever pings it exchanges.
//! - **HTTP/2 has shares of its own** (it may hold more memory); a client offering HTTP/2
//!   beyond them is offered HTTP/1.1 instead of being refused.
//! - **Everything turned away is counted** ([`ListenerMetrics`]) and summarised in the log at
//!   most every 10 s ([`report`]).
//!
//! Handlers see the client's address as axum's `ConnectInfo<SocketAddr>` (IPv4-mapped IPv6
//! addresses as IPv4), so they can share their own resources per source too. On the stop
//! signal the listener stops accepting and gives requests in progress [`Limits::drain`].

pub mod activity;
mod connection;
pub mod metrics;
pub mod nofile;
pub mod report;
pub mod stall;
pub mod table;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use crate::activity::Limit;
pub use crate::metrics::ListenerMetrics;
pub use crate::nofile::{raise_open_files_limit, raise_open_files_limit_logged};
pub use crate::table::Shares;

use crate::activity::Activity;
use crate::report::Report;
use crate::table::{Admission, ConnectionTable};

/// The TLS configurations a listener serves with, looked up for every connection (so that
/// reloaded certificates and client CAs take effect for new connections).
pub trait TlsConfigs: Send + Sync + std::fmt::Debug {
    /// The configuration for a new connection: offering HTTP/2 and HTTP/1.1 when `http2`,
    /// HTTP/1.1 only otherwise.
    fn server_config(&self, http2: bool) -> Arc<rustls::ServerConfig>;
}

/// HTTP/2's ALPN protocol name.
pub const ALPN_H2: &[u8] = b"h2";
/// HTTP/1.1's ALPN protocol name.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// A listener's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections in all and per source, HTTP/2 among them.
    pub shares: Shares,
    /// From accepting a connection to its TLS handshake's end.
    pub handshake_timeout: Duration,
    /// For a request's headers, and over HTTP/1.1 for the next request on a kept-alive
    /// connection.
    pub header_timeout: Duration,
    /// An HTTP/2 connection with no open stream this long is closed (pings do not count).
    pub http2_idle_timeout: Duration,
    /// A client that reads nothing of its answer this long loses its connection.
    pub write_stall: Duration,
    /// How long requests in progress get to finish after the stop signal.
    pub drain: Duration,
    /// The most a connection buffers of what it reads, and of what it writes.
    pub connection_buffer: usize,
    /// Requests one HTTP/2 connection may have open at once.
    pub http2_streams: u32,
    /// How many bytes of request bodies one HTTP/2 connection's peer may send before they are
    /// read (HTTP/2's connection-level flow-control window; each stream's own window is
    /// [`Self::connection_buffer`]). Each request's handler reads its body as it arrives, into
    /// the body budget, so this bounds throughput more than memory: a window no larger than a
    /// stream's lets a connection carry one request body at a time.
    pub http2_connection_window: u32,
    /// The most header bytes an HTTP/2 request may carry, decoded.
    pub http2_header_list: u32,
    /// The most of its answer an HTTP/2 stream buffers.
    pub http2_send_buffer: usize,
    /// How often an idle HTTP/2 connection is pinged.
    pub http2_keep_alive: Duration,
    /// How long a ping may go unanswered before the connection is closed (a peer that is
    /// gone without a word).
    pub http2_ping_timeout: Duration,
}

impl Limits {
    /// [`Shares::per_source`] of [`Self::webhook`] (a type a command-line flag can take).
    pub const WEBHOOK_CONNECTIONS_PER_SOURCE: u16 = 128;

    /// The scheduler extension's webhook and extender port: kube-apiserver and kube-scheduler
    /// keep a few connections each (over HTTP/2, one or two per caller), but an API server
    /// that has none open yet (it just started, or scheduler-ext did) dials one for each
    /// review waiting, before the first handshake tells it the server speaks HTTP/2: a
    /// 1,000-pod `Parallel` burst on a fresh webhook opened more than 50 at once from one
    /// address, and with a share of 32 the 21 refused reviews failed open (21 pods created
    /// unpinned). Half the listener is that address's share; what one address holds without
    /// a request in progress still gives way to other addresses when the listener is full.
    ///
    /// An API server that creates hundreds of pods at once (a StatefulSet of `Parallel` pods
    /// after a node failure) sends all their reviews to one address; Go's HTTP/2 client opens
    /// another connection whenever one has as many requests in flight as the server allows.
    /// 128 streams on each of the 4 HTTP/2 connections one address may hold carry 512 reviews
    /// at once, more than an API server's default 200 mutating requests in flight. (With 64,
    /// a 1,000-pod burst needed 8 connections: the 5th on were offered HTTP/1.1 only, the
    /// 33rd connection was refused, and the reviews it carried failed open.) A window of
    /// 1 MiB per connection lets those reviews (a few KiB each) arrive together: with 64 KiB
    /// the burst waited twice as long for its answers (170 ms against 78 ms on average).
    /// Real requests carry well under 1 KiB of headers; 8 KiB keeps the streams' headers of a
    /// connection within 1 MiB.
    pub const fn webhook() -> Self {
        Self {
            shares: Shares {
                total: 256,
                per_source: Self::WEBHOOK_CONNECTIONS_PER_SOURCE as usize,
                http2_total: 16,
                http2_per_source: 4,
            },
            handshake_timeout: Duration::from_secs(2),
            header_timeout: Duration::from_secs(10),
            http2_idle_timeout: Duration::from_secs(60),
            write_stall: Duration::from_secs(10),
            drain: Duration::from_secs(10),
            connection_buffer: 64 * 1024,
            http2_streams: 128,
            http2_connection_window: 1024 * 1024,
            http2_header_list: 8 * 1024,
            http2_send_buffer: 8 * 1024,
            http2_keep_alive: Duration::from_secs(30),
            http2_ping_timeout: Duration::from_secs(10),
        }
    }

    /// A plain-HTTP port for `/healthz`, `/readyz` and `/metrics`: the kubelet opens a
    /// connection per probe, Prometheus one per scrape. No HTTP/2.
    pub const fn probes() -> Self {
        Self {
            shares: Shares {
                total: 64,
                per_source: 8,
                http2_total: 0,
                http2_per_source: 0,
            },
            header_timeout: Duration::from_secs(5),
            drain: Duration::from_secs(5),
            ..Self::webhook()
        }
    }
}

/// One listener: its name (the `listener` label of its metrics, and in its logs), bounds,
/// TLS, and the metrics it counts into.
#[derive(Debug, Clone)]
pub struct Server {
    /// `webhook`, `probes`, `metrics`, …
    pub name: &'static str,
    /// Bounds.
    pub limits: Limits,
    /// Serve TLS (HTTP/2 and HTTP/1.1); plain HTTP/1.1 when `None`.
    pub tls: Option<Arc<dyn TlsConfigs>>,
    /// Where turned-away connections are counted.
    pub metrics: ListenerMetrics,
}

/// What every connection task of a listener shares.
#[derive(Debug)]
struct Shared {
    server: Server,
    table: Mutex<ConnectionTable>,
    report: Report,
}

impl Shared {
    fn table(&self) -> std::sync::MutexGuard<'_, ConnectionTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes `victim` (it has no request in progress) to make room, and counts it.
    fn evict(&self, victim: &Activity, why: Limit) {
        victim.evict(why);
        self.server.metrics.evicted(self.server.name, why.as_str());
    }

    fn turned_away(&self, reason: &'static str, source: std::net::IpAddr, error: Option<String>) {
        self.server.metrics.refused(self.server.name, reason);
        self.report.turned_away(reason, source, error);
    }
}

impl Server {
    /// A listener named `name` with `limits`, plain HTTP, counting into `metrics`.
    pub fn new(name: &'static str, limits: Limits, metrics: ListenerMetrics) -> Self {
        Self {
            name,
            limits,
            tls: None,
            metrics,
        }
    }

    /// The same, over TLS.
    pub fn with_tls(self, tls: Arc<dyn TlsConfigs>) -> Self {
        Self {
            tls: Some(tls),
            ..self
        }
    }

    /// Serves `app` on `listener` until `shutdown` resolves, then lets requests in progress
    /// finish (at most [`Limits::drain`]).
    pub async fn serve(
        self,
        listener: TcpListener,
        app: Router,
        shutdown: impl Future<Output = ()>,
    ) {
        let shared = Arc::new(Shared {
            table: Mutex::new(ConnectionTable::new(self.limits.shares)),
            report: Report::new(self.name, self.limits),
            server: self,
        });
        let (name, drain) = (shared.server.name, shared.server.limits.drain);
        shared.server.metrics.listening(name);
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            while connections.try_join_next().is_some() {}
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(listener = name, error = %e, "failed to accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let peer = std::net::SocketAddr::new(peer.ip().to_canonical(), peer.port());
            let activity = Arc::new(Activity::new(peer.ip()));
            let admission = shared.table().admit(activity.clone());
            match admission {
                Admission::Refused(why) => {
                    drop(stream);
                    shared.turned_away(why.as_str(), peer.ip(), None);
                }
                Admission::Admitted { id, evicted } => {
                    if let Some((victim, why)) = evicted {
                        shared.evict(&victim, why);
                    }
                    let (shared, app, stop) = (shared.clone(), app.clone(), stop_rx.clone());
                    connections.spawn(async move {
                        connection::serve(&shared, stream, peer, id, activity, app, stop).await;
                        shared.table().closed(id);
                        shared
                            .server
                            .metrics
                            .open(shared.server.name, shared.table().len());
                    });
                }
            }
            shared.server.metrics.open(name, shared.table().len());
        }
        let _ = stop_tx.send(true);
        let drained = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(drain, drained).await.is_err() {
            tracing::warn!(
                listener = name,
                "connections still open after {drain:?}; closing them"
            );
        }
    }
}
