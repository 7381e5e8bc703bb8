//! The commit half of a write: what happens under the lock once a candidate object is known —
//! server-owned metadata restored, schema and built-in validation, `generation`, managedFields,
//! the no-op check, storage, and what the write triggers (CRD registration, finalization,
//! orphan collection).

use serde_json::{Value, json};

use super::{
    FieldValidation, State, Subresource, WriteOptions, Written, lists_of, spec_part,
    uses_generation, without_managed_fields,
};
use crate::builtin;
use crate::convert::{from_storage, storage_of, to_storage};
use crate::lifecycle;
use crate::meta;
use crate::patch;
use crate::registry::{ResourceType, StorageKey};
use crate::schema;
use crate::status::ApiError;

impl State {
    pub(super) fn fill_new_metadata(&mut self, resource: &ResourceType, object: &mut Value) {
        self.uids += 1;
        let meta = &mut object["metadata"];
        meta["uid"] = json!(meta::new_uid(self.uids));
        meta["creationTimestamp"] = json!(meta::now());
        if let Some(m) = meta.as_object_mut() {
            for key in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
            ] {
                m.remove(key);
            }
        }
        if uses_generation(resource) {
            meta["generation"] = json!(1);
        } else if let Some(m) = meta.as_object_mut() {
            m.remove("generation");
        }
    }

    pub(super) fn check_namespace(
        &self,
        resource: &ResourceType,
        namespace: &str,
    ) -> Result<(), ApiError> {
        if !resource.namespaced {
            return Ok(());
        }
        let key = StorageKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        match self.store.get(&key, "", namespace) {
            None => Err(ApiError::not_found("", "namespaces", namespace)),
            Some(ns) if meta::is_deleting(ns) => Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                resource.plural, ""
            ))),
            Some(_) => Ok(()),
        }
    }

    pub(super) fn webhook_configurations(&self) -> Vec<Value> {
        let key = StorageKey {
            group: "admissionregistration.k8s.io".into(),
            plural: "mutatingwebhookconfigurations".into(),
        };
        self.store
            .list(&key, None)
            .iter()
            .map(|o| (**o).clone())
            .collect()
    }

    pub(super) fn namespace_object(&self, namespace: &str) -> Option<Value> {
        let key = StorageKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        self.store.get(&key, "", namespace).map(|o| (**o).clone())
    }

    /// Keeps spec writes off status and status writes off everything else.
    pub(super) fn merge_subresource(
        &self,
        resource: &ResourceType,
        subresource: Option<Subresource>,
        current: Option<&Value>,
        mut candidate: Value,
    ) -> Value {
        let Some(current) = current else {
            return candidate;
        };
        match subresource {
            Some(Subresource::Status) => {
                let mut object = current.clone();
                object["status"] = candidate.get("status").cloned().unwrap_or(Value::Null);
                if object["status"].is_null()
                    && let Some(m) = object.as_object_mut()
                {
                    m.remove("status");
                }
                if let Some(fields) = candidate.pointer("/metadata/managedFields") {
                    object["metadata"]["managedFields"] = fields.clone();
                }
                object
            }
            _ => {
                if resource.has_status() {
                    match current.get("status") {
                        Some(status) => candidate["status"] = status.clone(),
                        None => {
                            if let Some(m) = candidate.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                candidate
            }
        }
    }

    /// Validates, stamps and stores a candidate; runs what the write triggers.
    pub(super) fn commit(
        &mut self,
        resource: &ResourceType,
        subresource: Option<Subresource>,
        current: Option<&Value>,
        mut object: Value,
        options: &WriteOptions,
        applied: bool,
    ) -> Result<Written, ApiError> {
        let name = meta::name(&object).to_owned();
        let storage = storage_of(resource);
        // Server-owned metadata cannot be changed by clients.
        if let Some(current) = current {
            for key in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ] {
                match current["metadata"].get(key) {
                    Some(v) => object["metadata"][key] = v.clone(),
                    None => {
                        if let Some(m) = object["metadata"].as_object_mut() {
                            m.remove(key);
                        }
                    }
                }
            }
            if meta::is_deleting(current) {
                let before = meta::finalizers(current);
                if meta::finalizers(&object)
                    .iter()
                    .any(|f| !before.contains(f))
                {
                    return Err(ApiError::invalid(&resource.group, &resource.kind, &name, &[("metadata.finalizers".into(), "Forbidden: no new finalizers can be added if the object is being deleted".into())]));
                }
            }
        }
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        let mut warnings = Vec::new();
        if let Some(schema) = &resource.schema {
            match schema::admit_custom_resource(schema, &mut object) {
                Ok(outcome) if !outcome.unknown_fields.is_empty() => match options.field_validation
                {
                    FieldValidation::Strict => {
                        let list: Vec<String> = outcome
                            .unknown_fields
                            .iter()
                            .map(|f| format!("unknown field \"{f}\""))
                            .collect();
                        return Err(ApiError::bad_request(format!(
                            "strict decoding error: {}",
                            list.join(", ")
                        )));
                    }
                    FieldValidation::Warn => warnings.extend(
                        outcome
                            .unknown_fields
                            .iter()
                            .map(|f| format!("unknown field \"{f}\"")),
                    ),
                    FieldValidation::Ignore => {}
                },
                Ok(_) => {}
                Err(problems) => {
                    let causes: Vec<(String, String)> =
                        problems.into_iter().map(|p| (p.field, p.message)).collect();
                    return Err(ApiError::invalid(
                        &resource.group,
                        &resource.kind,
                        &name,
                        &causes,
                    ));
                }
            }
        }
        let problems = builtin::validate(resource, &object, current);
        if !problems.is_empty() {
            return Err(ApiError::invalid(
                &resource.group,
                &resource.kind,
                &name,
                &problems,
            ));
        }
        if resource.group == "apiextensions.k8s.io" {
            crate::registry::crd_resources(&object).map_err(|e| {
                let (field, message) = e
                    .split_once(": ")
                    .map_or((String::new(), e.clone()), |(f, m)| {
                        (f.to_owned(), m.to_owned())
                    });
                ApiError::invalid(&resource.group, &resource.kind, &name, &[(field, message)])
            })?;
            if current.is_none() {
                crd_accepted(&mut object);
            }
        }
        if let Some(current) = current {
            if uses_generation(resource) && spec_part(current) != spec_part(&object) {
                let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
                object["metadata"]["generation"] = json!(generation + 1);
            }
            if without_managed_fields(current) == without_managed_fields(&object) {
                // No-op: nothing is written and no event is sent.
                return Ok(Written {
                    object: current.clone(),
                    created: false,
                    warnings,
                });
            }
        }
        if !applied {
            let lists = lists_of(resource);
            let time = meta::now();
            let subresource = subresource.map(Subresource::as_str);
            if current.is_none() {
                // Like the real server, a create owns what was sent (and defaulted), not the
                // status the server resets.
                let mut sent = object.clone();
                if let Some(map) = sent
                    .as_object_mut()
                    .filter(|_| resource.has_status() && resource.kind != "Node")
                {
                    map.remove("status");
                }
                patch::record_update(
                    None,
                    &mut sent,
                    &options.field_manager,
                    &resource.api_version(),
                    subresource,
                    &time,
                    lists.as_ref(),
                );
                object["metadata"]["managedFields"] = sent["metadata"]["managedFields"].take();
            } else {
                patch::record_update(
                    current,
                    &mut object,
                    &options.field_manager,
                    &resource.api_version(),
                    subresource,
                    &time,
                    lists.as_ref(),
                );
            }
        }
        if options.dry_run {
            return Ok(Written {
                object,
                created: current.is_none(),
                warnings,
            });
        }
        let stored = to_storage(
            resource,
            &self
                .registry
                .storage_resource(&storage)
                .map(ResourceType::api_version)
                .unwrap_or_else(|| resource.api_version()),
            object,
        );
        let stored = if current.is_some() {
            self.store.replace(&storage, stored)
        } else {
            self.store.insert(&storage, stored)
        };
        if resource.group == "apiextensions.k8s.io" {
            self.registry
                .register_crd(&stored)
                .map_err(ApiError::internal)?;
        }
        let mut result = from_storage(resource, &stored);
        if let Some(removed) = lifecycle::remove_if_finalized(self, &storage, &stored) {
            result = from_storage(resource, &removed);
        } else if current.is_none() {
            lifecycle::collect_if_orphaned(self, &storage, &stored);
        }
        Ok(Written {
            object: result,
            created: current.is_none(),
            warnings,
        })
    }
}

/// What the apiextensions controllers write into a new CRD's status.
fn crd_accepted(crd: &mut Value) {
    let now = meta::now();
    let names = crd["spec"]["names"].clone();
    let stored: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == true)
        .map(|v| v["name"].clone())
        .collect();
    crd["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ]
    });
}
