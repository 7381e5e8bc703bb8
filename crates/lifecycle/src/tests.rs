//! Every transition and every escape hatch, as tables.
#![allow(clippy::unwrap_used)]

use super::*;

/// The one label both hooks name, as users write them: the operator adds it once it registered
/// the pod (PreNormal lets go) and removes it once it deregistered the pod (PreDelete lets go).
const REGISTERED: (&str, &str) = ("example.com/registered", "true");
const BLOCK_DELETE: (&str, &str) = REGISTERED;
const NOW: u64 = 1_000_000;

fn hook(label: (&str, &str), mark: bool) -> Hook {
    Hook {
        labels: [(label.0.to_string(), label.1.to_string())].into(),
        mark_pod_not_ready: mark,
    }
}

fn lifecycle(pre_normal: bool, pre_delete: Option<bool>) -> Lifecycle {
    Lifecycle {
        pre_normal: pre_normal.then(|| hook(REGISTERED, true)),
        pre_delete: pre_delete.map(|mark| hook(BLOCK_DELETE, mark)),
        pre_delete_timeout: DEFAULT_PRE_DELETE_TIMEOUT_SECS,
    }
}

fn labels(state: Option<State>, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(s) = state {
        l.insert(STATE_LABEL.into(), s.as_str().into());
    }
    l
}

fn facts(labels: &BTreeMap<String, String>) -> PodFacts<'_> {
    PodFacts {
        labels,
        held_since: None,
        since_annotation: None,
        terminating: false,
        node_ready: true,
        gated: true,
        held: None,
    }
}

#[test]
fn what_a_new_pod_gets() {
    for (name, lc, state, gate) in [
        ("no hooks: nothing", lifecycle(false, None), None, false),
        (
            "PreNormal: PreparingNormal, gated",
            lifecycle(true, None),
            Some(State::PreparingNormal),
            true,
        ),
        (
            "PreDelete only: Normal, no gate",
            lifecycle(false, Some(false)),
            Some(State::Normal),
            false,
        ),
        (
            "PreDelete with markPodNotReady: Normal, gated",
            lifecycle(false, Some(true)),
            Some(State::Normal),
            true,
        ),
        (
            "PreNormal without markPodNotReady: PreparingNormal, no gate",
            Lifecycle {
                pre_normal: Some(hook(REGISTERED, false)),
                ..lifecycle(false, None)
            },
            Some(State::PreparingNormal),
            false,
        ),
    ] {
        let got = at_create(&lc);
        assert_eq!(got.state, state, "{name}");
        assert_eq!(got.readiness_gate, gate, "{name}");
    }
}

#[test]
fn every_transition_of_the_controller() {
    use State::*;
    let both = lifecycle(true, Some(true));
    let no_drain = lifecycle(true, Some(false));
    let delete_only = lifecycle(false, Some(false));
    let staying = Fate::Staying;
    for (name, lc, state, extra, fate, want_state, want_ready) in [
        (
            "unlabelled pod fails open",
            &both,
            None,
            vec![],
            staying,
            None,
            Some(true),
        ),
        (
            "unlabelled pod is never held, whatever wants it gone",
            &both,
            None,
            vec![BLOCK_DELETE],
            Fate::Going(Going::ScaleDown),
            None,
            Some(true),
        ),
        (
            "PreparingNormal until registered: not Ready",
            &both,
            Some(PreparingNormal),
            vec![],
            staying,
            Some(PreparingNormal),
            Some(false),
        ),
        (
            "PreparingNormal, the operator said yes: Normal and Ready",
            &both,
            Some(PreparingNormal),
            vec![REGISTERED],
            staying,
            Some(Normal),
            Some(true),
        ),
        (
            "PreparingNormal, the label with another value: still waiting",
            &both,
            Some(PreparingNormal),
            vec![("example.com/registered", "false")],
            staying,
            Some(PreparingNormal),
            Some(false),
        ),
        (
            "PreparingNormal after the hook was removed from the spec: Normal",
            &delete_only,
            Some(PreparingNormal),
            vec![],
            staying,
            Some(Normal),
            Some(true),
        ),
        (
            "Normal stays Normal",
            &both,
            Some(Normal),
            vec![BLOCK_DELETE],
            staying,
            Some(Normal),
            Some(true),
        ),
        (
            "Normal, registered, its StatefulSet scales it down: held, not Ready",
            &both,
            Some(Normal),
            vec![BLOCK_DELETE],
            Fate::Going(Going::ScaleDown),
            Some(PreparingDelete),
            Some(false),
        ),
        (
            "Normal, registered, its node cordoned, without markPodNotReady: held, Ready",
            &no_drain,
            Some(Normal),
            vec![BLOCK_DELETE],
            Fate::Going(Going::Drain),
            Some(PreparingDelete),
            Some(true),
        ),
        (
            "Normal, deregistered already: nothing to hold",
            &both,
            Some(Normal),
            vec![],
            Fate::Going(Going::Update),
            Some(Normal),
            Some(true),
        ),
        (
            "Normal, fate unknown: no hold starts",
            &both,
            Some(Normal),
            vec![BLOCK_DELETE],
            Fate::Unknown,
            Some(Normal),
            Some(true),
        ),
    ] {
        let l = labels(state, &extra);
        let got = reconcile(lc, &facts(&l), fate, NOW);
        assert_eq!(got.state, want_state, "{name}");
        assert_eq!(got.ready, want_ready, "{name}");
        assert!(!got.delete, "{name}");
    }
}

#[test]
fn a_hold_records_why_and_since_when() {
    let lc = lifecycle(true, Some(true));
    let l = labels(Some(State::Normal), &[BLOCK_DELETE]);
    let got = reconcile(&lc, &facts(&l), Fate::Going(Going::Drain), NOW);
    assert_eq!(
        got,
        Wanted {
            state: Some(State::PreparingDelete),
            held_since: Some(NOW),
            held: Some(Going::Drain),
            ready: Some(false),
            recheck_at: None,
            delete: false,
        }
    );
    // Held already: the reason follows the cluster, the time it started stays.
    let held = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let pod = PodFacts {
        held_since: Some(NOW - 30),
        held: Some(Going::Drain),
        ..facts(&held)
    };
    let got = reconcile(&lc, &pod, Fate::Going(Going::ScaleDown), NOW);
    assert_eq!(
        (got.state, got.held_since, got.held, got.delete),
        (
            Some(State::PreparingDelete),
            Some(NOW - 30),
            Some(Going::ScaleDown),
            false
        )
    );
    assert_eq!(
        got.recheck_at,
        Some(NOW - 30 + DEFAULT_PRE_DELETE_TIMEOUT_SECS)
    );
    // A pod that is not held has no hold start, whatever its annotation says (an older
    // release wrote the time of every state change there).
    let normal = PodFacts {
        since_annotation: Some(7),
        ..facts(&l)
    };
    assert_eq!(reconcile(&lc, &normal, Fate::Staying, NOW).held_since, None);
}

#[test]
fn the_gate_follows_the_pod_not_the_configuration() {
    use State::*;
    let none = Lifecycle::default();
    // The hooks (or the whole PersistentPodState) were removed after the pod was created with
    // the gate: it is still set, or the pod would never be Ready.
    for state in [PreparingNormal, Normal, PreparingDelete] {
        let l = labels(Some(state), &[BLOCK_DELETE]);
        let pod = PodFacts {
            held: Some(Going::ScaleDown),
            ..facts(&l)
        };
        let got = reconcile(&none, &pod, Fate::Going(Going::ScaleDown), NOW);
        assert_eq!(
            (got.state, got.ready, got.delete),
            (Some(Normal), Some(true), false),
            "{state}: no preDelete hook, nothing held, nothing deleted"
        );
    }
    // A pod without the gate (created before the hooks, or while the webhook was down): no
    // condition to write, whatever its state.
    let l = labels(Some(PreparingDelete), &[BLOCK_DELETE]);
    let ungated = PodFacts {
        gated: false,
        held_since: Some(NOW),
        ..facts(&l)
    };
    assert_eq!(
        reconcile(&lifecycle(true, Some(true)), &ungated, Fate::Staying, NOW).ready,
        None
    );
}

#[test]
fn ipkeep_deletes_only_what_the_statefulset_controller_wants_gone() {
    let lc = lifecycle(false, Some(true));
    let blocked = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let released = labels(Some(State::PreparingDelete), &[]);
    let pod = |labels, since: u64, why: Going| PodFacts {
        held_since: Some(since),
        held: Some(why),
        ..facts(labels)
    };
    let timed_out = NOW - DEFAULT_PRE_DELETE_TIMEOUT_SECS;
    for (name, facts, fate, delete) in [
        (
            "scale-down, released",
            pod(&released, NOW - 10, Going::ScaleDown),
            Fate::Going(Going::ScaleDown),
            true,
        ),
        (
            "update, released",
            pod(&released, NOW - 10, Going::Update),
            Fate::Going(Going::Update),
            true,
        ),
        (
            "update, timed out",
            pod(&blocked, timed_out, Going::Update),
            Fate::Going(Going::Update),
            true,
        ),
        (
            "update, still registered",
            pod(&blocked, NOW - 10, Going::Update),
            Fate::Going(Going::Update),
            false,
        ),
        (
            "drain, released: the drain evicts it",
            pod(&released, NOW - 10, Going::Drain),
            Fate::Going(Going::Drain),
            false,
        ),
        (
            "drain, timed out",
            pod(&blocked, timed_out, Going::Drain),
            Fate::Going(Going::Drain),
            false,
        ),
        (
            "owner deleted: the garbage collector deletes it",
            pod(&released, NOW - 10, Going::OwnerDeleted),
            Fate::Going(Going::OwnerDeleted),
            false,
        ),
        (
            "a request: its requester deletes it",
            pod(&released, NOW - 10, Going::Requested),
            Fate::Staying,
            false,
        ),
        (
            "marked scale-down by someone else, but nothing wants it gone",
            pod(&released, NOW - 10, Going::ScaleDown),
            Fate::Staying,
            false,
        ),
        (
            "the first release's `deletion` mark, nothing wants it gone",
            pod(&released, NOW - 10, Going::parse("deletion")),
            Fate::Staying,
            false,
        ),
        (
            "fate unknown",
            pod(&released, NOW - 10, Going::Update),
            Fate::Unknown,
            false,
        ),
    ] {
        assert_eq!(reconcile(&lc, &facts, fate, NOW).delete, delete, "{name}");
    }
    // Not once it is terminating.
    let going = PodFacts {
        terminating: true,
        ..pod(&released, NOW - 10, Going::ScaleDown)
    };
    let got = reconcile(&lc, &going, Fate::Going(Going::ScaleDown), NOW);
    assert_eq!(
        (got.state, got.delete),
        (Some(State::PreparingDelete), false)
    );
}

#[test]
fn a_hold_whose_reason_went_away_lets_go() {
    use State::*;
    let both = lifecycle(true, Some(true));
    let deregistered = labels(Some(PreparingDelete), &[]);
    let registered = labels(Some(PreparingDelete), &[BLOCK_DELETE]);
    let pod = |labels, why: Going| PodFacts {
        held_since: Some(NOW - 10),
        held: Some(why),
        ..facts(labels)
    };
    // Scaled back up, the node uncordoned, the update rolled back: at once. A pod the operator
    // deregistered meanwhile goes through PreNormal again, so it is registered again.
    for why in [
        Going::ScaleDown,
        Going::Update,
        Going::Drain,
        Going::OwnerDeleted,
    ] {
        let got = reconcile(&both, &pod(&deregistered, why), Fate::Staying, NOW);
        assert_eq!(
            (got.state, got.ready, got.held, got.held_since),
            (Some(PreparingNormal), Some(false), None, None),
            "{why}"
        );
        let got = reconcile(&both, &pod(&registered, why), Fate::Staying, NOW);
        assert_eq!((got.state, got.ready), (Some(Normal), Some(true)), "{why}");
    }
    // The fate is unknown for a moment (the StatefulSet's status lags its spec): the hold stays
    // as it is, and the pod is looked at again soon.
    let got = reconcile(&both, &pod(&registered, Going::Update), Fate::Unknown, NOW);
    assert_eq!(
        got,
        Wanted {
            state: Some(PreparingDelete),
            held_since: Some(NOW - 10),
            held: Some(Going::Update),
            ready: Some(false),
            recheck_at: Some(NOW + reconcile::UNKNOWN_RECHECK_SECS),
            delete: false,
        }
    );
}

#[test]
fn a_requested_deletion_nobody_completes_leaves_preparing_delete() {
    let lc = lifecycle(false, Some(true));
    let l = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let limit = DEFAULT_PRE_DELETE_TIMEOUT_SECS + ABANDONED_AFTER_SECS;
    let pod = |since: Option<u64>, terminating: bool| PodFacts {
        held_since: since,
        terminating,
        held: None,
        ..facts(&l)
    };
    // Labelled by hand (no time, no reason): a request, held from now.
    let held = reconcile(&lc, &pod(None, false), Fate::Staying, NOW);
    assert_eq!(
        held,
        Wanted {
            state: Some(State::PreparingDelete),
            held_since: Some(NOW),
            held: Some(Going::Requested),
            ready: Some(false),
            recheck_at: Some(NOW + limit),
            delete: false,
        }
    );
    // Past the timeout every deletion passes; still here ABANDONED_AFTER_SECS later, nobody is
    // deleting it: back to Normal and Ready.
    let back = reconcile(&lc, &pod(Some(NOW - limit), false), Fate::Staying, NOW);
    assert_eq!(
        (
            back.state,
            back.ready,
            back.recheck_at,
            back.delete,
            back.held
        ),
        (Some(State::Normal), Some(true), None, false, None)
    );
    // One that is terminating stays as it is until it is gone.
    let going = reconcile(&lc, &pod(Some(NOW - limit), true), Fate::Staying, NOW);
    assert_eq!(
        (going.state, going.ready, going.delete),
        (Some(State::PreparingDelete), Some(false), false)
    );
}

#[test]
fn deletions_are_held_only_while_the_pod_carries_the_hook() {
    let lc = lifecycle(true, Some(true));
    let delete = DeleteRequest {
        force: false,
        eviction: false,
    };
    let deny = |pod: &PodFacts<'_>, request| match admit_delete(&lc, pod, request, NOW, "db-2") {
        Admission::Deny { message } => message,
        other => panic!("{other:?}"),
    };
    // Not PreparingDelete yet: refused, saying what starts the hook and how to ask for it.
    let blocked = labels(Some(State::Normal), &[BLOCK_DELETE]);
    let message = deny(&facts(&blocked), delete);
    for part in [
        "deletion of pod db-2 waits for its preDelete hook",
        "example.com/registered=true",
        "is not PreparingDelete yet",
        "its node is cordoned",
        "kubectl label pod db-2 ipkeep.dev/lifecycle-state=PreparingDelete --overwrite",
        "--force --grace-period=0",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    // PreparingDelete: refused with why and the time left, counting down.
    let preparing = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let pod = PodFacts {
        held_since: Some(NOW - 100),
        held: Some(Going::Drain),
        ..facts(&preparing)
    };
    let message = deny(
        &pod,
        DeleteRequest {
            eviction: true,
            ..delete
        },
    );
    assert!(
        message.contains("eviction of pod db-2 waits for its preDelete hook"),
        "{message}"
    );
    assert!(message.contains("its node is cordoned"), "{message}");
    assert!(message.contains("in 500 s at the latest"), "{message}");
    // The operator removed the label: it passes.
    let released = labels(Some(State::PreparingDelete), &[]);
    assert_eq!(
        admit_delete(&lc, &facts(&released), delete, NOW, "db-2"),
        Admission::Allow { escaped: None }
    );
}

#[test]
fn every_escape_hatch() {
    let lc = lifecycle(false, Some(true));
    let delete = DeleteRequest {
        force: false,
        eviction: false,
    };
    let blocked = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let base = PodFacts {
        held_since: Some(NOW - 10),
        ..facts(&blocked)
    };
    for (name, pod, request, want) in [
        (
            "force deletion",
            base,
            DeleteRequest {
                force: true,
                ..delete
            },
            Some(Escape::Force),
        ),
        (
            "node not Ready (drain of a dead node, pod GC)",
            PodFacts {
                node_ready: false,
                ..base
            },
            delete,
            Some(Escape::NodeNotReady),
        ),
        (
            "held for the timeout: a drain is never blocked for ever",
            PodFacts {
                held_since: Some(NOW - DEFAULT_PRE_DELETE_TIMEOUT_SECS),
                ..base
            },
            DeleteRequest {
                eviction: true,
                ..delete
            },
            Some(Escape::TimedOut),
        ),
        (
            "already terminating: nothing left to hold",
            PodFacts {
                terminating: true,
                ..base
            },
            delete,
            None,
        ),
    ] {
        assert_eq!(
            admit_delete(&lc, &pod, request, NOW, "db-0"),
            Admission::Allow { escaped: want },
            "{name}"
        );
    }
    // Without a PreDelete hook nothing is ever held.
    assert_eq!(
        admit_delete(&lifecycle(true, None), &base, delete, NOW, "db-0"),
        Admission::Allow { escaped: None }
    );
    // The timeout counts from a hold only: a Normal pod's stale annotation does not let its
    // first deletion through.
    let normal = labels(Some(State::Normal), &[BLOCK_DELETE]);
    let old = PodFacts {
        since_annotation: Some(0),
        ..facts(&normal)
    };
    assert!(matches!(
        admit_delete(&lc, &old, delete, NOW, "db-0"),
        Admission::Deny { .. }
    ));
}

#[test]
fn a_pod_carries_a_hook_only_with_all_its_labels() {
    let h = Hook {
        labels: [
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]
        .into(),
        mark_pod_not_ready: false,
    };
    assert!(h.carried_by(&labels(None, &[("a", "1"), ("b", "2"), ("c", "3")])));
    assert!(!h.carried_by(&labels(None, &[("a", "1")])));
    assert!(!h.carried_by(&labels(None, &[("a", "1"), ("b", "x")])));
    assert!(
        !Hook::default().carried_by(&labels(None, &[("a", "1")])),
        "no labels: never"
    );
    for s in [
        State::PreparingNormal,
        State::Normal,
        State::PreparingDelete,
    ] {
        assert_eq!(State::parse(s.as_str()), Some(s));
    }
    assert_eq!(State::parse("normal"), None);
}

/// No hold outlives the timeout, whatever the pod says: whoever may patch a pod writes its
/// labels and annotations (a time in the year 2500, `u64::MAX`, the state label set back to
/// `Normal`, the hook's label taken off and put back), never the condition that records the
/// hold's start. Each row: the pod as the controller first sees it, the start it records, and
/// the webhook's answer to an eviction, with that record and the pod's own claims, one second
/// before and at the timeout.
#[test]
fn a_hold_times_out_from_its_recorded_start_whatever_the_pod_says() {
    use State::*;
    const YEAR_2500: u64 = 16_725_225_600;
    const T: u64 = DEFAULT_PRE_DELETE_TIMEOUT_SECS;
    let lc = lifecycle(false, Some(true));
    let drain = Fate::Going(Going::Drain);
    for (name, state, hook, condition, annotation, fate, start) in [
        (
            "an older release's hold, the annotation moved to u64::MAX: from first sight",
            PreparingDelete,
            true,
            None,
            Some(u64::MAX),
            drain,
            NOW,
        ),
        (
            "an older release's hold, the annotation moved to the year 2500: from first sight",
            PreparingDelete,
            true,
            None,
            Some(YEAR_2500),
            drain,
            NOW,
        ),
        (
            "an older release's own hold: its start stands, never released early",
            PreparingDelete,
            true,
            None,
            Some(NOW - 100),
            drain,
            NOW - 100,
        ),
        (
            "on record, the annotation moved to u64::MAX: the record stands",
            PreparingDelete,
            true,
            Some(NOW - 100),
            Some(u64::MAX),
            drain,
            NOW - 100,
        ),
        (
            "on record, the annotation moved to the past: the record stands",
            PreparingDelete,
            true,
            Some(NOW - 100),
            Some(0),
            drain,
            NOW - 100,
        ),
        (
            "on record, the label set back to Normal: held again from the same start",
            Normal,
            true,
            Some(NOW - 100),
            Some(YEAR_2500),
            drain,
            NOW - 100,
        ),
        (
            "on record, Normal and the hook's label off (to be put back): still held",
            Normal,
            false,
            Some(NOW - 100),
            None,
            drain,
            NOW - 100,
        ),
        (
            "on record, Normal, the StatefulSet's status lagging: still held",
            Normal,
            true,
            Some(NOW - 100),
            None,
            Fate::Unknown,
            NOW - 100,
        ),
        (
            "on record in the future (a replica's clock ahead): from first sight",
            PreparingDelete,
            true,
            Some(NOW + 50),
            None,
            drain,
            NOW,
        ),
        (
            "labelled PreparingDelete by hand with u64::MAX: a request, from first sight",
            PreparingDelete,
            true,
            None,
            Some(u64::MAX),
            Fate::Staying,
            NOW,
        ),
    ] {
        let extra: &[(&str, &str)] = if hook { &[BLOCK_DELETE] } else { &[] };
        let l = labels(Some(state), extra);
        let seen = PodFacts {
            held_since: condition,
            since_annotation: annotation,
            // What ipkeep wrote with the hold; a request by hand has none.
            held: (fate != Fate::Staying).then_some(Going::Drain),
            ..facts(&l)
        };
        let got = reconcile(&lc, &seen, fate, NOW);
        assert_eq!(
            (got.state, got.held_since, got.delete),
            (Some(PreparingDelete), Some(start), false),
            "{name}"
        );
        // The controller wrote the start; the pod still claims what it claimed, and its label
        // may still say Normal: the webhook counts from the record.
        let recorded = PodFacts {
            held_since: got.held_since,
            ..seen
        };
        let eviction = DeleteRequest {
            force: false,
            eviction: true,
        };
        let at = |now| admit_delete(&lc, &recorded, eviction, now, "db-0");
        if hook {
            assert!(
                matches!(at(start + T - 1), Admission::Deny { .. }),
                "{name}: released early"
            );
        }
        let passes = if hook { Some(Escape::TimedOut) } else { None };
        assert_eq!(
            at(start + T),
            Admission::Allow { escaped: passes },
            "{name}"
        );
        // Looked at again later, the start stays where it was recorded.
        let again = reconcile(&lc, &recorded, fate, NOW + 30);
        assert_eq!(again.held_since, Some(start), "{name}: restarted");
    }
    // Before the controller has recorded anything (the webhook of a new release next to an
    // older controller), a time in the future counts as now: held, never for ever by itself.
    let l = labels(Some(PreparingDelete), &[BLOCK_DELETE]);
    let unrecorded = PodFacts {
        since_annotation: Some(u64::MAX),
        held: Some(Going::Drain),
        ..facts(&l)
    };
    let eviction = DeleteRequest {
        force: false,
        eviction: true,
    };
    let message = match admit_delete(&lc, &unrecorded, eviction, NOW, "db-0") {
        Admission::Deny { message } => message,
        other => panic!("{other:?}"),
    };
    assert!(
        message.contains(&format!("in {T} s at the latest")),
        "{message}"
    );
}
