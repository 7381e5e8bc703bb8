//! Plain-format logs cannot be forged through a request: request fields that are logged (pod
//! name, generateName, namespace, uid, what is wrong with a body) have their newlines and other
//! control characters escaped, so each request logs exactly one line.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use ipkeep_scheduler_ext::http::{AppState, Limits, router};
use ipkeep_scheduler_ext::metrics::Metrics;
use serde_json::{Value, json};
use support::{caches, pps_json};
use tower::ServiceExt;

/// A log line as the plain format writes one, to be smuggled into request fields.
const FORGED: &str =
    "\n1999-01-01T00:00:00.000000Z  INFO ipkeep_scheduler_ext::http: forged=true\n";

/// Everything logged, shared with the subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

#[tokio::test]
async fn request_fields_cannot_forge_log_lines() {
    let captured = Captured::default();
    let writer = captured.clone();
    // The binary's plain format (ipkeep_daemon::init_logging), without colours.
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let app = router(AppState::new(
        caches(&[pps_json()], 4).await,
        Arc::new(Metrics::default()),
        Limits::default(),
    ));
    let post = |path: &'static str, body: String| {
        let app = app.clone();
        async move {
            let request = Request::post(path).body(Body::from(body)).unwrap();
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            response.into_body().collect().await.unwrap();
            status
        }
    };
    let mut review: Value = serde_json::from_str(include_str!(
        "fixtures/admission-review-sts-pod-create.json"
    ))
    .unwrap();
    let forged_pod = |review: &mut Value| {
        let pod = &mut review["request"]["object"]["metadata"];
        pod["name"] = json!(format!("db-0{FORGED}"));
        pod["generateName"] = json!(format!("db-{FORGED}"));
        review["request"]["uid"] = json!(format!("uid{FORGED}"));
    };
    forged_pod(&mut review);
    let mut nameless = review.clone();
    nameless["request"]["object"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("name");
    let mut wrong_kind = review.clone();
    wrong_kind["kind"] = json!(format!("AdmissionReview{FORGED}"));
    // JSON whitespace may be a newline: a node that is not an object, quoted in the error.
    let not_a_node = format!(
        "{{\"Pod\": {}, \"Nodes\": {{\"items\": [[\n{:?}]]}}}}",
        review["request"]["object"],
        FORGED.trim()
    );
    let cases = [
        (
            "/mutate-pods",
            "a pod named with a log line",
            review.to_string(),
            true,
        ),
        (
            "/mutate-pods",
            "a pod with only a generateName",
            nameless.to_string(),
            true,
        ),
        (
            "/mutate-pods",
            "a review of a forged kind",
            wrong_kind.to_string(),
            true,
        ),
        (
            "/filter",
            "a node list with a newline in a node",
            not_a_node,
            false,
        ),
    ];
    for (path, what, body, whole) in cases {
        let status = post(path, body).await;
        let logged = captured.take();
        let lines: Vec<&str> = logged.lines().collect();
        assert_eq!(lines.len(), 1, "{what} ({status}) logged {lines:#?}");
        assert!(
            !lines[0].starts_with("1999-01-01"),
            "{what}: a forged line: {logged}"
        );
        assert!(
            !whole || lines[0].contains("forged=true"),
            "{what}: the field is logged, escaped: {logged}"
        );
    }
}
