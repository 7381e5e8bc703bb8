//! The validating webhook `/validate-pods` (`admission.k8s.io/v1` AdmissionReview): holds the
//! deletion (pods DELETE) and the eviction (pods/eviction CREATE) of a pod whose PreDelete hook
//! blocks, with the decision of [`ipkeep_lifecycle::admit_delete`]. A held request is refused
//! with code 429, so the StatefulSet controller, the garbage collector and `kubectl drain` retry
//! as they do for a PodDisruptionBudget; its message says what the pod waits for.
//!
//! Requests are not authenticated (anyone who can reach the server can send one), so the
//! review is an answer and nothing else: it writes nothing to the API, and the server holds no
//! permission to write pods. What starts a hook, marking the pod `PreparingDelete`, is the
//! controller's, from state only authorised principals write (docs/lifecycle.md, "Who can
//! cause what").
//!
//! A DELETE carries the pod (`oldObject`); an eviction only names it, so its pod comes from the
//! cache of pods with hooks ([`Caches::pod`]): a pod not there has no hooks, and passes.

use std::time::{SystemTime, UNIX_EPOCH};

use ipkeep_placement::ipkeep_lifecycle::{self as lifecycle, Admission, DeleteRequest};
use ipkeep_placement::pin;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use crate::cache::Caches;
use crate::error::RequestError;
use crate::pod;
use crate::review::{Outcome, Reviewed, StatusOut, read_request};

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct OptionsIn {
    #[serde(default)]
    grace_period_seconds: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EvictionIn {
    #[serde(default)]
    delete_options: Option<OptionsIn>,
}

/// Reviews one AdmissionReview body now.
pub fn review(body: &[u8], caches: &Caches) -> Result<Reviewed, RequestError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    review_at(body, caches, now)
}

/// Reviews one AdmissionReview body at `now` (unix seconds).
pub fn review_at(body: &[u8], caches: &Caches, now: u64) -> Result<Reviewed, RequestError> {
    let request = read_request(body)?;
    let mut out = Reviewed::passed(request.uid.clone());
    let core_pods = request.resource.group.is_empty() && request.resource.resource == "pods";
    let sub = request.sub_resource.as_deref().unwrap_or_default();
    let malformed = |what: &str, e: serde_json::Error| {
        RequestError::malformed(
            "admission.k8s.io/v1 AdmissionReview",
            format!("{what}: {e}"),
        )
    };
    let (eviction, options) = match (request.operation.as_str(), sub) {
        ("DELETE", "") if core_pods => {
            let options = request
                .options
                .map(|o| serde_json::from_str::<OptionsIn>(o.get()))
                .transpose()
                .map_err(|e| malformed("request.options", e))?;
            (false, options.unwrap_or_default())
        }
        ("CREATE", "eviction") if core_pods => {
            let eviction = request
                .object
                .map(|o| serde_json::from_str::<EvictionIn>(o.get()))
                .transpose()
                .map_err(|e| malformed("request.object (an Eviction)", e))?;
            (
                true,
                eviction.and_then(|e| e.delete_options).unwrap_or_default(),
            )
        }
        _ => return Ok(out),
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    let name = request.name.clone().unwrap_or_default();
    out.pod = Some((namespace.clone(), name.clone()));
    if !caches.ready() {
        return Err(RequestError::NotReady);
    }
    let pod: Pod = match (eviction, request.old_object) {
        (false, Some(old)) => pod::read(old.get()).map_err(|e| malformed_pod(&e))?,
        _ => match caches.pod(&namespace, &name) {
            Some(p) => Pod::clone(&p),
            None => return Ok(out),
        },
    };
    let Some((workload, statefulset)) = pin::statefulset_of(&pod) else {
        return Ok(out);
    };
    let Some(hooks) = caches
        .lifecycle_for(&namespace, workload, &statefulset)
        .filter(|l| l.pre_delete.is_some())
    else {
        return Ok(out);
    };
    let node_ready = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| caches.node_ready(n));
    let facts = ipkeep_placement::lifecycle::pod_facts(&pod, node_ready);
    let delete = DeleteRequest {
        force: options.grace_period_seconds == Some(0),
        eviction,
    };
    let response = &mut out.review.response;
    match lifecycle::admit_delete(&hooks, &facts, delete, now, &name) {
        Admission::Allow { escaped: None } => out.outcome = Outcome::Allowed,
        Admission::Allow {
            escaped: Some(escape),
        } => {
            out.outcome = Outcome::Escaped;
            response.warnings.push(format!(
                "ipkeep: pod {name} passes its preDelete hook: {escape}"
            ));
            response
                .audit_annotations
                .insert("lifecycle".into(), escape.to_string());
        }
        Admission::Deny { message } => {
            out.outcome = Outcome::Held;
            response.allowed = false;
            response.status = Some(StatusOut {
                code: 429,
                reason: "TooManyRequests",
                message,
            });
        }
    }
    Ok(out)
}

fn malformed_pod(e: &pod::PodError) -> RequestError {
    RequestError::malformed(
        "admission.k8s.io/v1 AdmissionReview",
        format!("request.oldObject (a Pod): {e}"),
    )
}
