//! CNI specification versions: which ones ipkeep speaks and what each allows.

use std::fmt;

use crate::error::{CniError, code};

/// Versions accepted in `cniVersion`, oldest first (host-local's list plus 1.1.0).
pub const SUPPORTED: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// A supported `cniVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CniVersion(u8, u8, u8);

impl CniVersion {
    /// The newest version, used where no configuration names one.
    pub const LATEST: CniVersion = CniVersion(1, 1, 0);

    /// Parses one of [`SUPPORTED`].
    pub fn parse(text: &str) -> Option<CniVersion> {
        if !SUPPORTED.contains(&text) {
            return None;
        }
        let mut parts = text.split('.').map(|p| p.parse::<u8>().ok());
        Some(CniVersion(parts.next()??, parts.next()??, parts.next()??))
    }

    /// Results use `ip4`/`ip6` objects (0.1.0, 0.2.0).
    pub fn has_legacy_result(self) -> bool {
        self < CniVersion(0, 3, 0)
    }

    /// Results carry `"version": "4"|"6"` per IP (0.3.x, 0.4.0).
    pub fn has_ip_version_field(self) -> bool {
        !self.has_legacy_result() && self < CniVersion(1, 0, 0)
    }

    /// More than one address per family (0.3.0 and later).
    pub fn allows_multiple_per_family(self) -> bool {
        !self.has_legacy_result()
    }

    /// CHECK exists (0.4.0 and later).
    pub fn allows_check(self) -> bool {
        self >= CniVersion(0, 4, 0)
    }

    /// GC and STATUS exist (1.1.0 and later).
    pub fn allows_gc_and_status(self) -> bool {
        self >= CniVersion(1, 1, 0)
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// Reads `cniVersion` from a decoded configuration.
pub fn from_config(conf: &serde_json::Value) -> Result<CniVersion, CniError> {
    let supported = || {
        let quoted: Vec<String> = SUPPORTED.iter().map(|v| format!("{v:?}")).collect();
        format!("plugin supports [{}]", quoted.join(" "))
    };
    match conf.get("cniVersion") {
        None => Err(CniError::new(
            code::INVALID_CONFIG,
            "missing cniVersion: the network configuration must say which CNI version it uses",
        )
        .with_details(supported())),
        Some(serde_json::Value::String(text)) => CniVersion::parse(text).ok_or_else(|| {
            CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
                .with_details(format!("config is {text:?}, {}", supported()))
        }),
        Some(other) => Err(
            CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
                .with_details(format!("config is {other}, {}", supported())),
        ),
    }
}

/// The VERSION command's answer.
pub fn version_info() -> String {
    serde_json::json!({"cniVersion": CniVersion::LATEST.to_string(), "supportedVersions": SUPPORTED})
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_and_capabilities() {
        for v in SUPPORTED {
            assert_eq!(CniVersion::parse(v).expect(v).to_string(), *v);
        }
        assert_eq!(CniVersion::parse("1.2.0"), None);
        assert_eq!(CniVersion::parse("garbage"), None);
        let v = |s| CniVersion::parse(s).expect("supported");
        assert!(v("0.2.0").has_legacy_result() && !v("0.2.0").allows_check());
        assert!(v("0.3.1").has_ip_version_field() && !v("0.3.1").allows_check());
        assert!(v("0.4.0").allows_check() && !v("1.0.0").has_ip_version_field());
        assert!(v("1.1.0").allows_gc_and_status() && !v("1.0.0").allows_gc_and_status());
        let e = from_config(&serde_json::json!({"cniVersion": "1.2.0"})).expect_err("unsupported");
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.details.unwrap_or_default().contains("\"1.1.0\""));
        assert_eq!(
            from_config(&serde_json::json!({"cniVersion": 1}))
                .expect_err("number")
                .code,
            1
        );
    }
}
