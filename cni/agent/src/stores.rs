//! The agent's open stores: one per network directory, opened on first use (or at start for
//! the networks already under `--data-dir`) and kept open, so the network's `flock` is held by
//! the agent for as long as it runs. Commands take turns on a store through its mutex; a plugin
//! that falls back while the agent is down takes the `flock` as before.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ipkeep_ipam::{DiskStore, NetworkDir, StoreError, validate_network_name};

use crate::metrics::Metrics;
use ipkeep_cni::plugin::Timings;
use ipkeep_cni::stores::Stores;

/// One network's store.
#[derive(Debug)]
pub struct Slot {
    dir: NetworkDir,
    network: String,
    store: Mutex<Option<DiskStore>>,
}

impl Slot {
    /// The network name.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// The network directory.
    pub fn dir(&self) -> &NetworkDir {
        &self.dir
    }

    fn guard(&self) -> MutexGuard<'_, Option<DiskStore>> {
        // A panic while a command held the store leaves the store itself consistent (commits are
        // atomic), so the guard is still good.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` with exclusive use of the store, opening it first if needed (waiting at most
    /// `timeout` for a plugin that holds the network's `flock`). Returns the time spent
    /// waiting and opening along with `f`'s result.
    pub fn with<R, E: From<StoreError>>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&mut DiskStore) -> Result<R, E>,
    ) -> (Duration, Result<R, E>) {
        let started = Instant::now();
        let mut guard = self.guard();
        if guard.is_none() {
            match self.dir.lock(timeout).and_then(DiskStore::open) {
                Ok(store) => {
                    tracing::info!(network = %self.network, dir = %self.dir.path().display(), "opened the store");
                    *guard = Some(store);
                }
                Err(e) => return (started.elapsed(), Err(e.into())),
            }
        }
        let waited = started.elapsed();
        match guard.as_mut() {
            Some(store) => (waited, f(store)),
            None => unreachable_store(waited),
        }
    }

    /// Closes the store (flushing it and releasing the `flock`).
    pub fn close(&self) {
        if self.guard().take().is_some() {
            tracing::info!(network = %self.network, "closed the store");
        }
    }
}

// Kept out of line: the branch cannot be taken (the slot was filled just above under the same
// guard), but it must not panic either.
fn unreachable_store<R, E: From<StoreError>>(waited: Duration) -> (Duration, Result<R, E>) {
    (
        waited,
        Err(StoreError::Io {
            action: "open",
            path: String::new(),
            source: std::io::Error::other("store vanished while locked"),
        }
        .into()),
    )
}

/// Every network store the agent serves.
#[derive(Debug)]
pub struct AgentStores {
    slots: Mutex<BTreeMap<PathBuf, Arc<Slot>>>,
    metrics: Arc<Metrics>,
}

impl AgentStores {
    /// No stores yet.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        AgentStores {
            slots: Mutex::default(),
            metrics,
        }
    }

    fn slot(&self, dir: &NetworkDir) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots
            .entry(dir.path().to_path_buf())
            .or_insert_with(|| {
                Arc::new(Slot {
                    dir: dir.clone(),
                    network: dir
                        .path()
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    store: Mutex::default(),
                })
            })
            .clone()
    }

    /// Registers every network that already has a store under `data_dir` and opens it, so the
    /// sweep covers them from the start. Returns the networks found; a store that cannot be
    /// opened now is logged and retried on first use.
    pub fn adopt(&self, data_dir: &Path, timeout: Duration) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(data_dir) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(dir) = NetworkDir::new(data_dir, &name) else {
                continue;
            };
            if validate_network_name(&name).is_err() || !dir.exists() {
                continue;
            }
            let slot = self.slot(&dir);
            let (_, opened) = slot.with(timeout, |_| Ok::<_, StoreError>(()));
            if let Err(e) = opened {
                tracing::warn!(network = %name, error = %e, "could not open the store at start; will retry on first use");
            }
            found.push(name);
        }
        found.sort();
        found
    }

    /// Every registered network.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.values().cloned().collect()
    }

    /// Closes every store (at shutdown, after the last request).
    pub fn close_all(&self) {
        for slot in self.slots() {
            slot.close();
        }
    }
}

impl Stores for AgentStores {
    fn with<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
        f: impl FnOnce(&mut DiskStore) -> Result<R, E>,
    ) -> Result<R, E> {
        let (waited, result) = self.slot(dir).with(timeout, f);
        self.metrics.lock_wait(waited.as_secs_f64());
        timings.push("lock", waited);
        result
    }
}
