//! The decision as a table: one row per situation a pod can be in at its ADD or DEL.

#![allow(clippy::unwrap_used)]

use ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE;
use serde_json::{Value, json};

use super::*;

const NS: &str = "prod";

/// Pod `name` of StatefulSet `sts` (no owner with `sts` empty), with `annotations` and `labels`.
fn pod(name: &str, sts: &str, annotations: Value, labels: Value) -> Pod {
    let owners = if sts.is_empty() {
        json!([])
    } else {
        json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts, "uid": "sts-uid", "controller": true}])
    };
    serde_json::from_value(json!({"metadata": {
        "name": name, "namespace": NS, "uid": "pod-uid",
        "ownerReferences": owners, "annotations": annotations, "labels": labels
    }}))
    .unwrap()
}

/// `state` with a record of `pod` (node `n1`) made for the pod with UID `uid`.
fn recording(mut state: PersistentPodState, pod: &str, uid: &str) -> PersistentPodState {
    let record = serde_json::from_value(json!({"nodeName": "n1", "podUID": uid,
        "nodeTopologyLabels": {"kubernetes.io/hostname": "n1"}, "podIPs": ["10.0.0.9"],
        "recordedAt": "2026-11-26T08:00:00Z"}))
    .unwrap();
    state
        .status
        .get_or_insert_default()
        .pod_states
        .insert(pod.to_string(), record);
    state
}

/// PersistentPodState `name` (UID `uid-<name>`) in `namespace` for StatefulSet `target`,
/// `ipRetention: 2h`, with a spec that checks (topology, hooks, annotations recorded: what the
/// agent does not read).
fn state(namespace: &str, name: &str, target: &str, deleting: bool) -> PersistentPodState {
    let mut meta = json!({"name": name, "namespace": namespace, "uid": format!("uid-{name}")});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-11-26T09:00:00Z");
        meta["finalizers"] = json!(["example.com/hold"]);
    }
    serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState", "metadata": meta,
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": target},
                 "ipRetention": "2h",
                 "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
                 "persistentPodAnnotations": [{"key": "example.com/a"}],
                 "nodeLossPolicy": {"action": "Wait", "after": "10m"},
                 "lifecycle": {"preDelete": {"labelsHandler": {"example.com/registered": "true"}}}},
        "status": {"recordedPods": 0, "conditions": [{"type": "Ready", "status": "True",
            "reason": "Recording", "message": "m", "lastTransitionTime": "2026-11-26T08:00:00Z"}]}
    }))
    .unwrap()
}

/// `state` as the controller leaves it once it has seen StatefulSet UID `uid`.
fn targeting(mut state: PersistentPodState, uid: &str) -> PersistentPodState {
    state.status.get_or_insert_default().target_uid = Some(uid.to_string());
    state
}

/// `state` carrying `ipkeep.dev/adopt-persistent-pod-state: "true"`.
fn adopting(mut state: PersistentPodState) -> PersistentPodState {
    state
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(ADOPT_PERSISTENT_POD_STATE.into(), "true".into());
    state
}

/// `state` controlled by the StatefulSet with the UID its status records.
fn owned(mut state: PersistentPodState) -> PersistentPodState {
    let uid = state
        .status
        .as_ref()
        .and_then(|s| s.target_uid.clone())
        .unwrap_or_default();
    state.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "name": "db", "uid": uid, "controller": true}))
        .unwrap(),
    ]);
    state
}

/// `state` targeting OpenKruise's Advanced StatefulSet of its target's name: same kind, same pod
/// names, group `apps.kruise.io`.
fn for_kruise(mut state: PersistentPodState) -> PersistentPodState {
    state.spec.target_ref.api_version = "apps.kruise.io/v1beta1".into();
    state
}

/// Pod `name` controlled by OpenKruise's Advanced StatefulSet `sts`.
fn kruise_pod(name: &str, sts: &str) -> Pod {
    let mut pod = pod(name, sts, json!({}), json!({}));
    for owner in pod.metadata.owner_references.iter_mut().flatten() {
        owner.api_version = "apps.kruise.io/v1beta1".into();
    }
    pod
}

/// `state` as the agent decodes it ([`crate::lean_pps`]).
fn lean(state: &PersistentPodState) -> PersistentPodState {
    let text = serde_json::to_string(state).unwrap();
    ipkeep_daemon::lenient::Lenient::<PersistentPodState, crate::lean_pps::LeanPps>::decode(&text)
        .decoded
        .unwrap()
}

/// Managed by `pps` (its UID `uid-<pps>`), judged from the pod.
fn managed(pps: &str, retention: &str) -> Management {
    Management::Managed {
        persistent_pod_state: StateRef {
            name: pps.into(),
            uid: Some(format!("uid-{pps}")),
        },
        annotations: [
            ("ipkeep.dev/persistent-pod-state", pps),
            ("ipkeep.dev/ip-retention", retention),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
        judged_by_name: false,
    }
}

/// Managed by `pps`, judged by the pod's name alone.
fn by_name(pps: &str, retention: &str) -> Management {
    match managed(pps, retention) {
        Management::Managed {
            persistent_pod_state,
            annotations,
            ..
        } => Management::Managed {
            persistent_pod_state,
            annotations,
            judged_by_name: true,
        },
        other => other,
    }
}

fn behind(why: &str) -> Management {
    Management::Unknown(Unavailable {
        why: why.into(),
        expected: true,
    })
}

struct Row {
    what: &'static str,
    readiness: Readiness,
    name: &'static str,
    /// The command's `K8S_POD_UID` (the pods here have `pod-uid`).
    uid: Option<&'static str>,
    /// ADD, rather than DEL.
    adding: bool,
    pod: Option<Pod>,
    states: Vec<PersistentPodState>,
    undecodable: Vec<String>,
    runtime: Option<Value>,
    want: Management,
}

fn rows() -> Vec<Row> {
    let none = || json!({});
    let db = || vec![state(NS, "db", "db", false)];
    let db_pod = |name: &str| Some(pod(name, "db", none(), none()));
    let row = |what, name, pod: Option<Pod>, states, want| Row {
        what,
        readiness: Readiness::Ready,
        name,
        uid: Some("pod-uid"),
        adding: false,
        pod,
        states,
        undecodable: Vec::new(),
        runtime: None,
        want,
    };
    vec![
        row(
            "managed: no link, no retention annotation (created before its PersistentPodState)",
            "db-0",
            db_pod("db-0"),
            db(),
            managed("db", "2h"),
        ),
        row(
            "managed: a readable retention of its own counts, as the webhook lets it",
            "db-1",
            Some(pod(
                "db-1",
                "db",
                json!({"ipkeep.dev/ip-retention": "30m", "team": "x"}),
                none(),
            )),
            db(),
            managed("db", "30m"),
        ),
        row(
            "managed: an unreadable one is replaced by the state's, as the webhook does",
            "db-1",
            Some(pod(
                "db-1",
                "db",
                json!({"ipkeep.dev/ip-retention": "soon"}),
                none(),
            )),
            db(),
            managed("db", "2h"),
        ),
        row(
            "managed: a link to another state changes nothing",
            "db-2",
            Some(pod(
                "db-2",
                "db",
                json!({"ipkeep.dev/persistent-pod-state": "forged"}),
                none(),
            )),
            db(),
            managed("db", "2h"),
        ),
        row(
            "managed: of two states targeting it, the one named after the StatefulSet",
            "db-0",
            db_pod("db-0"),
            vec![state(NS, "a-db", "db", false), state(NS, "db", "db", false)],
            managed("db", "2h"),
        ),
        row(
            "managed: its StatefulSet's UID is the one its state records",
            "db-0",
            db_pod("db-0"),
            vec![targeting(state(NS, "db", "db", false), "sts-uid")],
            managed("db", "2h"),
        ),
        row(
            "not managed: it names the StatefulSet, but not the UID its state records",
            "db-0",
            db_pod("db-0"),
            vec![targeting(state(NS, "db", "db", false), "other-uid")],
            Management::Unmanaged,
        ),
        row(
            "managed: another UID, but its state waits to be adopted by a re-created StatefulSet",
            "db-0",
            db_pod("db-0"),
            vec![adopting(targeting(
                state(NS, "db", "db", false),
                "other-uid",
            ))],
            managed("db", "2h"),
        ),
        row(
            "not managed: another UID, and the state that adopts is owned by its StatefulSet",
            "db-0",
            db_pod("db-0"),
            vec![owned(adopting(targeting(
                state(NS, "db", "db", false),
                "other-uid",
            )))],
            Management::Unmanaged,
        ),
        row(
            "not managed: no StatefulSet owns it, whatever its link says",
            "db-3",
            Some(pod(
                "db-3",
                "",
                json!({"ipkeep.dev/persistent-pod-state": "db", "ipkeep.dev/ip-retention": "forever"}),
                none(),
            )),
            db(),
            Management::Unmanaged,
        ),
        row(
            "orphaned (delete sts --cascade=orphan): its state records this very pod",
            "db-1",
            Some(pod("db-1", "", none(), none())),
            vec![recording(state(NS, "db", "db", false), "db-1", "pod-uid")],
            managed("db", "2h"),
        ),
        row(
            "orphaned: the record is another pod's (another UID)",
            "db-1",
            Some(pod("db-1", "", none(), none())),
            vec![recording(state(NS, "db", "db", false), "db-1", "older-uid")],
            Management::Unmanaged,
        ),
        row(
            "orphaned: its state is being deleted",
            "db-1",
            Some(pod("db-1", "", none(), none())),
            vec![recording(state(NS, "db", "db", true), "db-1", "pod-uid")],
            Management::Unmanaged,
        ),
        row(
            "not managed: its StatefulSet has no state",
            "web-0",
            Some(pod("web-0", "web", none(), none())),
            db(),
            Management::Unmanaged,
        ),
        row(
            "not managed: the only state is in another namespace",
            "db-0",
            db_pod("db-0"),
            vec![state("other", "db", "db", false)],
            Management::Unmanaged,
        ),
        row(
            "not managed: its state is being deleted",
            "db-0",
            db_pod("db-0"),
            vec![state(NS, "db", "db", true)],
            Management::Unmanaged,
        ),
        row(
            "ordinal out of range: not a canonical ordinal",
            "db-01",
            db_pod("db-01"),
            db(),
            Management::Unmanaged,
        ),
        row(
            "ordinal out of range: beyond what a StatefulSet numbers",
            "db-2147483648",
            db_pod("db-2147483648"),
            db(),
            Management::Unmanaged,
        ),
        row(
            "ordinal out of range: the pod-index label disagrees with the name",
            "db-4",
            Some(pod(
                "db-4",
                "db",
                none(),
                json!({"apps.kubernetes.io/pod-index": "5"}),
            )),
            db(),
            Management::Unmanaged,
        ),
        Row {
            runtime: Some(json!({"ipkeep.dev/ip-retention": "45m", "other": "x"})),
            ..row(
                "gone from the API: named as its state's StatefulSet names pods; its runtime annotations",
                "db-5",
                None,
                db(),
                by_name("db", "45m"),
            )
        },
        row(
            "not managed: its StatefulSet's name is targeted only as an Advanced StatefulSet's",
            "db-0",
            db_pod("db-0"),
            vec![for_kruise(state(NS, "db", "db", false))],
            Management::Unmanaged,
        ),
        row(
            "not managed: an Advanced StatefulSet's pod, with the apps StatefulSet's state of the name",
            "db-0",
            Some(kruise_pod("db-0", "db")),
            db(),
            Management::Unmanaged,
        ),
        row(
            "managed: an Advanced StatefulSet's pod, by the state targeting it",
            "db-0",
            Some(kruise_pod("db-0", "db")),
            vec![for_kruise(state(NS, "db", "db", false))],
            managed("db", "2h"),
        ),
        row(
            "managed: an Advanced StatefulSet's pod without the pod-index label (Kruise's PodIndexLabel off)",
            "db-3",
            Some(kruise_pod("db-3", "db")),
            vec![for_kruise(state(NS, "db", "db", false))],
            managed("db", "2h"),
        ),
        row(
            "not managed: an Advanced StatefulSet's pod whose pod-index label disagrees with its name",
            "db-3",
            Some({
                let mut pod = kruise_pod("db-3", "db");
                pod.metadata.labels = Some([(POD_INDEX_LABEL.to_string(), "4".to_string())].into());
                pod
            }),
            vec![for_kruise(state(NS, "db", "db", false))],
            Management::Unmanaged,
        ),
        row(
            "gone from the API: named as an Advanced StatefulSet's pod, by the name alone",
            "db-5",
            None,
            vec![for_kruise(state(NS, "db", "db", false))],
            by_name("db", "2h"),
        ),
        row(
            "gone from the API: its state records this very pod",
            "db-5",
            None,
            vec![recording(state(NS, "db", "db", false), "db-5", "pod-uid")],
            managed("db", "2h"),
        ),
        row(
            "gone from the API: its state records another pod of the name",
            "db-5",
            None,
            vec![recording(state(NS, "db", "db", false), "db-5", "older-uid")],
            by_name("db", "2h"),
        ),
        Row {
            uid: Some("deleted-uid"),
            ..row(
                "a DEL of a pod whose name another pod took since: judged as gone, not by the newcomer",
                "db-5",
                Some(pod("db-5", "", none(), none())),
                db(),
                by_name("db", "2h"),
            )
        },
        Row {
            adding: true,
            ..row(
                "view behind at ADD: the API does not show the pod yet",
                "db-5",
                None,
                db(),
                behind("the node agent's view of the API server does not show this pod yet"),
            )
        },
        Row {
            adding: true,
            uid: Some("new-uid"),
            ..row(
                "view behind at ADD: the pod of that name it shows is an older one",
                "db-5",
                db_pod("db-5"),
                db(),
                behind("the node agent's view of the API server does not show this pod yet"),
            )
        },
        Row {
            uid: None,
            ..row(
                "no UID from the runtime: the pod of that name is the one",
                "db-0",
                db_pod("db-0"),
                db(),
                managed("db", "2h"),
            )
        },
        row(
            "gone from the API: a name no state's StatefulSet gives",
            "dbx-0",
            None,
            db(),
            Management::Unmanaged,
        ),
        row(
            "gone from the API: its state is being deleted",
            "db-5",
            None,
            vec![state(NS, "db", "db", true)],
            Management::Unmanaged,
        ),
        Row {
            undecodable: vec!["odd".into()],
            ..row(
                "a state of its namespace does not decode: it may be the one, nobody can say",
                "db-0",
                db_pod("db-0"),
                db(),
                Management::Unknown(Unavailable {
                    why: "the node agent cannot decode PersistentPodState prod/odd (its log says why), which may manage this pod".into(),
                    expected: true,
                }),
            )
        },
        Row {
            undecodable: vec!["odd".into()],
            ..row(
                "... also for a pod no decoded state manages",
                "web-0",
                Some(pod("web-0", "web", none(), none())),
                db(),
                Management::Unknown(Unavailable {
                    why: "the node agent cannot decode PersistentPodState prod/odd (its log says why), which may manage this pod".into(),
                    expected: true,
                }),
            )
        },
        Row {
            readiness: Readiness::Syncing,
            adding: true,
            ..row(
                "view stale at ADD: caches not synced or a watch relisting",
                "db-0",
                db_pod("db-0"),
                db(),
                Management::Unknown(Unavailable {
                    why: "the node agent's view of the API server is not usable (syncing)".into(),
                    expected: true,
                }),
            )
        },
        Row {
            readiness: Readiness::Syncing,
            ..row(
                "view stale at DEL (the agent just started): the DEL waits for the view",
                "db-0",
                db_pod("db-0"),
                db(),
                Management::Syncing(Unavailable {
                    why: "the node agent's view of the API server is not usable (syncing)".into(),
                    expected: true,
                }),
            )
        },
        Row {
            readiness: Readiness::NodeUnknown,
            ..row(
                "view unusable: this agent's Node is unknown",
                "db-0",
                db_pod("db-0"),
                db(),
                Management::Unknown(Unavailable {
                    why: "the node agent's view of the API server is not usable (node unknown (check --node-name))".into(),
                    expected: true,
                }),
            )
        },
    ]
}

/// Each row with the states whole, and as the agent decodes them: the same answer.
#[test]
fn who_manages_a_pod_at_its_add_or_del() {
    for row in rows() {
        let runtime: Option<BTreeMap<String, String>> =
            row.runtime.map(|v| serde_json::from_value(v).unwrap());
        let asked = SandboxPod {
            namespace: NS,
            name: row.name,
            uid: row.uid,
            adding: row.adding,
            annotations: runtime.as_ref(),
        };
        let leans: Vec<PersistentPodState> = row.states.iter().map(lean).collect();
        for (how, states) in [("whole", &row.states), ("lean", &leans)] {
            let states: Vec<&PersistentPodState> = states.iter().collect();
            let got = management(
                row.readiness,
                &asked,
                row.pod.as_ref(),
                &states,
                &row.undecodable,
            );
            assert_eq!(got, row.want, "{} ({how})", row.what);
        }
    }
}
