//! Allocator scenarios, run against both the in-memory store and the on-disk store so the two
//! cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use super::{tests_ranges, tests_reclaim};
use crate::allocator::{self, AddRequest, AllocError, CheckError, Source};
use crate::clock::Reading;
use crate::disk::{DiskStore, NetworkDir};
use crate::lease::{Attachment, Lease, LeaseState, PodRef};
use crate::range::{RangeSet, RangeSpec};
use crate::retention::Retention;
use crate::store::{Commit, LeaseChange, MemoryStore, Store, StoreRead};

pub(super) const T0: u64 = 1_700_000_000;
pub(super) const DAY: Retention = Retention::Seconds(86_400);

pub(super) fn sets(subnets: &[&str]) -> Vec<RangeSet> {
    subnets
        .iter()
        .map(|s| {
            RangeSet::from_specs(&[RangeSpec {
                subnet: Some((*s).to_string()),
                ..RangeSpec::default()
            }])
            .expect("valid range")
        })
        .collect()
}

pub(super) fn att(id: &str) -> Attachment {
    Attachment {
        container_id: id.to_string(),
        ifname: "eth0".to_string(),
    }
}

pub(super) fn pod(name: &str) -> Option<PodRef> {
    Some(PodRef {
        namespace: "db".to_string(),
        name: name.to_string(),
        uid: None,
        persistent_pod_state: None,
        persistent_pod_state_uid: None,
        confirmed: false,
    })
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

pub(super) struct Case<'a> {
    pub(super) sets: &'a [RangeSet],
    pub(super) store: &'a mut dyn Store,
}

impl Case<'_> {
    pub(super) fn add_full(
        &mut self,
        cid: &str,
        pod_name: Option<&str>,
        retention: Retention,
        requested: &[IpAddr],
        now: u64,
    ) -> Result<Vec<(IpAddr, Source)>, AllocError> {
        let req = AddRequest {
            range_sets: self.sets,
            owner: att(cid),
            pod: pod_name.and_then(pod),
            retention,
            requested,
            netns: None,
            netns_known: BTreeMap::new(),
            reuse_cooldown: 0,
        };
        let out = allocator::add(self.store, &req, &Reading::wall(now))?;
        Ok(out
            .assignments
            .into_iter()
            .map(|a| (a.ip, a.source))
            .collect())
    }

    pub(super) fn add(
        &mut self,
        cid: &str,
        pod_name: Option<&str>,
        retention: Retention,
    ) -> Vec<String> {
        self.add_at(cid, pod_name, retention, T0)
    }

    fn add_at(&mut self, cid: &str, pod_name: Option<&str>, r: Retention, now: u64) -> Vec<String> {
        self.add_full(cid, pod_name, r, &[], now)
            .unwrap_or_else(|e| panic!("ADD {cid}: {e}"))
            .into_iter()
            .map(|(ip, _)| ip.to_string())
            .collect()
    }

    pub(super) fn del(&mut self, cid: &str, now: u64) -> (usize, usize) {
        let out = allocator::del(
            self.store,
            &att(cid),
            &Default::default(),
            &Reading::wall(now),
        )
        .expect("DEL");
        (out.held.len(), out.released.len())
    }

    pub(super) fn state(&self, addr: &str) -> Option<(String, LeaseState)> {
        self.store
            .lease(ip(addr))
            .expect("read")
            .map(|l| (l.owner.container_id, l.state))
    }
}

/// One module per scenario, with a test on each store: a failure names the scenario and the
/// store, and each runs on its own.
macro_rules! scenarios {
    ($($name:ident => $scenario:path,)*) => {
        $(
            mod $name {
                use super::*;

                #[test]
                fn on_the_memory_store() {
                    $scenario(&mut MemoryStore::new());
                }

                #[test]
                fn on_the_disk_store() {
                    let dir = tempfile::tempdir().expect("tempdir");
                    $scenario(&mut open_disk(dir.path()));
                }
            }
        )*
    };
}

scenarios! {
    round_robin_exhaustion_and_release => round_robin_exhaustion_and_release,
    rebuilt_pod_gets_same_addresses_on_every_set => rebuilt_pod_gets_same_addresses,
    held_addresses_go_to_nobody_else => held_addresses_go_to_nobody_else,
    held_addresses_never_starve_a_new_pod => tests_reclaim::held_addresses_never_starve_a_new_pod,
    forged_links_and_forever_give_way_before_a_real_holding => tests_reclaim::forged_links_and_forever_give_way_before_a_real_holding,
    a_confirmed_link_protects_a_holding_in_its_namespace => tests_reclaim::a_confirmed_link_protects_a_holding_in_its_namespace,
    expired_holdings_are_reclaimed => expired_holdings_are_reclaimed,
    forever_never_expires => forever_never_expires,
    late_del_of_old_sandbox_is_harmless => late_del_of_old_sandbox_is_harmless,
    a_live_old_sandbox_keeps_its_address => a_live_old_sandbox_keeps_its_address,
    every_unknown_namespace_is_asked_at_once => every_unknown_namespace_is_asked_at_once,
    without_retention_an_active_sibling_is_not_taken => without_retention_no_takeover,
    repeated_add_and_del_are_idempotent => repeated_add_and_del_are_idempotent,
    requested_ips => requested_ips,
    failed_add_changes_nothing => failed_add_changes_nothing,
    gc_holds_or_frees_and_never_touches_holdings => gc_semantics,
    check => check_semantics,
    admin_release => admin_release,
    agent_sweep_and_release => agent_sweep_and_release,
    reuse_cooldown => tests_ranges::reuse_cooldown,
    a_holding_outside_the_current_ranges_is_released => tests_ranges::a_holding_outside_the_current_ranges_is_released,
}

fn round_robin_exhaustion_and_release(store: &mut dyn Store) {
    let s = sets(&["10.10.0.0/29"]);
    let mut c = Case { sets: &s, store };
    for (i, want) in [
        "10.10.0.2",
        "10.10.0.3",
        "10.10.0.4",
        "10.10.0.5",
        "10.10.0.6",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(c.add(&format!("c{i}"), None, Retention::Off), [*want]);
    }
    let err = c
        .add_full("c9", None, Retention::Off, &[], T0)
        .expect_err("full");
    assert_eq!(
        err.to_string(),
        "failed to allocate for range 0: no IP addresses available in range set: 10.10.0.1-10.10.0.6 (5 in use, 0 held for deleted pods with IP retention; `ipkeep list` shows them)"
    );
    assert_eq!(c.del("c2", T0), (0, 1), "no pod name: released");
    assert_eq!(c.state("10.10.0.4"), None);
    assert_eq!(c.add("c7", None, Retention::Off), ["10.10.0.4"]);
    c.del("c3", T0);
    // round robin continues after the last reserved address (.4), so .5 comes before .2
    c.del("c0", T0);
    assert_eq!(c.add("c8", None, Retention::Off), ["10.10.0.5"]);
}

fn rebuilt_pod_gets_same_addresses(store: &mut dyn Store) {
    let s = sets(&["10.20.0.0/24", "fd00:20::/64"]);
    let mut c = Case { sets: &s, store };
    c.add("other", Some("web-9"), DAY);
    let first = c.add("c1", Some("web-0"), DAY);
    assert_eq!(first, ["10.20.0.3", "fd00:20::3"]);
    assert_eq!(c.del("c1", T0 + 10), (2, 0));
    assert_eq!(
        c.state("10.20.0.3"),
        Some((
            "c1".into(),
            LeaseState::Held {
                until: Some(T0 + 10 + 86_400)
            }
        ))
    );
    let again = c
        .add_full("c2", Some("web-0"), DAY, &[], T0 + 20)
        .expect("re-ADD");
    assert_eq!(
        again,
        [
            (
                ip("10.20.0.3"),
                Source::Retained {
                    from: att("c1"),
                    was_held: true
                }
            ),
            (
                ip("fd00:20::3"),
                Source::Retained {
                    from: att("c1"),
                    was_held: true
                }
            ),
        ]
    );
    assert_eq!(
        c.state("fd00:20::3"),
        Some(("c2".into(), LeaseState::Active))
    );
    // a retained pod whose retention is now off still gets its address back once
    c.del("c2", T0 + 30);
    assert_eq!(
        c.add_at("c3", Some("web-0"), Retention::Off, T0 + 40),
        first
    );
    assert_eq!(
        c.del("c3", T0 + 50),
        (0, 2),
        "retention off now: released at DEL"
    );
}

fn held_addresses_go_to_nobody_else(store: &mut dyn Store) {
    let s = sets(&["10.30.0.0/29"]);
    let mut c = Case { sets: &s, store };
    c.add("a", Some("web-0"), DAY);
    c.add("b", Some("web-1"), DAY);
    c.del("a", T0);
    c.del("b", T0);
    let got: Vec<String> = (0..3)
        .flat_map(|i| c.add(&format!("n{i}"), Some(&format!("x-{i}")), DAY))
        .collect();
    assert_eq!(got, ["10.30.0.4", "10.30.0.5", "10.30.0.6"]);
    let err = c
        .add_full("n9", Some("x-9"), DAY, &[ip("10.30.0.2")], T0)
        .expect_err("held");
    assert!(
        err.to_string()
            .contains("held of pod db/web-0 until 2023-11-15T22:13:20Z"),
        "{err}"
    );
}

fn expired_holdings_are_reclaimed(store: &mut dyn Store) {
    let s = sets(&["10.40.0.0/30"]);
    let mut c = Case { sets: &s, store };
    c.add("a", Some("web-0"), Retention::Seconds(60));
    c.del("a", T0);
    let out = allocator::add(
        c.store,
        &AddRequest {
            range_sets: &s,
            owner: att("b"),
            pod: pod("web-1"),
            retention: DAY,
            requested: &[],
            netns: None,
            netns_known: BTreeMap::new(),
            reuse_cooldown: 0,
        },
        &Reading::wall(T0 + 60),
    )
    .expect("expired holding reclaimed");
    assert_eq!(out.assignments[0].ip, ip("10.40.0.2"));
    assert_eq!(out.assignments[0].source, Source::RoundRobin);
    assert_eq!(out.expired.len(), 1);
    assert!(
        c.store.expired(u64::MAX).expect("expired").is_empty(),
        "held → active: no expiry entry"
    );
}

fn forever_never_expires(store: &mut dyn Store) {
    let s = sets(&["10.41.0.0/30"]);
    let mut c = Case { sets: &s, store };
    c.add("a", Some("web-0"), Retention::Forever);
    c.del("a", T0);
    let late = Reading::wall(u64::MAX - 1);
    assert!(
        allocator::release_expired(c.store, &late)
            .expect("sweep")
            .is_empty()
    );
    let gc = allocator::gc(c.store, &BTreeSet::new(), &late).expect("gc");
    assert!(gc.released.is_empty() && gc.expired.is_empty());
    assert_eq!(
        c.state("10.41.0.2"),
        Some(("a".to_string(), LeaseState::Held { until: None }))
    );
    assert_eq!(
        c.add_at("c", Some("web-0"), DAY, u64::MAX - 1),
        ["10.41.0.2"]
    );
}

fn late_del_of_old_sandbox_is_harmless(store: &mut dyn Store) {
    let s = sets(&["10.50.0.0/24"]);
    let mut c = Case { sets: &s, store };
    let old = c.add("old", Some("web-0"), DAY);
    // the new sandbox is added before the old one's DEL arrives
    let new = c
        .add_full("new", Some("web-0"), DAY, &[], T0 + 1)
        .expect("ADD");
    assert_eq!(
        new,
        [(
            ip(&old[0]),
            Source::Retained {
                from: att("old"),
                was_held: false
            }
        )]
    );
    assert_eq!(
        c.del("old", T0 + 2),
        (0, 0),
        "late DEL finds nothing it owns"
    );
    assert_eq!(c.state(&old[0]), Some(("new".into(), LeaseState::Active)));
    assert!(
        c.store
            .leases_of_attachment(&att("old"))
            .expect("index")
            .is_empty()
    );
}

/// A force-deleted pod's old sandbox may still run when its replacement's ADD comes: its
/// address moves only once the old network namespace is gone, and while nobody has said whether
/// it is, the ADD asks instead of guessing.
fn a_live_old_sandbox_keeps_its_address(store: &mut dyn Store) {
    let s = sets(&["10.43.0.0/24", "fd43::/120"]);
    let add = |store: &mut dyn Store, cid: &str, alive: Option<bool>| {
        let known: BTreeMap<String, bool> = alive
            .map(|alive| ("/run/netns/old".to_string(), alive))
            .into_iter()
            .collect();
        let req = AddRequest {
            range_sets: &s,
            owner: att(cid),
            pod: pod("web-0"),
            retention: DAY,
            requested: &[],
            netns: Some(format!("/run/netns/{cid}")),
            netns_known: known,
            reuse_cooldown: 0,
        };
        allocator::add(store, &req, &Reading::wall(T0))
    };
    let first = add(&mut *store, "old", None).expect("first ADD");
    let err = add(&mut *store, "new", None).expect_err("nobody said");
    assert!(
        matches!(&err, AllocError::NeedsNetns(paths) if paths == &["/run/netns/old"]),
        "one question for both addresses of the old sandbox: {err}"
    );
    let err = add(&mut *store, "new", Some(true)).expect_err("old sandbox alive");
    assert!(
        matches!(&err, AllocError::StillInUse { ip, netns, .. }
            if *ip == first.assignments[0].ip && netns == "/run/netns/old"),
        "{err}"
    );
    for assigned in &first.assignments {
        let lease = store.lease(assigned.ip).expect("read").expect("lease");
        assert_eq!(lease.owner, att("old"), "a refused ADD changes nothing");
    }
    let again = add(&mut *store, "new", Some(false)).expect("old sandbox gone");
    assert_eq!(
        again.assignments[0].source,
        Source::Retained {
            from: att("old"),
            was_held: false
        }
    );
    let lease = store
        .lease(first.assignments[0].ip)
        .expect("read")
        .expect("lease");
    assert_eq!(lease.netns.as_deref(), Some("/run/netns/new"));
}

/// Two older sandboxes still hold addresses of the pod (one per range set). The store lists
/// them in address order (a's IPv4 address first); they are judged in that order, as one probe
/// after another would: every namespace nobody spoke for up to the first one known to exist is
/// asked about, in one question.
fn every_unknown_namespace_is_asked_at_once(store: &mut dyn Store) {
    let s = sets(&["10.44.0.0/24", "fd44::/120"]);
    // Written as they are found after two sandboxes' ADDs: no ADD makes this on its own.
    let leases = [("a", "10.44.0.2"), ("b", "fd44::2")].map(|(cid, addr)| LeaseChange {
        ip: ip(addr),
        before: None,
        after: Some(Lease {
            ip: ip(addr),
            owner: att(cid),
            pod: pod("web-0"),
            retention: DAY,
            state: LeaseState::Active,
            since: T0,
            netns: Some(format!("/run/netns/{cid}")),
        }),
    });
    store
        .commit(Commit {
            leases: leases.to_vec(),
            ..Commit::default()
        })
        .expect("commit");
    let both = |store: &mut dyn Store, known: &[(&str, bool)]| {
        let known: BTreeMap<String, bool> =
            known.iter().map(|(p, e)| (p.to_string(), *e)).collect();
        let req = AddRequest {
            range_sets: &s,
            owner: att("c"),
            pod: pod("web-0"),
            retention: DAY,
            requested: &[],
            netns: Some("/run/netns/c".into()),
            netns_known: known,
            reuse_cooldown: 0,
        };
        allocator::add(store, &req, &Reading::wall(T0))
    };
    let err = both(&mut *store, &[]).expect_err("nobody said");
    assert!(
        matches!(&err, AllocError::NeedsNetns(p) if p.len() == 2),
        "{err}"
    );
    let err = both(&mut *store, &[("/run/netns/b", true)]).expect_err("a unknown");
    assert!(
        matches!(&err, AllocError::NeedsNetns(p) if p == &["/run/netns/a"]),
        "a comes first: asked about before b is reported: {err}"
    );
    let err = both(&mut *store, &[("/run/netns/a", true)]).expect_err("a alive");
    assert!(
        matches!(&err, AllocError::StillInUse { netns, .. } if netns == "/run/netns/a"),
        "{err}"
    );
    let err = both(
        &mut *store,
        &[("/run/netns/a", false), ("/run/netns/b", true)],
    )
    .expect_err("b alive");
    assert!(
        matches!(&err, AllocError::StillInUse { netns, .. } if netns == "/run/netns/b"),
        "{err}"
    );
    let out = both(
        &mut *store,
        &[("/run/netns/a", false), ("/run/netns/b", false)],
    )
    .expect("both gone");
    assert!(
        out.assignments.iter().all(|a| matches!(
            a.source,
            Source::Retained {
                was_held: false,
                ..
            }
        )),
        "{out:?}"
    );
}

fn without_retention_no_takeover(store: &mut dyn Store) {
    let s = sets(&["10.51.0.0/24"]);
    let mut c = Case { sets: &s, store };
    let a = c.add("a", Some("web-0"), Retention::Off);
    let b = c.add("b", Some("web-0"), Retention::Off);
    assert_ne!(a, b);
    assert_eq!(c.state(&a[0]), Some(("a".into(), LeaseState::Active)));
}

fn repeated_add_and_del_are_idempotent(store: &mut dyn Store) {
    let s = sets(&["10.60.0.0/24", "fd00:60::/120"]);
    let mut c = Case { sets: &s, store };
    let first = c.add("a", Some("web-0"), DAY);
    let again = c
        .add_full("a", Some("web-0"), DAY, &[], T0 + 5)
        .expect("repeat");
    assert!(again.iter().all(|(_, src)| *src == Source::Existing));
    assert_eq!(
        again.iter().map(|(i, _)| i.to_string()).collect::<Vec<_>>(),
        first
    );
    assert_eq!(c.store.all().expect("all").len(), 2, "no second address");
    assert_eq!(c.del("a", T0), (2, 0));
    assert_eq!(c.del("a", T0 + 1), (0, 0), "second DEL is a no-op");
    assert_eq!(c.del("never-added", T0), (0, 0));
    assert_eq!(
        c.state(&first[0]).map(|s| s.1),
        Some(LeaseState::Held {
            until: Some(T0 + 86_400)
        })
    );
}

fn requested_ips(store: &mut dyn Store) {
    let s = sets(&["10.70.0.0/24", "fd00:70::/120"]);
    let mut c = Case { sets: &s, store };
    let got = c
        .add_full("a", None, Retention::Off, &[ip("10.70.0.50")], T0)
        .expect("ADD");
    assert_eq!(got[0], (ip("10.70.0.50"), Source::Requested));
    assert_eq!(got[1].0, ip("fd00:70::2"));
    let taken = c
        .add_full("b", None, Retention::Off, &[ip("10.70.0.50")], T0)
        .expect_err("taken");
    assert!(taken.to_string().starts_with("failed to allocate for range 0: requested IP address 10.70.0.50 is not available in range set 10.70.0.1-10.70.0.254 (in use by a/eth0"), "{taken}");
    let gw = c
        .add_full("b", None, Retention::Off, &[ip("10.70.0.1")], T0)
        .expect_err("gateway");
    assert_eq!(
        gw.to_string(),
        "failed to allocate for range 0: requested ip 10.70.0.1 is subnet's gateway"
    );
    let outside = c
        .add_full("b", None, Retention::Off, &[ip("10.71.0.5")], T0)
        .expect_err("outside");
    assert_eq!(
        outside.to_string(),
        "failed to allocate all requested IPs: 10.71.0.5"
    );
    let two = c
        .add_full(
            "b",
            None,
            Retention::Off,
            &[ip("10.70.0.80"), ip("10.70.0.81")],
            T0,
        )
        .expect_err("two in one set");
    assert_eq!(
        two.to_string(),
        "failed to allocate all requested IPs: 10.70.0.81"
    );
    let own = c
        .add_full("a", None, Retention::Off, &[ip("10.70.0.51")], T0)
        .expect_err("own");
    assert!(
        matches!(own, AllocError::RequestedConflictsWithOwn { .. }),
        "{own}"
    );
    // the next dynamic address follows the requested one (host-local records it as last)
    assert_eq!(c.add("c", None, Retention::Off)[0], "10.70.0.51");
    // a pod that asks for a new address gives up the one held for it in that set
    c.add("p1", Some("web-0"), DAY);
    c.del("p1", T0);
    let held_v4 = c.store.leases_of_pod("db", "web-0").expect("pod")[0].ip;
    c.add_full("p2", Some("web-0"), DAY, &[ip("10.70.0.99")], T0)
        .expect("ADD");
    assert_eq!(c.store.lease(held_v4).expect("read"), None);
    // ...but an address still configured in the pod's old sandbox is not freed under it
    let active_v4 = c.add("q1", Some("web-5"), DAY)[0].clone();
    c.add_full("q2", Some("web-5"), DAY, &[ip("10.70.0.98")], T0)
        .expect("ADD");
    assert_eq!(c.state(&active_v4), Some(("q1".into(), LeaseState::Active)));
}

fn failed_add_changes_nothing(store: &mut dyn Store) {
    let s = sets(&["10.80.0.0/24", "fd00:80::/126"]);
    let mut c = Case { sets: &s, store };
    c.add("a", None, Retention::Off);
    c.add("b", None, Retention::Off);
    let before = c.store.all().expect("all");
    c.add_full("c", None, Retention::Off, &[], T0)
        .expect_err("v6 set full");
    c.add_full("a", None, Retention::Off, &[ip("10.80.0.77")], T0)
        .expect_err("conflict");
    assert_eq!(
        c.store.all().expect("all"),
        before,
        "nothing changed, a's addresses intact"
    );
    assert_eq!(
        c.store
            .last_reserved("10.80.0.1-10.80.0.254")
            .expect("cursor"),
        Some(ip("10.80.0.3"))
    );
}

fn gc_semantics(store: &mut dyn Store) {
    let s = sets(&["10.90.0.0/24"]);
    let mut c = Case { sets: &s, store };
    c.add("keep", Some("web-0"), DAY);
    c.add("gone-retained", Some("web-1"), DAY);
    c.add("gone-plain", None, Retention::Off);
    c.add("held", Some("web-2"), Retention::Seconds(100));
    c.del("held", T0);
    c.add("expiring", Some("web-3"), Retention::Seconds(10));
    c.del("expiring", T0);
    let valid: BTreeSet<Attachment> = [att("keep")].into();
    let out = allocator::gc(c.store, &valid, &Reading::wall(T0 + 50)).expect("gc");
    assert_eq!(
        out.held
            .iter()
            .map(|l| l.owner.container_id.as_str())
            .collect::<Vec<_>>(),
        ["gone-retained"]
    );
    assert_eq!(
        out.released
            .iter()
            .map(|l| l.owner.container_id.as_str())
            .collect::<Vec<_>>(),
        ["gone-plain"]
    );
    assert_eq!(out.expired.len(), 1);
    let states: Vec<_> = c
        .store
        .all()
        .expect("all")
        .into_iter()
        .map(|l| (l.owner.container_id, l.state))
        .collect();
    assert_eq!(
        states,
        [
            ("keep".into(), LeaseState::Active),
            (
                "gone-retained".into(),
                LeaseState::Held {
                    until: Some(T0 + 50 + 86_400)
                }
            ),
            (
                "held".into(),
                LeaseState::Held {
                    until: Some(T0 + 100)
                }
            ),
        ]
    );
}

fn check_semantics(store: &mut dyn Store) {
    let s = sets(&["10.95.0.0/24"]);
    let mut c = Case { sets: &s, store };
    let got = c.add("a", Some("web-0"), DAY);
    allocator::check(c.store, &att("a"), &[ip(&got[0])]).expect("CHECK ok");
    allocator::check(c.store, &att("a"), &[]).expect("CHECK without prevResult");
    let other = allocator::check(c.store, &att("a"), &[ip("10.95.0.99")]).expect_err("mismatch");
    assert!(matches!(other, CheckError::Mismatch { .. }));
    c.del("a", T0);
    let gone = allocator::check(c.store, &att("a"), &[]).expect_err("held is not configured");
    assert_eq!(
        gone.to_string(),
        "ipkeep: failed to find address added by container a/eth0"
    );
}

fn admin_release(store: &mut dyn Store) {
    let s = sets(&["10.96.0.0/24"]);
    let mut c = Case { sets: &s, store };
    c.add("a", Some("web-0"), Retention::Forever);
    c.add("b", Some("web-1"), Retention::Forever);
    c.del("a", T0);
    let out = allocator::release_pod(c.store, "db", "web-0", None, false, &Reading::wall(T0))
        .expect("release");
    assert_eq!(out.released.len(), 1);
    let out = allocator::release_pod(c.store, "db", "web-1", None, false, &Reading::wall(T0))
        .expect("release");
    assert_eq!((out.released.len(), out.still_active.len()), (0, 1));
    let out = allocator::release_pod(
        c.store,
        "db",
        "web-1",
        Some("eth0"),
        true,
        &Reading::wall(T0),
    )
    .expect("release");
    assert_eq!(out.released.len(), 1);
    assert!(c.store.all().expect("all").is_empty());
}

fn agent_sweep_and_release(store: &mut dyn Store) {
    let s = sets(&["10.97.0.0/24"]);
    let mut c = Case { sets: &s, store };
    c.add("a", Some("web-0"), Retention::Seconds(60));
    c.add("b", Some("web-1"), Retention::Forever);
    c.add("c", Some("web-2"), Retention::Forever);
    c.add("d", Some("web-3"), Retention::Forever);
    c.del("a", T0);
    c.del("b", T0);
    c.del("c", T0);
    assert!(
        allocator::release_expired(c.store, &Reading::wall(T0 + 59))
            .expect("sweep")
            .is_empty()
    );
    let swept = allocator::release_expired(c.store, &Reading::wall(T0 + 60)).expect("sweep");
    assert_eq!(swept.len(), 1);
    assert_eq!(c.state("10.97.0.2"), None);
    // A decision from a snapshot frees only leases that did not change since.
    let snapshot = c.store.all().expect("all");
    let held_b = snapshot
        .iter()
        .find(|l| l.owner.container_id == "b")
        .cloned();
    let held_c = snapshot
        .iter()
        .find(|l| l.owner.container_id == "c")
        .cloned();
    let active_d = snapshot
        .iter()
        .find(|l| l.owner.container_id == "d")
        .cloned();
    c.add_at("c2", Some("web-2"), Retention::Forever, T0 + 70); // web-2 came back
    let freed = allocator::release_held(
        c.store,
        &[held_b.expect("b"), held_c.expect("c"), active_d.expect("d")],
        &Reading::wall(T0 + 80),
    )
    .expect("release");
    assert_eq!(
        freed.len(),
        1,
        "only web-1's holding: web-2 is in use again, web-3 active"
    );
    assert_eq!(c.state("10.97.0.3"), None);
    assert_eq!(
        c.state("10.97.0.4"),
        Some(("c2".to_string(), LeaseState::Active))
    );
    assert_eq!(
        c.state("10.97.0.5"),
        Some(("d".to_string(), LeaseState::Active))
    );
}

pub(super) fn open_disk(dir: &std::path::Path) -> DiskStore {
    let net = NetworkDir::new(dir, "net").expect("name");
    DiskStore::open(
        net.lock(Duration::from_secs(5)).expect("lock"),
        &Default::default(),
    )
    .expect("open")
}

#[test]
fn disk_store_persists_and_keeps_indexes_consistent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = sets(&["10.99.0.0/24"]);
    let mut mem = MemoryStore::new();
    {
        let mut disk = open_disk(dir.path());
        for store in [&mut disk as &mut dyn Store, &mut mem] {
            let mut c = Case { sets: &s, store };
            c.add("a", Some("web-0"), DAY);
            c.add("b", Some("web-1"), Retention::Seconds(5));
            c.del("a", T0);
            c.del("b", T0);
            c.add("c", Some("web-0"), DAY);
        }
    }
    let disk = open_disk(dir.path());
    assert_eq!(disk.all().expect("all"), mem.all().expect("all"));
    assert_eq!(
        disk.expired(T0 + 5).expect("e"),
        mem.expired(T0 + 5).expect("e")
    );
    assert_eq!(disk.leases_of_attachment(&att("a")).expect("c"), vec![]);
    assert_eq!(
        disk.leases_of_attachment(&att("c")).expect("c"),
        mem.leases_of_attachment(&att("c")).expect("c")
    );
    assert_eq!(
        disk.range_sets().expect("ranges"),
        mem.range_sets().expect("ranges")
    );
    assert_eq!(
        disk.last_reserved("10.99.0.1-10.99.0.254").expect("l"),
        Some(ip("10.99.0.3"))
    );
}

#[test]
fn disk_lock_is_exclusive_with_bounded_wait() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let net = NetworkDir::new(dir.path(), "net").expect("name");
    let held = net.lock(Duration::from_secs(1)).expect("first lock");
    let err = net
        .lock(Duration::from_millis(50))
        .expect_err("second lock must time out");
    assert!(
        matches!(err, crate::StoreError::LockTimeout { .. }),
        "{err}"
    );
    drop(held);
    net.lock(Duration::from_millis(50)).expect("free again");
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(net.path()), 0o700);
    assert_eq!(mode(&net.path().join("lock")), 0o600);
    assert!(NetworkDir::new(dir.path(), "../etc").is_err());
    assert!(NetworkDir::new(dir.path(), ".hidden").is_err());
    assert!(NetworkDir::new(dir.path(), "").is_err());
}
