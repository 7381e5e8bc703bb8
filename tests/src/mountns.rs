//! A private mount namespace for full-disk tests: a small tmpfs mounted there is seen only by
//! the processes started inside it, never by the host, and goes away with the namespace. Also a
//! real network namespace kept on a file, as container runtimes keep a sandbox's.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A mount namespace held open by a sleeping process; processes join it through `nsenter`.
#[derive(Debug)]
pub struct MountNs {
    holder: Child,
}

impl MountNs {
    /// A new private mount namespace, or `None` (said loudly; a failure under CI) without root.
    pub fn new(test: &str) -> Option<MountNs> {
        if !crate::require_root(test) {
            return None;
        }
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sleep", "3600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)");
        let ns = MountNs { holder };
        let mine = std::fs::read_link("/proc/self/ns/mnt").expect("own mount namespace");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{}/ns/mnt", ns.pid())).ok() == Some(mine.clone()) {
            assert!(
                Instant::now() < deadline,
                "unshare did not create a namespace"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(ns)
    }

    /// The holder's PID.
    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// `nsenter -t PID -m --`: the prefix that runs a program inside the namespace.
    pub fn prefix(&self) -> Vec<String> {
        ["nsenter", "-t", &self.pid().to_string(), "-m", "--"]
            .map(String::from)
            .to_vec()
    }

    /// A command running `program` inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let prefix = self.prefix();
        let mut cmd = Command::new(&prefix[0]);
        cmd.args(&prefix[1..]).arg(program);
        cmd
    }

    /// Runs a shell command inside the namespace; returns whether it succeeded.
    pub fn sh(&self, script: &str) -> bool {
        self.command("sh")
            .args(["-c", script])
            .status()
            .expect("sh")
            .success()
    }

    /// Mounts a tmpfs of `size` (e.g. `1m`) on `dir`, inside the namespace only.
    pub fn mount_tmpfs(&self, dir: &Path, size: &str) {
        let ok = self
            .command("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .expect("mount")
            .success();
        assert!(ok, "mount a tmpfs on {}", dir.display());
    }
}

impl Drop for MountNs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// A real network namespace kept alive by a bind mount on a file, as runtimes keep a sandbox's
/// (`CNI_NETNS`); unmounted and deleted when dropped, as when the sandbox is torn down.
#[derive(Debug)]
pub struct SandboxNetns {
    path: std::path::PathBuf,
}

impl SandboxNetns {
    /// A new network namespace on `path` (created), in the caller's mount namespace.
    pub fn new(path: &Path) -> SandboxNetns {
        std::fs::write(path, "").expect("the mount point");
        crate::sh("unshare", &[&format!("--net={}", path.display()), "true"]);
        SandboxNetns {
            path: path.to_path_buf(),
        }
    }

    /// The path, as `CNI_NETNS`.
    pub fn path(&self) -> &str {
        self.path.to_str().expect("a UTF-8 path")
    }
}

impl Drop for SandboxNetns {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).output();
        let _ = std::fs::remove_file(&self.path);
    }
}
