//! Which holding gives way when a range set is full; run on both stores by the table in
//! `tests.rs`.

use std::collections::BTreeMap;

use super::tests::{Case, DAY, T0, att, pod};
use crate::allocator::{self, AddRequest, AllocError, Source};
use crate::clock::Reading;
use crate::lease::{Confirmed, PodRef};
use crate::range::RangeSet;
use crate::retention::Retention;
use crate::store::Store;

/// Pod `namespace/name`, linked to PersistentPodState `link` (confirmed by the agent or not).
fn pod_in(namespace: &str, name: &str, link: Option<&str>, confirmed: bool) -> Option<PodRef> {
    pod(name).map(|mut p| {
        p.namespace = namespace.to_string();
        p.persistent_pod_state = link.map(str::to_string);
        if let (true, Some(link)) = (confirmed, link) {
            p.confirm(&Confirmed::By(link.into()));
        }
        p
    })
}

/// ADD then DEL: `pod` deleted at T0, its address held for `retention`. Returns the address.
fn held_for(
    store: &mut dyn Store,
    sets: &[RangeSet],
    cid: &str,
    pod: Option<PodRef>,
    retention: Retention,
) -> String {
    let req = AddRequest {
        range_sets: sets,
        owner: att(cid),
        pod,
        retention,
        requested: &[],
        netns: None,
        netns_known: BTreeMap::new(),
        reuse_cooldown: 0,
    };
    let out = allocator::add(store, &req, &Reading::wall(T0)).expect("add");
    let mut c = Case { sets, store };
    assert_eq!(c.del(cid, T0).0, 1, "{cid} held");
    out.assignments[0].ip.to_string()
}

/// A new pod of `namespace` on the full set: the address it got and whose holding gave way.
fn reclaim(
    store: &mut dyn Store,
    sets: &[RangeSet],
    cid: &str,
    namespace: &str,
) -> (String, String) {
    let req = AddRequest {
        range_sets: sets,
        owner: att(cid),
        pod: pod_in(namespace, cid, None, false),
        retention: Retention::Off,
        requested: &[],
        netns: None,
        netns_known: BTreeMap::new(),
        reuse_cooldown: 0,
    };
    let out = allocator::add(store, &req, &Reading::wall(T0 + 1)).expect("a holding gives way");
    match &out.assignments[0].source {
        Source::Reclaimed { from } => {
            let p = from.pod.as_ref().expect("pod");
            (
                out.assignments[0].ip.to_string(),
                format!("{}/{}", p.namespace, p.name),
            )
        }
        other => panic!("{cid}: {other:?}"),
    }
}

/// A full range gives a new pod a held address rather than starving it: first the holdings no
/// confirmed link protects, `forever` before any that ends, then the confirmed ones in the same
/// order; active addresses never.
pub(super) fn held_addresses_never_starve_a_new_pod(store: &mut dyn Store) {
    let s = super::tests::sets(&["10.31.0.0/29"]); // .2 ... .6
    let kv = |name: &str| pod_in("db", name, Some("kv"), true);
    held_for(store, &s, "a", kv("kv-0"), Retention::Seconds(100));
    held_for(store, &s, "b", pod("solo-0"), Retention::Forever);
    held_for(store, &s, "c", pod("solo-1"), DAY);
    held_for(store, &s, "d", kv("kv-1"), Retention::Forever);
    Case { sets: &s, store }.add("e", Some("web-5"), Retention::Off);
    let took = |store: &mut dyn Store, cid: &str| reclaim(store, &s, cid, "db");
    assert_eq!(took(store, "n1"), ("10.31.0.3".into(), "db/solo-0".into()));
    assert_eq!(took(store, "n2"), ("10.31.0.4".into(), "db/solo-1".into()));
    assert_eq!(took(store, "n3"), ("10.31.0.5".into(), "db/kv-1".into()));
    assert_eq!(took(store, "n4"), ("10.31.0.2".into(), "db/kv-0".into()));
    let mut c = Case { sets: &s, store };
    let err = c
        .add_full("n5", Some("n5"), Retention::Off, &[], T0 + 1)
        .expect_err("full");
    assert!(
        matches!(
            err,
            AllocError::Exhausted {
                active: 5,
                held: 0,
                ..
            }
        ),
        "{err}"
    );
    // The pod whose holding gave way gets a new address when it comes back (none here).
    let err = c
        .add_full("a2", Some("kv-0"), DAY, &[], T0 + 2)
        .expect_err("its address went to another pod");
    assert!(matches!(err, AllocError::Exhausted { .. }), "{err}");
}

/// The security review's L-1 (`exhaust2.py` (c)), the plugin alone: a StatefulSet pod of
/// `prod` held for 1 h, then pods of `evil` that forge the link and ask for `forever` fill the
/// range. No link is confirmed without the agent, so the namespace holding the most addresses
/// gives way, `forever` first: the real holding stays, and its pod gets its address back.
/// (Before, "managed" meant carrying any link and the soonest end went first: db-0's holding
/// was the one taken.)
pub(super) fn forged_links_and_forever_give_way_before_a_real_holding(store: &mut dyn Store) {
    let s = super::tests::sets(&["10.40.0.0/29"]); // .2 ... .6
    let real = || pod_in("prod", "db-0", Some("db"), false);
    let db0 = held_for(store, &s, "db0-a", real(), Retention::Seconds(3_600));
    let mut forged = Vec::new();
    for i in 0..5 {
        let evil = pod_in("evil", &format!("p{i}"), Some("anything"), false);
        let req = AddRequest {
            range_sets: &s,
            owner: att(&format!("e{i}")),
            pod: evil,
            retention: Retention::Forever,
            requested: &[],
            netns: None,
            netns_known: BTreeMap::new(),
            reuse_cooldown: 0,
        };
        let out = allocator::add(store, &req, &Reading::wall(T0)).expect("forged ADD");
        forged.push(out.assignments[0].ip.to_string());
        Case { sets: &s, store }.del(&format!("e{i}"), T0);
    }
    assert!(
        !forged.contains(&db0),
        "the fifth forged pod took {db0} from db-0: {forged:?}"
    );
    let (_, victim) = reclaim(store, &s, "new1", "evil");
    assert!(victim.starts_with("evil/"), "{victim} gave way");
    let rebuilt = AddRequest {
        range_sets: &s,
        owner: att("db0-b"),
        pod: real(),
        retention: Retention::Seconds(3_600),
        requested: &[],
        netns: None,
        netns_known: BTreeMap::new(),
        reuse_cooldown: 0,
    };
    let out = allocator::add(store, &rebuilt, &Reading::wall(T0 + 2)).expect("db-0 back");
    assert_eq!(out.assignments[0].ip.to_string(), db0);
    assert!(
        matches!(
            out.assignments[0].source,
            Source::Retained { was_held: true, .. }
        ),
        "{:?}",
        out.assignments[0].source
    );
}

/// With the agent: a link it confirmed protects a holding ahead of forged links in the same
/// namespace (a tenant with its own quota there), and of `forever` ones.
pub(super) fn a_confirmed_link_protects_a_holding_in_its_namespace(store: &mut dyn Store) {
    let s = super::tests::sets(&["10.41.0.0/29"]); // .2 ... .6
    let db0 = held_for(
        store,
        &s,
        "db0",
        pod_in("prod", "db-0", Some("db"), true),
        Retention::Seconds(3_600),
    );
    for i in 0..4 {
        let forger = pod_in("prod", &format!("f-{i}"), Some("db"), false);
        held_for(store, &s, &format!("f{i}"), forger, Retention::Forever);
    }
    for i in 0..4 {
        let (ip, victim) = reclaim(store, &s, &format!("n{i}"), "prod");
        assert_ne!(ip, db0, "{victim}");
        assert!(victim.starts_with("prod/f-"), "{victim}");
    }
    let (ip, victim) = reclaim(store, &s, "n4", "prod");
    assert_eq!(
        (ip, victim),
        (db0, "prod/db-0".to_string()),
        "last, but it does give way"
    );
}
