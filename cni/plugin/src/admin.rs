//! `ipkeep list` and `ipkeep release`: what an admin runs by hand on a node to see and fix
//! the addresses held on it.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ipkeep_ipam::{
    Lease, LeaseCounts, LeaseState, NetworkDir, NetworkNameError, RangeSet, Reading, StoreError,
    StoreRead, allocator,
};

use crate::stores::{NotServed, Stores};
use crate::timings::Timings;
use serde::{Deserialize, Serialize};

use crate::netconf::{DEFAULT_AGENT_SOCKET, DEFAULT_DATA_DIR, parse_lock_timeout};

/// ipkeep — host-local compatible CNI IPAM that gives a rebuilt StatefulSet pod its address back.
///
/// Run by the container runtime with CNI_COMMAND set, it is a CNI plugin. Run by hand, these
/// subcommands inspect and repair a node's state.
#[derive(Debug, Parser)]
#[command(name = "ipkeep", version, about, long_about)]
pub struct Cli {
    /// The node agent's socket. When the agent answers there, the command runs inside it (it
    /// keeps the store open, so it never has to be stopped); otherwise ipkeep opens the store
    /// itself. Empty: never use the agent.
    #[arg(long, global = true, env = "IPKEEP_AGENT_SOCKET", default_value = DEFAULT_AGENT_SOCKET)]
    pub agent_socket: String,
    /// What to do.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// Which network's store (sent to the agent resolved, so its environment never leaks in).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// Network name (the "name" of the CNI configuration).
    #[arg(long, env = "IPKEEP_NETWORK")]
    pub network: String,
    /// The ipam.dataDir of that configuration.
    #[arg(long, env = "IPKEEP_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// How long to wait for running plugin commands to finish.
    #[arg(long, env = "IPKEEP_LOCK_TIMEOUT", default_value = "10s", value_parser = parse_lock_timeout)]
    pub lock_timeout: Duration,
}

/// Why an admin subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The store could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The report could not be written.
    #[error(transparent)]
    Write(#[from] std::io::Error),
    /// A lease or the report's header could not be put in JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The range sets the last ADD recorded do not read.
    #[error("failed to read the recorded range sets")]
    RangeSets(#[source] serde_json::Error),
    /// `--network` is no network name.
    #[error(transparent)]
    Network(#[from] NetworkNameError),
    /// Whoever serves the command does not lend this network's store: run it elsewhere.
    #[error(transparent)]
    NotServed(#[from] NotServed),
    /// `--pod` is not `NAMESPACE/NAME`.
    #[error("--pod must be NAMESPACE/NAME, got {0:?}")]
    Pod(String),
    /// The network has no store under `--data-dir`.
    #[error(
        "no ipkeep state for network {network:?} under {} (check --network and --data-dir against the CNI configuration)",
        data_dir.display()
    )]
    NoState {
        /// `--network`.
        network: String,
        /// `--data-dir`.
        data_dir: PathBuf,
    },
}

/// An admin subcommand, as sent to the agent (`Request::Admin`).
#[derive(Debug, Clone, PartialEq, Eq, Subcommand, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum AdminCommand {
    /// Show every address of a network: in use (by which container and pod) or held for a
    /// deleted pod (until when), and free counts per range set.
    List {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Free the addresses held for a deleted pod now, instead of waiting for its retention to
    /// run out.
    Release {
        #[command(flatten)]
        target: Target,
        /// The pod, as NAMESPACE/NAME.
        #[arg(long)]
        pod: String,
        /// Only this interface of the pod.
        #[arg(long)]
        ifname: Option<String>,
        /// Also free addresses the pod is using right now (only for pods that no longer exist
        /// but whose DEL never arrived).
        #[arg(long)]
        include_active: bool,
    },
}

impl AdminCommand {
    /// The network the command is about.
    pub fn target_mut(&mut self) -> &mut Target {
        match self {
            AdminCommand::List { target, .. } | AdminCommand::Release { target, .. } => target,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RangeSetReport {
    ranges: String,
    capacity: String,
    in_use: usize,
    held: usize,
    free: String,
}

/// How the range sets a network was last configured with are used, counted lease by lease.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    sets: Vec<(RangeSet, LeaseCounts)>,
}

impl Usage {
    /// Empty counts for the range sets recorded in `store`.
    pub fn of(store: &dyn StoreRead) -> Result<Self, AdminError> {
        let sets: Vec<RangeSet> = match store.range_sets()? {
            Some(json) => serde_json::from_str(&json).map_err(AdminError::RangeSets)?,
            None => Vec::new(),
        };
        Ok(Usage {
            sets: sets
                .into_iter()
                .map(|s| (s, LeaseCounts::default()))
                .collect(),
        })
    }

    /// Counts one lease.
    pub fn add(&mut self, lease: &Lease) {
        for (set, counts) in &mut self.sets {
            if set.range_of(lease.ip).is_some() {
                match lease.state {
                    LeaseState::Active => counts.active += 1,
                    LeaseState::Held { .. } => counts.held += 1,
                }
            }
        }
    }

    /// The counts per range set.
    pub fn report(&self) -> Vec<RangeSetUsage> {
        self.sets
            .iter()
            .map(|(set, counts)| RangeSetUsage {
                ranges: set.to_string(),
                capacity: set.capacity(),
                in_use: counts.active,
                held: counts.held,
                free: set
                    .capacity()
                    .saturating_sub((counts.active + counts.held) as u128),
            })
            .collect()
    }
}

/// How one range set is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSetUsage {
    /// The range set, as `start-end,…`.
    pub ranges: String,
    /// Addresses it can hand out.
    pub capacity: u128,
    /// Active leases in it.
    pub in_use: usize,
    /// Held leases in it.
    pub held: usize,
    /// Addresses nobody has.
    pub free: u128,
}

fn until_text(lease: &Lease, now: u64) -> String {
    match lease.state {
        LeaseState::Active => "-".into(),
        LeaseState::Held { until: None } => "forever".into(),
        LeaseState::Held { until: Some(t) } if t <= now => "expired".into(),
        LeaseState::Held { until: Some(t) } => format!(
            "{} (in {})",
            ipkeep_values::time::rfc3339(t),
            ipkeep_values::time::duration(t - now)
        ),
    }
}

/// Writes the report of `store` as it reads it, so a store of any size streams through in
/// constant memory.
fn write_list(
    out: &mut dyn Write,
    target: &Target,
    store: &dyn StoreRead,
    json: bool,
    now: u64,
) -> Result<(), AdminError> {
    let mut usage = Usage::of(store)?;
    let mut first = true;
    if json {
        write!(
            out,
            "{{\"network\":{},\"dataDir\":{},\"leases\":[",
            serde_json::to_string(&target.network)?,
            serde_json::to_string(&target.data_dir.display().to_string())?
        )?;
    } else {
        writeln!(
            out,
            "network {} ({})",
            target.network,
            target.data_dir.display()
        )?;
        writeln!(
            out,
            "{:<16}  {:<6}  {:<24}  {:<24}  UNTIL",
            "ADDRESS", "STATE", "CONTAINER/IFNAME", "POD"
        )?;
    }
    store.scan(&mut |lease| {
        usage.add(&lease);
        let written = if json {
            let sep = if first { "\n" } else { ",\n" };
            serde_json::to_string(&lease)
                .map_err(std::io::Error::other)
                .and_then(|l| write!(out, "{sep}{l}"))
        } else {
            writeln!(
                out,
                "{:<16}  {:<6}  {:<24}  {:<24}  {}",
                lease.ip.to_string(),
                if lease.is_active() { "in-use" } else { "held" },
                lease.owner.to_string(),
                lease
                    .pod
                    .as_ref()
                    .map_or("-".to_string(), ToString::to_string),
                until_text(&lease, now)
            )
        };
        first = false;
        written.map_err(|e| StoreError::Io {
            action: "write",
            path: "the report".into(),
            source: e,
        })
    })?;
    let sets = usage.report();
    if json {
        let sets: Vec<RangeSetReport> = sets
            .into_iter()
            .map(|u| RangeSetReport {
                ranges: u.ranges,
                capacity: u.capacity.to_string(),
                in_use: u.in_use,
                held: u.held,
                free: u.free.to_string(),
            })
            .collect();
        writeln!(out, "\n],\"rangeSets\":{}}}", serde_json::to_string(&sets)?)?;
    } else {
        for (i, s) in sets.iter().enumerate() {
            writeln!(
                out,
                "range set {i} ({}): {} addresses, {} in use, {} held, {} free",
                s.ranges, s.capacity, s.in_use, s.held, s.free
            )?;
        }
    }
    Ok(())
}

/// Runs an admin subcommand, writing its report to `out`; returns how many addresses it freed.
pub fn run<S: Stores>(
    stores: &S,
    command: AdminCommand,
    out: &mut dyn Write,
    reading: &Reading,
) -> Result<usize, AdminError> {
    let mut released = 0;
    match command {
        AdminCommand::List { target, json } => {
            let dir = target_dir(stores, &target)?;
            stores.read(&dir, target.lock_timeout, |store| {
                let now = ipkeep_ipam::clock::advance(store.clock()?.as_ref(), reading).now;
                write_list(out, &target, store, json, now)
            })?;
        }
        AdminCommand::Release {
            target,
            pod,
            ifname,
            include_active,
        } => {
            let Some((ns, name)) = pod
                .split_once('/')
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
            else {
                return Err(AdminError::Pod(pod));
            };
            let dir = target_dir(stores, &target)?;
            let outcome = stores.with(
                &dir,
                target.lock_timeout,
                &mut Timings::default(),
                |store| {
                    Ok::<_, AdminError>(allocator::release_pod(
                        store,
                        ns,
                        name,
                        ifname.as_deref(),
                        include_active,
                        reading,
                    )?)
                },
            )?;
            released = outcome.released.len();
            let ips = |ls: &[Lease]| ls.iter().map(|l| l.ip).collect::<Vec<IpAddr>>();
            for ip in ips(&outcome.released) {
                writeln!(out, "released {ip} (pod {pod})")?;
            }
            for ip in ips(&outcome.still_active) {
                writeln!(
                    out,
                    "kept {ip}: pod {pod} is using it (add --include-active if the pod is really gone)"
                )?;
            }
            if outcome.released.is_empty() && outcome.still_active.is_empty() {
                writeln!(
                    out,
                    "nothing held for pod {pod} on network {}",
                    target.network
                )?;
            }
        }
    }
    Ok(released)
}

/// The target network's directory, which must have a store the stores lend.
fn target_dir<S: Stores>(stores: &S, target: &Target) -> Result<NetworkDir, AdminError> {
    let dir = NetworkDir::new(&target.data_dir, &target.network)?;
    if !stores.exists(&dir) {
        return Err(AdminError::NoState {
            network: target.network.clone(),
            data_dir: target.data_dir.clone(),
        });
    }
    stores.serves(&dir)?;
    Ok(dir)
}
