//! What requests may cost in memory, as one budget of bytes shared by all of them: a request
//! body is charged as its bytes arrive (never on the length it declares, which costs its
//! client nothing), and an answer from the moment it is built until it has been handed to the
//! connection. A request that cannot get its share within [`BUDGET_WAIT`] is refused (503, or
//! `Error` for `filter`), so any number of concurrent requests together hold at most the
//! budget, whatever their sizes. The arithmetic is in `docs/scheduler-ext.md`.
//!
//! Who may hold what:
//! - The requests of one client address together hold at most a share of the budget, so that
//!   one client (one pod) sending large bodies slowly cannot hold all of it.
//! - Part of the budget is a reserve that only small requests may hold (those whose bytes fit
//!   one address's part of the reserve), and each address at most its part. A small request
//!   takes the open part while there is room and the reserve when there is not; a larger one
//!   takes the open part only. So addresses holding large bodies fill at most the open part,
//!   and it takes as many addresses as the reserve has parts, each holding small bodies too,
//!   to leave a small request of another address no room.

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

/// How a budget is shared out, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// The whole budget (at most 4 GiB).
    pub total: usize,
    /// The most the requests of one client address hold at once, reserve included.
    pub per_source: usize,
    /// The part of [`Self::total`] only small requests may hold; 0 for none.
    pub reserved: usize,
    /// The most of [`Self::reserved`] the requests of one client address hold at once; a
    /// request is small while its bytes fit it.
    pub reserved_per_source: usize,
}

impl Sizes {
    /// The same sizes made consistent: each part at most what it is a part of.
    fn clamped(self) -> Self {
        let total = self.total.min(u32::MAX as usize);
        let reserved = self.reserved.min(total);
        Self {
            total,
            per_source: self.per_source.min(total),
            reserved,
            reserved_per_source: self.reserved_per_source.min(reserved),
        }
    }
}

/// The shared budget.
#[derive(Debug, Clone)]
pub struct Budget {
    /// The bytes any request may hold: the budget less the reserve.
    open: Arc<Semaphore>,
    /// The bytes only small requests may hold.
    reserve: Arc<Semaphore>,
    sizes: Sizes,
    /// The shares of each client address that holds bytes now.
    sources: Arc<Mutex<HashMap<IpAddr, Share>>>,
}

/// What one client address may still hold.
#[derive(Debug, Clone)]
struct Share {
    /// Of the whole budget.
    all: Arc<Semaphore>,
    /// Of the reserve.
    reserved: Arc<Semaphore>,
}

impl Budget {
    /// A budget shared out as `sizes` says (clamped so that each part is at most what it is a
    /// part of; [`crate::http::Limits::check`] refuses sizes that need clamping).
    pub fn new(sizes: Sizes) -> Self {
        let sizes = sizes.clamped();
        Self {
            open: Arc::new(Semaphore::new(sizes.total - sizes.reserved)),
            reserve: Arc::new(Semaphore::new(sizes.reserved)),
            sizes,
            sources: Arc::default(),
        }
    }

    /// The bytes held by requests now, reserve included.
    pub fn in_use(&self) -> usize {
        self.sizes.total - self.open.available_permits() - self.reserve.available_permits()
    }

    /// The bytes of the reserve held by small requests now.
    pub fn reserve_in_use(&self) -> usize {
        self.sizes.reserved - self.reserve.available_permits()
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.sizes.total
    }

    /// The bytes held now by the requests of `source`, reserve included.
    pub fn in_use_by(&self, source: IpAddr) -> usize {
        let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        sources.get(&source).map_or(0, |share| {
            self.sizes.per_source - share.all.available_permits()
        })
    }

    /// An empty charge for one request from `source`, which may wait for budget until
    /// [`BUDGET_WAIT`] from now.
    pub fn charge(&self, source: IpAddr) -> Charge {
        let share = self
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(source)
            .or_insert_with(|| Share {
                all: Arc::new(Semaphore::new(self.sizes.per_source)),
                reserved: Arc::new(Semaphore::new(self.sizes.reserved_per_source)),
            })
            .clone();
        Charge {
            budget: self.clone(),
            source,
            share,
            of_share: None,
            held: Held::Nothing,
            deadline: Instant::now() + BUDGET_WAIT,
        }
    }
}

/// Where a charge's bytes are held.
#[derive(Debug)]
enum Held {
    Nothing,
    /// In the open part.
    Open(OwnedSemaphorePermit),
    /// In the reserve, and as many in the address's part of it.
    Reserved {
        reserve: OwnedSemaphorePermit,
        part: OwnedSemaphorePermit,
    },
}

impl Held {
    fn bytes(&self) -> usize {
        match self {
            Self::Nothing => 0,
            Self::Open(permit)
            | Self::Reserved {
                reserve: permit, ..
            } => permit.num_permits(),
        }
    }

    /// `new` added: merged into what is held in the same place, or held instead (what was held
    /// elsewhere is given back: `new` covers all of it).
    fn add(&mut self, new: Held) {
        match (&mut *self, new) {
            (_, Self::Nothing) => {}
            (Self::Open(held), Self::Open(new)) => held.merge(new),
            (
                Self::Reserved { reserve, part },
                Self::Reserved {
                    reserve: more,
                    part: more_part,
                },
            ) => {
                reserve.merge(more);
                part.merge(more_part);
            }
            (held, new) => *held = new,
        }
    }

    /// Gives back `bytes` of what is held.
    fn shrink(&mut self, bytes: usize) {
        match self {
            Self::Nothing => {}
            Self::Open(permit) => drop(permit.split(bytes)),
            Self::Reserved { reserve, part } => {
                drop(reserve.split(bytes));
                drop(part.split(bytes));
            }
        }
    }
}

/// The bytes one request holds; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Budget,
    source: IpAddr,
    share: Share,
    /// Of the address's share, as many bytes as are held.
    of_share: Option<OwnedSemaphorePermit>,
    held: Held,
    deadline: Instant,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.held = Held::Nothing;
        drop(self.of_share.take());
        // Forget the source once nothing of it is held (the table would otherwise keep every
        // address that ever sent a request).
        let mut sources = self
            .budget
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let sizes = self.budget.sizes;
        let unused = Arc::strong_count(&self.share.all) == 2
            && self.share.all.available_permits() == sizes.per_source
            && self.share.reserved.available_permits() == sizes.reserved_per_source;
        if unused
            && sources
                .get(&self.source)
                .is_some_and(|s| Arc::ptr_eq(&s.all, &self.share.all))
        {
            sources.remove(&self.source);
        }
    }
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.held.bytes()
    }

    /// Holds `more` bytes besides, waiting for them until the request's deadline.
    pub async fn grow(&mut self, more: usize) -> Result<(), RequestError> {
        if more == 0 {
            return Ok(());
        }
        let sizes = self.budget.sizes;
        let source_busy = || RequestError::SourceBusy {
            share: sizes.per_source,
        };
        let want = self.bytes() + more;
        // More than the whole share can never be granted; waiting would only block the queue.
        let n = u32::try_from(more)
            .ok()
            .filter(|_| want <= sizes.per_source)
            .ok_or_else(source_busy)?;
        // The source's share first: a client over its share waits on its own requests only.
        let share = self.share.all.clone().acquire_many_owned(n);
        let share = match tokio::time::timeout_at(self.deadline, share).await {
            Ok(Ok(permit)) => permit,
            // The semaphores are never closed.
            Ok(Err(_)) | Err(_) => return Err(source_busy()),
        };
        let placed = self.place(want).await?;
        self.held.add(placed);
        match &mut self.of_share {
            Some(held) => held.merge(share),
            None => self.of_share = Some(share),
        }
        Ok(())
    }

    /// Permits for the request to hold `want` bytes in all: more of the open part (all of
    /// `want` if the request is in the reserve now, which it then leaves), or, while `want` is
    /// small, more of the reserve (all of `want` if it is in the open part now). The open part
    /// is taken when it has room; the reserve only when it has not, and is waited for with it.
    async fn place(&self, want: usize) -> Result<Held, RequestError> {
        let sizes = self.budget.sizes;
        let held = self.bytes();
        let in_reserve = matches!(self.held, Held::Reserved { .. });
        let open_n = if in_reserve { want } else { want - held };
        let reserve_n = (want <= sizes.reserved_per_source)
            .then(|| if in_reserve { want - held } else { want });
        // Both are at most the share, which fits a u32 (checked by `grow`).
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let open = self.budget.open.clone();
        let reserve = self.budget.reserve.clone();
        let part = self.share.reserved.clone();
        if let Ok(permit) = open.clone().try_acquire_many_owned(count(open_n)) {
            return Ok(Held::Open(permit));
        }
        let Some(reserve_n) = reserve_n.map(count) else {
            let wait = open.acquire_many_owned(count(open_n));
            return match tokio::time::timeout_at(self.deadline, wait).await {
                Ok(Ok(permit)) => Ok(Held::Open(permit)),
                Ok(Err(_)) | Err(_) => Err(self.busy()),
            };
        };
        // The address's part first, as for its share: its own requests are all it waits on.
        let reserved = async move {
            let part = part.acquire_many_owned(reserve_n).await?;
            let reserve = reserve.acquire_many_owned(reserve_n).await?;
            Ok::<_, tokio::sync::AcquireError>(Held::Reserved { reserve, part })
        };
        let either = async {
            tokio::select! {
                // The open part when both have room: the reserve is kept for when it has not.
                biased;
                permit = open.acquire_many_owned(count(open_n)) => permit.map(Held::Open),
                held = reserved => held,
            }
        };
        // Whichever loses is dropped, and gives back what it had been granted so far.
        match tokio::time::timeout_at(self.deadline, either).await {
            Ok(Ok(held)) => Ok(held),
            Ok(Err(_)) | Err(_) => Err(self.busy()),
        }
    }

    fn busy(&self) -> RequestError {
        RequestError::Busy {
            budget: self.budget.sizes.total,
        }
    }

    /// Holds exactly `bytes`: gives back what is over, waits for what is missing.
    pub async fn resize(&mut self, bytes: usize) -> Result<(), RequestError> {
        let held = self.bytes();
        if bytes >= held {
            return self.grow(bytes - held).await;
        }
        self.held.shrink(held - bytes);
        if let Some(share) = &mut self.of_share {
            drop(share.split(held - bytes));
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

    fn sizes(
        total: usize,
        per_source: usize,
        reserved: usize,
        reserved_per_source: usize,
    ) -> Sizes {
        Sizes {
            total,
            per_source,
            reserved,
            reserved_per_source,
        }
    }

    fn source(i: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 1, i))
    }

    /// Whether `grow` is refused as busy, after waiting until the deadline.
    async fn refused(grow: impl Future<Output = Result<(), RequestError>>) -> bool {
        let started = Instant::now();
        let refused = matches!(grow.await, Err(RequestError::Busy { .. }));
        refused && started.elapsed() >= BUDGET_WAIT
    }

    /// Whether `grow` succeeds without waiting.
    async fn at_once(grow: impl Future<Output = Result<(), RequestError>>) -> bool {
        let started = Instant::now();
        grow.await.is_ok() && started.elapsed() < BUDGET_WAIT / 4
    }

    /// Addresses holding large bodies fill the open part only; small requests then take the
    /// reserve, each address at most its part of it, so that it takes as many addresses as
    /// the reserve has parts to fill it.
    #[tokio::test]
    async fn large_bodies_leave_the_reserve_to_small_requests() {
        let budget = Budget::new(sizes(100, 40, 20, 5));
        let mut large = Vec::new();
        for i in 0..2 {
            let mut charge = budget.charge(source(i));
            charge.grow(40).await.unwrap();
            large.push(charge);
        }
        assert_eq!((budget.in_use(), budget.reserve_in_use()), (80, 0));
        // A request larger than an address's part of the reserve may not use it.
        let mut big = budget.charge(A);
        // Small ones of four addresses fill it, a part each.
        let mut small: Vec<_> = (10..14).map(|i| budget.charge(source(i))).collect();
        for charge in &mut small {
            assert!(at_once(charge.grow(5)).await, "a small request waited");
        }
        assert_eq!(budget.reserve_in_use(), 20);
        let mut over_part = budget.charge(source(10));
        let mut fifth = budget.charge(B);
        let refusals = tokio::join!(
            refused(big.grow(6)),
            refused(over_part.grow(1)),
            refused(fifth.grow(1)),
        );
        assert!(refusals.0, "a large request took the reserve");
        assert!(
            refusals.1,
            "an address held more than its part of the reserve"
        );
        assert!(refusals.2, "the reserve held more than its size");
        drop((large, small, big, over_part, fifth));
        assert_eq!(budget.in_use(), 0);
        assert!(
            budget.sources.lock().unwrap().is_empty(),
            "sources forgotten"
        );
    }

    /// A small request uses the open part while it has room, moves to the reserve when it
    /// grows and the open part is full, moves back out when the open part has room again, and
    /// leaves the reserve for the open part when it grows past its address's part.
    #[tokio::test]
    async fn a_small_request_takes_the_reserve_only_while_the_open_part_is_full() {
        let budget = Budget::new(sizes(100, 100, 20, 10));
        let mut small = budget.charge(A);
        small.grow(4).await.unwrap();
        assert_eq!(budget.reserve_in_use(), 0, "the open part first");
        let mut large = budget.charge(B);
        large.grow(76).await.unwrap();
        // The open part is full: the whole request moves to the reserve.
        assert!(at_once(small.grow(4)).await);
        assert_eq!((budget.in_use(), budget.reserve_in_use()), (84, 8));
        // Room again: it grows into the open part, and leaves the reserve.
        large.resize(50).await.unwrap();
        assert!(at_once(small.grow(1)).await);
        assert_eq!((budget.in_use(), budget.reserve_in_use()), (59, 0));
        // Full again: into the reserve; then past its part, it waits for the open part.
        large.grow(21).await.unwrap();
        assert!(at_once(small.grow(1)).await);
        assert_eq!(budget.reserve_in_use(), 10);
        let ((), grown) = tokio::join!(
            async {
                tokio::time::sleep(BUDGET_WAIT / 4).await;
                large.resize(60).await.unwrap();
            },
            small.grow(2),
        );
        grown.unwrap();
        assert_eq!((small.bytes(), budget.reserve_in_use()), (12, 0));
        assert_eq!(budget.in_use(), 72);
        // Shrinking gives back what it held where it holds it.
        small.resize(3).await.unwrap();
        assert_eq!((budget.in_use(), budget.in_use_by(A)), (63, 3));
        drop((small, large));
        assert_eq!(budget.in_use(), 0);
        assert!(
            budget.sources.lock().unwrap().is_empty(),
            "sources forgotten"
        );
    }

    /// A small request waiting while both are full gets the first room of either.
    #[tokio::test]
    async fn a_waiting_small_request_takes_the_first_room_of_either() {
        let budget = Budget::new(sizes(30, 20, 10, 5));
        let mut large = budget.charge(A);
        large.grow(20).await.unwrap();
        let mut holders: Vec<_> = (0..2).map(|i| budget.charge(source(i))).collect();
        for holder in &mut holders {
            holder.grow(5).await.unwrap();
        }
        assert_eq!((budget.in_use(), budget.reserve_in_use()), (30, 10));
        let mut waiting = budget.charge(B);
        let started = Instant::now();
        let ((), grown) = tokio::join!(
            async {
                tokio::time::sleep(BUDGET_WAIT / 4).await;
                holders.pop();
            },
            waiting.grow(3),
        );
        grown.unwrap();
        assert!(
            started.elapsed() < BUDGET_WAIT,
            "it waited for the deadline"
        );
        assert_eq!(budget.reserve_in_use(), 8);
    }

    #[tokio::test]
    async fn charges_share_one_budget_and_wait_at_most_the_deadline() {
        let budget = Budget::new(sizes(100, 100, 0, 0));
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
        let budget = Budget::new(sizes(100, 40, 0, 0));
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
        let budget = Budget::new(sizes(1 << 20, 1 << 20, 0, 0));
        let mut charge = budget.charge(A);
        charge.grow(40_000).await.unwrap();
        let body = ChargedBody::new(vec![7; 40_000], charge);
        assert_eq!(budget.in_use(), 40_000);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 40_000);
        assert_eq!(budget.in_use(), 0);
    }
}
