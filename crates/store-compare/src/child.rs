//! Runs the child processes (`op`, `dump`, …), optionally SIGKILLing one after a delay, and reads
//! what they said.

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::backend::Backend;
use crate::workload::Action;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal ended it (9: our SIGKILL).
    Signal(i32),
    /// It ran past its time and was killed.
    TimedOut,
}

/// What one child did.
#[derive(Debug, Clone)]
pub struct Run {
    /// How it ended.
    pub exit: Exit,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr (phase markers `@name µs` and anything else).
    pub stderr: String,
    /// From spawn to exit.
    pub elapsed: Duration,
}

impl Run {
    /// Whether our SIGKILL ended it.
    pub fn killed(&self) -> bool {
        self.exit == Exit::Signal(9)
    }

    /// The acknowledgement line, without `ACK `.
    pub fn ack(&self) -> Option<&str> {
        self.stdout.lines().find_map(|l| l.strip_prefix("ACK "))
    }

    /// The error line: (class, message).
    pub fn error(&self) -> Option<(&str, &str)> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix("ERR "))
            .map(|rest| rest.split_once(' ').unwrap_or((rest, "")))
    }

    /// Phase markers in order: (name, µs since the child's `main`).
    pub fn phases(&self) -> Vec<(String, u64)> {
        self.stderr
            .lines()
            .filter_map(|l| l.strip_prefix('@'))
            .filter_map(|l| {
                let (name, us) = l.split_once(' ')?;
                Some((name.to_string(), us.trim().parse().ok()?))
            })
            .collect()
    }

    /// When `name` was reached, µs since the child's `main`.
    pub fn phase_at(&self, name: &str) -> Option<u64> {
        self.phases()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// The last phase reached.
    pub fn last_phase(&self) -> Option<String> {
        self.phases().pop().map(|(n, _)| n)
    }

    /// A one-line description of an unexpected end, for reports.
    pub fn describe(&self) -> String {
        let tail = |s: &str| {
            let s = s.trim();
            let start = s.len().saturating_sub(300);
            let start = (start..=s.len())
                .find(|i| s.is_char_boundary(*i))
                .unwrap_or(0);
            s[start..].replace('\n', " | ")
        };
        match (self.exit, self.error()) {
            (_, Some((class, msg))) => format!("{class}: {msg}"),
            (Exit::Code(101), None) => format!(
                "panicked: {}",
                self.stderr
                    .lines()
                    .skip_while(|l| !l.contains("panicked at"))
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            (Exit::Code(c), None) => format!("exit {c}: {}", tail(&self.stderr)),
            (Exit::Signal(s), None) => format!("signal {s}: {}", tail(&self.stderr)),
            (Exit::TimedOut, None) => format!("timed out: {}", tail(&self.stderr)),
        }
    }
}

fn reader(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

fn exit_of(status: ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(s),
        (None, None) => Exit::Code(-1),
    }
}

/// Runs `cmd`; SIGKILLs it `kill_after` after the spawn returned if it is still running, and in
/// any case once `timeout` has passed.
pub fn run(
    mut cmd: Command,
    kill_after: Option<Duration>,
    timeout: Duration,
) -> std::io::Result<Run> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let pid = Pid::from_raw(child.id() as i32);
    let out = reader(
        child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?,
    );
    let err = reader(
        child
            .stderr
            .take()
            .ok_or_else(|| std::io::Error::other("no stderr"))?,
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send((status, Instant::now()));
    });
    let mut timed_out = false;
    let first_wait = kill_after.unwrap_or(timeout).min(timeout);
    let (status, ended) = match rx.recv_timeout(first_wait) {
        Ok(done) => done,
        Err(_) => {
            timed_out = kill_after.is_none_or(|k| k >= timeout);
            let _ = kill(pid, Signal::SIGKILL);
            rx.recv()
                .map_err(|_| std::io::Error::other("waiter vanished"))?
        }
    };
    let status = status?;
    let exit = if timed_out && exit_of(status) == Exit::Signal(9) {
        Exit::TimedOut
    } else {
        exit_of(status)
    };
    Ok(Run {
        exit,
        stdout: out.recv().unwrap_or_default(),
        stderr: err.recv().unwrap_or_default(),
        elapsed: ended.duration_since(started),
    })
}

/// `store-compare op …` for one ADD or DEL.
pub fn op_command(
    backend: Backend,
    data_dir: &Path,
    action: Action,
    cid: &str,
    pod: &str,
) -> Command {
    let mut cmd = Command::new(exe());
    cmd.arg("op")
        .arg("--backend")
        .arg(backend.name())
        .arg("--data-dir")
        .arg(data_dir)
        .arg(match action {
            Action::Add => "add",
            Action::Del => "del",
        })
        .arg("--cid")
        .arg(cid)
        .arg("--pod")
        .arg(pod);
    cmd
}

/// `store-compare dump …`.
pub fn dump_command(backend: Backend, data_dir: &Path, names: Option<&Path>) -> Command {
    let mut cmd = Command::new(exe());
    cmd.arg("dump")
        .arg("--backend")
        .arg(backend.name())
        .arg("--data-dir")
        .arg(data_dir);
    if let Some(names) = names {
        cmd.arg("--names").arg(names);
    }
    cmd
}

/// This executable.
pub fn exe() -> std::path::PathBuf {
    std::env::current_exe().unwrap_or_else(|_| "store-compare".into())
}
