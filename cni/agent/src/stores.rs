//! The agent's open stores: one per network under its `--data-dir`, opened on first use (or at
//! start for the networks already there) and kept open, so the network's `flock` is held by the
//! agent for as long as it runs. Commands take turns on a store through its lock, waiting no
//! longer than their caller does; long readers (the sweep, `ipkeep list`) read a snapshot and
//! never hold the lock while they work.
//!
//! A store whose commit failed (a full disk) is closed at once: redb refuses further writes
//! until it is opened again, and closing lets the `flock` go, so a plugin can serve itself if
//! the agent cannot reopen it. Until a later commit succeeds, the network is unhealthy
//! (`/readyz`, `ipkeep_agent_store_healthy`, CNI STATUS).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ipkeep_cni::logs::hint;
use ipkeep_cni::stores::{NotServed, Stores, free_space_status};
use ipkeep_cni::timings::Timings;
use ipkeep_ipam::disk::{DiskSnapshot, StoreOptions};
use ipkeep_ipam::{DiskStore, NetworkDir, StoreError, StoreRead, validate_network_name};

use crate::metrics::Metrics;
use crate::netns::{NetnsView, Sighting};

/// The agent's page cache per store: enough for the hot part of a 60,000-lease store.
const CACHE_BYTES: usize = 8 << 20;

/// Why the agent does not serve a request's store, or a store cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoresError {
    /// The plugin's configuration names another data directory than the agent's: the plugin
    /// serves it itself.
    #[error("ipam.dataDir {} is not this agent's --data-dir {}", .given.display(), .ours.display())]
    NotOurDataDir {
        /// As the plugin named it.
        given: PathBuf,
        /// The agent's, canonical.
        ours: PathBuf,
    },
    /// A path that is no network directory right under the data directory.
    #[error("{} is not a network directory under {}", .path.display(), .data_dir.display())]
    NotANetworkDir {
        /// The path.
        path: PathBuf,
        /// The agent's data directory.
        data_dir: PathBuf,
    },
    /// The network's store could not be opened, or its last commit failed.
    #[error("network {network}: {why}")]
    Unhealthy {
        /// The network.
        network: String,
        /// What failed.
        why: String,
    },
}

/// One network's store.
#[derive(Debug)]
pub struct Slot {
    dir: NetworkDir,
    network: String,
    store: parking_lot::Mutex<Option<DiskStore>>,
    /// Why the last commit or open failed, until a command succeeds.
    failure: Mutex<Option<String>>,
    /// Whether a forward jump of the wall clock has been reported.
    clock_jumped: std::sync::atomic::AtomicBool,
    /// Whether the store doubts the wall clock after a reboot (see `ipkeep_ipam::clock`).
    clock_doubted: std::sync::atomic::AtomicBool,
    /// Counts commands that succeeded (and so may have changed the store).
    generation: std::sync::atomic::AtomicU64,
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

    /// `Err` with the reason while the store cannot be opened or cannot commit.
    pub fn health(&self) -> Result<(), StoresError> {
        match &*self.failure.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(()),
            Some(why) => Err(StoresError::Unhealthy {
                network: self.network.clone(),
                why: why.clone(),
            }),
        }
    }

    /// How many commands have succeeded on this store: changes when the store may have.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the store doubts the wall clock after a reboot, as the last sweep saw.
    pub fn clock_doubted(&self) -> bool {
        self.clock_doubted
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Reports, once until it ends, that the wall clock is `ahead` of the store's clock, or,
    /// after a reboot, so far ahead of it that the store `doubted` it.
    pub fn note_clock(&self, ahead: Option<u64>, doubted: Option<u64>) {
        use std::sync::atomic::Ordering;
        let was_doubted = self.clock_doubted.swap(doubted.is_some(), Ordering::AcqRel);
        match (doubted, was_doubted) {
            (Some(ahead), false) => tracing::warn!(
                network = %self.network,
                ahead = %ipkeep_values::time::duration(ahead),
                hint = hint::DOUBTED_WALL,
                "after a reboot the wall clock is far past this store's last time, and not synchronised"
            ),
            (None, true) => tracing::info!(
                network = %self.network,
                "the wall clock is taken again: synchronised, or the node has been up an hour"
            ),
            _ => {}
        }
        let ahead = ahead.filter(|_| doubted.is_none());
        let was = self.clock_jumped.swap(ahead.is_some(), Ordering::AcqRel);
        if let (Some(ahead), false) = (ahead, was) {
            tracing::warn!(
                network = %self.network,
                ahead = %ipkeep_values::time::duration(ahead),
                hint = hint::WALL_AHEAD,
                "the wall clock is ahead of the store's clock (it jumped forward)"
            );
        }
    }

    fn set_failure(&self, failure: Option<String>) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = failure;
    }

    /// Runs `f` with exclusive use of the store, opening it first if needed. Waits for the
    /// store until `deadline` at most (and for a plugin's `flock` at most `lock_timeout`).
    /// Returns the time spent waiting and opening, and `f`'s result, or (outer `Err`) why the
    /// store could not be had.
    pub fn with<R, E>(
        &self,
        deadline: Instant,
        lock_timeout: Duration,
        f: impl FnOnce(&mut DiskStore) -> Result<R, E>,
    ) -> (Duration, Result<Result<R, E>, StoreError>) {
        let started = Instant::now();
        let Some(mut guard) = self.store.try_lock_until(deadline) else {
            let err = StoreError::LockTimeout {
                path: format!("{} (busy in the agent)", self.dir.path().display()),
                waited_ms: started.elapsed().as_millis(),
            };
            return (started.elapsed(), Err(err));
        };
        if guard.is_none() {
            let timeout = lock_timeout.min(deadline.saturating_duration_since(Instant::now()));
            match self.open(timeout) {
                Ok(store) => *guard = Some(store),
                Err(e) => {
                    // Waiting for a plugin's flock is not a fault of the store; anything else is.
                    if !matches!(e, StoreError::LockTimeout { .. }) {
                        tracing::error!(network = %self.network, error = %e, "cannot open the store");
                        self.set_failure(Some(format!("the store cannot be opened: {e}")));
                    }
                    return (started.elapsed(), Err(e));
                }
            }
        }
        let waited = started.elapsed();
        let Some(store) = guard.as_mut() else {
            return (waited, Err(vanished()));
        };
        let result = f(store);
        if store.is_poisoned() {
            let why = "a commit failed (see the agent's log); the store was closed and is opened again on the next request".to_string();
            tracing::error!(network = %self.network, "{why}");
            self.set_failure(Some(why));
            *guard = None;
        } else if result.is_ok() {
            self.set_failure(None);
            self.generation
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        (waited, Ok(result))
    }

    /// A consistent read-only view of the store, taken under its lock but read without it.
    pub fn snapshot(
        &self,
        deadline: Instant,
        lock_timeout: Duration,
    ) -> Result<DiskSnapshot, StoreError> {
        self.with(deadline, lock_timeout, |store| store.snapshot())
            .1?
    }

    fn open(&self, timeout: Duration) -> Result<DiskStore, StoreError> {
        let options = StoreOptions {
            cache_bytes: CACHE_BYTES,
            // The agent opens a store once and keeps it: check every page, so a damaged file
            // is refused (and left to the operator) instead of trusted.
            verify: true,
        };
        let store = DiskStore::open(self.dir.lock(timeout)?, &options)?;
        tracing::info!(network = %self.network, path = %store.path().display(), "opened the store");
        Ok(store)
    }

    /// Closes the store (releasing the `flock`).
    pub fn close(&self) {
        if self.store.lock().take().is_some() {
            tracing::info!(network = %self.network, "closed the store");
        }
    }
}

fn vanished() -> StoreError {
    StoreError::Io {
        action: "open",
        path: String::new(),
        source: std::io::Error::other("store vanished while locked"),
    }
}

/// Every network store the agent serves: those under its data directory, nothing else.
#[derive(Debug)]
pub struct AgentStores {
    /// The canonical `--data-dir`.
    data_dir: PathBuf,
    /// `--data-dir` as given (a request naming it so needs no resolving).
    given: PathBuf,
    slots: Mutex<BTreeMap<String, Arc<Slot>>>,
    metrics: Arc<Metrics>,
}

impl AgentStores {
    /// The stores under `data_dir`, which is created (0700) if missing and resolved through any
    /// symlink, so a plugin naming it by another path reaches the same stores.
    pub fn new(data_dir: &Path, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(data_dir)?;
        Ok(AgentStores {
            given: data_dir.to_path_buf(),
            data_dir: data_dir.canonicalize()?,
            slots: Mutex::default(),
            metrics,
        })
    }

    /// The canonical data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Whether `dir` (as a plugin names it) is this agent's data directory; `Err` says why not.
    pub fn owns(&self, dir: &Path) -> Result<(), StoresError> {
        if dir == self.given || dir == self.data_dir {
            return Ok(());
        }
        match dir.canonicalize() {
            Ok(canonical) if canonical == self.data_dir => Ok(()),
            _ => Err(StoresError::NotOurDataDir {
                given: dir.to_path_buf(),
                ours: self.data_dir.clone(),
            }),
        }
    }

    /// The slot of `dir`, which must be a network directory under the data directory.
    pub fn slot(&self, dir: &NetworkDir) -> Result<Arc<Slot>, StoresError> {
        let network = dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = dir
            .path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if parent != self.data_dir || validate_network_name(&network).is_err() {
            return Err(StoresError::NotANetworkDir {
                path: dir.path().to_path_buf(),
                data_dir: self.data_dir.clone(),
            });
        }
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(slots
            .entry(network.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    dir: dir.clone(),
                    network,
                    store: parking_lot::Mutex::default(),
                    failure: Mutex::default(),
                    clock_jumped: Default::default(),
                    clock_doubted: Default::default(),
                    generation: Default::default(),
                })
            })
            .clone())
    }

    /// Registers every network that already has a store under the data directory and opens it,
    /// so the sweep covers them from the start. Returns the networks found; a store that cannot
    /// be opened now is logged and retried on first use. Entries that are not network store
    /// directories (a stray file, a backup, a directory without a `leases.redb`) are left alone
    /// and named once in the log: taking one for a store would report it broken for ever.
    pub fn adopt(&self, timeout: Duration) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.data_dir) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut ignored = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let slot = NetworkDir::new(&self.data_dir, &name)
                .ok()
                .filter(|dir| entry.file_type().is_ok_and(|t| t.is_dir()) && dir.exists())
                .and_then(|dir| self.slot(&dir).ok());
            let Some(slot) = slot else {
                ignored.push(name);
                continue;
            };
            let deadline = Instant::now() + timeout;
            let (_, opened) = slot.with(deadline, timeout, |_| Ok::<_, StoreError>(()));
            if let Err(e) = opened {
                tracing::warn!(network = %name, error = %e, "could not open the store at start; will retry on first use");
            }
            found.push(name);
        }
        if !ignored.is_empty() {
            ignored.sort();
            tracing::info!(data_dir = %self.data_dir.display(), entries = ?ignored, "ignored entries of --data-dir that are not network stores (a directory with a leases.redb)");
        }
        found.sort();
        found
    }

    /// Every registered network.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.values().cloned().collect()
    }

    /// `Err` listing every network whose store cannot commit.
    pub fn health(&self) -> Result<(), String> {
        let failures: Vec<String> = self
            .slots()
            .iter()
            .filter_map(|s| s.health().err().map(|e| e.to_string()))
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
        }
    }

    /// Closes every store (at shutdown, after the last request).
    pub fn close_all(&self) {
        for slot in self.slots() {
            slot.close();
        }
    }

    /// The stores as one request sees them: waiting no longer than `deadline`.
    pub fn for_request(&self, deadline: Instant) -> RequestStores<'_> {
        RequestStores {
            stores: self,
            deadline,
            netns: None,
            host_view: BTreeMap::new(),
        }
    }
}

/// The agent's stores for one request. A network directory outside the agent's data directory
/// is not served ([`Stores::serves`]), so the plugin serves itself. A store that fails to open
/// is an answer like any other (a plugin opening it itself would not check its pages, so it
/// must not be sent to).
#[derive(Debug)]
pub struct RequestStores<'a> {
    stores: &'a AgentStores,
    deadline: Instant,
    /// How the request's command judges older sandboxes' namespaces (`None`: as the plugin
    /// process would, for commands that never ask).
    netns: Option<&'a NetnsView>,
    /// What the plugin said it sees on the host of namespaces the agent asked about.
    host_view: BTreeMap<String, bool>,
}

impl<'a> RequestStores<'a> {
    /// The same, judging older sandboxes' network namespaces through `view`, and, where it
    /// cannot tell, by what the plugin said it sees on the host (`host_view`).
    pub fn seeing(self, view: &'a NetnsView, host_view: BTreeMap<String, bool>) -> Self {
        RequestStores {
            netns: Some(view),
            host_view,
            ..self
        }
    }

    fn slot(&self, dir: &NetworkDir) -> Result<Arc<Slot>, StoreError> {
        self.stores.slot(dir).map_err(|why| StoreError::Io {
            action: "serve",
            path: dir.path().display().to_string(),
            source: std::io::Error::other(why),
        })
    }
}

impl Stores for RequestStores<'_> {
    type Store = DiskStore;

    fn with<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
        f: impl FnOnce(&mut DiskStore) -> Result<R, E>,
    ) -> Result<R, E> {
        let slot = self.slot(dir)?;
        let (waited, result) = slot.with(self.deadline, timeout, f);
        self.stores.metrics.lock_wait(waited.as_secs_f64());
        timings.push("lock", waited);
        result?
    }

    fn read<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        f: impl FnOnce(&dyn StoreRead) -> Result<R, E>,
    ) -> Result<R, E> {
        let slot = self.slot(dir)?;
        let snapshot = slot.snapshot(self.deadline, timeout)?;
        f(&snapshot)
    }

    fn status(&self, dir: &NetworkDir) -> Result<(), String> {
        if let Ok(slot) = self.stores.slot(dir) {
            slot.health().map_err(|e| e.to_string())?;
        }
        free_space_status(dir)
    }

    fn serves(&self, dir: &NetworkDir) -> Result<(), NotServed> {
        self.stores
            .slot(dir)
            .map(drop)
            .map_err(|e| NotServed(e.to_string()))
    }

    fn netns_exists(&self, path: &str) -> Option<bool> {
        let Some(view) = self.netns else {
            return Some(ipkeep_cni::files::netns_exists(path));
        };
        match view.look(path) {
            Sighting::Exists => Some(true),
            Sighting::Gone => Some(false),
            Sighting::Unknown => self.host_view.get(path).copied(),
        }
    }
}
