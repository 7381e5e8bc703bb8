//! The sled 0.34.7 store of pre-release ipkeep (layout version 1, `git show
//! dbd7a2d:crates/ipam/src/disk.rs`), ported to today's [`StoreRead`] / [`Store`] traits so the
//! same allocator and the same checks run over it and over the redb [`DiskStore`]. It exists only
//! for the comparison in `docs/store.md`.
//!
//! # Layout (version 1, plus what today's traits need)
//! ```text
//! <dataDir>/<network>/lock        flock(LOCK_EX), the same NetworkDir::lock as the redb store
//! <dataDir>/<network>/leases.db/  the sled database (conf, db, snap.<lsn>, blobs/)
//! ```
//! Keys of the default tree (`ip` = family byte `4`/`6` + the address as a 16-byte big-endian
//! number, so keys sort by address):
//! ```text
//! a <ip>                                  → Lease as JSON          the truth, one per address
//! c <containerID> 0 <ifname> 0 <ip>       → ""                     index: owner attachment
//! p <namespace> 0 <pod> 0 <ifname> 0 <ip> → ""                     index: pod identity
//! e <until: u64 BE> <ip>                  → ""                     index: holdings by expiry
//! h <ip>                                  → ""                     index: every holding (new)
//! l <range set "start-end,…">             → address text           round-robin cursor
//! m:ranges                                → JSON of the range sets last configured
//! m:clock                                 → the store's clock (new)
//! m:version                               → "1"
//! ```
//! A commit is one `sled::Batch` (atomic) followed by `Db::flush`. sled 0.34 makes that flush
//! with `sync_file_range(2)`, never `fsync`/`fdatasync`: the data reaches the device but neither
//! the device's write cache nor the file's size is made durable.
//!
//! # The fixes ([`SledOptions`], backend `sled-fixed`)
//! * **Stale snapshots.** sled writes `snap.<lsn>.generating`, syncs it and renames it to
//!   `snap.<lsn>` on every open that finds the log ahead of the last snapshot. A SIGKILL or a
//!   full disk in between leaves the `.generating` file; sled's next open takes the name that
//!   sorts last (`snap.<lsn>.generating` sorts after `snap.<lsn>` and after every older one),
//!   finds its checksum wrong and fails with "Read corrupted data" — forever. The fix removes
//!   every `snap.*.generating` before opening: such a file was never renamed, so the previous
//!   snapshot is still there and the log is replayed from it.
//! * **Durability.** After sled's flush, `fdatasync` the `db` file ourselves, so an acknowledged
//!   commit is on stable storage as the [`Store`] contract requires; and after every open,
//!   `fsync` the `conf` and `db` files and the directories sled created them in or renamed a
//!   snapshot into (sled syncs neither a new file's directory nor `conf`).

use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipkeep_ipam::range::ip_to_u128;
use ipkeep_ipam::store::{Commit, Store, StoreError, StoreRead};
use ipkeep_ipam::{Attachment, ClockMark, Lease, LeaseState, NetworkLock, PodIdentity};

/// Layout version written by this code (the last sled layout).
pub const LAYOUT_VERSION: u32 = 1;
/// The database directory inside the network directory.
pub const DB_DIR: &str = "leases.db";

/// How the sled store is opened.
#[derive(Debug, Clone, Copy)]
pub struct SledOptions {
    /// sled's page cache (`cache_capacity`); the old code used 16 MiB for every opener.
    pub cache_bytes: u64,
    /// Remove `snap.*.generating` files left by an interrupted snapshot before opening.
    pub remove_stale_snapshots: bool,
    /// `fdatasync` the `db` file after sled's flush, before `commit` returns.
    pub fdatasync_commits: bool,
    /// After opening, `fsync` sled's `conf` and `db` files and the directories it created
    /// files in or renamed a snapshot into.
    pub sync_names: bool,
}

impl SledOptions {
    /// sled exactly as pre-release ipkeep used it.
    pub fn as_shipped() -> Self {
        SledOptions {
            cache_bytes: 16 << 20,
            remove_stale_snapshots: false,
            fdatasync_commits: false,
            sync_names: false,
        }
    }

    /// With both fixes.
    pub fn fixed() -> Self {
        SledOptions {
            remove_stale_snapshots: true,
            fdatasync_commits: true,
            sync_names: true,
            ..Self::as_shipped()
        }
    }
}

/// The sled-backed store. Holds the network lock for its whole life.
pub struct SledStore {
    // Field order matters: the database closes before the lock is released.
    db: sled::Db,
    /// The `db` file, opened only to `fdatasync` it (when the fix is on).
    sync: Option<File>,
    write_version: bool,
    path: PathBuf,
    _lock: NetworkLock,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn is_no_space(io: &std::io::Error) -> bool {
    matches!(
        io.raw_os_error(),
        Some(nix::libc::ENOSPC | nix::libc::EDQUOT)
    )
}

fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> StoreError {
    let path = path.display().to_string();
    if is_no_space(&source) {
        StoreError::NoSpace { action, path }
    } else {
        StoreError::Io {
            action,
            path,
            source,
        }
    }
}

fn db_error(action: &'static str, path: &Path, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(io) => io_error(action, path, io),
        other => StoreError::Database {
            action,
            path: path.display().to_string(),
            reason: other.to_string(),
        },
    }
}

/// sled reports its file lock being held as an `Other` I/O error with this text (sled 0.34).
fn is_sled_lock_busy(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().starts_with("could not acquire lock"))
}

fn ip_key(ip: IpAddr) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[0] = if ip.is_ipv4() { 4 } else { 6 };
    key[1..].copy_from_slice(&ip_to_u128(ip).to_be_bytes());
    key
}

fn ip_from_key(key: &[u8]) -> Option<IpAddr> {
    let tail: [u8; 17] = key.get(key.len().checked_sub(17)?..)?.try_into().ok()?;
    let value = u128::from_be_bytes(tail[1..].try_into().ok()?);
    match tail[0] {
        4 => u32::try_from(value)
            .ok()
            .map(|v| IpAddr::V4(std::net::Ipv4Addr::from(v))),
        6 => Some(IpAddr::V6(std::net::Ipv6Addr::from(value))),
        _ => None,
    }
}

fn key(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn lease_key(ip: IpAddr) -> Vec<u8> {
    key(&[b"a", &ip_key(ip)])
}

fn attachment_prefix(owner: &Attachment) -> Vec<u8> {
    key(&[
        b"c",
        owner.container_id.as_bytes(),
        b"\0",
        owner.ifname.as_bytes(),
        b"\0",
    ])
}

fn pod_prefix(namespace: &str, name: &str) -> Vec<u8> {
    key(&[b"p", namespace.as_bytes(), b"\0", name.as_bytes(), b"\0"])
}

fn identity_prefix(id: &PodIdentity) -> Vec<u8> {
    key(&[
        &pod_prefix(&id.namespace, &id.name),
        id.ifname.as_bytes(),
        b"\0",
    ])
}

fn index_keys(lease: &Lease) -> Vec<Vec<u8>> {
    let ip = ip_key(lease.ip);
    let mut keys = vec![key(&[&attachment_prefix(&lease.owner), &ip])];
    if let Some(id) = lease.identity() {
        keys.push(key(&[&identity_prefix(&id), &ip]));
    }
    if let LeaseState::Held { until } = lease.state {
        keys.push(key(&[b"h", &ip]));
        if let Some(until) = until {
            keys.push(key(&[b"e", &until.to_be_bytes(), &ip]));
        }
    }
    keys
}

/// Removes the `snap.*.generating` files an interrupted snapshot left in `dir`; returns how
/// many there were.
pub fn remove_stale_snapshots(dir: &Path) -> Result<usize, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_error("list", dir, e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| io_error("list", dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            std::fs::remove_file(entry.path()).map_err(|e| io_error("remove", &entry.path(), e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

impl SledStore {
    /// Opens (creating if needed) the database of a locked network directory.
    pub fn open(lock: NetworkLock, options: &SledOptions) -> Result<Self, StoreError> {
        let path = lock.dir().join(DB_DIR);
        if options.remove_stale_snapshots {
            remove_stale_snapshots(&path)?;
        }
        let config = sled::Config::new()
            .path(&path)
            .flush_every_ms(None)
            .cache_capacity(options.cache_bytes);
        let mut pause = Duration::from_micros(100);
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                // sled keeps its own lock on the database file until the last of its I/O
                // threads lets go, which in the previous holder of the network lock can be a
                // moment after that process released it on its way out.
                Err(e) if is_sled_lock_busy(&e) && Instant::now() < lock.deadline() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(4));
                }
                Err(e) if is_sled_lock_busy(&e) => {
                    return Err(StoreError::LockTimeout {
                        path: path.join("db").display().to_string(),
                        waited_ms: lock.waited.as_millis(),
                    });
                }
                Err(e) => return Err(db_error("open", &path, e)),
            }
        };
        if options.sync_names {
            // What sled creates or renames during open (conf, db, blobs/, snap.<lsn>) is only
            // durable once written and once its directory is: sled syncs neither.
            for file in [
                path.join("conf"),
                path.join("db"),
                path.clone(),
                lock.dir().to_path_buf(),
            ] {
                File::open(&file)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| io_error("sync", &file, e))?;
            }
        }
        let sync = if options.fdatasync_commits {
            let file = path.join("db");
            Some(File::open(&file).map_err(|e| io_error("open", &file, e))?)
        } else {
            None
        };
        let version = db
            .get(b"m:version")
            .map_err(|e| db_error("read", &path, e))?;
        let write_version = match version {
            None => true,
            Some(v) => {
                let found: u32 = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| StoreError::Corrupt {
                        key: "m:version".into(),
                        reason: "not a number".into(),
                    })?;
                if found > LAYOUT_VERSION {
                    return Err(StoreError::TooNew {
                        path: path.display().to_string(),
                        found,
                        supported: LAYOUT_VERSION,
                    });
                }
                false
            }
        };
        Ok(SledStore {
            db,
            sync,
            write_version,
            path,
            _lock: lock,
        })
    }

    fn err(&self, action: &'static str) -> impl FnOnce(sled::Error) -> StoreError + '_ {
        move |e| db_error(action, &self.path, e)
    }

    fn decode(key: &[u8], value: &[u8]) -> Result<Lease, StoreError> {
        serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
            key: String::from_utf8_lossy(key).into_owned(),
            reason: e.to_string(),
        })
    }

    /// Leases named by the index entries under `prefix`.
    fn by_index(&self, prefix: &[u8]) -> Result<Vec<Lease>, StoreError> {
        let mut leases = Vec::new();
        for entry in self.db.scan_prefix(prefix) {
            let (k, _) = entry.map_err(self.err("scan"))?;
            let ip = ip_from_key(&k).ok_or_else(|| StoreError::Corrupt {
                key: String::from_utf8_lossy(&k).into_owned(),
                reason: "index key does not end in an address".into(),
            })?;
            if let Some(lease) = self.lease(ip)? {
                leases.push(lease);
            }
        }
        Ok(leases)
    }
}

impl StoreRead for SledStore {
    fn lease(&self, ip: IpAddr) -> Result<Option<Lease>, StoreError> {
        let k = lease_key(ip);
        match self.db.get(&k).map_err(self.err("read"))? {
            Some(v) => Ok(Some(Self::decode(&k, &v)?)),
            None => Ok(None),
        }
    }

    fn leases_of_attachment(&self, owner: &Attachment) -> Result<Vec<Lease>, StoreError> {
        self.by_index(&attachment_prefix(owner))
    }

    fn leases_of_identity(&self, id: &PodIdentity) -> Result<Vec<Lease>, StoreError> {
        self.by_index(&identity_prefix(id))
    }

    fn leases_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Lease>, StoreError> {
        self.by_index(&pod_prefix(namespace, name))
    }

    fn expired(&self, now: u64) -> Result<Vec<Lease>, StoreError> {
        let low = key(&[b"e", &0u64.to_be_bytes()]);
        let high = key(&[b"e", &now.to_be_bytes(), &[0xff; 17]]);
        let mut leases = Vec::new();
        for entry in self.db.range(low..=high) {
            let (k, _) = entry.map_err(self.err("scan"))?;
            if let Some(lease) = ip_from_key(&k)
                .map(|ip| self.lease(ip))
                .transpose()?
                .flatten()
            {
                leases.push(lease);
            }
        }
        Ok(leases)
    }

    fn held(&self) -> Result<Vec<Lease>, StoreError> {
        self.by_index(b"h")
    }

    fn scan(
        &self,
        each: &mut dyn FnMut(Lease) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        for entry in self.db.scan_prefix(b"a") {
            let (k, v) = entry.map_err(self.err("scan"))?;
            each(Self::decode(&k, &v)?)?;
        }
        Ok(())
    }

    fn last_reserved(&self, range_set: &str) -> Result<Option<IpAddr>, StoreError> {
        let value = self
            .db
            .get(key(&[b"l", range_set.as_bytes()]))
            .map_err(self.err("read"))?;
        // Like host-local, an unreadable cursor only costs round-robin order.
        Ok(value.and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok()))
    }

    fn range_sets(&self) -> Result<Option<String>, StoreError> {
        let value = self.db.get(b"m:ranges").map_err(self.err("read"))?;
        Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    fn clock(&self) -> Result<Option<ClockMark>, StoreError> {
        let value = self.db.get(b"m:clock").map_err(self.err("read"))?;
        Ok(value.and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// The rejected candidate was measured before the reuse cooldown existed; it keeps no
    /// record of freed addresses (the comparison's workloads do not exercise the cooldown).
    fn freed_at(&self, _ip: IpAddr) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }
}

impl Store for SledStore {
    fn commit(&mut self, commit: Commit) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        // Removals first: a key removed for a lease's old value and inserted for its new one
        // must end up inserted.
        for change in &commit.leases {
            for k in change.before.iter().flat_map(index_keys) {
                batch.remove(k);
            }
        }
        for change in &commit.leases {
            match &change.after {
                Some(lease) => {
                    for k in index_keys(lease) {
                        batch.insert(k, &[][..]);
                    }
                    let json = serde_json::to_vec(lease).map_err(|e| StoreError::Corrupt {
                        key: lease.ip.to_string(),
                        reason: e.to_string(),
                    })?;
                    batch.insert(lease_key(change.ip), json);
                }
                None => batch.remove(lease_key(change.ip)),
            }
        }
        for (set, ip) in &commit.last_reserved {
            batch.insert(key(&[b"l", set.as_bytes()]), ip.to_string().as_bytes());
        }
        if let Some(ranges) = &commit.range_sets {
            batch.insert(&b"m:ranges"[..], ranges.as_bytes());
        }
        if let Some(clock) = &commit.clock {
            batch.insert(
                &b"m:clock"[..],
                serde_json::to_vec(clock).unwrap_or_default(),
            );
        }
        if self.write_version {
            batch.insert(&b"m:version"[..], LAYOUT_VERSION.to_string().as_bytes());
        }
        self.db.apply_batch(batch).map_err(self.err("write"))?;
        self.db.flush().map_err(self.err("flush"))?;
        if let Some(file) = &self.sync {
            file.sync_data()
                .map_err(|e| io_error("sync", &self.path.join("db"), e))?;
        }
        self.write_version = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_snapshot_names_sort_last() {
        // Why sled picks the interrupted snapshot: it sorts the candidates by name.
        let mut names = ["snap.00000000000000A0", "snap.00000000000000A0.generating"];
        names.sort();
        assert_eq!(names[1], "snap.00000000000000A0.generating");
    }

    #[test]
    fn index_keys_end_in_the_address() {
        let ip: IpAddr = "10.0.3.4".parse().unwrap_or(IpAddr::V4([0; 4].into()));
        assert_eq!(
            ip_from_key(&key(&[b"c", b"x\0eth0\0", &ip_key(ip)])),
            Some(ip)
        );
    }
}
