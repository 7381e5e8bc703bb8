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
        since: None,
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
    for (name, lc, state, extra, want_state, want_ready) in [
        (
            "unlabelled pod fails open",
            &both,
            None,
            vec![],
            None,
            Some(true),
        ),
        (
            "PreparingNormal until registered: not Ready",
            &both,
            Some(PreparingNormal),
            vec![],
            Some(PreparingNormal),
            Some(false),
        ),
        (
            "PreparingNormal, the operator said yes: Normal and Ready",
            &both,
            Some(PreparingNormal),
            vec![("example.com/registered", "true")],
            Some(Normal),
            Some(true),
        ),
        (
            "PreparingNormal, the label with another value: still waiting",
            &both,
            Some(PreparingNormal),
            vec![("example.com/registered", "false")],
            Some(PreparingNormal),
            Some(false),
        ),
        (
            "PreparingNormal after the hook was removed from the spec: Normal",
            &delete_only,
            Some(PreparingNormal),
            vec![],
            Some(Normal),
            Some(true),
        ),
        (
            "Normal stays Normal",
            &both,
            Some(Normal),
            vec![BLOCK_DELETE],
            Some(Normal),
            Some(true),
        ),
        (
            "PreparingDelete with markPodNotReady: not Ready, traffic drains",
            &both,
            Some(PreparingDelete),
            vec![BLOCK_DELETE],
            Some(PreparingDelete),
            Some(false),
        ),
        (
            "PreparingDelete without markPodNotReady: stays Ready",
            &no_drain,
            Some(PreparingDelete),
            vec![BLOCK_DELETE],
            Some(PreparingDelete),
            Some(true),
        ),
    ] {
        let l = labels(state, &extra);
        let got = reconcile(lc, &facts(&l), NOW);
        assert_eq!(got.state, want_state, "{name}");
        assert_eq!(got.ready, want_ready, "{name}");
    }
}

#[test]
fn the_gate_follows_the_pod_not_the_configuration() {
    use State::*;
    let none = Lifecycle::default();
    // The hooks (or the whole PersistentPodState) were removed after the pod was created with
    // the gate: it is still set, or the pod would never be Ready.
    for state in [PreparingNormal, Normal] {
        let l = labels(Some(state), &[]);
        let got = reconcile(&none, &facts(&l), NOW);
        assert_eq!(
            (got.state, got.ready),
            (Some(Normal), Some(true)),
            "{state}"
        );
    }
    // A pod without the gate (created before the hooks, or while the webhook was down): no
    // condition to write, whatever its state.
    let l = labels(Some(PreparingDelete), &[BLOCK_DELETE]);
    let ungated = PodFacts {
        gated: false,
        since: Some(NOW),
        ..facts(&l)
    };
    assert_eq!(
        reconcile(&lifecycle(true, Some(true)), &ungated, NOW).ready,
        None
    );
}

#[test]
fn a_held_eviction_nobody_retries_leaves_preparing_delete() {
    let lc = lifecycle(false, Some(true));
    let l = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let limit = DEFAULT_PRE_DELETE_TIMEOUT_SECS + ABANDONED_AFTER_SECS;
    let pod = |since: u64, terminating: bool| PodFacts {
        since: Some(since),
        terminating,
        held: Some(Held::Eviction),
        ..facts(&l)
    };
    let held = reconcile(&lc, &pod(NOW - 10, false), NOW);
    assert_eq!(
        held,
        Wanted {
            state: Some(State::PreparingDelete),
            ready: Some(false),
            recheck_at: Some(NOW - 10 + limit),
            delete: false,
        }
    );
    // Past the timeout every eviction passes; still here ABANDONED_AFTER_SECS later, nobody is
    // evicting it (a drain cancelled): back to Normal and Ready.
    let back = reconcile(&lc, &pod(NOW - limit, false), NOW);
    assert_eq!(
        (back.state, back.ready, back.recheck_at, back.delete),
        (Some(State::Normal), Some(true), None, false)
    );
    // One that is terminating stays as it is until it is gone.
    let going = reconcile(&lc, &pod(NOW - limit, true), NOW);
    assert_eq!(
        (going.state, going.ready, going.delete),
        (Some(State::PreparingDelete), Some(false), false)
    );
    // A mark without what was held (written by hand) is treated as an eviction.
    let unknown = PodFacts {
        held: None,
        ..pod(NOW - 10, false)
    };
    assert_eq!(reconcile(&lc, &unknown, NOW), held);
}

#[test]
fn a_held_deletion_is_completed_once_the_hook_lets_go() {
    let lc = lifecycle(false, Some(true));
    let blocked = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let released = labels(Some(State::PreparingDelete), &[]);
    let pod = |labels, since: u64| PodFacts {
        since: Some(since),
        held: Some(Held::Deletion),
        ..facts(labels)
    };
    // Still blocked: held, not Ready, looked at again when the hook times out.
    let waiting = reconcile(&lc, &pod(&blocked, NOW - 10), NOW);
    assert_eq!(
        waiting,
        Wanted {
            state: Some(State::PreparingDelete),
            ready: Some(false),
            recheck_at: Some(NOW - 10 + DEFAULT_PRE_DELETE_TIMEOUT_SECS),
            delete: false,
        }
    );
    // The operator removed the label, or the hook timed out, or the hook was removed from the
    // spec: ipkeep deletes the pod (its deleter may never retry).
    for (name, lc, pod) in [
        ("released", &lc, pod(&released, NOW - 10)),
        (
            "timed out",
            &lc,
            pod(&blocked, NOW - DEFAULT_PRE_DELETE_TIMEOUT_SECS),
        ),
        (
            "hook removed",
            &lifecycle(false, None),
            pod(&blocked, NOW - 10),
        ),
    ] {
        let got = reconcile(lc, &pod, NOW);
        assert!(got.delete, "{name}");
        assert_eq!(got.state, Some(State::PreparingDelete), "{name}");
    }
    // Not once it is terminating.
    let going = PodFacts {
        terminating: true,
        ..pod(&released, NOW - 10)
    };
    assert!(!reconcile(&lc, &going, NOW).delete);
    assert_eq!(Held::parse(Held::Deletion.as_str()), Some(Held::Deletion));
    assert_eq!(Held::parse(Held::Eviction.as_str()), Some(Held::Eviction));
    assert_eq!(Held::parse("drain"), None);
}

#[test]
fn deletions_are_held_only_while_the_pod_carries_the_hook() {
    let lc = lifecycle(true, Some(true));
    let delete = DeleteRequest {
        force: false,
        eviction: false,
        dry_run: false,
    };
    let blocked = labels(Some(State::Normal), &[BLOCK_DELETE]);
    match admit_delete(&lc, &facts(&blocked), delete, NOW, "db-2") {
        Admission::Deny {
            message,
            mark_since,
        } => {
            assert!(message.contains("deletion of pod db-2"), "{message}");
            assert!(message.contains("example.com/registered=true"), "{message}");
            assert!(message.contains("in 600 s at the latest"), "{message}");
            assert!(message.contains("--force --grace-period=0"), "{message}");
            assert_eq!(mark_since, Some(NOW), "marked PreparingDelete now");
        }
        other => panic!("{other:?}"),
    }
    // Already PreparingDelete: refused again, not marked again, the time left counts down.
    let preparing = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let mut pod = facts(&preparing);
    pod.since = Some(NOW - 100);
    match admit_delete(
        &lc,
        &pod,
        DeleteRequest {
            eviction: true,
            ..delete
        },
        NOW,
        "db-2",
    ) {
        Admission::Deny {
            message,
            mark_since,
        } => {
            assert!(message.contains("eviction of pod db-2"), "{message}");
            assert!(message.contains("in 500 s"), "{message}");
            assert_eq!(mark_since, None);
        }
        other => panic!("{other:?}"),
    }
    // A dry run decides the same and marks nothing.
    assert!(matches!(
        admit_delete(
            &lc,
            &facts(&blocked),
            DeleteRequest {
                dry_run: true,
                ..delete
            },
            NOW,
            "db-2"
        ),
        Admission::Deny {
            mark_since: None,
            ..
        }
    ));
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
        dry_run: false,
    };
    let blocked = labels(Some(State::PreparingDelete), &[BLOCK_DELETE]);
    let base = PodFacts {
        since: Some(NOW - 10),
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
                since: Some(NOW - DEFAULT_PRE_DELETE_TIMEOUT_SECS),
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
    // The timeout counts from PreparingDelete only: a Normal pod's stale `since` does not let
    // its first deletion through.
    let normal = labels(Some(State::Normal), &[BLOCK_DELETE]);
    let old = PodFacts {
        since: Some(0),
        ..facts(&normal)
    };
    assert!(matches!(
        admit_delete(&lc, &old, delete, NOW, "db-0"),
        Admission::Deny {
            mark_since: Some(NOW),
            ..
        }
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
