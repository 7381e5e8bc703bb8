//! How long a deleted pod's addresses stay held for it: the grammar of
//! `ipkeep.dev/ip-retention`, `spec.ipRetention`, the StatefulSet annotation and `ipam.retention`,
//! and of OpenKruise's whole-minutes `io.kubernetes.cri/reserved-ip-duration`.
//!
//! ```text
//! retention := "0" | "forever" | duration       (surrounding whitespace ignored)
//! ```
//! with `duration` of [`crate::duration`]. This is the CRD's pattern for `spec.ipRetention`, but
//! for the whitespace (pod annotations have no schema) and the 100-year limit; `crates/api`'s
//! tests feed one table of values to both. A duration of zero is off, anything
//! shorter than a second is held for one second, and anything longer than [`MAX_SECONDS`] (100
//! years) is refused: write `forever` instead. [`Retention`]'s `Display` is the canonical form and
//! parses back to the same value.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::duration::{self, Refused};

/// The longest finite retention: 100 years of 365 days.
pub const MAX_SECONDS: u64 = 100 * 365 * 86_400;

/// How long addresses are held after the pod's DEL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Retention {
    /// Released at DEL, like host-local.
    #[default]
    Off,
    /// Held for this many seconds after DEL (1 ..= [`MAX_SECONDS`]).
    Seconds(u64),
    /// Held until an admin, or Kubernetes' word through the node agent, releases them.
    Forever,
}

/// A retention value that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {origin} value {value:?}: {reason}")]
pub struct RetentionError {
    /// Which key carried the value.
    pub origin: String,
    /// The value as given (at most 64 characters of it).
    pub value: String,
    /// What is expected instead.
    pub reason: &'static str,
}

const HINT: &str = "expected a duration such as 30m, 24h or 1h30m (units ns, us, ms, s, m, h, d), \"forever\", or 0 to turn retention off";
const TOO_LONG: &str = "longer than 100 years; write \"forever\" instead";

impl Retention {
    /// Parses the retention grammar; `origin` names the key in errors.
    pub fn parse(origin: &str, text: &str) -> Result<Retention, RetentionError> {
        let err = |reason| RetentionError {
            origin: origin.to_string(),
            value: text.chars().take(64).collect(),
            reason,
        };
        let t = text.trim();
        match t {
            "0" => return Ok(Retention::Off),
            "forever" => return Ok(Retention::Forever),
            "" => return Err(err(HINT)),
            _ => {}
        }
        let max_nanos = u128::from(MAX_SECONDS) * 1_000_000_000;
        let nanos = duration::nanos(t, max_nanos).map_err(|refused| match refused {
            Refused::Syntax => err(HINT),
            Refused::TooLong => err(TOO_LONG),
        })?;
        // Sub-second retention rounds up: a pod that asked to be held must be held a little.
        let secs = nanos.div_ceil(1_000_000_000);
        Ok(match u64::try_from(secs) {
            Ok(0) => Retention::Off,
            Ok(s) => Retention::Seconds(s),
            Err(_) => return Err(err(TOO_LONG)),
        })
    }

    /// Parses OpenKruise's whole minutes (`0` for off).
    pub fn parse_kruise_minutes(origin: &str, text: &str) -> Result<Retention, RetentionError> {
        let err = |reason| RetentionError {
            origin: origin.to_string(),
            value: text.chars().take(64).collect(),
            reason,
        };
        let t = text.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("expected a whole number of minutes, 0 for off"));
        }
        let minutes: u64 = t.parse().map_err(|_| err(TOO_LONG))?;
        match minutes.checked_mul(60) {
            Some(0) => Ok(Retention::Off),
            Some(s) if s <= MAX_SECONDS => Ok(Retention::Seconds(s)),
            _ => Err(err(TOO_LONG)),
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

    /// The shorter of two retentions (`Forever` is the longest, `Off` the shortest).
    pub fn at_most(self, limit: Retention) -> Retention {
        match (self, limit) {
            (Retention::Off, _) | (_, Retention::Off) => Retention::Off,
            (r, Retention::Forever) | (Retention::Forever, r) => r,
            (Retention::Seconds(a), Retention::Seconds(b)) => Retention::Seconds(a.min(b)),
        }
    }
}

/// The canonical form: `0`, `forever`, or days, hours, minutes and seconds without spaces
/// (`1d2h`, `1h30m`, `45s`).
impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Retention::Off => f.write_str("0"),
            Retention::Forever => f.write_str("forever"),
            Retention::Seconds(mut s) => {
                for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
                    if s >= size {
                        write!(f, "{}{unit}", s / size)?;
                        s %= size;
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar() {
        let ok = [
            ("30m", Retention::Seconds(1800)),
            ("24h", Retention::Seconds(86400)),
            ("1h30m", Retention::Seconds(5400)),
            (" 90s ", Retention::Seconds(90)),
            ("2d", Retention::Seconds(172_800)),
            ("forever", Retention::Forever),
            ("0", Retention::Off),
            ("0s", Retention::Off),
            ("0h0m", Retention::Off),
            ("500ms", Retention::Seconds(1)),
            ("1ns", Retention::Seconds(1)),
            ("36500d", Retention::Seconds(MAX_SECONDS)),
        ];
        for (text, want) in ok {
            assert_eq!(Retention::parse("test", text), Ok(want), "{text}");
        }
        let bad = [
            "",
            "abc",
            "10",
            "00",
            "-5m",
            "5 parsecs",
            "1h 30m",
            "Forever",
            "2days",
            "1y",
            "h",
            "36500d1s",
            "10000y",
            "99999999999999999999999999999999999999999999d",
            "18446744073709551615s1ns",
        ];
        for text in bad {
            let e = Retention::parse("ipam.retention", text).expect_err(text);
            assert!(e.to_string().contains("ipam.retention"), "{e}");
        }
        let e = Retention::parse("x", "36501d").expect_err("too long");
        assert!(e.reason.contains("forever"), "{e}");
    }

    #[test]
    fn display_is_canonical_and_parses_back() {
        for s in [1, 59, 60, 90, 3600, 5400, 86_400, 90_061, MAX_SECONDS] {
            let r = Retention::Seconds(s);
            let text = r.to_string();
            assert!(!text.contains(' '), "{text}");
            assert_eq!(Retention::parse("t", &text), Ok(r), "{text}");
        }
        assert_eq!(Retention::Seconds(5400).to_string(), "1h30m");
        assert_eq!(Retention::Off.to_string(), "0");
        assert_eq!(Retention::Forever.to_string(), "forever");
    }

    #[test]
    fn kruise_minutes() {
        let k = |t| Retention::parse_kruise_minutes("kruise", t);
        assert_eq!(k("5"), Ok(Retention::Seconds(300)));
        assert_eq!(k("0"), Ok(Retention::Off));
        assert!(k("5m").is_err());
        assert!(k("-1").is_err());
        assert!(k("99999999999999999999").is_err());
        assert!(k("52560001").is_err(), "over 100 years");
    }

    #[test]
    fn holding_ends_and_limits() {
        assert_eq!(Retention::Seconds(10).hold_until(100), Some(110));
        assert_eq!(Retention::Forever.hold_until(100), None);
        assert_eq!(
            Retention::Seconds(MAX_SECONDS).hold_until(u64::MAX),
            Some(u64::MAX)
        );
        let (s5, s9) = (Retention::Seconds(5), Retention::Seconds(9));
        assert_eq!(Retention::Forever.at_most(s5), s5);
        assert_eq!(s9.at_most(s5), s5);
        assert_eq!(s5.at_most(Retention::Forever), s5);
        assert_eq!(s5.at_most(Retention::Off), Retention::Off);
        assert_eq!(
            Retention::Forever.at_most(Retention::Forever),
            Retention::Forever
        );
    }
}
