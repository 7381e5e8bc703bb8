//! `enospc`: a full disk at every write. The store lives on a small tmpfs mounted in a private
//! mount namespace (the command re-runs itself under `unshare --mount --propagation private`;
//! every child inherits the namespace, the host never sees the mount). For each of a list of
//! commands, a filler file leaves exactly `k` free pages, `k` = 0, 1, 2, … until the command
//! succeeds, so the command meets ENOSPC at every page it writes, one after the other. After
//! each failure: was it a clean error (an `ERR` line, exit 2) rather than a panic, a signal or a
//! hang? Does the store open while the disk is still full? Then the filler goes, and the store
//! must open and hold everything acknowledged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::fcntl::{FallocateFlags, fallocate};
use nix::mount::{MsFlags, mount, umount};
use serde::Serialize;

use crate::backend::Backend;
use crate::child::{self, Exit, Run};
use crate::model::Model;
use crate::workload::Dump;

const PAGE: u64 = 4096;
const TIMEOUT: Duration = Duration::from_secs(60);
const IN_NAMESPACE: &str = "STORE_COMPARE_IN_MOUNT_NS";

/// What happened to one backend.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// The backend.
    pub backend: String,
    /// Commands driven to success through ENOSPC.
    pub commands: usize,
    /// Commands that never succeeded, even with `max_pages` free.
    pub never_succeeded: usize,
    /// Attempts that failed for lack of space.
    pub failures: usize,
    /// …with a clean `no space left` error.
    pub clean_nospace: usize,
    /// …with another clean error (class: count).
    pub clean_other: BTreeMap<String, usize>,
    /// …with a panic, a signal or a hang.
    pub unclean: usize,
    /// Examples of errors other than a clean `no space` one.
    pub examples: Vec<String>,
    /// After a failure, with the disk still full: the store opened.
    pub opens_while_full: usize,
    /// …or did not (class: count).
    pub open_while_full_failed: BTreeMap<String, usize>,
    /// After a failure and freeing the space: the store did not open.
    pub open_after_free_failed: usize,
    /// Failures after which a `snap.*.generating` file was left (sled).
    pub stale_snapshots_left: usize,
    /// Free pages each command needed, in order.
    pub pages_needed: Vec<u64>,
    /// Violations of the promises after freeing space (lost acknowledged commands, …).
    pub violations: usize,
    /// Examples of them.
    pub violation_examples: Vec<String>,
    /// Whether the final checks passed: the store opens, one more ADD and DEL succeed, and
    /// everything acknowledged is there.
    pub final_ok: bool,
    /// Wall time, s.
    pub wall_s: f64,
}

fn example(list: &mut Vec<String>, what: String) {
    if list.len() < 12 && !list.contains(&what) {
        list.push(what);
    }
}

fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    let s = nix::sys::statvfs::statvfs(path)?;
    Ok(s.blocks_available() * s.fragment_size())
}

/// Leaves exactly `pages` free pages on the tmpfs (a filler file takes the rest).
fn set_free(mnt: &Path, pages: u64) -> anyhow::Result<u64> {
    let filler = mnt.join("filler");
    release(mnt)?;
    let free = free_bytes(mnt)?;
    let want = pages * PAGE;
    if free > want {
        let file = std::fs::File::create(&filler)?;
        fallocate(&file, FallocateFlags::empty(), 0, (free - want) as i64)
            .context("fallocate the filler")?;
    }
    free_bytes(mnt)
}

fn release(mnt: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(mnt.join("filler")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

fn dump(
    backend: Backend,
    data: &Path,
    scratch: &Path,
    model: &Model,
) -> anyhow::Result<(Dump, Run)> {
    // Outside the tmpfs, which may be full.
    let names = scratch.join("enospc-names.json");
    std::fs::write(&names, serde_json::to_vec(&model.names())?)?;
    let run = child::run(
        child::dump_command(backend, data, Some(&names)),
        None,
        TIMEOUT,
    )?;
    let dump = serde_json::from_str(run.stdout.trim()).unwrap_or_else(|_| Dump {
        error: Some(run.describe()),
        class: Some("crash".into()),
        ..Dump::default()
    });
    Ok((dump, run))
}

fn stale_snapshots(backend: Backend, data: &Path) -> bool {
    backend != Backend::Redb
        && std::fs::read_dir(backend.db_path(&data.join(crate::backend::NETWORK)))
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".generating"))
            })
            .unwrap_or(false)
}

const PODS: usize = 40;

/// The pods, in command order: ADD 40 pods (the first creates the store; the file grows), DEL
/// half (holdings), ADD them again (retained addresses), DEL the other half.
fn slots() -> Vec<usize> {
    let half = PODS / 2;
    (0..PODS)
        .chain(0..half)
        .chain(0..half)
        .chain(half..PODS)
        .collect()
}

fn one(backend: Backend, mnt: &Path, scratch: &Path, max_pages: u64) -> anyhow::Result<Stats> {
    let started = Instant::now();
    let mut stats = Stats {
        backend: backend.name().into(),
        ..Stats::default()
    };
    let data = mnt.join("data");
    std::fs::create_dir_all(&data)?;
    let mut model = Model::new("pod", PODS + 1);
    'slots: for pod in slots() {
        let (action, cid) = model.next(pod);
        let mut k = 0;
        loop {
            if k > max_pages {
                stats.never_succeeded += 1;
                release(mnt)?;
                break;
            }
            set_free(mnt, k)?;
            let cmd = child::op_command(backend, &data, action, &cid, model.pod_name(pod));
            let run = child::run(cmd, None, TIMEOUT)?;
            model.record(pod, action, &cid, &run);
            if run.ack().is_some() {
                stats.commands += 1;
                stats.pages_needed.push(k);
                break;
            }
            stats.failures += 1;
            match (run.exit, run.error()) {
                (Exit::Code(2), Some(("nospace", _))) => stats.clean_nospace += 1,
                (Exit::Code(2), Some((class, msg))) => {
                    *stats.clean_other.entry(class.to_string()).or_default() += 1;
                    example(&mut stats.examples, format!("{class}: {msg}"));
                }
                _ => {
                    stats.unclean += 1;
                    example(
                        &mut stats.examples,
                        format!("unclean ({:?}): {}", run.exit, run.describe()),
                    );
                }
            }
            if stale_snapshots(backend, &data) {
                stats.stale_snapshots_left += 1;
            }
            // Still full: does the store open (as the next plugin call would)?
            let (full, _) = dump(backend, &data, scratch, &model)?;
            if full.ok {
                stats.opens_while_full += 1;
            } else {
                let class = full.class.clone().unwrap_or_else(|| "?".into());
                *stats.open_while_full_failed.entry(class).or_default() += 1;
                if backend == Backend::Redb
                    || stats.open_while_full_failed.values().sum::<usize>() == 1
                {
                    example(
                        &mut stats.examples,
                        format!(
                            "open while full after ENOSPC at {k} free pages ({action:?} {cid}): {}",
                            full.error.as_deref().unwrap_or("?")
                        ),
                    );
                }
            }
            release(mnt)?;
            let (freed, _) = dump(backend, &data, scratch, &model)?;
            if !freed.ok {
                stats.open_after_free_failed += 1;
            }
            for v in model.verify(&freed) {
                stats.violations += 1;
                example(
                    &mut stats.violation_examples,
                    format!("after ENOSPC at {k} free pages ({action:?} {cid}): {v}"),
                );
            }
            if !freed.ok {
                // Nothing more to learn from a store that no longer opens.
                break 'slots;
            }
            k += 1;
        }
    }
    release(mnt)?;
    let (action, cid) = model.next(PODS);
    let run = child::run(
        child::op_command(backend, &data, action, &cid, model.pod_name(PODS)),
        None,
        TIMEOUT,
    )?;
    model.record(PODS, action, &cid, &run);
    let (action2, cid2) = model.next(PODS);
    let run2 = child::run(
        child::op_command(backend, &data, action2, &cid2, model.pod_name(PODS)),
        None,
        TIMEOUT,
    )?;
    model.record(PODS, action2, &cid2, &run2);
    let (last, _) = dump(backend, &data, scratch, &model)?;
    let violations = model.verify(&last);
    for v in &violations {
        stats.violations += 1;
        example(&mut stats.violation_examples, format!("final: {v}"));
    }
    stats.final_ok =
        run.ack().is_some() && run2.ack().is_some() && last.ok && violations.is_empty();
    if !stats.final_ok {
        example(
            &mut stats.violation_examples,
            format!("final commands: {} / {}", run.describe(), run2.describe()),
        );
    }
    stats.wall_s = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// Runs the check for every backend; writes `enospc.<backend>.json` into `results`.
pub fn run(
    backends: &[Backend],
    work: &Path,
    results: &Path,
    max_pages: u64,
) -> anyhow::Result<Vec<Stats>> {
    if std::env::var_os(IN_NAMESPACE).is_none() {
        // Re-run inside a private mount namespace; children inherit it.
        let status = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--"])
            .arg(child::exe())
            .args(std::env::args_os().skip(1))
            .env(IN_NAMESPACE, "1")
            .status()
            .context("run unshare (util-linux; needs root)")?;
        anyhow::ensure!(
            status.success(),
            "enospc inside the mount namespace failed: {status}"
        );
        // The results are in `results`, written by the inner run.
        return Ok(Vec::new());
    }
    let mnt: PathBuf = work.join("enospc-mnt");
    std::fs::create_dir_all(&mnt)?;
    let mut out = Vec::new();
    for b in backends {
        mount(
            Some("tmpfs"),
            &mnt,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("size=64m,mode=0700"),
        )
        .context("mount the tmpfs")?;
        let stats = one(*b, &mnt, work, max_pages);
        umount(&mnt).context("unmount the tmpfs")?;
        let stats = stats?;
        eprintln!(
            "enospc {}: {} commands, {} failures ({} clean no-space, {} unclean), {} violations, final ok: {}, {:.0} s",
            b,
            stats.commands,
            stats.failures,
            stats.clean_nospace,
            stats.unclean,
            stats.violations,
            stats.final_ok,
            stats.wall_s
        );
        std::fs::write(
            results.join(format!("enospc.{b}.json")),
            serde_json::to_vec_pretty(&stats)?,
        )?;
        out.push(stats);
    }
    Ok(out)
}
