//! The lifecycle hooks at both webhooks: what a new pod gets at CREATE (`/mutate-pods`), and
//! which deletions and evictions `/validate-pods` holds, with what answer and which mark.
#![allow(clippy::unwrap_used)]

mod support;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ipkeep_scheduler_ext::deletion;
use ipkeep_scheduler_ext::review::Outcome;
use ipkeep_scheduler_ext::webhook;
use serde_json::{Value, json};
use support::{STS_UID, caches_with_pods, pps_json};

const CREATE: &str = include_str!("fixtures/admission-review-sts-pod-create.json");
const NOW: u64 = 1_800_000_000;
const STATE: &str = "ipkeep.dev/lifecycle-state";
const REGISTERED: &str = "registry.example.com/registered";

/// `db` with both hooks (PreDelete drains).
fn pps_with_hooks() -> Value {
    let mut pps = pps_json();
    pps["spec"]["lifecycle"] = json!({
        "preNormal": {"labelsHandler": {REGISTERED: "true"}},
        "preDelete": {"labelsHandler": {REGISTERED: "true"}, "markPodNotReady": true, "timeoutSeconds": 300}
    });
    pps
}

/// Pod `db-1` on `node` in `state`, registered (blocked by PreDelete).
fn pod(state: &str, node: &str, extra: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "db-1", "namespace": "prod", "uid": "pod-uid-1",
            "labels": {"app": "db", "statefulset.kubernetes.io/pod-name": "db-1", STATE: state, REGISTERED: "true"},
            "annotations": {"ipkeep.dev/lifecycle-since": (NOW - 10).to_string(), "team": "x"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": STS_UID, "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "db", "image": "db"}],
                 "readinessGates": [{"conditionType": "ipkeep.dev/lifecycle-ready"}]},
        "status": {"phase": "Running"}
    });
    json_patch::merge(&mut pod, &extra);
    pod
}

fn delete_review(pod: &Value, options: Value) -> String {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "r-1", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"], "namespace": "prod", "operation": "DELETE",
        "oldObject": pod, "options": options}})
    .to_string()
}

fn eviction_review(name: &str, grace: Option<i64>) -> String {
    let mut eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": "prod"}});
    if let Some(g) = grace {
        eviction["deleteOptions"] = json!({"gracePeriodSeconds": g});
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "r-2", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "eviction", "name": name, "namespace": "prod", "operation": "CREATE",
        "object": eviction}})
    .to_string()
}

#[tokio::test]
async fn a_new_pod_is_created_preparing_normal_with_the_gate() {
    let caches = caches_with_pods(&[pps_with_hooks()], 3, &[]).await;
    let reviewed = webhook::review(CREATE.as_bytes(), &caches).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(
        &BASE64
            .decode(reviewed.review.response.patch.as_ref().unwrap())
            .unwrap(),
    )
    .unwrap();
    let mut object: Value =
        serde_json::from_str::<Value>(CREATE).unwrap()["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).unwrap();
    let labels = &object["metadata"]["labels"];
    assert_eq!(labels[STATE], "PreparingNormal");
    assert!(labels.get(REGISTERED).is_none(), "the operator adds it");
    assert_eq!(labels["app"], "db", "the pod's own labels stay");
    assert_eq!(
        object["spec"]["readinessGates"],
        json!([{"conditionType": "ipkeep.dev/lifecycle-ready"}])
    );
    assert!(
        object["spec"]["containers"].is_array(),
        "nothing else touched"
    );

    // Without hooks, no label and no gate.
    let plain = caches_with_pods(&[pps_json()], 3, &[]).await;
    let reviewed = webhook::review(CREATE.as_bytes(), &plain).unwrap();
    let patch = String::from_utf8(
        BASE64
            .decode(reviewed.review.response.patch.as_ref().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert!(
        !patch.contains("lifecycle") && !patch.contains("readinessGates"),
        "{patch}"
    );
}

/// The review is an answer and nothing else: `Reviewed` carries no write (the server has none
/// to make), whatever the request says.
#[tokio::test]
async fn a_blocked_deletion_is_held_with_429_and_says_what_to_do() {
    let normal = pod("Normal", "n1", json!({}));
    let caches = caches_with_pods(&[pps_with_hooks()], 3, std::slice::from_ref(&normal)).await;
    let r =
        deletion::review_at(delete_review(&normal, json!({})).as_bytes(), &caches, NOW).unwrap();
    assert_eq!(r.outcome, Outcome::Held);
    let answer = serde_json::to_value(&r.review).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 429);
    assert_eq!(answer["response"]["status"]["reason"], "TooManyRequests");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    for part in [
        "deletion of pod db-1 waits for its preDelete hook",
        "registry.example.com/registered=true",
        "is not PreparingDelete yet",
        "kubectl label pod db-1 ipkeep.dev/lifecycle-state=PreparingDelete --overwrite",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }

    // A pod this server does not watch is answered the same (from the request's oldObject).
    let stranger = caches_with_pods(&[pps_with_hooks()], 3, &[]).await;
    let r =
        deletion::review_at(delete_review(&normal, json!({})).as_bytes(), &stranger, NOW).unwrap();
    assert_eq!(r.outcome, Outcome::Held);

    // PreparingDelete (marked by the controller): held, with why and the time left.
    let preparing = pod(
        "PreparingDelete",
        "n1",
        json!({"metadata": {"annotations": {"ipkeep.dev/lifecycle-held": "scale-down"}}}),
    );
    let r = deletion::review_at(
        delete_review(&preparing, json!({})).as_bytes(),
        &caches,
        NOW,
    )
    .unwrap();
    assert_eq!(r.outcome, Outcome::Held);
    let message = r.review.response.status.unwrap().message;
    assert!(message.contains("in 290 s"), "{message}");
    assert!(
        message.contains("its StatefulSet scales it down"),
        "{message}"
    );

    // The operator deregistered it (label removed): it passes.
    let released = pod(
        "PreparingDelete",
        "n1",
        json!({"metadata": {"labels": {REGISTERED: null}}}),
    );
    let r =
        deletion::review_at(delete_review(&released, json!({})).as_bytes(), &caches, NOW).unwrap();
    assert_eq!(r.outcome, Outcome::Allowed);
    assert!(r.review.response.allowed);
}

#[tokio::test]
async fn an_eviction_is_held_by_its_pod_from_the_cache() {
    let normal = pod("Normal", "n1", json!({}));
    let caches = caches_with_pods(&[pps_with_hooks()], 3, &[normal]).await;
    let r = deletion::review_at(eviction_review("db-1", None).as_bytes(), &caches, NOW).unwrap();
    assert_eq!(r.outcome, Outcome::Held);
    let status = r.review.response.status.unwrap();
    assert_eq!(status.code, 429, "kubectl drain retries a 429");
    assert!(
        status.message.contains("eviction of pod db-1"),
        "{}",
        status.message
    );
    // A pod without hooks is not in the cache: its eviction passes untouched.
    let r = deletion::review_at(eviction_review("web-0", None).as_bytes(), &caches, NOW).unwrap();
    assert_eq!(r.outcome, Outcome::Passed);
    assert!(r.review.response.allowed);
}

#[tokio::test]
async fn every_escape_hatch_lets_a_blocked_pod_go() {
    let normal = pod("Normal", "n1", json!({}));
    let caches = caches_with_pods(&[pps_with_hooks()], 3, std::slice::from_ref(&normal)).await;
    let allowed = |body: String| {
        let r = deletion::review_at(body.as_bytes(), &caches, NOW).unwrap();
        assert!(r.review.response.allowed, "{:?}", r.review);
        (r.outcome, r.review.response.warnings.join(" "))
    };
    let (outcome, warning) = allowed(delete_review(&normal, json!({"gracePeriodSeconds": 0})));
    assert_eq!(outcome, Outcome::Escaped);
    assert!(warning.contains("force deletion"), "{warning}");
    let (_, warning) = allowed(eviction_review("db-1", Some(0)));
    assert!(warning.contains("force deletion"), "{warning}");
    // n7 is not a known node (gone, or never Ready).
    let (_, warning) = allowed(delete_review(&pod("Normal", "n7", json!({})), json!({})));
    assert!(warning.contains("node is not Ready"), "{warning}");
    let timed_out = pod(
        "PreparingDelete",
        "n1",
        json!({"metadata": {"annotations": {"ipkeep.dev/lifecycle-since": (NOW - 300).to_string()}}}),
    );
    let (_, warning) = allowed(delete_review(&timed_out, json!({})));
    assert!(warning.contains("timeout"), "{warning}");
    let terminating = pod(
        "Normal",
        "n1",
        json!({"metadata": {"deletionTimestamp": "2026-11-26T00:00:00Z"}}),
    );
    assert_eq!(
        allowed(delete_review(&terminating, json!({}))).0,
        Outcome::Allowed
    );
    let finished = pod("Normal", "n1", json!({"status": {"phase": "Succeeded"}}));
    assert_eq!(
        allowed(delete_review(&finished, json!({}))).0,
        Outcome::Allowed
    );
}

/// The timeout runs from the hold's start in the pod's status (ipkeep-controller's condition),
/// read from a DELETE's `oldObject` and from the cache an eviction is answered from alike; the
/// pod's own annotation, set to the year 2500, moves nothing.
#[tokio::test]
async fn the_timeout_runs_from_the_recorded_start_not_the_pods_annotation() {
    let start = k8s_openapi::jiff::Timestamp::from_second((NOW - 300) as i64).unwrap();
    let held = pod(
        "PreparingDelete",
        "n1",
        json!({"metadata": {"annotations": {"ipkeep.dev/lifecycle-since": "16725225600",
                "ipkeep.dev/lifecycle-held": "drain"}},
            "status": {"conditions": [{"type": "ipkeep.dev/lifecycle-held", "status": "True",
                "lastTransitionTime": start.to_string()}]}}),
    );
    let caches = caches_with_pods(&[pps_with_hooks()], 3, std::slice::from_ref(&held)).await;
    for (what, body) in [
        ("deletion", delete_review(&held, json!({}))),
        ("eviction", eviction_review("db-1", None)),
    ] {
        let before = deletion::review_at(body.as_bytes(), &caches, NOW - 1).unwrap();
        assert_eq!(before.outcome, Outcome::Held, "{what}: released early");
        let at = deletion::review_at(body.as_bytes(), &caches, NOW).unwrap();
        assert_eq!(
            (at.outcome, at.review.response.allowed),
            (Outcome::Escaped, true),
            "{what}: held past its timeout"
        );
    }
}

#[tokio::test]
async fn what_is_not_a_pod_deletion_passes() {
    let normal = pod("Normal", "n1", json!({}));
    let caches = caches_with_pods(&[pps_with_hooks()], 3, std::slice::from_ref(&normal)).await;
    // A pod's UPDATE, a DELETE of another resource, a StatefulSet without hooks.
    let mut update: Value = serde_json::from_str(&delete_review(&normal, json!({}))).unwrap();
    update["request"]["operation"] = json!("UPDATE");
    let mut configmap: Value = serde_json::from_str(&delete_review(&normal, json!({}))).unwrap();
    configmap["request"]["resource"]["resource"] = json!("configmaps");
    for body in [update.to_string(), configmap.to_string()] {
        let r = deletion::review_at(body.as_bytes(), &caches, NOW).unwrap();
        assert_eq!(
            (r.outcome, r.review.response.allowed),
            (Outcome::Passed, true)
        );
    }
    let no_hooks = caches_with_pods(&[pps_json()], 3, std::slice::from_ref(&normal)).await;
    let r =
        deletion::review_at(delete_review(&normal, json!({})).as_bytes(), &no_hooks, NOW).unwrap();
    assert_eq!(
        (r.outcome, r.review.response.allowed),
        (Outcome::Passed, true)
    );
    // Bad input is an error (the API server then applies failurePolicy: Ignore), never a panic.
    for body in [
        "{",
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","operation":"DELETE","resource":{"group":"","resource":"pods"},"options":"x"}}"#,
    ] {
        assert!(
            deletion::review_at(body.as_bytes(), &caches, NOW).is_err(),
            "{body}"
        );
    }
}
