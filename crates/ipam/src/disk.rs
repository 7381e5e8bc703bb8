//! The on-disk store: one `sled` database per network, guarded by an exclusive `flock`.
//!
//! # Layout
//! ```text
//! <dataDir>/<network>/            0700, created on first use
//! <dataDir>/<network>/lock        0600, empty; flock(LOCK_EX) held for the whole command
//! <dataDir>/<network>/leases.db/  the sled database (files 0600 under the plugin's umask 077)
//! ```
//! Keys of the database's default tree (`ip` = family byte `4`/`6` + the address as a 16-byte
//! big-endian number, so keys sort by address):
//! ```text
//! a <ip>                                  → Lease as JSON          the truth, one per address
//! c <containerID> 0 <ifname> 0 <ip>       → ""                     index: owner attachment
//! p <namespace> 0 <pod> 0 <ifname> 0 <ip> → ""                     index: pod identity
//! e <until: u64 BE> <ip>                  → ""                     index: holdings by expiry
//! l <range set "start-end,…">             → address text           round-robin cursor
//! m:ranges                                → JSON of the range sets last configured
//! m:version                               → layout version (decimal)
//! ```
//! # Invariants
//! * Index entries exist exactly for the current `a` records: a commit removes the entries of
//!   each lease's previous value and inserts those of its new value in one `sled` batch, which
//!   sled applies atomically (all or nothing after a crash), then flushes before the command
//!   reports success. So an acknowledged ADD survives a crash, and a crash at any instant leaves
//!   either the old or the new state.
//! * One record per address means no address can have two owners.
//! * The lock is taken *before* the database is opened and released only after it is closed,
//!   so exactly one process has the database open at a time; the wait is bounded.
//! * Container IDs, interface names and pod names are only ever keys, never paths; the only
//!   path component taken from input is the network name, validated by [`validate_network_name`].

use std::fs::{DirBuilder, File, OpenOptions};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::lease::{Attachment, Lease, LeaseState, PodIdentity};
use crate::range::ip_to_u128;
use crate::store::{Commit, Store, StoreError};

/// Layout version written by this code.
pub const LAYOUT_VERSION: u32 = 1;
const DB_DIR: &str = "leases.db";
const LOCK_FILE: &str = "lock";

/// Why a network name cannot name a directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkNameError {
    /// Empty name.
    #[error("missing network name")]
    Missing,
    /// Characters outside `[a-zA-Z0-9_.-]`, or not starting with a letter or digit.
    #[error("invalid characters found in network name")]
    InvalidCharacters,
}

/// Checks a network name with the CNI rule `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, which also keeps it
/// a single safe path component (no `/`, never `.` or `..`).
pub fn validate_network_name(name: &str) -> Result<(), NetworkNameError> {
    let mut bytes = name.bytes();
    match bytes.next() {
        None => Err(NetworkNameError::Missing),
        Some(first) if !first.is_ascii_alphanumeric() => Err(NetworkNameError::InvalidCharacters),
        Some(_) if bytes.all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)) => Ok(()),
        Some(_) => Err(NetworkNameError::InvalidCharacters),
    }
}

/// The state directory of one network.
#[derive(Debug, Clone)]
pub struct NetworkDir {
    path: PathBuf,
}

/// The exclusive lock on a network directory; released when dropped.
#[derive(Debug)]
pub struct NetworkLock {
    _flock: Flock<File>,
    dir: PathBuf,
    /// How long acquiring it took.
    pub waited: Duration,
    /// The end of the bounded wait this lock was taken under.
    deadline: Instant,
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.display().to_string();
    move |source| StoreError::Io {
        action,
        path,
        source,
    }
}

impl NetworkDir {
    /// `<data_dir>/<network>`; the name must already be valid.
    pub fn new(data_dir: &Path, network: &str) -> Result<Self, NetworkNameError> {
        validate_network_name(network)?;
        Ok(NetworkDir {
            path: data_dir.join(network),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the directory has a database (for read-only admin commands).
    pub fn exists(&self) -> bool {
        self.path.join(DB_DIR).is_dir()
    }

    /// Creates the directory (0700) if needed and takes its lock, waiting at most `timeout`.
    pub fn lock(&self, timeout: Duration) -> Result<NetworkLock, StoreError> {
        let started = Instant::now();
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.path)
            .map_err(io_err("create", &self.path))?;
        let meta = std::fs::metadata(&self.path).map_err(io_err("inspect", &self.path))?;
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err("restrict permissions of", &self.path))?;
        }
        let lock_path = self.path.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_CLOEXEC)
            .open(&lock_path)
            .map_err(io_err("open", &lock_path))?;
        let flock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(flock) => flock,
            Err((file, Errno::EWOULDBLOCK | Errno::EINTR)) => {
                wait_for_lock(file, timeout.saturating_sub(started.elapsed()), &lock_path)?
            }
            Err((_, errno)) => {
                return Err(io_err("lock", &lock_path)(std::io::Error::from(errno)));
            }
        };
        Ok(NetworkLock {
            _flock: flock,
            dir: self.path.clone(),
            waited: started.elapsed(),
            deadline: started + timeout,
        })
    }
}

/// Waits for a contended lock with a *blocking* `flock`, so waiters are woken the moment it is
/// released (polling with back-off lets newcomers overtake long waiters: p99 waits of ~0.5 s
/// under 16-way load). The blocking call runs on a helper thread so the wait stays bounded; if
/// the bound passes first, the thread releases the lock as soon as it gets it.
fn wait_for_lock(file: File, timeout: Duration, path: &Path) -> Result<Flock<File>, StoreError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let mut file = file;
        loop {
            match Flock::lock(file, FlockArg::LockExclusive) {
                Err((f, Errno::EINTR)) => file = f,
                // If the waiter gave up, the channel is gone and the lock is dropped here.
                result => {
                    let _ = tx.send(result.map_err(|(_, errno)| errno));
                    return;
                }
            }
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(flock)) => Ok(flock),
        Ok(Err(errno)) => Err(io_err("lock", path)(std::io::Error::from(errno))),
        Err(_) => Err(StoreError::LockTimeout {
            path: path.display().to_string(),
            waited_ms: timeout.as_millis(),
        }),
    }
}

/// The sled-backed [`Store`]. Holds the network lock for its whole life.
#[derive(Debug)]
pub struct DiskStore {
    // Field order matters: the database closes before the lock is released.
    db: sled::Db,
    write_version: bool,
    _lock: NetworkLock,
}

/// sled reports its file lock being held as an `Other` I/O error with this text (sled 0.34).
fn is_sled_lock_busy(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().starts_with("could not acquire lock"))
}

fn db_err(action: &'static str) -> impl FnOnce(sled::Error) -> StoreError {
    move |source| StoreError::Database { action, source }
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
    if let LeaseState::Held { until: Some(until) } = lease.state {
        keys.push(key(&[b"e", &until.to_be_bytes(), &ip]));
    }
    keys
}

impl DiskStore {
    /// Opens (creating if needed) the database of a locked network directory.
    pub fn open(lock: NetworkLock) -> Result<Self, StoreError> {
        let path = lock.dir.join(DB_DIR);
        let config = sled::Config::new()
            .path(&path)
            .flush_every_ms(None)
            .cache_capacity(16 << 20);
        let mut pause = Duration::from_micros(100);
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                // sled keeps its own lock on the database file until the last of its I/O
                // threads lets go, which in the previous holder of the network lock can be a
                // moment after that process released it on its way out. Data is already
                // flushed by then; wait for the file to be let go, within the same bound.
                Err(e) if is_sled_lock_busy(&e) && Instant::now() < lock.deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(4));
                }
                Err(e) if is_sled_lock_busy(&e) => {
                    return Err(StoreError::LockTimeout {
                        path: path.join("db").display().to_string(),
                        waited_ms: lock.waited.as_millis(),
                    });
                }
                Err(e) => return Err(db_err("open")(e)),
            }
        };
        let version = db.get(b"m:version").map_err(db_err("read"))?;
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
        Ok(DiskStore {
            db,
            write_version,
            _lock: lock,
        })
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
            let (k, _) = entry.map_err(db_err("scan"))?;
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

impl Store for DiskStore {
    fn lease(&self, ip: IpAddr) -> Result<Option<Lease>, StoreError> {
        let k = lease_key(ip);
        match self.db.get(&k).map_err(db_err("read"))? {
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
            let (k, _) = entry.map_err(db_err("scan"))?;
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

    fn all(&self) -> Result<Vec<Lease>, StoreError> {
        self.db
            .scan_prefix(b"a")
            .map(|entry| {
                let (k, v) = entry.map_err(db_err("scan"))?;
                Self::decode(&k, &v)
            })
            .collect()
    }

    fn last_reserved(&self, range_set: &str) -> Result<Option<IpAddr>, StoreError> {
        let value = self
            .db
            .get(key(&[b"l", range_set.as_bytes()]))
            .map_err(db_err("read"))?;
        // Like host-local, an unreadable cursor only costs round-robin order.
        Ok(value.and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok()))
    }

    fn range_sets(&self) -> Result<Option<String>, StoreError> {
        let value = self.db.get(b"m:ranges").map_err(db_err("read"))?;
        Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

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
        if self.write_version {
            batch.insert(&b"m:version"[..], LAYOUT_VERSION.to_string().as_bytes());
        }
        self.db.apply_batch(batch).map_err(db_err("write"))?;
        self.db.flush().map_err(db_err("flush"))?;
        self.write_version = false;
        Ok(())
    }
}
