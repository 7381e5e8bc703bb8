//! API errors and the one place they become `metav1.Status` bodies.
//!
//! Every failure a client can see is an [`ApiError`]; its `code` and `reason` are the ones
//! kube-apiserver uses for the same situation, because clients branch on them (client-go's
//! `IsConflict`, kube-rs' `ErrorResponse.code`, kubectl's "NotFound" handling).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A failed API request, as the client will see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code, also written as `code` in the body.
    pub code: u16,
    /// `metav1.StatusReason`, e.g. `NotFound`, `Conflict`.
    pub reason: &'static str,
    /// Human-readable message, worded like kube-apiserver's.
    pub message: String,
    /// `details` (name, group, kind, causes, retryAfterSeconds), if any.
    pub details: Option<Value>,
    /// Seconds for the `Retry-After` header (429, and 500 with retry).
    pub retry_after: Option<u64>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn details(group: &str, kind: &str, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": kind });
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    /// An error with no details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 404 for a named object of a resource.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self {
            details: Some(details(group, plural, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", qualified(group, plural)),
            )
        }
    }

    /// 404 for a path that names no resource at all.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 on create of an existing name.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(group, plural)),
            )
        }
    }

    /// 409 on a write with a stale `resourceVersion`.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    qualified(group, plural)
                ),
            )
        }
    }

    /// The stale-`resourceVersion` conflict, worded as kube-apiserver words it.
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per invalid field.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[(String, String)]) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let mut d = details(group, kind, name);
        d["causes"] = causes
            .iter()
            .map(|(field, message)| {
                json!({"reason": "FieldValueInvalid", "message": message, "field": field})
            })
            .collect();
        // kube-apiserver says `Kind "name"` for core kinds and `Kind.group "name"` otherwise.
        let kind = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        };
        Self {
            details: Some(d),
            ..Self::new(
                422,
                "Invalid",
                format!("{kind} \"{name}\" is invalid: {}", text.join(", ")),
            )
        }
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 for a verb the resource does not support.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410 when a watch or continue token refers to compacted history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 415 for a patch or body type the server does not accept.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 403, e.g. creating in a terminating namespace.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = self.details.clone();
        if let Some(seconds) = self.retry_after {
            let d = details.get_or_insert_with(|| json!({}));
            d["retryAfterSeconds"] = json!(seconds);
        }
        if let Some(d) = details {
            status["details"] = d;
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (code, axum::Json(self.to_status())).into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

/// A `Status` with `status: Success`, as returned by some deletes.
pub fn success(group: &str, kind: &str, name: &str, uid: &str) -> Value {
    let mut d = details(group, kind, name);
    d["uid"] = json!(uid);
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": d,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_code_reason_and_details() {
        let s = ApiError::not_found("apps", "statefulsets", "db").to_status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "statefulsets.apps \"db\" not found");
        assert_eq!(s["details"]["group"], "apps");
        let s = ApiError::stale("", "pods", "p").to_status();
        assert_eq!(s["reason"], "Conflict");
        assert!(
            s["message"]
                .as_str()
                .unwrap()
                .starts_with("Operation cannot be fulfilled on pods \"p\"")
        );
        let e = ApiError::invalid(
            "ipkeep.dev",
            "PersistentPodState",
            "x",
            &[("spec.a".into(), "Required value".into())],
        );
        assert_eq!(
            e.message,
            "PersistentPodState.ipkeep.dev \"x\" is invalid: spec.a: Required value"
        );
        let mut e = ApiError::new(429, "TooManyRequests", "slow down");
        e.retry_after = Some(3);
        assert_eq!(e.to_status()["details"]["retryAfterSeconds"], 3);
    }
}
