//! Mutating admission webhooks, called the way kube-apiserver calls them
//! (`admissionregistration.k8s.io/v1` configurations, `admission.k8s.io/v1` reviews).
//!
//! [`WebhookCaller::admit`] takes the stored `MutatingWebhookConfiguration` objects and one
//! request's attributes, and promises kube-apiserver's behaviour: configurations in name order,
//! webhooks in list order, each seeing the object as patched by the ones before; the same rule,
//! `namespaceSelector` and `objectSelector` matching; `failurePolicy`, `timeoutSeconds`,
//! `sideEffects` on dry run and one extra round for `reinvocationPolicy: IfNeeded`; denials and
//! failures carry the HTTP code, reason and message the real server returns. Services are
//! reached through a loopback override while the certificate is still checked for
//! `<name>.<namespace>.svc`, trusting only the `caBundle`. What it cannot evaluate (CEL
//! `matchConditions`, v1beta1-only webhooks, malformed selectors or configurations) is an
//! error, never a silent match, and no configuration or response makes it panic.
//!
//! Not modelled: `matchPolicy: Equivalent` (rules match the request's own group and version)
//! and other admission plugins.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::Uri;
use hyper::body::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::selector::{LabelSelector, labels_of};

/// The largest webhook response read.
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// The `metav1.StatusReason`s a denial may carry.
const REASONS: &str = "Unauthorized Forbidden NotFound AlreadyExists Conflict Gone Invalid \
    ServerTimeout StoreReadError Timeout TooManyRequests BadRequest MethodNotAllowed \
    NotAcceptable RequestEntityTooLarge UnsupportedMediaType InternalError Expired \
    ServiceUnavailable";

/// The operation of an admission request, serialised as `"CREATE"`, `"UPDATE"`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    /// The name used in rules and reviews.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Connect => "CONNECT",
        }
    }
}

/// What an admission request is about. `group`/`version`/`kind` are the object's, `resource`
/// the plural (`pods`), `sub_resource` e.g. `Some("status")`; `object` is `None` for DELETE,
/// `old_object` the stored object; `namespace_object` is the Namespace of a namespaced request
/// (or the one being deleted) if it exists; `options` the Create/Update/DeleteOptions as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionAttributes {
    pub operation: Operation,
    pub group: String,
    pub version: String,
    pub kind: String,
    pub resource: String,
    pub sub_resource: Option<String>,
    pub namespaced: bool,
    pub name: String,
    pub namespace: Option<String>,
    pub object: Option<Value>,
    pub old_object: Option<Value>,
    pub namespace_object: Option<Value>,
    pub options: Option<Value>,
    pub dry_run: bool,
}

/// The result of admission when every webhook allowed the request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionOutcome {
    /// The object as mutated by the webhooks (unchanged if none patched it).
    pub object: Option<Value>,
    /// Warnings returned by the webhooks, in order, without duplicates.
    pub warnings: Vec<String>,
    /// The webhooks' audit annotations, keyed `<webhook name>/<key>` as in the audit log.
    pub annotations: BTreeMap<String, String>,
}

/// Why admission refused a request; [`AdmissionError::status`] gives the API server's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// A MutatingWebhookConfiguration cannot be read or breaks a rule of the v1 API (500).
    #[error("mutatingwebhookconfiguration {configuration:?} is invalid: {message}")]
    InvalidConfiguration {
        configuration: String,
        message: String,
    },
    /// A webhook matched the request but cannot be evaluated as configured: a malformed
    /// selector, `matchConditions`, or only v1beta1 reviews (500).
    #[error("admission webhook {webhook:?} cannot be evaluated: {message}")]
    InvalidWebhook { webhook: String, message: String },
    /// A dry-run request matched a webhook whose `sideEffects` is not `None`/`NoneOnDryRun`
    /// (400); the webhook was not called.
    #[error("admission webhook {webhook:?} does not support dry run")]
    DryRunUnsupported { webhook: String },
    /// The webhook answered `allowed: false`: `code` is its `status.code` when in 400..=599
    /// (else 400), `reason` its `status.reason` when that is a Kubernetes reason (else `""`).
    #[error("{message}")]
    Denied {
        webhook: String,
        code: u16,
        reason: &'static str,
        message: String,
    },
    /// The webhook could not be called or answered badly, and its failurePolicy is Fail (500).
    #[error("failed calling webhook {webhook:?}: {cause}")]
    CallFailed { webhook: String, cause: String },
    /// The webhook's patch is not a JSON patch, cannot be applied, or has no object (500).
    #[error("admission webhook {webhook:?} returned a patch that cannot be applied: {message}")]
    PatchFailed { webhook: String, message: String },
}

impl AdmissionError {
    /// The HTTP code, `metav1.Status` reason and message the API server answers with. Like
    /// kube-apiserver, a denial passes the webhook's reason through, so it may be `""`.
    pub fn status(&self) -> (u16, &'static str, String) {
        match self {
            Self::Denied {
                code,
                reason,
                message,
                ..
            } => (*code, reason, message.clone()),
            Self::DryRunUnsupported { .. } => (400, "BadRequest", self.to_string()),
            _ => (
                500,
                "InternalError",
                format!("Internal error occurred: {self}"),
            ),
        }
    }
}

type Body = Full<Bytes>;
type HttpsClient = Client<HttpsConnector<HttpConnector>, Body>;
/// HTTPS clients by (caBundle, server name to verify).
type HttpsClients = HashMap<(Option<String>, Option<String>), HttpsClient>;

/// Calls mutating admission webhooks over HTTP and HTTPS; clones share their clients.
#[derive(Clone, Debug)]
pub struct WebhookCaller {
    http: Client<HttpConnector, Body>,
    https: Arc<Mutex<HttpsClients>>,
    endpoints: Arc<HashMap<(String, String), SocketAddr>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename = "MutatingWebhookConfiguration")]
struct ConfigSpec {
    webhooks: Option<Vec<Value>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase", rename = "MutatingWebhook")]
struct WebhookSpec {
    name: String,
    client_config: ClientConfigSpec,
    rules: Option<Vec<RuleSpec>>,
    failure_policy: Option<String>,
    match_policy: Option<String>,
    namespace_selector: Value,
    object_selector: Value,
    side_effects: Option<String>,
    timeout_seconds: Option<i64>,
    admission_review_versions: Option<Vec<String>>,
    reinvocation_policy: Option<String>,
    match_conditions: Option<Vec<Value>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase", rename = "WebhookClientConfig")]
struct ClientConfigSpec {
    url: Option<String>,
    service: Option<ServiceSpec>,
    ca_bundle: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename = "ServiceReference")]
struct ServiceSpec {
    namespace: String,
    name: String,
    path: Option<String>,
    port: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase", rename = "RuleWithOperations")]
struct RuleSpec {
    operations: Option<Vec<String>>,
    api_groups: Option<Vec<String>>,
    api_versions: Option<Vec<String>>,
    resources: Option<Vec<String>>,
    scope: Option<String>,
}

/// One validated webhook: its spec, and the URL kube-apiserver would post to.
struct Hook {
    spec: WebhookSpec,
    /// The URL, `?timeout=` included.
    url: Uri,
    /// (namespace, name) when the URL is a service's, reached via the loopback override.
    service: Option<(String, String)>,
    timeout: Duration,
}

/// How one webhook call went wrong: subject to the failure policy (`Call`) or not.
enum Failure {
    Call(String),
    Fatal(AdmissionError),
}

impl Hook {
    fn invalid(&self, message: impl fmt::Display) -> AdmissionError {
        let (webhook, message) = (self.spec.name.clone(), message.to_string());
        AdmissionError::InvalidWebhook { webhook, message }
    }

    fn patch_failed(&self, message: impl fmt::Display) -> Failure {
        let (webhook, message) = (self.spec.name.clone(), message.to_string());
        Failure::Fatal(AdmissionError::PatchFailed { webhook, message })
    }
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase", rename = "AdmissionReview")]
struct ReviewSpec {
    api_version: String,
    kind: String,
    response: Option<ResponseSpec>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase", rename = "AdmissionResponse")]
struct ResponseSpec {
    uid: String,
    allowed: bool,
    status: Option<StatusSpec>,
    patch: Option<String>,
    patch_type: Option<String>,
    audit_annotations: Option<BTreeMap<String, String>>,
    warnings: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename = "Status")]
struct StatusSpec {
    code: Option<i64>,
    message: Option<String>,
    reason: Option<String>,
}

impl WebhookCaller {
    /// `service_endpoints` maps (namespace, service name) to the loopback address where that
    /// service's webhook server really listens (the loopback override for `clientConfig.service`).
    pub fn new(service_endpoints: HashMap<(String, String), SocketAddr>) -> Self {
        Self {
            http: Client::builder(TokioExecutor::new()).build_http(),
            https: Arc::default(),
            endpoints: Arc::new(service_endpoints),
        }
    }

    /// Runs the mutating webhooks of `configurations` (MutatingWebhookConfiguration objects)
    /// for one request and returns the mutated object, or why the request is refused.
    pub async fn admit(
        &self,
        configurations: &[Value],
        attrs: &AdmissionAttributes,
    ) -> Result<AdmissionOutcome, AdmissionError> {
        let mut outcome = AdmissionOutcome::default();
        outcome.object.clone_from(&attrs.object);
        // As in kube-apiserver, webhooks never see admission configuration objects, so a broken
        // configuration can always be fixed or deleted.
        if attrs.group == "admissionregistration.k8s.io" {
            return Ok(outcome);
        }
        let hooks = parse_configurations(configurations)?;
        // Reinvocable webhooks called since the object last changed, and those to call again.
        let (mut since_change, mut reinvoke) = (HashSet::new(), HashSet::new());
        for round in 0..2 {
            if round == 1 && reinvoke.is_empty() {
                break;
            }
            // Like `ShouldCallHook`, matching is decided for the whole round before any call.
            let mut relevant = Vec::new();
            for (index, hook) in hooks.iter().enumerate() {
                let wanted = round == 0 || reinvoke.contains(&index);
                if wanted && should_call(hook, attrs, outcome.object.as_ref())? {
                    relevant.push((index, hook));
                }
            }
            for (index, hook) in relevant {
                let fail_open = hook.spec.failure_policy.as_deref() == Some("Ignore");
                let changed = match self.call(hook, attrs, &mut outcome).await {
                    Ok(changed) => changed,
                    Err(Failure::Call(cause)) if fail_open => {
                        let name = &hook.spec.name;
                        tracing::warn!("failed calling webhook {name:?}, failing open: {cause}");
                        false
                    }
                    Err(Failure::Call(cause)) => {
                        let webhook = hook.spec.name.clone();
                        return Err(AdmissionError::CallFailed { webhook, cause });
                    }
                    Err(Failure::Fatal(error)) => return Err(error),
                };
                if changed {
                    reinvoke.extend(since_change.drain());
                }
                if hook.spec.reinvocation_policy.as_deref() == Some("IfNeeded") {
                    since_change.insert(index);
                }
            }
        }
        Ok(outcome)
    }

    /// Calls one webhook and applies its patch; returns whether the object changed.
    async fn call(
        &self,
        hook: &Hook,
        attrs: &AdmissionAttributes,
        outcome: &mut AdmissionOutcome,
    ) -> Result<bool, Failure> {
        if attrs.dry_run {
            match hook.spec.side_effects.as_deref() {
                None => return Err(Failure::Call("webhook SideEffects is nil".into())),
                Some("None" | "NoneOnDryRun") => {}
                Some(_) => {
                    let webhook = hook.spec.name.clone();
                    let error = AdmissionError::DryRunUnsupported { webhook };
                    return Err(Failure::Fatal(error));
                }
            }
        }
        let versions = &hook.spec.admission_review_versions;
        let accepts = |version: &str| versions.iter().flatten().any(|v| v == version);
        if !accepts("v1") && accepts("v1beta1") {
            let error = hook.invalid(
                "admissionReviewVersions lists only v1beta1, and apisim sends only \
                 admission.k8s.io/v1 reviews",
            );
            return Err(Failure::Fatal(error));
        } else if !accepts("v1") {
            let cause = "webhook does not accept v1 or v1beta1 AdmissionReview";
            return Err(Failure::Call(cause.into()));
        }
        let uid = new_uid();
        let body = review_request(&uid, attrs, outcome.object.as_ref());
        let review = self.post(hook, body).await.map_err(Failure::Call)?;
        let response = verify_response(&uid, review)
            .map_err(|e| Failure::Call(format!("received invalid webhook response: {e}")))?;
        for (key, value) in response.audit_annotations.unwrap_or_default() {
            let key = format!("{}/{key}", hook.spec.name);
            outcome.annotations.insert(key, value);
        }
        for warning in response.warnings.unwrap_or_default() {
            if !outcome.warnings.contains(&warning) {
                outcome.warnings.push(warning);
            }
        }
        if !response.allowed {
            let status = response.status.unwrap_or_default();
            return Err(Failure::Fatal(denial(hook, status)));
        }
        let patch = response.patch.as_deref().filter(|p| !p.is_empty());
        let patch = match patch.map(|p| BASE64.decode(p)) {
            None => return Ok(false),
            Some(Ok(patch)) => patch,
            Some(Err(e)) => {
                let cause = format!("failed to call webhook: response.patch is not base64: {e}");
                return Err(Failure::Call(cause));
            }
        };
        let patch: json_patch::Patch = serde_json::from_slice(&patch)
            .map_err(|e| hook.patch_failed(format!("not a JSON patch: {e}")))?;
        if patch.0.is_empty() {
            return Ok(false);
        }
        let Some(object) = outcome.object.as_ref() else {
            let message = "the webhook attempted to modify the object, which is not supported \
                           for this operation";
            return Err(hook.patch_failed(message));
        };
        let patch_type = response.patch_type.unwrap_or_default();
        if patch_type != "JSONPatch" {
            let cause = format!("unsupported patch type {patch_type:?}");
            return Err(Failure::Call(cause));
        }
        let mut patched = object.clone();
        json_patch::patch(&mut patched, &patch).map_err(|e| hook.patch_failed(e))?;
        if !patched.is_object() {
            return Err(hook.patch_failed("the patched object is not a JSON object"));
        }
        let changed = patched != *object;
        outcome.object = Some(patched);
        Ok(changed)
    }

    /// Posts the review and reads the answer, all within the webhook's timeout.
    async fn post(&self, hook: &Hook, body: Vec<u8>) -> Result<ReviewSpec, String> {
        let url = &hook.url;
        let fail = |e: &dyn fmt::Display| format!("failed to call webhook: Post \"{url}\": {e}");
        let https = url.scheme_str() == Some("https");
        let mut request = hyper::Request::post(url.clone());
        let mut server_name = None;
        if let Some((namespace, name)) = &hook.service {
            let key = (namespace.clone(), name.clone());
            let Some(addr) = self.endpoints.get(&key) else {
                let why = format!("service \"{namespace}/{name}\" has no loopback endpoint");
                return Err(fail(&why));
            };
            let path = url.path_and_query().map_or("/", |p| p.as_str());
            let authority = url.authority().map_or("", |a| a.as_str());
            request = hyper::Request::post(format!("https://{addr}{path}")).header(HOST, authority);
            server_name = url.host().map(str::to_owned);
        }
        let request = request
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, */*")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| fail(&e))?;
        let exchange = async {
            let sent = if https {
                let client =
                    self.https_client(hook.spec.client_config.ca_bundle.as_deref(), server_name)?;
                client.request(request).await
            } else {
                self.http.request(request).await
            };
            let hint = match hook.spec.client_config.ca_bundle.as_deref() {
                None if https => " (no caBundle is configured, and apisim trusts no other roots)",
                _ => "",
            };
            let response = sent.map_err(|e| fail(&format_args!("{}{hint}", describe(&e))))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES);
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => return Err(format!("failed to call webhook: reading the response: {e}")),
            };
            if !status.is_success() {
                let text: String = String::from_utf8_lossy(&bytes).chars().take(512).collect();
                let code = status.as_u16();
                let why = format!("the server responded with HTTP {code}: {text:?}");
                return Err(format!("failed to call webhook: {why}"));
            }
            serde_json::from_slice::<ReviewSpec>(&bytes)
                .map_err(|e| format!("failed to call webhook: cannot decode the response: {e}"))
        };
        let answer = tokio::time::timeout(hook.timeout, exchange).await;
        answer.map_err(|_| fail(&"context deadline exceeded"))?
    }

    /// The HTTPS client trusting only `ca_bundle` and verifying `server_name` if given.
    fn https_client(
        &self,
        ca_bundle: Option<&str>,
        server_name: Option<String>,
    ) -> Result<HttpsClient, String> {
        let key = (ca_bundle.map(str::to_owned), server_name.clone());
        let mut cache = self.https.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = cache.get(&key) {
            return Ok(client.clone());
        }
        let no_client = |e: &dyn fmt::Display| format!("could not get REST client: {e}");
        let mut roots = rustls::RootCertStore::empty();
        if let Some(bundle) = ca_bundle {
            let pem = BASE64.decode(bundle.trim());
            let pem = pem.map_err(|e| no_client(&format_args!("caBundle is not base64: {e}")))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| no_client(&format_args!("caBundle: {e}")))?;
                let added = roots.add(cert);
                added.map_err(|e| no_client(&format_args!("caBundle: {e}")))?;
            }
            if roots.is_empty() {
                return Err(no_client(&"caBundle holds no PEM certificate"));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| no_client(&e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let builder = HttpsConnectorBuilder::new().with_tls_config(config);
        let mut builder = builder.https_only();
        if let Some(name) = server_name {
            let name = ServerName::try_from(name).map_err(|e| no_client(&e))?;
            builder = builder.with_server_name_resolver(FixedServerNameResolver::new(name));
        }
        let client = Client::builder(TokioExecutor::new()).build(builder.enable_http1().build());
        if cache.len() >= 64 {
            cache.clear();
        }
        cache.insert(key, client.clone());
        Ok(client)
    }
}

/// Reads and validates every configuration; webhooks come out in the order they are called.
fn parse_configurations(configurations: &[Value]) -> Result<Vec<Hook>, AdmissionError> {
    let mut parsed = Vec::new();
    for value in configurations {
        let name = value.pointer("/metadata/name").and_then(Value::as_str);
        let name = name.unwrap_or_default().to_owned();
        let invalid = |message| AdmissionError::InvalidConfiguration {
            configuration: name.clone(),
            message,
        };
        let spec: ConfigSpec = from_object(value).map_err(invalid)?;
        let mut hooks = Vec::new();
        for (i, webhook) in spec.webhooks.iter().flatten().enumerate() {
            let hook = from_object(webhook).and_then(parse_webhook);
            hooks.push(hook.map_err(|e| invalid(format!("webhooks[{i}]: {e}")))?);
        }
        parsed.push((name, hooks));
    }
    parsed.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(parsed.into_iter().flat_map(|(_, hooks)| hooks).collect())
}

/// Reads a JSON object into `T` (serde alone would also take a list for a struct).
fn from_object<'a, T: Deserialize<'a>>(value: &'a Value) -> Result<T, String> {
    match value {
        Value::Object(_) => T::deserialize(value).map_err(|e| e.to_string()),
        _ => Err("must be a JSON object".into()),
    }
}

fn parse_webhook(mut spec: WebhookSpec) -> Result<Hook, String> {
    let one_of = |field: &str, value: &Option<String>, allowed: &[&str]| match value {
        Some(v) if !allowed.contains(&v.as_str()) => Err(format!(
            "{field}: unsupported value {v:?}, must be one of {allowed:?}"
        )),
        _ => Ok(()),
    };
    if spec.name.is_empty() {
        return Err("name: required".into());
    }
    one_of("failurePolicy", &spec.failure_policy, &["Fail", "Ignore"])?;
    one_of("matchPolicy", &spec.match_policy, &["Exact", "Equivalent"])?;
    let reinvocation = &spec.reinvocation_policy;
    one_of("reinvocationPolicy", reinvocation, &["Never", "IfNeeded"])?;
    let side_effects = ["None", "NoneOnDryRun", "Some", "Unknown"];
    one_of("sideEffects", &spec.side_effects, &side_effects)?;
    for rule in spec.rules.iter().flatten() {
        let scopes = ["*", "Cluster", "Namespaced"];
        one_of("rules[].scope", &rule.scope, &scopes)?;
    }
    let timeout = spec.timeout_seconds.unwrap_or(10);
    if !(1..=30).contains(&timeout) {
        return Err(format!("timeoutSeconds: {timeout} is not between 1 and 30"));
    }
    if spec
        .admission_review_versions
        .iter()
        .flatten()
        .next()
        .is_none()
    {
        return Err("admissionReviewVersions: required".into());
    }
    let client = &mut spec.client_config;
    client.ca_bundle = client.ca_bundle.take().filter(|b| !b.is_empty());
    let (url, service) = match (&client.url, &client.service) {
        (Some(url), None) => (url.clone(), None),
        (None, Some(service)) => {
            let (namespace, name) = (&service.namespace, &service.name);
            let path = service.path.as_deref().unwrap_or("/");
            let port = service.port.unwrap_or(443);
            if !(1..=65535).contains(&port) || !path.starts_with('/') || path.contains('?') {
                let why = format!("port {port} and path {path:?} must be 1..=65535 and absolute");
                return Err(format!("clientConfig.service: {why}"));
            }
            let url = format!("https://{name}.{namespace}.svc:{port}{path}");
            (url, Some((namespace.clone(), name.clone())))
        }
        _ => return Err("clientConfig: exactly one of url or service is required".into()),
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let full = format!("{url}{separator}timeout={timeout}s");
    let uri: Uri = full.parse().map_err(|e| format!("{url:?}: {e}"))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.host().is_none_or(str::is_empty) || url.contains('#') {
        return Err(format!(
            "clientConfig.url {url:?}: must be http(s) with a host"
        ));
    }
    let timeout = Duration::from_secs(timeout.unsigned_abs());
    Ok(Hook {
        spec,
        url: uri,
        service,
        timeout,
    })
}

/// kube-apiserver's `ShouldCallHook`: selector errors only count when the rules match.
fn should_call(
    hook: &Hook,
    attrs: &AdmissionAttributes,
    object: Option<&Value>,
) -> Result<bool, AdmissionError> {
    let namespace = LabelSelector::from_json(&hook.spec.namespace_selector);
    let namespace = namespace.map(|s| namespace_selected(&s, attrs, object));
    if matches!(namespace, Ok(false)) {
        return Ok(false);
    }
    let objects = [object, attrs.old_object.as_ref()];
    let by_object = LabelSelector::from_json(&hook.spec.object_selector).map(|s| {
        let mut labels = objects.into_iter().flatten().map(labels_of);
        s.is_empty() || labels.any(|l| s.matches(&l))
    });
    if matches!(by_object, Ok(false))
        || !hook
            .spec
            .rules
            .iter()
            .flatten()
            .any(|r| rule_matches(r, attrs))
    {
        return Ok(false);
    }
    namespace.map_err(|e| hook.invalid(format_args!("invalid namespaceSelector: {e}")))?;
    by_object.map_err(|e| hook.invalid(format_args!("invalid objectSelector: {e}")))?;
    if hook
        .spec
        .match_conditions
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        return Err(hook.invalid("matchConditions (CEL) are not supported by apisim"));
    }
    Ok(true)
}

fn is_namespace(attrs: &AdmissionAttributes) -> bool {
    attrs.group.is_empty() && attrs.resource == "namespaces"
}

fn in_namespace(attrs: &AdmissionAttributes) -> bool {
    attrs.namespaced && attrs.namespace.as_deref().is_some_and(|n| !n.is_empty())
}

/// kube-apiserver's namespace matcher: cluster-scoped objects other than namespaces always
/// match; a namespace being created or updated is matched by its own labels.
fn namespace_selected(
    selector: &LabelSelector,
    attrs: &AdmissionAttributes,
    object: Option<&Value>,
) -> bool {
    if selector.is_empty() || (!is_namespace(attrs) && !in_namespace(attrs)) {
        return true;
    }
    let writing = matches!(attrs.operation, Operation::Create | Operation::Update);
    let stored = attrs.namespace_object.as_ref();
    let namespace = match is_namespace(attrs) {
        true if attrs.sub_resource.is_none() && writing => object,
        true => stored.or(attrs.old_object.as_ref()),
        false => stored,
    };
    selector.matches(&namespace.map(labels_of).unwrap_or_default())
}

fn rule_matches(rule: &RuleSpec, attrs: &AdmissionAttributes) -> bool {
    let listed = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|x| x == "*" || x == value)
    };
    let sub_resource = attrs.sub_resource.as_deref().unwrap_or_default();
    let resource = rule.resources.iter().flatten().any(|r| {
        let (res, sub) = r.split_once('/').unwrap_or((r, ""));
        (res == "*" || res == attrs.resource) && (sub == "*" || sub == sub_resource)
    });
    let core_namespace = is_namespace(attrs) && attrs.version == "v1";
    let scope = match rule.scope.as_deref() {
        None | Some("*") => true,
        Some("Namespaced") => !core_namespace && in_namespace(attrs),
        Some("Cluster") => core_namespace || !in_namespace(attrs),
        Some(_) => false,
    };
    listed(&rule.operations, attrs.operation.as_str())
        && listed(&rule.api_groups, &attrs.group)
        && listed(&rule.api_versions, &attrs.version)
        && resource
        && scope
}

fn review_request(uid: &str, attrs: &AdmissionAttributes, object: Option<&Value>) -> Vec<u8> {
    let (group, version) = (&attrs.group, &attrs.version);
    let kind = json!({"group": group, "version": version, "kind": attrs.kind});
    let resource = json!({"group": group, "version": version, "resource": attrs.resource});
    let mut request = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "operation": attrs.operation,
        "userInfo": {
            "username": "system:admin",
            "groups": ["system:masters", "system:authenticated"],
        },
        "object": object,
        "oldObject": attrs.old_object,
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    });
    let sub_resource = attrs.sub_resource.as_ref().filter(|s| !s.is_empty());
    if let Some(sub) = sub_resource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if !attrs.name.is_empty() {
        request["name"] = json!(attrs.name);
    }
    if let Some(namespace) = attrs.namespace.as_ref().filter(|n| !n.is_empty()) {
        request["namespace"] = json!(namespace);
    }
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let mut review = review;
    review["request"] = request;
    review.to_string().into_bytes()
}

/// kube-apiserver's `VerifyAdmissionResponse` for a mutating v1 review.
fn verify_response(uid: &str, review: ReviewSpec) -> Result<ResponseSpec, String> {
    let response = review.response.ok_or("webhook response was absent")?;
    if response.uid != uid {
        return Err(format!(
            "expected response.uid={uid:?}, got {:?}",
            response.uid
        ));
    }
    let (api_version, kind) = (review.api_version, review.kind);
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        let expected = "admission.k8s.io/v1, Kind=AdmissionReview";
        let got = format!("{api_version}, Kind={kind}");
        return Err(format!(
            "expected webhook response of {expected}, got {got}"
        ));
    }
    let has_patch = response.patch.as_deref().is_some_and(|p| !p.is_empty());
    let error = match (has_patch, response.patch_type.as_deref()) {
        (true, None) => "webhook returned response.patch but not response.patchType",
        (false, Some(_)) => "webhook returned response.patchType but not response.patch",
        (_, Some("")) => "webhook returned invalid response.patchType of \"\"",
        _ => return Ok(response),
    };
    Err(error.into())
}

/// kube-apiserver's `webhookerrors.ToStatusErr`.
fn denial(hook: &Hook, status: StatusSpec) -> AdmissionError {
    let denied_by = format!("admission webhook {:?} denied the request", hook.spec.name);
    let reason = status.reason.unwrap_or_default();
    let message = match status.message.filter(|m| !m.is_empty()) {
        Some(message) => format!("{denied_by}: {message}"),
        None if !reason.is_empty() => format!("{denied_by}: {reason}"),
        None => format!("{denied_by} without explanation"),
    };
    let code = status.code.and_then(|c| u16::try_from(c).ok());
    AdmissionError::Denied {
        webhook: hook.spec.name.clone(),
        code: code.filter(|c| (400..=599).contains(c)).unwrap_or(400),
        reason: REASONS
            .split_whitespace()
            .find(|r| *r == reason)
            .unwrap_or(""),
        message,
    }
}

/// An error and its sources, which is where hyper and rustls put the useful part.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        source = cause.source();
    }
    text
}

/// A random, unique, UUID-shaped request uid.
fn new_uid() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let state = RandomState::new();
    let (high, low) = (state.hash_one(count), state.hash_one((count, 1u8)));
    let (a, b, c) = (high >> 32, (high >> 16) & 0xffff, high & 0xfff);
    let (d, e) = (0x8000 | ((low >> 48) & 0x3fff), low & 0xffff_ffff_ffff);
    format!("{a:08x}-{b:04x}-4{c:03x}-{d:04x}-{e:012x}")
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
