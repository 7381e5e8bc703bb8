//! The AdmissionReview envelope (`admission.k8s.io/v1`) both webhooks read and answer
//! (`/mutate-pods`, [`crate::webhook`]; `/validate-pods`, [`crate::deletion`]), and what came of
//! a review ([`Reviewed`], [`Outcome`]).
//!
//! Written here rather than taken from `kube::core::admission`, whose types do not fit:
//! - `AdmissionRequest<T>` deserializes the whole `object` and `oldObject` into `T` (a `Pod` or a
//!   `DynamicObject`); the webhooks read the request through borrowed `RawValue`s and parse only
//!   the pod fields a decision reads ([`crate::pod`]), which is most of the ~20 µs a review takes;
//! - it requires `kind`, `userInfo` and `resource`, and accepts any `apiVersion`;
//! - `AdmissionResponse` always writes `status` and writes `patch` as an array of numbers, where
//!   the answer has been a base64 string, which the tests and clients read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::RequestError;

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
    /// What the webhook did.
    pub outcome: Outcome,
    /// The skip reason label, when a pin was skipped (not on dry runs).
    pub skipped: Option<&'static str>,
    /// The pod's namespace and name (or generateName), once read (for logs).
    pub pod: Option<(String, String)>,
}

impl Reviewed {
    /// Allows the request `uid` unchanged: [`Outcome::Passed`].
    pub fn passed(uid: String) -> Self {
        Self {
            review: ReviewOut::allow(uid),
            outcome: Outcome::Passed,
            skipped: None,
            pod: None,
        }
    }
}

/// What a webhook (or the extender) did with a request; [`Outcome::label`] is the `outcome`
/// metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Not a request it acts on (not a pod CREATE of a managed pod, not a pod with hooks).
    Passed,
    /// `/mutate-pods`: the pod's object cannot be read; admitted unchanged, with a warning.
    Invalid,
    /// Pinned to its recorded node.
    Pinned,
    /// Managed, but its PersistentPodState has no record for it yet.
    Unrecorded,
    /// Managed, but the recorded pin was not applied (the pod's own constraints exclude it).
    Skipped,
    /// `/validate-pods`: a pod with hooks whose deletion passes.
    Allowed,
    /// `/validate-pods`: a deletion its PreDelete hook holds (answered 429).
    Held,
    /// `/validate-pods`: held by its hook, let through by an escape hatch.
    Escaped,
    /// `/mutate-persistentpodstates`: labelled pending until its hooks are in the plan.
    Labelled,
}

impl Outcome {
    /// The `outcome` metric label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Invalid => "invalid",
            Outcome::Pinned => "pinned",
            Outcome::Unrecorded => "unrecorded",
            Outcome::Skipped => "skipped",
            Outcome::Allowed => "allowed",
            Outcome::Held => "held",
            Outcome::Escaped => "escaped",
            Outcome::Labelled => "labelled",
        }
    }
}

/// The value of annotation `key` of `pod`.
pub(crate) fn annotation<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}
