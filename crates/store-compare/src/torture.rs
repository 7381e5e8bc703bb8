//! `torture`: thousands of SIGKILLs at random moments of real `op` processes — during the lock,
//! the open (and the first creation of the store), the allocation and commit, and the close —
//! and after every kill, the next command must succeed. Every epoch ends with a dump of the
//! store checked against every acknowledgement (see [`crate::model`]).
//!
//! Backends are interleaved epoch by epoch so the machine's load falls on each alike.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::{Backend, NETWORK};
use crate::child::{self, Run};
use crate::model::Model;
use crate::rng::Rng;
use crate::workload::{Action, Dump};

/// How hard to push.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Kills during ordinary commands, per backend.
    pub steady_kills: usize,
    /// Kills while the store is being created (fresh directory every time), per backend.
    pub create_kills: usize,
    /// At most this many kills per epoch (fresh store, then a dump and the checks).
    pub epoch_kills: usize,
    /// Pods per epoch.
    pub pods: usize,
    /// Held leases filled into each ordinary epoch's store before it starts (bigger files:
    /// longer snapshots for sled, longer repairs for redb).
    pub prefill: u32,
    /// Names the result files `torture<label>.<backend>.json`.
    pub label: String,
    /// Seed of the random moments.
    pub seed: u64,
}

/// What happened to one backend.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// The backend.
    pub backend: String,
    /// Held leases in each ordinary epoch's store before it started.
    pub prefill: u32,
    /// SIGKILLs delivered to a running command.
    pub kills: usize,
    /// …of which while the store was being created.
    pub kills_creating: usize,
    /// Where the kills landed: the last phase the command reported (`create/…`: in a
    /// creation epoch, where every command starts on an empty directory).
    pub kills_by_phase: BTreeMap<String, usize>,
    /// Commands that finished before their kill moment (not counted as kills).
    pub finished_before_kill: usize,
    /// Commands run after a kill.
    pub next_ops: usize,
    /// …that failed on their first attempt.
    pub next_op_failed: usize,
    /// Stores that stayed unusable: the next command and three retries after it all failed.
    pub bricked: usize,
    /// Kills after which a `snap.*.generating` file was left (sled).
    pub stale_snapshots_left: usize,
    /// Examples of failures of the command after a kill.
    pub failure_examples: Vec<String>,
    /// Commands that failed without being killed (other than right after a kill).
    pub unkilled_failures: usize,
    /// Dumps checked against the acknowledgements.
    pub verifies: usize,
    /// Acknowledged commands.
    pub acknowledged: usize,
    /// Violations of the promises (lost acknowledged commands, two owners, …).
    pub violations: usize,
    /// Examples of them.
    pub violation_examples: Vec<String>,
    /// Processes started.
    pub processes: usize,
    /// Median time of an un-killed command right after a kill, ms.
    pub next_op_median_ms: f64,
    /// Longest such command, ms.
    pub next_op_max_ms: f64,
    /// Wall time spent on this backend, s.
    pub wall_s: f64,
    #[serde(skip)]
    next_op_ms: Vec<f64>,
}

impl Stats {
    fn example(list: &mut Vec<String>, what: String) {
        if list.len() < 12 && !list.contains(&what) {
            list.push(what);
        }
    }

    fn violation(&mut self, what: String) {
        self.violations += 1;
        Self::example(&mut self.violation_examples, what);
    }
}

fn net_dir(data: &Path) -> PathBuf {
    data.join(NETWORK)
}

fn wipe(data: &Path) -> anyhow::Result<()> {
    match std::fs::remove_dir_all(net_dir(data)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

fn stale_snapshots(backend: Backend, data: &Path) -> bool {
    if backend == Backend::Redb {
        return false;
    }
    std::fs::read_dir(backend.db_path(&net_dir(data)))
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("snap.") && name.ends_with(".generating")
            })
        })
        .unwrap_or(false)
}

const TIMEOUT: Duration = Duration::from_secs(120);

fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One backend's state across epochs.
struct Runner {
    backend: Backend,
    data: PathBuf,
    stats: Stats,
    epoch: usize,
    steady_done: usize,
    create_done: usize,
    creating: bool,
}

impl Runner {
    fn op(
        &mut self,
        model: &mut Model,
        pod: usize,
        kill_after: Option<Duration>,
    ) -> anyhow::Result<(Run, bool)> {
        let (action, cid) = model.next(pod);
        let existed = self.backend.db_path(&net_dir(&self.data)).exists();
        let cmd = child::op_command(self.backend, &self.data, action, &cid, model.pod_name(pod));
        let run = child::run(cmd, kill_after, TIMEOUT)?;
        self.stats.processes += 1;
        model.record(pod, action, &cid, &run);
        if run.killed() {
            self.stats.kills += 1;
            let phase = match run.last_phase().as_deref() {
                None | Some("start") => "start (before the lock)".to_string(),
                Some("locked") if !existed => {
                    self.stats.kills_creating += 1;
                    "locked (creating the store)".to_string()
                }
                Some("locked") => "locked (opening the store)".to_string(),
                Some("opened") => "opened (allocating, committing)".to_string(),
                Some("committed") => "committed (acknowledging, closing)".to_string(),
                Some(other) => other.to_string(),
            };
            let phase = if self.creating {
                format!("create/{phase}")
            } else {
                phase
            };
            *self.stats.kills_by_phase.entry(phase).or_default() += 1;
            if stale_snapshots(self.backend, &self.data) {
                self.stats.stale_snapshots_left += 1;
            }
        } else if kill_after.is_some() {
            self.stats.finished_before_kill += 1;
        }
        Ok((run, action == Action::Add))
    }

    /// After a kill: the next command must succeed. Returns false if the store stayed unusable.
    fn next_after_kill(&mut self, model: &mut Model, rng: &mut Rng) -> anyhow::Result<bool> {
        self.stats.next_ops += 1;
        for attempt in 0..4 {
            let pod = rng.below(model.len());
            let (run, _) = self.op(model, pod, None)?;
            if run.ack().is_some() {
                self.stats.next_op_ms.push(run.elapsed.as_secs_f64() * 1e3);
                return Ok(true);
            }
            if attempt == 0 {
                self.stats.next_op_failed += 1;
            }
            Stats::example(&mut self.stats.failure_examples, run.describe());
        }
        self.stats.bricked += 1;
        Ok(false)
    }

    fn verify(&mut self, model: &Model) -> anyhow::Result<()> {
        let names = self.data.join("names.json");
        std::fs::write(&names, serde_json::to_vec(&model.names())?)?;
        let run = child::run(
            child::dump_command(self.backend, &self.data, Some(&names)),
            None,
            TIMEOUT,
        )?;
        self.stats.processes += 1;
        let dump: Dump = serde_json::from_str(run.stdout.trim()).unwrap_or_else(|_| Dump {
            error: Some(run.describe()),
            ..Dump::default()
        });
        self.stats.verifies += 1;
        self.stats.acknowledged += model.acked;
        for v in model.verify(&dump) {
            self.stats.violation(format!("epoch {}: {v}", self.epoch));
        }
        Ok(())
    }

    fn recent_median_ms(&self) -> f64 {
        let n = self.stats.next_op_ms.len();
        median(&self.stats.next_op_ms[n.saturating_sub(31)..])
    }

    /// Kills while the store is created: a fresh directory each time.
    fn create_epoch(&mut self, kills: usize, rng: &mut Rng) -> anyhow::Result<()> {
        self.epoch += 1;
        self.creating = true;
        // How long a creating command takes, un-killed.
        let mut create_ms = Vec::new();
        for i in 0..3 {
            wipe(&self.data)?;
            let mut model = Model::new(&format!("w{}-{i}", self.epoch), 1);
            let (run, _) = self.op(&mut model, 0, None)?;
            if run.ack().is_none() {
                self.stats.unkilled_failures += 1;
                Stats::example(
                    &mut self.stats.failure_examples,
                    format!("creating: {}", run.describe()),
                );
            }
            create_ms.push(run.elapsed.as_secs_f64() * 1e3);
        }
        let window = median(&create_ms) * 1.2;
        let mut done = 0;
        while done < kills {
            wipe(&self.data)?;
            let mut model = Model::new(&format!("k{}-{done}", self.epoch), 2);
            let delay = Duration::from_secs_f64(rng.unit() * window / 1e3);
            let (run, _) = self.op(&mut model, 0, Some(delay))?;
            if !run.killed() {
                if run.ack().is_none() {
                    self.stats.unkilled_failures += 1;
                }
                continue;
            }
            done += 1;
            self.create_done += 1;
            // The next command, for another pod, must succeed on whatever the kill left.
            self.stats.next_ops += 1;
            let (next, _) = self.op(&mut model, 1, None)?;
            if next.ack().is_some() {
                self.stats.next_op_ms.push(next.elapsed.as_secs_f64() * 1e3);
            } else {
                self.stats.next_op_failed += 1;
                Stats::example(
                    &mut self.stats.failure_examples,
                    format!("after a kill while creating: {}", next.describe()),
                );
                let mut recovered = false;
                for _ in 0..3 {
                    let (again, _) = self.op(&mut model, 1, None)?;
                    if again.ack().is_some() {
                        recovered = true;
                        break;
                    }
                }
                if !recovered {
                    self.stats.bricked += 1;
                }
            }
            self.verify(&model)?;
        }
        Ok(())
    }

    /// Kills during ordinary commands on one fresh store.
    fn steady_epoch(
        &mut self,
        kills: usize,
        pods: usize,
        prefill: u32,
        rng: &mut Rng,
    ) -> anyhow::Result<()> {
        self.epoch += 1;
        self.creating = false;
        wipe(&self.data)?;
        if prefill > 0 {
            crate::workload::fill(self.backend, &self.data, prefill)?;
        }
        let mut model = Model::new(&format!("e{}", self.epoch), pods);
        // Warm up: create the store and measure a command.
        let mut warm = Vec::new();
        for _ in 0..5 {
            let pod = rng.below(pods);
            let (run, _) = self.op(&mut model, pod, None)?;
            if run.ack().is_none() {
                self.stats.unkilled_failures += 1;
                Stats::example(
                    &mut self.stats.failure_examples,
                    format!("warm-up: {}", run.describe()),
                );
            }
            warm.push(run.elapsed.as_secs_f64() * 1e3);
        }
        let mut window = median(&warm) * 1.2;
        let mut done = 0;
        while done < kills {
            let pod = rng.below(pods);
            let delay = Duration::from_secs_f64(rng.unit() * window / 1e3);
            let (run, _) = self.op(&mut model, pod, Some(delay))?;
            if !run.killed() {
                if run.ack().is_none() {
                    self.stats.unkilled_failures += 1;
                    Stats::example(
                        &mut self.stats.failure_examples,
                        format!("un-killed: {}", run.describe()),
                    );
                }
                continue;
            }
            done += 1;
            self.steady_done += 1;
            if !self.next_after_kill(&mut model, rng)? {
                break;
            }
            window = self.recent_median_ms().max(0.5) * 1.2;
        }
        self.verify(&model)
    }
}

/// Runs the torture on every backend, interleaved; writes `torture.<backend>.json` into
/// `results` and returns the stats.
pub fn run(
    backends: &[Backend],
    work: &Path,
    plan: &Plan,
    results: &Path,
) -> anyhow::Result<Vec<Stats>> {
    let mut rng = Rng::new(plan.seed);
    let mut runners: Vec<Runner> = backends
        .iter()
        .map(|b| {
            let data = work.join(format!("torture{}-{b}", plan.label));
            Runner {
                backend: *b,
                data,
                stats: Stats {
                    backend: b.name().to_string(),
                    prefill: plan.prefill,
                    ..Stats::default()
                },
                epoch: 0,
                steady_done: 0,
                create_done: 0,
                creating: false,
            }
        })
        .collect();
    for r in &runners {
        std::fs::create_dir_all(&r.data)?;
    }
    let create_chunk = plan.epoch_kills.min(plan.create_kills).max(1);
    loop {
        let mut busy = false;
        for r in runners.iter_mut() {
            let started = Instant::now();
            if r.create_done < plan.create_kills {
                busy = true;
                let n = create_chunk.min(plan.create_kills - r.create_done);
                r.create_epoch(n, &mut rng)?;
            }
            if r.steady_done < plan.steady_kills {
                busy = true;
                let n = plan.epoch_kills.min(plan.steady_kills - r.steady_done);
                r.steady_epoch(n, plan.pods, plan.prefill, &mut rng)?;
            }
            r.stats.wall_s += started.elapsed().as_secs_f64();
            eprintln!(
                "torture{} {}: {} kills ({} creating), {} bricked, {} violations, {:.0} s",
                plan.label,
                r.backend,
                r.stats.kills,
                r.stats.kills_creating,
                r.stats.bricked,
                r.stats.violations,
                r.stats.wall_s
            );
        }
        if !busy {
            break;
        }
    }
    let mut out = Vec::new();
    for mut r in runners {
        let mut ms = std::mem::take(&mut r.stats.next_op_ms);
        ms.sort_by(f64::total_cmp);
        r.stats.next_op_median_ms = ms.get(ms.len() / 2).copied().unwrap_or(0.0);
        r.stats.next_op_max_ms = ms.last().copied().unwrap_or(0.0);
        std::fs::write(
            results.join(format!("torture{}.{}.json", plan.label, r.backend)),
            serde_json::to_vec_pretty(&r.stats)?,
        )?;
        out.push(r.stats);
    }
    Ok(out)
}
