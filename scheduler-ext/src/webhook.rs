//! The mutating admission webhook (`/mutate-pods`, `admission.k8s.io/v1` AdmissionReview): on a
//! pod CREATE, applies the pin decision as a JSONPatch. Everything that is not a StatefulSet pod
//! with a PersistentPodState is allowed unchanged. Of the pod, only the fields a decision reads
//! are parsed ([`crate::pod`]), and the patch is the diff of those.
//!
//! Requests are not authenticated, so nothing here acts on what a request claims beyond
//! answering it: a skipped pin is said in the pod's annotation and an admission warning, and the
//! controller, which sees the pods that really exist, turns the annotation into an Event.
//!
//! Every pod CREATE reviewed also gets an admission warning for a retention annotation that does
//! not parse (in the one grammar, `ipkeep_values::Retention`): the pod is admitted, and the CNI
//! plugin falls back to the network's retention for it.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ipkeep_placement::pin::{self, Decision, PinOutcome};
use ipkeep_placement::{affinity, lifecycle};
use ipkeep_values::Retention;
use ipkeep_values::keys::{IP_RETENTION, KRUISE_RESERVED_IP, PERSISTENT_POD_STATE};
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::cache::Caches;
use crate::error::RequestError;
use crate::pod;

/// The AdmissionReview version served (and the only one declared in the configuration).
pub const ADMISSION_V1: &str = "admission.k8s.io/v1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(borrow)]
    request: Option<RequestIn<'a>>,
}

/// `request` of an AdmissionReview: what either webhook reads of it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequestIn<'a> {
    pub(crate) uid: String,
    #[serde(default)]
    pub(crate) resource: GroupResource,
    #[serde(default)]
    pub(crate) sub_resource: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    pub(crate) operation: String,
    #[serde(default, borrow)]
    pub(crate) object: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub(crate) old_object: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub(crate) options: Option<&'a RawValue>,
    #[serde(default)]
    pub(crate) dry_run: Option<bool>,
}

#[derive(Deserialize, Default)]
pub(crate) struct GroupResource {
    #[serde(default)]
    pub(crate) group: String,
    #[serde(default)]
    pub(crate) resource: String,
}

/// Reads an AdmissionReview's request, refusing anything but `admission.k8s.io/v1`.
pub(crate) fn read_request(body: &[u8]) -> Result<RequestIn<'_>, RequestError> {
    let malformed =
        |reason: String| RequestError::malformed("admission.k8s.io/v1 AdmissionReview", reason);
    let review: ReviewIn<'_> =
        serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    if review.api_version.as_deref() != Some(ADMISSION_V1)
        || review.kind.as_deref() != Some("AdmissionReview")
    {
        return Err(malformed(format!(
            "apiVersion/kind must be {ADMISSION_V1}/AdmissionReview, got {}/{}",
            review.api_version.as_deref().unwrap_or("(none)"),
            review.kind.as_deref().unwrap_or("(none)")
        )));
    }
    review
        .request
        .ok_or_else(|| malformed("it has no request".into()))
}

/// The AdmissionReview sent back.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    api_version: &'static str,
    kind: &'static str,
    /// The response.
    pub response: ResponseOut,
}

impl ReviewOut {
    /// An answer that allows the request unchanged.
    pub fn allow(uid: String) -> Self {
        Self {
            api_version: ADMISSION_V1,
            kind: "AdmissionReview",
            response: ResponseOut {
                uid,
                allowed: true,
                status: None,
                patch_type: None,
                patch: None,
                warnings: Vec::new(),
                audit_annotations: BTreeMap::new(),
            },
        }
    }
}

/// `response` of an AdmissionReview.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ResponseOut {
    /// `request.uid`.
    pub uid: String,
    /// False only when `/validate-pods` holds a deletion; the mutating webhook pins or
    /// explains, it never refuses a pod.
    pub allowed: bool,
    /// Why a request is refused (`metav1.Status`): the client sees its message and code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusOut>,
    /// `JSONPatch` when `patch` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// Base64 of the RFC 6902 patch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// Shown to the client that created the pod.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Recorded in the API server's audit log.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
}

/// `response.status` of a refusal.
#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct StatusOut {
    /// The HTTP code the client gets: 429, so the StatefulSet controller and `kubectl drain`
    /// retry, as they do for a PodDisruptionBudget.
    pub code: u16,
    /// `TooManyRequests`.
    pub reason: &'static str,
    /// What the request waits for, and how to get past it.
    pub message: String,
}

/// What came of one review.
#[derive(Debug)]
pub struct Reviewed {
    /// The answer.
    pub review: ReviewOut,
    /// The `outcome` metric label.
    pub outcome: &'static str,
    /// The skip reason label, when a pin was skipped (not on dry runs).
    pub skipped: Option<&'static str>,
    /// The pod's namespace and name (or generateName), once read (for logs).
    pub pod: Option<(String, String)>,
}

/// Reviews one AdmissionReview body.
pub fn review(body: &[u8], caches: &Caches) -> Result<Reviewed, RequestError> {
    let request = read_request(body)?;
    let mut out = Reviewed {
        review: ReviewOut::allow(request.uid.clone()),
        outcome: "passed",
        skipped: None,
        pod: None,
    };
    let is_pod_create = request.operation == "CREATE"
        && request.resource.group.is_empty()
        && request.resource.resource == "pods"
        && request
            .sub_resource
            .as_deref()
            .unwrap_or_default()
            .is_empty();
    let Some(object) = request.object.filter(|_| is_pod_create) else {
        return Ok(out);
    };
    let pod = match pod::read(object.get()) {
        Ok(pod) => pod,
        Err(e) => {
            out.outcome = "invalid";
            out.review.response.warnings.push(format!(
                "ipkeep: pod not pinned: its object cannot be read: {e}"
            ));
            return Ok(out);
        }
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_default();
    let name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_default();
    out.pod = Some((namespace.clone(), name));
    let Some(statefulset) = pin::statefulset_name(&pod) else {
        out.review.response.warnings = retention_warnings(&pod, &pod);
        return Ok(out);
    };
    if !caches.ready() {
        return Err(RequestError::NotReady);
    }
    let pps = caches.pps_for(&namespace, &statefulset);
    let Decision::Manage(managed) = pin::decide(&pod, &namespace, pps.as_deref()) else {
        out.review.response.warnings = retention_warnings(&pod, &pod);
        return Ok(out);
    };
    let mut after = pod.clone();
    affinity::apply(&managed, &mut after);
    // The hooks of a spec that does not check are not applied (the pod fails open); the
    // controller reports the spec on the PersistentPodState.
    lifecycle::apply_at_create(&managed.lifecycle, &mut after);
    let patch = json_patch::diff(&to_json(&pod), &to_json(&after));
    if !patch.0.is_empty() {
        let bytes = serde_json::to_vec(&patch).map_err(|e| RequestError::Body(e.to_string()))?;
        out.review.response.patch_type = Some("JSONPatch");
        out.review.response.patch = Some(BASE64.encode(bytes));
    }
    let response = &mut out.review.response;
    match &managed.pin {
        PinOutcome::Pinned(p) => {
            out.outcome = "pinned";
            let how = if p.required.is_empty() {
                "preferred"
            } else {
                "required"
            };
            response.audit_annotations.insert(
                "pin".into(),
                format!("{how} pin to node {} by {}", p.node, managed.pps),
            );
        }
        PinOutcome::Unrecorded(_) => out.outcome = "unrecorded",
        PinOutcome::Skipped(why) => {
            out.outcome = "skipped";
            response
                .warnings
                .push(format!("ipkeep: pod {} {why}", managed.pod));
            if !request.dry_run.unwrap_or(false) {
                out.skipped = Some(why.label());
            }
        }
    }
    // What the pod came with, and what it is created with (the retention stamped included).
    response.warnings.extend(retention_warnings(&pod, &after));
    Ok(out)
}

/// A warning for each retention annotation of `before` (the pod as submitted) that does not
/// parse, saying what happens instead in `after` (the pod as created): the webhook stamped its
/// PersistentPodState's retention over it, or the CNI plugin ignores it (it reads
/// `ipkeep.dev/ip-retention` first, OpenKruise's minutes only without it).
pub fn retention_warnings(before: &Pod, after: &Pod) -> Vec<String> {
    let ignored = "the ipkeep CNI plugin ignores it and holds this pod's IPs for the network's retention (ipam.retention) instead";
    let mut warnings = Vec::new();
    let own = annotation(before, IP_RETENTION);
    if let Some(Err(e)) = own.map(|v| Retention::parse(&format!("annotation {IP_RETENTION}"), v)) {
        let instead = match annotation(after, IP_RETENTION) {
            Some(stamped) if Some(stamped) != own => format!(
                "replaced by the retention of its PersistentPodState ({}), {stamped:?}",
                annotation(after, PERSISTENT_POD_STATE).unwrap_or_default()
            ),
            _ => ignored.to_string(),
        };
        warnings.push(format!("ipkeep: {e}; {instead}"));
    }
    if let Some(Err(e)) = annotation(before, KRUISE_RESERVED_IP)
        .map(|v| Retention::parse_kruise_minutes(&format!("annotation {KRUISE_RESERVED_IP}"), v))
    {
        let instead = if annotation(after, IP_RETENTION).is_some() {
            format!("it is not used anyway: {IP_RETENTION} takes precedence")
        } else {
            ignored.to_string()
        };
        warnings.push(format!("ipkeep: {e}; {instead}"));
    }
    warnings
}

fn annotation<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn to_json(pod: &Pod) -> serde_json::Value {
    // A Pod always serializes.
    serde_json::to_value(pod).unwrap_or_default()
}
