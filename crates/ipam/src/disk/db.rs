//! The redb database of one network: [`DiskStore`] (reads and durable commits, under the
//! network's lock) and [`DiskSnapshot`] (a consistent read-only view that needs no lock).
//!
//! # Tables (layout version 2)
//! `ip` is the address as 17 bytes: family byte `4`/`6`, then the address as a 16-byte
//! big-endian number, so keys sort by address.
//! ```text
//! leases     ip                                 → Lease as JSON      the truth, one per address
//! by_owner   (container ID, ifname, ip)         → ()                 index: owner attachment
//! by_pod     (namespace, pod, ifname, ip)       → ()                 index: pod identity
//! by_expiry  (until, ip)                        → ()                 index: timed holdings
//! cursors    range set "start-end,…"            → address text       round-robin cursor
//! meta       "version"                          → "2"
//!            "ranges"                           → JSON of the range sets last configured
//!            "clock"                            → the store's clock (crate::clock)
//! freed      ip                                 → store time         free addresses, when freed
//! freed_order (store time, ip)                  → ()                 index of `freed`, oldest first
//! ```
//! `freed` serves the reuse cooldown and is kept small by [`super::freed`].
//! Index entries exist exactly for the current `leases` records: a commit removes the entries of
//! each lease's previous value and inserts those of its new value in the same transaction, which
//! redb makes atomic and durable (fsync before `commit` returns). Tuple keys are length-prefixed
//! by redb, so no container ID, interface or pod name can make two keys collide.

use std::cell::{Ref, RefCell};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redb::{Database, DatabaseError, Durability, ReadOnlyTable, ReadableDatabase, TableDefinition};

use super::freed::{self, FREED, FREED_ORDER};
use super::{NetworkLock, io_err};
use crate::clock::ClockMark;
use crate::lease::{Attachment, Lease, LeaseState, PodIdentity};
use crate::range::ip_to_u128;
use crate::store::{Commit, Store, StoreError, StoreRead};

/// Layout version written by this code: the tables in this module's documentation, in one redb
/// file. A store of a newer layout is refused, never read.
pub const LAYOUT_VERSION: u32 = 2;

type IpKey = [u8; 17];

const LEASES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("leases");
const BY_OWNER: TableDefinition<(&str, &str, &[u8]), ()> = TableDefinition::new("by_owner");
const BY_POD: TableDefinition<(&str, &str, &str, &[u8]), ()> = TableDefinition::new("by_pod");
const BY_EXPIRY: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("by_expiry");
const CURSORS: TableDefinition<&str, &str> = TableDefinition::new("cursors");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

const MIN_IP: &[u8] = &[];
const MAX_IP: &[u8] = &[0xff; 17];
/// Above every interface name (they are short ASCII).
const MAX_STR: &str = "\u{10FFFF}";

/// How a store is opened.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// redb's page cache.
    pub cache_bytes: usize,
    /// Verify every page's checksum on open, refusing a damaged file instead of trusting it
    /// (reads the whole file: for a long-lived opener such as the node agent).
    pub verify: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            cache_bytes: 4 << 20,
            verify: false,
        }
    }
}

pub(super) fn ip_key(ip: IpAddr) -> IpKey {
    let mut key = [0u8; 17];
    key[0] = if ip.is_ipv4() { 4 } else { 6 };
    key[1..].copy_from_slice(&ip_to_u128(ip).to_be_bytes());
    key
}

fn ip_from_key(key: &[u8]) -> Option<IpAddr> {
    let key: &IpKey = key.try_into().ok()?;
    let value = u128::from_be_bytes(key[1..].try_into().ok()?);
    match key[0] {
        4 => u32::try_from(value)
            .ok()
            .map(|v| IpAddr::V4(std::net::Ipv4Addr::from(v))),
        6 => Some(IpAddr::V6(std::net::Ipv6Addr::from(value))),
        _ => None,
    }
}

/// Turns any redb error into a [`StoreError`], telling a full file system apart.
fn db_error(action: &'static str, path: &Path, e: impl Into<redb::Error>) -> StoreError {
    match e.into() {
        redb::Error::Io(io) => io_err(action, path)(io),
        other => StoreError::Database {
            action,
            path: path.display().to_string(),
            reason: other.to_string(),
        },
    }
}

fn decode(key: &[u8], value: &[u8]) -> Result<Lease, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        key: ip_from_key(key).map_or_else(|| format!("{key:?}"), |ip| ip.to_string()),
        reason: e.to_string(),
    })
}

fn corrupt_index(key: &[u8]) -> StoreError {
    StoreError::Corrupt {
        key: format!("{key:?}"),
        reason: "index entry does not end in an address".into(),
    }
}

/// Every table of one read transaction: a consistent view of the store.
struct ReadTables {
    path: PathBuf,
    leases: ReadOnlyTable<&'static [u8], &'static [u8]>,
    by_owner: ReadOnlyTable<(&'static str, &'static str, &'static [u8]), ()>,
    by_pod: ReadOnlyTable<(&'static str, &'static str, &'static str, &'static [u8]), ()>,
    by_expiry: ReadOnlyTable<(u64, &'static [u8]), ()>,
    cursors: ReadOnlyTable<&'static str, &'static str>,
    meta: ReadOnlyTable<&'static str, &'static [u8]>,
    /// `None` in a store that has not freed anything since it learnt the table.
    freed: Option<ReadOnlyTable<&'static [u8], u64>>,
}

impl ReadTables {
    fn begin(db: &Database, path: &Path) -> Result<Self, StoreError> {
        let txn = db.begin_read().map_err(|e| db_error("read", path, e))?;
        let err = |e: redb::TableError| db_error("open a table of", path, e);
        Ok(ReadTables {
            path: path.to_path_buf(),
            leases: txn.open_table(LEASES).map_err(err)?,
            by_owner: txn.open_table(BY_OWNER).map_err(err)?,
            by_pod: txn.open_table(BY_POD).map_err(err)?,
            by_expiry: txn.open_table(BY_EXPIRY).map_err(err)?,
            cursors: txn.open_table(CURSORS).map_err(err)?,
            meta: txn.open_table(META).map_err(err)?,
            freed: match txn.open_table(FREED) {
                Ok(t) => Some(t),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(err(e)),
            },
        })
    }

    fn err(&self, action: &'static str, e: redb::StorageError) -> StoreError {
        db_error(action, &self.path, e)
    }

    fn lease_at(&self, key: &[u8]) -> Result<Option<Lease>, StoreError> {
        match self.leases.get(key).map_err(|e| self.err("read", e))? {
            Some(v) => Ok(Some(decode(key, v.value())?)),
            None => Ok(None),
        }
    }

    /// Leases named by index entries, given their address keys.
    fn leases_at(&self, keys: Vec<Vec<u8>>) -> Result<Vec<Lease>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if ip_from_key(&key).is_none() {
                return Err(corrupt_index(&key));
            }
            out.extend(self.lease_at(&key)?);
        }
        Ok(out)
    }
}

impl StoreRead for ReadTables {
    fn lease(&self, ip: IpAddr) -> Result<Option<Lease>, StoreError> {
        self.lease_at(&ip_key(ip))
    }

    fn leases_of_attachment(&self, owner: &Attachment) -> Result<Vec<Lease>, StoreError> {
        let (c, i) = (owner.container_id.as_str(), owner.ifname.as_str());
        let mut keys = Vec::new();
        for entry in self
            .by_owner
            .range((c, i, MIN_IP)..=(c, i, MAX_IP))
            .map_err(|e| self.err("scan", e))?
        {
            keys.push(entry.map_err(|e| self.err("scan", e))?.0.value().2.to_vec());
        }
        self.leases_at(keys)
    }

    fn leases_of_identity(&self, id: &PodIdentity) -> Result<Vec<Lease>, StoreError> {
        let (n, p, i) = (id.namespace.as_str(), id.name.as_str(), id.ifname.as_str());
        let mut keys = Vec::new();
        for entry in self
            .by_pod
            .range((n, p, i, MIN_IP)..=(n, p, i, MAX_IP))
            .map_err(|e| self.err("scan", e))?
        {
            keys.push(entry.map_err(|e| self.err("scan", e))?.0.value().3.to_vec());
        }
        self.leases_at(keys)
    }

    fn leases_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Lease>, StoreError> {
        let mut keys = Vec::new();
        for entry in self
            .by_pod
            .range((namespace, name, "", MIN_IP)..=(namespace, name, MAX_STR, MAX_IP))
            .map_err(|e| self.err("scan", e))?
        {
            keys.push(entry.map_err(|e| self.err("scan", e))?.0.value().3.to_vec());
        }
        self.leases_at(keys)
    }

    fn expired(&self, now: u64) -> Result<Vec<Lease>, StoreError> {
        let mut keys = Vec::new();
        for entry in self
            .by_expiry
            .range((0, MIN_IP)..=(now, MAX_IP))
            .map_err(|e| self.err("scan", e))?
        {
            keys.push(entry.map_err(|e| self.err("scan", e))?.0.value().1.to_vec());
        }
        self.leases_at(keys)
    }

    fn scan(
        &self,
        each: &mut dyn FnMut(Lease) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        for entry in self
            .leases
            .range::<&[u8]>(..)
            .map_err(|e| self.err("scan", e))?
        {
            let (k, v) = entry.map_err(|e| self.err("scan", e))?;
            each(decode(k.value(), v.value())?)?;
        }
        Ok(())
    }

    fn last_reserved(&self, range_set: &str) -> Result<Option<IpAddr>, StoreError> {
        let value = self
            .cursors
            .get(range_set)
            .map_err(|e| self.err("read", e))?;
        // Like host-local, an unreadable cursor only costs round-robin order.
        Ok(value.and_then(|v| v.value().parse().ok()))
    }

    fn range_sets(&self) -> Result<Option<String>, StoreError> {
        let value = self.meta.get("ranges").map_err(|e| self.err("read", e))?;
        Ok(value.map(|v| String::from_utf8_lossy(v.value()).into_owned()))
    }

    fn clock(&self) -> Result<Option<ClockMark>, StoreError> {
        let Some(v) = self.meta.get("clock").map_err(|e| self.err("read", e))? else {
            return Ok(None);
        };
        // An unreadable clock mark only costs the protection against wall-clock jumps.
        Ok(serde_json::from_slice(v.value()).ok())
    }

    fn freed_at(&self, ip: IpAddr) -> Result<Option<u64>, StoreError> {
        let Some(freed) = &self.freed else {
            return Ok(None);
        };
        let value = freed
            .get(&ip_key(ip)[..])
            .map_err(|e| self.err("read", e))?;
        Ok(value.map(|v| v.value()))
    }
}

/// A consistent, read-only view of a store as of one moment. It needs no lock: decisions made
/// from it are re-checked under the lock before they are applied.
pub struct DiskSnapshot(ReadTables);

impl std::fmt::Debug for DiskSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DiskSnapshot").field(&self.0.path).finish()
    }
}

/// The redb-backed [`Store`] of one network. Holds the network lock for its whole life.
pub struct DiskStore {
    // Field order matters: the database closes before the lock is released.
    db: Database,
    /// The read transaction of the current command, dropped at every commit.
    reads: RefCell<Option<ReadTables>>,
    /// A commit failed: redb refuses further writes until the database is reopened.
    poisoned: bool,
    path: PathBuf,
    _lock: NetworkLock,
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStore")
            .field("path", &self.path)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl DiskStore {
    /// Opens the database of a locked network directory, creating it first if there is none.
    /// A database a crash interrupted is repaired here; a damaged or foreign file is refused.
    pub fn open(lock: NetworkLock, options: &OpenOptions) -> Result<Self, StoreError> {
        let path = lock.dir().join(super::DB_FILE);
        // Only a file that is certainly absent is created: an error while looking (EIO,
        // EACCES) must never lead to a fresh database renamed over an existing one.
        if !path.try_exists().map_err(io_err("inspect", &path))? {
            create(lock.dir(), &path)?;
        }
        let db = open_existing(&path, options, lock.deadline())?;
        let store = DiskStore {
            db,
            reads: RefCell::default(),
            poisoned: false,
            path,
            _lock: lock,
        };
        store.check_version()?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a commit failed, after which the store must be closed and opened again.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// A consistent read-only view as of now, usable without this store's lock.
    pub fn snapshot(&self) -> Result<DiskSnapshot, StoreError> {
        ReadTables::begin(&self.db, &self.path).map(DiskSnapshot)
    }

    fn check_version(&self) -> Result<(), StoreError> {
        let tables = self.tables()?;
        let value = tables
            .meta
            .get("version")
            .map_err(|e| tables.err("read", e))?;
        let found = value
            .and_then(|v| std::str::from_utf8(v.value()).ok()?.parse::<u32>().ok())
            .ok_or_else(|| StoreError::Corrupt {
                key: "meta/version".into(),
                reason: format!("{} is not an ipkeep lease database", self.path.display()),
            })?;
        if found > LAYOUT_VERSION {
            return Err(StoreError::TooNew {
                path: self.path.display().to_string(),
                found,
                supported: LAYOUT_VERSION,
            });
        }
        Ok(())
    }

    fn tables(&self) -> Result<Ref<'_, ReadTables>, StoreError> {
        if self.reads.borrow().is_none() {
            let tables = ReadTables::begin(&self.db, &self.path)?;
            *self.reads.borrow_mut() = Some(tables);
        }
        Ref::filter_map(self.reads.borrow(), Option::as_ref).map_err(|_| StoreError::Database {
            action: "read",
            path: self.path.display().to_string(),
            reason: "read transaction vanished".into(),
        })
    }

    fn write(&self, commit: &Commit) -> Result<(), StoreError> {
        let path = self.path.as_path();
        let mut txn = self
            .db
            .begin_write()
            .map_err(|e| db_error("begin a write to", path, e))?;
        let w = |e: redb::StorageError| db_error("write", path, e);
        let t = |e: redb::TableError| db_error("write", path, e);
        txn.set_durability(Durability::Immediate)
            .map_err(|e| StoreError::Database {
                action: "write",
                path: self.path.display().to_string(),
                reason: e.to_string(),
            })?;
        {
            let mut leases = txn.open_table(LEASES).map_err(t)?;
            let mut by_owner = txn.open_table(BY_OWNER).map_err(t)?;
            let mut by_pod = txn.open_table(BY_POD).map_err(t)?;
            let mut by_expiry = txn.open_table(BY_EXPIRY).map_err(t)?;
            let mut index = |lease: &Lease, insert: bool| -> Result<(), redb::StorageError> {
                let ip = ip_key(lease.ip);
                let owner = (
                    lease.owner.container_id.as_str(),
                    lease.owner.ifname.as_str(),
                    &ip[..],
                );
                let pod = lease.pod.as_ref().map(|p| {
                    (
                        p.namespace.as_str(),
                        p.name.as_str(),
                        lease.owner.ifname.as_str(),
                        &ip[..],
                    )
                });
                let until = match lease.state {
                    LeaseState::Held { until } => until,
                    LeaseState::Active => None,
                };
                if insert {
                    by_owner.insert(owner, ())?;
                    if let Some(k) = pod {
                        by_pod.insert(k, ())?;
                    }
                    if let Some(t) = until {
                        by_expiry.insert((t, &ip[..]), ())?;
                    }
                } else {
                    by_owner.remove(owner)?;
                    if let Some(k) = pod {
                        by_pod.remove(k)?;
                    }
                    if let Some(t) = until {
                        by_expiry.remove((t, &ip[..]))?;
                    }
                }
                Ok(())
            };
            // Removals first: an entry removed for a lease's old value and inserted for its
            // new one must end up inserted.
            for change in &commit.leases {
                if let Some(before) = &change.before {
                    index(before, false).map_err(w)?;
                }
            }
            for change in &commit.leases {
                let key = ip_key(change.ip);
                match &change.after {
                    Some(lease) => {
                        index(lease, true).map_err(w)?;
                        let json = serde_json::to_vec(lease).map_err(|e| StoreError::Corrupt {
                            key: lease.ip.to_string(),
                            reason: e.to_string(),
                        })?;
                        leases.insert(&key[..], json.as_slice()).map_err(w)?;
                    }
                    None => {
                        leases.remove(&key[..]).map_err(w)?;
                    }
                }
            }
            let mut cursors = txn.open_table(CURSORS).map_err(t)?;
            for (set, ip) in &commit.last_reserved {
                cursors
                    .insert(set.as_str(), ip.to_string().as_str())
                    .map_err(w)?;
            }
            let mut meta = txn.open_table(META).map_err(t)?;
            if let Some(ranges) = &commit.range_sets {
                meta.insert("ranges", ranges.as_bytes()).map_err(w)?;
            }
            if let Some(clock) = &commit.clock {
                let json = serde_json::to_vec(clock).unwrap_or_default();
                meta.insert("clock", json.as_slice()).map_err(w)?;
            }
            if !commit.freed.is_empty() || commit.forget_freed_until.is_some() {
                let mut freed = txn.open_table(FREED).map_err(t)?;
                let mut order = txn.open_table(FREED_ORDER).map_err(t)?;
                freed::remember(&mut freed, &mut order, commit).map_err(w)?;
            }
        }
        txn.commit().map_err(|e| db_error("commit to", path, e))
    }
}

// Each read runs in the read transaction the store keeps until its next commit.
crate::forward_store_read!(impl[] for DiskStore, |this| this.tables()?);

impl Store for DiskStore {
    fn commit(&mut self, commit: Commit) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Database {
                action: "write",
                path: self.path.display().to_string(),
                reason: "an earlier commit failed; the store must be opened again".into(),
            });
        }
        // The next command reads what this one wrote.
        *self.reads.get_mut() = None;
        let result = self.write(&commit);
        self.poisoned = result.is_err();
        result
    }
}

crate::forward_store_read!(impl[] for DiskSnapshot, |this| this.0);

/// Creates a new, empty database at `path` atomically: built under a temporary name, synced,
/// then renamed into place, so a crash during creation leaves no half-made file behind.
fn create(dir: &Path, path: &Path) -> Result<(), StoreError> {
    let tmp = dir.join(format!("{}.new", super::DB_FILE));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io_err("remove", &tmp)(e));
        }
        _ => {}
    }
    {
        let db = redb::Builder::new()
            .create(&tmp)
            .map_err(|e| db_error("create", &tmp, e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err("restrict permissions of", &tmp))?;
        let init = |e: redb::Error| db_error("initialise", &tmp, e);
        let txn = db.begin_write().map_err(|e| init(e.into()))?;
        {
            let t = |e: redb::TableError| init(e.into());
            txn.open_table(LEASES).map_err(t)?;
            txn.open_table(BY_OWNER).map_err(t)?;
            txn.open_table(BY_POD).map_err(t)?;
            txn.open_table(BY_EXPIRY).map_err(t)?;
            txn.open_table(CURSORS).map_err(t)?;
            txn.open_table(FREED).map_err(t)?;
            txn.open_table(FREED_ORDER).map_err(t)?;
            let mut meta = txn.open_table(META).map_err(t)?;
            meta.insert("version", LAYOUT_VERSION.to_string().as_bytes())
                .map_err(|e| init(e.into()))?;
        }
        txn.commit().map_err(|e| init(e.into()))?;
    }
    std::fs::rename(&tmp, path).map_err(io_err("rename into place", &tmp))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync", dir))
}

/// Opens an existing database, waiting (within the lock's bound) for a previous holder's file
/// lock to be let go.
fn open_existing(
    path: &Path,
    options: &OpenOptions,
    deadline: Instant,
) -> Result<Database, StoreError> {
    let mut builder = redb::Builder::new();
    builder
        .set_cache_size(options.cache_bytes)
        .set_check_integrity_on_open(options.verify);
    let mut pause = Duration::from_micros(100);
    loop {
        match builder.open(path) {
            Ok(db) => return Ok(db),
            Err(DatabaseError::DatabaseAlreadyOpen) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(4));
            }
            Err(DatabaseError::DatabaseAlreadyOpen) => {
                return Err(StoreError::LockTimeout {
                    path: path.display().to_string(),
                    waited_ms: 0,
                });
            }
            Err(e) => return Err(db_error("open", path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn address_keys_round_trip_and_sort() {
        let ips: Vec<IpAddr> = ["10.0.0.1", "10.0.0.2", "255.255.255.255", "::1", "fd00::1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let keys: Vec<IpKey> = ips.iter().map(|ip| ip_key(*ip)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        for (ip, key) in ips.iter().zip(&keys) {
            assert_eq!(ip_from_key(key), Some(*ip));
        }
        assert_eq!(ip_from_key(&[9; 17]), None);
        assert_eq!(ip_from_key(&[4; 3]), None);
    }
}
