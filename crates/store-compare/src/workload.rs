//! What the child processes do: one CNI ADD or DEL through the real allocator (`op`), a dump of
//! the store with its indexes cross-checked (`dump`), a bulk fill for the size measurements
//! (`fill`), and a long-lived opener that behaves like the node agent (`agent-sim`).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ipkeep_ipam::disk::system_reading;
use ipkeep_ipam::store::{Commit, LeaseChange, Store, StoreError};
use ipkeep_ipam::{
    AddRequest, AllocError, Attachment, Lease, LeaseState, PodIdentity, PodRef, RangeSet,
    RangeSpec, Retention, allocator,
};
use serde::{Deserialize, Serialize};

use crate::backend::{self, Backend, Opener};

/// The interface every attachment uses.
pub const IFNAME: &str = "eth0";
/// The namespace of every pod.
pub const NAMESPACE: &str = "ns";

/// One range set, 10.0.0.0/16: room for 60k leases and then some.
pub fn range_sets() -> Vec<RangeSet> {
    let spec = RangeSpec {
        subnet: Some("10.0.0.0/16".into()),
        ..RangeSpec::default()
    };
    let set = RangeSet::from_specs(&[spec]);
    #[allow(clippy::expect_used)]
    let set = set.expect("a valid range");
    vec![set]
}

fn attachment(cid: &str) -> Attachment {
    Attachment {
        container_id: cid.to_string(),
        ifname: IFNAME.to_string(),
    }
}

fn pod_ref(pod: &str) -> PodRef {
    PodRef {
        namespace: NAMESPACE.to_string(),
        name: pod.to_string(),
        uid: None,
        persistent_pod_state: Some("pps".to_string()),
        confirmed: true,
    }
}

/// A CNI ADD of `cid` for `pod`, retention forever (the pod gets its address back after DEL).
#[allow(clippy::result_large_err)] // the allocator's own error type, as it returns it
pub fn add(
    store: &mut dyn Store,
    sets: &[RangeSet],
    cid: &str,
    pod: &str,
) -> Result<Vec<IpAddr>, AllocError> {
    let req = AddRequest {
        range_sets: sets,
        owner: attachment(cid),
        pod: Some(pod_ref(pod)),
        retention: Retention::Forever,
        requested: &[],
        netns: None,
        netns_exists: &|_| false,
        reuse_cooldown: 0,
    };
    let outcome = allocator::add(store, &req, &system_reading())?;
    Ok(outcome.assignments.iter().map(|a| a.ip).collect())
}

/// A CNI DEL of `cid`.
pub fn del(store: &mut dyn Store, cid: &str) -> Result<(), StoreError> {
    allocator::del(store, &attachment(cid), None, &system_reading()).map(|_| ())
}

/// A short class for an error, for tables.
pub fn class(e: &StoreError) -> &'static str {
    match e {
        StoreError::LockTimeout { .. } => "lock-timeout",
        StoreError::NoSpace { .. } => "nospace",
        StoreError::Io { .. } => "io",
        StoreError::Database { .. } => "database",
        StoreError::Corrupt { .. } => "corrupt",
        StoreError::TooNew { .. } => "too-new",
        StoreError::PastDeadline { .. } => "past-deadline",
    }
}

fn alloc_class(e: &AllocError) -> &'static str {
    match e {
        AllocError::Store(e) => class(e),
        _ => "alloc",
    }
}

/// Which command `op` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// CNI ADD.
    Add,
    /// CNI DEL.
    Del,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The acknowledgement is one write(2) of one line.
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

/// `op`: lock, open, one ADD or DEL, commit, acknowledge on stdout, close. Exit status 0 with
/// `ACK …`, or 2 with `ERR <class> <message>`. With `hold`, stays open after acknowledging
/// until killed (for open-after-crash measurements).
pub fn op(
    backend: Backend,
    data_dir: &Path,
    opener: Opener,
    action: Action,
    cid: &str,
    pod: &str,
    hold: bool,
) -> i32 {
    crate::phase("start");
    let sets = range_sets();
    let mut store = match backend::open(backend, data_dir, opener) {
        Ok(store) => store,
        Err(e) => {
            say(&format!("ERR {} {e}", class(&e)));
            return 2;
        }
    };
    crate::phase("opened");
    let line = match action {
        Action::Add => match add(&mut *store, &sets, cid, pod) {
            Ok(ips) => {
                let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
                format!("ACK ADD {cid} {}", ips.join(","))
            }
            Err(e) => format!("ERR {} {e}", alloc_class(&e)),
        },
        Action::Del => match del(&mut *store, cid) {
            Ok(()) => format!("ACK DEL {cid}"),
            Err(e) => format!("ERR {} {e}", class(&e)),
        },
    };
    crate::phase("committed");
    say(&line);
    if hold && line.starts_with("ACK") {
        crate::phase("holding");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    drop(store);
    crate::phase("closed");
    if line.starts_with("ACK") { 0 } else { 2 }
}

/// What `dump` is asked to cross-check: every container ID and pod name the parent ever used.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Names {
    /// Container IDs.
    pub cids: Vec<String>,
    /// Pod names.
    pub pods: Vec<String>,
}

/// What `dump` found.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Dump {
    /// Whether the store opened and could be read.
    pub ok: bool,
    /// Why not.
    pub error: Option<String>,
    /// The error's class.
    pub class: Option<String>,
    /// Every lease.
    pub leases: Vec<Lease>,
    /// Index entries that disagree with the leases: an address found through one owner's or
    /// pod's index while the lease says someone else owns it, or a lease missing from its own
    /// index entries.
    pub problems: Vec<String>,
}

fn check_indexes(
    store: &dyn Store,
    names: &Names,
) -> Result<(Vec<Lease>, Vec<String>), StoreError> {
    let leases = store.all()?;
    let mut problems = Vec::new();
    let held: BTreeSet<IpAddr> = store.held()?.iter().map(|l| l.ip).collect();
    let mut seen = BTreeSet::new();
    for lease in &leases {
        if !seen.insert(lease.ip) {
            problems.push(format!("{} has two records", lease.ip));
        }
        if !store
            .leases_of_attachment(&lease.owner)?
            .iter()
            .any(|l| l.ip == lease.ip)
        {
            problems.push(format!(
                "{} missing from the index of its owner {}",
                lease.ip, lease.owner
            ));
        }
        if let Some(id) = lease.identity()
            && !store
                .leases_of_identity(&id)?
                .iter()
                .any(|l| l.ip == lease.ip)
        {
            problems.push(format!(
                "{} missing from the index of its pod {id}",
                lease.ip
            ));
        }
        if lease.is_active() == held.contains(&lease.ip) {
            problems.push(format!(
                "{} held index disagrees with its state {:?}",
                lease.ip, lease.state
            ));
        }
    }
    for cid in &names.cids {
        for l in store.leases_of_attachment(&attachment(cid))? {
            if l.owner.container_id != *cid {
                problems.push(format!(
                    "{} found under owner {cid} but owned by {}",
                    l.ip, l.owner
                ));
            }
        }
    }
    for pod in &names.pods {
        let id = PodIdentity {
            namespace: NAMESPACE.into(),
            name: pod.clone(),
            ifname: IFNAME.into(),
        };
        for l in store.leases_of_identity(&id)? {
            if l.pod.as_ref().map(|p| p.name.as_str()) != Some(pod.as_str()) {
                problems.push(format!(
                    "{} found under pod {pod} but belongs to {:?}",
                    l.ip, l.pod
                ));
            }
        }
    }
    Ok((leases, problems))
}

/// `dump`: open the store, read every lease, cross-check the indexes; print a [`Dump`] as JSON.
pub fn dump(
    backend: Backend,
    data_dir: &Path,
    names_file: Option<&Path>,
    opener: Opener,
) -> anyhow::Result<i32> {
    let names: Names = match names_file {
        Some(path) => serde_json::from_slice(&std::fs::read(path).context("names file")?)?,
        None => Names::default(),
    };
    let result =
        backend::open(backend, data_dir, opener).and_then(|store| check_indexes(&*store, &names));
    let dump = match result {
        Ok((leases, problems)) => Dump {
            ok: true,
            leases,
            problems,
            ..Dump::default()
        },
        Err(e) => Dump {
            error: Some(e.to_string()),
            class: Some(class(&e).to_string()),
            ..Dump::default()
        },
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &dump)?;
    out.write_all(b"\n")?;
    Ok(if dump.ok { 0 } else { 2 })
}

/// The `i`-th address of the fill (10.0.0.10 onwards).
pub fn fill_ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 10)) + i))
}

/// `fill`: `count` held leases (deleted pods with retention forever), committed 1,000 at a time,
/// plus the cursor and range sets an ADD would leave. Returns the seconds it took.
pub fn fill(backend: Backend, data_dir: &Path, count: u32) -> anyhow::Result<f64> {
    let started = Instant::now();
    let sets = range_sets();
    let mut store = backend::open(backend, data_dir, Opener::Plugin)?;
    let now = system_reading().wall;
    let mut i = 0;
    while i < count {
        let end = (i + 1000).min(count);
        let leases = (i..end)
            .map(|n| {
                let ip = fill_ip(n);
                LeaseChange {
                    ip,
                    before: None,
                    after: Some(Lease {
                        ip,
                        owner: attachment(&format!(
                            "fill-{n:08x}-0123456789abcdef0123456789abcdef"
                        )),
                        pod: Some(pod_ref(&format!("fill-{n}"))),
                        retention: Retention::Forever,
                        state: LeaseState::Held { until: None },
                        since: now,
                        netns: None,
                    }),
                }
            })
            .collect();
        let last = fill_ip(end - 1);
        store.commit(Commit {
            leases,
            last_reserved: vec![(sets[0].to_string(), last)],
            range_sets: Some(serde_json::to_string(&sets)?),
            clock: None,
            freed: Vec::new(),
            forget_freed_until: None,
        })?;
        i = end;
    }
    drop(store);
    Ok(started.elapsed().as_secs_f64())
}

/// `VmHWM` (peak resident set) of this process, in KiB.
pub fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// What `agent-sim` measured.
#[derive(Debug, Serialize, Deserialize)]
pub struct AgentSim {
    /// Seconds to open (the agent's options).
    pub open_s: f64,
    /// Peak RSS right after opening, KiB.
    pub hwm_after_open_kib: u64,
    /// Peak RSS at the end, KiB.
    pub hwm_end_kib: u64,
    /// RSS at the end, KiB.
    pub rss_end_kib: u64,
    /// ADD/DEL commands run.
    pub ops: usize,
    /// Median and p99 of one command, µs.
    pub op_median_us: u64,
    /// p99.
    pub op_p99_us: u64,
    /// Sweeps (expiry + a streamed scan of every lease, as the agent's pass) run.
    pub sweeps: usize,
    /// Median of one sweep, ms.
    pub sweep_median_ms: f64,
}

/// `agent-sim`: what the node agent does with one network: open once (agent options), serve
/// `ops` ADD/DEL commands on the open store, and sweep every 100 commands. Prints an
/// [`AgentSim`] as JSON.
pub fn agent_sim(backend: Backend, data_dir: &Path, ops: usize) -> anyhow::Result<()> {
    let sets = range_sets();
    let t = Instant::now();
    let mut store = backend::open(backend, data_dir, Opener::Agent)?;
    // The agent reads the store at start (gauges): make the open do its real work.
    let _ = store.range_sets()?;
    let open_s = t.elapsed().as_secs_f64();
    let hwm_after_open_kib = vm_hwm_kib();
    let mut times = Vec::with_capacity(ops);
    let mut sweeps = Vec::new();
    let pods = 20;
    for n in 0..ops {
        let pod = n / 2 % pods;
        let generation = n / (2 * pods);
        let cid = format!("agent-{pod}-{generation}");
        let t = Instant::now();
        if n % 2 == 0 {
            add(&mut *store, &sets, &cid, &format!("agent-pod-{pod}"))?;
        } else {
            del(&mut *store, &cid)?;
        }
        times.push(t.elapsed().as_micros() as u64);
        if n % 100 == 99 {
            let t = Instant::now();
            allocator::release_expired(&mut *store, &system_reading())?;
            let mut held = 0usize;
            store.scan(&mut |l| {
                held += usize::from(!l.is_active());
                Ok(())
            })?;
            sweeps.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_unstable();
    sweeps.sort_by(f64::total_cmp);
    let result = AgentSim {
        open_s,
        hwm_after_open_kib,
        hwm_end_kib: vm_hwm_kib(),
        rss_end_kib: vm_rss_kib(),
        ops,
        op_median_us: crate::stats::percentile(&times, 50.0),
        op_p99_us: crate::stats::percentile(&times, 99.0),
        sweeps: sweeps.len(),
        sweep_median_ms: sweeps.get(sweeps.len() / 2).copied().unwrap_or(0.0),
    };
    drop(store);
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}
