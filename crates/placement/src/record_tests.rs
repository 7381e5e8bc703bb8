#![allow(clippy::unwrap_used)]

use super::*;
use crate::ordinals::{ReservedOrdinals, ValidOrdinals};
use crate::view::NodeHealth;
use ipkeep_api::k8s_openapi::jiff::Timestamp;

fn t(s: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + s).unwrap())
}

fn config(policy: RecordRetention, action: NodeLossAction) -> CheckedSpec {
    CheckedSpec {
        topology_keys: vec!["kubernetes.io/hostname".into(), "zone".into()],
        annotation_keys: vec![],
        retention_policy: policy,
        node_loss_action: action,
        node_loss_after: Duration::from_secs(300),
        lifecycle: Default::default(),
        ip_retention: "0".into(),
    }
}

fn target(replicas: u32, start: u32) -> TargetView {
    TargetView {
        name: "db".into(),
        uid: "sts-1".into(),
        ordinals: ValidOrdinals::native(replicas, start),
        adopts_records: false,
        invalid_reserve_ordinal: None,
    }
}

fn pod(name: &str, node: &str, ready: bool) -> PodView {
    PodView {
        name: name.into(),
        uid: format!("uid-{name}"),
        controller_uid: Some("sts-1".into()),
        node_name: Some(node.into()).filter(|n: &String| !n.is_empty()),
        ready,
        terminating: false,
        ips: vec![format!("10.0.0.{}", name.len())],
        annotations: BTreeMap::new(),
        created_ms: None,
    }
}

fn node(name: &str, health: NodeHealth) -> (String, NodeView) {
    let labels = [
        ("kubernetes.io/hostname", name),
        ("zone", "a"),
        ("unrelated", "x"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    (name.to_string(), NodeView { labels, health })
}

struct Case {
    config: CheckedSpec,
    target: TargetView,
    previous: PersistentPodStateStatus,
    pods: Vec<PodView>,
    nodes: BTreeMap<String, NodeView>,
    now: Time,
}

impl Case {
    fn new() -> Self {
        Self {
            config: config(
                RecordRetention::WhenScaled,
                NodeLossAction::FallbackToPreferred,
            ),
            target: target(3, 0),
            previous: PersistentPodStateStatus {
                target_uid: Some("sts-1".into()),
                ..Default::default()
            },
            pods: vec![],
            nodes: [node("n1", NodeHealth::Ready), node("n2", NodeHealth::Ready)]
                .into_iter()
                .collect(),
            now: t(0),
        }
    }

    fn plan(&self) -> RecordPlan {
        let pods = self
            .pods
            .iter()
            .map(|p| (p.name.clone(), p.clone()))
            .collect();
        plan(&RecordInput {
            config: &self.config,
            target: &self.target,
            previous: &self.previous,
            pods: &pods,
            nodes: &self.nodes,
            now: &self.now,
        })
    }

    /// Runs the plan and makes its records the previous status, as the controller does.
    fn step(&mut self) -> RecordPlan {
        let plan = self.plan();
        self.previous.pod_states = plan.pod_states.clone();
        plan
    }
}

#[test]
fn records_ready_bound_pods_with_configured_labels_and_ips() {
    let mut c = Case::new();
    c.pods = vec![pod("db-0", "n1", true), pod("db-1", "n2", true)];
    let p = c.plan();
    assert_eq!(p.pod_states.len(), 2);
    let r = &p.pod_states["db-0"];
    assert_eq!(r.node_name, "n1");
    assert_eq!(
        r.node_topology_labels,
        [("kubernetes.io/hostname", "n1"), ("zone", "a")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    );
    assert_eq!(r.pod_ips, vec!["10.0.0.4"]);
    assert_eq!(r.pod_uid.as_deref(), Some("uid-db-0"));
    assert_eq!(r.recorded_at, Some(t(0)));
    assert_eq!(
        p.changes[0],
        RecordChange::Recorded {
            pod: "db-0".into(),
            node: "n1".into()
        }
    );
}

#[test]
fn skips_pods_that_are_not_ready_bound_live_and_ours() {
    let mut c = Case::new();
    let mut terminating = pod("db-1", "n1", true);
    terminating.terminating = true;
    let mut foreign = pod("db-2", "n1", true);
    foreign.controller_uid = Some("old-sts".into());
    let unknown_node = pod("db-0", "n9", true);
    c.pods = vec![pod("db-3", "", true), terminating, foreign, unknown_node];
    c.target = target(4, 0);
    let p = c.plan();
    assert!(p.pod_states.is_empty(), "{:?}", p.pod_states);
    c.pods = vec![pod("db-0", "n1", false)];
    assert!(c.plan().pod_states.is_empty());
}

#[test]
fn unchanged_pod_writes_nothing_and_keeps_its_time() {
    let mut c = Case::new();
    c.pods = vec![pod("db-0", "n1", true)];
    c.step();
    c.now = t(60);
    let p = c.step();
    assert!(p.changes.is_empty(), "{:?}", p.changes);
    assert_eq!(p.pod_states["db-0"].recorded_at, Some(t(0)));
}

#[test]
fn ready_on_another_node_moves_the_pin() {
    let mut c = Case::new();
    c.pods = vec![pod("db-0", "n1", true)];
    c.step();
    c.pods = vec![pod("db-0", "n2", true)];
    c.now = t(10);
    let p = c.step();
    assert_eq!(
        p.changes,
        vec![RecordChange::Moved {
            pod: "db-0".into(),
            from: "n1".into(),
            to: "n2".into()
        }]
    );
    assert_eq!(p.pod_states["db-0"].node_name, "n2");
    assert_eq!(p.pod_states["db-0"].recorded_at, Some(t(10)));
}

#[test]
fn terminating_or_absent_pod_in_range_keeps_its_record() {
    let mut c = Case::new();
    c.pods = vec![pod("db-0", "n1", true), pod("db-1", "n1", true)];
    c.step();
    let mut rebuilding = pod("db-0", "n1", false);
    rebuilding.terminating = true;
    c.pods = vec![rebuilding]; // db-0 terminating, db-1 gone: both in range
    let p = c.step();
    assert_eq!(p.pod_states.len(), 2);
    assert!(p.changes.is_empty(), "{:?}", p.changes);
}

#[test]
fn when_scaled_prunes_out_of_range_once_no_pod_holds_the_name() {
    let mut c = Case::new();
    c.target = target(3, 5);
    c.pods = ["db-5", "db-6", "db-7"]
        .iter()
        .map(|n| pod(n, "n1", true))
        .collect();
    assert_eq!(
        c.step().pod_states.len(),
        3,
        "ordinals.start = 5 is honoured"
    );
    c.target = target(1, 5);
    let mut leaving = pod("db-7", "n1", false);
    leaving.terminating = true;
    c.pods = vec![pod("db-5", "n1", true), leaving];
    let p = c.step();
    assert_eq!(p.changes, vec![RecordChange::Pruned { pod: "db-6".into() }]);
    assert!(p.pod_states.contains_key("db-7"), "its pod still exists");
    c.pods.truncate(1);
    let p = c.step();
    assert_eq!(p.changes, vec![RecordChange::Pruned { pod: "db-7".into() }]);
    assert_eq!(p.pod_states.keys().collect::<Vec<_>>(), vec!["db-5"]);
}

#[test]
fn when_deleted_keeps_records_through_scale_down() {
    let mut c = Case::new();
    c.config = config(RecordRetention::WhenDeleted, NodeLossAction::Wait);
    c.pods = vec![pod("db-0", "n1", true), pod("db-2", "n2", true)];
    c.step();
    c.target = target(0, 0);
    c.pods.clear();
    let p = c.step();
    assert_eq!(p.pod_states.len(), 2);
    assert!(p.changes.is_empty());
}

#[test]
fn records_of_an_earlier_statefulset_with_the_same_name_are_dropped() {
    let mut c = Case::new();
    c.pods = vec![pod("db-0", "n1", true)];
    c.step();
    c.previous.target_uid = Some("sts-0".into());
    c.pods.clear();
    let p = c.step();
    assert!(p.pod_states.is_empty());
    assert_eq!(p.changes, vec![RecordChange::TargetReplaced { dropped: 1 }]);
}

#[test]
fn records_kept_for_adoption_go_to_the_next_statefulset_of_the_name() {
    let mut c = Case::new();
    c.pods = vec![pod("db-0", "n1", true), pod("db-1", "n2", true)];
    c.step();
    // Deleted with --cascade=orphan and re-created: db-1 is being rebuilt, db-0 runs on and
    // is adopted by the new StatefulSet (its controller reference names the new UID).
    c.previous.target_uid = Some("sts-0".into());
    c.target.adopts_records = true;
    c.pods = vec![pod("db-0", "n1", true)];
    let p = c.step();
    assert_eq!(p.changes, vec![RecordChange::Adopted { records: 2 }]);
    assert_eq!(
        p.pod_states.keys().collect::<Vec<_>>(),
        ["db-0", "db-1"],
        "db-1 keeps its record while it is rebuilt"
    );
    assert_eq!(p.pod_states["db-1"].node_name, "n2");
}

#[test]
fn missing_node_falls_back_after_the_grace_period() {
    let mut c = Case::new();
    c.pods = vec![pod("db-0", "n1", true)];
    c.step();
    c.pods.clear(); // the pod is being rebuilt
    c.nodes.remove("n1");
    c.now = t(100);
    let p = c.step();
    assert_eq!(p.pod_states["db-0"].node_lost_at, Some(t(100)));
    assert!(!p.pod_states["db-0"].preferred_only);
    assert_eq!(p.requeue_after, Some(Duration::from_secs(300)));
    assert!(matches!(p.lost[0].state, LostPinState::Grace { .. }));
    assert!(p.lost[0].missing);
    c.now = t(250);
    assert_eq!(c.step().requeue_after, Some(Duration::from_secs(150)));
    c.now = t(400);
    let p = c.step();
    assert!(p.pod_states["db-0"].preferred_only);
    assert_eq!(p.lost[0].state, LostPinState::FellBack);
    assert_eq!(
        p.changes,
        vec![RecordChange::FellBack {
            pod: "db-0".into(),
            node: "n1".into()
        }]
    );
    assert_eq!(p.requeue_after, None);
    let cond = node_lost_condition(&p.lost, c.config.node_loss_after);
    assert!(cond.status);
    assert_eq!(cond.reason, "FellBackToPreferred");
    assert!(
        cond.message.contains("db-0: node n1 is gone"),
        "{}",
        cond.message
    );
    // The node comes back: the pin is whole again.
    c.nodes.extend([node("n1", NodeHealth::Ready)]);
    let p = c.step();
    assert!(!p.pod_states["db-0"].preferred_only);
    assert_eq!(p.pod_states["db-0"].node_lost_at, None);
    assert!(p.lost.is_empty());
    assert!(!node_lost_condition(&p.lost, c.config.node_loss_after).status);
}

#[test]
fn not_ready_node_counts_from_its_transition_and_wait_keeps_the_pin() {
    let mut c = Case::new();
    c.config = config(RecordRetention::WhenScaled, NodeLossAction::Wait);
    c.pods = vec![pod("db-0", "n1", true)];
    c.step();
    c.pods.clear();
    c.nodes.extend([node(
        "n1",
        NodeHealth::NotReady {
            since: Some(t(-600)),
        },
    )]);
    let p = c.step();
    assert_eq!(p.lost[0].state, LostPinState::Waiting);
    assert!(!p.lost[0].missing);
    assert!(!p.pod_states["db-0"].preferred_only);
    assert_eq!(p.pod_states["db-0"].node_lost_at, Some(t(-600)));
    let cond = node_lost_condition(&p.lost, c.config.node_loss_after);
    assert_eq!(cond.reason, "WaitingForNode");
    assert!(cond.message.contains("stays Pending"), "{}", cond.message);
}

#[test]
fn stranded_pods_are_the_pending_ones_pinned_before_the_fallback() {
    let lost_at = t(0);
    let after = Duration::from_secs(300);
    let record = |preferred_only: bool| PodState {
        node_name: "gone".into(),
        node_lost_at: Some(lost_at.clone()),
        preferred_only,
        ..Default::default()
    };
    // (case, record preferred-only, node, terminating, pinned-by, created at, stranded)
    let cases: [(&str, bool, &str, bool, &str, i64, bool); 7] = [
        (
            "pending, pinned before the fallback",
            true,
            "",
            false,
            "db",
            10,
            true,
        ),
        (
            "created after the fallback",
            true,
            "",
            false,
            "db",
            301,
            false,
        ),
        (
            "still in the grace period",
            false,
            "",
            false,
            "db",
            10,
            false,
        ),
        ("bound", true, "n1", false, "db", 10, false),
        ("terminating", true, "", true, "db", 10, false),
        ("pinned by another", true, "", false, "other", 10, false),
        ("not pinned", true, "", false, "", 10, false),
    ];
    for (case, preferred_only, node, terminating, pinned_by, created, want) in cases {
        let mut p = pod("db-0", node, false);
        p.terminating = terminating;
        p.created_ms = Some(t(created).0.as_millisecond());
        if !pinned_by.is_empty() {
            p.annotations.insert(PINNED_BY.into(), pinned_by.into());
        }
        let pods = BTreeMap::from([("db-0".to_string(), p)]);
        let records = BTreeMap::from([("db-0".to_string(), record(preferred_only))]);
        let got = stranded_pods("db", true, after, &records, &pods);
        assert_eq!(!got.is_empty(), want, "{case}");
        assert!(
            stranded_pods("db", false, after, &records, &pods).is_empty(),
            "{case}: nothing is stranded without required topology"
        );
    }
}

/// A recorded annotation value is bounded like the schema bounds it: a pod author's longer value
/// is not copied into the status (the status write would be refused, and every component that
/// caches the PersistentPodState would hold it).
#[test]
fn an_annotation_value_over_the_bound_is_not_recorded() {
    let mut c = Case::new();
    c.config.annotation_keys = vec!["short".into(), "long".into()];
    let mut p = pod("db-0", "n1", true);
    p.annotations
        .insert("short".into(), "x".repeat(MAX_RECORDED_ANNOTATION_LENGTH));
    p.annotations.insert(
        "long".into(),
        "x".repeat(MAX_RECORDED_ANNOTATION_LENGTH + 1),
    );
    c.pods = vec![p];
    let recorded = &c.plan().pod_states["db-0"].annotations;
    assert_eq!(recorded.keys().collect::<Vec<_>>(), ["short"]);
}

/// An Advanced StatefulSet of `replicas` with `reserve` reserved and `ordinals.start` `start`.
fn kruise_target(replicas: u32, start: u32, reserve: serde_json::Value) -> TargetView {
    let entries = serde_json::from_value::<Vec<ipkeep_api::kruise::ReserveOrdinal>>(reserve);
    TargetView {
        ordinals: ValidOrdinals::kruise(
            replicas,
            start,
            &ReservedOrdinals::parse(&entries.unwrap()).unwrap(),
        ),
        ..target(replicas, 0)
    }
}

/// Reserving ordinal 1 of an Advanced StatefulSet of 3 condemns db-1 without any change of
/// `replicas` (Kruise deletes it and creates db-3): `WhenScaled` prunes its record once the pod
/// is gone.
#[test]
fn when_scaled_prunes_a_reserved_ordinal() {
    let mut c = Case::new();
    c.target = kruise_target(3, 0, serde_json::json!([]));
    c.pods = ["db-0", "db-1", "db-2"]
        .iter()
        .map(|n| pod(n, "n1", true))
        .collect();
    assert_eq!(c.step().pod_states.len(), 3);
    c.target = kruise_target(3, 0, serde_json::json!([1]));
    let mut leaving = pod("db-1", "n1", false);
    leaving.terminating = true;
    c.pods = vec![pod("db-0", "n1", true), leaving, pod("db-2", "n1", true)];
    assert!(c.step().changes.is_empty(), "db-1's pod still exists");
    c.pods = vec![
        pod("db-0", "n1", true),
        pod("db-2", "n1", true),
        pod("db-3", "n2", true),
    ];
    let p = c.step();
    assert_eq!(
        p.changes,
        vec![
            RecordChange::Pruned { pod: "db-1".into() },
            RecordChange::Recorded {
                pod: "db-3".into(),
                node: "n2".into()
            },
        ]
    );
    assert_eq!(
        p.pod_states.keys().collect::<Vec<_>>(),
        ["db-0", "db-2", "db-3"]
    );
}

/// Under `WhenDeleted` a reserved ordinal's record stays; un-reserving it gives db-1 the same
/// record (node and addresses) back.
#[test]
fn when_deleted_keeps_a_reserved_ordinal_for_its_return() {
    let mut c = Case::new();
    c.config = config(RecordRetention::WhenDeleted, NodeLossAction::Wait);
    c.target = kruise_target(3, 0, serde_json::json!([]));
    c.pods = vec![
        pod("db-0", "n1", true),
        pod("db-1", "n2", true),
        pod("db-2", "n1", true),
    ];
    let first = c.step().pod_states["db-1"].clone();
    c.target = kruise_target(3, 0, serde_json::json!(["1-1"]));
    c.pods = vec![
        pod("db-0", "n1", true),
        pod("db-2", "n1", true),
        pod("db-3", "n1", true),
    ];
    let reserved = c.step();
    assert_eq!(reserved.pod_states["db-1"], first, "kept while reserved");
    c.target = kruise_target(3, 0, serde_json::json!([]));
    c.pods = vec![pod("db-0", "n1", true), pod("db-2", "n1", true)];
    let back = c.step();
    assert_eq!(
        back.pod_states["db-1"], first,
        "the same record to pin db-1 with"
    );
    assert!(
        back.changes.is_empty(),
        "nothing pruned: {:?}",
        back.changes
    );
}

/// `ordinals.start` 2 on an Advanced StatefulSet of 2: Kruise's gate decides whether db-0,db-1
/// or db-2,db-3 run; neither reading's records are pruned, an ordinal outside both is.
#[test]
fn a_kruise_start_prunes_only_what_neither_reading_wants() {
    let mut c = Case::new();
    c.target = kruise_target(4, 0, serde_json::json!([]));
    c.pods = ["db-0", "db-1", "db-2", "db-3"]
        .iter()
        .map(|n| pod(n, "n1", true))
        .collect();
    c.step();
    c.target = kruise_target(2, 2, serde_json::json!([]));
    c.pods.clear();
    let p = c.step();
    assert!(p.changes.is_empty(), "{:?}", p.changes);
    c.target = kruise_target(1, 2, serde_json::json!([]));
    let p = c.step();
    assert_eq!(
        p.changes,
        vec![
            RecordChange::Pruned { pod: "db-1".into() },
            RecordChange::Pruned { pod: "db-3".into() },
        ]
    );
    assert_eq!(p.pod_states.keys().collect::<Vec<_>>(), ["db-0", "db-2"]);
}
