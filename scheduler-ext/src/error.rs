//! Request errors, and the one place they become wire formats: a `metav1.Status` with an HTTP
//! error code for the webhook (the API server then applies the webhook's `failurePolicy`), an
//! `Error` field for the extender's `filter` (the scheduler shows it), and an HTTP error for
//! `prioritize` (whose errors the scheduler ignores).
//!
//! What a client sent ends up in these messages (a field name, a kind), and they are logged:
//! [`RequestError::malformed`] escapes control characters, so a request cannot forge log lines.

use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The body is over the limit.
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The client did not send the whole body in time.
    #[error("request body not received within {0:?}")]
    SlowBody(Duration),
    /// The connection failed while reading the body.
    #[error("failed to read the request body: {0}")]
    Body(String),
    /// The body is not what the endpoint takes.
    #[error("request is not a valid {expected}: {reason}")]
    Malformed {
        /// What the endpoint takes.
        expected: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The caches have not been filled yet, and the pod may be ours.
    #[error(
        "ipkeep-scheduler-ext is starting: its PersistentPodState and node caches are not synced yet; retry shortly"
    )]
    NotReady,
    /// The requests in flight hold all of the memory budget this request may use (a large one
    /// may not use the reserve), and did not give back enough of it in time.
    #[error(
        "ipkeep-scheduler-ext is busy: the requests in flight hold all of its memory budget of {budget} bytes (--max-in-flight-bytes) that this request may use; retry shortly"
    )]
    Busy {
        /// The budget.
        budget: usize,
    },
    /// The requests in flight from the same client address hold its whole share of the memory
    /// budget, and did not give back enough of it in time.
    #[error(
        "ipkeep-scheduler-ext is busy: the requests in flight from this client address hold its whole share of the memory budget, {share} bytes (--max-in-flight-bytes-per-source); retry shortly"
    )]
    SourceBusy {
        /// The share.
        share: usize,
    },
}

impl RequestError {
    /// A body that is not what the endpoint takes, with the reason's control characters
    /// escaped.
    pub fn malformed(expected: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::Malformed {
            expected,
            reason: escape_controls(&reason.to_string()),
        }
    }

    /// The HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::SlowBody(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Body(_) | Self::Malformed { .. } => StatusCode::BAD_REQUEST,
            Self::NotReady | Self::Busy { .. } | Self::SourceBusy { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The `outcome` metric label.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::NotReady => "not-ready",
            Self::Busy { .. } | Self::SourceBusy { .. } => "busy",
            _ => "invalid",
        }
    }

    /// The webhook's answer: an HTTP error with a `metav1.Status` body saying what is wrong.
    pub fn into_webhook_response(self) -> Response {
        let code = self.status();
        let body = json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": self.to_string(),
            "reason": code.canonical_reason().unwrap_or("Error").replace(' ', ""),
            "code": code.as_u16(),
        });
        (code, Json(body)).into_response()
    }

    /// The extender's `filter` answer: HTTP 200 with the message in `Error` (the scheduler
    /// reports it as the scheduling failure); body-level failures keep their HTTP status.
    pub fn into_filter_response(self) -> Response {
        let code = match self {
            Self::Malformed { .. }
            | Self::NotReady
            | Self::Busy { .. }
            | Self::SourceBusy { .. } => StatusCode::OK,
            _ => self.status(),
        };
        let body = json!({
            "Nodes": null, "NodeNames": null, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
            "Error": self.to_string(),
        });
        (code, Json(body)).into_response()
    }

    /// The extender's `prioritize` answer: an HTTP error with the message as text.
    pub fn into_prioritize_response(self) -> Response {
        (self.status(), self.to_string()).into_response()
    }
}

/// `text` with every control character (newlines included) written as an escape (`\n`,
/// `\u{1b}`), so it stays on one log line.
pub fn escape_controls(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_reasons_stay_on_one_line() {
        let e = RequestError::malformed("x", "unknown field `a\nINFO forged\r\u{1b}[31m`");
        let text = e.to_string();
        assert!(!text.chars().any(char::is_control), "{text}");
        assert!(text.contains("`a\\nINFO forged\\r\\u{1b}[31m`"), "{text}");
    }
}
