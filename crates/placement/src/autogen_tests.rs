#![allow(clippy::unwrap_used)]

use super::*;

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn off_unless_exactly_true() {
    for value in [None, Some("false"), Some("yes"), Some("True")] {
        let mut a = ann(&[(keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname")]);
        if let Some(v) = value {
            a.insert(keys::AUTO_GENERATE.into(), v.into());
        }
        assert_eq!(generated_spec("db", Some(&a), None), Ok(None), "{value:?}");
    }
    assert_eq!(generated_spec("db", None, None), Ok(None));
}

#[test]
fn builds_trimmed_required_and_weight_100_preferred() {
    let a = ann(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, " kubernetes.io/hostname "),
        (
            keys::PREFERRED_TOPOLOGY,
            "topology.kubernetes.io/zone, topology.kubernetes.io/region",
        ),
        (keys::IP_RETENTION, "2h"),
    ]);
    let spec = generated_spec("db", Some(&a), None).unwrap().unwrap().spec;
    assert_eq!(spec.target_ref.name, "db");
    assert_eq!(spec.target_ref.kind, "StatefulSet");
    assert_eq!(
        spec.required_persistent_topology
            .unwrap()
            .node_topology_keys,
        vec!["kubernetes.io/hostname"]
    );
    assert_eq!(spec.preferred_persistent_topology[0].weight, 100);
    assert_eq!(
        spec.preferred_persistent_topology[0]
            .preference
            .node_topology_keys,
        vec![
            "topology.kubernetes.io/zone",
            "topology.kubernetes.io/region"
        ]
    );
    assert_eq!(spec.ip_retention, "2h");
}

#[test]
fn kruise_spellings_work_and_ipkeep_wins() {
    let a = ann(&[
        (keys::KRUISE_AUTO_GENERATE, "true"),
        (keys::KRUISE_PREFERRED_TOPOLOGY, "kubernetes.io/hostname"),
        (keys::KRUISE_REQUIRED_TOPOLOGY, "zone-a"),
        (keys::REQUIRED_TOPOLOGY, "topology.kubernetes.io/zone"),
    ]);
    let spec = generated_spec("db", Some(&a), None).unwrap().unwrap().spec;
    assert_eq!(
        spec.required_persistent_topology
            .unwrap()
            .node_topology_keys,
        vec!["topology.kubernetes.io/zone"]
    );
    assert_eq!(spec.ip_retention, DEFAULT_IP_RETENTION);
}

#[test]
fn refuses_incomplete_or_invalid_annotations() {
    let a = ann(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, " , "),
    ]);
    assert_eq!(
        generated_spec("db", Some(&a), None),
        Err(AutoGenerateError::NoTopology)
    );
    let a = ann(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, "Not A Key"),
    ]);
    assert!(matches!(
        generated_spec("db", Some(&a), None),
        Err(AutoGenerateError::Invalid(SpecError::InvalidKey { .. }))
    ));
    let a = ann(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
        (keys::IP_RETENTION, "a while"),
    ]);
    assert!(matches!(
        generated_spec("db", Some(&a), None),
        Err(AutoGenerateError::Invalid(SpecError::BadRetention(_)))
    ));
}

#[test]
fn node_loss_policy_from_annotations() {
    let base = [
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
    ];
    let spec = |extra: &[(&str, &str)]| {
        let mut a = ann(&base);
        a.extend(ann(extra));
        generated_spec("db", Some(&a), None)
    };
    assert_eq!(
        spec(&[]).unwrap().unwrap().spec.node_loss_policy,
        NodeLossPolicy::default()
    );
    let p = spec(&[
        (keys::NODE_LOSS_ACTION, " Wait "),
        (keys::NODE_LOSS_AFTER, "30s"),
    ])
    .unwrap()
    .unwrap()
    .spec
    .node_loss_policy;
    assert_eq!((p.action, p.after.as_str()), (NodeLossAction::Wait, "30s"));
    let err = spec(&[(keys::NODE_LOSS_ACTION, "wait")]).unwrap_err();
    assert!(
        err.to_string().contains("FallbackToPreferred or Wait"),
        "{err}"
    );
    assert!(matches!(
        spec(&[(keys::NODE_LOSS_AFTER, "soon")]),
        Err(AutoGenerateError::Invalid(_))
    ));
}

/// The StatefulSet's annotation decides when it is there, whatever the namespace says; the
/// namespace's label decides for the others.
#[test]
fn the_statefulset_annotation_wins_over_the_namespace_label() {
    let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
    let other_label = ann(&[(keys::AUTO_GENERATE, "false")]);
    let unrelated = ann(&[("team", "payments")]);
    let host = (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname");
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Option<&'a BTreeMap<String, String>>,
        Option<GeneratedBy>,
    );
    let cases: Vec<Case> = vec![
        ("no annotation, no label", vec![], None, None),
        (
            "no annotation, unrelated labels",
            vec![],
            Some(&unrelated),
            None,
        ),
        (
            "no annotation, label false",
            vec![],
            Some(&other_label),
            None,
        ),
        (
            "no annotation, label true",
            vec![],
            Some(&labelled),
            Some(GeneratedBy::NamespaceLabel),
        ),
        (
            "topology annotations only, label true",
            vec![host],
            Some(&labelled),
            Some(GeneratedBy::NamespaceLabel),
        ),
        (
            "annotation false opts out of the label",
            vec![(keys::AUTO_GENERATE, "false"), host],
            Some(&labelled),
            None,
        ),
        (
            "OpenKruise's spelling false opts out too",
            vec![(keys::KRUISE_AUTO_GENERATE, "false")],
            Some(&labelled),
            None,
        ),
        (
            "any other annotation value opts out",
            vec![(keys::AUTO_GENERATE, "yes")],
            Some(&labelled),
            None,
        ),
        (
            "ipkeep's false beats OpenKruise's true",
            vec![
                (keys::AUTO_GENERATE, "false"),
                (keys::KRUISE_AUTO_GENERATE, "true"),
            ],
            Some(&labelled),
            None,
        ),
        (
            "annotation true, no label",
            vec![(keys::AUTO_GENERATE, "true"), host],
            None,
            Some(GeneratedBy::Annotation),
        ),
        (
            "annotation true, label false",
            vec![(keys::AUTO_GENERATE, " true "), host],
            Some(&other_label),
            Some(GeneratedBy::Annotation),
        ),
        (
            "annotation true, label true",
            vec![(keys::AUTO_GENERATE, "true")],
            Some(&labelled),
            Some(GeneratedBy::Annotation),
        ),
    ];
    for (what, annotations, labels, expected) in cases {
        let got = generated_spec("db", Some(&ann(&annotations)), labels)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .map(|g| g.by);
        assert_eq!(got, expected, "{what}");
    }
    assert_eq!(
        generated_spec("db", None, Some(&labelled))
            .unwrap()
            .unwrap()
            .by,
        GeneratedBy::NamespaceLabel,
        "a StatefulSet without any annotation"
    );
}

/// What a StatefulSet with no annotation gets from its namespace's label: pinned to its node,
/// and every other field as the annotated path defaults it.
#[test]
fn the_namespace_label_alone_pins_by_hostname_with_the_annotation_defaults() {
    let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
    let from_label = generated_spec("db", None, Some(&labelled))
        .unwrap()
        .unwrap()
        .spec;
    let annotated = ann(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, keys::HOSTNAME_LABEL),
    ]);
    let from_annotations = generated_spec("db", Some(&annotated), None)
        .unwrap()
        .unwrap()
        .spec;
    assert_eq!(from_label, from_annotations);
    assert_eq!(
        from_label
            .required_persistent_topology
            .unwrap()
            .node_topology_keys,
        vec!["kubernetes.io/hostname"]
    );
    assert!(from_label.preferred_persistent_topology.is_empty());
    assert_eq!(from_label.ip_retention, DEFAULT_IP_RETENTION);
    assert_eq!(from_label.node_loss_policy, NodeLossPolicy::default());
    assert_eq!(
        from_label.persistent_pod_state_retention_policy,
        RecordRetention::WhenScaled
    );
    assert_eq!(from_label.lifecycle, None);
}

/// In a labelled namespace the StatefulSet's other annotations still shape the spec, and a
/// topology annotation replaces the default rather than adding to it.
#[test]
fn in_a_labelled_namespace_the_annotations_shape_the_spec() {
    let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
    let a = ann(&[
        (keys::PREFERRED_TOPOLOGY, "topology.kubernetes.io/zone"),
        (keys::IP_RETENTION, "forever"),
        (keys::NODE_LOSS_ACTION, "Wait"),
    ]);
    let g = generated_spec("db", Some(&a), Some(&labelled))
        .unwrap()
        .unwrap();
    assert_eq!(g.by, GeneratedBy::NamespaceLabel);
    assert_eq!(
        g.spec.required_persistent_topology, None,
        "no default added"
    );
    assert_eq!(
        g.spec.preferred_persistent_topology[0]
            .preference
            .node_topology_keys,
        vec!["topology.kubernetes.io/zone"]
    );
    assert_eq!(g.spec.ip_retention, "forever");
    assert_eq!(g.spec.node_loss_policy.action, NodeLossAction::Wait);

    // An annotated StatefulSet without a topology key is refused outside a labelled
    // namespace, and pinned by hostname inside one.
    let bare = ann(&[(keys::AUTO_GENERATE, "true")]);
    assert_eq!(
        generated_spec("db", Some(&bare), None),
        Err(AutoGenerateError::NoTopology)
    );
    let g = generated_spec("db", Some(&bare), Some(&labelled))
        .unwrap()
        .unwrap();
    assert_eq!(
        g.spec
            .required_persistent_topology
            .unwrap()
            .node_topology_keys,
        vec![keys::HOSTNAME_LABEL]
    );

    // Invalid annotations are refused on either path.
    let bad = ann(&[(keys::IP_RETENTION, "a while")]);
    assert!(matches!(
        generated_spec("db", Some(&bad), Some(&labelled)),
        Err(AutoGenerateError::Invalid(SpecError::BadRetention(_)))
    ));
}

/// A PersistentPodState `name` targeting StatefulSet `target`, controlled by `controller` (kind,
/// name, UID) if any, with the adoption annotation if `marked`.
fn pps(
    name: &str,
    target: &str,
    controller: Option<(&str, &str, &str)>,
    marked: bool,
) -> PersistentPodState {
    let owners: Vec<serde_json::Value> = controller
        .into_iter()
        .map(|(kind, name, uid)| {
            serde_json::json!({"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true})
        })
        .collect();
    let annotations = if marked {
        serde_json::json!({keys::ADOPT_PERSISTENT_POD_STATE: "true"})
    } else {
        serde_json::json!({})
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": name, "namespace": "prod", "uid": format!("uid-{name}"),
                     "ownerReferences": owners, "annotations": annotations},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": target}},
    }))
    .unwrap()
}

/// `pps` with the spec StatefulSet `db` with annotations `a` generates.
fn generated(mut pps: PersistentPodState, a: &BTreeMap<String, String>) -> PersistentPodState {
    pps.spec = generated_spec("db", Some(a), None).unwrap().unwrap().spec;
    pps
}

/// The current StatefulSet `db`'s UID.
const UID: &str = "sts-now";

fn decide_for(
    annotations: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
    existing: Existing,
    targeting: &[&PersistentPodState],
) -> GenerateAction {
    decide(&GenerateInput {
        workload: Workload::Native,
        name: "db",
        namespace: "prod",
        uid: UID,
        annotations: Some(annotations),
        deleting: false,
        namespace_labels: labels,
        existing,
        targeting,
    })
}

fn on() -> BTreeMap<String, String> {
    ann(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
    ])
}

fn adopting() -> BTreeMap<String, String> {
    let mut a = on();
    a.insert(keys::ADOPT_PERSISTENT_POD_STATE.into(), "true".into());
    a
}

fn off() -> BTreeMap<String, String> {
    ann(&[(keys::AUTO_GENERATE, "false")])
}

/// The kind of action, with what tells the cases apart.
fn short(action: &GenerateAction) -> String {
    match action {
        GenerateAction::Apply {
            verb, adopt_marker, ..
        } => format!("apply {verb:?} marker={adopt_marker}"),
        GenerateAction::DeleteOwned { uid, why } => format!("delete owned {uid:?} {why:?}"),
        GenerateAction::DeleteStale { uid } => format!("delete stale {uid:?}"),
        GenerateAction::Refuse(Refusal::Invalid(_)) => "refuse invalid".into(),
        GenerateAction::Refuse(Refusal::NotOwned(by)) => format!("refuse not owned {by:?}"),
        GenerateAction::StandAside(why) => format!("aside {why:?}"),
        GenerateAction::Unchanged => "unchanged".into(),
    }
}

/// Ownership, adoption and what an earlier StatefulSet of the name left: the PersistentPodState
/// of the name is written only when it is this StatefulSet's own, or taken over.
#[test]
fn only_its_own_persistent_pod_state_is_written_or_one_it_may_adopt() {
    let own = Some(("StatefulSet", "db", UID));
    let earlier = Some(("StatefulSet", "db", "sts-before"));
    let clone_set = Some(("CloneSet", "db", "cs"));
    let mut bad = on();
    bad.insert(keys::IP_RETENTION.into(), "a while".into());
    type Case<'a> = (
        &'a str,
        BTreeMap<String, String>,
        Option<PersistentPodState>,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        ("none yet", on(), None, "apply Created marker=false"),
        (
            "its own, as generated",
            on(),
            Some(generated(pps("db", "db", own, false), &on())),
            "unchanged",
        ),
        (
            "its own, another spec",
            on(),
            Some(pps("db", "db", own, false)),
            "apply Updated marker=false",
        ),
        (
            "its own, the adoption annotation added",
            adopting(),
            Some(generated(pps("db", "db", own, false), &on())),
            "apply Updated marker=true",
        ),
        (
            "its own, the adoption annotation removed",
            on(),
            Some(generated(pps("db", "db", own, true), &on())),
            "apply Updated marker=false",
        ),
        (
            "its own, generation turned off",
            off(),
            Some(pps("db", "db", own, false)),
            r#"delete owned Some("uid-db") Off"#,
        ),
        (
            "someone else's, generation off",
            off(),
            Some(pps("db", "db", None, false)),
            "aside Off",
        ),
        ("none, generation off", off(), None, "aside Off"),
        (
            "invalid annotations leave its own as it is",
            bad.clone(),
            Some(pps("db", "db", own, false)),
            "refuse invalid",
        ),
        ("invalid annotations, none yet", bad, None, "refuse invalid"),
        (
            "left by an earlier StatefulSet of the name",
            on(),
            Some(pps("db", "db", earlier, false)),
            r#"delete stale Some("uid-db")"#,
        ),
        (
            "left by an earlier one, adopted",
            adopting(),
            Some(pps("db", "db", earlier, true)),
            "apply Adopted marker=true",
        ),
        (
            "orphaned, not adopted",
            on(),
            Some(pps("db", "db", None, false)),
            "refuse not owned Annotation",
        ),
        (
            "orphaned, adopted",
            adopting(),
            Some(pps("db", "db", None, false)),
            "apply Adopted marker=true",
        ),
        (
            "targeting another StatefulSet: not adoptable",
            adopting(),
            Some(pps("db", "web", None, false)),
            "refuse not owned Annotation",
        ),
        (
            "controlled by something else: not adoptable",
            adopting(),
            Some(pps("db", "db", clone_set, false)),
            "refuse not owned Annotation",
        ),
        (
            "controlled by another StatefulSet name: not stale, not adoptable",
            adopting(),
            Some(pps("db", "db", Some(("StatefulSet", "web", "w")), false)),
            "refuse not owned Annotation",
        ),
    ];
    for (what, annotations, existing, expected) in cases {
        let existing = existing
            .as_ref()
            .map_or(Existing::Absent, Existing::Decoded);
        let got = decide_for(&annotations, None, existing, &[]);
        assert_eq!(short(&got), expected, "{what}");
    }
}

/// A PersistentPodState that does not decode is never applied over, and a StatefulSet being
/// deleted writes nothing, whatever else holds.
#[test]
fn an_undecodable_persistent_pod_state_or_a_deleted_statefulset_writes_nothing() {
    for annotations in [on(), adopting(), off()] {
        let got = decide_for(&annotations, None, Existing::Undecodable, &[]);
        assert_eq!(got, GenerateAction::StandAside(Aside::Undecodable));
    }
    let own = pps("db", "db", Some(("StatefulSet", "db", UID)), false);
    let input = GenerateInput {
        workload: Workload::Native,
        name: "db",
        namespace: "prod",
        uid: UID,
        annotations: Some(&off()),
        deleting: true,
        namespace_labels: None,
        existing: Existing::Decoded(&own),
        targeting: &[],
    };
    assert_eq!(decide(&input), GenerateAction::StandAside(Aside::Deleting));
}

/// A StatefulSet that only its namespace's label turned on stands aside for a PersistentPodState
/// written for it, under any name; one that asks by its own annotation, or adopts, does not.
#[test]
fn a_statefulset_only_the_namespace_asked_for_stands_aside_for_one_written_for_it() {
    let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
    let none = BTreeMap::new();
    let marker = ann(&[(keys::ADOPT_PERSISTENT_POD_STATE, "true")]);
    let own = pps("db", "db", Some(("StatefulSet", "db", UID)), false);
    let manual = pps("db-manual", "db", None, false);
    let another = pps("db-a", "db", None, false);
    let by_clone_set = pps("db-kruise", "db", Some(("CloneSet", "db", "cs")), false);
    let stale = pps(
        "db-old",
        "db",
        Some(("StatefulSet", "db", "sts-before")),
        false,
    );
    let orphan = pps("db", "db", None, false);
    let annotated = on();
    type Case<'a> = (
        &'a str,
        &'a BTreeMap<String, String>,
        Option<&'a PersistentPodState>,
        Vec<&'a PersistentPodState>,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "one written by hand: none generated",
            &none,
            None,
            vec![&manual],
            r#"aside WrittenFor("db-manual")"#,
        ),
        (
            "one written by hand: the generated one goes",
            &none,
            Some(&own),
            vec![&own, &manual],
            r#"delete owned Some("uid-db") WrittenFor("db-manual")"#,
        ),
        (
            "two written by hand: the first by name is named",
            &none,
            None,
            vec![&manual, &another],
            r#"aside WrittenFor("db-a")"#,
        ),
        (
            "controlled by something other than a StatefulSet counts as written for it",
            &none,
            None,
            vec![&by_clone_set],
            r#"aside WrittenFor("db-kruise")"#,
        ),
        (
            "one generated for an earlier StatefulSet does not",
            &none,
            None,
            vec![&stale],
            "apply Created marker=false",
        ),
        (
            "its own generated one does not",
            &none,
            Some(&own),
            vec![&own],
            "apply Updated marker=false",
        ),
        (
            "an orphan of its name written for it: aside, no Warning",
            &none,
            Some(&orphan),
            vec![&orphan],
            r#"aside WrittenFor("db")"#,
        ),
        (
            "an orphan of its name, adopted",
            &marker,
            Some(&orphan),
            vec![&orphan, &manual],
            "apply Adopted marker=true",
        ),
        (
            "its own annotation asks: no standing aside",
            &annotated,
            None,
            vec![&manual],
            "apply Created marker=false",
        ),
    ];
    for (what, annotations, existing, targeting, expected) in cases {
        let existing = existing.map_or(Existing::Absent, Existing::Decoded);
        let got = decide_for(annotations, Some(&labelled), existing, &targeting);
        assert_eq!(short(&got), expected, "{what}");
    }
    // Outside a labelled namespace nothing asks, so nothing stands aside either.
    let got = decide_for(&none, None, Existing::Absent, &[&manual]);
    assert_eq!(got, GenerateAction::StandAside(Aside::Off));
}

/// What each action tells the StatefulSet, and that quiet ones tell nothing.
#[test]
fn each_write_and_refusal_says_why_on_the_statefulset() {
    let labelled = ann(&[(keys::AUTO_GENERATE, "true")]);
    let input = GenerateInput {
        workload: Workload::Native,
        name: "db",
        namespace: "prod",
        uid: UID,
        annotations: None,
        deleting: false,
        namespace_labels: Some(&labelled),
        existing: Existing::Absent,
        targeting: &[],
    };
    let apply = decide(&input);
    let notice = apply.notice(&input).unwrap();
    assert_eq!(
        (notice.warning, notice.reason),
        (false, "PersistentPodStateCreated")
    );
    assert!(
        notice.note.contains("namespace prod is labelled"),
        "{}",
        notice.note
    );
    let refused = GenerateAction::Refuse(Refusal::NotOwned(GeneratedBy::NamespaceLabel));
    let notice = refused.notice(&input).unwrap();
    assert_eq!(
        (notice.warning, notice.reason),
        (true, "PersistentPodStateNotOwned")
    );
    assert!(
        notice.note.contains(keys::ADOPT_PERSISTENT_POD_STATE)
            && notice
                .note
                .contains("auto-generate-persistent-pod-state=\"false\""),
        "names both ways out: {}",
        notice.note
    );
    let deleted = GenerateAction::DeleteOwned {
        uid: None,
        why: Unwanted::WrittenFor("db-manual".into()),
    };
    let notice = deleted.notice(&input).unwrap();
    assert_eq!(notice.reason, "PersistentPodStateDeleted");
    assert!(
        notice
            .note
            .starts_with("PersistentPodState db-manual was written")
    );
    for quiet in [
        GenerateAction::DeleteStale { uid: None },
        GenerateAction::StandAside(Aside::Off),
        GenerateAction::Unchanged,
    ] {
        assert_eq!(quiet.notice(&input), None, "{quiet:?}");
    }
}

#[test]
fn only_a_persistent_pod_state_left_for_this_name_can_be_adopted() {
    assert!(
        adoptable(&pps("db", "db", None, false), Workload::Native, "db"),
        "orphaned"
    );
    assert!(
        adoptable(
            &pps("db", "db", Some(("StatefulSet", "db", "old")), false),
            Workload::Native,
            "db"
        ),
        "left by an earlier StatefulSet of the name"
    );
    assert!(
        !adoptable(&pps("db", "web", None, false), Workload::Native, "db"),
        "targets another"
    );
    assert!(
        !adoptable(
            &pps("db", "db", Some(("CloneSet", "db", "old")), false),
            Workload::Native,
            "db"
        ),
        "controlled by something else"
    );
}

#[test]
fn a_persistent_pod_state_no_statefulset_controls_was_written_for_its_target() {
    assert!(
        written_for(&pps("db", "db", None, false), Workload::Native, "db"),
        "by hand"
    );
    assert!(
        written_for(
            &pps("db", "db", Some(("CloneSet", "db", "old")), false),
            Workload::Native,
            "db"
        ),
        "controlled by something other than a StatefulSet"
    );
    assert!(
        !written_for(&pps("db", "web", None, false), Workload::Native, "db"),
        "targets another"
    );
    assert!(
        !written_for(
            &pps("db", "db", Some(("StatefulSet", "db", "old")), false),
            Workload::Native,
            "db"
        ),
        "generated"
    );
}

/// `pps` controlled by OpenKruise's Advanced StatefulSet of its controller's name (same kind,
/// group `apps.kruise.io`).
fn kruise_controlled(mut pps: PersistentPodState) -> PersistentPodState {
    for o in pps.metadata.owner_references.iter_mut().flatten() {
        o.api_version = "apps.kruise.io/v1beta1".into();
    }
    pps
}

/// Only an `apps` StatefulSet is "a StatefulSet of the name": a PersistentPodState an Advanced
/// StatefulSet of the name controls is another's, neither generated for an earlier one (so not
/// deleted as stale) nor free to adopt.
#[test]
fn an_advanced_statefulset_of_the_name_is_another_controller() {
    let theirs = kruise_controlled(pps("db", "db", Some(("StatefulSet", "db", "old")), true));
    assert!(
        !stale_generated(&theirs, Workload::Native, "db"),
        "not deleted as stale"
    );
    assert!(!adoptable(&theirs, Workload::Native, "db"), "not adopted");
    assert!(
        written_for(&theirs, Workload::Native, "db"),
        "written for db, not generated by it"
    );
    let mut targets_kruise = pps("db", "db", None, true);
    targets_kruise.spec.target_ref.api_version = "apps.kruise.io/v1beta1".into();
    assert!(
        !adoptable(&targets_kruise, Workload::Native, "db"),
        "targets another workload"
    );
    assert!(
        !written_for(&targets_kruise, Workload::Native, "db"),
        "targets another workload"
    );
}

/// An Advanced StatefulSet's annotations generate the same spec, targeting it; a
/// PersistentPodState an `apps` StatefulSet of the name generated is another's to it.
#[test]
fn an_advanced_statefulset_generates_its_own() {
    let a = on();
    let native = generated_spec("db", Some(&a), None).unwrap().unwrap();
    let kruise = generated_spec_for(Workload::Kruise, "db", Some(&a), None)
        .unwrap()
        .unwrap();
    assert_eq!(kruise.spec.target_ref.api_version, "apps.kruise.io/v1beta1");
    let mut back = kruise.spec.clone();
    back.target_ref.api_version = "apps/v1".into();
    assert_eq!(back, native.spec, "the same spec otherwise");
    let mut input = GenerateInput {
        workload: Workload::Kruise,
        name: "db",
        namespace: "prod",
        uid: UID,
        annotations: Some(&a),
        deleting: false,
        namespace_labels: None,
        existing: Existing::Absent,
        targeting: &[],
    };
    assert!(matches!(
        decide(&input),
        GenerateAction::Apply { verb: Verb::Created, ref spec, .. } if spec.target_ref.workload() == Some((Workload::Kruise, "db"))
    ));
    let native_generated = pps("db", "db", Some(("StatefulSet", "db", "old")), false);
    input.existing = Existing::Decoded(&native_generated);
    assert!(
        matches!(decide(&input), GenerateAction::Refuse(Refusal::NotOwned(_))),
        "generated by the apps StatefulSet db: not stale for the Advanced one"
    );
    let theirs = kruise_controlled(pps("db", "db", Some(("StatefulSet", "db", "old")), false));
    assert!(stale_generated(&theirs, Workload::Kruise, "db"));
    assert!(!stale_generated(&theirs, Workload::Native, "db"));
}

/// Generated from OpenKruise's spelling, the Event says so, and that Kruise's own
/// PersistentPodState must not run for the same workload; from ipkeep's, it does not.
#[test]
fn the_kruise_spelling_is_named_in_the_event() {
    let kruise = ann(&[
        (keys::KRUISE_AUTO_GENERATE, "true"),
        (keys::KRUISE_REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
    ]);
    let ours = ann(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::KRUISE_AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
    ]);
    for (annotations, named) in [(&kruise, true), (&ours, false)] {
        let input = GenerateInput {
            workload: Workload::Kruise,
            name: "db",
            namespace: "prod",
            uid: UID,
            annotations: Some(annotations),
            deleting: false,
            namespace_labels: None,
            existing: Existing::Absent,
            targeting: &[],
        };
        let note = decide(&input).notice(&input).unwrap().note;
        assert_eq!(
            note.contains("OpenKruise's spelling kruise.io/auto-generate-persistent-pod-state")
                && note.contains("keep one of the two"),
            named,
            "{note}"
        );
    }
}
