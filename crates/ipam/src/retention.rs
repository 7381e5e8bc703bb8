//! How long a deleted pod's addresses stay held for it, and where that duration comes from.
//!
//! Precedence (first match wins): the pod annotation [`IP_RETENTION_ANNOTATION`], OpenKruise's
//! [`KRUISE_RESERVED_IP_ANNOTATION`] (integer minutes), then the network's `ipam.retention`.
//! Annotations arrive through `runtimeConfig["io.kubernetes.cri.pod-annotations"]`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// ipkeep's pod annotation: a duration (`30m`, `24h`, `1h30m`), `forever`, or `0` for off.
pub const IP_RETENTION_ANNOTATION: &str = "ipkeep.dev/ip-retention";
/// OpenKruise's pod annotation: whole minutes, `0` for off.
pub const KRUISE_RESERVED_IP_ANNOTATION: &str = "io.kubernetes.cri/reserved-ip-duration";

/// How long addresses are held after the pod's DEL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Retention {
    /// Released at DEL, like host-local.
    #[default]
    Off,
    /// Held for this many seconds after DEL.
    Seconds(u64),
    /// Held until an admin releases them.
    Forever,
}

/// Where a pod's retention came from (for logs and `ipkeep list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionSource {
    /// The `ipkeep.dev/ip-retention` annotation.
    Annotation,
    /// The `io.kubernetes.cri/reserved-ip-duration` annotation.
    KruiseAnnotation,
    /// The network's `ipam.retention` (or its default, off).
    NetworkDefault,
}

/// A retention value that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {origin} value {value:?}: {reason}")]
pub struct RetentionError {
    /// Which key carried the value.
    pub origin: String,
    /// The value as given.
    pub value: String,
    /// What is expected instead.
    pub reason: &'static str,
}

const DURATION_HINT: &str =
    "expected a duration such as 30m, 24h or 1h30m, \"forever\", or 0 to turn retention off";

impl Retention {
    /// Parses the duration syntax shared by the annotation and `ipam.retention`.
    pub fn parse(origin: &str, text: &str) -> Result<Retention, RetentionError> {
        let err = |reason| RetentionError {
            origin: origin.to_string(),
            value: text.to_string(),
            reason,
        };
        let trimmed = text.trim();
        if trimmed.eq_ignore_ascii_case("forever") {
            return Ok(Retention::Forever);
        }
        if trimmed.bytes().all(|b| b == b'0') && !trimmed.is_empty() {
            return Ok(Retention::Off);
        }
        if trimmed.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(
                "a bare number has no unit; write 30m, 24h, ... (0 alone means off)",
            ));
        }
        let duration = humantime::parse_duration(trimmed).map_err(|_| err(DURATION_HINT))?;
        Ok(Retention::from_duration(duration))
    }

    /// Parses OpenKruise's integer-minutes annotation.
    pub fn parse_kruise_minutes(text: &str) -> Result<Retention, RetentionError> {
        let minutes: u64 = text.trim().parse().map_err(|_| RetentionError {
            origin: KRUISE_RESERVED_IP_ANNOTATION.to_string(),
            value: text.to_string(),
            reason: "expected a whole number of minutes, 0 for off",
        })?;
        Ok(Retention::from_duration(Duration::from_secs(
            minutes.saturating_mul(60),
        )))
    }

    fn from_duration(duration: Duration) -> Retention {
        // Sub-second retention rounds up: a pod that asked to be held must be held a little.
        let secs = duration
            .as_secs()
            .saturating_add(u64::from(duration.subsec_nanos() > 0));
        if secs == 0 {
            Retention::Off
        } else {
            Retention::Seconds(secs)
        }
    }

    /// Whether addresses are held at all.
    pub fn is_on(self) -> bool {
        self != Retention::Off
    }

    /// When a holding that starts at `now` (unix seconds) ends; `None` means never.
    pub fn hold_until(self, now: u64) -> Option<u64> {
        match self {
            Retention::Off => Some(now),
            Retention::Seconds(s) => Some(now.saturating_add(s)),
            Retention::Forever => None,
        }
    }

    /// Resolves a pod's retention from its annotations (if the runtime passed them) and the
    /// network default.
    pub fn resolve(
        annotations: Option<&BTreeMap<String, String>>,
        network_default: Retention,
    ) -> Result<(Retention, RetentionSource), RetentionError> {
        if let Some(annotations) = annotations {
            if let Some(v) = annotations.get(IP_RETENTION_ANNOTATION) {
                let r = Retention::parse(&format!("annotation {IP_RETENTION_ANNOTATION}"), v)?;
                return Ok((r, RetentionSource::Annotation));
            }
            if let Some(v) = annotations.get(KRUISE_RESERVED_IP_ANNOTATION) {
                return Ok((
                    Retention::parse_kruise_minutes(v)?,
                    RetentionSource::KruiseAnnotation,
                ));
            }
        }
        Ok((network_default, RetentionSource::NetworkDefault))
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retention::Off => f.write_str("0"),
            Retention::Seconds(s) => {
                write!(f, "{}", humantime::format_duration(Duration::from_secs(*s)))
            }
            Retention::Forever => f.write_str("forever"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations_forever_and_zero() {
        let ok = [
            ("30m", Retention::Seconds(1800)),
            ("24h", Retention::Seconds(86400)),
            ("1h30m", Retention::Seconds(5400)),
            (" 90s ", Retention::Seconds(90)),
            ("2days", Retention::Seconds(172_800)),
            ("forever", Retention::Forever),
            ("Forever", Retention::Forever),
            ("0", Retention::Off),
            ("0s", Retention::Off),
            ("500ms", Retention::Seconds(1)),
            // found by the fuzzer: the largest duration humantime accepts must not overflow
            ("18446744073709551615s 1ns", Retention::Seconds(u64::MAX)),
        ];
        for (text, want) in ok {
            assert_eq!(Retention::parse("test", text), Ok(want), "{text}");
        }
        for bad in ["", "abc", "10", "-5m", "5 parsecs"] {
            let err = Retention::parse("ipam.retention", bad).expect_err(bad);
            assert!(err.to_string().contains("ipam.retention"), "{err}");
        }
    }

    #[test]
    fn kruise_minutes() {
        assert_eq!(
            Retention::parse_kruise_minutes("5"),
            Ok(Retention::Seconds(300))
        );
        assert_eq!(Retention::parse_kruise_minutes("0"), Ok(Retention::Off));
        assert!(Retention::parse_kruise_minutes("5m").is_err());
    }

    #[test]
    fn precedence_is_annotation_then_kruise_then_network() {
        let mut ann = BTreeMap::new();
        let default = Retention::Seconds(60);
        assert_eq!(
            Retention::resolve(None, default),
            Ok((default, RetentionSource::NetworkDefault))
        );
        assert_eq!(
            Retention::resolve(Some(&ann), default),
            Ok((default, RetentionSource::NetworkDefault))
        );
        ann.insert(KRUISE_RESERVED_IP_ANNOTATION.to_string(), "10".to_string());
        assert_eq!(
            Retention::resolve(Some(&ann), default),
            Ok((Retention::Seconds(600), RetentionSource::KruiseAnnotation))
        );
        ann.insert(IP_RETENTION_ANNOTATION.to_string(), "0".to_string());
        assert_eq!(
            Retention::resolve(Some(&ann), default),
            Ok((Retention::Off, RetentionSource::Annotation))
        );
        ann.insert(IP_RETENTION_ANNOTATION.to_string(), "soon".to_string());
        assert!(Retention::resolve(Some(&ann), default).is_err());
    }

    #[test]
    fn hold_until() {
        assert_eq!(Retention::Seconds(10).hold_until(100), Some(110));
        assert_eq!(Retention::Forever.hold_until(100), None);
        assert_eq!(Retention::Seconds(u64::MAX).hold_until(100), Some(u64::MAX));
        assert_eq!(Retention::Seconds(90).to_string(), "1m 30s");
    }
}
