//! `measure`: per-process open time at 1k and 60k leases (what every plugin call pays), open
//! time after a crash at the largest size (redb repairs the whole file; sled replays its log),
//! file size, and the peak RSS of one long-lived opener with 60k held leases running 1,000
//! ADD/DEL commands (the node agent). Backends are interleaved, in a shuffled order every round,
//! so the machine's load falls on each alike.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;

use crate::backend::{Backend, NETWORK};
use crate::child;
use crate::rng::Rng;
use crate::stats::summary;
use crate::workload::{self, Action, AgentSim};

/// Median, p99 and max, ms.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Dist {
    /// Samples.
    pub n: usize,
    /// Median.
    pub median_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

impl Dist {
    fn of(mut us: Vec<u64>) -> Dist {
        let n = us.len();
        let (m, p, x) = summary(&mut us);
        Dist {
            n,
            median_ms: m as f64 / 1e3,
            p99_ms: p as f64 / 1e3,
            max_ms: x as f64 / 1e3,
        }
    }
}

/// One backend at one size.
#[derive(Debug, Default, Serialize)]
pub struct AtSize {
    /// Leases filled in.
    pub leases: u32,
    /// Seconds the bulk fill took (1,000 leases per commit).
    pub fill_s: f64,
    /// Bytes on disk after the fill (allocated blocks), and the apparent size.
    pub disk_bytes_after_fill: u64,
    /// Apparent size after the fill.
    pub apparent_bytes_after_fill: u64,
    /// …after the per-process commands below.
    pub disk_bytes_after_ops: u64,
    /// Apparent size after them.
    pub apparent_bytes_after_ops: u64,
    /// Per-process: lock + open, from the process's `main`.
    pub open: Dist,
    /// Per-process: one ADD or DEL with its commit.
    pub op: Dist,
    /// Per-process: close.
    pub close: Dist,
    /// Per-process: spawn to exit, as the caller waits for it.
    pub process: Dist,
    /// Open (lock + open + repair) by the first command after a SIGKILL of a process that had
    /// the store open and had just committed.
    pub open_after_crash: Dist,
    /// Failures (any command that did not acknowledge).
    pub failures: usize,
    /// Examples.
    pub failure_examples: Vec<String>,
}

/// One backend.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// The backend.
    pub backend: String,
    /// Per size.
    pub sizes: Vec<AtSize>,
    /// The agent simulation at the largest size, one per run.
    pub agent: Vec<AgentSim>,
}

fn disk_usage(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![path.to_path_buf()];
    let (mut blocks, mut apparent) = (0, 0);
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            stack.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else {
            blocks += meta.blocks() * 512;
            apparent += meta.len();
        }
    }
    (blocks, apparent)
}

/// Runs `op --hold` (ADD), waits for its acknowledgement, SIGKILLs it while it holds the store.
fn crash_holding(backend: Backend, data: &Path, cid: &str, pod: &str) -> anyhow::Result<bool> {
    let mut cmd = child::op_command(backend, data, Action::Add, cid, pod);
    cmd.arg("--hold")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut proc = cmd.spawn()?;
    let stdout = proc.stdout.take().context("stdout")?;
    let mut acked = false;
    for line in BufReader::new(stdout).lines() {
        if line?.starts_with("ACK") {
            acked = true;
            break;
        }
    }
    let _ = kill(Pid::from_raw(proc.id() as i32), Signal::SIGKILL);
    proc.wait()?;
    Ok(acked)
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Store sizes (leases).
    pub sizes: Vec<u32>,
    /// Per-process commands per backend and size.
    pub opens: usize,
    /// Crashes (and timed opens after them) per backend at the largest size.
    pub crash_opens: usize,
    /// ADD/DEL commands of the agent simulation.
    pub agent_ops: usize,
    /// Agent simulations per backend.
    pub agent_runs: usize,
}

/// Measures every backend; writes `measure.<backend>.json` into `results`.
pub fn run(
    backends: &[Backend],
    work: &Path,
    plan: &Plan,
    results: &Path,
) -> anyhow::Result<Vec<Stats>> {
    let mut rng = Rng::new(7);
    let mut stats: BTreeMap<Backend, Stats> = backends
        .iter()
        .map(|b| {
            (
                *b,
                Stats {
                    backend: b.name().into(),
                    ..Stats::default()
                },
            )
        })
        .collect();
    let largest = plan.sizes.iter().copied().max().unwrap_or(0);
    let data_of = |b: Backend, size: u32| -> PathBuf { work.join(format!("measure-{b}-{size}")) };
    for &size in &plan.sizes {
        let mut at: BTreeMap<Backend, AtSize> = BTreeMap::new();
        let mut samples: BTreeMap<Backend, [Vec<u64>; 5]> = BTreeMap::new();
        for &b in backends {
            let data = data_of(b, size);
            let _ = std::fs::remove_dir_all(&data);
            std::fs::create_dir_all(&data)?;
            let fill_s = workload::fill(b, &data, size)?;
            let (disk, apparent) = disk_usage(&data.join(NETWORK));
            eprintln!("measure {b}: filled {size} leases in {fill_s:.1} s, {disk} bytes on disk");
            at.insert(
                b,
                AtSize {
                    leases: size,
                    fill_s,
                    disk_bytes_after_fill: disk,
                    apparent_bytes_after_fill: apparent,
                    ..AtSize::default()
                },
            );
            samples.insert(b, Default::default());
        }
        let started = Instant::now();
        let mut order = backends.to_vec();
        for round in 0..plan.opens {
            // A fresh shuffle every round.
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let pair = round / 2;
            let (action, cid, pod) = (
                if round % 2 == 0 {
                    Action::Add
                } else {
                    Action::Del
                },
                format!("bench-{pair}"),
                format!("bench-pod-{}", pair % 10),
            );
            for &b in &order {
                let run = child::run(
                    child::op_command(b, &data_of(b, size), action, &cid, &pod),
                    None,
                    Duration::from_secs(300),
                )?;
                let a = at.get_mut(&b).context("backend")?;
                let s = samples.get_mut(&b).context("backend")?;
                if run.ack().is_none() {
                    a.failures += 1;
                    if a.failure_examples.len() < 5 {
                        a.failure_examples.push(run.describe());
                    }
                    continue;
                }
                let (Some(opened), Some(committed), Some(closed)) = (
                    run.phase_at("opened"),
                    run.phase_at("committed"),
                    run.phase_at("closed"),
                ) else {
                    continue;
                };
                s[0].push(opened);
                s[1].push(committed - opened);
                s[2].push(closed - committed);
                s[3].push(run.elapsed.as_micros() as u64);
            }
        }
        eprintln!(
            "measure: {} per-process rounds at {size} leases in {:.0} s",
            plan.opens,
            started.elapsed().as_secs_f64()
        );
        if size == largest {
            for i in 0..plan.crash_opens {
                for i2 in (1..order.len()).rev() {
                    order.swap(i2, rng.below(i2 + 1));
                }
                for &b in &order {
                    let data = data_of(b, size);
                    let cid = format!("crash-{i}");
                    let pod = format!("crash-pod-{}", i % 10);
                    let a = at.get_mut(&b).context("backend")?;
                    if !crash_holding(b, &data, &cid, &pod)? {
                        a.failures += 1;
                        continue;
                    }
                    let run = child::run(
                        child::op_command(b, &data, Action::Del, &cid, &pod),
                        None,
                        Duration::from_secs(600),
                    )?;
                    match (run.ack(), run.phase_at("opened")) {
                        (Some(_), Some(opened)) => {
                            samples.get_mut(&b).context("backend")?[4].push(opened)
                        }
                        _ => {
                            a.failures += 1;
                            if a.failure_examples.len() < 5 {
                                a.failure_examples
                                    .push(format!("after a crash: {}", run.describe()));
                            }
                        }
                    }
                }
            }
        }
        for &b in backends {
            let mut a = at.remove(&b).context("backend")?;
            let [open, op, close, process, crash] = samples.remove(&b).context("backend")?;
            a.open = Dist::of(open);
            a.op = Dist::of(op);
            a.close = Dist::of(close);
            a.process = Dist::of(process);
            a.open_after_crash = Dist::of(crash);
            let (disk, apparent) = disk_usage(&data_of(b, size).join(NETWORK));
            a.disk_bytes_after_ops = disk;
            a.apparent_bytes_after_ops = apparent;
            stats.get_mut(&b).context("backend")?.sizes.push(a);
        }
    }
    // The agent: one long-lived opener at the largest size.
    for _ in 0..plan.agent_runs {
        let mut order = backends.to_vec();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for &b in &order {
            let out = Command::new(child::exe())
                .arg("agent-sim")
                .arg("--backend")
                .arg(b.name())
                .arg("--data-dir")
                .arg(data_of(b, largest))
                .arg("--ops")
                .arg(plan.agent_ops.to_string())
                .stderr(Stdio::null())
                .output()?;
            let sim: AgentSim = serde_json::from_slice(&out.stdout).with_context(|| {
                format!("agent-sim {b}: {}", String::from_utf8_lossy(&out.stdout))
            })?;
            eprintln!(
                "measure {b}: agent peak RSS {} KiB, open {:.2} s",
                sim.hwm_end_kib, sim.open_s
            );
            stats.get_mut(&b).context("backend")?.agent.push(sim);
        }
    }
    let mut out = Vec::new();
    for (b, s) in stats {
        std::fs::write(
            results.join(format!("measure.{b}.json")),
            serde_json::to_vec_pretty(&s)?,
        )?;
        out.push(s);
    }
    Ok(out)
}
