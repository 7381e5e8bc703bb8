//! ipkeep's binaries as separate processes: started with their flags, logs appended to one file
//! per process, restarted (gracefully or by SIGKILL) on demand, killed when dropped.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How a process is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM, then SIGKILL after 10 s: a rolling update.
    Graceful,
    /// SIGKILL: a crash or an OOM kill.
    Kill,
}

/// One running binary.
#[derive(Debug)]
pub struct Process {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(String, OsString)>,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Process {
    /// Starts `program args` with `envs` added; stdout and stderr go to `<log_dir>/<name>.log`.
    pub fn start(
        name: &str,
        program: &Path,
        args: Vec<OsString>,
        envs: Vec<(String, OsString)>,
        log_dir: &Path,
    ) -> Result<Process> {
        let mut p = Process {
            name: name.to_string(),
            program: program.to_path_buf(),
            args,
            envs,
            log: log_dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!(
                    "cannot start {} ({}); build it with `cargo build --workspace --bins`",
                    self.name,
                    self.program.display()
                )
            })?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// The name (`controller-0`, `agent-node-1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where its output goes.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// How many times it was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Stops it (and waits for it to exit).
    pub async fn stop(&mut self, how: Stop) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        if how == Stop::Graceful && kill(pid, Signal::SIGTERM).is_ok() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops it and starts it again with the same flags.
    pub async fn restart(&mut self, how: Stop) -> Result<()> {
        self.stop(how).await;
        self.spawn()
    }

    /// An error if it has exited on its own.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!(
                "{} exited unexpectedly ({status}); its log {} ends with:\n{}",
                self.name,
                self.log.display(),
                self.tail(20)
            );
        }
        Ok(())
    }

    /// The last `lines` lines of its log.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loopback address with a port nobody listens on now, chosen outside the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by default): a port from that
/// range can be taken by any outgoing connection before the process it is meant for binds it.
pub fn free_port() -> Result<std::net::SocketAddr> {
    use std::hash::{BuildHasher, RandomState};
    let start = RandomState::new().hash_one(std::process::id());
    for i in 0..2000u64 {
        let port = 10_000 + (start.wrapping_add(i) % 10_000) as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(listener.local_addr()?);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}
