//! A crash of ipkeep's own processes on the real nodes: SIGKILL, as an OOM kill or a node's
//! power cut delivers it, mid-work (no graceful shutdown, no leader lease released, a store
//! transaction cut off wherever it was). The host sees every node's container processes, so
//! they are found in its `/proc`.

use std::path::Path;

use anyhow::{Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// ipkeep's long-running programs, as the manifests in `deploy/` start them.
pub const PROGRAMS: [&str; 3] = ["ipkeep-controller", "ipkeep-scheduler-ext", "ipkeep-agent"];

/// A process running one of [`PROGRAMS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Its PID on the host.
    pub pid: i32,
    /// Which program.
    pub program: &'static str,
}

/// The processes on this machine running one of [`PROGRAMS`] as a container's process (their
/// parent is a containerd shim), so that an ipkeep-agent a developer or a test runs by hand is
/// left alone.
pub fn in_containers() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<Process> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let program = program_of(pid)?;
            let parent = parent_of(pid)?;
            let shim = std::fs::read_to_string(format!("/proc/{parent}/comm")).ok()?;
            shim.starts_with("containerd-shim")
                .then_some(Process { pid, program })
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// Which of [`PROGRAMS`] the process runs (its `argv[0]`, any directory).
fn program_of(pid: i32) -> Option<&'static str> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv0 = cmdline.split(|b| *b == 0).next()?;
    let name = Path::new(std::str::from_utf8(argv0).ok()?).file_name()?;
    PROGRAMS.into_iter().find(|p| name == *p)
}

/// The parent's PID, from `/proc/PID/stat` (the field after the command name, which may hold
/// spaces and parentheses of its own).
fn parent_of(pid: i32) -> Option<i32> {
    parent_in_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parent_in_stat(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// SIGKILLs every process of `victims`, one right after the other. An error names the ones
/// that could not be killed (a process that exited on its own meanwhile is not one).
pub fn kill_all(victims: &[Process]) -> Result<()> {
    let failed: Vec<String> = victims
        .iter()
        .filter_map(|p| match kill(Pid::from_raw(p.pid), Signal::SIGKILL) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => None,
            Err(e) => Some(format!("{} (pid {}): {e}", p.program, p.pid)),
        })
        .collect();
    if !failed.is_empty() {
        bail!("could not SIGKILL {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_a_command_name_with_spaces_and_parentheses() {
        assert_eq!(
            parent_in_stat("4242 (a) b (c)) S 77 4242 4242 0 -1"),
            Some(77)
        );
        assert_eq!(parent_in_stat("4242 (ipkeep-agent) S 1 4242"), Some(1));
        assert_eq!(parent_in_stat("garbage"), None);
        // This test's own process, through /proc.
        let me = std::process::id() as i32;
        assert_eq!(parent_of(me), Some(nix::unistd::getppid().as_raw()));
        assert_eq!(program_of(me), None);
    }
}
