//! The `Store` trait the allocator works against, and its in-memory twin for tests.
//!
//! A store answers point and index queries over the leases of one network and applies a
//! [`Commit`] atomically: after a crash either all of it is visible or none of it. Callers
//! serialise access (the on-disk store holds an exclusive lock for its whole lifetime), so a
//! store needs no optimistic concurrency of its own.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::lease::{Attachment, Lease, LeaseState, PodIdentity};

/// Why the store could not answer or write.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process held the network's lock for longer than the allowed wait.
    #[error(
        "timed out after {waited_ms} ms waiting for the lock on {path}; another ipkeep process holds it, try again later"
    )]
    LockTimeout {
        /// The lock file.
        path: String,
        /// How long we waited.
        waited_ms: u128,
    },
    /// A file-system operation failed.
    #[error("failed to {action} {path}: {source}")]
    Io {
        /// What we were doing.
        action: &'static str,
        /// On which path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The database failed.
    #[error("failed to {action} the lease database: {source}")]
    Database {
        /// What we were doing.
        action: &'static str,
        /// sled's error.
        source: sled::Error,
    },
    /// A record could not be decoded (the database was written by something else).
    #[error("failed to decode the stored record {key}: {reason}")]
    Corrupt {
        /// The key, printable.
        key: String,
        /// Why.
        reason: String,
    },
    /// The store was written by a newer ipkeep.
    #[error(
        "the lease database at {path} has layout version {found}; this ipkeep understands up to {supported}; upgrade ipkeep"
    )]
    TooNew {
        /// Database path.
        path: String,
        /// Version found.
        found: u32,
        /// Version we write.
        supported: u32,
    },
}

/// One lease's transition inside a commit. `before` is the committed value the change was
/// computed from, so a store can drop stale index entries without reading again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseChange {
    /// The address.
    pub ip: IpAddr,
    /// Committed value before the change.
    pub before: Option<Lease>,
    /// Value after the change (`None` frees the address).
    pub after: Option<Lease>,
}

/// Everything one command writes, applied atomically and durably.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Commit {
    /// Lease transitions, at most one per address.
    pub leases: Vec<LeaseChange>,
    /// New round-robin cursors, keyed by range-set description.
    pub last_reserved: Vec<(String, IpAddr)>,
    /// The network's range sets as last configured (JSON), for `ipkeep list`.
    pub range_sets: Option<String>,
}

impl Commit {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty() && self.last_reserved.is_empty() && self.range_sets.is_none()
    }
}

/// Lease storage for one network.
pub trait Store {
    /// The lease on `ip`, if any.
    fn lease(&self, ip: IpAddr) -> Result<Option<Lease>, StoreError>;
    /// Leases whose current owner is `owner` (active or held).
    fn leases_of_attachment(&self, owner: &Attachment) -> Result<Vec<Lease>, StoreError>;
    /// Leases of one pod identity (active or held).
    fn leases_of_identity(&self, id: &PodIdentity) -> Result<Vec<Lease>, StoreError>;
    /// Leases of a pod on any interface.
    fn leases_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Lease>, StoreError>;
    /// Held leases whose holding ended at or before `now`.
    fn expired(&self, now: u64) -> Result<Vec<Lease>, StoreError>;
    /// Every lease, in address order.
    fn all(&self) -> Result<Vec<Lease>, StoreError>;
    /// The round-robin cursor of a range set.
    fn last_reserved(&self, range_set: &str) -> Result<Option<IpAddr>, StoreError>;
    /// The range sets recorded by the last ADD (JSON), if any.
    fn range_sets(&self) -> Result<Option<String>, StoreError>;
    /// Applies a commit atomically and durably.
    fn commit(&mut self, commit: Commit) -> Result<(), StoreError>;
}

/// In-memory store: the reference model the on-disk store is tested against.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    leases: BTreeMap<IpAddr, Lease>,
    last_reserved: BTreeMap<String, IpAddr>,
    range_sets: Option<String>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn filter(&self, keep: impl Fn(&Lease) -> bool) -> Vec<Lease> {
        self.leases.values().filter(|l| keep(l)).cloned().collect()
    }
}

impl Store for MemoryStore {
    fn lease(&self, ip: IpAddr) -> Result<Option<Lease>, StoreError> {
        Ok(self.leases.get(&ip).cloned())
    }

    fn leases_of_attachment(&self, owner: &Attachment) -> Result<Vec<Lease>, StoreError> {
        Ok(self.filter(|l| &l.owner == owner))
    }

    fn leases_of_identity(&self, id: &PodIdentity) -> Result<Vec<Lease>, StoreError> {
        Ok(self.filter(|l| l.identity().as_ref() == Some(id)))
    }

    fn leases_of_pod(&self, namespace: &str, name: &str) -> Result<Vec<Lease>, StoreError> {
        Ok(self.filter(|l| {
            l.pod
                .as_ref()
                .is_some_and(|p| p.namespace == namespace && p.name == name)
        }))
    }

    fn expired(&self, now: u64) -> Result<Vec<Lease>, StoreError> {
        Ok(self.filter(|l| l.is_expired(now)))
    }

    fn all(&self) -> Result<Vec<Lease>, StoreError> {
        Ok(self.filter(|_| true))
    }

    fn last_reserved(&self, range_set: &str) -> Result<Option<IpAddr>, StoreError> {
        Ok(self.last_reserved.get(range_set).copied())
    }

    fn range_sets(&self) -> Result<Option<String>, StoreError> {
        Ok(self.range_sets.clone())
    }

    fn commit(&mut self, commit: Commit) -> Result<(), StoreError> {
        for change in commit.leases {
            match change.after {
                Some(lease) => self.leases.insert(change.ip, lease),
                None => self.leases.remove(&change.ip),
            };
        }
        self.last_reserved.extend(commit.last_reserved);
        if commit.range_sets.is_some() {
            self.range_sets = commit.range_sets;
        }
        Ok(())
    }
}

/// Counts of a store's leases by state, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    /// Active leases.
    pub active: usize,
    /// Held leases (expired or not).
    pub held: usize,
}

impl LeaseCounts {
    /// Counts `leases`.
    pub fn of<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> Self {
        leases.into_iter().fold(Self::default(), |mut c, l| {
            match l.state {
                LeaseState::Active => c.active += 1,
                LeaseState::Held { .. } => c.held += 1,
            }
            c
        })
    }
}
