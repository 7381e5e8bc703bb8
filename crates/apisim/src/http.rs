//! The HTTP surface: turns requests into [`Cluster`] calls the way kube-apiserver's
//! `RequestInfoFactory` and handlers do (path → verb, namespace, resource, name,
//! subresource), and results into JSON, Tables or watch streams. Also serves discovery,
//! OpenAPI, health, and the `/apisim/v1/…` test controls (faults, watch drops, compaction).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::cluster::{
    Cluster, DeleteOptions, FieldValidation, ListOptions, PatchKind, Subresource, WriteOptions,
    Written,
};
use crate::discovery;
use crate::faults::Fault;
use crate::lifecycle::Propagation;
use crate::meta;
use crate::registry::ResourceType;
use crate::status::{self, ApiError};
use crate::table::{self, IncludeObject};
use crate::watch::{self, WatchRequest};

/// What the router shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The control plane.
    pub cluster: Arc<Cluster>,
    /// `host:port` clients reach us at (for `/api`'s serverAddressByClientCIDRs).
    pub address: String,
    /// How often idle watches get a BOOKMARK.
    pub bookmark_interval: Duration,
}

/// The router: every path goes through [`handle`].
pub fn router(state: AppState) -> Router {
    Router::new().fallback(handle).with_state(state)
}

type Params = HashMap<String, String>;

fn ok_json(value: Value) -> Response {
    (StatusCode::OK, axum::Json(value)).into_response()
}

/// Where a resource request points.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    group: String,
    version: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    subresource: Option<String>,
}

/// Parses `/api/v1/...` and `/apis/<g>/<v>/...` into a target (None: not a resource path).
fn parse_target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => {
            (String::new(), (*version).to_owned(), rest)
        }
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            ((*group).to_owned(), (*version).to_owned(), rest)
        }
        _ => return None,
    };
    let mut rest: &[&str] = rest;
    let mut namespace = None;
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = Some(rest[1].to_owned());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        } else {
            // The namespace object itself: /api/v1/namespaces/NAME[/status].
            return Some(Target {
                group,
                version,
                namespace: None,
                plural: "namespaces".into(),
                name: Some(rest[1].to_owned()),
                subresource: rest.get(2).map(|s| (*s).to_owned()),
            });
        }
    }
    Some(Target {
        group,
        version,
        namespace,
        plural: rest.first()?.to_string(),
        name: rest.get(1).map(|s| (*s).to_owned()),
        subresource: match rest.len() {
            0..=2 => None,
            3 => Some(rest[2].to_owned()),
            _ => return None,
        },
    })
}

fn verb(method: &Method, target: &Target, params: &Params) -> &'static str {
    let watching = params.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (method.as_str(), target.name.is_some()) {
        ("GET", _) if watching => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// The single entry point.
pub async fn handle(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    Query(params): Query<Params>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path();
    match dispatch(&app, &method, path, &params, &headers, body).await {
        Ok(response) => response,
        Err(err) => {
            tracing::debug!(%method, %path, code = err.code, reason = err.reason, "request failed: {}", err.message);
            err.into_response()
        }
    }
}

async fn dispatch(
    app: &AppState,
    method: &Method,
    path: &str,
    params: &Params,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let registry = app.cluster.lock().registry.clone();
    match path.trim_end_matches('/') {
        "/healthz" | "/livez" | "/readyz" => return Ok((StatusCode::OK, "ok").into_response()),
        "/version" => return Ok(ok_json(discovery::version())),
        "/api" => return Ok(ok_json(discovery::core_versions(&app.address))),
        "/apis" => return Ok(ok_json(discovery::group_list(&registry))),
        "/openapi/v3" => return Ok(ok_json(discovery::openapi_index(&registry))),
        "/openapi/v2" => return Err(ApiError::no_route(path)),
        "/apisim/v1/faults" if method == Method::POST => {
            let fault: Fault = serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad_request(format!("bad fault: {e}")))?;
            app.cluster.faults.inject(fault);
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        "/apisim/v1/faults" if method == Method::DELETE => {
            app.cluster.faults.clear();
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        "/apisim/v1/drop-watches" if method == Method::POST => {
            app.cluster.drop_watches();
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        "/apisim/v1/compact" if method == Method::POST => {
            app.cluster.compact();
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        _ => {}
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", version] => {
            return discovery::resource_list(&registry, "", version)
                .map(ok_json)
                .ok_or_else(|| ApiError::no_route(path));
        }
        ["apis", group] => {
            return discovery::group(&registry, group)
                .map(ok_json)
                .ok_or_else(|| ApiError::no_route(path));
        }
        ["apis", group, version] => {
            return discovery::resource_list(&registry, group, version)
                .map(ok_json)
                .ok_or_else(|| ApiError::no_route(path));
        }
        ["openapi", "v3", "api", version] => {
            return discovery::openapi_document(&registry, "", version)
                .map(ok_json)
                .ok_or_else(|| ApiError::no_route(path));
        }
        ["openapi", "v3", "apis", group, version] => {
            return discovery::openapi_document(&registry, group, version)
                .map(ok_json)
                .ok_or_else(|| ApiError::no_route(path));
        }
        _ => {}
    }
    let target = parse_target(path).ok_or_else(|| ApiError::no_route(path))?;
    let resource = registry
        .get(&target.group, &target.version, &target.plural)
        .cloned()
        .ok_or_else(|| ApiError::no_route(path))?;
    let verb = verb(method, &target, params);
    let scoped_right = if resource.namespaced {
        target.namespace.is_some() || matches!(verb, "list" | "watch")
    } else {
        target.namespace.is_none()
    };
    if !scoped_right {
        return Err(ApiError::no_route(path));
    }
    let fault_resource = match &target.subresource {
        Some(sub) => format!("{}/{sub}", target.plural),
        None => target.plural.clone(),
    };
    if let Some(err) = app.cluster.faults.take(verb, &fault_resource) {
        return Err(err);
    }
    let namespace = target.namespace.clone().unwrap_or_default();
    let subresource = match target.subresource.as_deref() {
        None => None,
        Some("status") if resource.status => Some(Subresource::Status),
        Some("scale") if resource.scale.is_some() => Some(Subresource::Scale),
        Some("binding") if resource.binding => Some(Subresource::Binding),
        Some(_) => return Err(ApiError::no_route(path)),
    };
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let table =
        table::wants_table(accept).then(|| match params.get("includeObject").map(String::as_str) {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        });
    let cluster = &app.cluster;
    match (verb, target.name.as_deref(), subresource) {
        ("watch", _, None) => watch::serve(
            Arc::clone(cluster),
            resource,
            WatchRequest {
                namespace: target.namespace.clone(),
                resource_version: params.get("resourceVersion").cloned(),
                label_selector: params.get("labelSelector").cloned().unwrap_or_default(),
                field_selector: field_selector(params, target.name.as_deref()),
                bookmarks: params
                    .get("allowWatchBookmarks")
                    .is_some_and(|v| v == "true"),
                send_initial_events: params.get("sendInitialEvents").is_some_and(|v| v == "true"),
                timeout: params
                    .get("timeoutSeconds")
                    .and_then(|t| t.parse().ok())
                    .map(Duration::from_secs),
                table,
            },
            app.bookmark_interval,
        ),
        ("list", None, None) => {
            let page = cluster.list(
                &resource,
                target.namespace.as_deref(),
                &list_options(params)?,
            )?;
            let mut metadata = json!({"resourceVersion": page.revision.to_string()});
            if let Some(token) = &page.continue_token {
                metadata["continue"] = json!(token);
            }
            if let Some(remaining) = page.remaining {
                metadata["remainingItemCount"] = json!(remaining);
            }
            Ok(ok_json(match table {
                Some(include) => table::table(&resource, &page.items, metadata, include, true),
                None => json!({
                    "apiVersion": resource.api_version(),
                    "kind": format!("{}List", resource.kind),
                    "metadata": metadata,
                    "items": page.items,
                }),
            }))
        }
        ("get", Some(name), None | Some(Subresource::Status)) => {
            let object = cluster.get(&resource, &namespace, name)?;
            Ok(ok_json(match table {
                Some(include) => table::table(
                    &resource,
                    std::slice::from_ref(&object),
                    json!({"resourceVersion": object["metadata"]["resourceVersion"]}),
                    include,
                    true,
                ),
                None => object,
            }))
        }
        ("get", Some(name), Some(Subresource::Scale)) => Ok(ok_json(scale_of(
            &resource,
            &cluster.get(&resource, &namespace, name)?,
        ))),
        ("create", None, None) => {
            let written = cluster
                .create(
                    &resource,
                    &namespace,
                    parse_body(headers, &body)?,
                    &write_options(params, headers)?,
                )
                .await?;
            Ok(written_response(written))
        }
        ("create", Some(name), Some(Subresource::Binding)) => {
            cluster.bind(&resource, &namespace, name, &parse_body(headers, &body)?)?;
            Ok((StatusCode::CREATED, axum::Json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})))
                .into_response())
        }
        ("update", Some(name), None | Some(Subresource::Status)) => {
            let written = cluster
                .update(
                    &resource,
                    &namespace,
                    name,
                    subresource,
                    parse_body(headers, &body)?,
                    &write_options(params, headers)?,
                )
                .await?;
            Ok(written_response(written))
        }
        ("update" | "patch", Some(name), Some(Subresource::Scale)) => {
            let current = scale_of(&resource, &cluster.get(&resource, &namespace, name)?);
            let sent = parse_json(&body)?;
            let wanted = if verb == "update" {
                sent
            } else {
                let mut merged = current.clone();
                json_patch::merge(&mut merged, &sent);
                merged
            };
            let replicas = wanted["spec"]["replicas"].as_i64().ok_or_else(|| {
                ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    &[("spec.replicas".into(), "Required value".into())],
                )
            })?;
            if replicas < 0 {
                return Err(ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    &[(
                        "spec.replicas".into(),
                        format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                    )],
                ));
            }
            let mut patch = json!({});
            if let Some(paths) = &resource.scale {
                meta::set_path(&mut patch, &paths.spec_replicas, json!(replicas));
            }
            let rv = meta::resource_version(&wanted);
            if !rv.is_empty() {
                patch["metadata"] = json!({"resourceVersion": rv});
            }
            let written = cluster
                .patch(
                    &resource,
                    &namespace,
                    name,
                    None,
                    PatchKind::Merge,
                    patch,
                    &write_options(params, headers)?,
                )
                .await?;
            Ok(ok_json(scale_of(&resource, &written.object)))
        }
        ("patch", Some(name), None | Some(Subresource::Status)) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = match content_type.split(';').next().unwrap_or_default().trim() {
                "application/json-patch+json" => PatchKind::Json,
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/apply-patch+yaml" | "application/apply-patch+cbor" => PatchKind::Apply,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let patch = if kind == PatchKind::Apply {
                parse_yaml_or_json(&body)?
            } else {
                parse_json(&body)?
            };
            let written = cluster
                .patch(
                    &resource,
                    &namespace,
                    name,
                    subresource,
                    kind,
                    patch,
                    &write_options(params, headers)?,
                )
                .await?;
            Ok(written_response(written))
        }
        ("delete", Some(name), None) => {
            let options = delete_options(params, &body)?;
            let deletion = cluster.delete(&resource, &namespace, name, &options)?;
            if deletion.removed && resource.group.is_empty() && resource.plural == "namespaces" {
                return Ok(ok_json(status::success(
                    "",
                    &resource.plural,
                    name,
                    meta::uid(&deletion.object),
                )));
            }
            Ok(ok_json((*deletion.object).clone()))
        }
        ("deletecollection", None, None) => {
            let options = delete_options(params, &body)?;
            let page = cluster.list(
                &resource,
                target.namespace.as_deref(),
                &list_options(params)?,
            )?;
            let mut deleted = Vec::new();
            for item in &page.items {
                match cluster.delete(&resource, meta::namespace(item), meta::name(item), &options) {
                    Ok(d) => deleted.push((*d.object).clone()),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(ok_json(
                json!({"apiVersion": resource.api_version(), "kind": format!("{}List", resource.kind), "metadata": {}, "items": deleted}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {path})"
        ))),
    }
}

/// `kubectl get NAME -w` style watches name the object in the path; turn that into the
/// equivalent field selector.
fn field_selector(params: &Params, name: Option<&str>) -> String {
    let sent = params.get("fieldSelector").cloned().unwrap_or_default();
    match name {
        Some(name) if sent.is_empty() => format!("metadata.name={name}"),
        Some(name) => format!("{sent},metadata.name={name}"),
        None => sent,
    }
}

fn written_response(written: Written) -> Response {
    let code = if written.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut response = (code, axum::Json(written.object)).into_response();
    for warning in written.warnings {
        if let Ok(value) =
            HeaderValue::from_str(&format!("299 - \"{}\"", warning.replace('"', "'")))
        {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

fn scale_of(resource: &ResourceType, object: &Value) -> Value {
    let paths = resource.scale.as_ref();
    let read = |path: Option<&String>| {
        path.and_then(|p| meta::get_path(object, p))
            .cloned()
            .unwrap_or(json!(0))
    };
    let mut selector = paths
        .and_then(|p| p.label_selector.as_ref())
        .and_then(|p| meta::get_path(object, p))
        .cloned();
    if selector.is_none() && resource.kind == "StatefulSet" {
        let labels: Vec<String> = object["spec"]["selector"]["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        selector = Some(json!(labels.join(",")));
    }
    let mut status = json!({"replicas": read(paths.map(|p| &p.status_replicas))});
    if let Some(selector) = selector {
        status["selector"] = selector;
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": object["metadata"]["name"], "namespace": object["metadata"]["namespace"],
            "uid": object["metadata"]["uid"], "resourceVersion": object["metadata"]["resourceVersion"],
            "creationTimestamp": object["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": read(paths.map(|p| &p.spec_replicas))},
        "status": status,
    })
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn parse_yaml_or_json(body: &[u8]) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice(body) {
        return Ok(v);
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
    serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid YAML: {e}")))
}

fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    match content_type.split(';').next().unwrap_or_default().trim() {
        "application/json" | "" | "*/*" => parse_json(body),
        "application/yaml" => parse_yaml_or_json(body),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn list_options(params: &Params) -> Result<ListOptions, ApiError> {
    let exact = match (
        params.get("resourceVersionMatch").map(String::as_str),
        params.get("resourceVersion"),
    ) {
        (Some("Exact"), Some(rv)) => Some(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?,
        ),
        (Some("Exact" | "NotOlderThan"), None) => {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        _ => None,
    };
    Ok(ListOptions {
        label_selector: params.get("labelSelector").cloned().unwrap_or_default(),
        field_selector: params.get("fieldSelector").cloned().unwrap_or_default(),
        limit: params
            .get("limit")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0),
        continue_token: params.get("continue").filter(|c| !c.is_empty()).cloned(),
        exact_revision: exact,
    })
}

fn write_options(params: &Params, headers: &HeaderMap) -> Result<WriteOptions, ApiError> {
    let field_manager = match params.get("fieldManager") {
        Some(m) if m.len() > 128 => {
            return Err(ApiError::bad_request(
                "fieldManager: Too long: may not be more than 128 bytes",
            ));
        }
        Some(m) => m.clone(),
        None => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|ua| {
                ua.split('/')
                    .next()
                    .unwrap_or(ua)
                    .chars()
                    .take(128)
                    .collect()
            })
            .unwrap_or_else(|| "unknown".into()),
    };
    let field_validation = match params.get("fieldValidation").map(String::as_str) {
        None | Some("Warn") | Some("") => FieldValidation::Warn,
        Some("Ignore") => FieldValidation::Ignore,
        Some("Strict") => FieldValidation::Strict,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            )));
        }
    };
    Ok(WriteOptions {
        field_manager,
        dry_run: params.get("dryRun").is_some_and(|d| d == "All"),
        field_validation,
        force: params.get("force").is_some_and(|f| f == "true"),
    })
}

fn delete_options(params: &Params, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        parse_json(body)?
    };
    let policy = params
        .get("propagationPolicy")
        .cloned()
        .or_else(|| body["propagationPolicy"].as_str().map(str::to_owned));
    let propagation = match policy.as_deref() {
        None => match body["orphanDependents"]
            .as_bool()
            .or_else(|| params.get("orphanDependents").map(|o| o == "true"))
        {
            Some(true) => Propagation::Orphan,
            _ => Propagation::Background,
        },
        Some("Background") => Propagation::Background,
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            )));
        }
    };
    let grace_seconds = params
        .get("gracePeriodSeconds")
        .and_then(|g| g.parse::<i64>().ok())
        .or_else(|| body["gracePeriodSeconds"].as_i64())
        .map(|g| g.max(0) as u64);
    let dry_run = params.get("dryRun").is_some_and(|d| d == "All")
        || body["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    Ok(DeleteOptions {
        propagation,
        grace_seconds,
        uid: body["preconditions"]["uid"].as_str().map(str::to_owned),
        resource_version: body["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_owned),
        dry_run,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_like_request_info() {
        let t = parse_target("/api/v1/namespaces/db/pods/pg-0/status").unwrap();
        assert_eq!(
            (
                t.namespace.as_deref(),
                t.plural.as_str(),
                t.name.as_deref(),
                t.subresource.as_deref()
            ),
            (Some("db"), "pods", Some("pg-0"), Some("status"))
        );
        let t = parse_target("/api/v1/namespaces/db").unwrap();
        assert_eq!(
            (t.namespace, t.plural.as_str(), t.name.as_deref()),
            (None, "namespaces", Some("db"))
        );
        let t = parse_target("/api/v1/namespaces/db/status").unwrap();
        assert_eq!(
            (t.plural.as_str(), t.subresource.as_deref()),
            ("namespaces", Some("status"))
        );
        let t = parse_target("/apis/apps/v1/statefulsets").unwrap();
        assert_eq!(
            (t.group.as_str(), t.namespace, t.name),
            ("apps", None, None)
        );
        let t = parse_target("/api/v1/nodes/n1").unwrap();
        assert_eq!(t.name.as_deref(), Some("n1"));
        assert!(parse_target("/api/v1").is_none());
        assert!(parse_target("/api/v1/namespaces/a/pods/b/c/d").is_none());
    }
}
