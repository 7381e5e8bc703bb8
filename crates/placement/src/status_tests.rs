#![allow(clippy::unwrap_used)]

use ipkeep_api::Condition;
use ipkeep_api::k8s_openapi::jiff::Timestamp;
use ipkeep_values::keys::PINNED_BY;
use serde_json::json;

use super::*;
use crate::view::NodeHealth;

fn t(s: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + s).unwrap())
}

fn spec(overrides: serde_json::Value) -> PersistentPodStateSpec {
    let mut v = json!({
        "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
        "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
        "nodeLossPolicy": {"action": "FallbackToPreferred", "after": "5m"},
    });
    for (k, val) in overrides.as_object().unwrap() {
        v[k] = val.clone();
    }
    serde_json::from_value(v).unwrap()
}

fn target() -> TargetView {
    TargetView {
        name: "db".into(),
        uid: "sts-1".into(),
        ordinals: crate::ordinals::ValidOrdinals::native(2, 0),
        adopts_records: false,
        invalid_reserve_ordinal: None,
    }
}

fn record(node: &str) -> PodState {
    PodState {
        node_name: node.into(),
        node_topology_labels: [("kubernetes.io/hostname".to_string(), node.to_string())].into(),
        ..PodState::default()
    }
}

fn ready_pod(name: &str, node: &str) -> PodView {
    PodView {
        name: name.into(),
        uid: format!("uid-{name}"),
        controller_uid: Some("sts-1".into()),
        node_name: Some(node.into()),
        ready: true,
        ips: vec!["10.0.0.1".into()],
        ..PodView::default()
    }
}

fn node(name: &str, health: NodeHealth) -> (String, NodeView) {
    let labels = [("kubernetes.io/hostname".to_string(), name.to_string())].into();
    (name.to_string(), NodeView { labels, health })
}

fn condition(type_: &str, status: &str, reason: &str, since: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: t(since),
        observed_generation: Some(1),
    }
}

/// What one reconcile sees; each test changes what it is about.
struct World {
    spec: PersistentPodStateSpec,
    adopts: bool,
    previous: PersistentPodStateStatus,
    target: Option<TargetView>,
    template: Option<PodTemplateSpec>,
    pods: Vec<PodView>,
    nodes: BTreeMap<String, NodeView>,
    now: Time,
}

impl World {
    /// Two records on n1 and n2, both Ready; `Ready` and `NodeLost` as recording leaves them.
    fn new() -> Self {
        Self {
            spec: spec(json!({})),
            adopts: false,
            previous: PersistentPodStateStatus {
                target_uid: Some("sts-1".into()),
                pod_states: [
                    ("db-0".to_string(), record("n1")),
                    ("db-1".to_string(), record("n2")),
                ]
                .into(),
                recorded_pods: 2,
                conditions: vec![
                    condition(NODE_LOST, "False", "NodesReady", 0),
                    condition(READY, "True", "Recording", 0),
                ],
                observed_generation: Some(1),
            },
            target: Some(target()),
            template: None,
            pods: Vec::new(),
            nodes: [node("n1", NodeHealth::Ready), node("n2", NodeHealth::Ready)].into(),
            now: t(100),
        }
    }

    fn reconcile(&self) -> Reconciled {
        let pods = self
            .pods
            .iter()
            .map(|p| (p.name.clone(), p.clone()))
            .collect();
        reconcile(&StatusInput {
            name: "db",
            namespace: "prod",
            spec: &self.spec,
            adopts: self.adopts,
            generation: Some(2),
            previous: &self.previous,
            target: self.target.as_ref(),
            template: self.template.as_ref(),
            pods: &pods,
            nodes: &self.nodes,
            now: &self.now,
        })
    }
}

fn ready_of(status: &PersistentPodStateStatus) -> (&str, &str, &str) {
    let c = status.condition(READY).unwrap();
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

/// Each not-Ready case: its reason, what it says, and what happens to the records, the target
/// UID and `NodeLost`.
#[test]
fn ready_says_why_it_does_not_record_and_what_became_of_the_records() {
    type Change = fn(&mut World);
    let cases: [(&str, Change, Verdict, &str, &str, usize, bool); 5] = [
        (
            "a topology key the API server would refuse",
            |w| {
                w.spec =
                    spec(json!({"requiredPersistentTopology": {"nodeTopologyKeys": ["Not A Key"]}}))
            },
            Verdict::InvalidSpec(SpecError::InvalidKey {
                key: "Not A Key".into(),
                reason: String::new(),
            }),
            "InvalidSpec",
            "invalid node topology key \"Not A Key\"",
            2,
            true,
        ),
        (
            "a Deployment as target",
            |w| {
                w.spec = spec(
                    json!({"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "db"}}),
                );
            },
            Verdict::InvalidSpec(SpecError::UnsupportedTarget {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
            }),
            "InvalidSpec",
            "apps/v1 StatefulSet",
            2,
            true,
        ),
        (
            "StatefulSet gone",
            |w| w.target = None,
            Verdict::TargetNotFound,
            "TargetNotFound",
            "StatefulSet prod/db does not exist (or is being deleted); records are cleared",
            0,
            false,
        ),
        (
            "StatefulSet gone, records kept for the next one",
            |w| {
                w.target = None;
                w.adopts = true;
            },
            Verdict::WaitingForAdoption,
            "WaitingForAdoption",
            "its 2 record(s) and held IPs are kept for the next StatefulSet of this name",
            2,
            true,
        ),
        (
            "invalid spec wins over a missing StatefulSet",
            |w| {
                w.target = None;
                w.spec = spec(json!({"ipRetention": "soon"}));
            },
            Verdict::InvalidSpec(SpecError::BadRetention(
                ipkeep_values::Retention::parse("ipRetention", "soon").unwrap_err(),
            )),
            "InvalidSpec",
            "ipRetention",
            2,
            true,
        ),
    ];
    for (case, change, verdict, reason, text, records, keeps_target) in cases {
        let mut w = World::new();
        change(&mut w);
        let got = w.reconcile();
        match (&got.verdict, &verdict) {
            (Verdict::InvalidSpec(a), Verdict::InvalidSpec(b)) => {
                assert_eq!(
                    std::mem::discriminant(a),
                    std::mem::discriminant(b),
                    "{case}: {a}"
                );
            }
            (a, b) => assert_eq!(a, b, "{case}"),
        }
        let (status, why, message) = ready_of(&got.status);
        assert_eq!((status, why), ("False", reason), "{case}");
        assert!(message.contains(text), "{case}: {message}");
        assert_eq!(got.status.pod_states.len(), records, "{case}");
        assert_eq!(got.status.recorded_pods, records as i32, "{case}");
        assert_eq!(
            got.status.target_uid.is_some(),
            keeps_target,
            "{case}: target UID"
        );
        assert!(
            got.status.condition(NODE_LOST).is_none(),
            "{case}: NodeLost is removed while not recording"
        );
        assert_eq!(got.status.observed_generation, Some(2), "{case}");
        let c = got.status.condition(READY).unwrap();
        assert_eq!(
            (c.last_transition_time.clone(), c.observed_generation),
            (t(100), Some(2)),
            "{case}: Ready turned False now"
        );
        assert!(got.changes.is_empty() && got.stranded.is_empty() && got.requeue.is_none());
    }
}

#[test]
fn an_invalid_spec_keeps_its_message_and_transition_time_until_fixed() {
    let mut w = World::new();
    w.spec = spec(json!({"nodeLossPolicy": {"after": "x"}}));
    let first = w.reconcile();
    w.previous = first.status.clone();
    w.now = t(200);
    let again = w.reconcile();
    assert_eq!(
        again.status, first.status,
        "nothing to write the second time"
    );
    w.spec = spec(json!({}));
    w.pods = vec![ready_pod("db-0", "n1")];
    let fixed = w.reconcile();
    assert_eq!(fixed.verdict, Verdict::Recording);
    let c = fixed.status.condition(READY).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Recording")
    );
    assert_eq!(c.last_transition_time, t(200));
    assert_eq!(
        fixed.status.condition(NODE_LOST).unwrap().reason,
        "NodesReady"
    );
}

#[test]
fn recording_keeps_transition_times_and_writes_nothing_new_when_nothing_changed() {
    let mut w = World::new();
    w.pods = vec![ready_pod("db-0", "n1"), ready_pod("db-1", "n2")];
    let first = w.reconcile();
    assert_eq!(first.verdict, Verdict::Recording);
    assert_eq!(first.status.target_uid.as_deref(), Some("sts-1"));
    let (status, reason, message) = ready_of(&first.status);
    assert_eq!(
        (status, reason, message),
        ("True", "Recording", "recording the pods of StatefulSet db")
    );
    for c in &first.status.conditions {
        assert_eq!(c.last_transition_time, t(0), "{}: status held", c.type_);
    }
    w.previous = first.status.clone();
    w.now = t(300);
    assert_eq!(w.reconcile().status, first.status);
}

/// `NodeLost` while recording: True for a lost node with the policy's state, False again once
/// it is back; a grace period asks to be looked at again when it ends.
#[test]
fn node_lost_follows_the_recorded_nodes() {
    let mut w = World::new();
    w.nodes = [
        node("n1", NodeHealth::Ready),
        node("n2", NodeHealth::NotReady { since: Some(t(0)) }),
    ]
    .into();
    let lost = w.reconcile();
    let c = lost.status.condition(NODE_LOST).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "InGracePeriod")
    );
    assert!(
        c.message.contains("db-1: node n2 is NotReady"),
        "{}",
        c.message
    );
    assert_eq!(lost.requeue, Some(Duration::from_secs(200)));
    assert_eq!(
        lost.status.pod_states["db-1"].node_lost_at,
        Some(t(0)),
        "since the node's NotReady"
    );

    w.previous = lost.status;
    w.now = t(301);
    let fell = w.reconcile();
    assert_eq!(
        fell.status.condition(NODE_LOST).unwrap().reason,
        "FellBackToPreferred"
    );
    assert!(fell.status.pod_states["db-1"].preferred_only);
    assert_eq!(
        fell.changes,
        vec![RecordChange::FellBack {
            pod: "db-1".into(),
            node: "n2".into()
        }]
    );
    assert_eq!(fell.requeue, None);

    w.previous = fell.status;
    w.nodes = [node("n1", NodeHealth::Ready), node("n2", NodeHealth::Ready)].into();
    let back = w.reconcile();
    let c = back.status.condition(NODE_LOST).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NodesReady")
    );
    assert!(!back.status.pod_states["db-1"].preferred_only);
}

/// The records of an earlier StatefulSet of the name: dropped, or adopted when asked.
#[test]
fn a_new_statefulset_of_the_name_drops_or_adopts_the_records() {
    let mut w = World::new();
    w.target = Some(TargetView {
        uid: "sts-2".into(),
        ..target()
    });
    let dropped = w.reconcile();
    assert!(dropped.status.pod_states.is_empty());
    assert_eq!(dropped.status.target_uid.as_deref(), Some("sts-2"));
    assert_eq!(
        dropped.changes,
        vec![RecordChange::TargetReplaced { dropped: 2 }]
    );
    w.adopts = true;
    let adopted = w.reconcile();
    assert_eq!(adopted.status.pod_states.len(), 2);
    assert_eq!(adopted.changes, vec![RecordChange::Adopted { records: 2 }]);
}

/// A pod created while its pin still required the lost node, left Pending after the fallback:
/// listed for deletion once, with its UID.
#[test]
fn a_pod_stranded_by_a_fallen_back_pin_is_listed() {
    let mut w = World::new();
    w.previous.pod_states.get_mut("db-1").unwrap().node_lost_at = Some(t(0));
    w.previous
        .pod_states
        .get_mut("db-1")
        .unwrap()
        .preferred_only = true;
    w.nodes.remove("n2");
    w.now = t(400);
    let pending = PodView {
        name: "db-1".into(),
        uid: "uid-pending".into(),
        controller_uid: Some("sts-1".into()),
        annotations: [(PINNED_BY.to_string(), "db".to_string())].into(),
        created_ms: Some(t(100).0.as_millisecond()),
        ..PodView::default()
    };
    w.pods = vec![pending.clone()];
    let got = w.reconcile();
    assert_eq!(got.stranded, vec![pending.clone()]);
    // Only with required topology: a preferred-only spec never pinned it hard.
    w.spec = spec(json!({"requiredPersistentTopology": null,
        "preferredPersistentTopology": [{"weight": 10, "preference": {"nodeTopologyKeys": ["kubernetes.io/hostname"]}}]}));
    assert!(w.reconcile().stranded.is_empty());
}

/// The plan is decided from the status this very reconcile writes: a pod recorded now is
/// pinned by it, and one pruned now is not.
#[test]
fn the_admission_plan_follows_the_status_it_is_decided_with() {
    let mut w = World::new();
    w.template = Some(PodTemplateSpec::default());
    let none = w.reconcile();
    let plan = none.plan.expect("a plan while the StatefulSet exists");
    assert_eq!(plan.stateful_set_uid, "sts-1");
    assert_eq!(
        plan.pods.keys().collect::<Vec<_>>(),
        none.status.pod_states.keys().collect::<Vec<_>>()
    );
    assert!(none.status.condition(ADMISSION_PLANNED).is_none());
    w.target = None;
    assert_eq!(w.reconcile().plan, None, "no StatefulSet, no plan");
}

/// A template whose node constraints are too large for the policy to compare: a False
/// `AdmissionPlanned` that says what pins the pods instead, and no pins in the plan.
#[test]
fn too_large_node_constraints_say_so_in_a_condition() {
    let mut w = World::new();
    let values: Vec<String> = (0..500).map(|i| format!("node-{i:04}")).collect();
    w.template = Some(
        serde_json::from_value(json!({"spec": {"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": values}]}
            ]}}}}}))
        .unwrap(),
    );
    let decided = w.reconcile();
    assert!(decided.plan.unwrap().pods.is_empty());
    let c = decided.status.condition(ADMISSION_PLANNED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NodeConstraintsTooLarge")
    );
    assert!(c.message.contains("scheduler extender"), "{}", c.message);
    // Fixed: the condition goes.
    w.previous = decided.status;
    w.template = Some(PodTemplateSpec::default());
    assert!(w.reconcile().status.condition(ADMISSION_PLANNED).is_none());
}

/// `spec.lifecycle` on an Advanced StatefulSet's state: recording goes on, and `LifecycleHooks`
/// says ipkeep's hooks stand aside for its own; without hooks, or on an `apps` StatefulSet, the
/// condition is not there.
#[test]
fn hooks_asked_for_an_advanced_statefulset_say_they_stand_aside() {
    let hooks = json!({"preDelete": {"labelsHandler": {"example.com/drained": "true"}}});
    let kruise =
        json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "StatefulSet", "name": "db"});
    let mut w = World::new();
    w.spec = spec(json!({"targetRef": kruise, "lifecycle": hooks}));
    let asked = w.reconcile();
    assert_eq!(asked.verdict, Verdict::Recording);
    let c = asked
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == LIFECYCLE_HOOKS)
        .expect("LifecycleHooks");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "AdvancedStatefulSetHasItsOwn")
    );
    assert!(
        c.message.contains("OpenKruise Advanced StatefulSet"),
        "{}",
        c.message
    );
    w.previous = asked.status;
    w.spec = spec(json!({"targetRef": kruise}));
    let removed = w.reconcile();
    assert!(
        removed
            .status
            .conditions
            .iter()
            .all(|c| c.type_ != LIFECYCLE_HOOKS),
        "hooks removed: the condition goes"
    );
    w.spec = spec(json!({"lifecycle": hooks}));
    assert!(
        w.reconcile()
            .status
            .conditions
            .iter()
            .all(|c| c.type_ != LIFECYCLE_HOOKS),
        "an apps StatefulSet's hooks run"
    );
}

/// The messages name an Advanced StatefulSet as such.
#[test]
fn messages_name_the_workload() {
    let kruise =
        json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "StatefulSet", "name": "db"});
    let mut w = World::new();
    w.spec = spec(json!({"targetRef": kruise}));
    let recording = w.reconcile();
    let ready = recording.status.condition(READY).unwrap();
    assert_eq!(
        ready.message,
        "recording the pods of Advanced StatefulSet (apps.kruise.io) db"
    );
    w.target = None;
    let gone = w.reconcile();
    let ready = gone.status.condition(READY).unwrap();
    assert!(
        ready
            .message
            .starts_with("Advanced StatefulSet (apps.kruise.io) prod/db does not exist")
            && ready.message.contains("where OpenKruise is installed"),
        "{}",
        ready.message
    );
}

/// An Advanced StatefulSet whose `reserveOrdinals` has an entry that does not parse: recording
/// goes on with nothing reserved (as Kruise), and `ReserveOrdinals` names the entry and what to
/// write; fixed (or on an `apps` StatefulSet), the condition is not there.
#[test]
fn an_unreadable_reserve_ordinal_is_said_on_the_state() {
    let kruise =
        json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "StatefulSet", "name": "db"});
    let asts = |reserve: serde_json::Value| {
        let asts: ipkeep_api::kruise::AdvancedStatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db", "uid": "sts-1"},
            "spec": {"replicas": 2, "reserveOrdinals": reserve}
        }))
        .unwrap();
        TargetView::from_advanced(&asts)
    };
    let mut w = World::new();
    w.spec = spec(json!({"targetRef": kruise}));
    w.target = Some(asts(json!([1, "5-2"])));
    let bad = w.reconcile();
    assert_eq!(bad.verdict, Verdict::Recording);
    assert_eq!(
        bad.status.pod_states.keys().collect::<Vec<_>>(),
        ["db-0", "db-1"],
        "nothing reserved: db-1 is kept"
    );
    let c = bad
        .status
        .condition(RESERVE_ORDINALS)
        .expect("ReserveOrdinals");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "InvalidReserveOrdinal")
    );
    assert!(
        c.message.starts_with(
            "Advanced StatefulSet prod/db: spec.reserveOrdinals[1] is \"5-2\", neither an ordinal nor a range \"a-b\" with a <= b"
        ) && c.message.contains("\"2-5\""),
        "{}",
        c.message
    );
    w.previous = bad.status;
    w.target = Some(asts(json!([1])));
    let fixed = w.reconcile();
    assert!(fixed.status.condition(RESERVE_ORDINALS).is_none());
    assert_eq!(
        fixed.status.pod_states.keys().collect::<Vec<_>>(),
        ["db-0"],
        "db-1 reserved now: pruned (WhenScaled)"
    );
}
