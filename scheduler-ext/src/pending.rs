//! The mutating webhook for PersistentPodState writes (`/mutate-persistentpodstates`), on the
//! webhook's path: a PersistentPodState created with lifecycle hooks, or whose hooks change, is
//! labelled [`ADMISSION_PENDING_LABEL`] ([`admission::gets_hooks`]); ipkeep-controller removes the
//! label once the hooks' admission plan is in place, and until then the admission policy
//! `ipkeep-hooks-pending` refuses to create the StatefulSet's pods (its controller retries). The
//! admission policy `ipkeep-admission-pending` does the same where the pin's policy runs.
//!
//! Of the objects, only `spec.lifecycle`, `spec.targetRef.apiVersion` (a target outside group
//! `apps`, an Advanced StatefulSet, gets none of ipkeep's hooks) and the labels are read;
//! anything else is allowed unchanged.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ipkeep_api::LifecycleSpec;
use ipkeep_placement::admission;
use ipkeep_values::keys::ADMISSION_PENDING_LABEL;
use serde::Deserialize;
use serde_json::json;

use crate::cache::Caches;
use crate::error::RequestError;
use crate::review::{Outcome, Reviewed, read_request};

/// What is read of a PersistentPodState.
#[derive(Deserialize, Default)]
struct Lean {
    #[serde(default)]
    metadata: LeanMeta,
    #[serde(default)]
    spec: LeanSpec,
}

#[derive(Deserialize, Default)]
struct LeanMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LeanSpec {
    #[serde(default)]
    lifecycle: Option<LifecycleSpec>,
    /// Read leniently: only its `apiVersion` decides (a target outside group `apps` gets none of
    /// ipkeep's hooks, so nothing waits for them).
    #[serde(default)]
    target_ref: Option<serde_json::Value>,
}

impl LeanSpec {
    /// Whether the target is in group `apps`, the only one ipkeep's hooks run for (OpenKruise's
    /// Advanced StatefulSet has hooks of its own), as the admission policy
    /// `ipkeep-admission-pending` reads it.
    fn targets_apps(&self) -> bool {
        let api_version = self
            .target_ref
            .as_ref()
            .and_then(|t| t.get("apiVersion"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        ipkeep_api::statefulset::group_of(api_version) == ipkeep_api::statefulset::GROUP
    }
}

/// Reviews one AdmissionReview body.
pub fn review(body: &[u8], _caches: &Caches) -> Result<Reviewed, RequestError> {
    let request = read_request(body)?;
    let mut out = Reviewed::passed(request.uid.clone());
    let created = request.operation == "CREATE";
    let is_pps_write = (created || request.operation == "UPDATE")
        && request.resource.group == "ipkeep.dev"
        && request.resource.resource == "persistentpodstates"
        && request
            .sub_resource
            .as_deref()
            .unwrap_or_default()
            .is_empty();
    let Some(object) = request.object.filter(|_| is_pps_write) else {
        return Ok(out);
    };
    let read = |raw: &serde_json::value::RawValue| -> Result<Lean, RequestError> {
        serde_json::from_str(raw.get())
            .map_err(|e| RequestError::malformed("PersistentPodState", format!("its object: {e}")))
    };
    let new = read(object)?;
    let old = match request.old_object.filter(|_| !created) {
        Some(raw) => read(raw)?,
        None => Lean::default(),
    };
    out.pod = Some((
        new.metadata
            .namespace
            .clone()
            .or(request.namespace)
            .unwrap_or_default(),
        new.metadata.name.clone().unwrap_or_default(),
    ));
    let hooked = new.spec.targets_apps()
        && admission::gets_hooks(
            created,
            old.spec.lifecycle.as_ref(),
            new.spec.lifecycle.as_ref(),
        );
    let labelled = new
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(ADMISSION_PENDING_LABEL));
    if !hooked || labelled {
        return Ok(out);
    }
    let mut patch = Vec::new();
    if new.metadata.labels.is_none() {
        patch.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
    }
    patch.push(json!({"op": "add",
        "path": format!("/metadata/labels/{}", ADMISSION_PENDING_LABEL.replace('~', "~0").replace('/', "~1")),
        "value": "true"}));
    let bytes = serde_json::to_vec(&patch).map_err(|e| RequestError::Body(e.to_string()))?;
    out.review.response.patch_type = Some("JSONPatch");
    out.review.response.patch = Some(BASE64.encode(bytes));
    out.outcome = Outcome::Labelled;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn body(operation: &str, new: serde_json::Value, old: Option<serde_json::Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": operation,
                "resource": {"group": "ipkeep.dev", "version": "v1alpha1", "resource": "persistentpodstates"},
                "object": new, "oldObject": old}}))
        .unwrap()
    }

    fn pps(lifecycle: Option<&str>, labels: serde_json::Value) -> serde_json::Value {
        let mut spec =
            json!({"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"}});
        if let Some(v) = lifecycle {
            spec["lifecycle"] =
                json!({"preNormal": {"labelsHandler": {"example.com/registered": v}}});
        }
        json!({"metadata": {"name": "db", "namespace": "prod", "labels": labels}, "spec": spec})
    }

    fn patch_of(r: &Reviewed) -> Option<serde_json::Value> {
        r.review
            .response
            .patch
            .as_ref()
            .map(|p| serde_json::from_slice(&BASE64.decode(p).unwrap()).unwrap())
    }

    #[test]
    fn a_persistent_pod_state_created_with_hooks_is_labelled_pending() {
        let caches = Caches::new(Default::default()).0;
        let r = review(
            &body("CREATE", pps(Some("true"), json!(null)), None),
            &caches,
        )
        .unwrap();
        assert_eq!(r.outcome, Outcome::Labelled);
        assert_eq!(
            patch_of(&r).unwrap(),
            json!([{"op": "add", "path": "/metadata/labels", "value": {}},
                   {"op": "add", "path": "/metadata/labels/ipkeep.dev~1admission-pending", "value": "true"}])
        );
        let plain = review(
            &body("CREATE", pps(None, json!({"app": "db"})), None),
            &caches,
        )
        .unwrap();
        assert_eq!((plain.outcome, patch_of(&plain)), (Outcome::Passed, None));
    }

    /// ipkeep's hooks stand aside for an Advanced StatefulSet (it has its own): nothing waits
    /// for a plan of them.
    #[test]
    fn hooks_for_an_advanced_statefulset_leave_it_unlabelled() {
        let caches = Caches::new(Default::default()).0;
        let mut kruise = pps(Some("true"), json!(null));
        kruise["spec"]["targetRef"]["apiVersion"] = json!("apps.kruise.io/v1beta1");
        let r = review(&body("CREATE", kruise, None), &caches).unwrap();
        assert_eq!((r.outcome, patch_of(&r)), (Outcome::Passed, None));
    }

    #[test]
    fn only_a_change_of_hooks_labels_an_update() {
        let caches = Caches::new(Default::default()).0;
        let same = review(
            &body(
                "UPDATE",
                pps(Some("true"), json!({})),
                Some(pps(Some("true"), json!({}))),
            ),
            &caches,
        )
        .unwrap();
        assert_eq!(same.outcome, Outcome::Passed);
        let changed = review(
            &body(
                "UPDATE",
                pps(Some("yes"), json!({"app": "db"})),
                Some(pps(Some("true"), json!({}))),
            ),
            &caches,
        )
        .unwrap();
        assert_eq!(
            patch_of(&changed).unwrap(),
            json!([{"op": "add", "path": "/metadata/labels/ipkeep.dev~1admission-pending", "value": "true"}])
        );
    }
}
