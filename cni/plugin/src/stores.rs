//! Where a command gets its network's store from.
//!
//! The plugin process locks and opens the store for one command and closes it after
//! ([`OpenPerCall`]); the node agent keeps each store open and lends it to one command at a
//! time (`agent::stores`). Both run the same command code over the same [`DiskStore`], which is
//! what makes the two paths give the same answers.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use ipkeep_ipam::{DiskStore, NetworkDir, StoreError};

use crate::plugin::Timings;

/// Name of the file, in each network directory, that counts commands the plugin served itself
/// because the agent did not answer. Written under the network lock.
pub const FALLBACK_COUNT_FILE: &str = "fallbacks";

/// Lends a network's store to one command at a time.
pub trait Stores {
    /// Runs `f` with exclusive use of the store of `dir`, waiting at most `timeout` for it.
    /// Records the `lock` and `open` phases in `timings`.
    fn with<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
        f: impl FnOnce(&mut DiskStore) -> Result<R, E>,
    ) -> Result<R, E>;
}

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

impl Stores for OpenPerCall {
    fn with<R, E: From<StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
        f: impl FnOnce(&mut DiskStore) -> Result<R, E>,
    ) -> Result<R, E> {
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
        let mut store = DiskStore::open(lock)?;
        timings.record("open", t);
        f(&mut store)
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
        .open(dir.path().join(FALLBACK_COUNT_FILE))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let count = text.trim().parse::<u64>().unwrap_or(0) + 1;
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
}
