//! The open-files limit. Containers often start with a soft limit of 1,024 descriptors and a
//! much higher hard one; at the soft limit `accept` fails and so does every connection the
//! process opens itself (its API watches), which is worse than any one listener's bounds.
//! Raising the soft limit to the hard one needs no privilege.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Never raise the soft limit beyond this: enough for every bound in this crate many times
/// over, and small enough that nothing sized by it grows absurd.
pub const OPEN_FILES_CEILING: u64 = 1 << 20;

/// The soft limit before and after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
}

/// Raises the soft limit on open files to the hard limit (at most [`OPEN_FILES_CEILING`]).
pub fn raise_open_files_limit() -> Result<OpenFiles, nix::Error> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let target = hard.min(OPEN_FILES_CEILING).max(soft);
    if target > soft {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    }
    Ok(OpenFiles {
        before: soft,
        now: target,
    })
}

/// [`raise_open_files_limit`], with a log line saying what came of it.
pub fn raise_open_files_limit_logged() {
    match raise_open_files_limit() {
        Ok(OpenFiles { before, now }) if now > before => {
            tracing::info!(before, now, "raised the soft limit on open files");
        }
        Ok(OpenFiles { now, .. }) => tracing::debug!(now, "open files limit unchanged"),
        Err(e) => tracing::warn!(
            error = %e,
            "failed to raise the soft limit on open files; connections are still bounded per listener"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_the_soft_limit_up_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        let raised = raise_open_files_limit().expect("raise");
        assert_eq!(raised.now, hard.min(OPEN_FILES_CEILING).max(raised.before));
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        assert_eq!(soft, raised.now);
    }
}
