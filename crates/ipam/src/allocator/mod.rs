//! The allocation rules: ADD, DEL, CHECK, GC and admin release over any [`Store`].
//!
//! Promises, whatever the store:
//! * an address has at most one lease, so it never has two owners;
//! * ADD for an attachment that already has addresses returns them (idempotent) and never
//!   hands it a second address in the same range set;
//! * ADD for a pod identity with held addresses moves them to the new attachment in the same
//!   commit, so a late DEL from the old sandbox finds nothing; an address still *active* in an
//!   older sandbox of the same pod moves only once that sandbox's network namespace is gone
//!   (until then the ADD fails with "try again later"), so two live sandboxes never share it;
//!   whether it is gone is the caller's word (`AddRequest::netns_known`), and where the caller
//!   has not said, the ADD asks (`AllocError::NeedsNetns`) instead of guessing;
//! * an address kept for a pod a PersistentPodState managed moves only to a pod tied to that
//!   same state (`PodRef::succeeds`); any other pod of the name gets other addresses, and
//!   neither its ADD nor its DEL touches the kept one;
//! * held addresses never starve a pod of a range: when nothing else is free, a holding gives
//!   way (see `reclaimable` in `add.rs`: holdings no PersistentPodState link confirmed by the node
//!   agent protects first, and never a real finite one before a `forever` one);
//! * DEL only touches leases the attachment owns *now*, and holds them when retention is on;
//! * a failed command commits nothing (host-local's rollback can delete a pod's existing
//!   addresses; ours cannot);
//! * expired holdings are released by every ADD and GC before anything else is decided, by the
//!   store's clock ([`crate::clock`]), which a jump of the wall clock does not move.

mod add;
mod release;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ranges;
#[cfg(test)]
mod tests_reclaim;
#[cfg(test)]
mod tests_successor;

use std::collections::BTreeMap;
use std::net::IpAddr;

pub use add::{AddOutcome, AddRequest, AllocError, Assignment, Source, add};
pub use release::{
    CheckError, Departure, ReleaseOutcome, check, del, gc, release_expired, release_held,
    release_pod,
};

use crate::clock::{self, ClockMark, Reading};
use crate::lease::{Lease, LeaseState};
use crate::retention::Retention;
use crate::store::{Commit, LeaseChange, Store, StoreError};

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads through pending changes, collects them, and turns them into one [`Commit`].
struct Pending<'s, S: Store + ?Sized> {
    store: &'s S,
    changes: BTreeMap<IpAddr, LeaseChange>,
    last_reserved: Vec<(String, IpAddr)>,
    clock: ClockMark,
    /// Whether the clock mark must be written: the first of this boot (later ones follow from
    /// it and the boot clock, so writing them would only cost every commit a page).
    new_clock: bool,
}

impl<'s, S: Store + ?Sized> Pending<'s, S> {
    /// Starts a command at `reading`; the command's time is [`Self::now`].
    fn new(store: &'s S, reading: &Reading) -> Result<Self, StoreError> {
        let stored = store.clock()?;
        let clock = clock::advance(stored.as_ref(), reading);
        Ok(Pending {
            store,
            changes: BTreeMap::new(),
            last_reserved: Vec::new(),
            new_clock: clock::starts_a_boot(stored.as_ref(), reading),
            clock,
        })
    }

    /// The command's time, by the store's clock.
    fn now(&self) -> u64 {
        self.clock.now
    }

    fn lease(&self, ip: IpAddr) -> Result<Option<Lease>, StoreError> {
        match self.changes.get(&ip) {
            Some(change) => Ok(change.after.clone()),
            None => self.store.lease(ip),
        }
    }

    /// Records `after` for the address of `before` (a lease read from the store).
    fn replace(&mut self, before: &Lease, after: Option<Lease>) {
        self.changes
            .entry(before.ip)
            .or_insert_with(|| LeaseChange {
                ip: before.ip,
                before: Some(before.clone()),
                after: None,
            })
            .after = after;
    }

    fn set(&mut self, ip: IpAddr, after: Lease) -> Result<(), StoreError> {
        if let Some(change) = self.changes.get_mut(&ip) {
            change.after = Some(after);
        } else {
            let before = self.store.lease(ip)?;
            self.changes.insert(
                ip,
                LeaseChange {
                    ip,
                    before,
                    after: Some(after),
                },
            );
        }
        Ok(())
    }

    fn sweep_expired(&mut self) -> Result<Vec<Lease>, StoreError> {
        let expired = self.store.expired(self.now())?;
        for lease in &expired {
            self.replace(lease, None);
        }
        Ok(expired)
    }

    /// When a free address was freed: now, if this command freed it; else as the store says.
    fn freed_at(&self, ip: IpAddr) -> Result<Option<u64>, StoreError> {
        match self.changes.get(&ip) {
            Some(LeaseChange {
                before: Some(_),
                after: None,
                ..
            }) => Ok(Some(self.now())),
            _ => self.store.freed_at(ip),
        }
    }

    fn into_commit(self) -> Commit {
        let now = self.now();
        let leases: Vec<LeaseChange> = self
            .changes
            .into_values()
            .filter(|c| c.before != c.after)
            .collect();
        // Freed addresses remember when, for the reuse cooldown; taken ones forget it.
        let freed = leases
            .iter()
            .filter_map(|c| match (&c.before, &c.after) {
                (Some(_), None) => Some((c.ip, Some(now))),
                (None, Some(_)) => Some((c.ip, None)),
                _ => None,
            })
            .collect();
        Commit {
            leases,
            last_reserved: self.last_reserved,
            range_sets: None,
            clock: self.new_clock.then_some(self.clock),
            freed,
            forget_freed_until: None,
        }
    }
}

/// Commits `commit` unless it changes nothing.
fn commit<S: Store + ?Sized>(store: &mut S, commit: Commit) -> Result<(), StoreError> {
    if commit.is_empty() {
        return Ok(());
    }
    store.commit(commit)
}

/// Applies DEL semantics to one active lease: hold it for its pod or free it.
fn release_or_hold(lease: &Lease, retention: Retention, now: u64) -> Option<Lease> {
    (lease.pod.is_some() && retention.is_on()).then(|| Lease {
        retention,
        state: LeaseState::Held {
            until: retention.hold_until(now),
        },
        since: now,
        netns: None,
        ..lease.clone()
    })
}

fn describe_holder(lease: &Lease) -> String {
    let pod = lease
        .pod
        .as_ref()
        .map_or(String::new(), |p| format!(" of pod {p}"));
    match lease.state {
        LeaseState::Active => format!("in use by {}{pod}", lease.owner),
        LeaseState::Held { until: None } => format!("held{pod} forever"),
        LeaseState::Held { until: Some(t) } => {
            format!("held{pod} until {}", ipkeep_values::time::rfc3339(t))
        }
    }
}
