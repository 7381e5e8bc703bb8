//! Reconcile errors. Each has a short `kind` for the `errors` metric.

/// A reconcile that failed; the controller retries it with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API request failed.
    #[error("failed to {action} {what}: {source}")]
    Api {
        /// What the request did (`apply status of`, `delete`, ...).
        action: &'static str,
        /// The object, as `namespace/name`.
        what: String,
        /// The client error.
        source: kube::Error,
    },
    /// A cache's writer went away (the controller is shutting down).
    #[error("the {0} cache is gone (shutting down)")]
    CacheGone(&'static str),
    /// An object has no name or namespace (never happens with a real API server).
    #[error("object has no {0}")]
    MissingMeta(&'static str),
}

impl Error {
    /// An API request that failed: `action` (`delete`, `apply the status of`, ...) on `what`
    /// (the object, as `namespace/name` or with its kind).
    pub fn api(action: &'static str, what: String, source: kube::Error) -> Self {
        Error::Api {
            action,
            what,
            source,
        }
    }

    /// Every [`Error::kind`] (the metric's series are created with these at start).
    pub const KINDS: [&'static str; 8] = [
        "conflict",
        "throttled",
        "not_found",
        "server",
        "api",
        "transport",
        "cache_gone",
        "missing_meta",
    ];

    /// A short label for metrics: `conflict`, `throttled`, `server`, `not_found`, `api`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Api {
                source: kube::Error::Api(status),
                ..
            } => match status.code {
                409 => "conflict",
                429 => "throttled",
                404 => "not_found",
                c if c >= 500 => "server",
                _ => "api",
            },
            Error::Api { .. } => "transport",
            Error::CacheGone(_) => "cache_gone",
            Error::MissingMeta(_) => "missing_meta",
        }
    }
}
