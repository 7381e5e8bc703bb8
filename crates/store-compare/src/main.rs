//! `store-compare`: one harness for the [`ipkeep_ipam::store::Store`] trait, run on sled 0.34.7
//! (as shipped, and with the fixes of [`sled_store`]) and on redb (today's `DiskStore`). Every
//! command goes through the real allocator (`ipkeep_ipam::allocator::{add, del}`) under
//! `NetworkDir::lock`, in its own process, as the CNI plugin runs it.
//!
//! A measurement tool for `docs/store.md`, not part of CI: `scripts/store-compare.sh` builds it
//! and runs every check on every backend.

mod backend;
mod child;
mod damage;
mod durability;
mod enospc;
mod measure;
mod model;
mod report;
mod rng;
mod sled_store;
mod stats;
mod torture;
mod workload;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use clap::{Parser, Subcommand};

use backend::{Backend, Opener};
use workload::Action;

static STARTED: OnceLock<Instant> = OnceLock::new();

/// Reports reaching a phase on stderr (`@name µs-since-main`), so a parent that kills this
/// process knows where the kill landed.
pub fn phase(name: &str) {
    let us = STARTED.get_or_init(Instant::now).elapsed().as_micros();
    eprintln!("@{name} {us}");
}

#[derive(Debug, Parser)]
#[command(
    about = "Compare ipkeep's node stores (sled, sled-fixed, redb). A measurement tool, not part of CI."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// One CNI command: lock, open, ADD or DEL through the allocator, commit, `ACK` on stdout.
    Op {
        #[arg(long, value_enum)]
        backend: Backend,
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, value_enum, default_value = "plugin")]
        opener: Opener,
        /// After acknowledging, keep the store open until killed.
        #[arg(long)]
        hold: bool,
        #[arg(value_enum)]
        action: Action,
        #[arg(long)]
        cid: String,
        #[arg(long)]
        pod: String,
    },
    /// Open the store, cross-check its indexes, print every lease as JSON.
    Dump {
        #[arg(long, value_enum)]
        backend: Backend,
        #[arg(long)]
        data_dir: PathBuf,
        /// JSON {cids, pods} to look up through the indexes.
        #[arg(long)]
        names: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "plugin")]
        opener: Opener,
    },
    /// Fill a store with held leases (1,000 per commit).
    Fill {
        #[arg(long, value_enum)]
        backend: Backend,
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long)]
        leases: u32,
    },
    /// Behave like the node agent: open once, run ADD/DEL commands, report peak RSS.
    AgentSim {
        #[arg(long, value_enum)]
        backend: Backend,
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, default_value_t = 1000)]
        ops: usize,
    },
    /// SIGKILL commands at random moments, thousands of times.
    Torture {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 1800)]
        steady_kills: usize,
        #[arg(long, default_value_t = 300)]
        create_kills: usize,
        #[arg(long, default_value_t = 150)]
        epoch_kills: usize,
        #[arg(long, default_value_t = 24)]
        pods: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Held leases filled into each ordinary epoch's store first.
        #[arg(long, default_value_t = 0)]
        prefill: u32,
        /// Result files are `torture<label>.<backend>.json`.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// ENOSPC at every page a command writes (tmpfs in a private mount namespace; root).
    Enospc {
        #[command(flatten)]
        common: Common,
        /// Give up on a command that still fails with this many free pages.
        #[arg(long, default_value_t = 1024)]
        max_pages: u64,
    },
    /// strace one command: fsync/fdatasync before the acknowledgement?
    Durability {
        #[command(flatten)]
        common: Common,
    },
    /// Open times, file sizes, agent RSS.
    Measure {
        #[command(flatten)]
        common: Common,
        #[arg(long, value_delimiter = ',', default_value = "1000,60000")]
        sizes: Vec<u32>,
        #[arg(long, default_value_t = 100)]
        opens: usize,
        #[arg(long, default_value_t = 10)]
        crash_opens: usize,
        #[arg(long, default_value_t = 1000)]
        agent_ops: usize,
        #[arg(long, default_value_t = 3)]
        agent_runs: usize,
    },
    /// Change one byte of a clean store, then run a command on it (plugin and agent opens).
    Damage {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 200)]
        trials: usize,
        #[arg(long, default_value_t = 1000)]
        leases: u32,
    },
    /// Print the markdown table and the raw numbers.
    Report {
        #[arg(long)]
        results: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct Common {
    /// Backends, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sled,sled-fixed,redb"
    )]
    backends: Vec<Backend>,
    /// Scratch directory (stores are created under it).
    #[arg(long)]
    work: PathBuf,
    /// Where the JSON results go.
    #[arg(long)]
    results: PathBuf,
}

impl Common {
    fn prepare(&self) -> anyhow::Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(&self.work)?;
        std::fs::create_dir_all(&self.results)?;
        Ok((self.work.canonicalize()?, self.results.canonicalize()?))
    }
}

fn main() -> anyhow::Result<()> {
    STARTED.get_or_init(Instant::now);
    let cli = Cli::parse();
    match cli.command {
        Cmd::Op {
            backend,
            data_dir,
            opener,
            hold,
            action,
            cid,
            pod,
        } => std::process::exit(workload::op(
            backend, &data_dir, opener, action, &cid, &pod, hold,
        )),
        Cmd::Dump {
            backend,
            data_dir,
            names,
            opener,
        } => std::process::exit(workload::dump(
            backend,
            &data_dir,
            names.as_deref(),
            opener,
        )?),
        Cmd::Fill {
            backend,
            data_dir,
            leases,
        } => {
            let secs = workload::fill(backend, &data_dir, leases)?;
            println!("filled {leases} leases in {secs:.2} s");
        }
        Cmd::AgentSim {
            backend,
            data_dir,
            ops,
        } => workload::agent_sim(backend, &data_dir, ops)?,
        Cmd::Torture {
            common,
            steady_kills,
            create_kills,
            epoch_kills,
            pods,
            seed,
            prefill,
            label,
        } => {
            let (work, results) = common.prepare()?;
            let plan = torture::Plan {
                steady_kills,
                create_kills,
                epoch_kills,
                pods,
                seed,
                prefill,
                label,
            };
            torture::run(&common.backends, &work, &plan, &results)?;
        }
        Cmd::Enospc { common, max_pages } => {
            let (work, results) = common.prepare()?;
            enospc::run(&common.backends, &work, &results, max_pages)?;
        }
        Cmd::Durability { common } => {
            let (work, results) = common.prepare()?;
            durability::run(&common.backends, &work, &results)?;
        }
        Cmd::Measure {
            common,
            sizes,
            opens,
            crash_opens,
            agent_ops,
            agent_runs,
        } => {
            let (work, results) = common.prepare()?;
            let plan = measure::Plan {
                sizes,
                opens,
                crash_opens,
                agent_ops,
                agent_runs,
            };
            measure::run(&common.backends, &work, &plan, &results)?;
        }
        Cmd::Damage {
            common,
            trials,
            leases,
        } => {
            let (work, results) = common.prepare()?;
            damage::run(&common.backends, &work, &results, trials, leases)?;
        }
        Cmd::Report { results } => report::print(&results)?,
    }
    Ok(())
}
