//! The store's clock: when holdings started and when they end, in unix seconds that do not jump
//! when the wall clock does.
//!
//! Holdings end at absolute times (`until`). Read straight off the wall clock, a forward step
//! (a bad NTP server, an operator's typo, a VM resumed with a stale clock corrected later) would
//! free every held address at once, and those pods would come back with new addresses. So the
//! store keeps a [`ClockMark`] with each commit: the time it used and the kernel's boot clock
//! (`CLOCK_BOOTTIME`, which counts suspend and never steps) at that moment. While the node stays
//! up, the next command's time is the mark plus the boot clock's elapsed time, whatever the wall
//! clock says. Across a reboot nothing measures the time the node was down, so the wall clock is
//! taken again, but never earlier than the mark.

use serde::{Deserialize, Serialize};

/// What a command knows about the time when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The wall clock, unix seconds.
    pub wall: u64,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`) and `CLOCK_BOOTTIME` in seconds,
    /// when available.
    pub boot: Option<(String, u64)>,
}

impl Reading {
    /// A reading of the wall clock alone (tests, platforms without a boot clock): the store's
    /// clock then follows the wall clock.
    pub fn wall(wall: u64) -> Self {
        Reading { wall, boot: None }
    }
}

/// The store's clock as of a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClockMark {
    /// The store's time, unix seconds.
    pub now: u64,
    /// The boot it was taken in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// `CLOCK_BOOTTIME` seconds when it was taken.
    #[serde(default)]
    pub since_boot: u64,
}

/// How far the wall clock may run ahead of the store's clock before a command says so.
pub const JUMP_WARNING_SECS: u64 = 300;

/// The store's time for a command starting with `reading`, given the store's last `mark`, and
/// the mark to commit with it.
pub fn advance(mark: Option<&ClockMark>, reading: &Reading) -> ClockMark {
    let (boot_id, since_boot) = match &reading.boot {
        Some((id, secs)) => (Some(id.clone()), *secs),
        None => (None, 0),
    };
    let now = match (mark, &reading.boot) {
        // Same boot: only the boot clock's elapsed time counts.
        (Some(m), Some((id, secs)))
            if m.boot_id.as_deref() == Some(id) && *secs >= m.since_boot =>
        {
            m.now.saturating_add(secs - m.since_boot)
        }
        // Another boot: the wall clock, but never back in time.
        (Some(m), Some(_)) => reading.wall.max(m.now),
        // No boot clock: the wall clock, as it is.
        _ => reading.wall,
    };
    ClockMark {
        now,
        boot_id,
        since_boot,
    }
}

/// Whether `reading` is the first the store sees of its boot, so the mark [`advance`] returns
/// must be stored: within one boot every later time follows from it and the boot clock.
pub fn starts_a_boot(mark: Option<&ClockMark>, reading: &Reading) -> bool {
    match (mark, &reading.boot) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(m), Some((id, secs))) => m.boot_id.as_deref() != Some(id) || *secs < m.since_boot,
    }
}

/// How far the wall clock is ahead of the store's time `now` (from [`advance`]), when that is
/// worth a warning: the wall clock jumped forward since the store last saw it.
pub fn wall_ahead(now: u64, reading: &Reading) -> Option<u64> {
    reading
        .wall
        .checked_sub(now)
        .filter(|ahead| *ahead > JUMP_WARNING_SECS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(wall: u64, boot: &str, secs: u64) -> Reading {
        Reading {
            wall,
            boot: Some((boot.to_string(), secs)),
        }
    }

    #[test]
    fn a_forward_jump_of_the_wall_clock_does_not_advance_the_store() {
        let first = advance(None, &reading(1_000, "b1", 50));
        assert_eq!(first.now, 1_000);
        // 10 s later by the boot clock, but the wall clock jumped a year ahead.
        let next = advance(Some(&first), &reading(1_000 + 365 * 86_400, "b1", 60));
        assert_eq!(next.now, 1_010);
        assert_eq!(
            wall_ahead(next.now, &reading(1_000 + 365 * 86_400, "b1", 60)),
            Some(365 * 86_400 - 10)
        );
        assert_eq!(wall_ahead(next.now, &reading(1_100, "b1", 60)), None);
        // A backward step does not take it back either.
        let back = advance(Some(&next), &reading(500, "b1", 70));
        assert_eq!(back.now, 1_020);
    }

    #[test]
    fn after_a_reboot_the_wall_clock_is_taken_but_never_backwards() {
        let before = advance(None, &reading(1_000, "b1", 50));
        assert_eq!(advance(Some(&before), &reading(9_000, "b2", 5)).now, 9_000);
        assert_eq!(advance(Some(&before), &reading(900, "b2", 5)).now, 1_000);
        // A boot clock that went backwards is another boot, whatever the id says.
        assert_eq!(advance(Some(&before), &reading(2_000, "b1", 10)).now, 2_000);
    }

    #[test]
    fn a_mark_is_stored_once_per_boot() {
        let first = advance(None, &reading(1_000, "b1", 50));
        assert!(starts_a_boot(None, &reading(1_000, "b1", 50)));
        assert!(!starts_a_boot(Some(&first), &reading(1_900, "b1", 950)));
        assert!(starts_a_boot(Some(&first), &reading(1_900, "b2", 5)));
        assert!(starts_a_boot(Some(&first), &reading(1_900, "b1", 10)));
        assert!(!starts_a_boot(None, &Reading::wall(7)));
    }

    #[test]
    fn without_a_boot_clock_the_wall_clock_rules() {
        let m = advance(None, &Reading::wall(1_000));
        assert_eq!(advance(Some(&m), &Reading::wall(500)).now, 500);
        assert_eq!(advance(Some(&m), &Reading::wall(5_000)).now, 5_000);
        assert_eq!(advance(None, &Reading::wall(7)).now, 7);
    }
}
