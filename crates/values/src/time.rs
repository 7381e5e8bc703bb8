//! Unix timestamps for people. Every `u64` prints: years past 9999 (a hostile retention) are
//! written as plain unix seconds instead of panicking in an RFC 3339 formatter.

use std::time::{Duration, UNIX_EPOCH};

/// 10000-01-01T00:00:00Z, the first instant RFC 3339 cannot write.
const RFC3339_END: u64 = 253_402_300_800;

/// `2026-11-23T10:00:00Z`, or `unix time N` for instants RFC 3339 cannot write.
pub fn rfc3339(unix_secs: u64) -> String {
    match UNIX_EPOCH.checked_add(Duration::from_secs(unix_secs)) {
        Some(t) if unix_secs < RFC3339_END => humantime::format_rfc3339_seconds(t).to_string(),
        _ => format!("unix time {unix_secs}"),
    }
}

/// A duration for people (`1h 30m`).
pub fn duration(secs: u64) -> String {
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_instant_prints() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(RFC3339_END - 1), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339(RFC3339_END), format!("unix time {RFC3339_END}"));
        assert_eq!(rfc3339(u64::MAX), format!("unix time {}", u64::MAX));
        assert_eq!(duration(5400), "1h 30m");
        assert!(!duration(u64::MAX).is_empty());
    }
}
