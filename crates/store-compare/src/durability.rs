//! `durability`: runs one `op` under `strace -f -y` and checks that every file of the store
//! written before the acknowledgement was `fsync`ed or `fdatasync`ed after its last write and
//! before the acknowledgement was written (`sync_file_range` does not count: it flushes neither
//! the device's write cache nor the file's size), and that new names in the store's directories
//! (created files, renames) were made durable by an `fsync` of their directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use serde::Serialize;

use crate::backend::{Backend, NETWORK};
use crate::child;
use crate::workload::Action;

/// One system call from the trace.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    /// The file of the first fd argument, or the opened/created/renamed-to path.
    path: Option<String>,
    text: String,
    start: usize,
    end: usize,
}

const WRITES: &[&str] = &[
    "write",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "writev",
    "ftruncate",
    "fallocate",
];
const SYNCS: &[&str] = &["fsync", "fdatasync"];

fn fd_path(args: &str) -> Option<String> {
    // `3</dir/file>, …`: the decoration strace -y adds to an fd.
    let open = args.find('<')?;
    let digits = &args[..open];
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let rest = &args[open + 1..];
    Some(rest[..rest.find('>')?].to_string())
}

fn quoted(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('"') {
        let after = &rest[i + 1..];
        let Some(j) = after.find('"') else { break };
        out.push(after[..j].to_string());
        rest = &after[j + 1..];
    }
    out
}

fn call_path(name: &str, args: &str, result: &str) -> Option<String> {
    match name {
        "openat" | "open" => fd_path(result.trim()),
        "mkdir" => quoted(args).into_iter().next(),
        "mkdirat" => quoted(args).into_iter().next(),
        "rename" | "renameat" | "renameat2" => quoted(args).into_iter().nth(1),
        _ => fd_path(args),
    }
}

/// Parses `strace -f -y -o` output into calls with their start and end line.
fn parse(trace: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut pending: BTreeMap<String, Call> = BTreeMap::new();
    for (i, line) in trace.lines().enumerate() {
        let Some((pid, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(resumed) = rest.strip_prefix("<... ") {
            if let Some(mut call) = pending.remove(pid) {
                call.end = i;
                if let Some((_, result)) = resumed.rsplit_once(" = ")
                    && call.path.is_none()
                {
                    call.path = call_path(&call.name, "", result);
                }
                call.text.push_str(resumed);
                calls.push(call);
            }
            continue;
        }
        let Some(paren) = rest.find('(') else {
            continue;
        };
        let name = rest[..paren].to_string();
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let body = &rest[paren + 1..];
        if let Some(args) = body.strip_suffix(" <unfinished ...>") {
            pending.insert(
                pid.to_string(),
                Call {
                    path: call_path(&name, args, ""),
                    name,
                    text: rest.to_string(),
                    start: i,
                    end: i,
                },
            );
            continue;
        }
        let (args, result) = body.rsplit_once(" = ").unwrap_or((body, ""));
        if result.trim_start().starts_with('-') {
            continue; // failed call
        }
        calls.push(Call {
            path: call_path(&name, args, result),
            name,
            text: rest.to_string(),
            start: i,
            end: i,
        });
    }
    calls
}

/// The verdict on one traced command.
#[derive(Debug, Default, Serialize)]
pub struct Scenario {
    /// What ran.
    pub name: String,
    /// Whether it acknowledged.
    pub acknowledged: bool,
    /// Every store file written before the acknowledgement was fsync'd/fdatasync'd after its
    /// last write and before the acknowledgement.
    pub data_durable: bool,
    /// Files written but not synced that way, with what was done instead.
    pub unsynced: Vec<String>,
    /// Every new name in the store (created file, rename target) had its directory fsync'd
    /// before the acknowledgement.
    pub names_durable: bool,
    /// New names without a directory fsync.
    pub unsynced_names: Vec<String>,
    /// When the command created the network directory (`NetworkDir::lock`, shared by every
    /// backend): whether the data directory was fsync'd after that mkdir, before the ACK.
    pub network_dir_synced: Option<bool>,
    /// Calls on store files before the acknowledgement: "call file" → count.
    pub calls: BTreeMap<String, usize>,
}

fn listing(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if !d.exists() {
            continue;
        }
        out.insert(d.display().to_string());
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.display().to_string());
            }
        }
    }
    out
}

fn scenario(
    backend: Backend,
    data: &Path,
    name: &str,
    action: Action,
    cid: &str,
    pod: &str,
) -> anyhow::Result<Scenario> {
    let net = data.join(NETWORK);
    let before = listing(&net);
    let trace_path = data.join(format!("{name}.strace"));
    let out_path = data.join(format!("{name}.out"));
    let op = child::op_command(backend, data, action, cid, pod);
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-y", "-qq", "-s", "48", "-o"])
        .arg(&trace_path)
        .arg("-e")
        .arg("trace=fsync,fdatasync,sync_file_range,msync,write,pwrite64,pwritev,pwritev2,writev,ftruncate,fallocate,rename,renameat,renameat2,openat,mkdir,mkdirat")
        .arg("--")
        .arg(op.get_program())
        .args(op.get_args())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(Stdio::null());
    let status = cmd
        .status()
        .context("run strace (apt-get install strace)")?;
    let out = std::fs::read_to_string(&out_path)?;
    let trace = std::fs::read_to_string(&trace_path)?;
    let calls = parse(&trace);
    let prefix = format!("{}/", net.display());
    let in_store = |p: &str| p.starts_with(&prefix) && !p.ends_with("/lock");
    let mut result = Scenario {
        name: name.to_string(),
        acknowledged: status.success() && out.starts_with("ACK"),
        ..Scenario::default()
    };
    let Some(ack) = calls
        .iter()
        .find(|c| c.name == "write" && c.text.contains("\"ACK "))
        .map(|c| c.start)
    else {
        result
            .unsynced
            .push(format!("no acknowledgement in the trace ({out})"));
        return Ok(result);
    };
    let before_ack: Vec<&Call> = calls.iter().filter(|c| c.end < ack).collect();
    for c in &before_ack {
        if let Some(p) = c
            .path
            .as_deref()
            .filter(|p| in_store(p) || *p == net.display().to_string())
        {
            let short = p.strip_prefix(&prefix).unwrap_or("<network dir>");
            *result
                .calls
                .entry(format!("{} {short}", c.name))
                .or_default() += 1;
        }
    }
    // Data: every written store file synced after its last write.
    let mut written: BTreeMap<&str, usize> = BTreeMap::new();
    for c in before_ack
        .iter()
        .filter(|c| WRITES.contains(&c.name.as_str()))
    {
        if let Some(p) = c.path.as_deref().filter(|p| in_store(p)) {
            let e = written.entry(p).or_default();
            *e = (*e).max(c.end);
        }
    }
    for (path, last) in &written {
        let synced = before_ack.iter().any(|c| {
            SYNCS.contains(&c.name.as_str()) && c.path.as_deref() == Some(*path) && c.start > *last
        });
        if !synced {
            let instead: Vec<String> = before_ack
                .iter()
                .filter(|c| {
                    c.start > *last && c.path.as_deref() == Some(*path) && c.name.contains("sync")
                })
                .map(|c| c.name.clone())
                .collect();
            result.unsynced.push(format!(
                "{}: written, then {}",
                path.strip_prefix(&prefix).unwrap_or(path),
                if instead.is_empty() {
                    "no sync at all".to_string()
                } else {
                    format!("only {}", instead.join(", "))
                }
            ));
        }
    }
    result.data_durable = result.acknowledged && result.unsynced.is_empty();
    // Names: created files and rename targets, each followed by an fsync of its directory.
    for c in before_ack.iter().filter(|c| {
        matches!(
            c.name.as_str(),
            "openat" | "mkdir" | "mkdirat" | "rename" | "renameat" | "renameat2"
        )
    }) {
        let Some(p) = c.path.as_deref() else { continue };
        if !(in_store(p) || p == net.display().to_string()) {
            continue;
        }
        let is_new = c.name.starts_with("rename")
            || (!before.contains(p) && (c.text.contains("O_CREAT") || c.name.starts_with("mkdir")));
        if !is_new {
            continue;
        }
        let parent = PathBuf::from(p)
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let synced = before_ack.iter().any(|s| {
            s.name == "fsync" && s.path.as_deref() == Some(parent.as_str()) && s.start > c.end
        });
        match p.strip_prefix(&prefix) {
            Some(short) if !synced && !result.unsynced_names.iter().any(|n| n == short) => {
                result.unsynced_names.push(short.to_string());
            }
            Some(_) => {}
            // The network directory itself: NetworkDir::lock's mkdir, the same for every backend.
            None => result.network_dir_synced = Some(synced),
        }
    }
    result.names_durable = result.acknowledged && result.unsynced_names.is_empty();
    Ok(result)
}

/// What one backend showed.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// The backend.
    pub backend: String,
    /// The traced commands.
    pub scenarios: Vec<Scenario>,
}

/// Traces a creating ADD, an ADD and a DEL on each backend; writes `durability.<backend>.json`.
pub fn run(backends: &[Backend], work: &Path, results: &Path) -> anyhow::Result<Vec<Stats>> {
    let mut out = Vec::new();
    for b in backends {
        let data = work.join(format!("durability-{b}"));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)?;
        let data = data.canonicalize()?;
        let mut stats = Stats {
            backend: b.name().into(),
            ..Stats::default()
        };
        stats
            .scenarios
            .push(scenario(*b, &data, "create-add", Action::Add, "c1", "p1")?);
        for i in 0..20 {
            let run = child::run(
                child::op_command(*b, &data, Action::Add, &format!("w{i}"), &format!("w{i}")),
                None,
                std::time::Duration::from_secs(60),
            )?;
            anyhow::ensure!(run.ack().is_some(), "warm-up failed: {}", run.describe());
        }
        stats
            .scenarios
            .push(scenario(*b, &data, "add", Action::Add, "c2", "p2")?);
        stats
            .scenarios
            .push(scenario(*b, &data, "del", Action::Del, "c2", "p2")?);
        for s in &stats.scenarios {
            eprintln!(
                "durability {b} {}: acknowledged {}, data durable {}, names durable {} {:?} {:?}; network dir mkdir synced {:?}",
                s.name,
                s.acknowledged,
                s.data_durable,
                s.names_durable,
                s.unsynced,
                s.unsynced_names,
                s.network_dir_synced
            );
        }
        std::fs::write(
            results.join(format!("durability.{b}.json")),
            serde_json::to_vec_pretty(&stats)?,
        )?;
        out.push(stats);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decorated_and_split_calls() {
        let trace = "\
10 openat(AT_FDCWD</w>, \"/d/net/leases.redb\", O_RDWR|O_CLOEXEC) = 3</d/net/leases.redb>
10 pwrite64(3</d/net/leases.redb>, \"\\0\"..., 4096, 0) = 4096
11 fdatasync(3</d/net/leases.redb> <unfinished ...>
10 write(2<pipe:[1]>, \"@x\", 2) = 2
11 <... fdatasync resumed>) = 0
10 write(1</d/c.out>, \"ACK ADD c 10.0.0.2\\n\", 19) = 19
";
        let calls = parse(trace);
        let sync = calls
            .iter()
            .find(|c| c.name == "fdatasync")
            .map(|c| (c.start, c.end));
        assert_eq!(sync, Some((2, 4)));
        assert_eq!(calls[0].path.as_deref(), Some("/d/net/leases.redb"));
        assert_eq!(calls[1].path.as_deref(), Some("/d/net/leases.redb"));
    }
}
