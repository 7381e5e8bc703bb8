//! Which pods the StatefulSet controller deletes next, as tables.

use super::*;

const NEW: &str = "rev-2";
const OLD: &str = "rev-1";

fn member(ordinal: u32, revision: &str) -> Member {
    Member {
        ordinal,
        revision: Some(revision.to_string()),
        terminating: false,
        ready: true,
        held: false,
    }
}

fn set(replicas: u32, parallel: bool, rolling: Option<(u32, u32)>) -> SetFacts {
    SetFacts {
        replicas,
        ordinals_start: 0,
        parallel,
        rolling: rolling.map(|(partition, max_unavailable)| Rolling {
            update_revision: NEW.to_string(),
            partition,
            max_unavailable,
        }),
    }
}

fn gone(set: &SetFacts, members: &[Member]) -> Vec<(u32, Going)> {
    statefulset_wants_gone(set, members).into_iter().collect()
}

#[test]
fn a_scale_down_takes_the_highest_ordinal_first_unless_parallel() {
    use Going::ScaleDown;
    let pods: Vec<Member> = (0..5).map(|o| member(o, NEW)).collect();
    for (name, set, want) in [
        ("nothing condemned", set(5, false, None), vec![]),
        (
            "OrderedReady: the highest only",
            set(2, false, None),
            vec![(4, ScaleDown)],
        ),
        (
            "Parallel: every condemned pod",
            set(2, true, None),
            vec![(2, ScaleDown), (3, ScaleDown), (4, ScaleDown)],
        ),
        ("to zero", set(0, false, None), vec![(4, ScaleDown)]),
    ] {
        assert_eq!(gone(&set, &pods), want, "{name}");
    }
    // OrderedReady waits for the pod above to be gone, and for every pod in range to be Ready.
    let mut terminating = pods.clone();
    terminating[4].terminating = true;
    assert_eq!(
        gone(&set(2, false, None), &terminating),
        vec![],
        "4 still terminating"
    );
    assert_eq!(
        gone(&set(2, false, None), &terminating[..4]),
        vec![(3, ScaleDown)],
        "4 gone: then 3"
    );
    let mut unready = pods.clone();
    unready[0].ready = false;
    assert_eq!(gone(&set(2, false, None), &unready), vec![], "0 not Ready");
    assert_eq!(
        gone(&set(2, true, None), &unready).len(),
        3,
        "Parallel does not wait"
    );
    // ordinals.start shifts the range.
    let shifted = SetFacts {
        ordinals_start: 3,
        ..set(2, false, None)
    };
    let pods: Vec<Member> = (3..6).map(|o| member(o, NEW)).collect();
    assert_eq!(gone(&shifted, &pods), vec![(5, ScaleDown)]);
    let pods: Vec<Member> = [2, 3, 4].map(|o| member(o, NEW)).to_vec();
    assert_eq!(gone(&shifted, &pods), vec![(2, ScaleDown)], "below start");
}

#[test]
fn a_rolling_update_takes_one_outdated_pod_at_a_time_from_the_top() {
    use Going::Update;
    let old: Vec<Member> = (0..3).map(|o| member(o, OLD)).collect();
    for (name, set, want) in [
        ("OnDelete: nothing", set(3, false, None), vec![]),
        (
            "the highest outdated pod",
            set(3, false, Some((0, 1))),
            vec![(2, Update)],
        ),
        (
            "Parallel: the same order",
            set(3, true, Some((0, 1))),
            vec![(2, Update)],
        ),
        (
            "maxUnavailable 2",
            set(3, false, Some((0, 2))),
            vec![(1, Update), (2, Update)],
        ),
        (
            "partition 2 keeps 0 and 1",
            set(3, false, Some((2, 3))),
            vec![(2, Update)],
        ),
        ("partition 3: nothing", set(3, false, Some((3, 1))), vec![]),
    ] {
        assert_eq!(gone(&set, &old), want, "{name}");
    }
    // 2 is updated and Ready: 1 is next.
    let mut pods = old.clone();
    pods[2] = member(2, NEW);
    assert_eq!(gone(&set(3, false, Some((0, 1))), &pods), vec![(1, Update)]);
    // 2 is updated but not Ready yet (registering, say): nothing, until it is.
    pods[2].ready = false;
    assert_eq!(gone(&set(3, false, Some((0, 1))), &pods), vec![]);
    assert_eq!(
        gone(&set(3, true, Some((0, 1))), &pods),
        vec![],
        "maxUnavailable used up"
    );
    // 2 is gone (rebuilding): nothing either.
    assert_eq!(gone(&set(3, false, Some((0, 1))), &pods[..2]), vec![]);
    // The pod ipkeep holds for the update stays the one: its hold made it not Ready.
    let mut held = old.clone();
    held[2].ready = false;
    held[2].held = true;
    assert_eq!(gone(&set(3, false, Some((0, 1))), &held), vec![(2, Update)]);
    // A pod held for something else that is not Ready blocks the update, as it blocks the
    // StatefulSet controller.
    let mut other = old.clone();
    other[0] = Member {
        ready: false,
        held: true,
        ..member(0, NEW)
    };
    assert_eq!(gone(&set(3, false, Some((0, 1))), &other), vec![]);
    // Scaling comes before updating with OrderedReady.
    let mut more = old.clone();
    more.push(member(3, OLD));
    assert_eq!(
        gone(&set(3, false, Some((0, 1))), &more),
        vec![(3, Going::ScaleDown)]
    );
    // Up to date: nothing.
    let new: Vec<Member> = (0..3).map(|o| member(o, NEW)).collect();
    assert_eq!(gone(&set(3, false, Some((0, 1))), &new), vec![]);
    // A pod without a revision label is outdated, as for the StatefulSet controller.
    let mut unlabelled = new.clone();
    unlabelled[1].revision = None;
    assert_eq!(
        gone(&set(3, false, Some((0, 1))), &unlabelled),
        vec![(1, Update)]
    );
}

#[test]
fn max_unavailable_resolves_as_kubernetes_does() {
    use MaxUnavailable::*;
    for (value, replicas, want) in [
        (None, 5, 1),
        (Some(Count(0)), 5, 1),
        (Some(Count(3)), 5, 3),
        (Some(Percent(50)), 5, 3),
        (Some(Percent(10)), 5, 1),
        (Some(Percent(100)), 4, 4),
        (Some(Percent(0)), 4, 1),
    ] {
        assert_eq!(
            resolve_max_unavailable(value.as_ref(), replicas),
            want,
            "{value:?} of {replicas}"
        );
    }
}

#[test]
fn the_reason_reads_back_and_only_the_statefulset_completes() {
    for g in [
        Going::ScaleDown,
        Going::Update,
        Going::OwnerDeleted,
        Going::Drain,
        Going::Requested,
    ] {
        assert_eq!(Going::parse(g.as_str()), g);
        assert_eq!(
            g.completes(),
            matches!(g, Going::ScaleDown | Going::Update),
            "{g}"
        );
    }
    // The first release's values, and anything written by hand, complete nothing.
    for text in ["deletion", "eviction", "", "scale-down "] {
        assert_eq!(Going::parse(text), Going::Requested, "{text:?}");
    }
}
