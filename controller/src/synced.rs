//! When the watch caches have their first full list: seen on the watch streams themselves (the
//! `InitDone` that ends each first list, once the store has it), and told to any number of
//! waiters.
//!
//! kube-runtime's `Store::wait_until_ready` keeps one waker per store: with several futures
//! waiting on the same store at once (the reconciles of three loops, each waiting for the
//! caches, and the controller runtime itself waiting for its own store), all but the last to
//! poll are never woken. At a restart beside existing pods with lifecycle hooks, their
//! reconciles all waited at once, so in most starts none of them ever ran, and a graceful
//! shutdown then waited for them for ever. A `tokio::sync::watch` wakes every waiter.

use std::sync::Arc;

use tokio::sync::watch;

/// One watch stream whose first full list the caches wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// StatefulSets.
    StatefulSets = 1,
    /// StatefulSet pods.
    Pods = 2,
    /// Nodes.
    Nodes = 4,
    /// PersistentPodStates.
    PersistentPodStates = 8,
    /// Namespaces (their auto-generation label).
    Namespaces = 16,
    /// OpenKruise's Advanced StatefulSets: synced at once when the API server does not serve
    /// them ([`crate::watches`]).
    AdvancedStatefulSets = 32,
}

const ALL: u8 = 1 | 2 | 4 | 8 | 16 | 32;

/// The sending side: marks caches synced as their streams pass `InitDone`.
#[derive(Debug, Clone)]
pub struct Tracker(Arc<watch::Sender<u8>>);

/// The waiting side, cloned into every reconcile.
#[derive(Debug, Clone)]
pub struct Synced(watch::Receiver<u8>);

/// A tracker and its waiters.
pub fn tracker() -> (Tracker, Synced) {
    let (tx, rx) = watch::channel(0);
    (Tracker(Arc::new(tx)), Synced(rx))
}

impl Tracker {
    /// Marks `cache` synced: its first full list is in its store (call it once the store has
    /// it). A relist later changes nothing: the store keeps serving the old objects meanwhile.
    pub fn synced(&self, cache: Cache) {
        self.0.send_modify(|synced| *synced |= cache as u8);
    }
}

impl Synced {
    /// Waits until every cache has had its first full list. Fails once every tracker is gone
    /// (the watches stopped: the controller is shutting down).
    pub async fn wait(&self) -> Result<(), crate::Error> {
        let mut rx = self.0.clone();
        rx.wait_for(|synced| *synced == ALL)
            .await
            .map(|_| ())
            .map_err(|_| crate::Error::CacheGone("watch"))
    }

    /// Whether every cache has had its first full list.
    pub fn now(&self) -> bool {
        *self.0.borrow() == ALL
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures::FutureExt;

    /// Many waiters at once are all woken (kube-runtime's store readiness wakes only the last
    /// one to poll it), and none before every cache is synced.
    #[tokio::test]
    async fn every_waiter_wakes_once_every_cache_is_synced() {
        let (tracker, synced) = tracker();
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let s = synced.clone();
                tokio::spawn(async move { s.wait().await })
            })
            .collect();
        for cache in [
            Cache::StatefulSets,
            Cache::Pods,
            Cache::Nodes,
            Cache::Namespaces,
            Cache::AdvancedStatefulSets,
        ] {
            tracker.synced(cache);
        }
        tokio::task::yield_now().await;
        assert!(!synced.now());
        assert!(
            synced.wait().now_or_never().is_none(),
            "one cache is missing"
        );
        tracker.synced(Cache::PersistentPodStates);
        for w in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), w)
                .await
                .expect("woken")
                .unwrap()
                .unwrap();
        }
        drop(tracker);
        assert!(synced.wait().await.is_ok(), "synced stays synced");
    }

    /// Why this module exists: kube-runtime's own store readiness, waited for by several tasks
    /// at once, wakes only one of them. If this starts failing, kube-runtime fixed it.
    #[tokio::test]
    async fn kube_runtimes_store_readiness_loses_all_but_one_waiter() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::{reflector, watcher};
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let s = store.clone();
                tokio::spawn(async move { s.wait_until_ready().await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let woken = waiters.iter().filter(|w| w.is_finished()).count();
        waiters.iter().for_each(tokio::task::JoinHandle::abort);
        assert_eq!(woken, 1, "kube-runtime woke {woken} of 8 waiters");
    }

    /// With the trackers gone before the first list, waiters fail instead of waiting for ever.
    #[tokio::test]
    async fn waiters_fail_when_the_watches_stop() {
        let (tracker, synced) = tracker();
        let waiter = tokio::spawn({
            let s = synced.clone();
            async move { s.wait().await }
        });
        drop(tracker);
        assert!(waiter.await.unwrap().is_err());
    }
}
