//! Fault injection: make the next N requests matching a verb and resource fail with a chosen
//! status, so tests can prove a client retries, backs off and relists.

use std::sync::Mutex;

use serde::Deserialize;

use crate::status::ApiError;

/// One armed failure.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fault {
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`), or `None` for any.
    #[serde(default)]
    pub verb: Option<String>,
    /// Plural resource, optionally with a subresource (`pods/status`), or `None` for any.
    #[serde(default)]
    pub resource: Option<String>,
    /// How many matching requests fail.
    pub count: usize,
    /// HTTP status: 409, 429, 500, 503, …
    pub code: u16,
    /// `Retry-After` seconds (429 and 5xx).
    #[serde(default)]
    pub retry_after_seconds: Option<u64>,
}

impl Fault {
    /// A fault for `count` requests of `verb` on `resource`.
    pub fn new(verb: &str, resource: &str, count: usize, code: u16) -> Self {
        Self {
            verb: Some(verb.to_owned()),
            resource: Some(resource.to_owned()),
            count,
            code,
            retry_after_seconds: None,
        }
    }

    /// With a `Retry-After`.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_seconds = Some(seconds);
        self
    }

    fn matches(&self, verb: &str, resource: &str) -> bool {
        self.count > 0
            && self.verb.as_deref().is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
    }

    fn error(&self, verb: &str, resource: &str) -> ApiError {
        let (reason, text) = match self.code {
            409 => (
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again",
            ),
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted",
            ),
            404 => (
                "NotFound",
                "the server could not find the requested resource",
            ),
            _ => (
                "InternalError",
                "an error on the server has prevented the request from succeeding",
            ),
        };
        let mut err = ApiError::new(
            self.code,
            reason,
            format!("{text} (injected fault on {verb} {resource})"),
        );
        err.retry_after = self.retry_after_seconds;
        err
    }
}

/// The armed faults.
#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<Vec<Fault>>,
}

impl Faults {
    /// Arms a fault.
    pub fn inject(&self, fault: Fault) {
        self.lock().push(fault);
    }

    /// Disarms everything.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// How many failures are still armed.
    pub fn pending(&self) -> usize {
        self.lock().iter().map(|f| f.count).sum()
    }

    /// If a fault matches this request, consumes one count of it and returns its error.
    pub fn take(&self, verb: &str, resource: &str) -> Option<ApiError> {
        let mut armed = self.lock();
        let fault = armed.iter_mut().find(|f| f.matches(verb, resource))?;
        fault.count -= 1;
        let err = fault.error(verb, resource);
        armed.retain(|f| f.count > 0);
        Some(err)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_count_times_for_matching_requests_only() {
        let faults = Faults::default();
        faults.inject(Fault::new("patch", "pods/status", 2, 429).retry_after(1));
        assert!(faults.take("patch", "pods").is_none());
        assert!(faults.take("get", "pods/status").is_none());
        let err = faults.take("patch", "pods/status").unwrap();
        assert_eq!((err.code, err.retry_after), (429, Some(1)));
        assert!(faults.take("patch", "pods/status").is_some());
        assert!(faults.take("patch", "pods/status").is_none());
    }
}
