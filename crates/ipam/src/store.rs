//! The store traits the allocator works against, and the in-memory twin for tests.
//!
//! A store answers point and index queries over the leases of one network ([`StoreRead`]) and
//! applies a [`Commit`] atomically and durably ([`Store`]): after a crash either all of it is
//! visible or none of it, and once `commit` returns `Ok` it survives a power loss. Callers
//! serialise writers (the on-disk store is used under an exclusive lock), so a store needs no
//! optimistic concurrency of its own. A read-only snapshot ([`StoreRead`] alone) may be read
//! while a writer works; decisions made from one are re-checked under the lock before they are
//! applied (see `allocator::release_held`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::clock::ClockMark;
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
    /// The file system holding the store is full.
    #[error(
        "failed to {action} {path}: the file system is full (no space left on device); free space under ipam.dataDir, then the runtime's retry will succeed"
    )]
    NoSpace {
        /// What we were doing.
        action: &'static str,
        /// On which path.
        path: String,
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
    #[error("failed to {action} the lease database {path}: {reason}")]
    Database {
        /// What we were doing.
        action: &'static str,
        /// The database file.
        path: String,
        /// The database's error, as text.
        reason: String,
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
    /// The command ran out of the time its caller gave it before it could commit; nothing was
    /// written (the caller has already given up on the answer).
    #[error(
        "gave up before committing: the caller stopped waiting {late_ms} ms ago; nothing was written"
    )]
    PastDeadline {
        /// How late the commit would have been.
        late_ms: u128,
    },
}

impl StoreError {
    /// Whether retrying the same command later can succeed without anyone changing anything
    /// but time or disk space (CNI code 11).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::LockTimeout { .. }
                | StoreError::NoSpace { .. }
                | StoreError::PastDeadline { .. }
        )
    }
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
    /// The store's clock after this command (see [`crate::clock`]).
    pub clock: Option<ClockMark>,
    /// When addresses this commit frees were freed (`Some(now)`), and addresses it hands out
    /// again (`None`: forget when they were freed). Read back by [`StoreRead::freed_at`] for the
    /// reuse cooldown.
    pub freed: Vec<(IpAddr, Option<u64>)>,
    /// Forget when addresses were freed at or before this time (store clock): past the reuse
    /// cooldown a freed address is as free as any other, and remembering it would only grow
    /// the store (on an IPv6 range, round robin may never come back to it).
    pub forget_freed_until: Option<u64>,
}

/// The most freed addresses a store remembers for the reuse cooldown; past it, the ones freed
/// longest ago are forgotten first (they are the first a cooldown would let go anyway). A node
/// frees far fewer addresses than this within any sensible cooldown.
pub const MAX_FREED_REMEMBERED: usize = 4096;

impl Commit {
    /// Whether there is nothing to write (a clock mark alone is not worth a write).
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty() && self.last_reserved.is_empty() && self.range_sets.is_none()
    }
}

/// Read access to the leases of one network.
pub trait StoreRead {
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
    /// Calls `each` with every lease in address order, without collecting them; stops at the
    /// first error `each` returns.
    fn scan(&self, each: &mut dyn FnMut(Lease) -> Result<(), StoreError>)
    -> Result<(), StoreError>;
    /// The round-robin cursor of a range set.
    fn last_reserved(&self, range_set: &str) -> Result<Option<IpAddr>, StoreError>;
    /// The range sets recorded by the last ADD (JSON), if any.
    fn range_sets(&self) -> Result<Option<String>, StoreError>;
    /// The store's clock as of its last commit.
    fn clock(&self) -> Result<Option<ClockMark>, StoreError>;
    /// When a free address was last freed (store-clock seconds), if the store remembers it.
    fn freed_at(&self, ip: IpAddr) -> Result<Option<u64>, StoreError>;

    /// Every held lease (timed or forever), in address order. Reads every lease: for rare
    /// decisions only (a full range).
    fn held(&self) -> Result<Vec<Lease>, StoreError> {
        let mut out = Vec::new();
        self.scan(&mut |l| {
            if !l.is_active() {
                out.push(l);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Every lease, in address order.
    fn all(&self) -> Result<Vec<Lease>, StoreError> {
        let mut out = Vec::new();
        self.scan(&mut |l| {
            out.push(l);
            Ok(())
        })?;
        Ok(out)
    }
}

/// Implements [`StoreRead`] for a type that reads through another store: every required method
/// forwards to the store that `|this| expr` names (`expr` may use `?`, for a store that has to
/// be reached first); `held` and `all` keep their defaults.
///
/// ```ignore
/// ipkeep_ipam::forward_store_read!(impl[S: StoreRead] for Wrapper<S>, |this| this.inner);
/// ```
#[macro_export]
macro_rules! forward_store_read {
    (impl[$($generics:tt)*] for $ty:ty, |$this:ident| $to:expr) => {
        impl<$($generics)*> $crate::StoreRead for $ty {
            fn lease(
                &self,
                ip: ::std::net::IpAddr,
            ) -> ::std::result::Result<::std::option::Option<$crate::Lease>, $crate::StoreError> {
                let $this = self;
                $to.lease(ip)
            }
            fn leases_of_attachment(
                &self,
                owner: &$crate::Attachment,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::Lease>, $crate::StoreError> {
                let $this = self;
                $to.leases_of_attachment(owner)
            }
            fn leases_of_identity(
                &self,
                id: &$crate::PodIdentity,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::Lease>, $crate::StoreError> {
                let $this = self;
                $to.leases_of_identity(id)
            }
            fn leases_of_pod(
                &self,
                namespace: &str,
                name: &str,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::Lease>, $crate::StoreError> {
                let $this = self;
                $to.leases_of_pod(namespace, name)
            }
            fn expired(
                &self,
                now: u64,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::Lease>, $crate::StoreError> {
                let $this = self;
                $to.expired(now)
            }
            fn scan(
                &self,
                each: &mut dyn FnMut($crate::Lease) -> ::std::result::Result<(), $crate::StoreError>,
            ) -> ::std::result::Result<(), $crate::StoreError> {
                let $this = self;
                $to.scan(each)
            }
            fn last_reserved(
                &self,
                range_set: &str,
            ) -> ::std::result::Result<::std::option::Option<::std::net::IpAddr>, $crate::StoreError>
            {
                let $this = self;
                $to.last_reserved(range_set)
            }
            fn range_sets(
                &self,
            ) -> ::std::result::Result<::std::option::Option<::std::string::String>, $crate::StoreError>
            {
                let $this = self;
                $to.range_sets()
            }
            fn clock(
                &self,
            ) -> ::std::result::Result<::std::option::Option<$crate::ClockMark>, $crate::StoreError>
            {
                let $this = self;
                $to.clock()
            }
            fn freed_at(
                &self,
                ip: ::std::net::IpAddr,
            ) -> ::std::result::Result<::std::option::Option<u64>, $crate::StoreError> {
                let $this = self;
                $to.freed_at(ip)
            }
        }
    };
}

/// Lease storage for one network: reads, and atomic durable commits.
pub trait Store: StoreRead {
    /// Applies a commit atomically and durably: when this returns `Ok`, the commit survives a
    /// crash or power loss. After an `Err` the commit may or may not have been applied (as
    /// after any interrupted write); the store must be reopened before it is written again.
    fn commit(&mut self, commit: Commit) -> Result<(), StoreError>;
}

/// In-memory store: the reference model the on-disk store is tested against.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    leases: BTreeMap<IpAddr, Lease>,
    last_reserved: BTreeMap<String, IpAddr>,
    range_sets: Option<String>,
    clock: Option<ClockMark>,
    freed: BTreeMap<IpAddr, u64>,
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

impl StoreRead for MemoryStore {
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

    fn scan(
        &self,
        each: &mut dyn FnMut(Lease) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.leases.values().try_for_each(|l| each(l.clone()))
    }

    fn last_reserved(&self, range_set: &str) -> Result<Option<IpAddr>, StoreError> {
        Ok(self.last_reserved.get(range_set).copied())
    }

    fn range_sets(&self) -> Result<Option<String>, StoreError> {
        Ok(self.range_sets.clone())
    }

    fn clock(&self) -> Result<Option<ClockMark>, StoreError> {
        Ok(self.clock.clone())
    }

    fn freed_at(&self, ip: IpAddr) -> Result<Option<u64>, StoreError> {
        Ok(self.freed.get(&ip).copied())
    }
}

impl Store for MemoryStore {
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
        if commit.clock.is_some() {
            self.clock = commit.clock;
        }
        for (ip, at) in commit.freed {
            match at {
                Some(at) => self.freed.insert(ip, at),
                None => self.freed.remove(&ip),
            };
        }
        if let Some(until) = commit.forget_freed_until {
            self.freed.retain(|_, at| *at > until);
        }
        while self.freed.len() > MAX_FREED_REMEMBERED {
            let oldest = self.freed.iter().map(|(ip, at)| (*at, *ip)).min();
            if let Some((_, ip)) = oldest {
                self.freed.remove(&ip);
            }
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
