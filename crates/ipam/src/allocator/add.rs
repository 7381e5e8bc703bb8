//! ADD: one address per range set for an attachment, its pod's held addresses first.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{Pending, commit, describe_holder, list};
use crate::clock::Reading;
use crate::lease::{Attachment, Lease, LeaseState, PodIdentity, PodRef};
use crate::range::{Range, RangeSet};
use crate::retention::Retention;
use crate::store::{Commit, Store, StoreError};

/// Why an ADD could not be satisfied. Messages keep host-local's wording where it has one.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// Every address of a range set is in use.
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
    /// The pod's address is still configured in an older sandbox of the same pod, whose network
    /// namespace still exists (a force-deleted pod's sandbox that is still being torn down).
    #[error(
        "address {ip} of pod {pod} is still configured in its older sandbox {owner} (network namespace {netns} still exists); try again once that sandbox is deleted"
    )]
    StillInUse {
        /// The address.
        ip: IpAddr,
        /// The pod.
        pod: String,
        /// The older sandbox's attachment.
        owner: Attachment,
        /// Its network namespace.
        netns: String,
    },
    /// Addresses of the pod are still configured in older sandboxes whose network namespaces
    /// (these paths) the request does not say anything about: nothing was decided. Whoever
    /// can tell says whether each exists ([`AddRequest::netns_known`]), and the ADD runs again.
    #[error(
        "cannot tell whether the network namespaces of the pod's older sandboxes still exist: {}",
        .0.join(" ")
    )]
    NeedsNetns(Vec<String>),
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
    /// The sandbox's network namespace (`CNI_NETNS`), recorded with its addresses.
    pub netns: Option<String>,
    /// Whether older sandboxes' network namespaces (`CNI_NETNS` of their ADD) still exist, as
    /// far as the caller knows: one the ADD must judge and this does not name ends it with
    /// [`AllocError::NeedsNetns`].
    pub netns_known: BTreeMap<String, bool>,
    /// `ipam.reuseCooldown` in seconds: an address freed less than this long ago goes to a
    /// new pod only when no other address of its range set is free (0: no cooldown).
    pub reuse_cooldown: u64,
}

/// How an address came to the attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Next free address in round-robin order.
    RoundRobin,
    /// No other address of the range set was free: this one was freed at `freed_at` (store
    /// clock), less than `ipam.reuseCooldown` ago, and goes to a new pod before its cooldown
    /// ended.
    Cooling {
        /// When it was freed.
        freed_at: u64,
    },
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
    /// The range set was full; this address was held for another deleted pod, whose holding
    /// gave way so that this pod could start.
    Reclaimed {
        /// The holding that gave way.
        from: Box<Lease>,
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
    /// Addresses held (or still recorded) for this pod that lie in none of the network's
    /// current ranges (the node's pod CIDR or the configuration changed): released, and the pod
    /// got a new address instead.
    pub outside_ranges: Vec<Lease>,
    /// Addresses kept for an earlier pod of this identity that a PersistentPodState this pod
    /// is not tied to managed ([`PodRef::succeeds`]): left as they are, for that state's pod.
    pub kept_for_another: Vec<Lease>,
}

/// Runs an ADD and commits it. Returns one assignment per range set.
pub fn add<S: Store + ?Sized>(
    store: &mut S,
    req: &AddRequest<'_>,
    reading: &Reading,
) -> Result<AddOutcome, AllocError> {
    let (outcome, planned) = plan_add(&*store, req, reading)?;
    commit(store, planned)?;
    Ok(outcome)
}

fn plan_add<S: Store + ?Sized>(
    store: &S,
    req: &AddRequest<'_>,
    reading: &Reading,
) -> Result<(AddOutcome, Commit), AllocError> {
    let mut pending = Pending::new(store, reading)?;
    let now = pending.now();
    let expired = pending.sweep_expired()?;
    let swept: BTreeSet<IpAddr> = expired.iter().map(|l| l.ip).collect();

    let own = store.leases_of_attachment(&req.owner)?;
    let (retained, kept_for_another) = retainable(store, req, &swept)?;

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
            let (ip, source) = next_free(&mut pending, set, index, req.reuse_cooldown)?;
            pending.last_reserved.push((set.to_string(), ip));
            (ip, source)
        };

        let before = pending.lease(ip)?;
        let lease = Lease {
            ip,
            owner: req.owner.clone(),
            pod: req
                .pod
                .as_ref()
                .map(|p| p.keeping_tie(before.as_ref().and_then(|l| l.pod.as_ref()))),
            retention: req.retention,
            state: LeaseState::Active,
            since: now,
            netns: req.netns.clone(),
        };
        let unchanged = before.is_some_and(|old| {
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
    // What is kept for this pod outside every current range can never be handed out again
    // here: it goes, and the caller says so.
    let outside_ranges: Vec<Lease> = retained
        .into_iter()
        .filter(|l| {
            req.range_sets
                .iter()
                .all(|set| set.range_of(l.ip).is_none())
        })
        .collect();
    for lease in &outside_ranges {
        pending.replace(lease, None);
    }
    let mut commit = pending.into_commit();
    // Past the cooldown, when an address was freed no longer matters.
    commit.forget_freed_until = Some(now.saturating_sub(req.reuse_cooldown));
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
            outside_ranges,
            kept_for_another,
        },
        commit,
    ))
}

/// Addresses of the same pod identity that this attachment may take over, and those it may
/// not. It may take over an address kept for a pod it succeeds ([`PodRef::succeeds`]: kept for
/// no PersistentPodState, or for the one this pod is tied to); held ones always, still-active
/// ones (the old sandbox's DEL has not arrived yet) only with retention, and only once the old
/// sandbox's network namespace is gone ([`AddRequest::netns_known`]; namespaces it does not
/// name are asked about, all at once, before any that exists is reported). Those kept for
/// another state's pod are left alone: a pod that merely has the name (created by hand on the
/// node, while the StatefulSet's pod is scaled away or being rebuilt) must neither get them nor
/// free them.
fn retainable<S: Store + ?Sized>(
    store: &S,
    req: &AddRequest<'_>,
    swept: &BTreeSet<IpAddr>,
) -> Result<(Vec<Lease>, Vec<Lease>), AllocError> {
    let Some(pod) = &req.pod else {
        return Ok(Default::default());
    };
    let id = PodIdentity {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        ifname: req.owner.ifname.clone(),
    };
    let (mut out, mut others) = (Vec::new(), Vec::new());
    let mut unknown: Vec<String> = Vec::new();
    for lease in store.leases_of_identity(&id)? {
        if lease.owner == req.owner || swept.contains(&lease.ip) {
            continue;
        }
        if lease.pod.as_ref().is_some_and(|kept| !pod.succeeds(kept)) {
            others.push(lease);
            continue;
        }
        if lease.is_active() {
            if !req.retention.is_on() && !lease.retention.is_on() {
                continue;
            }
            if let Some(netns) = lease.netns.as_deref() {
                match req.netns_known.get(netns) {
                    Some(true) if unknown.is_empty() => {
                        return Err(AllocError::StillInUse {
                            ip: lease.ip,
                            pod: pod.to_string(),
                            owner: lease.owner,
                            netns: netns.to_string(),
                        });
                    }
                    None if !unknown.iter().any(|u| u == netns) => unknown.push(netns.to_string()),
                    _ => {}
                }
            }
        }
        out.push(lease);
    }
    if !unknown.is_empty() {
        return Err(AllocError::NeedsNetns(unknown));
    }
    // One address a range set goes back; should several be kept under the name, first one kept
    // for this pod's state (rather than one a pod nothing managed left under the name with
    // `ipam.retention`), then the oldest.
    out.sort_by_key(|l| {
        let tied = l
            .pod
            .as_ref()
            .is_some_and(|p| p.persistent_pod_state.is_some());
        (!tied, l.since)
    });
    Ok((out, others))
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

/// The next free address in round-robin order, passing over those freed less than `cooldown`
/// seconds ago; when there is none, the cooling address freed longest ago; when there is none
/// either, the holding that gives way (see [`reclaimable`]).
fn next_free<S: Store + ?Sized>(
    pending: &mut Pending<'_, S>,
    set: &RangeSet,
    index: usize,
    cooldown: u64,
) -> Result<(IpAddr, Source), AllocError> {
    let last = pending.store.last_reserved(&set.to_string())?;
    let now = pending.now();
    let mut cooling: Option<(u64, IpAddr)> = None;
    for candidate in set.candidates(last) {
        if pending.lease(candidate)?.is_some() {
            continue;
        }
        // With the cooldown off, when an address was freed is not read at all.
        let freed = if cooldown > 0 {
            pending.freed_at(candidate)?
        } else {
            None
        };
        match freed {
            Some(at) if now < at.saturating_add(cooldown) => {
                if cooling.is_none_or(|(best, _)| at < best) {
                    cooling = Some((at, candidate));
                }
            }
            _ => return Ok((candidate, Source::RoundRobin)),
        }
    }
    if let Some((freed_at, ip)) = cooling {
        return Ok((ip, Source::Cooling { freed_at }));
    }
    if let Some(victim) = reclaimable(pending, set)? {
        pending.replace(&victim, None);
        return Ok((
            victim.ip,
            Source::Reclaimed {
                from: Box::new(victim),
            },
        ));
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

/// The holding in `set` that gives way when the set is full, first in this order:
/// 1. one that no PersistentPodState link confirmed by the node agent protects: an unconfirmed
///    link is only the pod's annotation, which whoever creates a pod can write;
/// 2. one of the namespace holding the most addresses of the set, so a tenant that fills a
///    node's range gives way before its neighbours;
/// 3. a `forever` one before any that ends: asking for more never protects more;
/// 4. the one that would end soonest;
/// 5. the oldest.
///
/// Only holdings this command has not touched qualify.
fn reclaimable<S: Store + ?Sized>(
    pending: &Pending<'_, S>,
    set: &RangeSet,
) -> Result<Option<Lease>, StoreError> {
    let mut candidates = Vec::new();
    let mut per_namespace: BTreeMap<String, usize> = BTreeMap::new();
    for lease in pending.store.held()? {
        if set.range_of(lease.ip).is_none() || pending.lease(lease.ip)?.as_ref() != Some(&lease) {
            continue;
        }
        let LeaseState::Held { until } = lease.state else {
            continue;
        };
        *per_namespace
            .entry(namespace_of(&lease).to_string())
            .or_default() += 1;
        candidates.push((until, lease));
    }
    let key = |until: Option<u64>, lease: &Lease| {
        let vouched = lease
            .pod
            .as_ref()
            .is_some_and(|p| p.confirmed_manager().is_some());
        let crowd = per_namespace
            .get(namespace_of(lease))
            .copied()
            .unwrap_or_default();
        (
            vouched,
            Reverse(crowd),
            until.is_some(),
            until.unwrap_or(u64::MAX),
            lease.since,
        )
    };
    Ok(candidates
        .into_iter()
        .min_by_key(|(until, lease)| key(*until, lease))
        .map(|(_, lease)| lease))
}

fn namespace_of(lease: &Lease) -> &str {
    lease.pod.as_ref().map_or("", |p| p.namespace.as_str())
}
