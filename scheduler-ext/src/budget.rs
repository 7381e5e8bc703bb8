//! What requests may cost in memory, as one budget of bytes shared by all of them: a request
//! body is charged as its bytes arrive, and an answer from the moment it is built until it has
//! been handed to the connection. A request that cannot get its share within [`BUDGET_WAIT`] is
//! refused (503, or `Error` for `filter`), so any number of concurrent requests together hold at
//! most the budget, whatever their sizes. The arithmetic is in `docs/scheduler-ext.md`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
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
}

impl Budget {
    /// A budget of `total` bytes (at most 4 GiB).
    pub fn new(total: usize) -> Self {
        let total = total.min(u32::MAX as usize);
        Self {
            bytes: Arc::new(Semaphore::new(total)),
            total,
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

    /// An empty charge for one request, which may wait for budget until [`BUDGET_WAIT`] from
    /// now.
    pub fn charge(&self) -> Charge {
        Charge {
            budget: self.clone(),
            held: None,
            deadline: Instant::now() + BUDGET_WAIT,
        }
    }
}

/// The bytes one request holds; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Budget,
    held: Option<OwnedSemaphorePermit>,
    deadline: Instant,
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
        let busy = || RequestError::Busy {
            budget: self.budget.total,
        };
        // More than the whole budget can never be granted; waiting would only block the queue.
        let n = u32::try_from(more)
            .ok()
            .filter(|_| self.bytes() + more <= self.budget.total)
            .ok_or_else(busy)?;
        let acquire = self.budget.bytes.clone().acquire_many_owned(n);
        let permit = match tokio::time::timeout_at(self.deadline, acquire).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed.
            Ok(Err(_)) | Err(_) => return Err(busy()),
        };
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        Ok(())
    }

    /// Holds exactly `bytes`: gives back what is over, waits for what is missing.
    pub async fn resize(&mut self, bytes: usize) -> Result<(), RequestError> {
        let held = self.bytes();
        if bytes >= held {
            return self.grow(bytes - held).await;
        }
        if let Some(permit) = &mut self.held {
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

    #[tokio::test]
    async fn charges_share_one_budget_and_wait_at_most_the_deadline() {
        let budget = Budget::new(100);
        let mut a = budget.charge();
        a.grow(60).await.unwrap();
        a.grow(20).await.unwrap();
        assert_eq!((a.bytes(), budget.in_use()), (80, 80));
        let mut b = budget.charge();
        let started = Instant::now();
        assert!(matches!(b.grow(30).await, Err(RequestError::Busy { .. })));
        assert!(started.elapsed() >= BUDGET_WAIT, "waited, then gave up");
        assert!(
            matches!(
                budget.charge().grow(101).await,
                Err(RequestError::Busy { .. })
            ),
            "more than the whole budget is refused at once"
        );
        a.resize(10).await.unwrap();
        assert_eq!(budget.in_use(), 10);
        let mut c = budget.charge();
        c.grow(90).await.unwrap();
        drop(a);
        drop(c);
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn an_answer_holds_its_charge_until_it_is_taken() {
        let budget = Budget::new(1 << 20);
        let mut charge = budget.charge();
        charge.grow(40_000).await.unwrap();
        let body = ChargedBody::new(vec![7; 40_000], charge);
        assert_eq!(budget.in_use(), 40_000);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 40_000);
        assert_eq!(budget.in_use(), 0);
    }
}
