//! DEL, GC, CHECK and the releases the agent and an admin make.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::{Pending, commit, list, release_or_hold};
use crate::clock::Reading;
use crate::lease::{Attachment, Confirmed, Lease, PodRef};
use crate::retention::Retention;
use crate::store::{Store, StoreError};

/// Why CHECK failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The attachment has no active address.
    #[error("ipkeep: failed to find address added by container {0}")]
    NotFound(Attachment),
    /// The previous result names an address the attachment does not own.
    #[error(
        "ipkeep: container {owner} does not own {ip} from its previous result (it owns {owned})"
    )]
    Mismatch {
        /// The attachment.
        owner: Attachment,
        /// Address from prevResult.
        ip: IpAddr,
        /// Addresses it does own.
        owned: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What DEL or GC did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// Leases now held for their pod.
    pub held: Vec<Lease>,
    /// Leases freed.
    pub released: Vec<Lease>,
    /// Holdings freed because they had expired.
    pub expired: Vec<Lease>,
    /// Active leases an admin release left alone (the pod still uses them).
    pub still_active: Vec<Lease>,
}

/// What a DEL knows about its pod now, in place of what its ADD recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Departure {
    /// The pod's retention now (the runtime passed its annotations again, or the node agent
    /// decided from the API server); `None`: the retention resolved at ADD.
    pub retention: Option<Retention>,
    /// The node agent's word on who manages the pod now, recorded as confirmed with the
    /// holding; `None`: nobody asked the API server, and the link recorded at ADD stays.
    pub confirmed: Option<Confirmed>,
    /// Whether the agent could judge the pod by its name alone (the API no longer shows it, and
    /// no PersistentPodState records this very pod). Then what the agent confirmed at the
    /// sandbox's ADD, from the pod itself, stands where it names another state or none, with
    /// the retention ADD resolved: a pod that only had the name (the agent said at its ADD that
    /// nothing manages it) is not held for the StatefulSet's pod once it is gone.
    pub judged_by_name: bool,
}

/// Runs a DEL: the attachment's active leases are held for their pod (when it has a name and
/// retention is on) or freed, by what `departure` says where it says something, else by what
/// ADD recorded. Unknown attachments are a no-op.
pub fn del<S: Store + ?Sized>(
    store: &mut S,
    owner: &Attachment,
    departure: &Departure,
    reading: &Reading,
) -> Result<ReleaseOutcome, StoreError> {
    let mut pending = Pending::new(&*store, reading)?;
    let mut outcome = ReleaseOutcome::default();
    for lease in store.leases_of_attachment(owner)? {
        if lease.is_active() {
            record_release(&mut pending, &mut outcome, &lease, departure);
        }
    }
    let planned = pending.into_commit();
    commit(store, planned)?;
    Ok(outcome)
}

fn record_release<S: Store + ?Sized>(
    pending: &mut Pending<'_, S>,
    outcome: &mut ReleaseOutcome,
    lease: &Lease,
    departure: &Departure,
) {
    let at_add = lease.pod.as_ref().and_then(PodRef::word);
    let departure = match (&at_add, &departure.confirmed) {
        (Some(then), Some(now)) if departure.judged_by_name && !same_state(then, now) => {
            &Departure::default()
        }
        _ => departure,
    };
    let mut known = lease.clone();
    if let (Some(word), Some(pod)) = (&departure.confirmed, known.pod.as_mut()) {
        pod.confirm(word);
    }
    let retention = departure.retention.unwrap_or(lease.retention);
    let after = release_or_hold(&known, retention, pending.now());
    match &after {
        Some(held) => outcome.held.push(held.clone()),
        None => outcome.released.push(lease.clone()),
    }
    pending.replace(lease, after);
}

/// Whether two words of the agent name the same PersistentPodState (or both none).
fn same_state(a: &Confirmed, b: &Confirmed) -> bool {
    match (a, b) {
        (Confirmed::By(a), Confirmed::By(b)) => a.name == b.name,
        (Confirmed::Nobody, Confirmed::Nobody) => true,
        _ => false,
    }
}

/// Runs a CHECK: the attachment must own active addresses, including every address of its
/// previous result.
pub fn check<S: Store + ?Sized>(
    store: &S,
    owner: &Attachment,
    previous: &[IpAddr],
) -> Result<Vec<Lease>, CheckError> {
    let active: Vec<Lease> = store
        .leases_of_attachment(owner)?
        .into_iter()
        .filter(Lease::is_active)
        .collect();
    if active.is_empty() {
        return Err(CheckError::NotFound(owner.clone()));
    }
    if let Some(ip) = previous
        .iter()
        .find(|ip| !active.iter().any(|l| l.ip == **ip))
    {
        return Err(CheckError::Mismatch {
            owner: owner.clone(),
            ip: *ip,
            owned: list(&active.iter().map(|l| l.ip).collect::<Vec<_>>()),
        });
    }
    Ok(active)
}

/// Runs a GC: active leases of attachments not in `valid` get DEL semantics (held for their
/// pod with retention, else freed); held leases are never touched unless expired.
pub fn gc<S: Store + ?Sized>(
    store: &mut S,
    valid: &BTreeSet<Attachment>,
    reading: &Reading,
) -> Result<ReleaseOutcome, StoreError> {
    let mut pending = Pending::new(&*store, reading)?;
    let mut outcome = ReleaseOutcome {
        expired: pending.sweep_expired()?,
        ..ReleaseOutcome::default()
    };
    let mut stale = Vec::new();
    store.scan(&mut |lease| {
        if lease.is_active() && !valid.contains(&lease.owner) {
            stale.push(lease);
        }
        Ok(())
    })?;
    for lease in &stale {
        record_release(&mut pending, &mut outcome, lease, &Departure::default());
    }
    let planned = pending.into_commit();
    commit(store, planned)?;
    Ok(outcome)
}

/// Admin release of a pod's holdings (all interfaces, or one). Active leases are left alone
/// unless `include_active`, because the pod still uses them.
pub fn release_pod<S: Store + ?Sized>(
    store: &mut S,
    namespace: &str,
    name: &str,
    ifname: Option<&str>,
    include_active: bool,
    reading: &Reading,
) -> Result<ReleaseOutcome, StoreError> {
    let mut pending = Pending::new(&*store, reading)?;
    let mut outcome = ReleaseOutcome::default();
    for lease in store.leases_of_pod(namespace, name)? {
        if ifname.is_some_and(|i| i != lease.owner.ifname) {
            continue;
        }
        if !lease.is_active() || include_active {
            pending.replace(&lease, None);
            outcome.released.push(lease);
        } else {
            outcome.still_active.push(lease);
        }
    }
    let planned = pending.into_commit();
    commit(store, planned)?;
    Ok(outcome)
}

/// Frees every holding whose time has come (the agent's timer sweep).
pub fn release_expired<S: Store + ?Sized>(
    store: &mut S,
    reading: &Reading,
) -> Result<Vec<Lease>, StoreError> {
    let mut pending = Pending::new(&*store, reading)?;
    let expired = pending.sweep_expired()?;
    let planned = pending.into_commit();
    commit(store, planned)?;
    Ok(expired)
}

/// Frees the given holdings, each only if the store still has exactly that lease (a decision
/// made from a snapshot never frees an address that changed since). Returns what it freed.
pub fn release_held<S: Store + ?Sized>(
    store: &mut S,
    leases: &[Lease],
    reading: &Reading,
) -> Result<Vec<Lease>, StoreError> {
    let mut pending = Pending::new(&*store, reading)?;
    let mut released = Vec::new();
    for lease in leases {
        let current = store.lease(lease.ip)?;
        if !lease.is_active() && current.as_ref() == Some(lease) {
            pending.replace(lease, None);
            released.push(lease.clone());
        }
    }
    let planned = pending.into_commit();
    commit(store, planned)?;
    Ok(released)
}
