//! Scenarios of the reuse cooldown and of ranges that changed under held addresses; run on
//! both stores by the table in `tests.rs`.

use std::collections::BTreeMap;

use super::tests::{Case, DAY, T0, att, ip, pod, sets};
use crate::allocator::{self, AddRequest, Source};
use crate::clock::Reading;
use crate::lease::LeaseState;
use crate::range::RangeSet;
use crate::retention::Retention;
use crate::store::Store;

const COOLDOWN: u64 = 300;

fn add_cooled(
    store: &mut dyn Store,
    sets: &[RangeSet],
    cid: &str,
    pod_name: &str,
    now: u64,
) -> (String, Source) {
    let req = AddRequest {
        range_sets: sets,
        owner: att(cid),
        pod: pod(pod_name),
        retention: Retention::Off,
        requested: &[],
        netns: None,
        netns_known: BTreeMap::new(),
        reuse_cooldown: COOLDOWN,
    };
    let out = allocator::add(store, &req, &Reading::wall(now)).expect("ADD");
    let a = out.assignments.into_iter().next().expect("one set");
    (a.ip.to_string(), a.source)
}

/// An address freed less than `ipam.reuseCooldown` ago goes to a new pod only when nothing
/// else of the range is free, and then the one freed longest ago; a pod's own holding is never
/// delayed by it.
pub(super) fn reuse_cooldown(store: &mut dyn Store) {
    let s = sets(&["10.50.0.0/29"]); // .2 ... .6
    for (i, want) in [
        "10.50.0.2",
        "10.50.0.3",
        "10.50.0.4",
        "10.50.0.5",
        "10.50.0.6",
    ]
    .iter()
    .enumerate()
    {
        let got = add_cooled(store, &s, &format!("c{i}"), &format!("x-{i}"), T0);
        assert_eq!(got, ((*want).to_string(), Source::RoundRobin));
    }
    let mut c = Case { sets: &s, store };
    c.del("c0", T0); // .2 freed at T0
    c.del("c2", T0 + 100); // .4 freed at T0 + 100
    // Only cooling addresses are free: the range does not run dry, the oldest goes first.
    assert_eq!(
        add_cooled(c.store, &s, "n1", "y-1", T0 + 200),
        ("10.50.0.2".to_string(), Source::Cooling { freed_at: T0 })
    );
    c.del("c1", T0 + 200); // .3 freed at T0 + 200
    // .3 comes first in round-robin order (after .2) but is cooling; .4 has cooled down.
    assert_eq!(
        add_cooled(c.store, &s, "n2", "y-2", T0 + 401),
        ("10.50.0.4".to_string(), Source::RoundRobin)
    );
    // Taking an address forgets when it was freed.
    assert_eq!(c.store.freed_at(ip("10.50.0.4")).expect("read"), None);
    assert_eq!(
        c.store.freed_at(ip("10.50.0.3")).expect("read"),
        Some(T0 + 200)
    );

    // A held address comes back to its pod at once, cooldown or not.
    let req = AddRequest {
        range_sets: &s,
        owner: att("h1"),
        pod: pod("db-0"),
        retention: DAY,
        requested: &[],
        netns: None,
        netns_known: BTreeMap::new(),
        reuse_cooldown: COOLDOWN,
    };
    c.del("n2", T0 + 402);
    let first = allocator::add(c.store, &req, &Reading::wall(T0 + 403)).expect("ADD");
    let held_ip = first.assignments[0].ip;
    c.del("h1", T0 + 404);
    let again = allocator::add(
        c.store,
        &AddRequest {
            owner: att("h2"),
            ..req.clone()
        },
        &Reading::wall(T0 + 405),
    )
    .expect("re-ADD");
    assert_eq!(again.assignments[0].ip, held_ip);
    assert!(matches!(
        again.assignments[0].source,
        Source::Retained { .. }
    ));
}

/// The node's range changed while a pod's address was held: the old address is never handed
/// out, the pod gets one of the new range, and the holding goes in the same commit.
pub(super) fn a_holding_outside_the_current_ranges_is_released(store: &mut dyn Store) {
    let old = sets(&["10.60.0.0/24"]);
    let new = sets(&["10.61.0.0/24"]);
    let mut c = Case { sets: &old, store };
    assert_eq!(c.add("a", Some("db-0"), DAY), ["10.60.0.2"]);
    c.del("a", T0);
    assert!(matches!(
        c.state("10.60.0.2"),
        Some((_, LeaseState::Held { .. }))
    ));
    let req = AddRequest {
        range_sets: &new,
        owner: att("b"),
        pod: pod("db-0"),
        retention: DAY,
        requested: &[],
        netns: None,
        netns_known: BTreeMap::new(),
        reuse_cooldown: 0,
    };
    let out = allocator::add(c.store, &req, &Reading::wall(T0 + 10)).expect("ADD");
    assert_eq!(out.assignments[0].ip, ip("10.61.0.2"));
    assert_eq!(out.assignments[0].source, Source::RoundRobin);
    assert_eq!(
        out.outside_ranges.iter().map(|l| l.ip).collect::<Vec<_>>(),
        [ip("10.60.0.2")]
    );
    assert_eq!(c.state("10.60.0.2"), None, "the stale holding is released");
    // A repeated ADD finds nothing more to release.
    let out = allocator::add(c.store, &req, &Reading::wall(T0 + 11)).expect("ADD");
    assert!(out.outside_ranges.is_empty());
    assert_eq!(out.assignments[0].source, Source::Existing);
}
