//! Whom a held address goes back to (the security review's L-2): an address kept for a pod a
//! PersistentPodState manages goes only to a pod of that same state; one kept for a pod no state
//! was tied to, to the next pod of its identity, as `ipam.retention` promises. One test per
//! scenario, each on both stores.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::tests::{DAY, T0, att, ip, open_disk, pod, sets};
use crate::allocator::{self, AddOutcome, AddRequest, AllocError, Source};
use crate::clock::Reading;
use crate::lease::{Confirmed, LeaseState, PodRef, StateRef};
use crate::range::RangeSet;
use crate::retention::Retention;
use crate::store::{MemoryStore, Store};

fn on_both_stores(scenario: fn(&mut dyn Store)) {
    scenario(&mut MemoryStore::new());
    let dir = tempfile::tempdir().expect("tempdir");
    scenario(&mut open_disk(dir.path()));
}

/// `prod/db-7`, as the node agent judged it: managed by PersistentPodState `state`.
fn managed(state: &str) -> Option<PodRef> {
    judged(Confirmed::By(state.into()))
}

/// `prod/db-7`, managed by PersistentPodState `state` with UID `uid`.
fn managed_uid(state: &str, uid: &str) -> Option<PodRef> {
    judged(Confirmed::By(StateRef {
        name: state.to_string(),
        uid: Some(uid.to_string()),
    }))
}

/// `prod/db-7`, which the node agent says no PersistentPodState manages.
fn unmanaged() -> Option<PodRef> {
    judged(Confirmed::Nobody)
}

fn judged(word: Confirmed) -> Option<PodRef> {
    unjudged(None).map(|mut p| {
        p.confirm(&word);
        p
    })
}

/// `prod/db-7` without the agent's view, carrying the webhook's link `link` (or none).
fn unjudged(link: Option<&str>) -> Option<PodRef> {
    pod("db-7").map(|mut p| {
        p.namespace = "prod".to_string();
        p.persistent_pod_state = link.map(str::to_string);
        p
    })
}

/// One ADD of `cid` for `pod`, asking for `requested`. A pod the agent says nothing manages
/// gets the network's retention (off here: `ipam.retention` is 0), any other a day.
fn add(
    store: &mut dyn Store,
    s: &[RangeSet],
    cid: &str,
    pod: Option<PodRef>,
    requested: &[IpAddr],
) -> Result<AddOutcome, AllocError> {
    let retention = match pod.as_ref().and_then(PodRef::word) {
        Some(Confirmed::Nobody) => Retention::Off,
        _ => DAY,
    };
    add_kept(store, s, cid, pod, requested, retention)
}

fn add_kept(
    store: &mut dyn Store,
    s: &[RangeSet],
    cid: &str,
    pod: Option<PodRef>,
    requested: &[IpAddr],
    retention: Retention,
) -> Result<AddOutcome, AllocError> {
    let req = AddRequest {
        range_sets: s,
        owner: att(cid),
        pod,
        retention,
        requested,
        netns: None,
        netns_known: BTreeMap::new(),
        reuse_cooldown: 0,
    };
    allocator::add(store, &req, &Reading::wall(T0))
}

fn ips(out: &AddOutcome) -> Vec<IpAddr> {
    out.assignments.iter().map(|a| a.ip).collect()
}

/// ADD then DEL of `cid` for `pod`, with retention: the addresses now held for it.
fn held_for(store: &mut dyn Store, s: &[RangeSet], cid: &str, pod: Option<PodRef>) -> Vec<IpAddr> {
    let out = add_kept(store, s, cid, pod, &[], DAY).expect("ADD");
    let del =
        allocator::del(store, &att(cid), &Default::default(), &Reading::wall(T0)).expect("DEL");
    assert_eq!(del.held.len(), out.assignments.len(), "{cid} held");
    ips(&out)
}

/// DEL of `cid`, with what the agent says now.
fn del(
    store: &mut dyn Store,
    cid: &str,
    departure: &allocator::Departure,
) -> allocator::ReleaseOutcome {
    allocator::del(store, &att(cid), departure, &Reading::wall(T0)).expect("DEL")
}

/// Whether every address of `kept` is still held for attachment `cid`.
fn still_held(store: &dyn Store, kept: &[IpAddr], cid: &str) -> bool {
    kept.iter().all(|ip| {
        store
            .lease(*ip)
            .expect("read")
            .is_some_and(|l| l.owner == att(cid) && matches!(l.state, LeaseState::Held { .. }))
    })
}

/// A pod of the held name that no PersistentPodState manages (`db-7` scaled away under
/// `WhenDeleted`, created by hand on the recorded node) gets new addresses, and its DEL frees
/// only those: the StatefulSet's `db-7` still gets its own back.
#[test]
fn an_unmanaged_pod_of_the_name_neither_gets_the_holding_nor_frees_it() {
    on_both_stores(|store| {
        let s = sets(&["10.70.0.0/29", "fd00:70::/125"]);
        let kept = held_for(store, &s, "sts-a", managed("db"));
        let got = ips(&add(store, &s, "evil", unmanaged(), &[]).expect("ADD"));
        assert!(
            got.iter().all(|ip| !kept.contains(ip)),
            "the unmanaged db-7 got {got:?}; {kept:?} is held for PersistentPodState db"
        );
        assert!(still_held(store, &kept, "sts-a"));
        let gone = del(
            store,
            "evil",
            &allocator::Departure {
                retention: Some(Retention::Off),
                confirmed: Some(Confirmed::Nobody),
                judged_by_name: false,
            },
        );
        assert_eq!(gone.released.len(), 2);
        assert!(
            still_held(store, &kept, "sts-a"),
            "its DEL freed db's holding"
        );
        let back = add(store, &s, "sts-b", managed("db"), &[]).expect("ADD");
        assert_eq!(ips(&back), kept);
        assert!(
            back.assignments
                .iter()
                .all(|a| matches!(a.source, Source::Retained { was_held: true, .. }))
        );
    });
}

/// A pod of the held name that another PersistentPodState manages does not get the holding:
/// another name, or the same name on another object (deleted and created again), told by its
/// UID. The state's own pod does, and so does one judged without a UID (a holding recorded
/// before UIDs were).
#[test]
fn a_pod_another_state_manages_does_not_get_the_holding() {
    on_both_stores(|store| {
        let s = sets(&["10.71.0.0/29"]);
        let kept = held_for(store, &s, "sts-a", managed_uid("db", "uid-1"));
        for (cid, other) in [
            ("copy", managed("db-copy")),
            ("again", managed_uid("db", "uid-2")),
        ] {
            let got = ips(&add(store, &s, cid, other, &[]).expect("ADD"));
            assert_ne!(got, kept, "{cid} took db's holding");
            assert!(still_held(store, &kept, "sts-a"), "{cid}");
        }
        let back = add(store, &s, "sts-b", managed_uid("db", "uid-1"), &[]).expect("ADD");
        assert_eq!(ips(&back), kept);
        del(store, "sts-b", &Default::default());
        let back = add(store, &s, "sts-c", managed("db"), &[]).expect("ADD");
        assert_eq!(ips(&back), kept, "no UID on one side: the name decides");
    });
}

/// Without the agent's view the plugin knows the pod's annotations only: the link the webhook
/// stamps on every pod a PersistentPodState manages gets the holding back; a pod without it,
/// or linked to another state, gets new addresses and leaves the holding alone.
#[test]
fn without_the_agent_only_the_webhooks_link_to_the_same_state_gets_the_holding() {
    on_both_stores(|store| {
        let s = sets(&["10.72.0.0/29"]);
        let kept = held_for(store, &s, "sts-a", managed("db"));
        for (cid, pod) in [("bare", unjudged(None)), ("other", unjudged(Some("web")))] {
            let got = ips(&add(store, &s, cid, pod, &[]).expect("ADD"));
            assert_ne!(got, kept, "{cid} took db's holding");
            assert!(still_held(store, &kept, "sts-a"), "{cid}");
        }
        let back = add(store, &s, "sts-b", unjudged(Some("db")), &[]).expect("ADD");
        assert_eq!(ips(&back), kept, "the rebuilt pod, agent down");
    });
}

/// An address kept for a pod no PersistentPodState was tied to (`ipam.retention`) goes to the
/// next pod of its identity, whoever manages it: that is what `ipam.retention` is for.
#[test]
fn a_holding_no_state_is_tied_to_goes_to_the_next_pod_of_its_name() {
    on_both_stores(|store| {
        let s = sets(&["10.73.0.0/29"]);
        for (i, (first, next)) in [
            (unjudged(None), unmanaged()),
            (unmanaged(), managed("db")),
            (unmanaged(), unjudged(None)),
        ]
        .into_iter()
        .enumerate()
        {
            let kept = held_for(store, &s, &format!("a{i}"), first);
            let back = add(store, &s, &format!("b{i}"), next, &[]).expect("ADD");
            assert_eq!(ips(&back), kept, "case {i}");
            let off = allocator::Departure {
                retention: Some(Retention::Off),
                ..Default::default()
            };
            assert_eq!(
                del(store, &format!("b{i}"), &off).released.len(),
                1,
                "case {i}"
            );
        }
    });
}

/// A pod of the held name that asks for an address of its own does not free the holding (the
/// rebuilt pod's own request does: it replaces its kept address), and asking for the held
/// address names whom it is held for.
#[test]
fn an_unmanaged_pod_asking_for_addresses_does_not_free_the_holding() {
    on_both_stores(|store| {
        let s = sets(&["10.74.0.0/29"]);
        let kept = held_for(store, &s, "sts-a", managed("db"));
        let other = ip("10.74.0.6");
        let got = add(store, &s, "evil", unmanaged(), &[other]).expect("ADD");
        assert_eq!(ips(&got), [other]);
        assert!(
            still_held(store, &kept, "sts-a"),
            "asking for {other} freed it"
        );
        let err = add(store, &s, "evil2", unmanaged(), &kept).expect_err("held for db");
        assert!(
            matches!(&err, AllocError::RequestedTaken { holder, .. } if holder.contains("prod/db-7")),
            "{err}"
        );
    });
}

/// An address still recorded in an older sandbox of a managed pod (its DEL has not come; its
/// network namespace is gone) is not taken over by an unmanaged pod of the name.
#[test]
fn an_unmanaged_pod_does_not_take_over_a_managed_pods_old_sandbox() {
    on_both_stores(|store| {
        let s = sets(&["10.75.0.0/29"]);
        let first = ips(&add(store, &s, "sts-a", managed("db"), &[]).expect("ADD"));
        let got = ips(&add(store, &s, "evil", unmanaged(), &[]).expect("ADD"));
        assert_ne!(
            got, first,
            "the unmanaged pod took over the sandbox's address"
        );
        let lease = store.lease(first[0]).expect("read").expect("lease");
        assert_eq!(
            (lease.owner, lease.state),
            (att("sts-a"), LeaseState::Active)
        );
    });
}

/// A pod that only had the name is force-deleted, and its DEL comes once the API no longer
/// shows it: the agent can then judge it by its name alone, which fits the StatefulSet. What
/// the agent said at its ADD, from the pod itself (nothing manages it), stands: its address is
/// freed, not held for the StatefulSet's pod. A DEL judged by name that agrees with the ADD,
/// or of a pod the agent was not asked about at ADD, holds as before.
#[test]
fn a_del_judged_by_name_does_not_overrule_the_agents_word_at_add() {
    on_both_stores(|store| {
        let s = sets(&["10.76.0.0/29"]);
        let by_name = allocator::Departure {
            retention: Some(DAY),
            confirmed: Some(Confirmed::By("db".into())),
            judged_by_name: true,
        };
        let stranger = ips(&add(store, &s, "evil", unmanaged(), &[]).expect("ADD"));
        let gone = del(store, "evil", &by_name);
        assert_eq!(
            (gone.held.len(), gone.released.len()),
            (0, 1),
            "the stranger's {stranger:?} was held for db: {gone:?}"
        );
        for (cid, pod) in [("sts", managed("db")), ("blind", unjudged(Some("db")))] {
            add(store, &s, cid, pod, &[]).expect("ADD");
            let gone = del(store, cid, &by_name);
            assert_eq!(gone.held.len(), 1, "{cid}");
            let kept = gone.held[0].pod.as_ref().expect("pod");
            assert_eq!(kept.confirmed_manager(), Some("db"), "{cid}");
            allocator::release_held(store, &gone.held, &Reading::wall(T0)).expect("release");
        }
    });
}

/// With `ipam.retention` on, a pod nothing manages leaves its address held under the name too.
/// When the StatefulSet's pod comes back, the address kept for its state goes back to it, not
/// the stranger's, wherever the two lie in the range.
#[test]
fn the_address_kept_for_the_pods_state_goes_back_before_a_strangers() {
    on_both_stores(|store| {
        let s = sets(&["10.77.0.0/29"]);
        let kept = ip("10.77.0.5");
        let real = add_kept(store, &s, "sts-a", managed("db"), &[kept], DAY).expect("ADD");
        assert_eq!(ips(&real), [kept]);
        del(store, "sts-a", &Default::default());
        let stranger = ip("10.77.0.2");
        add_kept(store, &s, "evil", unmanaged(), &[stranger], DAY).expect("ADD");
        assert_eq!(del(store, "evil", &Default::default()).held.len(), 1);
        let back = add(store, &s, "sts-b", managed("db"), &[]).expect("ADD");
        assert_eq!(
            ips(&back),
            [kept],
            "the stranger's {stranger} came back instead"
        );
    });
}

/// After a reboot the kubelet builds a new sandbox for every pod still bound to the node, often
/// before the agent is back: the plugin runs alone, and a pod the webhook never stamped (created
/// before its PersistentPodState existed) carries no link. It is the same pod (the runtime names
/// its UID), so it takes its address over from the dead sandbox all the same.
#[test]
fn the_same_pod_in_a_new_sandbox_takes_its_address_over_unjudged() {
    on_both_stores(|store| {
        let s = sets(&["10.79.0.0/29"]);
        let with_uid = |p: Option<PodRef>| {
            p.map(|mut p| {
                p.uid = Some("pod-1".to_string());
                p
            })
        };
        let first = ips(&add(store, &s, "before", with_uid(managed("db")), &[]).expect("ADD"));
        let after = add(store, &s, "after", with_uid(unjudged(None)), &[]).expect("ADD");
        assert_eq!(ips(&after), first);
        let stranger = pod("db-7").map(|mut p| {
            p.namespace = "prod".to_string();
            p.uid = Some("pod-2".to_string());
            p
        });
        del(store, "after", &Default::default());
        let got = ips(&add(store, &s, "other", stranger, &[]).expect("ADD"));
        assert_ne!(got, first, "another pod of the name, not judged, took it");
    });
}
