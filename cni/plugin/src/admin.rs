//! `ipkeep list` and `ipkeep release`: what an admin runs by hand on a node to see and fix
//! the addresses held on it.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use ipkeep_ipam::{DiskStore, Lease, LeaseState, NetworkDir, RangeSet, Store, allocator};

use crate::plugin::Timings;
use crate::stores::Stores;
use serde::{Deserialize, Serialize};

use crate::netconf::DEFAULT_DATA_DIR;

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
    #[arg(long, global = true, env = "IPKEEP_AGENT_SOCKET", default_value = crate::proto::DEFAULT_SOCKET)]
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
    network: String,
    /// The ipam.dataDir of that configuration.
    #[arg(long, env = "IPKEEP_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// How long to wait for running plugin commands to finish.
    #[arg(long, env = "IPKEEP_LOCK_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    lock_timeout: Duration,
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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RangeSetReport {
    ranges: String,
    capacity: String,
    in_use: usize,
    held: usize,
    free: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListReport {
    network: String,
    data_dir: String,
    leases: Vec<Lease>,
    range_sets: Vec<RangeSetReport>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs `f` on the target network's store, which must exist.
fn with_store<S: Stores, R>(
    stores: &S,
    target: &Target,
    f: impl FnOnce(&mut DiskStore) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let dir = NetworkDir::new(&target.data_dir, &target.network)?;
    if !dir.exists() {
        bail!(
            "no ipkeep state for network {:?} under {} (check --network and --data-dir against the CNI configuration)",
            target.network,
            target.data_dir.display()
        );
    }
    stores.with(&dir, target.lock_timeout, &mut Timings::default(), f)
}

fn until_text(lease: &Lease, now: u64) -> String {
    match lease.state {
        LeaseState::Active => "-".into(),
        LeaseState::Held { until: None } => "forever".into(),
        LeaseState::Held { until: Some(t) } if t <= now => "expired".into(),
        LeaseState::Held { until: Some(t) } => {
            let at = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(t));
            format!(
                "{at} (in {})",
                humantime::format_duration(Duration::from_secs(t - now))
            )
        }
    }
}

/// Usage of each range set the network was last configured with.
pub fn range_set_usage(store: &DiskStore, leases: &[Lease]) -> anyhow::Result<Vec<RangeSetUsage>> {
    let sets: Vec<RangeSet> = match store.range_sets()? {
        Some(json) => {
            serde_json::from_str(&json).context("failed to read the recorded range sets")?
        }
        None => Vec::new(),
    };
    Ok(sets
        .iter()
        .map(|set| {
            let inside: Vec<&Lease> = leases
                .iter()
                .filter(|l| set.range_of(l.ip).is_some())
                .collect();
            let counts = ipkeep_ipam::LeaseCounts::of(inside.iter().copied());
            RangeSetUsage {
                ranges: set.to_string(),
                capacity: set.capacity(),
                in_use: counts.active,
                held: counts.held,
                free: set.capacity().saturating_sub(inside.len() as u128),
            }
        })
        .collect())
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

fn report(target: &Target, store: &mut DiskStore) -> anyhow::Result<ListReport> {
    let leases = store.all()?;
    let range_sets = range_set_usage(store, &leases)?
        .into_iter()
        .map(|u| RangeSetReport {
            ranges: u.ranges,
            capacity: u.capacity.to_string(),
            in_use: u.in_use,
            held: u.held,
            free: u.free.to_string(),
        })
        .collect();
    Ok(ListReport {
        network: target.network.clone(),
        data_dir: target.data_dir.display().to_string(),
        leases,
        range_sets,
    })
}

fn print_table(out: &mut dyn Write, r: &ListReport) -> anyhow::Result<()> {
    let now = now();
    writeln!(out, "network {} ({})", r.network, r.data_dir)?;
    let mut rows = vec![["ADDRESS", "STATE", "CONTAINER/IFNAME", "POD", "UNTIL"].map(String::from)];
    rows.extend(r.leases.iter().map(|l| {
        [
            l.ip.to_string(),
            if l.is_active() { "in-use" } else { "held" }.to_string(),
            l.owner.to_string(),
            l.pod.as_ref().map_or("-".to_string(), ToString::to_string),
            until_text(l, now),
        ]
    }));
    let width = |col: usize| rows.iter().map(|r| r[col].len()).max().unwrap_or(0);
    let widths = [width(0), width(1), width(2), width(3)];
    for row in &rows {
        writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        )?;
    }
    for (i, s) in r.range_sets.iter().enumerate() {
        writeln!(
            out,
            "range set {i} ({}): {} addresses, {} in use, {} held, {} free",
            s.ranges, s.capacity, s.in_use, s.held, s.free
        )?;
    }
    Ok(())
}

/// Runs an admin subcommand, writing its report to `out`; returns how many addresses it freed.
pub fn run<S: Stores>(
    stores: &S,
    command: AdminCommand,
    out: &mut dyn Write,
) -> anyhow::Result<usize> {
    let mut released = 0;
    match command {
        AdminCommand::List { target, json } => {
            let r = with_store(stores, &target, |store| report(&target, store))?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
            } else {
                print_table(out, &r)?;
            }
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
                bail!("--pod must be NAMESPACE/NAME, got {pod:?}");
            };
            let outcome = with_store(stores, &target, |store| {
                Ok(allocator::release_pod(
                    store,
                    ns,
                    name,
                    ifname.as_deref(),
                    include_active,
                )?)
            })?;
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
