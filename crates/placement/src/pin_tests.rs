//! Table-driven tests of the pin decision and of writing it into pods: one row per pod/template
//! shape, each checked through the whole path the webhook takes (decide, then apply).

use serde_json::{Value, json};

use ipkeep_api::PersistentPodState;
use ipkeep_api::k8s_openapi::api::core::v1::Pod;
use ipkeep_api::statefulset::Workload;
use ipkeep_values::keys::{IP_RETENTION, PERSISTENT_POD_STATE, PIN_SKIPPED, PINNED_BY};

use crate::affinity;
use crate::pin::{Decision, PinOutcome, decide};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

fn owner(kind: &str, api_version: &str, name: &str, controller: bool) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": "sts-uid", "controller": controller}])
}

/// A pod of StatefulSet `db`, named `db-0`, with `spec` merged in.
fn pod(spec: Value) -> Value {
    let mut p = json!({
        "metadata": {"name": "db-0", "ownerReferences": owner("StatefulSet", "apps/v1", "db", true)},
        "spec": {"containers": [{"name": "db", "image": "postgres"}]}
    });
    merge(&mut p["spec"], spec);
    p
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}

/// A PersistentPodState `db` in `prod` for StatefulSet `db`: required hostname, preferred zone
/// (weight 60), and one record for `db-0` on node `n1` in zone `a`.
fn pps() -> Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db", "namespace": "prod"},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": [HOST]},
            "preferredPersistentTopology": [{"weight": 60, "preference": {"nodeTopologyKeys": [ZONE]}}]
        },
        "status": {"targetUID": "sts-uid", "podStates": {
            "db-0": {"nodeName": "n1", "nodeTopologyLabels": {HOST: "n1", ZONE: "a"}}
        }}
    })
}

/// `base` with the member at `path` set (its parent must exist).
fn with(mut base: Value, path: &str, value: Value) -> Value {
    let (parent, key) = path.rsplit_once('/').unwrap();
    let parent = base
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"));
    match parent {
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        other => {
            other[key] = value;
        }
    }
    base
}

fn req(key: &str, op: &str, values: &[&str]) -> Value {
    json!({"key": key, "operator": op, "values": values})
}

fn pinned_host() -> Value {
    req(HOST, "In", &["n1"])
}

fn preferred_zone() -> Value {
    json!({"weight": 60, "preference": {"matchExpressions": [req(ZONE, "In", &["a"])]}})
}

/// What a row expects.
enum Want {
    /// Passed through; the label.
    Pass(&'static str),
    /// Managed, not pinned: the reason label and the retention annotation afterwards.
    Unrecorded(&'static str, Option<&'static str>),
    /// Managed, pin skipped: the reason label and a fragment of the explanation.
    Skipped(&'static str, &'static str),
    /// Pinned: `spec.affinity.nodeAffinity` afterwards.
    Pinned(Value),
}

fn row(name: &'static str, pod: Value, pps: Option<Value>, want: Want) -> Row {
    Row {
        name,
        pod,
        namespace: "prod",
        pps,
        want,
    }
}

struct Row {
    name: &'static str,
    pod: Value,
    namespace: &'static str,
    pps: Option<Value>,
    want: Want,
}

fn rows() -> Vec<Row> {
    let both_terms = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [req("disk", "In", &["ssd"])]},
        {"matchExpressions": [req("disk", "In", &["nvme"])], "matchFields": [req("metadata.name", "NotIn", &["n9"])]}
    ]}});
    let mut failed_over = pps();
    failed_over["status"]["podStates"]["db-0"]["preferredOnly"] = json!(true);
    let mut only_required = pps();
    only_required["spec"]["preferredPersistentTopology"] = json!([]);
    let mut multi_key = pps();
    multi_key["spec"]["requiredPersistentTopology"]["nodeTopologyKeys"] = json!([HOST, ZONE]);
    vec![
        row(
            "no affinity: one required term is created",
            pod(json!({})),
            Some(pps()),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "several required terms: the pin is ANDed into each",
            pod(json!({"affinity": {"nodeAffinity": both_terms}})),
            Some(pps()),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [req("disk", "In", &["ssd"]), pinned_host()]},
                    {"matchExpressions": [req("disk", "In", &["nvme"]), pinned_host()], "matchFields": [req("metadata.name", "NotIn", &["n9"])]}
                ]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "compatible nodeSelector is left alone, affinity added",
            pod(json!({"nodeSelector": {ZONE: "a", "disk": "ssd"}})),
            Some(multi_key.clone()),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host(), req(ZONE, "In", &["a"])]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "nodeSelector for another zone: skipped, never applied",
            pod(json!({"nodeSelector": {ZONE: "b"}})),
            Some(multi_key.clone()),
            Want::Skipped(
                "conflict",
                "spec.nodeSelector requires topology.kubernetes.io/zone=b",
            ),
        ),
        row(
            "template's preferred terms are kept and ours appended",
            pod(
                json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [req("disk", "In", &["ssd"])]}}]}}}),
            ),
            Some(pps()),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 5, "preference": {"matchExpressions": [req("disk", "In", &["ssd"])]}}, preferred_zone()]})),
        ),
        row(
            "template requires zone b, record says a: skipped",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [req(ZONE, "In", &["b"])]}]}}}}),
            ),
            Some(multi_key.clone()),
            Want::Skipped("conflict", "topology.kubernetes.io/zone In [\"b\"]"),
        ),
        row(
            "one of two terms conflicts: the other still admits the record, so pinned",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [req(ZONE, "In", &["b"])]}, {"matchExpressions": [req(ZONE, "In", &["a", "c"])]}]}}}}),
            ),
            Some(multi_key.clone()),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [req(ZONE, "In", &["b"]), pinned_host(), req(ZONE, "In", &["a"])]},
                    {"matchExpressions": [req(ZONE, "In", &["a", "c"]), pinned_host(), req(ZONE, "In", &["a"])]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "multi-key required topology: both keys, one term",
            pod(json!({})),
            Some(multi_key.clone()),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host(), req(ZONE, "In", &["a"])]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "node lacked the zone label: only the hostname is pinned",
            pod(json!({})),
            Some(with(
                multi_key.clone(),
                "/status/podStates/db-0/nodeTopologyLabels",
                json!({HOST: "n1"}),
            )),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]}})),
        ),
        row(
            "node lacked every label: nothing to pin, retention only",
            pod(json!({})),
            Some(with(
                pps(),
                "/status/podStates/db-0/nodeTopologyLabels",
                json!({}),
            )),
            Want::Unrecorded("no-recorded-labels", Some("24h")),
        ),
        row(
            "node-loss fallback: required becomes a preference, nothing required",
            pod(json!({})),
            Some(failed_over),
            Want::Pinned(json!({"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [pinned_host()]}}, preferred_zone()]})),
        ),
        row(
            "required only, no preferred terms",
            pod(json!({})),
            Some(only_required),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]}})),
        ),
        row(
            "not a StatefulSet pod (ReplicaSet)",
            with(
                pod(json!({})),
                "/metadata/ownerReferences",
                owner("ReplicaSet", "apps/v1", "db", true),
            ),
            Some(pps()),
            Want::Pass("not-statefulset-pod"),
        ),
        row(
            "no owner at all",
            with(pod(json!({})), "/metadata/ownerReferences", json!([])),
            Some(pps()),
            Want::Pass("not-statefulset-pod"),
        ),
        row(
            "StatefulSet owner that is not the controller",
            with(
                pod(json!({})),
                "/metadata/ownerReferences",
                owner("StatefulSet", "apps/v1", "db", false),
            ),
            Some(pps()),
            Want::Pass("not-statefulset-pod"),
        ),
        row(
            "an OpenKruise Advanced StatefulSet's pod, with the apps StatefulSet's state of the name",
            with(
                pod(json!({})),
                "/metadata/ownerReferences",
                owner("StatefulSet", "apps.kruise.io/v1beta1", "db", true),
            ),
            Some(pps()),
            Want::Pass("other-workload"),
        ),
        row(
            "an OpenKruise Advanced StatefulSet's pod, with its own state: pinned alike",
            with(
                pod(json!({})),
                "/metadata/ownerReferences",
                owner("StatefulSet", "apps.kruise.io/v1beta1", "db", true),
            ),
            Some(with(
                pps(),
                "/spec/targetRef/apiVersion",
                json!("apps.kruise.io/v1beta1"),
            )),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "an Advanced StatefulSet's pod whose pod-index label disagrees with its name",
            with(
                with(
                    pod(json!({})),
                    "/metadata/ownerReferences",
                    owner("StatefulSet", "apps.kruise.io/v1alpha1", "db", true),
                ),
                "/metadata/labels",
                json!({"apps.kubernetes.io/pod-index": "1"}),
            ),
            Some(with(
                pps(),
                "/spec/targetRef/apiVersion",
                json!("apps.kruise.io/v1beta1"),
            )),
            Want::Unrecorded("first-creation", Some("24h")),
        ),
        row(
            "StatefulSet without a PersistentPodState",
            pod(json!({})),
            None,
            Want::Pass("no-persistentpodstate"),
        ),
        Row {
            namespace: "staging",
            ..row(
                "PersistentPodState of another namespace",
                pod(json!({})),
                Some(pps()),
                Want::Pass("other-workload"),
            )
        },
        row(
            "PersistentPodState of another StatefulSet",
            pod(json!({})),
            Some(with(pps(), "/spec/targetRef/name", json!("web"))),
            Want::Pass("other-workload"),
        ),
        row(
            "PersistentPodState of OpenKruise's Advanced StatefulSet of the same name",
            pod(json!({})),
            Some(with(
                pps(),
                "/spec/targetRef/apiVersion",
                json!("apps.kruise.io/v1beta1"),
            )),
            Want::Pass("other-workload"),
        ),
        row(
            "same pod name, but the records are of an earlier StatefulSet (other UID)",
            pod(json!({})),
            Some(with(pps(), "/status/targetUID", json!("old-uid"))),
            Want::Unrecorded("records-of-earlier-statefulset", Some("24h")),
        ),
        row(
            "records of an earlier StatefulSet, kept for adoption by the next one of the name",
            pod(json!({})),
            Some(with(
                with(pps(), "/status/targetUID", json!("old-uid")),
                "/metadata/annotations",
                json!({"ipkeep.dev/adopt-persistent-pod-state": "true"}),
            )),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "a record under a name that is not one of this StatefulSet's pods",
            with(pod(json!({})), "/metadata/name", json!("db-0x")),
            Some(with(
                pps(),
                "/status/podStates",
                json!({"db-0x": {"nodeName": "n1", "nodeTopologyLabels": {HOST: "n1"}}}),
            )),
            Want::Unrecorded("first-creation", Some("24h")),
        ),
        row(
            "first creation: retention only",
            pod(json!({})),
            Some(with(pps(), "/status/podStates", json!({}))),
            Want::Unrecorded("first-creation", Some("24h")),
        ),
        row(
            "first creation with ipRetention 2h",
            pod(json!({})),
            Some(with(
                with(pps(), "/status/podStates", json!({})),
                "/spec/ipRetention",
                json!("2h"),
            )),
            Want::Unrecorded("first-creation", Some("2h")),
        ),
        row(
            "an ipRetention the plugin cannot read is not stamped",
            pod(json!({})),
            Some(with(
                with(pps(), "/status", json!({})),
                "/spec/ipRetention",
                json!("soon"),
            )),
            Want::Skipped("invalid-spec", "ipRetention value \"soon\""),
        ),
        row(
            "preferred weight 0 (schema bypassed): skipped, never an invalid pod",
            pod(json!({})),
            Some(with(
                pps(),
                "/spec/preferredPersistentTopology/0/weight",
                json!(0),
            )),
            Want::Skipped("invalid-spec", "weight 0"),
        ),
        row(
            "PersistentPodState being deleted",
            pod(json!({})),
            Some(with(
                pps(),
                "/metadata",
                json!({"name": "db", "namespace": "prod", "deletionTimestamp": "2026-01-01T00:00:00Z"}),
            )),
            Want::Pass("persistentpodstate-deleting"),
        ),
        row(
            "matchFields names another node while the hostname is pinned: skipped",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [req("metadata.name", "In", &["n2"])]}]}}}}),
            ),
            Some(pps()),
            Want::Skipped("conflict", "metadata.name In [\"n2\"] vs node n1"),
        ),
        row(
            "spec.nodeName already set to another node: skipped",
            pod(json!({"nodeName": "n2"})),
            Some(pps()),
            Want::Skipped("conflict", "spec.nodeName binds it to node n2"),
        ),
        row(
            "template says the key must not exist: skipped",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOST, "operator": "DoesNotExist"}]}]}}}}),
            ),
            Some(pps()),
            Want::Skipped("conflict", "DoesNotExist"),
        ),
        row(
            "NotIn the recorded zone: skipped",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [req(ZONE, "NotIn", &["a"])]}]}}}}),
            ),
            Some(multi_key.clone()),
            Want::Skipped("conflict", "NotIn"),
        ),
        row(
            "zone pin and a hostname field requirement: unknowable, so pinned",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [req("metadata.name", "In", &["n2"])]}]}}}}),
            ),
            Some(with(
                pps(),
                "/spec/requiredPersistentTopology/nodeTopologyKeys",
                json!([ZONE]),
            )),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [req(ZONE, "In", &["a"])], "matchFields": [req("metadata.name", "In", &["n2"])]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "an empty term (matches nothing) stays empty; the others get the pin",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {}, {"matchExpressions": [req("disk", "Exists", &[])]}]}}}}),
            ),
            Some(only_required_pps()),
            Want::Pinned(
                json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {}, {"matchExpressions": [{"key": "disk", "operator": "Exists", "values": []}, pinned_host()]}]}}),
            ),
        ),
        row(
            "the pin already present (reinvocation): nothing duplicated",
            pod(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]}}})),
            Some(pps()),
            Want::Pinned(json!({
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [pinned_host()]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [preferred_zone()]})),
        ),
        row(
            "numeric Gt requirement the recorded value meets",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [req("rack", "Gt", &["3"])]}]}}}}),
            ),
            Some(with(
                with(
                    only_required_pps(),
                    "/spec/requiredPersistentTopology/nodeTopologyKeys",
                    json!(["rack"]),
                ),
                "/status/podStates/db-0/nodeTopologyLabels",
                json!({"rack": "7"}),
            )),
            Want::Pinned(
                json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [req("rack", "Gt", &["3"]), req("rack", "In", &["7"])]}]}}),
            ),
        ),
        row(
            "numeric Lt requirement the recorded value fails: skipped",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [req("rack", "Lt", &["3"])]}]}}}}),
            ),
            Some(with(
                with(
                    only_required_pps(),
                    "/spec/requiredPersistentTopology/nodeTopologyKeys",
                    json!(["rack"]),
                ),
                "/status/podStates/db-0/nodeTopologyLabels",
                json!({"rack": "7"}),
            )),
            Want::Skipped("conflict", "rack Lt"),
        ),
    ]
}

fn only_required_pps() -> Value {
    with(pps(), "/spec/preferredPersistentTopology", json!([]))
}

#[test]
fn decisions_and_patched_pods_for_every_shape() {
    let rows = rows();
    assert!(rows.len() >= 20);
    for r in rows {
        let pod: Pod = serde_json::from_value(r.pod.clone()).expect(r.name);
        let pps: Option<PersistentPodState> =
            r.pps.map(|p| serde_json::from_value(p).expect(r.name));
        let decision = decide(&pod, r.namespace, pps.as_ref());
        let mut after = pod.clone();
        if let Decision::Manage(m) = &decision {
            affinity::apply(m, &mut after);
        }
        let annotations = after.metadata.annotations.clone().unwrap_or_default();
        let node_affinity = serde_json::to_value(&after.spec.as_ref().unwrap().affinity)
            .unwrap()
            .pointer("/nodeAffinity")
            .cloned();
        if let Decision::Manage(m) = &decision {
            assert_eq!(
                annotations.get(PERSISTENT_POD_STATE),
                Some(&m.pps),
                "{}: every managed pod names its PersistentPodState",
                r.name
            );
        }
        match (&r.want, &decision) {
            (Want::Pass(label), Decision::Pass(reason)) => {
                assert_eq!(reason.label(), *label, "{}", r.name);
                assert_eq!(after, pod, "{}: a pass-through changes nothing", r.name);
            }
            (Want::Unrecorded(label, retention), Decision::Manage(m)) => {
                let PinOutcome::Unrecorded(reason) = &m.pin else {
                    panic!("{}: {decision:?}", r.name)
                };
                assert_eq!(reason.label(), *label, "{}", r.name);
                assert_eq!(
                    annotations.get(IP_RETENTION).map(String::as_str),
                    *retention,
                    "{}",
                    r.name
                );
                assert!(!annotations.contains_key(PINNED_BY), "{}", r.name);
                assert_eq!(after.spec, pod.spec, "{}: no affinity", r.name);
            }
            (Want::Skipped(label, fragment), Decision::Manage(m)) => {
                let PinOutcome::Skipped(reason) = &m.pin else {
                    panic!("{}: {decision:?}", r.name)
                };
                assert_eq!(reason.label(), *label, "{}", r.name);
                let said = annotations
                    .get(PIN_SKIPPED)
                    .unwrap_or_else(|| panic!("{}: no {PIN_SKIPPED}", r.name));
                assert!(
                    said.contains(fragment),
                    "{}: {said:?} lacks {fragment:?}",
                    r.name
                );
                assert!(!annotations.contains_key(PINNED_BY), "{}", r.name);
                assert_eq!(
                    after.spec, pod.spec,
                    "{}: a skipped pin is never applied",
                    r.name
                );
            }
            (Want::Pinned(want), Decision::Manage(m)) => {
                assert!(
                    matches!(m.pin, PinOutcome::Pinned(_)),
                    "{}: {decision:?}",
                    r.name
                );
                assert_eq!(node_affinity.as_ref(), Some(want), "{}", r.name);
                assert_eq!(
                    annotations.get(PINNED_BY).map(String::as_str),
                    Some("db"),
                    "{}",
                    r.name
                );
                assert_eq!(
                    annotations.get(IP_RETENTION).map(String::as_str),
                    Some("24h"),
                    "{}",
                    r.name
                );
                let mut again = after.clone();
                affinity::apply(m, &mut again);
                assert_eq!(again, after, "{}: applying twice changes nothing", r.name);
            }
            _ => panic!("{}: unexpected {decision:?}", r.name),
        }
    }
}

#[test]
fn a_retention_the_pod_sets_itself_is_kept() {
    let mut p = pod(json!({}));
    p["metadata"]["annotations"] = json!({IP_RETENTION: "forever"});
    let pod: Pod = serde_json::from_value(p).unwrap();
    let pps: PersistentPodState = serde_json::from_value(pps()).unwrap();
    let Decision::Manage(m) = decide(&pod, "prod", Some(&pps)) else {
        panic!("managed")
    };
    let mut after = pod.clone();
    affinity::apply(&m, &mut after);
    assert_eq!(after.metadata.annotations.unwrap()[IP_RETENTION], "forever");
}

#[test]
fn extender_filter_and_scores() {
    let pod: Pod = serde_json::from_value(pod(json!({}))).unwrap();
    let labels = |host: &str, zone: &str| {
        [
            (HOST.to_string(), host.to_string()),
            (ZONE.to_string(), zone.to_string()),
        ]
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>()
    };
    let state: PersistentPodState = serde_json::from_value(pps()).unwrap();
    let Decision::Manage(m) = decide(&pod, "prod", Some(&state)) else {
        panic!("managed")
    };
    let PinOutcome::Pinned(pin) = m.pin else {
        panic!("pinned")
    };
    assert!(pin.admits(&labels("n1", "a")));
    assert!(!pin.admits(&labels("n2", "a")));
    assert!(!pin.admits(&Default::default()));
    assert_eq!(
        pin.refusal(),
        "ipkeep: pinned to kubernetes.io/hostname=n1 (recorded on node n1, where its IPs are held)"
    );
    assert_eq!(pin.score("n1", &labels("n1", "a")), 10);
    assert_eq!(pin.score("n2", &labels("n2", "a")), 9);
    assert_eq!(pin.score("n3", &labels("n3", "b")), 0);

    let mut failed_over = pps();
    failed_over["status"]["podStates"]["db-0"]["preferredOnly"] = json!(true);
    let state: PersistentPodState = serde_json::from_value(failed_over).unwrap();
    let Decision::Manage(m) = decide(&pod, "prod", Some(&state)) else {
        panic!("managed")
    };
    let PinOutcome::Pinned(pin) = m.pin else {
        panic!("pinned")
    };
    assert!(pin.fallback);
    assert!(pin.admits(&labels("n2", "b")), "fallback admits every node");
    // weights 100 (hostname) and 60 (zone): same zone scores 60/160 of 9
    assert_eq!(pin.score("n2", &labels("n2", "a")), 3);
    assert_eq!(pin.score("n3", &labels("n3", "b")), 0);
}

/// One grammar with the node agent: the ordinal is the pod's `apps.kubernetes.io/pod-index`
/// label where it has one, and a name and label that disagree name no pod of the StatefulSet.
#[test]
fn the_pod_index_label_names_the_ordinal() {
    let decide_with = |labels: Value| {
        let mut p = pod(json!({}));
        p["metadata"]["labels"] = labels;
        let pod: Pod = serde_json::from_value(p).unwrap();
        let pps: PersistentPodState = serde_json::from_value(pps()).unwrap();
        match decide(&pod, "prod", Some(&pps)) {
            Decision::Manage(m) => matches!(m.pin, PinOutcome::Pinned(_)),
            other => panic!("{other:?}"),
        }
    };
    assert!(decide_with(json!({"apps.kubernetes.io/pod-index": "0"})));
    assert!(decide_with(json!({})));
    assert!(!decide_with(json!({"apps.kubernetes.io/pod-index": "1"})));
}

/// The webhook and the node agent find a StatefulSet's PersistentPodState by one rule: the one
/// named after the StatefulSet if it targets it, else the first by name that targets it.
#[test]
fn which_persistent_pod_state_is_a_statefulsets() {
    let named = |name: &str, target: &str, kind: &str| -> PersistentPodState {
        let mut p = pps();
        p["metadata"]["name"] = json!(name);
        p["spec"]["targetRef"]["name"] = json!(target);
        p["spec"]["targetRef"]["kind"] = json!(kind);
        serde_json::from_value(p).unwrap()
    };
    let states = [
        named("b", "db", "StatefulSet"),
        named("a", "db", "StatefulSet"),
        named("db", "db", "StatefulSet"),
        named("web", "web", "Deployment"),
    ];
    let of_workload = |workload, sts: &str, from: &[PersistentPodState]| {
        crate::pin::persistent_pod_state_of(from, workload, sts)
            .and_then(|p| p.metadata.name.clone())
    };
    let of = |sts: &str, from: &[PersistentPodState]| of_workload(Workload::Native, sts, from);
    assert_eq!(of("db", &states).as_deref(), Some("db"));
    assert_eq!(of("db", &states[..2]).as_deref(), Some("a"));
    assert_eq!(of("web", &states), None, "a StatefulSet only");
    assert_eq!(of("kv", &states), None);
    let mut kruise = pps();
    kruise["spec"]["targetRef"]["apiVersion"] = json!("apps.kruise.io/v1beta1");
    let kruise: PersistentPodState = serde_json::from_value(kruise).unwrap();
    let kruise = [kruise];
    assert_eq!(
        of("db", &kruise),
        None,
        "an Advanced StatefulSet (apps.kruise.io) of the name is another workload"
    );
    assert_eq!(
        of_workload(Workload::Kruise, "db", &kruise).as_deref(),
        Some("db")
    );
    assert_eq!(of_workload(Workload::Kruise, "db", &states), None);
}

/// A PersistentPodState waits for adoption only while nothing controls it: one an OpenKruise
/// Advanced StatefulSet of the name controls (not an `apps` StatefulSet, and not adoptable) does
/// not make the name's pods its own.
#[test]
fn only_an_uncontrolled_state_awaits_adoption() {
    let state = |owners: Value| -> PersistentPodState {
        let mut p = pps();
        p["metadata"]["annotations"] =
            json!({ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE: "true"});
        p["metadata"]["ownerReferences"] = owners;
        serde_json::from_value(p).unwrap()
    };
    let awaiting = |owners| crate::pin::awaiting_adoption(&state(owners));
    assert!(awaiting(json!([])), "orphaned");
    assert!(
        awaiting(owner("StatefulSet", "apps/v1", "db", false)),
        "owned, not controlled"
    );
    assert!(!awaiting(owner("StatefulSet", "apps/v1", "db", true)));
    assert!(
        !awaiting(owner("StatefulSet", "apps.kruise.io/v1beta1", "db", true)),
        "an Advanced StatefulSet controls it"
    );
}

/// ipkeep's lifecycle hooks stand aside for an Advanced StatefulSet's pod (it has its own): the
/// pin is decided, the hooks are not given.
#[test]
fn an_advanced_statefulsets_pod_gets_no_hooks() {
    let mut state = pps();
    state["spec"]["lifecycle"] =
        json!({"preDelete": {"labelsHandler": {"example.com/drained": "true"}}});
    let native: Pod = serde_json::from_value(pod(json!({}))).unwrap();
    let apps: PersistentPodState = serde_json::from_value(state.clone()).unwrap();
    let Decision::Manage(m) = decide(&native, "prod", Some(&apps)) else {
        panic!("an apps StatefulSet's pod is managed");
    };
    assert!(m.lifecycle.pre_delete.is_some(), "its hooks run");
    state["spec"]["targetRef"]["apiVersion"] = json!("apps.kruise.io/v1beta1");
    let kruise: PersistentPodState = serde_json::from_value(state).unwrap();
    let asts_pod: Pod = serde_json::from_value(with(
        pod(json!({})),
        "/metadata/ownerReferences",
        owner("StatefulSet", "apps.kruise.io/v1beta1", "db", true),
    ))
    .unwrap();
    let Decision::Manage(m) = decide(&asts_pod, "prod", Some(&kruise)) else {
        panic!("an Advanced StatefulSet's pod is managed");
    };
    assert!(matches!(m.pin, PinOutcome::Pinned(_)), "{:?}", m.pin);
    assert_eq!(*m.lifecycle, Default::default(), "no hooks of ipkeep's");
}
