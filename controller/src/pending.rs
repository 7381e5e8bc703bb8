//! Triggers waiting for a loop, coalesced: a key already waiting is not queued again (its value
//! is replaced, its place kept), so what waits is bounded by the number of distinct keys (the
//! objects that exist, and those deleted since the loop last looked), the watch that sends never
//! waits for the loop, and no trigger is ever dropped: a loop that falls behind reconciles each
//! object once, as it is by then. Used in place of channels between the watches and the loops.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::{Stream, StreamExt};

/// The sending side; clones send to the same receiver.
#[derive(Debug)]
pub struct Sender<K, V = ()> {
    shared: Arc<Mutex<State<K, V>>>,
}

/// The receiving side: a stream of the keys waiting, oldest first, each with its latest value;
/// it ends once every sender is gone and nothing waits.
#[derive(Debug)]
pub struct Receiver<K, V = ()> {
    shared: Arc<Mutex<State<K, V>>>,
}

#[derive(Debug)]
struct State<K, V> {
    order: VecDeque<K>,
    values: HashMap<K, V>,
    waker: Option<Waker>,
    senders: usize,
}

/// A sender and its receiver, nothing waiting.
pub fn channel<K, V>() -> (Sender<K, V>, Receiver<K, V>) {
    let shared = Arc::new(Mutex::new(State {
        order: VecDeque::new(),
        values: HashMap::new(),
        waker: None,
        senders: 1,
    }));
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

fn lock<K, V>(shared: &Mutex<State<K, V>>) -> MutexGuard<'_, State<K, V>> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<K: Hash + Eq + Clone, V> Sender<K, V> {
    /// Makes `key` wait with `value`; if it waits already, only its value changes.
    pub fn send(&self, key: K, value: V) {
        let waker = {
            let mut state = lock(&self.shared);
            if state.values.insert(key.clone(), value).is_none() {
                state.order.push_back(key);
            }
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<K: Hash + Eq + Clone> Sender<K, ()> {
    /// Makes `key` wait, unless it does already.
    pub fn trigger(&self, key: K) {
        self.send(key, ());
    }
}

impl<K, V> Clone for Sender<K, V> {
    fn clone(&self) -> Self {
        lock(&self.shared).senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<K, V> Drop for Sender<K, V> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.shared);
            state.senders -= 1;
            if state.senders > 0 {
                return;
            }
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<K: Hash + Eq, V> Stream for Receiver<K, V> {
    type Item = (K, V);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut state = lock(&self.shared);
        while let Some(key) = state.order.pop_front() {
            if let Some(value) = state.values.remove(&key) {
                return Poll::Ready(Some((key, value)));
            }
        }
        if state.senders == 0 {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<K: Hash + Eq + Send + 'static> Receiver<K, ()> {
    /// The keys alone.
    pub fn keys(self) -> impl Stream<Item = K> + Send + use<K> {
        self.map(|(key, ())| key)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures::FutureExt;

    /// However often a key is sent before the loop looks, it waits once, in its first place,
    /// with its latest value; nothing sent is lost.
    #[test]
    fn a_key_waits_once_in_its_first_place_with_its_latest_value() {
        let (tx, mut rx) = channel::<&str, u32>();
        for (key, value) in [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 3)] {
            tx.send(key, value);
        }
        let mut got = Vec::new();
        while let Some(item) = rx.next().now_or_never().flatten() {
            got.push(item);
        }
        assert_eq!(got, [("a", 2), ("b", 3), ("c", 1)]);
        tx.send("a", 4);
        assert_eq!(rx.next().now_or_never().flatten(), Some(("a", 4)), "again");
        assert_eq!(rx.next().now_or_never(), None, "nothing waits");
    }

    /// The receiver wakes for a key sent while it waits, and ends once every sender is gone
    /// and what waited was taken.
    #[tokio::test]
    async fn the_receiver_wakes_for_a_key_and_ends_after_the_last_sender() {
        let (tx, rx) = channel::<u32, ()>();
        let other = tx.clone();
        let task = tokio::spawn(rx.keys().collect::<Vec<u32>>());
        tokio::task::yield_now().await;
        tx.trigger(1);
        tokio::task::yield_now().await;
        other.trigger(2);
        drop(tx);
        other.trigger(2);
        drop(other);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("ended")
            .unwrap();
        assert_eq!(got, [1, 2]);
    }
}
