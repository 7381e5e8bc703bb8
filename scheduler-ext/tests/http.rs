//! The HTTP front in-process (`tower::ServiceExt::oneshot`), with request bodies in the exact
//! shape kube-apiserver and kube-scheduler send (`tests/fixtures/`), and bad input of every kind.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use http_body_util::BodyExt;
use ipkeep_scheduler_ext::cache::Caches;
use ipkeep_scheduler_ext::http::{AppState, Limits, router, webhook_router};
use ipkeep_scheduler_ext::metrics::Metrics;
use serde_json::{Value, json};
use support::{HOST, ZONE, caches, node_json, pps_json};
use tower::ServiceExt;

const REVIEW: &str = include_str!("fixtures/admission-review-sts-pod-create.json");
const FILTER: &str = include_str!("fixtures/extender-filter-node-names.json");

struct App {
    state: AppState,
}

async fn app(pps: &[Value]) -> App {
    app_with(caches(pps, 6).await, Limits::default())
}

fn app_with(caches: Caches, limits: Limits) -> App {
    App {
        state: AppState::new(caches, Arc::new(Metrics::default()), limits),
    }
}

impl App {
    async fn send(&self, path: &str, body: Body) -> (StatusCode, Vec<u8>) {
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        let response = router(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, bytes.to_vec())
    }

    async fn post(&self, path: &str, body: impl Into<String>) -> (StatusCode, Value) {
        let (status, bytes) = self.send(path, Body::from(body.into())).await;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let response = router(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn review_with(edit: impl FnOnce(&mut Value)) -> String {
    let mut v: Value = serde_json::from_str(REVIEW).unwrap();
    edit(&mut v);
    v.to_string()
}

/// The object of `review` with the response's patch applied, as the API server would.
fn patched(review: &str, response: &Value) -> Value {
    let mut object: Value =
        serde_json::from_str::<Value>(review).unwrap()["request"]["object"].clone();
    let r = &response["response"];
    if let Some(patch) = r["patch"].as_str() {
        assert_eq!(r["patchType"], "JSONPatch");
        let patch: json_patch::Patch =
            serde_json::from_slice(&BASE64.decode(patch).unwrap()).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
    } else {
        assert!(r.get("patchType").is_none(), "patchType without patch: {r}");
    }
    object
}

fn pinned_host() -> Value {
    json!({"key": HOST, "operator": "In", "values": ["n1"]})
}

#[tokio::test]
async fn webhook_pins_a_rebuilt_pod_into_every_required_term() {
    let app = app(&[pps_json()]).await;
    let (status, response) = app.post("/mutate-pods", REVIEW).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(
        response["response"]["uid"],
        "5d5b4f39-8a4c-4b8e-9c61-0d6f1f6e2c11"
    );
    assert_eq!(response["response"]["allowed"], true);
    let pod = patched(REVIEW, &response);
    let affinity = &pod["spec"]["affinity"]["nodeAffinity"];
    assert_eq!(
        affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([
            {"matchExpressions": [{"key": "node-role.example.com/db", "operator": "Exists"}, pinned_host()]},
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]}, pinned_host()]}
        ])
    );
    assert_eq!(
        affinity["preferredDuringSchedulingIgnoredDuringExecution"],
        json!([{"weight": 60, "preference": {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["z1"]}]}}])
    );
    assert_eq!(
        pod["metadata"]["annotations"]["ipkeep.dev/ip-retention"],
        "24h"
    );
    assert_eq!(pod["metadata"]["annotations"]["ipkeep.dev/pinned-by"], "db");
    // Nothing else of the pod changed: the patch touches only what the pin needs.
    let original: Value =
        serde_json::from_str::<Value>(REVIEW).unwrap()["request"]["object"].clone();
    assert_eq!(pod["spec"]["containers"], original["spec"]["containers"]);
    assert_eq!(pod["spec"]["tolerations"], original["spec"]["tolerations"]);
    assert_eq!(
        pod["metadata"]["managedFields"],
        original["metadata"]["managedFields"]
    );
    assert_eq!(pod["metadata"]["creationTimestamp"], Value::Null);
    let (_, metrics) = app.get("/metrics").await;
    assert!(
        metrics.contains(
            r#"ipkeep_scheduler_ext_requests_total{endpoint="mutate-pods",outcome="pinned"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"ipkeep_scheduler_ext_pins_applied_total{endpoint="mutate-pods"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn webhook_first_creation_gets_retention_only() {
    let mut pps = pps_json();
    pps["status"]["podStates"] = json!({});
    pps["spec"]["ipRetention"] = json!("2h");
    let app = app(&[pps]).await;
    let (status, response) = app.post("/mutate-pods", REVIEW).await;
    assert_eq!(status, StatusCode::OK);
    let pod = patched(REVIEW, &response);
    assert_eq!(
        pod["metadata"]["annotations"],
        json!({"ipkeep.dev/ip-retention": "2h", "ipkeep.dev/persistent-pod-state": "db"})
    );
    let original: Value =
        serde_json::from_str::<Value>(REVIEW).unwrap()["request"]["object"].clone();
    assert_eq!(pod["spec"], original["spec"]);
}

#[tokio::test]
async fn webhook_skips_a_conflicting_pin_and_says_why() {
    let mut pps = pps_json();
    pps["spec"]["requiredPersistentTopology"]["nodeTopologyKeys"] = json!([ZONE]);
    let app = app(&[pps]).await;
    let review = review_with(|v| {
        v["request"]["object"]["spec"]["nodeSelector"] = json!({ZONE: "z2"});
    });
    let (status, response) = app.post("/mutate-pods", review.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let warnings = response["response"]["warnings"].to_string();
    assert!(
        warnings.contains("spec.nodeSelector requires topology.kubernetes.io/zone=z2"),
        "{warnings}"
    );
    let pod = patched(&review, &response);
    let skipped = pod["metadata"]["annotations"]["ipkeep.dev/pin-skipped"]
        .as_str()
        .unwrap();
    assert!(
        skipped.contains("the record says topology.kubernetes.io/zone=z1"),
        "{skipped}"
    );
    assert!(
        pod["metadata"]["annotations"]
            .get("ipkeep.dev/pinned-by")
            .is_none()
    );
    let original: Value =
        serde_json::from_str::<Value>(&review).unwrap()["request"]["object"].clone();
    assert_eq!(
        pod["spec"], original["spec"],
        "a skipped pin is never applied"
    );

    // A dry run says the same but is not counted.
    let dry = review_with(|v| {
        v["request"]["object"]["spec"]["nodeSelector"] = json!({ZONE: "z2"});
        v["request"]["dryRun"] = json!(true);
    });
    let (_, response) = app.post("/mutate-pods", dry).await;
    assert!(
        response["response"]["warnings"]
            .to_string()
            .contains("nodeSelector")
    );
    let (_, metrics) = app.get("/metrics").await;
    assert!(
        metrics.contains(
            r#"ipkeep_scheduler_ext_pins_skipped_total{endpoint="mutate-pods",reason="conflict"} 1"#
        ),
        "dry runs are not counted: {metrics}"
    );
}

#[tokio::test]
async fn webhook_passes_what_is_not_ours_unchanged() {
    let app = app(&[pps_json()]).await;
    let cases = [
        (
            "no PersistentPodState for this StatefulSet",
            review_with(|v| {
                v["request"]["object"]["metadata"]["ownerReferences"][0]["name"] = json!("web");
            }),
        ),
        (
            "a ReplicaSet's pod",
            review_with(|v| {
                v["request"]["object"]["metadata"]["ownerReferences"][0]["kind"] =
                    json!("ReplicaSet");
            }),
        ),
        (
            "a pod UPDATE",
            review_with(|v| v["request"]["operation"] = json!("UPDATE")),
        ),
        (
            "a pods/status subresource",
            review_with(|v| v["request"]["subResource"] = json!("status")),
        ),
        (
            "another resource",
            review_with(|v| {
                v["request"]["resource"] =
                    json!({"group": "apps", "version": "v1", "resource": "statefulsets"});
                v["request"]["object"] = json!({"kind": "StatefulSet", "apiVersion": "apps/v1", "metadata": {"name": "db"}});
            }),
        ),
        (
            "the same pod in another namespace",
            review_with(|v| v["request"]["namespace"] = json!("staging")),
        ),
    ];
    for (what, review) in cases {
        let (status, response) = app.post("/mutate-pods", review).await;
        assert_eq!(status, StatusCode::OK, "{what}");
        assert_eq!(response["response"]["allowed"], true, "{what}");
        assert!(
            response["response"].get("patch").is_none(),
            "{what}: {response}"
        );
        assert_eq!(
            response["response"]["uid"], "5d5b4f39-8a4c-4b8e-9c61-0d6f1f6e2c11",
            "{what}"
        );
    }
}

#[tokio::test]
async fn webhook_bad_input_gets_a_clear_error_never_a_panic() {
    let app = app_with(
        caches(&[pps_json()], 3).await,
        Limits {
            webhook_body: 64 * 1024,
            body_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
    );
    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        (
            "malformed JSON",
            "{\"kind\": \"AdmissionReview\", ".into(),
            StatusCode::BAD_REQUEST,
            "EOF while parsing",
        ),
        (
            "not JSON at all",
            "hello".into(),
            StatusCode::BAD_REQUEST,
            "expected value",
        ),
        (
            "wrong apiVersion",
            review_with(|v| v["apiVersion"] = json!("admission.k8s.io/v1beta1")),
            StatusCode::BAD_REQUEST,
            "must be admission.k8s.io/v1/AdmissionReview, got admission.k8s.io/v1beta1/AdmissionReview",
        ),
        (
            "wrong kind",
            review_with(|v| v["kind"] = json!("Pod")),
            StatusCode::BAD_REQUEST,
            "got admission.k8s.io/v1/Pod",
        ),
        (
            "missing uid",
            review_with(|v| {
                v["request"].as_object_mut().unwrap().remove("uid");
            }),
            StatusCode::BAD_REQUEST,
            "missing field `uid`",
        ),
        (
            "no request",
            review_with(|v| {
                v.as_object_mut().unwrap().remove("request");
            }),
            StatusCode::BAD_REQUEST,
            "no request",
        ),
        (
            "huge body",
            format!("{{\"pad\": \"{}\"}}", "x".repeat(100 * 1024)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than the limit of 65536 bytes",
        ),
    ];
    for (what, body, code, message) in cases {
        let (status, response) = app.post("/mutate-pods", body).await;
        assert_eq!(status, code, "{what}: {response}");
        assert_eq!(response["kind"], "Status", "{what}");
        let said = response["message"].as_str().unwrap();
        assert!(said.contains(message), "{what}: {said:?} lacks {message:?}");
    }
    // A pod object whose fields the decision reads are not a pod's: allowed, unpinned, with a
    // warning. (Fields it does not read, such as containers, are the API server's to check.)
    let review = review_with(|v| v["request"]["object"]["spec"]["nodeSelector"] = json!("nope"));
    let (status, response) = app.post("/mutate-pods", review).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(response["response"]["allowed"], true);
    assert!(
        response["response"]["warnings"]
            .to_string()
            .contains("cannot be read"),
        "{response}"
    );

    // A client that sends half a body and stops: 408 after the timeout, not a hang.
    let (mut tx, body) = body_channel();
    tx.try_send(axum::body::Bytes::from_static(b"{\"kind\":"))
        .unwrap();
    let started = Instant::now();
    let (status, bytes) = app.send("/mutate-pods", body).await;
    assert_eq!(
        status,
        StatusCode::REQUEST_TIMEOUT,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(tx);
}

/// A request body fed by hand.
fn body_channel() -> (futures::channel::mpsc::Sender<axum::body::Bytes>, Body) {
    use futures::StreamExt;
    let (tx, rx) = futures::channel::mpsc::channel::<axum::body::Bytes>(4);
    (tx, Body::from_stream(rx.map(Ok::<_, std::io::Error>)))
}

#[tokio::test]
async fn not_ready_refuses_statefulset_pods_only() {
    let (caches, _writers) = Caches::new(Default::default());
    let app = app_with(caches, Limits::default());
    let (status, response) = app.post("/mutate-pods", REVIEW).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        response["message"]
            .as_str()
            .unwrap()
            .contains("not synced yet")
    );
    let (status, _) = app
        .post(
            "/mutate-pods",
            review_with(|v| {
                v["request"]["object"]["metadata"]["ownerReferences"] = json!([]);
            }),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a pod that is not a StatefulSet's needs no cache"
    );
    let (status, response) = app.post("/filter", FILTER).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        response["Error"]
            .as_str()
            .unwrap()
            .contains("not synced yet")
    );
    assert_eq!(app.get("/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.get("/healthz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn filter_with_node_names_keeps_the_recorded_node() {
    let pinned = app(&[pps_json()]).await;
    let (status, result) = pinned.post("/filter", FILTER).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(result["NodeNames"], json!(["n1"]));
    assert_eq!(result["Error"], "");
    let unresolvable = result["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(unresolvable.len(), 3, "{result}");
    assert_eq!(
        unresolvable["n2"],
        "ipkeep: pinned to kubernetes.io/hostname=n1 (recorded on node n1, where its IPs are held)"
    );
    // Pinned by zone: every name is looked up; one the cache does not know (yet) is failed,
    // but resolvable.
    let mut by_zone = pps_json();
    by_zone["spec"]["requiredPersistentTopology"]["nodeTopologyKeys"] = json!([ZONE]);
    let zone_app = app(&[by_zone]).await;
    let unknown = FILTER.replace("\"n4\"", "\"n99\"");
    let (_, result) = zone_app.post("/filter", unknown).await;
    assert_eq!(
        result["NodeNames"],
        json!(["n1"]),
        "n1 is the only z1 node of n1..n3"
    );
    assert!(
        result["FailedNodes"]["n99"]
            .as_str()
            .unwrap()
            .contains("not in the node cache"),
        "{result}"
    );
}

#[tokio::test]
async fn filter_passes_pods_that_are_not_pinned_with_their_list() {
    let app = app(&[pps_json()]).await;
    let mut args: Value = serde_json::from_str(FILTER).unwrap();
    args["Pod"]["metadata"]["name"] = json!("db-1"); // no record yet
    let (_, result) = app.post("/filter", args.to_string()).await;
    assert_eq!(result["NodeNames"], json!(["n1", "n2", "n3", "n4"]));
    args["Pod"]["metadata"]["ownerReferences"] = json!([]);
    let (_, result) = app.post("/filter", args.to_string()).await;
    assert_eq!(result["NodeNames"], json!(["n1", "n2", "n3", "n4"]));
    // no nodes at all: still lists, never null
    args["NodeNames"] = Value::Null;
    let (_, result) = app.post("/filter", args.to_string()).await;
    assert_eq!(result["NodeNames"], json!([]));
    assert_eq!(result["Nodes"]["items"], json!([]));
}

#[tokio::test]
async fn filter_with_full_nodes_echoes_the_kept_nodes_byte_for_byte() {
    let app = app(&[pps_json()]).await;
    let mut args: Value = serde_json::from_str(FILTER).unwrap();
    args["NodeNames"] = Value::Null;
    args["Nodes"] = json!({"metadata": {}, "items": (0..5).map(node_json).collect::<Vec<_>>()});
    let (status, bytes) = app.send("/filter", Body::from(args.to_string())).await;
    assert_eq!(status, StatusCode::OK);
    let result: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(result["Nodes"]["items"], json!([node_json(1)]));
    assert_eq!(result["NodeNames"], Value::Null);
    assert_eq!(
        result["FailedAndUnresolvableNodes"]
            .as_object()
            .unwrap()
            .len(),
        4
    );
    let text = String::from_utf8(bytes).unwrap();
    assert!(
        text.contains(&node_json(1).to_string()),
        "raw node echoed unchanged"
    );

    // A pod that is not ours gets every node back.
    args["Pod"]["metadata"]["ownerReferences"] = json!([]);
    let (_, result) = app.post("/filter", args.to_string()).await;
    assert_eq!(result["Nodes"]["items"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn prioritize_scores_the_recorded_node_highest() {
    let app = app(&[pps_json()]).await;
    let (status, scores) = app.post("/prioritize", FILTER).await;
    assert_eq!(status, StatusCode::OK);
    // n1 is the recorded node; n4 shares its zone (z1); n2, n3 do not.
    assert_eq!(
        scores,
        json!([{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}, {"Host": "n3", "Score": 0}, {"Host": "n4", "Score": 9}])
    );
    let mut args: Value = serde_json::from_str(FILTER).unwrap();
    args["NodeNames"] = Value::Null;
    args["Nodes"] = json!({"items": [node_json(1), node_json(2)]});
    let (_, scores) = app.post("/prioritize", args.to_string()).await;
    assert_eq!(
        scores,
        json!([{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}])
    );
}

#[tokio::test]
async fn extender_bad_input_is_an_error_field_not_a_crash() {
    let app = app(&[pps_json()]).await;
    for (what, body, message) in [
        ("malformed", "{\"Pod\": ", "EOF while parsing"),
        (
            "no pod",
            "{\"Pod\": null, \"NodeNames\": [\"n1\"]}",
            "has no Pod",
        ),
        (
            "a node that is not an object",
            "{\"Pod\": {\"metadata\": {\"name\": \"db-0\", \"namespace\": \"prod\", \"ownerReferences\": [{\"apiVersion\": \"apps/v1\", \"kind\": \"StatefulSet\", \"name\": \"db\", \"uid\": \"9a1f0c4e-2b7d-4e1a-8f3c-5d6e7f8a9b0c\", \"controller\": true}]}}, \"Nodes\": {\"items\": [42]}}",
            "expected a Node object",
        ),
    ] {
        let (status, result) = app.post("/filter", body).await;
        assert_eq!(status, StatusCode::OK, "{what}");
        let error = result["Error"].as_str().unwrap();
        assert!(error.contains(message), "{what}: {error:?}");
        let (status, text) = app.post("/prioritize", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}");
        assert!(text.as_str().unwrap().contains(message), "{what}: {text}");
    }
}

/// A retention annotation that does not parse never blocks a pod: the webhook admits it and
/// warns, in the grammar the CNI plugin reads (`ipkeep_values::Retention`), saying what is used
/// instead (a managed pod's typo is replaced by its PersistentPodState's retention).
#[tokio::test]
async fn webhook_warns_of_retention_annotations_that_do_not_parse() {
    let app = app(&[pps_json()]).await;
    let with = |annotations: Value, ours: bool| {
        review_with(|v| {
            v["request"]["object"]["metadata"]["annotations"] = annotations;
            if !ours {
                v["request"]["object"]["metadata"]["ownerReferences"][0]["name"] = json!("web");
            }
        })
    };
    let cases = [
        (
            "a typo in a managed pod's retention",
            with(json!({"ipkeep.dev/ip-retention": "24 hours"}), true),
            vec![
                "ipkeep: invalid annotation ipkeep.dev/ip-retention value \"24 hours\": expected a duration such as 30m, 24h or 1h30m (units ns, us, ms, s, m, h, d), \"forever\", or 0 to turn retention off; replaced by the retention of its PersistentPodState (",
            ],
        ),
        (
            "OpenKruise minutes on a pod of a StatefulSet without a PersistentPodState",
            with(
                json!({"io.kubernetes.cri/reserved-ip-duration": "5m"}),
                false,
            ),
            vec![
                "ipkeep: invalid annotation io.kubernetes.cri/reserved-ip-duration value \"5m\": expected a whole number of minutes, 0 for off; the ipkeep CNI plugin ignores it and holds this pod's IPs for the network's retention (ipam.retention) instead",
            ],
        ),
        (
            "OpenKruise minutes beside a retention the webhook stamps",
            with(
                json!({"io.kubernetes.cri/reserved-ip-duration": "-1"}),
                true,
            ),
            vec![
                "ipkeep: invalid annotation io.kubernetes.cri/reserved-ip-duration value \"-1\": expected a whole number of minutes, 0 for off; it is not used anyway: ipkeep.dev/ip-retention takes precedence",
            ],
        ),
        (
            "both wrong",
            with(
                json!({"ipkeep.dev/ip-retention": "10", "io.kubernetes.cri/reserved-ip-duration": "x"}),
                false,
            ),
            vec![
                "ipkeep.dev/ip-retention value \"10\"",
                "reserved-ip-duration value \"x\"",
            ],
        ),
        (
            "readable values",
            with(
                json!({"ipkeep.dev/ip-retention": "forever", "io.kubernetes.cri/reserved-ip-duration": "30"}),
                true,
            ),
            vec![],
        ),
    ];
    for (what, review, want) in cases {
        let (status, response) = app.post("/mutate-pods", review).await;
        assert_eq!(status, StatusCode::OK, "{what}");
        assert_eq!(response["response"]["allowed"], true, "{what}");
        let warnings: Vec<String> = response["response"]["warnings"]
            .as_array()
            .map(|w| w.iter().map(|w| w.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        assert_eq!(warnings.len(), want.len(), "{what}: {warnings:#?}");
        for (got, want) in warnings.iter().zip(&want) {
            assert!(got.contains(want), "{what}: {got:?} lacks {want:?}");
        }
    }
}

/// The patch is the diff of the fields a decision reads: whatever else the pod has (other
/// annotations, pod anti-affinity, containers) is neither read nor touched.
#[tokio::test]
async fn webhook_patch_adds_to_what_the_pod_has() {
    let app = app(&[pps_json()]).await;
    let anti = json!({"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "db"}}}]});
    let review = review_with(|v| {
        let pod = &mut v["request"]["object"];
        pod["metadata"]["annotations"] =
            json!({"team": "payments", "ipkeep.dev/ip-retention": "forever"});
        pod["spec"]["affinity"]["podAntiAffinity"] = anti.clone();
    });
    let (status, response) = app.post("/mutate-pods", review.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let pod = patched(&review, &response);
    assert_eq!(
        pod["metadata"]["annotations"],
        json!({"team": "payments", "ipkeep.dev/ip-retention": "forever",
            "ipkeep.dev/persistent-pod-state": "db", "ipkeep.dev/pinned-by": "db"}),
        "the pod's own retention wins; other annotations stay"
    );
    assert_eq!(pod["spec"]["affinity"]["podAntiAffinity"], anti);
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][1],
        pinned_host()
    );
    let original: Value =
        serde_json::from_str::<Value>(&review).unwrap()["request"]["object"].clone();
    assert_eq!(pod["spec"]["containers"], original["spec"]["containers"]);
}

#[tokio::test]
async fn extender_takes_at_most_max_nodes() {
    use ipkeep_scheduler_ext::extender::MAX_NODES;
    let app = app(&[pps_json()]).await;
    let mut args: Value = serde_json::from_str(FILTER).unwrap();
    args["NodeNames"] = json!((0..MAX_NODES).map(|i| format!("x{i}")).collect::<Vec<_>>());
    let (status, result) = app.post("/filter", args.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(result["Error"], "");
    assert_eq!(
        result["FailedAndUnresolvableNodes"]
            .as_object()
            .unwrap()
            .len(),
        MAX_NODES
    );
    args["NodeNames"]
        .as_array_mut()
        .unwrap()
        .push(json!("one-too-many"));
    let (status, result) = app.post("/filter", args.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let error = result["Error"].as_str().unwrap();
    assert!(error.contains("more than 10000 nodes"), "{error}");
}

/// Issue 41: `IpkeepWebhookNotCalled` fired on the admission-policy path, where no webhook is
/// called by design: it compared the extender's pins with the webhook's calls. The extender now
/// counts the pins admission missed, pods without `ipkeep.dev/pinned-by` (which the webhook and
/// the policy both set); a pod pinned at admission, by either, is not counted.
#[tokio::test]
async fn filter_counts_only_the_pins_admission_missed() {
    let app = app(&[pps_json()]).await;
    let missed = |metrics: &str, n: u32| {
        metrics.contains(&format!(
            "ipkeep_scheduler_ext_pins_missed_at_admission_total {n}"
        ))
    };
    let (_, metrics) = app.get("/metrics").await;
    assert!(missed(&metrics, 0), "at zero from the start: {metrics}");
    let mut admitted: Value = serde_json::from_str(FILTER).unwrap();
    admitted["Pod"]["metadata"]["annotations"] = json!({"ipkeep.dev/pinned-by": "db"});
    let (status, result) = app.post("/filter", admitted.to_string()).await;
    assert_eq!(
        (status, &result["NodeNames"]),
        (StatusCode::OK, &json!(["n1"]))
    );
    let (_, metrics) = app.get("/metrics").await;
    assert!(missed(&metrics, 0), "pinned at admission: {metrics}");
    let mut unseen: Value = serde_json::from_str(FILTER).unwrap();
    unseen["Pod"]["metadata"]["annotations"] = Value::Null;
    let (_, result) = app.post("/filter", unseen.to_string()).await;
    assert_eq!(result["NodeNames"], json!(["n1"]));
    let (_, metrics) = app.get("/metrics").await;
    assert!(missed(&metrics, 1), "not pinned at admission: {metrics}");
    assert!(
        metrics.contains(r#"ipkeep_scheduler_ext_pins_applied_total{endpoint="filter"} 2"#),
        "{metrics}"
    );
}

/// Security review L-4: `/metrics` is served on the probe listener, which the NetworkPolicy
/// opens to the monitoring namespace only; the webhook port, which the Service exposes to the
/// cluster, then answers the webhooks, the extender and the probes, not `/metrics`.
#[tokio::test]
async fn the_webhook_port_serves_no_metrics_beside_a_probe_listener() {
    let app = app(&[pps_json()]).await;
    let get = |path: &'static str| {
        let state = app.state.clone();
        async move {
            let request = Request::get(path).body(Body::empty()).unwrap();
            webhook_router(state)
                .oneshot(request)
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(get("/metrics").await, StatusCode::NOT_FOUND);
    assert_eq!(get("/healthz").await, StatusCode::OK);
    assert_eq!(get("/readyz").await, StatusCode::OK);
    let (status, _) = app.get("/metrics").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "without a probe listener it serves them"
    );
    let request = Request::post("/filter")
        .header("content-type", "application/json")
        .body(Body::from(FILTER))
        .unwrap();
    let response = webhook_router(app.state.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
