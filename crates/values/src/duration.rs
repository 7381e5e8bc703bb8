//! Durations as the CRD's patterns write them: `nodeLossPolicy.after` (`5m`, `1h30m`), and the
//! terms of [`crate::retention`].
//!
//! ```text
//! duration := term+                             (no spaces, nothing around it)
//! term     := digits ("ns" | "us" | "ms" | "s" | "m" | "h" | "d")
//! ```
//! This is exactly the CRD's pattern `^([0-9]+(ns|us|ms|s|m|h|d))+$`, except that a value past
//! [`u64::MAX`] seconds is refused (the pattern cannot count); `crates/api`'s tests feed one table
//! of values to both.

use std::time::Duration;

/// Why a duration cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not `term+`.
    Syntax,
    /// Longer than the caller's limit.
    TooLong,
}

/// A duration that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {}", match .refused {
    Refused::Syntax => "expected digits and a unit, repeated, without spaces, such as 5m or 1h30m (units ns, us, ms, s, m, h, d)",
    Refused::TooLong => "too long",
})]
pub struct DurationError {
    /// The value as given (at most 64 characters of it).
    pub value: String,
    /// Why.
    pub refused: Refused,
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    })
}

/// The sum of `text`'s terms in nanoseconds, refused past `max`.
pub fn nanos(text: &str, max: u128) -> Result<u128, Refused> {
    if text.is_empty() {
        return Err(Refused::Syntax);
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let units = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || units == 0 {
            return Err(Refused::Syntax);
        }
        let factor = unit_nanos(&rest[digits..digits + units]).ok_or(Refused::Syntax)?;
        // More digits than any valid value has: too long, whatever they say.
        let number: u128 = rest[..digits].parse().map_err(|_| Refused::TooLong)?;
        total = number
            .checked_mul(factor)
            .and_then(|n| n.checked_add(total))
            .filter(|n| *n <= max)
            .ok_or(Refused::TooLong)?;
        rest = &rest[digits + units..];
    }
    Ok(total)
}

/// Parses a duration (`nodeLossPolicy.after`).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    const NANOS: u128 = 1_000_000_000;
    let max = u128::from(u64::MAX) * NANOS + (NANOS - 1);
    let total = nanos(text, max).map_err(|refused| DurationError {
        value: text.chars().take(64).collect(),
        refused,
    })?;
    // Both fit: `total` is at most `max`.
    let secs = u64::try_from(total / NANOS).unwrap_or(u64::MAX);
    let subsec = u32::try_from(total % NANOS).unwrap_or_default();
    Ok(Duration::new(secs, subsec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_terms() {
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1s500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(
            parse("18446744073709551615s999999999ns"),
            Ok(Duration::MAX),
            "the longest Duration"
        );
        let e = parse("18446744073709551616s").expect_err("past u64 seconds");
        assert_eq!(e.refused, Refused::TooLong);
        let e = parse("1w").expect_err("no weeks");
        assert!(e.to_string().contains("\"1w\""), "{e}");
    }
}
