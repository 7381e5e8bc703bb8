//! What requests may cost in memory, as one budget of bytes shared by all of them: a request
//! body is charged as its bytes arrive (never on the length it declares, which costs its
//! client nothing), and an answer from the moment it is built until it has been handed to the
//! connection. A request that cannot get its share within [`BUDGET_WAIT`] is refused (503, or
//! `Error` for `filter`), so any number of concurrent requests together hold at most the
//! budget, whatever their sizes. The arithmetic is in `docs/scheduler-ext.md`.
//!
//! The requests of one client address together hold at most a share of the budget, so that
//! one client (one pod) sending large bodies slowly cannot hold all of it; the others' requests
//! still find room.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::RequestError;

/// How long a request waits, in all, for its share of the budget before it is refused: less
/// than the callers' own timeouts (the webhook's 3 s, the extender's `httpTimeout` of 2 s).
pub const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// Answers are handed to the connection in pieces of this size, each a copy: the connection
/// never holds more than its own small write buffer of an answer whose budget was given back.
const CHUNK: usize = 16 * 1024;

/// The shared budget.
#[derive(Debug, Clone)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
    per_source: usize,
    /// The share of each client address that holds bytes now.
    sources: Arc<Mutex<HashMap<IpAddr, Arc<Semaphore>>>>,
}

impl Budget {
    /// A budget of `total` bytes (at most 4 GiB), of which one client address holds at most
    /// `per_source`.
    pub fn new(total: usize, per_source: usize) -> Self {
        let total = total.min(u32::MAX as usize);
        Self {
            bytes: Arc::new(Semaphore::new(total)),
            total,
            per_source: per_source.min(total),
            sources: Arc::default(),
        }
    }

    /// The bytes held by requests now.
    pub fn in_use(&self) -> usize {
        self.total - self.bytes.available_permits()
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The bytes held now by the requests of `source`.
    pub fn in_use_by(&self, source: IpAddr) -> usize {
        let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        sources
            .get(&source)
            .map_or(0, |share| self.per_source - share.available_permits())
    }

    /// An empty charge for one request from `source`, which may wait for budget until
    /// [`BUDGET_WAIT`] from now.
    pub fn charge(&self, source: IpAddr) -> Charge {
        let share = self
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(source)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_source)))
            .clone();
        Charge {
            budget: self.clone(),
            source,
            share,
            held: None,
            held_share: None,
            deadline: Instant::now() + BUDGET_WAIT,
        }
    }
}

/// The bytes one request holds; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Budget,
    source: IpAddr,
    share: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
    held_share: Option<OwnedSemaphorePermit>,
    deadline: Instant,
}

impl Drop for Charge {
    fn drop(&mut self) {
        drop(self.held.take());
        drop(self.held_share.take());
        // Forget the source once nothing of it is held (the table would otherwise keep every
        // address that ever sent a request).
        let mut sources = self
            .budget
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let unused = Arc::strong_count(&self.share) == 2
            && self.share.available_permits() == self.budget.per_source;
        if unused
            && sources
                .get(&self.source)
                .is_some_and(|s| Arc::ptr_eq(s, &self.share))
        {
            sources.remove(&self.source);
        }
    }
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.held
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Holds `more` bytes besides, waiting for them until the request's deadline.
    pub async fn grow(&mut self, more: usize) -> Result<(), RequestError> {
        if more == 0 {
            return Ok(());
        }
        let source_busy = || RequestError::SourceBusy {
            share: self.budget.per_source,
        };
        let busy = || RequestError::Busy {
            budget: self.budget.total,
        };
        // More than the whole share can never be granted; waiting would only block the queue.
        let n = u32::try_from(more)
            .ok()
            .filter(|_| self.bytes() + more <= self.budget.per_source)
            .ok_or_else(source_busy)?;
        // The source's share first: a client over its share waits on its own requests only.
        let share = self.share.clone().acquire_many_owned(n);
        let share = match tokio::time::timeout_at(self.deadline, share).await {
            Ok(Ok(permit)) => permit,
            // The semaphores are never closed.
            Ok(Err(_)) | Err(_) => return Err(source_busy()),
        };
        let acquire = self.budget.bytes.clone().acquire_many_owned(n);
        let permit = match tokio::time::timeout_at(self.deadline, acquire).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => return Err(busy()),
        };
        for (held, new) in [(&mut self.held, permit), (&mut self.held_share, share)] {
            match held {
                Some(held) => held.merge(new),
                None => *held = Some(new),
            }
        }
        Ok(())
    }

    /// Holds exactly `bytes`: gives back what is over, waits for what is missing.
    pub async fn resize(&mut self, bytes: usize) -> Result<(), RequestError> {
        let held = self.bytes();
        if bytes >= held {
            return self.grow(bytes - held).await;
        }
        for permit in [&mut self.held, &mut self.held_share].into_iter().flatten() {
            drop(permit.split(held - bytes));
        }
        Ok(())
    }
}

/// An answer that keeps its charge until the connection has taken all of it.
#[derive(Debug)]
pub struct ChargedBody {
    data: Bytes,
    _charge: Charge,
}

impl ChargedBody {
    /// `data`, holding `charge` (which should cover it) until it is sent or dropped.
    pub fn new(data: Vec<u8>, charge: Charge) -> Self {
        Self {
            data: Bytes::from(data),
            _charge: charge,
        }
    }

    /// As an axum body.
    pub fn into_body(self) -> axum::body::Body {
        axum::body::Body::new(self)
    }
}

impl Body for ChargedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.data.is_empty() {
            return Poll::Ready(None);
        }
        let n = this.data.len().min(CHUNK);
        // A copy, not a slice: a slice would keep the whole answer alive in the connection's
        // write queue after this body (and its charge) is gone.
        let chunk = Bytes::copy_from_slice(&this.data[..n]);
        this.data = this.data.split_off(n);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[tokio::test]
    async fn charges_share_one_budget_and_wait_at_most_the_deadline() {
        let budget = Budget::new(100, 100);
        let mut a = budget.charge(A);
        a.grow(60).await.unwrap();
        a.grow(20).await.unwrap();
        assert_eq!((a.bytes(), budget.in_use()), (80, 80));
        let mut b = budget.charge(B);
        let started = Instant::now();
        assert!(matches!(b.grow(30).await, Err(RequestError::Busy { .. })));
        assert!(started.elapsed() >= BUDGET_WAIT, "waited, then gave up");
        assert!(
            matches!(
                budget.charge(A).grow(101).await,
                Err(RequestError::SourceBusy { .. })
            ),
            "more than the whole budget is refused at once"
        );
        a.resize(10).await.unwrap();
        assert_eq!(budget.in_use(), 10);
        let mut c = budget.charge(A);
        c.grow(90).await.unwrap();
        drop((a, b, c));
        assert_eq!(budget.in_use(), 0);
        assert!(
            budget.sources.lock().unwrap().is_empty(),
            "sources forgotten"
        );
    }

    #[tokio::test]
    async fn one_source_holds_at_most_its_share_and_others_still_find_room() {
        let budget = Budget::new(100, 40);
        let mut a = budget.charge(A);
        a.grow(30).await.unwrap();
        let mut a2 = budget.charge(A);
        let started = Instant::now();
        assert!(matches!(
            a2.grow(20).await,
            Err(RequestError::SourceBusy { .. })
        ));
        assert!(
            started.elapsed() >= BUDGET_WAIT,
            "waited on its own share, then gave up"
        );
        assert_eq!(budget.in_use_by(A), 30);
        // Another client is served at once.
        let mut b = budget.charge(B);
        b.grow(40).await.unwrap();
        assert_eq!((budget.in_use(), budget.in_use_by(B)), (70, 40));
        // Giving back part of a charge gives back part of the share.
        a.resize(10).await.unwrap();
        a2.grow(30).await.unwrap();
        assert_eq!(budget.in_use_by(A), 40);
        drop((a, a2, b));
        assert_eq!(budget.in_use(), 0);
        assert!(
            budget.sources.lock().unwrap().is_empty(),
            "sources forgotten"
        );
    }

    #[tokio::test]
    async fn an_answer_holds_its_charge_until_it_is_taken() {
        let budget = Budget::new(1 << 20, 1 << 20);
        let mut charge = budget.charge(A);
        charge.grow(40_000).await.unwrap();
        let body = ChargedBody::new(vec![7; 40_000], charge);
        assert_eq!(budget.in_use(), 40_000);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 40_000);
        assert_eq!(budget.in_use(), 0);
    }
}
