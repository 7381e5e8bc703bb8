//! CNI errors and their one wire form: `{"cniVersion"?, "code", "msg", "details"?}` on stdout,
//! indented like the reference plugins, with a non-zero exit.

use std::fmt;

use ipkeep_ipam::{AllocError, CheckError, StoreError};

/// Error codes from the CNI specification ("Error" section).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure (e.g. reading stdin).
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODE_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// The plugin is not available (STATUS).
    pub const NOT_AVAILABLE: u32 = 50;
    /// Generic failure (what the reference plugins use for everything of their own).
    pub const GENERIC: u32 = 999;
}

/// A CNI error: a spec code, a message that says what to fix, optional details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    /// Spec error code.
    pub code: u32,
    /// Human message.
    pub msg: String,
    /// More context.
    pub details: Option<String>,
}

impl CniError {
    /// An error with no details.
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: None,
        }
    }

    /// Adds details.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }

    /// The wire form; `cni_version` is included when the configuration named a supported one.
    pub fn to_json(&self, cni_version: Option<&str>) -> String {
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            cni_version: Option<&'a str>,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            details: Option<&'a str>,
        }
        crate::json::to_pretty_json(&Wire {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: self.details.as_deref(),
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "code {}: {}", self.code, self.msg)?;
        if let Some(d) = &self.details {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

impl From<StoreError> for CniError {
    fn from(e: StoreError) -> Self {
        let code = if e.is_transient() {
            code::TRY_AGAIN_LATER
        } else {
            code::GENERIC
        };
        CniError::new(code, e.to_string())
    }
}

impl From<AllocError> for CniError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::Store(s) => s.into(),
            e @ (AllocError::StillInUse { .. } | AllocError::NeedsNetns(_)) => {
                CniError::new(code::TRY_AGAIN_LATER, e.to_string())
            }
            other => CniError::new(code::GENERIC, other.to_string()),
        }
    }
}

impl From<CheckError> for CniError {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Store(s) => s.into(),
            other => CniError::new(code::GENERIC, other.to_string()),
        }
    }
}
