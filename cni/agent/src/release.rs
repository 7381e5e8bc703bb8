//! Which addresses Kubernetes says nobody will use again: pure decisions over a snapshot of
//! the store and of what the agent knows from the API server. No I/O.
//!
//! A **holding** (the address of a deleted pod, kept for its rebuild) is released when
//! * the PersistentPodState that manages the pod no longer records it (the controller pruned
//!   the record: scaled down with `WhenScaled`, or the StatefulSet was deleted or replaced),
//! * the record now names another node (the pod was rebuilt elsewhere after a node loss), or
//! * that PersistentPodState was deleted (with its StatefulSet, or by hand).
//!
//! A holding of a pod no PersistentPodState manages is left to its retention timer, and so is
//! one whose pod is on this node again (its ADD takes the address back), and every holding of a
//! namespace with a PersistentPodState the agent cannot decode (it might be the managing one,
//! and say to keep it).
//!
//! An **active** address whose pod is gone from this node lost its DEL (the node or runtime
//! was down when the pod was deleted); it gets DEL semantics: held per its retention, or freed.
//! The pod is compared by the UID the runtime passed at ADD, which for a static pod is its
//! mirror Pod's `kubernetes.io/config.mirror` annotation, not the mirror Pod's own UID (the
//! cluster view carries that). An address whose sandbox's network namespace still exists is
//! never treated so: its sandbox is still being torn down, and still uses it. The DEL applied
//! is decided like any DEL, by who manages the pod now ([`missed_del`]).
//!
//! Every decision waits for a grace period after the lease's last change, so a cache that is a
//! moment behind the API server cannot release what was just recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use std::path::Path;

use ipkeep_cni::management::{ApiView, Management, SandboxPod};
use ipkeep_ipam::{
    Attachment, Confirmed, Departure, Lease, LeaseState, Retention, RetentionPolicy, StoreError,
    StoreRead,
};
use ipkeep_values::ordinal;

/// The slice of the cluster the decisions read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// This node's name.
    pub node: String,
    /// PersistentPodStates by `(namespace, name)`.
    pub pps: BTreeMap<(String, String), PpsView>,
    /// Namespaces with a PersistentPodState that does not decode (not in `pps`).
    pub undecodable: BTreeSet<String>,
    /// Pods bound to this node, `(namespace, name)` → the UID the container runtime knows
    /// them by (the static pod's UID for a mirror Pod).
    pub pods: BTreeMap<(String, String), Option<String>>,
}

/// One PersistentPodState, reduced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PpsView {
    /// The StatefulSet it targets (`None` for other kinds).
    pub statefulset: Option<String>,
    /// Recorded pods: pod name → node name.
    pub records: BTreeMap<String, String>,
}

/// Why the agent released or re-held an address (the `reason` label of its metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The PersistentPodState no longer records the pod.
    RecordPruned,
    /// The record names another node.
    RecordedElsewhere,
    /// The PersistentPodState that managed the pod is gone.
    StateDeleted,
    /// The pod is gone but its DEL never came.
    MissedDel,
    /// The holding's retention ran out.
    Expired,
    /// A CNI DEL.
    Del,
    /// A CNI GC.
    Gc,
    /// `ipkeep release`.
    Admin,
    /// A full range: the holding gave way to a new pod.
    Reclaimed,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 9] = [
        Reason::RecordPruned,
        Reason::RecordedElsewhere,
        Reason::StateDeleted,
        Reason::MissedDel,
        Reason::Expired,
        Reason::Del,
        Reason::Gc,
        Reason::Admin,
        Reason::Reclaimed,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RecordPruned => "record-pruned",
            Reason::RecordedElsewhere => "recorded-on-another-node",
            Reason::StateDeleted => "persistent-pod-state-deleted",
            Reason::MissedDel => "missed-del",
            Reason::Expired => "expired",
            Reason::Del => "del",
            Reason::Gc => "gc",
            Reason::Admin => "admin",
            Reason::Reclaimed => "reclaimed-for-a-new-pod",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Grace periods, in seconds after a lease's last change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace {
    /// Before a holding is released on Kubernetes' word.
    pub release: u64,
    /// Before an active address of a vanished pod gets DEL semantics.
    pub missed_del: u64,
}

/// What a pass should do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Holdings to free, each with its reason.
    pub release: Vec<(Lease, Reason)>,
    /// Attachments whose DEL never came, with the DEL to apply.
    pub missed_del: Vec<MissedDel>,
}

/// A DEL that never came, as the agent applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissedDel {
    /// The sandbox's attachment.
    pub owner: Attachment,
    /// What the DEL records ([`missed_del`]).
    pub departure: Departure,
}

impl Plan {
    /// Whether the DEL of `owner` is planned already.
    fn has_missed_del(&self, owner: &Attachment) -> bool {
        self.missed_del.iter().any(|m| m.owner == *owner)
    }
}

/// What the agent's own DEL of a sandbox whose DEL never came records. For a pod a
/// PersistentPodState manages now: that state's word, and the retention its stamped annotations
/// say (one they do not say stays as ADD resolved it: the network's configuration is not at
/// hand here). For any other pod: what ADD recorded.
pub fn missed_del(management: &Management, recorded: Retention) -> Departure {
    let Management::Managed {
        persistent_pod_state,
        annotations,
        judged_by_name,
    } = management
    else {
        return Departure::default();
    };
    let by_state = RetentionPolicy {
        default: recorded,
        max_unmanaged: Retention::Off,
    };
    Departure {
        retention: Some(by_state.resolve(Some(annotations)).retention),
        confirmed: Some(Confirmed::By(persistent_pod_state.clone())),
        judged_by_name: *judged_by_name,
    }
}

impl Plan {
    /// Keeps at most `budget` decisions (holdings first, then missed DELs), takes them from
    /// the budget, and returns how many were left for a later pass.
    pub fn limit(&mut self, budget: &mut usize) -> usize {
        let total = self.release.len() + self.missed_del.len();
        let allowed = total.min(*budget);
        *budget -= allowed;
        self.release.truncate(allowed);
        self.missed_del
            .truncate(allowed.saturating_sub(self.release.len()));
        total - allowed
    }
}

/// The PersistentPodState a lease's pod belongs to: the one its lease names, else one whose
/// StatefulSet would have named the pod. `Err(())` when the named one is gone.
fn managing<'v>(lease: &Lease, view: &'v ClusterView) -> Result<Option<&'v PpsView>, ()> {
    let Some(pod) = &lease.pod else {
        return Ok(None);
    };
    if let Some(name) = &pod.persistent_pod_state {
        return view
            .pps
            .get(&(pod.namespace.clone(), name.clone()))
            .map(Some)
            .ok_or(());
    }
    Ok(view
        .pps
        .range((pod.namespace.clone(), String::new())..)
        .take_while(|((ns, _), _)| *ns == pod.namespace)
        .map(|(_, p)| p)
        .find(|p| {
            p.records.contains_key(&pod.name)
                || p.statefulset
                    .as_deref()
                    .is_some_and(|s| ordinal::from_name(&pod.name, s).is_some())
        }))
}

/// The verdict on one holding.
pub fn holding_verdict(lease: &Lease, view: &ClusterView) -> Option<Reason> {
    let pod = lease.pod.as_ref()?;
    if view
        .pods
        .contains_key(&(pod.namespace.clone(), pod.name.clone()))
        || view.undecodable.contains(&pod.namespace)
    {
        return None;
    }
    match managing(lease, view) {
        Err(()) => Some(Reason::StateDeleted),
        Ok(None) => None,
        Ok(Some(pps)) => match pps.records.get(&pod.name) {
            None => Some(Reason::RecordPruned),
            Some(node) if *node != view.node => Some(Reason::RecordedElsewhere),
            Some(_) => None,
        },
    }
}

/// Whether an active lease's pod is gone from this node (its DEL never came).
pub fn lost_its_del(lease: &Lease, view: &ClusterView) -> bool {
    let Some(pod) = &lease.pod else {
        // Without a pod name there is nothing to compare with; the runtime's GC covers it.
        return false;
    };
    match view.pods.get(&(pod.namespace.clone(), pod.name.clone())) {
        None => true,
        Some(uid) => matches!((uid, &pod.uid), (Some(now), Some(then)) if now != then),
    }
}

/// How long before a vanished pod's address whose sandbox still exists is looked at again.
pub const RECHECK_SANDBOX_SECS: u64 = 30;

/// Plans one pass, lease by lease (a store streams through in constant memory).
pub struct Planner<'v> {
    view: &'v ClusterView,
    /// Who manages a pod now, for the DELs that never came.
    api: &'v dyn ApiView,
    now: u64,
    grace: Grace,
    netns_exists: &'v dyn Fn(&str) -> bool,
    /// What the pass should do.
    pub plan: Plan,
    /// Active leases of pods still on the node whose network namespace is gone (see
    /// [`Planner::finish`]).
    dead_sandboxes: Vec<Lease>,
    /// The earliest time (store clock) at which a lease seen here may call for a decision
    /// that it did not call for yet: a grace period ending, or a sandbox's namespace to look
    /// at again.
    pub due: Option<u64>,
}

impl fmt::Debug for Planner<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Planner")
            .field("now", &self.now)
            .field("grace", &self.grace)
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl<'v> Planner<'v> {
    /// A planner at `now` (the store's clock); `api` says who manages a pod now, and
    /// `netns_exists` whether a sandbox's network namespace still exists.
    pub fn new(
        view: &'v ClusterView,
        api: &'v dyn ApiView,
        now: u64,
        grace: Grace,
        netns_exists: &'v dyn Fn(&str) -> bool,
    ) -> Self {
        Planner {
            view,
            api,
            now,
            grace,
            netns_exists,
            plan: Plan::default(),
            dead_sandboxes: Vec::new(),
            due: None,
        }
    }

    fn due_at(&mut self, at: u64) {
        self.due = Some(self.due.map_or(at, |d| d.min(at)));
    }

    /// Plans the DEL of the sandbox that has `lease`, decided by who manages its pod now, once
    /// per sandbox.
    fn plan_del(&mut self, lease: &Lease) {
        if self.plan.has_missed_del(&lease.owner) {
            return;
        }
        let departure = lease
            .pod
            .as_ref()
            .map(|pod| {
                let said = self.api.management(&SandboxPod {
                    namespace: &pod.namespace,
                    name: &pod.name,
                    uid: pod.uid.as_deref(),
                    adding: false,
                    annotations: None,
                });
                missed_del(&said, lease.retention)
            })
            .unwrap_or_default();
        self.plan.missed_del.push(MissedDel {
            owner: lease.owner.clone(),
            departure,
        });
    }

    /// Considers one lease.
    pub fn consider(&mut self, lease: &Lease) {
        let age = self.now.saturating_sub(lease.since);
        match lease.state {
            LeaseState::Held { .. } => {
                if let Some(reason) = holding_verdict(lease, self.view) {
                    if age >= self.grace.release {
                        self.plan.release.push((lease.clone(), reason));
                    } else {
                        self.due_at(lease.since.saturating_add(self.grace.release));
                    }
                }
            }
            LeaseState::Active if lost_its_del(lease, self.view) => {
                if age < self.grace.missed_del {
                    self.due_at(lease.since.saturating_add(self.grace.missed_del));
                } else if lease.netns.as_deref().is_some_and(self.netns_exists) {
                    // Its sandbox is still being torn down: look again in a while.
                    self.due_at(self.now.saturating_add(RECHECK_SANDBOX_SECS));
                } else {
                    self.plan_del(lease);
                }
            }
            LeaseState::Active => {
                // The pod is still here. Its sandbox is dead if its network namespace is gone
                // (the runtime's state was wiped by a reboot) — but that alone never frees an
                // address: see [`Planner::finish`].
                if age >= self.grace.missed_del
                    && lease.netns.as_deref().is_some_and(|n| {
                        !(self.netns_exists)(n)
                            && Path::new(n)
                                .parent()
                                .and_then(Path::to_str)
                                .is_some_and(self.netns_exists)
                    })
                {
                    self.dead_sandboxes.push(lease.clone());
                }
            }
        }
    }

    /// Ends the pass: an active address of a pod that is still on the node, whose sandbox's
    /// network namespace is gone, lost its DEL if the same pod has a newer sandbox with its own
    /// address (the kubelet rebuilt the sandbox after a reboot wiped the runtime's state, and
    /// the pod's retention is off, so the new sandbox did not take the address over). `store`
    /// answers who else the pod's identity has. An address whose pod has no newer sandbox is
    /// left alone: its pod may still come back to it.
    pub fn finish(mut self, store: &dyn StoreRead) -> Result<(Plan, Option<u64>), StoreError> {
        for lease in std::mem::take(&mut self.dead_sandboxes) {
            let Some(id) = lease.identity() else {
                continue;
            };
            let superseded = store.leases_of_identity(&id)?.iter().any(|other| {
                other.is_active() && other.owner != lease.owner && other.since >= lease.since
            });
            if superseded {
                self.plan_del(&lease);
            }
        }
        Ok((self.plan, self.due))
    }
}

/// Plans one pass over `leases` (no network namespace exists; `api` says who manages a pod).
pub fn plan(
    leases: &[Lease],
    view: &ClusterView,
    api: &dyn ApiView,
    now: u64,
    grace: Grace,
) -> Plan {
    let mut planner = Planner::new(view, api, now, grace, &|_| false);
    for lease in leases {
        planner.consider(lease);
    }
    planner.plan
}

/// The workload a lease belongs to, for the holdings metric: the StatefulSet of its
/// PersistentPodState, else the pod name without its ordinal, else the pod name.
pub fn workload(lease: &Lease, view: &ClusterView) -> String {
    let Some(pod) = &lease.pod else {
        return String::new();
    };
    if let Ok(Some(PpsView {
        statefulset: Some(s),
        ..
    })) = managing(lease, view)
    {
        return s.clone();
    }
    match pod.name.rsplit_once('-') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            base.to_string()
        }
        _ => pod.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ipkeep_cni::management::{NoApiView, Unavailable};
    use ipkeep_ipam::{PodRef, StateRef};

    /// No view of the API server: a missed DEL keeps what ADD recorded.
    fn no_api() -> NoApiView {
        NoApiView::new("no API server in this test", false)
    }

    /// The owners of the planned missed DELs.
    fn owners(plan: &Plan) -> Vec<Attachment> {
        plan.missed_del.iter().map(|m| m.owner.clone()).collect()
    }

    const NOW: u64 = 10_000;
    const GRACE: Grace = Grace {
        release: 5,
        missed_del: 120,
    };

    fn lease(ip: u8, pod: &str, pps: Option<&str>, held: bool, since: u64) -> Lease {
        Lease {
            ip: format!("10.0.0.{ip}").parse().unwrap(),
            owner: Attachment {
                container_id: format!("c{ip}"),
                ifname: "eth0".into(),
            },
            pod: Some(PodRef {
                namespace: "db".into(),
                name: pod.into(),
                uid: Some(format!("uid-{pod}")),
                persistent_pod_state: pps.map(str::to_string),
                persistent_pod_state_uid: None,
                confirmed: false,
            }),
            retention: Retention::Forever,
            state: if held {
                LeaseState::Held { until: None }
            } else {
                LeaseState::Active
            },
            since,
            netns: None,
        }
    }

    fn view(records: &[(&str, &str)]) -> ClusterView {
        ClusterView {
            node: "n1".into(),
            pps: BTreeMap::from([(
                ("db".to_string(), "kv".to_string()),
                PpsView {
                    statefulset: Some("kv".into()),
                    records: records
                        .iter()
                        .map(|(p, n)| (p.to_string(), n.to_string()))
                        .collect(),
                },
            )]),
            undecodable: BTreeSet::new(),
            pods: BTreeMap::new(),
        }
    }

    fn verdicts(leases: &[Lease], v: &ClusterView) -> Vec<(String, Option<&'static str>)> {
        let p = plan(leases, v, &no_api(), NOW, GRACE);
        leases
            .iter()
            .map(|l| {
                let name = l.pod.as_ref().unwrap().name.clone();
                let r = p
                    .release
                    .iter()
                    .find(|(x, _)| x.ip == l.ip)
                    .map(|(_, r)| r.as_str())
                    .or_else(|| p.has_missed_del(&l.owner).then_some("missed-del"));
                (name, r)
            })
            .collect()
    }

    #[test]
    fn holdings_follow_the_records() {
        let v = view(&[("kv-0", "n1"), ("kv-1", "n2")]);
        let leases = [
            lease(1, "kv-0", Some("kv"), true, 0),   // recorded here: keep
            lease(2, "kv-1", Some("kv"), true, 0),   // recorded on n2: release
            lease(3, "kv-2", Some("kv"), true, 0),   // pruned: release
            lease(4, "kv-3", None, true, 0),         // no link, name matches kv: pruned
            lease(5, "other-0", None, true, 0),      // nobody manages it: timer only
            lease(6, "kv-4", Some("gone"), true, 0), // its state was deleted
            lease(7, "kv-5", Some("kv"), true, NOW - 2), // too fresh
            lease(8, "kvx-0", None, true, 0),        // not kv's name pattern
        ];
        assert_eq!(
            verdicts(&leases, &v),
            vec![
                ("kv-0".into(), None),
                ("kv-1".into(), Some("recorded-on-another-node")),
                ("kv-2".into(), Some("record-pruned")),
                ("kv-3".into(), Some("record-pruned")),
                ("other-0".into(), None),
                ("kv-4".into(), Some("persistent-pod-state-deleted")),
                ("kv-5".into(), None),
                ("kvx-0".into(), None),
            ]
        );
    }

    /// A PersistentPodState of the namespace that the agent cannot decode may be the one that
    /// manages a holding, and say to keep it: no holding of the namespace is released on
    /// Kubernetes' word while it does not decode (each keeps its retention timer).
    #[test]
    fn holdings_of_a_namespace_with_an_undecodable_state_stay() {
        let mut v = view(&[("kv-1", "n2")]);
        v.undecodable.insert("db".into());
        let leases = [
            lease(2, "kv-1", Some("kv"), true, 0),
            lease(3, "kv-2", Some("kv"), true, 0),
            lease(6, "kv-4", Some("gone"), true, 0),
        ];
        assert_eq!(
            verdicts(&leases, &v),
            vec![
                ("kv-1".into(), None),
                ("kv-2".into(), None),
                ("kv-4".into(), None)
            ]
        );
        v.undecodable = BTreeSet::from(["elsewhere".to_string()]);
        assert_eq!(
            verdicts(&leases, &v),
            vec![
                ("kv-1".into(), Some("recorded-on-another-node")),
                ("kv-2".into(), Some("record-pruned")),
                ("kv-4".into(), Some("persistent-pod-state-deleted")),
            ]
        );
    }

    #[test]
    fn a_pod_back_on_the_node_keeps_its_holding() {
        let mut v = view(&[]);
        v.pods
            .insert(("db".into(), "kv-2".into()), Some("new".into()));
        assert_eq!(
            verdicts(&[lease(3, "kv-2", Some("kv"), true, 0)], &v),
            vec![("kv-2".into(), None)]
        );
    }

    #[test]
    fn active_addresses_of_vanished_pods_lost_their_del() {
        let mut v = view(&[("kv-0", "n1"), ("kv-1", "n1"), ("kv-2", "n1")]);
        v.pods
            .insert(("db".into(), "kv-0".into()), Some("uid-kv-0".into()));
        v.pods
            .insert(("db".into(), "kv-1".into()), Some("rebuilt".into()));
        v.pods.insert(("db".into(), "kv-3".into()), None);
        let leases = [
            lease(1, "kv-0", Some("kv"), false, 0),        // its pod runs
            lease(2, "kv-1", Some("kv"), false, 0),        // same name, another pod: lost
            lease(3, "kv-2", Some("kv"), false, 0),        // gone: lost
            lease(4, "kv-3", Some("kv"), false, 0),        // uid unknown: trust the name
            lease(5, "kv-4", Some("kv"), false, NOW - 60), // within grace
        ];
        assert_eq!(
            verdicts(&leases, &v),
            vec![
                ("kv-0".into(), None),
                ("kv-1".into(), Some("missed-del")),
                ("kv-2".into(), Some("missed-del")),
                ("kv-3".into(), None),
                ("kv-4".into(), None),
            ]
        );
    }

    #[test]
    fn an_address_whose_sandbox_still_exists_never_lost_its_del() {
        let v = view(&[("kv-0", "n1")]);
        let mut old = lease(1, "kv-0", Some("kv"), false, 0);
        old.netns = Some("/run/netns/cni-1".into());
        let alive = |n: &str| n == "/run/netns/cni-1";
        let api = no_api();
        let mut planner = Planner::new(&v, &api, NOW, GRACE, &alive);
        planner.consider(&old);
        assert!(
            planner.plan.missed_del.is_empty(),
            "its sandbox is still being torn down"
        );
        let mut planner = Planner::new(&v, &api, NOW, GRACE, &|_| false);
        planner.consider(&old);
        assert_eq!(owners(&planner.plan), vec![old.owner.clone()]);
    }

    /// After a reboot wiped the runtime's state the kubelet builds a new sandbox for a pod
    /// that is still on the node; with retention off the new sandbox got a new address and the
    /// old one would stay in use forever. It lost its DEL only when all of these hold.
    #[test]
    fn a_sandbox_replaced_after_its_namespace_vanished_lost_its_del() {
        use ipkeep_ipam::{MemoryStore, Store, StoreRead};
        let v = view(&[]);
        let pod_of = |mut l: Lease, netns: &str| {
            l.retention = Retention::Off;
            l.netns = Some(netns.into());
            l
        };
        let old = pod_of(lease(1, "web-0", None, false, 0), "/run/netns/cni-old");
        let new = pod_of(
            lease(2, "web-0", None, false, NOW - 200),
            "/run/netns/cni-new",
        );
        let mut with_new = MemoryStore::new();
        let changes = [&old, &new].map(|l| ipkeep_ipam::store::LeaseChange {
            ip: l.ip,
            before: None,
            after: Some(l.clone()),
        });
        with_new
            .commit(ipkeep_ipam::Commit {
                leases: changes.to_vec(),
                ..Default::default()
            })
            .unwrap();
        let mut alone = MemoryStore::new();
        alone
            .commit(ipkeep_ipam::Commit {
                leases: changes[..1].to_vec(),
                ..Default::default()
            })
            .unwrap();
        // web-0 is on the node, with the UID its sandboxes were made for: not a vanished pod.
        let mut v = v;
        v.pods
            .insert(("db".into(), "web-0".into()), Some("uid-web-0".into()));
        // The old namespace is gone; the new one and the namespace directory exist.
        let visible = |n: &str| n == "/run/netns" || n == "/run/netns/cni-new";
        let run =
            |store: &dyn StoreRead, leases: &[&Lease], now: u64, probe: &dyn Fn(&str) -> bool| {
                let api = no_api();
                let mut planner = Planner::new(&v, &api, now, GRACE, probe);
                for l in leases {
                    planner.consider(l);
                }
                owners(&planner.finish(store).unwrap().0)
            };
        assert_eq!(
            run(&with_new, &[&old, &new], NOW, &visible),
            vec![old.owner.clone()],
            "a newer sandbox has its own address: the old one lost its DEL"
        );
        assert!(
            run(&alone, &[&old], NOW, &visible).is_empty(),
            "no newer sandbox: the pod may still come back to it"
        );
        assert!(
            run(&with_new, &[&old, &new], NOW, &|n: &str| n
                .ends_with("cni-new"))
            .is_empty(),
            "the namespace directory is not visible: its absence proves nothing"
        );
        assert!(
            run(&with_new, &[&old, &new], NOW, &|n: &str| n
                .starts_with("/run/netns"))
            .is_empty(),
            "the old namespace still exists"
        );
        assert!(
            run(&with_new, &[&old, &new], 100, &visible).is_empty(),
            "within the missed-DEL grace"
        );
        assert!(
            run(&with_new, &[&new], NOW, &visible).is_empty(),
            "the newer sandbox itself is never taken for the old one"
        );
    }

    #[test]
    fn the_planner_says_when_a_decision_falls_due() {
        let v = view(&[("kv-0", "n1")]);
        let fresh = lease(2, "kv-9", Some("kv"), true, NOW - 2); // pruned, 2 s into its 5 s grace
        let gone = lease(3, "kv-8", Some("kv"), false, NOW - 60); // missed DEL in 60 s
        let kept = lease(1, "kv-0", Some("kv"), true, 0); // recorded here: never due
        let api = no_api();
        let mut planner = Planner::new(&v, &api, NOW, GRACE, &|_| false);
        planner.consider(&kept);
        assert_eq!(planner.due, None);
        planner.consider(&gone);
        assert_eq!(planner.due, Some(NOW + 60));
        planner.consider(&fresh);
        assert_eq!(planner.due, Some(NOW + 3));
        assert!(planner.plan.release.is_empty() && planner.plan.missed_del.is_empty());
    }

    #[test]
    fn only_canonical_ordinals_name_a_statefulsets_pods() {
        // One grammar with placement: `kv-01` is not a pod of `kv`, so its holding is left to
        // its timer instead of being released as a pruned record.
        let v = view(&[]);
        assert_eq!(
            verdicts(&[lease(1, "kv-01", None, true, 0)], &v),
            vec![("kv-01".into(), None)]
        );
    }

    #[test]
    fn one_pass_acts_on_at_most_its_budget() {
        let mut v = view(&[]);
        v.pods.clear();
        let leases: Vec<Lease> = (1..=5)
            .map(|i| lease(i, &format!("kv-{i}"), Some("kv"), i > 2, 0))
            .collect();
        let mut plan = plan(&leases, &v, &no_api(), NOW, GRACE);
        assert_eq!((plan.release.len(), plan.missed_del.len()), (3, 2));
        let mut budget = 4;
        assert_eq!(plan.limit(&mut budget), 1);
        assert_eq!(
            (plan.release.len(), plan.missed_del.len(), budget),
            (3, 1, 0)
        );
        let mut nothing_left = 0;
        let mut plan = plan_of(&leases, &v);
        assert_eq!(plan.limit(&mut nothing_left), 5);
        assert_eq!(plan, Plan::default());
    }

    fn plan_of(leases: &[Lease], v: &ClusterView) -> Plan {
        plan(leases, v, &no_api(), NOW, GRACE)
    }

    /// Says the same of every pod.
    #[derive(Debug)]
    struct Says(Management);

    impl ApiView for Says {
        fn management(&self, _: &SandboxPod<'_>) -> Management {
            self.0.clone()
        }
    }

    fn managed_by_db(judged_by_name: bool) -> Management {
        Management::Managed {
            persistent_pod_state: StateRef {
                name: "db".into(),
                uid: Some("uid-db".into()),
            },
            annotations: [
                ("ipkeep.dev/persistent-pod-state", "db"),
                ("ipkeep.dev/ip-retention", "2h"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
            judged_by_name,
        }
    }

    #[test]
    fn a_missed_del_holds_by_the_state_that_manages_the_pod_now() {
        let recorded = Retention::Off;
        let departure = missed_del(&managed_by_db(false), recorded);
        assert_eq!(departure.retention, Some(Retention::Seconds(7_200)));
        let db = StateRef {
            name: "db".into(),
            uid: Some("uid-db".into()),
        };
        assert_eq!(departure.confirmed, Some(Confirmed::By(db)));
        assert!(!departure.judged_by_name);
        assert!(missed_del(&managed_by_db(true), recorded).judged_by_name);
        for other in [
            Management::Unmanaged,
            Management::Unknown(Unavailable {
                why: "x".into(),
                expected: true,
            }),
        ] {
            assert_eq!(
                missed_del(&other, recorded),
                Departure::default(),
                "{other:?}"
            );
        }
    }

    /// The plan carries the DEL each vanished sandbox gets, decided by who manages its pod at
    /// planning time: the sweeper only applies it.
    #[test]
    fn a_planned_missed_del_says_what_it_records() {
        let mut v = view(&[]);
        v.pods.clear();
        let gone = lease(1, "kv-1", Some("kv"), false, 0);
        let managed = plan(
            std::slice::from_ref(&gone),
            &v,
            &Says(managed_by_db(false)),
            NOW,
            GRACE,
        );
        assert_eq!(
            managed.missed_del,
            vec![MissedDel {
                owner: gone.owner.clone(),
                departure: missed_del(&managed_by_db(false), gone.retention),
            }]
        );
        assert_eq!(
            managed.missed_del[0].departure.retention,
            Some(Retention::Seconds(7_200))
        );
        let alone = plan(std::slice::from_ref(&gone), &v, &no_api(), NOW, GRACE);
        assert_eq!(alone.missed_del[0].departure, Departure::default());
    }

    #[test]
    fn workloads() {
        let v = view(&[]);
        assert_eq!(workload(&lease(1, "kv-3", None, true, 0), &v), "kv");
        assert_eq!(workload(&lease(1, "web-7", None, true, 0), &v), "web");
        assert_eq!(workload(&lease(1, "solo", None, true, 0), &v), "solo");
    }
}
