//! Tests for the mutating admission webhook caller against real in-process HTTP(S) servers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Json, State};
use axum::http::{HeaderMap, Uri};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

use super::*;

type Handler = Arc<dyn Fn(&Value) -> Value + Send + Sync>;
/// What a test server received: request URI, Host header and the review.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Value)>>>;

#[derive(Clone)]
struct TestState {
    handler: Handler,
    delay: Duration,
    calls: Arc<AtomicUsize>,
    seen: Seen,
}

/// A running webhook server: where it is, how often it was called and what it received.
struct Server {
    addr: SocketAddr,
    state: TestState,
}

impl Server {
    fn calls(&self) -> usize {
        self.state.calls.load(Ordering::SeqCst)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn last(&self) -> (String, Option<String>, Value) {
        self.state.seen.lock().unwrap().last().cloned().unwrap()
    }
}

async fn handle(
    State(state): State<TestState>,
    uri: Uri,
    headers: HeaderMap,
    Json(review): Json<Value>,
) -> Json<Value> {
    state.calls.fetch_add(1, Ordering::SeqCst);
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned);
    state
        .seen
        .lock()
        .unwrap()
        .push((uri.to_string(), host, review.clone()));
    tokio::time::sleep(state.delay).await;
    Json((state.handler)(&review))
}

fn state(handler: impl Fn(&Value) -> Value + Send + Sync + 'static, delay: Duration) -> TestState {
    TestState {
        handler: Arc::new(handler),
        delay,
        calls: Arc::default(),
        seen: Arc::default(),
    }
}

async fn serve_on<L: axum::serve::Listener<Addr = SocketAddr>>(
    listener: L,
    state: TestState,
) -> Server {
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new()
        .fallback(axum::routing::post(handle))
        .with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    Server { addr, state }
}

async fn serve(handler: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Server {
    serve_slow(handler, Duration::ZERO).await
}

async fn serve_slow(
    handler: impl Fn(&Value) -> Value + Send + Sync + 'static,
    delay: Duration,
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener, state(handler, delay)).await
}

/// A listener that completes a TLS handshake before handing a connection to axum.
struct TlsListener {
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// A CA and a serving certificate it signed, for `names`.
struct Pki {
    ca_bundle: String,
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

fn pki(names: &[&str]) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "apisim test ca");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca_bundle: BASE64.encode(ca_cert.pem()),
        cert: cert.der().clone(),
        key: key.serialize_der(),
    }
}

async fn serve_tls(pki: &Pki, handler: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Server {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![pki.cert.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.key.clone())),
        )
        .unwrap();
    let listener = TlsListener {
        tcp: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    serve_on(listener, state(handler, Duration::ZERO)).await
}

/// An allowing response, with a JSON patch if `patch` is not null.
fn allow(review: &Value, patch: Value) -> Value {
    let mut response = json!({"uid": review["request"]["uid"], "allowed": true});
    if !patch.is_null() {
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(BASE64.encode(patch.to_string()));
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// A handler that sets label `key` to `value` on the object.
fn labeller(key: &'static str, value: &'static str) -> impl Fn(&Value) -> Value + Send + Sync {
    move |review| {
        let path = format!("/metadata/labels/{key}");
        allow(review, json!([{"op": "add", "path": path, "value": value}]))
    }
}

/// A webhook for CREATE of pods calling `url`, with `extra` fields merged over it.
fn webhook(name: &str, url: &str, extra: Value) -> Value {
    let mut hook = json!({
        "name": name,
        "clientConfig": {"url": url},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                   "resources": ["pods"]}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    });
    for (key, value) in extra.as_object().unwrap() {
        hook[key] = value.clone();
    }
    hook
}

fn config(name: &str, webhooks: Vec<Value>) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": webhooks,
    })
}

fn pod(labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "namespace": "default", "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
}

fn pod_create(labels: Value) -> AdmissionAttributes {
    AdmissionAttributes {
        operation: Operation::Create,
        group: String::new(),
        version: "v1".into(),
        kind: "Pod".into(),
        resource: "pods".into(),
        sub_resource: None,
        namespaced: true,
        name: "web".into(),
        namespace: Some("default".into()),
        object: Some(pod(labels)),
        old_object: None,
        namespace_object: Some(json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "default", "labels": {"env": "test"}}})),
        options: Some(json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"})),
        dry_run: false,
    }
}

fn caller() -> WebhookCaller {
    WebhookCaller::new(HashMap::new())
}

async fn admit_one(
    hook: Value,
    attrs: &AdmissionAttributes,
) -> Result<AdmissionOutcome, AdmissionError> {
    caller().admit(&[config("c", vec![hook])], attrs).await
}

#[tokio::test]
async fn patch_is_applied_and_the_review_is_what_kube_apiserver_sends() {
    let server = serve(labeller("mutated", "yes")).await;
    let attrs = pod_create(json!({"app": "web"}));
    let outcome = admit_one(
        webhook("label.test", &server.url("/mutate"), json!({})),
        &attrs,
    )
    .await
    .unwrap();
    let object = outcome.object.unwrap();
    assert_eq!(
        object["metadata"]["labels"],
        json!({"app": "web", "mutated": "yes"})
    );
    assert_eq!(server.calls(), 1);
    let (uri, _, review) = server.last();
    assert_eq!(uri, "/mutate?timeout=10s");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    let request = &review["request"];
    assert_eq!(request["uid"].as_str().unwrap().len(), 36);
    assert_eq!(
        request["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(request["requestKind"], request["kind"]);
    assert_eq!(request["requestResource"], request["resource"]);
    assert!(request.get("subResource").is_none());
    assert_eq!(request["name"], "web");
    assert_eq!(request["namespace"], "default");
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(request["userInfo"]["username"], "system:admin");
    assert_eq!(
        request["userInfo"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );
    assert_eq!(request["object"], attrs.object.unwrap());
    assert_eq!(request["oldObject"], Value::Null);
    assert_eq!(request["dryRun"], false);
    assert_eq!(request["options"]["kind"], "CreateOptions");
}

#[tokio::test]
async fn uids_are_unique_per_call() {
    let server = serve(|review| allow(review, Value::Null)).await;
    let hook = webhook("a.test", &server.url("/"), json!({}));
    let configs = [config("c", vec![hook.clone(), hook])];
    caller()
        .admit(&configs, &pod_create(json!({})))
        .await
        .unwrap();
    let seen = server.state.seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0].2["request"]["uid"], seen[1].2["request"]["uid"]);
}

#[tokio::test]
async fn configurations_run_in_name_order_and_each_webhook_sees_the_previous_patches() {
    // Each webhook appends its own name to the "order" annotation it receives.
    let append = |me: &'static str| {
        move |review: &Value| {
            let annotations = &review["request"]["object"]["metadata"]["annotations"];
            let order = annotations["order"].as_str().unwrap_or_default();
            let value = if order.is_empty() {
                me.to_owned()
            } else {
                format!("{order},{me}")
            };
            allow(
                review,
                json!([{"op": "add", "path": "/metadata/annotations",
                                   "value": {"order": value}}]),
            )
        }
    };
    let (a1, a2, b) = (
        serve(append("a1")).await,
        serve(append("a2")).await,
        serve(append("b")).await,
    );
    let configs = [
        config("b-config", vec![webhook("b.test", &b.url("/"), json!({}))]),
        config(
            "a-config",
            vec![
                webhook("a1.test", &a1.url("/"), json!({})),
                webhook("a2.test", &a2.url("/"), json!({})),
            ],
        ),
    ];
    let outcome = caller()
        .admit(&configs, &pod_create(json!({})))
        .await
        .unwrap();
    assert_eq!(
        outcome.object.unwrap()["metadata"]["annotations"]["order"],
        "a1,a2,b"
    );
}

#[tokio::test]
async fn rules_that_do_not_match_are_not_called() {
    let server = serve(|review| allow(review, Value::Null)).await;
    let url = server.url("/");
    let status = AdmissionAttributes {
        operation: Operation::Update,
        sub_resource: Some("status".into()),
        old_object: Some(pod(json!({}))),
        ..pod_create(json!({}))
    };
    let node = AdmissionAttributes {
        group: String::new(),
        kind: "Node".into(),
        resource: "nodes".into(),
        namespaced: false,
        name: "n1".into(),
        namespace: None,
        namespace_object: None,
        ..pod_create(json!({}))
    };
    let rule = |ops: Value, resources: Value, scope: Value| {
        let mut rule = json!({"operations": ops, "apiGroups": ["*"], "apiVersions": ["*"],
                              "resources": resources});
        if !scope.is_null() {
            rule["scope"] = scope;
        }
        json!({"rules": [rule]})
    };
    let cases = [
        (
            "operation",
            rule(json!(["UPDATE"]), json!(["pods"]), Value::Null),
            pod_create(json!({})),
            0,
        ),
        (
            "wildcard operation",
            rule(json!(["*"]), json!(["pods"]), Value::Null),
            pod_create(json!({})),
            1,
        ),
        (
            "resource",
            rule(json!(["*"]), json!(["services"]), Value::Null),
            pod_create(json!({})),
            0,
        ),
        (
            "wildcard resource",
            rule(json!(["*"]), json!(["*"]), Value::Null),
            pod_create(json!({})),
            1,
        ),
        (
            "parent for subresource",
            rule(json!(["*"]), json!(["pods"]), Value::Null),
            status.clone(),
            0,
        ),
        (
            "* for subresource",
            rule(json!(["*"]), json!(["*"]), Value::Null),
            status.clone(),
            0,
        ),
        (
            "pods/status",
            rule(json!(["*"]), json!(["pods/status"]), Value::Null),
            status.clone(),
            1,
        ),
        (
            "*/status",
            rule(json!(["*"]), json!(["*/status"]), Value::Null),
            status.clone(),
            1,
        ),
        (
            "*/*",
            rule(json!(["*"]), json!(["*/*"]), Value::Null),
            status.clone(),
            1,
        ),
        (
            "pods/status on pods",
            rule(json!(["*"]), json!(["pods/status"]), Value::Null),
            pod_create(json!({})),
            0,
        ),
        (
            "Cluster scope",
            rule(json!(["*"]), json!(["*"]), json!("Cluster")),
            pod_create(json!({})),
            0,
        ),
        (
            "Namespaced scope",
            rule(json!(["*"]), json!(["*"]), json!("Namespaced")),
            pod_create(json!({})),
            1,
        ),
        (
            "Namespaced scope, node",
            rule(json!(["*"]), json!(["*"]), json!("Namespaced")),
            node.clone(),
            0,
        ),
        (
            "Cluster scope, node",
            rule(json!(["*"]), json!(["*"]), json!("Cluster")),
            node.clone(),
            1,
        ),
        (
            "* scope, node",
            rule(json!(["*"]), json!(["*"]), json!("*")),
            node,
            1,
        ),
        (
            "group",
            json!({"rules": [{"operations": ["*"], "apiGroups": ["apps"],
                                     "apiVersions": ["*"], "resources": ["*"]}]}),
            pod_create(json!({})),
            0,
        ),
        (
            "version",
            json!({"rules": [{"operations": ["*"], "apiGroups": [""],
                                       "apiVersions": ["v2"], "resources": ["*"]}]}),
            pod_create(json!({})),
            0,
        ),
        ("no rules", json!({"rules": []}), pod_create(json!({})), 0),
    ];
    for (what, extra, attrs, expected) in cases {
        let before = server.calls();
        admit_one(webhook("rules.test", &url, extra), &attrs)
            .await
            .unwrap();
        assert_eq!(server.calls() - before, expected, "{what}");
    }
}

#[tokio::test]
async fn admission_configuration_objects_never_go_to_webhooks() {
    let server = serve(|review| allow(review, Value::Null)).await;
    let hook = webhook(
        "all.test",
        &server.url("/"),
        json!({"rules": [{"operations": ["*"],
        "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]}),
    );
    let attrs = AdmissionAttributes {
        group: "admissionregistration.k8s.io".into(),
        kind: "MutatingWebhookConfiguration".into(),
        resource: "mutatingwebhookconfigurations".into(),
        namespaced: false,
        namespace: None,
        ..pod_create(json!({}))
    };
    admit_one(hook, &attrs).await.unwrap();
    assert_eq!(server.calls(), 0);
}

#[tokio::test]
async fn object_and_namespace_selectors_choose_the_webhooks_called() {
    let server = serve(|review| allow(review, Value::Null)).await;
    let url = server.url("/");
    let selected = |selector_field: &str, selector: Value| {
        webhook("sel.test", &url, json!({selector_field: selector}))
    };
    let app_web = json!({"matchLabels": {"app": "web"}});
    let update = AdmissionAttributes {
        operation: Operation::Update,
        object: Some(pod(json!({"app": "db"}))),
        old_object: Some(pod(json!({"app": "web"}))),
        ..pod_create(json!({}))
    };
    let no_namespace = AdmissionAttributes {
        namespace_object: None,
        ..pod_create(json!({}))
    };
    let namespace = |op: Operation, labels: Value| AdmissionAttributes {
        operation: op,
        kind: "Namespace".into(),
        resource: "namespaces".into(),
        namespaced: false,
        name: "team".into(),
        namespace: None,
        object: Some(json!({"metadata": {"name": "team", "labels": labels}})),
        namespace_object: None,
        ..pod_create(json!({}))
    };
    let all = json!({"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
                                "resources": ["*"]}]});
    let with_all = |mut hook: Value| {
        hook["rules"] = all["rules"].clone();
        hook
    };
    let node = AdmissionAttributes {
        resource: "nodes".into(),
        namespaced: false,
        namespace: None,
        namespace_object: None,
        ..pod_create(json!({}))
    };
    let env_prod = json!({"matchLabels": {"env": "prod"}});
    let cases = [
        (
            "object matches",
            selected("objectSelector", app_web.clone()),
            pod_create(json!({"app": "web"})),
            1,
        ),
        (
            "object does not match",
            selected("objectSelector", app_web.clone()),
            pod_create(json!({"app": "db"})),
            0,
        ),
        (
            "old object matches",
            with_all(selected("objectSelector", app_web.clone())),
            update,
            1,
        ),
        (
            "empty object selector",
            selected("objectSelector", json!({})),
            pod_create(json!({})),
            1,
        ),
        (
            "namespace matches",
            selected("namespaceSelector", json!({"matchLabels": {"env": "test"}})),
            pod_create(json!({})),
            1,
        ),
        (
            "namespace does not match",
            selected("namespaceSelector", env_prod.clone()),
            pod_create(json!({})),
            0,
        ),
        (
            "missing namespace: no labels",
            selected("namespaceSelector", env_prod.clone()),
            no_namespace.clone(),
            0,
        ),
        (
            "missing namespace: DoesNotExist",
            selected(
                "namespaceSelector",
                json!({"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]}),
            ),
            no_namespace,
            1,
        ),
        (
            "cluster-scoped object",
            with_all(selected("namespaceSelector", env_prod.clone())),
            node,
            1,
        ),
        (
            "namespace's own labels",
            with_all(selected("namespaceSelector", env_prod.clone())),
            namespace(Operation::Create, json!({"env": "prod"})),
            1,
        ),
        (
            "namespace's own labels, no match",
            with_all(selected("namespaceSelector", env_prod.clone())),
            namespace(Operation::Create, json!({"env": "dev"})),
            0,
        ),
    ];
    for (what, hook, attrs, expected) in cases {
        let before = server.calls();
        admit_one(hook, &attrs).await.unwrap();
        assert_eq!(server.calls() - before, expected, "{what}");
    }
}

#[tokio::test]
async fn malformed_selectors_are_errors_when_the_rules_match() {
    let server = serve(|review| allow(review, Value::Null)).await;
    let bad = json!({"matchExpressions": [{"key": "app", "operator": "Like", "values": ["x"]}]});
    let hook = webhook("bad.test", &server.url("/"), json!({"objectSelector": bad}));
    let err = admit_one(hook.clone(), &pod_create(json!({})))
        .await
        .unwrap_err();
    let (code, reason, message) = err.status();
    assert_eq!((code, reason), (500, "InternalError"));
    assert!(
        message.contains("\"bad.test\"") && message.contains("objectSelector"),
        "{message}"
    );
    let delete = AdmissionAttributes {
        operation: Operation::Delete,
        ..pod_create(json!({}))
    };
    admit_one(hook, &delete).await.unwrap();
    let hook = webhook(
        "bad.test",
        &server.url("/"),
        json!({"namespaceSelector": "env=prod"}),
    );
    let err = admit_one(hook, &pod_create(json!({}))).await.unwrap_err();
    assert!(err.to_string().contains("namespaceSelector"), "{err}");
    assert_eq!(server.calls(), 0);
}

#[tokio::test]
async fn denials_carry_the_webhooks_code_and_message() {
    let deny = |status: Value| {
        move |review: &Value| {
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": review["request"]["uid"], "allowed": false, "status": status,
                                "warnings": ["careful"]}})
        }
    };
    let forbidden = serve(deny(
        json!({"code": 403, "reason": "Forbidden", "message": "no pods on fridays"}),
    ))
    .await;
    let err = admit_one(
        webhook("deny.test", &forbidden.url("/"), json!({})),
        &pod_create(json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.status(),
        (
            403,
            "Forbidden",
            "admission webhook \"deny.test\" denied the request: no pods on fridays".into()
        )
    );
    let bare = serve(deny(Value::Null)).await;
    let err = admit_one(
        webhook("deny.test", &bare.url("/"), json!({})),
        &pod_create(json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.status(),
        (
            400,
            "",
            "admission webhook \"deny.test\" denied the request without explanation".into()
        )
    );
    let odd = serve(deny(json!({"code": 200, "reason": "Whatever"}))).await;
    let err = admit_one(
        webhook("deny.test", &odd.url("/"), json!({})),
        &pod_create(json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.status(),
        (
            400,
            "",
            "admission webhook \"deny.test\" denied the request: Whatever".into()
        )
    );
}

#[tokio::test]
async fn timeouts_fail_closed_or_open_by_failure_policy() {
    let slow = serve_slow(labeller("slow", "yes"), Duration::from_secs(3)).await;
    let after = serve(labeller("after", "yes")).await;
    let hooks = |policy: &str| {
        vec![
            webhook(
                "slow.test",
                &slow.url("/"),
                json!({"timeoutSeconds": 1, "failurePolicy": policy}),
            ),
            webhook("after.test", &after.url("/"), json!({})),
        ]
    };
    let started = std::time::Instant::now();
    let err = caller()
        .admit(&[config("c", hooks("Fail"))], &pod_create(json!({})))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(2500));
    let (code, reason, message) = err.status();
    assert_eq!((code, reason), (500, "InternalError"));
    assert!(
        message.starts_with("Internal error occurred: failed calling webhook \"slow.test\": "),
        "{message}"
    );
    assert!(message.contains("context deadline exceeded"), "{message}");
    assert!(message.contains("timeout=1s"), "{message}");
    assert_eq!(after.calls(), 0);
    let outcome = caller()
        .admit(
            &[config("c", hooks("Ignore"))],
            &pod_create(json!({"app": "web"})),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome.object.unwrap()["metadata"]["labels"],
        json!({"app": "web", "after": "yes"})
    );
}

#[tokio::test]
async fn unreachable_webhooks_fail_by_policy() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    drop(listener);
    let err = admit_one(
        webhook("gone.test", &url, json!({})),
        &pod_create(json!({})),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AdmissionError::CallFailed { .. }), "{err}");
    let outcome = admit_one(
        webhook("gone.test", &url, json!({"failurePolicy": "Ignore"})),
        &pod_create(json!({})),
    )
    .await
    .unwrap();
    assert_eq!(outcome.object, Some(pod(json!({}))));
}

#[tokio::test]
async fn bad_responses_are_call_failures() {
    type Respond = fn(&Value) -> Value;
    let cases: [(&str, Respond); 5] = [
        ("expected response.uid=", |_| {
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "response": {"uid": "not-mine", "allowed": true}})
        }),
        (
            "expected webhook response of admission.k8s.io/v1",
            |review| {
                let mut answer = allow(review, Value::Null);
                answer["apiVersion"] = json!("admission.k8s.io/v1beta1");
                answer
            },
        ),
        ("response.patch but not response.patchType", |review| {
            let mut answer = allow(review, json!([{"op": "add", "path": "/x", "value": 1}]));
            answer["response"]
                .as_object_mut()
                .unwrap()
                .remove("patchType");
            answer
        }),
        ("unsupported patch type", |review| {
            let mut answer = allow(review, json!([{"op": "add", "path": "/x", "value": 1}]));
            answer["response"]["patchType"] = json!("MergePatch");
            answer
        }),
        (
            "webhook response was absent",
            |_| json!({"apiVersion": "admission.k8s.io/v1"}),
        ),
    ];
    for (expected, make) in cases {
        let server = serve(make).await;
        let err = admit_one(
            webhook("bad.test", &server.url("/"), json!({})),
            &pod_create(json!({})),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, AdmissionError::CallFailed { .. }), "{err}");
        assert!(err.to_string().contains(expected), "{err}");
        let ignored = webhook(
            "bad.test",
            &server.url("/"),
            json!({"failurePolicy": "Ignore"}),
        );
        admit_one(ignored, &pod_create(json!({}))).await.unwrap();
    }
}

#[tokio::test]
async fn patches_that_cannot_be_applied_fail_whatever_the_policy() {
    let server = serve(|review| {
        allow(
            review,
            json!([{"op": "replace", "path": "/metadata/missing/x", "value": 1}]),
        )
    })
    .await;
    let hook = webhook(
        "patch.test",
        &server.url("/"),
        json!({"failurePolicy": "Ignore"}),
    );
    let err = admit_one(hook.clone(), &pod_create(json!({})))
        .await
        .unwrap_err();
    assert!(matches!(err, AdmissionError::PatchFailed { .. }), "{err}");
    assert_eq!(err.status().0, 500);
    let delete_rules = json!({"rules": [{"operations": ["DELETE"], "apiGroups": [""],
                                         "apiVersions": ["v1"], "resources": ["pods"]}]});
    let hook = webhook("patch.test", &server.url("/"), delete_rules);
    let delete = AdmissionAttributes {
        operation: Operation::Delete,
        object: None,
        old_object: Some(pod(json!({}))),
        ..pod_create(json!({}))
    };
    let err = admit_one(hook, &delete).await.unwrap_err();
    assert!(
        err.to_string().contains("not supported for this operation"),
        "{err}"
    );
}

#[tokio::test]
async fn https_url_trusts_only_the_ca_bundle() {
    let trusted = pki(&["127.0.0.1"]);
    let server = serve_tls(&trusted, labeller("tls", "yes")).await;
    let url = format!("https://{}/mutate", server.addr);
    let hook = |ca: Option<&str>| {
        let mut hook = webhook("tls.test", &url, json!({}));
        if let Some(ca) = ca {
            hook["clientConfig"]["caBundle"] = json!(ca);
        }
        hook
    };
    let outcome = admit_one(hook(Some(&trusted.ca_bundle)), &pod_create(json!({})))
        .await
        .unwrap();
    assert_eq!(outcome.object.unwrap()["metadata"]["labels"]["tls"], "yes");
    let other = pki(&["127.0.0.1"]);
    let err = admit_one(hook(Some(&other.ca_bundle)), &pod_create(json!({})))
        .await
        .unwrap_err();
    assert!(matches!(err, AdmissionError::CallFailed { .. }), "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    let err = admit_one(hook(None), &pod_create(json!({})))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no caBundle"), "{err}");
    let err = admit_one(hook(Some("not base64!")), &pod_create(json!({})))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("caBundle"), "{err}");
    assert_eq!(server.calls(), 1);
}

#[tokio::test]
async fn services_are_reached_through_the_loopback_override_with_their_dns_name() {
    let pki_ok = pki(&["webhook.ipkeep-system.svc"]);
    let server = serve_tls(&pki_ok, labeller("svc", "yes")).await;
    let wrong_name = pki(&["other.ipkeep-system.svc"]);
    let impostor = serve_tls(&wrong_name, labeller("svc", "no")).await;
    let endpoints = HashMap::from([
        (
            ("ipkeep-system".to_owned(), "webhook".to_owned()),
            server.addr,
        ),
        (
            ("ipkeep-system".to_owned(), "impostor".to_owned()),
            impostor.addr,
        ),
    ]);
    let caller = WebhookCaller::new(endpoints);
    let hook = |name: &str, ca: &str| {
        webhook(
            "svc.test",
            "unused",
            json!({"clientConfig": {
            "service": {"namespace": "ipkeep-system", "name": name, "path": "/mutate-pods"},
            "caBundle": ca}}),
        )
    };
    let attrs = pod_create(json!({}));
    let outcome = caller
        .admit(
            &[config("c", vec![hook("webhook", &pki_ok.ca_bundle)])],
            &attrs,
        )
        .await
        .unwrap();
    assert_eq!(outcome.object.unwrap()["metadata"]["labels"]["svc"], "yes");
    let (uri, host, _) = server.last();
    assert_eq!(uri, "/mutate-pods?timeout=10s");
    assert_eq!(host.as_deref(), Some("webhook.ipkeep-system.svc:443"));
    // The impostor's certificate is for another name.
    let err = caller
        .admit(
            &[config("c", vec![hook("impostor", &wrong_name.ca_bundle)])],
            &attrs,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, AdmissionError::CallFailed { .. }), "{err}");
    assert_eq!(impostor.calls(), 0);
    let err = caller
        .admit(
            &[config("c", vec![hook("nowhere", &pki_ok.ca_bundle)])],
            &attrs,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ipkeep-system/nowhere"), "{err}");
}

#[tokio::test]
async fn dry_run_skips_nothing_but_refuses_webhooks_with_side_effects() {
    let server = serve(labeller("dry", "yes")).await;
    let attrs = AdmissionAttributes {
        dry_run: true,
        ..pod_create(json!({}))
    };
    let hook = |effects: &str| {
        webhook(
            "dry.test",
            &server.url("/"),
            json!({"sideEffects": effects}),
        )
    };
    for effects in ["Unknown", "Some"] {
        let err = admit_one(hook(effects), &attrs).await.unwrap_err();
        assert_eq!(
            err.status(),
            (
                400,
                "BadRequest",
                "admission webhook \"dry.test\" does not support dry run".into()
            )
        );
    }
    assert_eq!(server.calls(), 0);
    let outcome = admit_one(hook("NoneOnDryRun"), &attrs).await.unwrap();
    assert_eq!(outcome.object.unwrap()["metadata"]["labels"]["dry"], "yes");
    assert_eq!(server.last().2["request"]["dryRun"], true);
    // Without dry run, side effects do not matter.
    admit_one(hook("Unknown"), &pod_create(json!({})))
        .await
        .unwrap();
    assert_eq!(server.calls(), 2);
}

#[tokio::test]
async fn if_needed_webhooks_are_reinvoked_once_after_later_changes() {
    // "first" records whether it saw the label set by "second".
    let first = serve(|review| {
        let saw = review["request"]["object"]["metadata"]["labels"]["second"].is_string();
        allow(
            review,
            json!([{"op": "add", "path": "/metadata/labels/first-saw-second",
                              "value": saw.to_string()}]),
        )
    })
    .await;
    let second = serve(labeller("second", "yes")).await;
    let configs = |policy: &str| {
        [config(
            "c",
            vec![
                webhook(
                    "first.test",
                    &first.url("/"),
                    json!({"reinvocationPolicy": policy}),
                ),
                webhook(
                    "second.test",
                    &second.url("/"),
                    json!({"reinvocationPolicy": policy}),
                ),
            ],
        )]
    };
    let outcome = caller()
        .admit(&configs("IfNeeded"), &pod_create(json!({})))
        .await
        .unwrap();
    let labels = &outcome.object.unwrap()["metadata"]["labels"];
    assert_eq!(labels["first-saw-second"], "true");
    assert_eq!((first.calls(), second.calls()), (2, 1));
    let outcome = caller()
        .admit(&configs("Never"), &pod_create(json!({})))
        .await
        .unwrap();
    assert_eq!(
        outcome.object.unwrap()["metadata"]["labels"]["first-saw-second"],
        "false"
    );
    assert_eq!((first.calls(), second.calls()), (3, 2));
}

#[tokio::test]
async fn warnings_and_audit_annotations_are_collected() {
    let server = serve(|review| {
        let mut answer = allow(review, Value::Null);
        answer["response"]["warnings"] = json!(["deprecated field", "deprecated field"]);
        answer["response"]["auditAnnotations"] = json!({"decision": "kept"});
        answer
    })
    .await;
    let outcome = admit_one(
        webhook("warn.test", &server.url("/"), json!({})),
        &pod_create(json!({})),
    )
    .await
    .unwrap();
    assert_eq!(outcome.warnings, vec!["deprecated field".to_owned()]);
    assert_eq!(
        outcome
            .annotations
            .get("warn.test/decision")
            .map(String::as_str),
        Some("kept")
    );
}

#[tokio::test]
async fn invalid_configurations_are_clear_errors() {
    let url = "http://127.0.0.1:1/";
    let cases = [
        (json!("not an object"), "\"\""),
        (
            config(
                "c",
                vec![webhook("t.test", url, json!({"timeoutSeconds": 31}))],
            ),
            "timeoutSeconds",
        ),
        (
            config(
                "c",
                vec![webhook("t.test", url, json!({"timeoutSeconds": 0}))],
            ),
            "timeoutSeconds",
        ),
        (
            config(
                "c",
                vec![webhook(
                    "t.test",
                    url,
                    json!({"failurePolicy": "Sometimes"}),
                )],
            ),
            "failurePolicy",
        ),
        (
            config("c", vec![webhook("t.test", "ftp://x/", json!({}))]),
            "http(s)",
        ),
        (
            config(
                "c",
                vec![webhook("t.test", url, json!({"clientConfig": {}}))],
            ),
            "exactly one",
        ),
        (
            config(
                "c",
                vec![webhook(
                    "t.test",
                    url,
                    json!({"admissionReviewVersions": []}),
                )],
            ),
            "admissionReviewVersions",
        ),
        (
            config("c", vec![webhook("t.test", url, json!({"rules": "pods"}))]),
            "invalid type",
        ),
        (
            config(
                "c",
                vec![webhook(
                    "t.test",
                    url,
                    json!({"clientConfig": {"service":
            {"namespace": "n", "name": "s", "port": 70000}}}),
                )],
            ),
            "port",
        ),
    ];
    for (configuration, expected) in cases {
        let err = caller()
            .admit(&[configuration], &pod_create(json!({})))
            .await
            .unwrap_err();
        assert!(
            matches!(err, AdmissionError::InvalidConfiguration { .. }),
            "{err}"
        );
        assert!(err.to_string().contains(expected), "{expected}: {err}");
        assert_eq!(err.status().0, 500);
    }
}

#[tokio::test]
async fn webhooks_apisim_cannot_honour_are_named_errors() {
    let server = serve(|review| allow(review, Value::Null)).await;
    let hook = webhook(
        "old.test",
        &server.url("/"),
        json!({"admissionReviewVersions": ["v1beta1"]}),
    );
    let err = admit_one(hook, &pod_create(json!({}))).await.unwrap_err();
    assert!(
        err.to_string().contains("\"old.test\"") && err.to_string().contains("v1beta1"),
        "{err}"
    );
    let hook = webhook(
        "cel.test",
        &server.url("/"),
        json!({"matchConditions": [
        {"name": "x", "expression": "true"}]}),
    );
    let err = admit_one(hook, &pod_create(json!({}))).await.unwrap_err();
    assert!(err.to_string().contains("matchConditions"), "{err}");
    assert_eq!(server.calls(), 0);
}

#[tokio::test]
async fn junk_configurations_and_responses_are_errors_not_panics() {
    let junk_configs = [
        json!(null),
        json!([]),
        json!({"webhooks": 5}),
        json!({"webhooks": [null]}),
        json!({"webhooks": [{"name": "x", "clientConfig": {"url": "http://[::1"}}]}),
        json!({"webhooks": [{"name": "x", "clientConfig": {"service": {"name": "a b", "namespace": "n"}},
                             "admissionReviewVersions": ["v1"]}]}),
        json!({"webhooks": [{"name": "x", "clientConfig": {"url": "http://127.0.0.1:1/"},
                             "admissionReviewVersions": ["v1"], "timeoutSeconds": 1e300}]}),
    ];
    for configuration in junk_configs {
        let result = caller()
            .admit(std::slice::from_ref(&configuration), &pod_create(json!({})))
            .await;
        assert!(
            matches!(result, Err(AdmissionError::InvalidConfiguration { .. })),
            "{configuration}: {result:?}"
        );
    }
    let respond = |response: Value| {
        move |review: &Value| {
            let mut answer = allow(review, Value::Null);
            for (key, value) in response.as_object().unwrap() {
                answer["response"][key] = value.clone();
            }
            answer
        }
    };
    let root = BASE64.encode(json!([{"op": "replace", "path": "", "value": 5}]).to_string());
    let junk_responses = [
        json!({"patch": "!!!", "patchType": "JSONPatch"}),
        json!({"patch": BASE64.encode("not json"), "patchType": "JSONPatch"}),
        json!({"patch": root, "patchType": "JSONPatch"}),
        json!({"status": {"code": 1e300}, "allowed": false}),
        json!({"warnings": [1, 2]}),
    ];
    for response in junk_responses {
        let server = serve(respond(response.clone())).await;
        let hook = webhook("junk.test", &server.url("/"), json!({}));
        let result = admit_one(hook, &pod_create(json!({}))).await;
        assert!(result.is_err(), "{response}: {result:?}");
    }
    // An empty patch is no patch.
    let server = serve(respond(json!({"patch": ""}))).await;
    let hook = webhook("empty.test", &server.url("/"), json!({}));
    let outcome = admit_one(hook, &pod_create(json!({}))).await.unwrap();
    assert_eq!(outcome.object, Some(pod(json!({}))));
}
