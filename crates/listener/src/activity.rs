//! What one connection is doing, shared between its task and the listener's
//! [`crate::table::ConnectionTable`]: whether its handshake is done, how many of its requests
//! are in progress (a request counts from its headers until its answer has been handed to the
//! connection or dropped), and a signal that asks it to close.

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Notify, watch};

/// Which limit a connection met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Its source had its share.
    SourceLimit,
    /// The listener was full.
    Capacity,
}

impl Limit {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SourceLimit => "source-limit",
            Self::Capacity => "capacity",
        }
    }
}

/// One connection's state.
#[derive(Debug)]
pub struct Activity {
    source: IpAddr,
    ready: AtomicBool,
    requests: watch::Sender<usize>,
    evicted: Notify,
    eviction: Mutex<Option<Limit>>,
}

impl Activity {
    /// A connection from `source`, handshake not done, no request yet.
    pub fn new(source: IpAddr) -> Self {
        Self {
            source,
            ready: AtomicBool::new(false),
            requests: watch::Sender::new(0),
            evicted: Notify::new(),
            eviction: Mutex::new(None),
        }
    }

    /// The source address (IPv4-mapped IPv6 addresses as IPv4).
    pub fn source(&self) -> IpAddr {
        self.source
    }

    /// The handshake is done (TLS), or there is none (plain HTTP): from now on, a connection
    /// without a request in progress is idle.
    pub fn ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Handshake done and no request in progress: it may give way to a new connection.
    pub fn is_idle(&self) -> bool {
        self.ready.load(Ordering::Acquire) && *self.requests.borrow() == 0
    }

    /// No request in progress (an unfinished handshake included).
    pub fn is_unoccupied(&self) -> bool {
        *self.requests.borrow() == 0
    }

    /// Counts a request in progress until the guard is dropped.
    pub fn begin(self: &std::sync::Arc<Self>) -> RequestGuard {
        self.requests.send_modify(|n| *n += 1);
        RequestGuard(self.clone())
    }

    /// Watches the number of requests in progress.
    pub fn requests(&self) -> watch::Receiver<usize> {
        self.requests.subscribe()
    }

    /// Asks the connection to close, for `why`.
    pub fn evict(&self, why: Limit) {
        *self.eviction.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        // A stored permit: the connection sees it even if it was not waiting yet.
        self.evicted.notify_one();
    }

    /// Resolves when [`Self::evict`] is called; the reason.
    pub async fn evicted(&self) -> Limit {
        self.evicted.notified().await;
        self.eviction
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(Limit::Capacity)
    }
}

/// A request in progress; dropping it ends it.
#[derive(Debug)]
pub struct RequestGuard(std::sync::Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.requests.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn idle_once_ready_and_without_requests() {
        let a = Arc::new(Activity::new(IpAddr::from([10, 0, 0, 1])));
        assert!(!a.is_idle() && a.is_unoccupied(), "in its handshake");
        a.ready();
        assert!(a.is_idle());
        let first = a.begin();
        let second = a.begin();
        assert!(!a.is_idle() && !a.is_unoccupied());
        drop(first);
        assert!(!a.is_idle());
        drop(second);
        assert!(a.is_idle());
    }
}
