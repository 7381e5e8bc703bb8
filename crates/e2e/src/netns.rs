//! Named network namespaces (`ip netns`), removed on drop. Every failure is an error, never a
//! panic: the demonstration cleans up and says what went wrong.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

/// Runs `program args` and returns its stdout, or an error with its output.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Netns {
    /// `ip netns add <name>` (a stale one from a crashed run is removed first), with `lo` up.
    pub fn new(name: &str) -> Result<Netns> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run("ip", &["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        run("ip", &["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path runtimes pass as `CNI_NETNS`.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// The IPv4 addresses on `dev` inside the namespace, as the kernel reports them.
    pub fn ipv4_addresses(&self, dev: &str) -> Result<Vec<String>> {
        let out = run(
            "ip",
            &["-n", &self.name, "-4", "-o", "addr", "show", "dev", dev],
        )?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                words.find(|w| *w == "inet")?;
                words.next()?.split('/').next().map(str::to_string)
            })
            .collect())
    }

    /// Whether one ping from inside the namespace to `to` is answered.
    pub fn ping(&self, to: &str) -> bool {
        Command::new("ip")
            .args([
                "netns", "exec", &self.name, "ping", "-c", "1", "-W", "2", to,
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Whether this process may create network namespaces (root).
pub fn can_create() -> bool {
    nix::unistd::geteuid().is_root()
        && Command::new("ip")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
}
