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
//!
//! Right after a reboot the wall clock comes from the hardware clock (RTC), which may run
//! ahead until NTP corrects it. Taken as it is, a clock ten days fast would free every holding
//! of less than ten days at the first command. So a wall clock more than
//! [`UNCONFIRMED_GAP_SECS`] past the mark is *doubted* until the kernel says it is synchronised
//! (an NTP daemon cleared `STA_UNSYNC`) or the node has been up [`SYNC_PATIENCE_SECS`]; while
//! it is, the store's time is only what it can prove (the mark plus the time since this boot,
//! so nothing ends that had not surely ended) and no mark is stored, so the next command looks
//! again.

use serde::{Deserialize, Serialize};

/// What a command knows about the time when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The wall clock, unix seconds.
    pub wall: u64,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`) and `CLOCK_BOOTTIME` in seconds,
    /// when available.
    pub boot: Option<(String, u64)>,
    /// Whether the kernel says the wall clock is synchronised (NTP), when it can be asked.
    pub synced: Option<bool>,
}

impl Reading {
    /// A reading of the wall clock alone (tests, platforms without a boot clock): the store's
    /// clock then follows the wall clock.
    pub fn wall(wall: u64) -> Self {
        Reading {
            wall,
            boot: None,
            synced: None,
        }
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

/// How far past the store's mark a wall clock read in a new boot may be without confirmation.
/// A node down for longer is rare; a hardware clock days ahead is what this guards against.
pub const UNCONFIRMED_GAP_SECS: u64 = 86_400;

/// How long after boot an unsynchronised wall clock far past the mark is doubted. NTP steps a
/// wrong hardware clock within a minute or two of boot; on a node where nothing ever
/// synchronises the clock there is nothing better than the wall clock once this has passed.
pub const SYNC_PATIENCE_SECS: u64 = 3_600;

/// Whether `reading` is of another boot than `mark` (or the boot clock went back, which only a
/// reboot does).
fn another_boot(mark: &ClockMark, boot_id: &str, since_boot: u64) -> bool {
    mark.boot_id.as_deref() != Some(boot_id) || since_boot < mark.since_boot
}

/// How far the wall clock is past the store's last mark when the store doubts it: in a new
/// boot, more than [`UNCONFIRMED_GAP_SECS`] past, not reported synchronised, and within
/// [`SYNC_PATIENCE_SECS`] of boot. `None` when the wall clock is not doubted.
pub fn doubted_wall(mark: Option<&ClockMark>, reading: &Reading) -> Option<u64> {
    let (mark, (boot_id, since_boot)) = (mark?, reading.boot.as_ref()?);
    let ahead = reading.wall.checked_sub(mark.now)?;
    (another_boot(mark, boot_id, *since_boot)
        && ahead > UNCONFIRMED_GAP_SECS
        && reading.synced != Some(true)
        && *since_boot < SYNC_PATIENCE_SECS)
        .then_some(ahead)
}

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
        // Another boot and a wall clock far ahead that nobody confirmed: only what is proven
        // (the mark, plus at least the time this boot has lasted).
        (Some(m), Some((_, secs))) if doubted_wall(mark, reading).is_some() => {
            m.now.saturating_add(*secs)
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
/// must be stored: within one boot every later time follows from it and the boot clock. Not
/// while the wall clock is doubted ([`doubted_wall`]): the old mark stays, and the next
/// command decides again.
pub fn starts_a_boot(mark: Option<&ClockMark>, reading: &Reading) -> bool {
    match (mark, &reading.boot) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(m), Some((id, secs))) => {
            another_boot(m, id, *secs) && doubted_wall(mark, reading).is_none()
        }
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
            synced: None,
        }
    }

    const DAY: u64 = 86_400;

    /// Found by review: a reboot with the hardware clock ten days ahead (before NTP corrected
    /// it) freed every holding of less than ten days at the first command.
    #[test]
    fn after_a_reboot_a_wall_clock_far_ahead_is_doubted_until_it_is_synchronised() {
        let before = advance(None, &reading(1_000_000, "b1", 50));
        // Rebooted: the RTC says ten days later, the kernel has not synchronised it, 30 s up.
        let fast = reading(1_000_000 + 10 * DAY, "b2", 30);
        assert_eq!(doubted_wall(Some(&before), &fast), Some(10 * DAY));
        let now = advance(Some(&before), &fast);
        assert_eq!(
            now.now, 1_000_030,
            "only what is proven: the mark plus 30 s of this boot"
        );
        assert!(
            !starts_a_boot(Some(&before), &fast),
            "no mark from a doubted clock"
        );
        // Later in the same boot, still unsynchronised: still doubted, still counting.
        let later = reading(1_000_000 + 10 * DAY + 600, "b2", 630);
        assert_eq!(advance(Some(&before), &later).now, 1_000_630);
        // NTP corrected it (the node was really down 2 days): taken, and stored.
        let synced = Reading {
            synced: Some(true),
            ..reading(1_000_000 + 2 * DAY + 700, "b2", 700)
        };
        assert_eq!(doubted_wall(Some(&before), &synced), None);
        assert_eq!(
            advance(Some(&before), &synced).now,
            1_000_000 + 2 * DAY + 700
        );
        assert!(starts_a_boot(Some(&before), &synced));
        // Never synchronised: after an hour of uptime the wall clock is all there is.
        let patient = reading(1_000_000 + 10 * DAY, "b2", SYNC_PATIENCE_SECS);
        assert_eq!(doubted_wall(Some(&before), &patient), None);
        assert_eq!(advance(Some(&before), &patient).now, 1_000_000 + 10 * DAY);
        // Less than a day past the mark: taken at once (a short reboot, a node down a night).
        let night = reading(1_000_000 + DAY - 1, "b2", 30);
        assert_eq!(doubted_wall(Some(&before), &night), None);
        assert_eq!(advance(Some(&before), &night).now, 1_000_000 + DAY - 1);
        // Within one boot the wall clock is never read anyway.
        let same = reading(1_000_000 + 10 * DAY, "b1", 60);
        assert_eq!(doubted_wall(Some(&before), &same), None);
        assert_eq!(advance(Some(&before), &same).now, 1_000_010);
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
