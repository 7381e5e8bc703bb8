//! Where a command gets its network's store from.
//!
//! The plugin process locks and opens the store for one command and closes it after
//! ([`OpenPerCall`]); the node agent keeps each store open and lends it to one command at a
//! time (crate `ipkeep-agent`); tests use [`MemoryStores`]. Every command runs over the
//! [`Stores`] trait, so the three give the same answers.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipkeep_ipam::disk::StoreOptions;
use ipkeep_ipam::store::Commit;
use ipkeep_ipam::{DiskStore, MemoryStore, NetworkDir, Store, StoreError, StoreRead};

use crate::timings::Timings;

/// Name of the file, in each network directory, that counts commands the plugin served itself
/// because the agent did not answer. Written under the network lock.
pub const FALLBACK_COUNT_FILE: &str = "fallbacks";

/// The least free space under `ipam.dataDir` with which STATUS says the plugin can serve ADD.
pub const MIN_FREE_BYTES: u64 = 256 << 10;

/// Lends a network's store to one command at a time.
pub trait Stores {
    /// The store commands write through.
    type Store: Store;

    /// Whether the network has a store at all (DEL and CHECK of an unknown network do nothing).
    fn exists(&self, dir: &NetworkDir) -> bool {
        dir.exists()
    }

    /// Runs `f` with exclusive use of the store of `dir` (created if needed), waiting at most
    /// `timeout` for it. Records the `lock` and `open` phases in `timings`.
    fn with<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
        f: impl FnOnce(&mut Self::Store) -> Result<R, E>,
    ) -> Result<R, E>;

    /// Runs `f` on a consistent read-only view of the store of `dir`, which must exist. An
    /// implementation may let commands write meanwhile (the agent reads a snapshot), so a long
    /// reader never holds up a pod.
    fn read<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        f: impl FnOnce(&dyn StoreRead) -> Result<R, E>,
    ) -> Result<R, E>;

    /// Whether ADD can be served on this network now (CNI STATUS); `Err` says why not.
    fn status(&self, dir: &NetworkDir) -> Result<(), String>;

    /// Whether the command may use the store of `dir` at all: `Err` ends it unrun, and whoever
    /// sent it serves it elsewhere ([`crate::Completion::refused`]).
    fn serves(&self, _dir: &NetworkDir) -> Result<(), NotServed> {
        Ok(())
    }

    /// Whether an older sandbox's network namespace (the `CNI_NETNS` path of its ADD) still
    /// exists, as whoever serves the command can tell; `None` where it cannot. A plugin process
    /// runs on the host and sees the runtime's paths; the node agent looks in its own
    /// container, and cannot tell everywhere ([`crate::Completion::needs_netns`]).
    fn netns_exists(&self, path: &str) -> Option<bool> {
        Some(crate::files::netns_exists(path))
    }
}

/// Why a [`Stores`] will not lend a network's store: the command was not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotServed(pub String);

/// The plugin process's way: `flock` the network, open the database, run, close, unlock.
#[derive(Debug, Default)]
pub struct OpenPerCall {
    /// Count this command in the network's [`FALLBACK_COUNT_FILE`] (the agent did not answer).
    pub count_fallback: bool,
    /// Wait at most this long for the `flock`, whatever the configured timeout (a falling-back
    /// plugin retries the agent in between, since a restarted agent holds the lock for good).
    pub max_wait: Option<Duration>,
    /// Set when the wait for the `flock` ran out.
    pub lock_busy: std::cell::Cell<bool>,
}

impl OpenPerCall {
    fn open(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
    ) -> Result<DiskStore, StoreError> {
        let t = Instant::now();
        let timeout = self.max_wait.map_or(timeout, |m| m.min(timeout));
        let lock = dir.lock(timeout).inspect_err(|e| {
            if matches!(e, StoreError::LockTimeout { .. }) {
                self.lock_busy.set(true);
            }
        })?;
        let t = timings.record("lock", t);
        if self.count_fallback {
            // Best effort: a counter that cannot be written must not fail the pod.
            if let Err(e) = bump_fallback_count(dir) {
                tracing::debug!(error = %e, "could not count the fallback");
            }
        }
        // Checksums verified on every open: a file damaged behind our back is refused with an
        // error naming it, never read as if it were what was committed (docs/store.md).
        let options = StoreOptions {
            verify: true,
            ..StoreOptions::default()
        };
        let store = DiskStore::open(lock, &options)?;
        timings.record("open", t);
        Ok(store)
    }
}

impl Stores for OpenPerCall {
    type Store = DiskStore;

    fn with<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
        f: impl FnOnce(&mut DiskStore) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut store = self.open(dir, timeout, timings)?;
        f(&mut store)
    }

    fn read<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        f: impl FnOnce(&dyn StoreRead) -> Result<R, E>,
    ) -> Result<R, E> {
        let store = self.open(dir, timeout, &mut Timings::default())?;
        f(&store)
    }

    fn status(&self, dir: &NetworkDir) -> Result<(), String> {
        free_space_status(dir)
    }
}

/// STATUS's disk check: the data directory, if it exists, is a directory on a file system with
/// at least [`MIN_FREE_BYTES`] free.
pub fn free_space_status(dir: &NetworkDir) -> Result<(), String> {
    let Some(data_dir) = dir.path().parent() else {
        return Ok(());
    };
    match std::fs::metadata(data_dir) {
        Err(_) => return Ok(()), // created on first ADD
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "ipam.dataDir {} exists but is not a directory",
                data_dir.display()
            ));
        }
        Ok(_) => {}
    }
    match ipkeep_ipam::disk::free_bytes(data_dir) {
        Ok(free) if free < MIN_FREE_BYTES => Err(format!(
            "the file system holding ipam.dataDir {} has {free} bytes free; ipkeep needs at least {MIN_FREE_BYTES} to record addresses",
            data_dir.display()
        )),
        _ => Ok(()),
    }
}

/// Adds one to the network's fallback count. The caller holds the network lock.
fn bump_fallback_count(dir: &NetworkDir) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(dir.path().join(FALLBACK_COUNT_FILE))?;
    let mut text = String::new();
    Read::by_ref(&mut file).take(64).read_to_string(&mut text)?;
    let count = text.trim().parse::<u64>().unwrap_or(0).saturating_add(1);
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{count}")
}

/// The network's fallback count (0 when never written).
pub fn fallback_count(dir: &NetworkDir) -> u64 {
    std::fs::read_to_string(dir.path().join(FALLBACK_COUNT_FILE))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// In-memory stores, one per network directory, for tests of whole commands.
#[derive(Debug, Default)]
pub struct MemoryStores {
    stores: RefCell<BTreeMap<PathBuf, MemoryStore>>,
}

impl MemoryStores {
    /// The store of `dir`, as it is now.
    pub fn get(&self, dir: &NetworkDir) -> Option<MemoryStore> {
        self.stores.borrow().get(dir.path()).cloned()
    }
}

impl Stores for MemoryStores {
    type Store = MemoryStore;

    fn exists(&self, dir: &NetworkDir) -> bool {
        self.stores.borrow().contains_key(dir.path())
    }

    fn with<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        _timeout: Duration,
        _timings: &mut Timings,
        f: impl FnOnce(&mut MemoryStore) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut stores = self.stores.borrow_mut();
        f(stores.entry(dir.path().to_path_buf()).or_default())
    }

    fn read<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        _timeout: Duration,
        f: impl FnOnce(&dyn StoreRead) -> Result<R, E>,
    ) -> Result<R, E> {
        let stores = self.stores.borrow();
        let empty = MemoryStore::new();
        f(stores.get(dir.path()).unwrap_or(&empty))
    }

    fn status(&self, _dir: &NetworkDir) -> Result<(), String> {
        Ok(())
    }
}

/// A store whose commits are refused once the caller's deadline has passed: the caller (a
/// plugin waiting for the agent) has given up and reported a failure, so writing now would
/// record an ADD the runtime was told failed.
#[derive(Debug)]
pub struct Deadlined<'s, S> {
    /// The store.
    pub store: &'s mut S,
    /// No commit after this.
    pub deadline: Option<Instant>,
}

ipkeep_ipam::forward_store_read!(impl[S: StoreRead] for Deadlined<'_, S>, |this| this.store);

impl<S: Store> Store for Deadlined<'_, S> {
    fn commit(&mut self, commit: Commit) -> Result<(), StoreError> {
        if let Some(late) = self
            .deadline
            .and_then(|d| Instant::now().checked_duration_since(d))
        {
            return Err(StoreError::PastDeadline {
                late_ms: late.as_millis(),
            });
        }
        self.store.commit(commit)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fallbacks_are_counted_under_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = NetworkDir::new(tmp.path(), "net").unwrap();
        assert_eq!(fallback_count(&dir), 0);
        let stores = OpenPerCall {
            count_fallback: true,
            ..OpenPerCall::default()
        };
        for _ in 0..3 {
            stores
                .with(
                    &dir,
                    Duration::from_secs(1),
                    &mut Timings::default(),
                    |_| Ok::<_, StoreError>(()),
                )
                .unwrap();
        }
        OpenPerCall::default()
            .with(
                &dir,
                Duration::from_secs(1),
                &mut Timings::default(),
                |_| Ok::<_, StoreError>(()),
            )
            .unwrap();
        assert_eq!(fallback_count(&dir), 3);
    }

    #[test]
    fn a_commit_past_the_deadline_writes_nothing() {
        let mut store = MemoryStore::new();
        let past = Instant::now().checked_sub(Duration::from_millis(5));
        let mut late = Deadlined {
            store: &mut store,
            deadline: past,
        };
        let commit = Commit {
            range_sets: Some("[]".into()),
            ..Commit::default()
        };
        let err = late.commit(commit.clone()).unwrap_err();
        assert!(matches!(err, StoreError::PastDeadline { .. }), "{err}");
        assert!(err.is_transient());
        assert_eq!(store.range_sets().unwrap(), None);
        let mut on_time = Deadlined {
            store: &mut store,
            deadline: Some(Instant::now() + Duration::from_secs(5)),
        };
        on_time.commit(commit).unwrap();
        assert_eq!(store.range_sets().unwrap().as_deref(), Some("[]"));
    }
}
