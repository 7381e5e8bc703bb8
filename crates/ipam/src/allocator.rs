//! The allocation rules: ADD, DEL, CHECK, GC and admin release over any [`Store`].
//!
//! Promises, whatever the store:
//! * an address has at most one lease, so it never has two owners;
//! * ADD for an attachment that already has addresses returns them (idempotent) and never
//!   hands it a second address in the same range set;
//! * ADD for a pod identity with held (or, with retention, still active) addresses moves them
//!   to the new attachment in the same commit, so a late DEL from the old sandbox finds nothing;
//! * DEL only touches leases the attachment owns *now*, and holds them when retention is on;
//! * a failed command commits nothing (host-local's rollback can delete a pod's existing
//!   addresses; ours cannot);
//! * expired holdings are released by every ADD and GC before anything else is decided.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::lease::{Attachment, Lease, LeaseState, PodIdentity, PodRef};
use crate::range::{Range, RangeSet};
use crate::retention::Retention;
use crate::store::{Commit, LeaseChange, Store, StoreError};

/// Why an ADD could not be satisfied. Messages keep host-local's wording where it has one.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// Every address of a range set is in use or held.
    #[error(
        "failed to allocate for range {set}: no IP addresses available in range set: {ranges} ({active} in use, {held} held for deleted pods with IP retention; `ipkeep list` shows them)"
    )]
    Exhausted {
        /// Range-set index.
        set: usize,
        /// The set, as `start-end[,start-end…]`.
        ranges: String,
        /// Addresses in use.
        active: usize,
        /// Addresses held for deleted pods.
        held: usize,
    },
    /// A requested address is a range's gateway.
    #[error("failed to allocate for range {set}: requested ip {ip} is subnet's gateway")]
    RequestedGateway {
        /// Range-set index.
        set: usize,
        /// The address.
        ip: IpAddr,
    },
    /// A requested address belongs to someone else.
    #[error(
        "failed to allocate for range {set}: requested IP address {ip} is not available in range set {ranges} ({holder})"
    )]
    RequestedTaken {
        /// Range-set index.
        set: usize,
        /// The address.
        ip: IpAddr,
        /// The set.
        ranges: String,
        /// Who has it.
        holder: String,
    },
    /// The attachment already has another address in the set of a requested one.
    #[error(
        "failed to allocate for range {set}: requested IP address {ip} but {owner} already has {existing} in this range set; delete it first"
    )]
    RequestedConflictsWithOwn {
        /// Range-set index.
        set: usize,
        /// Requested address.
        ip: IpAddr,
        /// The attachment.
        owner: Attachment,
        /// Address it already has.
        existing: IpAddr,
    },
    /// Requested addresses that fall in no range set (or several in one set).
    #[error("failed to allocate all requested IPs: {}", list(.0))]
    RequestedUnused(Vec<IpAddr>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

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

/// An ADD: the configuration and who is asking.
#[derive(Debug, Clone)]
pub struct AddRequest<'a> {
    /// The network's range sets, in order; one address per set.
    pub range_sets: &'a [RangeSet],
    /// The attachment being added.
    pub owner: Attachment,
    /// The pod, if the runtime named it.
    pub pod: Option<PodRef>,
    /// The pod's retention.
    pub retention: Retention,
    /// Requested addresses (CNI_ARGS `IP`, `args.cni.ips`, `runtimeConfig.ips`), deduplicated.
    pub requested: &'a [IpAddr],
}

/// How an address came to the attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Next free address in round-robin order.
    RoundRobin,
    /// Explicitly requested.
    Requested,
    /// The attachment already had it (repeated ADD).
    Existing,
    /// Held or owned for the same pod identity by an earlier sandbox.
    Retained {
        /// The previous owner.
        from: Attachment,
        /// Whether it was held (the old sandbox had been deleted) rather than still active.
        was_held: bool,
    },
}

/// One address handed out by ADD, with the range it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The address.
    pub ip: IpAddr,
    /// Its range (prefix length and gateway for the result).
    pub range: Range,
    /// How it was chosen.
    pub source: Source,
}

/// What ADD did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOutcome {
    /// One per range set, in order.
    pub assignments: Vec<Assignment>,
    /// Holdings released because they had expired.
    pub expired: Vec<Lease>,
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

/// Reads through pending changes, collects them, and turns them into one [`Commit`].
struct Pending<'s, S: Store + ?Sized> {
    store: &'s S,
    changes: BTreeMap<IpAddr, LeaseChange>,
    last_reserved: Vec<(String, IpAddr)>,
}

impl<'s, S: Store + ?Sized> Pending<'s, S> {
    fn new(store: &'s S) -> Self {
        Pending {
            store,
            changes: BTreeMap::new(),
            last_reserved: Vec::new(),
        }
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

    fn sweep_expired(&mut self, now: u64) -> Result<Vec<Lease>, StoreError> {
        let expired = self.store.expired(now)?;
        for lease in &expired {
            self.replace(lease, None);
        }
        Ok(expired)
    }

    fn into_commit(self) -> Commit {
        Commit {
            leases: self
                .changes
                .into_values()
                .filter(|c| c.before != c.after)
                .collect(),
            last_reserved: self.last_reserved,
            range_sets: None,
        }
    }
}

/// Applies DEL semantics to one active lease: hold it for its pod or free it.
fn release_or_hold(lease: &Lease, retention: Retention, now: u64) -> Option<Lease> {
    (lease.pod.is_some() && retention.is_on()).then(|| Lease {
        retention,
        state: LeaseState::Held {
            until: retention.hold_until(now),
        },
        since: now,
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
        LeaseState::Held { until: Some(t) } => format!("held{pod} until unix time {t}"),
    }
}

/// Runs an ADD and commits it. Returns one assignment per range set.
pub fn add<S: Store + ?Sized>(
    store: &mut S,
    req: &AddRequest<'_>,
    now: u64,
) -> Result<AddOutcome, AllocError> {
    let (outcome, commit) = plan_add(&*store, req, now)?;
    if !commit.is_empty() {
        store.commit(commit)?;
    }
    Ok(outcome)
}

fn plan_add<S: Store + ?Sized>(
    store: &S,
    req: &AddRequest<'_>,
    now: u64,
) -> Result<(AddOutcome, Commit), AllocError> {
    let mut pending = Pending::new(store);
    let expired = pending.sweep_expired(now)?;
    let swept: BTreeSet<IpAddr> = expired.iter().map(|l| l.ip).collect();

    let own = store.leases_of_attachment(&req.owner)?;
    let identity = req.pod.as_ref().map(|p| PodIdentity {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        ifname: req.owner.ifname.clone(),
    });
    // Addresses of the same pod identity that this attachment may take over: held ones always,
    // still-active ones (the old sandbox's DEL has not arrived yet) only with retention.
    let retained: Vec<Lease> = match &identity {
        Some(id) => store
            .leases_of_identity(id)?
            .into_iter()
            .filter(|l| l.owner != req.owner && !swept.contains(&l.ip))
            .filter(|l| !l.is_active() || req.retention.is_on() || l.retention.is_on())
            .collect(),
        None => Vec::new(),
    };

    let mut unused: Vec<IpAddr> = req.requested.to_vec();
    let mut assignments = Vec::with_capacity(req.range_sets.len());
    for (index, set) in req.range_sets.iter().enumerate() {
        let in_set = |l: &&Lease| set.range_of(l.ip).is_some();
        let own_here = own.iter().find(in_set);
        let retained_here = retained.iter().find(in_set);
        let requested_here = unused.iter().position(|ip| set.range_of(*ip).is_some());

        let (ip, source) = if let Some(pos) = requested_here {
            let ip = unused.remove(pos);
            let source = take_requested(&pending, set, index, ip, req, own_here, &retained)?;
            // The pod asked for a specific address: a different one held for it here goes
            // (one still configured in an old sandbox stays until that sandbox's DEL).
            if let Some(old) = retained_here.filter(|l| l.ip != ip && !l.is_active()) {
                pending.replace(old, None);
            }
            pending.last_reserved.push((set.to_string(), ip));
            (ip, source)
        } else if let Some(lease) = own_here {
            (lease.ip, Source::Existing)
        } else if let Some(lease) = retained_here {
            let source = Source::Retained {
                from: lease.owner.clone(),
                was_held: !lease.is_active(),
            };
            (lease.ip, source)
        } else {
            let ip = next_free(&pending, set, index)?;
            pending.last_reserved.push((set.to_string(), ip));
            (ip, Source::RoundRobin)
        };

        let lease = Lease {
            ip,
            owner: req.owner.clone(),
            pod: req.pod.clone(),
            retention: req.retention,
            state: LeaseState::Active,
            since: now,
        };
        let unchanged = pending.lease(ip)?.is_some_and(|old| {
            Lease {
                since: old.since,
                ..lease.clone()
            } == old
        });
        if !unchanged {
            pending.set(ip, lease)?;
        }
        let range = set
            .range_of(ip)
            .cloned()
            .unwrap_or_else(|| set.ranges()[0].clone());
        assignments.push(Assignment { ip, range, source });
    }
    if !unused.is_empty() {
        return Err(AllocError::RequestedUnused(unused));
    }
    let mut commit = pending.into_commit();
    // Remember the configured ranges so `ipkeep list` can count free addresses without the
    // network configuration at hand.
    let ranges = serde_json::to_string(req.range_sets).unwrap_or_default();
    if store.range_sets()?.as_deref() != Some(ranges.as_str()) {
        commit.range_sets = Some(ranges);
    }
    Ok((
        AddOutcome {
            assignments,
            expired,
        },
        commit,
    ))
}

fn take_requested<S: Store + ?Sized>(
    pending: &Pending<'_, S>,
    set: &RangeSet,
    index: usize,
    ip: IpAddr,
    req: &AddRequest<'_>,
    own_here: Option<&Lease>,
    retained: &[Lease],
) -> Result<Source, AllocError> {
    if set.range_of(ip).is_some_and(|r| r.gateway == ip) {
        return Err(AllocError::RequestedGateway { set: index, ip });
    }
    if let Some(existing) = own_here.filter(|l| l.ip != ip) {
        return Err(AllocError::RequestedConflictsWithOwn {
            set: index,
            ip,
            owner: req.owner.clone(),
            existing: existing.ip,
        });
    }
    match pending.lease(ip)? {
        None => Ok(Source::Requested),
        Some(l) if l.owner == req.owner => Ok(Source::Existing),
        Some(l) if retained.iter().any(|r| r.ip == ip) => Ok(Source::Retained {
            from: l.owner.clone(),
            was_held: !l.is_active(),
        }),
        Some(l) => Err(AllocError::RequestedTaken {
            set: index,
            ip,
            ranges: set.to_string(),
            holder: describe_holder(&l),
        }),
    }
}

fn next_free<S: Store + ?Sized>(
    pending: &Pending<'_, S>,
    set: &RangeSet,
    index: usize,
) -> Result<IpAddr, AllocError> {
    let last = pending.store.last_reserved(&set.to_string())?;
    for candidate in set.candidates(last) {
        if pending.lease(candidate)?.is_none() {
            return Ok(candidate);
        }
    }
    // Exhausted: count what fills the set so the operator knows whether holdings are the cause.
    let (mut active, mut held) = (0, 0);
    for lease in pending.store.all()? {
        if set.range_of(lease.ip).is_none() {
            continue;
        }
        match pending.lease(lease.ip)?.map(|l| l.state) {
            Some(LeaseState::Active) => active += 1,
            Some(LeaseState::Held { .. }) => held += 1,
            None => {}
        }
    }
    Err(AllocError::Exhausted {
        set: index,
        ranges: set.to_string(),
        active,
        held,
    })
}

/// Runs a DEL: the attachment's active leases are held for their pod (when it has a name and
/// retention is on) or freed. `retention` overrides what was recorded at ADD (the runtime sent
/// the pod's annotations again). Unknown attachments are a no-op.
pub fn del<S: Store + ?Sized>(
    store: &mut S,
    owner: &Attachment,
    retention: Option<Retention>,
    now: u64,
) -> Result<ReleaseOutcome, StoreError> {
    let mut pending = Pending::new(&*store);
    let mut outcome = ReleaseOutcome::default();
    for lease in store.leases_of_attachment(owner)? {
        if lease.is_active() {
            record_release(&mut pending, &mut outcome, &lease, retention, now);
        }
    }
    let commit = pending.into_commit();
    if !commit.is_empty() {
        store.commit(commit)?;
    }
    Ok(outcome)
}

fn record_release<S: Store + ?Sized>(
    pending: &mut Pending<'_, S>,
    outcome: &mut ReleaseOutcome,
    lease: &Lease,
    retention: Option<Retention>,
    now: u64,
) {
    let after = release_or_hold(lease, retention.unwrap_or(lease.retention), now);
    match &after {
        Some(held) => outcome.held.push(held.clone()),
        None => outcome.released.push(lease.clone()),
    }
    pending.replace(lease, after);
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
    now: u64,
) -> Result<ReleaseOutcome, StoreError> {
    let mut pending = Pending::new(&*store);
    let mut outcome = ReleaseOutcome {
        expired: pending.sweep_expired(now)?,
        ..ReleaseOutcome::default()
    };
    for lease in store.all()? {
        if lease.is_active() && !valid.contains(&lease.owner) {
            record_release(&mut pending, &mut outcome, &lease, None, now);
        }
    }
    let commit = pending.into_commit();
    if !commit.is_empty() {
        store.commit(commit)?;
    }
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
) -> Result<ReleaseOutcome, StoreError> {
    let mut pending = Pending::new(&*store);
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
    let commit = pending.into_commit();
    if !commit.is_empty() {
        store.commit(commit)?;
    }
    Ok(outcome)
}

/// Frees every holding whose time has come (the agent's timer sweep).
pub fn release_expired<S: Store + ?Sized>(
    store: &mut S,
    now: u64,
) -> Result<Vec<Lease>, StoreError> {
    let mut pending = Pending::new(&*store);
    let expired = pending.sweep_expired(now)?;
    let commit = pending.into_commit();
    if !commit.is_empty() {
        store.commit(commit)?;
    }
    Ok(expired)
}

/// Frees the given holdings, each only if the store still has exactly that lease (a decision
/// made from a snapshot never frees an address that changed since). Returns what it freed.
pub fn release_held<S: Store + ?Sized>(
    store: &mut S,
    leases: &[Lease],
) -> Result<Vec<Lease>, StoreError> {
    let mut pending = Pending::new(&*store);
    let mut released = Vec::new();
    for lease in leases {
        let current = store.lease(lease.ip)?;
        if !lease.is_active() && current.as_ref() == Some(lease) {
            pending.replace(lease, None);
            released.push(lease.clone());
        }
    }
    let commit = pending.into_commit();
    if !commit.is_empty() {
        store.commit(commit)?;
    }
    Ok(released)
}
