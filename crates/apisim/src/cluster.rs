//! The API's write and read semantics over the store: create (with `generateName`), update
//! with optimistic concurrency, the four patch types, status and scale subresources, binding,
//! delete, list with selectors and paging, and mutating admission.
//!
//! Promises: a write either commits one new revision or returns an [`ApiError`] and changes
//! nothing; a write that changes nothing commits nothing (no new `resourceVersion`, no watch
//! event); spec writes never touch status and status writes never touch anything else;
//! `metadata.generation` moves on spec changes only.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::admission::{AdmissionAttributes, Operation, WebhookCaller};
use crate::builtin;
use crate::convert::{from_storage, storage_of};
use crate::faults::Faults;
use crate::lifecycle::{self, Deletion, Propagation};
use crate::meta;
use crate::patch::{self, ApplyRequest, PatchError};
use crate::registry::{Registry, ResourceType};
use crate::selector::{FieldSelector, LabelSelector, labels_of};
use crate::status::ApiError;
use crate::store::Store;

mod commit;

/// Which subresource a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// `/status`.
    Status,
    /// `/scale`.
    Scale,
    /// `/binding` (pods).
    Binding,
}

impl Subresource {
    /// The URL segment.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Scale => "scale",
            Self::Binding => "binding",
        }
    }
}

/// `fieldValidation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop them and warn (the server default).
    #[default]
    Warn,
    /// Refuse the write.
    Strict,
}

/// Query options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `fieldManager` (or the one derived from the User-Agent).
    pub field_manager: String,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// `force` (server-side apply).
    pub force: bool,
}

/// The patch types of `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml`.
    Apply,
}

/// `DeleteOptions`.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `propagationPolicy` (or the legacy `orphanDependents`).
    pub propagation: Propagation,
    /// `gracePeriodSeconds`.
    pub grace_seconds: Option<u64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `dryRun=All`.
    pub dry_run: bool,
}

/// List parameters.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// `labelSelector`.
    pub label_selector: String,
    /// `fieldSelector`.
    pub field_selector: String,
    /// `limit` (0: no limit).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `resourceVersion` with `resourceVersionMatch=Exact`.
    pub exact_revision: Option<u64>,
}

/// A page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// Items, converted to the requested version.
    pub items: Vec<Value>,
    /// The list's `resourceVersion`.
    pub revision: u64,
    /// The `continue` token for the next page.
    pub continue_token: Option<String>,
    /// `remainingItemCount`.
    pub remaining: Option<usize>,
}

/// A committed write.
#[derive(Debug, Clone)]
pub struct Written {
    /// The object as stored (converted to the requested version).
    pub object: Value,
    /// Whether it was created (201) rather than updated (200).
    pub created: bool,
    /// `Warning` headers.
    pub warnings: Vec<String>,
}

/// Everything behind the lock.
#[derive(Debug)]
pub struct State {
    /// Objects and history.
    pub store: Store,
    /// Served resources.
    pub registry: Registry,
    uids: u64,
}

/// The simulated control plane.
#[derive(Debug)]
pub struct Cluster {
    state: Mutex<State>,
    revisions: watch::Sender<u64>,
    watch_generation: watch::Sender<u64>,
    /// Injected failures.
    pub faults: Faults,
    webhooks: WebhookCaller,
}

/// The system namespaces every cluster starts with.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

const MAX_CONFLICT_RETRIES: usize = 5;

fn lists_of(resource: &ResourceType) -> Box<dyn patch::ListSchema + Send + Sync> {
    resource.lists()
}

fn patch_error(resource: &ResourceType, name: &str, err: PatchError) -> ApiError {
    match err {
        PatchError::Conflict { ref conflicts } => {
            let causes: Vec<Value> = conflicts
                .iter()
                .map(|c| json!({"reason": "FieldManagerConflict", "message": c.cause_message(), "field": c.path}))
                .collect();
            let mut e = ApiError::new(409, "Conflict", err.to_string());
            e.details = Some(
                json!({"name": name, "kind": resource.plural, "group": resource.group, "causes": causes}),
            );
            e
        }
        other => ApiError::new(422, "Invalid", other.to_string()),
    }
}

/// Top-level fields that are neither metadata nor status (a change bumps `generation`).
fn spec_part(object: &Value) -> Value {
    let mut spec = object.clone();
    if let Some(map) = spec.as_object_mut() {
        for key in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(key);
        }
    }
    spec
}

fn without_managed_fields(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    object
}

fn uses_generation(resource: &ResourceType) -> bool {
    !(resource.group.is_empty()
        || resource.group == "coordination.k8s.io"
        || resource.group == "events.k8s.io")
}

impl Cluster {
    /// A cluster with the system namespaces, keeping `max_history` changes for watches.
    pub fn new(
        max_history: usize,
        service_endpoints: HashMap<(String, String), SocketAddr>,
    ) -> Self {
        let mut state = State {
            store: Store::new(max_history),
            registry: Registry::new(),
            uids: 0,
        };
        let namespaces = state.registry.get("", "v1", "namespaces").cloned();
        if let Some(resource) = namespaces {
            for name in INITIAL_NAMESPACES {
                let mut ns =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
                state.fill_new_metadata(&resource, &mut ns);
                builtin::prepare_create(&resource, &mut ns);
                state.store.insert(&resource.storage(), ns);
            }
        }
        let revision = state.store.revision();
        Self {
            state: Mutex::new(state),
            revisions: watch::channel(revision).0,
            watch_generation: watch::channel(0).0,
            faults: Faults::default(),
            webhooks: WebhookCaller::new(service_endpoints),
        }
    }

    /// Locks the state (a poisoned lock is still usable: every write is all-or-nothing).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A receiver that changes whenever a new revision is committed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revisions.subscribe()
    }

    /// A receiver that changes when all watches must be dropped.
    pub fn watch_generation(&self) -> watch::Receiver<u64> {
        self.watch_generation.subscribe()
    }

    /// Closes every open watch (fault injection).
    pub fn drop_watches(&self) {
        self.watch_generation.send_modify(|g| *g += 1);
    }

    /// Forgets history so the next watch from an older version gets 410.
    pub fn compact(&self) {
        self.lock().store.compact();
    }

    fn notify(&self, state: &State) {
        let revision = state.store.revision();
        self.revisions.send_if_modified(|r| {
            let changed = *r != revision;
            *r = revision;
            changed
        });
    }

    /// One object.
    pub fn get(
        &self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let state = self.lock();
        state
            .store
            .get(&storage_of(resource), namespace, name)
            .map(|o| from_storage(resource, o))
            .ok_or_else(|| ApiError::not_found(&resource.group, &resource.plural, name))
    }

    /// A page of objects.
    pub fn list(
        &self,
        resource: &ResourceType,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let labels = LabelSelector::parse(&options.label_selector)
            .map_err(|e| ApiError::bad_request(e.0))?;
        let fields = FieldSelector::parse(&options.field_selector, &resource.selectable_fields())
            .map_err(|e| ApiError::bad_request(e.0))?;
        let (revision, after) = match &options.continue_token {
            Some(token) => decode_continue(token)?,
            None => (0, None),
        };
        let state = self.lock();
        let storage = storage_of(resource);
        let revision = if revision > 0 {
            revision
        } else {
            options.exact_revision.unwrap_or(0)
        };
        let (objects, revision) = if revision > 0 {
            let objects = state.store.list_at(&storage, namespace, revision).map_err(|c| {
                ApiError::gone(format!(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list. (requested {}, oldest {})",
                    c.requested, c.oldest
                ))
            })?;
            (objects, revision)
        } else {
            (
                state.store.list(&storage, namespace),
                state.store.revision(),
            )
        };
        drop(state);
        let mut matching = objects
            .iter()
            .map(|o| from_storage(resource, o))
            .filter(|o| labels.matches(&labels_of(o)) && fields.matches(o))
            .filter(|o| {
                after.as_ref().is_none_or(|(ns, n)| {
                    (meta::namespace(o), meta::name(o)) > (ns.as_str(), n.as_str())
                })
            });
        let mut items: Vec<Value> = Vec::new();
        let mut continue_token = None;
        let mut remaining = None;
        for object in matching.by_ref() {
            if options.limit > 0 && items.len() == options.limit {
                let rest = 1 + matching.count();
                remaining = Some(rest);
                if let Some(last) = items.last() {
                    continue_token = Some(encode_continue(
                        revision,
                        meta::namespace(last),
                        meta::name(last),
                    ));
                }
                break;
            }
            items.push(object);
        }
        Ok(ListPage {
            items,
            revision,
            continue_token,
            remaining,
        })
    }

    /// Create.
    pub async fn create(
        &self,
        resource: &ResourceType,
        namespace: &str,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let mut body = body;
        check_type(resource, &body)?;
        {
            // generateName is resolved before admission, as in the real server.
            let meta = body.get_mut("metadata").filter(|m| m.is_object());
            let Some(meta) = meta else {
                return Err(ApiError::invalid(
                    &resource.group,
                    &resource.kind,
                    "",
                    &[(
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            };
            if meta["name"].as_str().is_none_or(str::is_empty) {
                match meta["generateName"].as_str() {
                    Some(prefix) if !prefix.is_empty() => {
                        meta["name"] = json!(format!("{prefix}{}", meta::name_suffix()));
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &resource.group,
                            &resource.kind,
                            "",
                            &[(
                                "metadata.name".into(),
                                "Required value: name or generateName is required".into(),
                            )],
                        ));
                    }
                }
            }
            if resource.namespaced {
                let sent = meta["namespace"].as_str().unwrap_or_default();
                if !sent.is_empty() && sent != namespace {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                meta["namespace"] = json!(namespace);
            } else if let Some(m) = meta.as_object_mut() {
                m.remove("namespace");
            }
        }
        let name = meta::name(&body).to_owned();
        let valid = if resource.group.is_empty() && resource.plural == "namespaces" {
            meta::validate_label(&name)
        } else {
            meta::validate_subdomain(&name)
        };
        if let Err(message) = valid {
            return Err(ApiError::invalid(
                &resource.group,
                &resource.kind,
                &name,
                &[("metadata.name".into(), message)],
            ));
        }
        self.write(
            resource,
            namespace,
            &name,
            None,
            Operation::Create,
            options,
            false,
            |state, current| {
                if current.is_some() {
                    return Err(ApiError::already_exists(
                        &resource.group,
                        &resource.plural,
                        &name,
                    ));
                }
                state.check_namespace(resource, namespace)?;
                let mut object = body.clone();
                state.fill_new_metadata(resource, &mut object);
                builtin::prepare_create(resource, &mut object);
                Ok(object)
            },
        )
        .await
    }

    /// Update (PUT) of the object or its status.
    pub async fn update(
        &self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        subresource: Option<Subresource>,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        check_type(resource, &body)?;
        if meta::name(&body) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta::name(&body)
            )));
        }
        let wanted_rv = meta::resource_version(&body).to_owned();
        self.write(
            resource,
            namespace,
            name,
            subresource,
            Operation::Update,
            options,
            false,
            |_, current| {
                let current = current
                    .ok_or_else(|| ApiError::not_found(&resource.group, &resource.plural, name))?;
                if !wanted_rv.is_empty() && wanted_rv != meta::resource_version(current) {
                    return Err(ApiError::stale(&resource.group, &resource.plural, name));
                }
                Ok(body.clone())
            },
        )
        .await
    }

    /// Patch of the object or its status.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        subresource: Option<Subresource>,
        kind: PatchKind,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        if kind == PatchKind::Strategic && !resource.strategic_merge() {
            return Err(ApiError::unsupported_media_type(
                "application/strategic-merge-patch+json",
            ));
        }
        if kind != PatchKind::Json && !body.is_object() {
            return Err(ApiError::bad_request("the patch must be a JSON object"));
        }
        if kind == PatchKind::Apply && options.field_manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH: fieldManager is required for apply requests",
            ));
        }
        let operation = if kind == PatchKind::Apply {
            Operation::Create
        } else {
            Operation::Update
        };
        self.write(resource, namespace, name, subresource, operation, options, kind == PatchKind::Apply, |state, current| {
            let lists = lists_of(resource);
            let Some(current) = current else {
                if kind == PatchKind::Apply && subresource.is_none() {
                    state.check_namespace(resource, namespace)?;
                    check_type(resource, &body)?;
                    let mut object = body.clone();
                    object["metadata"]["name"] = json!(name);
                    if resource.namespaced {
                        object["metadata"]["namespace"] = json!(namespace);
                    }
                    let request = ApplyRequest { manager: &options.field_manager, force: options.force, api_version: &resource.api_version(), subresource: None, time: &meta::now() };
                    let mut applied = patch::server_side_apply(None, &object, &request, lists.as_ref()).map_err(|e| patch_error(resource, name, e))?;
                    applied["metadata"]["name"] = json!(name);
                    if resource.namespaced {
                        applied["metadata"]["namespace"] = json!(namespace);
                    }
                    state.fill_new_metadata(resource, &mut applied);
                    builtin::prepare_create(resource, &mut applied);
                    return Ok(applied);
                }
                return Err(ApiError::not_found(&resource.group, &resource.plural, name));
            };
            let current = current.clone();
            let patched = match kind {
                PatchKind::Merge => {
                    let mut target = current.clone();
                    json_patch::merge(&mut target, &body);
                    target
                }
                PatchKind::Json => {
                    let operations: json_patch::Patch = serde_json::from_value(body.clone())
                        .map_err(|e| ApiError::bad_request(format!("the JSON patch is malformed: {e}")))?;
                    let mut target = current.clone();
                    json_patch::patch(&mut target, &operations).map_err(|e| ApiError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}")))?;
                    target
                }
                PatchKind::Strategic => patch::strategic_merge(&current, &body, lists.as_ref()).map_err(|e| patch_error(resource, name, e))?,
                PatchKind::Apply => {
                    check_type(resource, &body)?;
                    let request = ApplyRequest { manager: &options.field_manager, force: options.force, api_version: &resource.api_version(), subresource: subresource.map(Subresource::as_str), time: &meta::now() };
                    patch::server_side_apply(Some(&current), &body, &request, lists.as_ref()).map_err(|e| patch_error(resource, name, e))?
                }
            };
            let wanted_rv = meta::resource_version(&patched);
            if !wanted_rv.is_empty() && wanted_rv != meta::resource_version(&current) {
                return Err(ApiError::stale(&resource.group, &resource.plural, name));
            }
            Ok(patched)
        })
        .await
    }

    /// The shared write pipeline: compute under the lock, admit without it, commit under it if
    /// nothing moved meanwhile (else recompute, as the real server retries patches).
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        subresource: Option<Subresource>,
        operation: Operation,
        options: &WriteOptions,
        apply: bool,
        compute: impl Fn(&mut State, Option<&Value>) -> Result<Value, ApiError>,
    ) -> Result<Written, ApiError> {
        let storage = storage_of(resource);
        for _ in 0..MAX_CONFLICT_RETRIES {
            let (candidate, current, configs, namespace_object) = {
                let mut state = self.lock();
                let current = state
                    .store
                    .get(&storage, namespace, name)
                    .map(|o| from_storage(resource, o));
                let candidate = compute(&mut state, current.as_ref())?;
                let candidate =
                    state.merge_subresource(resource, subresource, current.as_ref(), candidate);
                let configs = state.webhook_configurations();
                let namespace_object = state.namespace_object(namespace);
                (candidate, current, configs, namespace_object)
            };
            let operation = if current.is_none() {
                Operation::Create
            } else if operation == Operation::Create {
                Operation::Update
            } else {
                operation
            };
            let mut warnings = Vec::new();
            let candidate = if configs.is_empty() {
                candidate
            } else {
                let attributes = AdmissionAttributes {
                    operation,
                    group: resource.group.clone(),
                    version: resource.version.clone(),
                    kind: resource.kind.clone(),
                    resource: resource.plural.clone(),
                    sub_resource: subresource.map(|s| s.as_str().to_owned()),
                    namespaced: resource.namespaced,
                    name: name.to_owned(),
                    namespace: resource.namespaced.then(|| namespace.to_owned()),
                    object: Some(candidate),
                    old_object: current.clone(),
                    namespace_object,
                    options: None,
                    dry_run: options.dry_run,
                };
                let outcome = self
                    .webhooks
                    .admit(&configs, &attributes)
                    .await
                    .map_err(|e| {
                        let (code, reason, message) = e.status();
                        ApiError::new(code, reason, message)
                    })?;
                warnings.extend(outcome.warnings);
                outcome.object.unwrap_or(json!({}))
            };
            let mut state = self.lock();
            let now_current = state
                .store
                .get(&storage, namespace, name)
                .map(|o| from_storage(resource, o));
            if meta::resource_version(now_current.as_ref().unwrap_or(&Value::Null))
                != meta::resource_version(current.as_ref().unwrap_or(&Value::Null))
            {
                continue;
            }
            let mut written = state.commit(
                resource,
                subresource,
                current.as_ref(),
                candidate,
                options,
                apply,
            )?;
            written.warnings.splice(0..0, warnings);
            self.notify(&state);
            return Ok(written);
        }
        Err(ApiError::stale(&resource.group, &resource.plural, name))
    }

    /// Delete one object.
    pub fn delete(
        &self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Deletion, ApiError> {
        let mut state = self.lock();
        let storage = storage_of(resource);
        let current = state
            .store
            .get(&storage, namespace, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&resource.group, &resource.plural, name))?;
        if let Some(uid) = &options.uid
            && uid != meta::uid(&current)
        {
            return Err(ApiError::conflict(
                &resource.group,
                &resource.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta::uid(&current)
                ),
            ));
        }
        if let Some(rv) = &options.resource_version
            && rv != meta::resource_version(&current)
        {
            return Err(ApiError::conflict(
                &resource.group,
                &resource.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta::resource_version(&current)
                ),
            ));
        }
        if options.dry_run {
            return Ok(Deletion {
                object: Arc::new(from_storage(resource, &current)),
                removed: false,
            });
        }
        let deletion = lifecycle::delete(
            &mut state,
            &storage,
            namespace,
            name,
            options.propagation,
            options.grace_seconds,
        )
        .ok_or_else(|| ApiError::not_found(&resource.group, &resource.plural, name))?;
        self.notify(&state);
        Ok(Deletion {
            object: Arc::new(from_storage(resource, &deletion.object)),
            removed: deletion.removed,
        })
    }

    /// `POST pods/NAME/binding`: assigns the pod to a node once.
    pub fn bind(
        &self,
        resource: &ResourceType,
        namespace: &str,
        name: &str,
        binding: &Value,
    ) -> Result<(), ApiError> {
        let node = binding["target"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "",
                    "Binding",
                    name,
                    &[("target.name".into(), "Required value".into())],
                )
            })?;
        let mut state = self.lock();
        let storage = storage_of(resource);
        let current = state
            .store
            .get(&storage, namespace, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found("", "pods", name))?;
        if meta::is_deleting(&current) {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(existing) = current["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                name,
                &format!("pod {name} is already assigned to node \"{existing}\""),
            ));
        }
        let mut pod = (*current).clone();
        pod["spec"]["nodeName"] = json!(node);
        let mut conditions: Vec<Value> = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "PodScheduled");
        conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now()}));
        pod["status"]["conditions"] = Value::Array(conditions);
        state.store.replace(&storage, pod);
        self.notify(&state);
        Ok(())
    }

    /// Runs `f` on the state, then wakes watchers (for callers that edit the store directly,
    /// such as fault injection).
    pub fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.lock();
        let out = f(&mut state);
        self.notify(&state);
        out
    }
}

fn check_type(resource: &ResourceType, body: &Value) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let api_version = body["apiVersion"].as_str().unwrap_or_default();
    let kind = body["kind"].as_str().unwrap_or_default();
    if !kind.is_empty() && kind != resource.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            resource.kind
        )));
    }
    if !api_version.is_empty() && api_version != resource.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            resource.api_version()
        )));
    }
    Ok(())
}

fn encode_continue(revision: u64, namespace: &str, name: &str) -> String {
    let token = json!({"rv": revision, "ns": namespace, "name": name}).to_string();
    token.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Result<(u64, Option<(String, String)>), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(())
        })
        .collect();
    let value: Value = bytes
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(bad)?;
    let revision = value["rv"].as_u64().ok_or_else(bad)?;
    let ns = value["ns"].as_str().ok_or_else(bad)?.to_owned();
    let name = value["name"].as_str().ok_or_else(bad)?.to_owned();
    Ok((revision, Some((ns, name))))
}
