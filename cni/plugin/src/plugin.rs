//! The CNI "skel": one invocation from environment, stdin and clock to stdout bytes and an exit
//! code. Everything the plugin does happens here; `main` only wires real stdio.
//!
//! Errors become CNI error JSON in exactly one place, [`run`]; stdout carries nothing else.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use ipkeep_ipam::{
    AddRequest, Attachment, LeaseState, NetworkDir, PERSISTENT_POD_STATE_ANNOTATION, PodRef,
    Retention, Source, Store, allocator,
};
use tracing::{info, warn};

use crate::env::{self, CniArgs, Command, Invocation};
use crate::error::{CniError, code};
use crate::netconf::{self, Decoded, MAX_CONFIG_BYTES};
use crate::result::{Dns, IpConfig, IpamResult};
use crate::stores::Stores;
use crate::version;

/// Phase durations of one invocation, printed to stderr when `IPKEEP_TIMING` is set, so the
/// benchmark can say where the time goes.
#[derive(Debug, Default, Clone)]
pub struct Timings {
    started: Option<Instant>,
    phases: Vec<(&'static str, Duration)>,
}

impl Timings {
    pub(crate) fn begin() -> Self {
        Timings {
            started: Some(Instant::now()),
            phases: Vec::new(),
        }
    }

    pub fn push(&mut self, phase: &'static str, took: Duration) {
        self.phases.push((phase, took));
    }

    pub(crate) fn record(&mut self, phase: &'static str, since: Instant) -> Instant {
        let now = Instant::now();
        self.phases.push((phase, now - since));
        now
    }

    /// `ipkeep-timing parse_us=… lock_us=… open_us=… alloc_us=… commit_us=… total_us=…`.
    pub fn line(&self) -> String {
        let mut out = String::from("ipkeep-timing");
        for (phase, d) in &self.phases {
            out.push_str(&format!(" {phase}_us={}", d.as_micros()));
        }
        if let Some(start) = self.started {
            out.push_str(&format!(" total_us={}", start.elapsed().as_micros()));
        }
        out
    }
}

/// How many addresses one invocation allocated, held and released, for the agent's metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Addresses newly allocated (not returned again to the same attachment).
    pub allocated: usize,
    /// Of those, addresses given back to their pod from a holding.
    pub retained: usize,
    /// Addresses now held for a deleted pod.
    pub held: usize,
    /// Addresses freed by DEL or GC.
    pub released: usize,
    /// Holdings freed because they had expired.
    pub expired: usize,
}

/// What one invocation produced.
#[derive(Debug)]
pub struct Completion {
    /// Process exit code.
    pub exit_code: i32,
    /// Phase timings.
    pub timings: Timings,
    /// What changed in the store.
    pub tally: Tally,
    /// The command, when the environment named a known one.
    pub command: Option<Command>,
}

/// Runs one CNI invocation against `stores`. `now` is unix seconds.
pub fn run<S: Stores>(
    stores: &S,
    vars: &HashMap<String, String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    now: u64,
) -> Completion {
    let mut cx = Context {
        stores,
        now,
        timings: Timings::begin(),
        tally: Tally::default(),
    };
    let mut version_for_errors = None;
    let command = env::parse(vars).ok().map(|inv| inv.command);
    let outcome = dispatch(&mut cx, vars, stdin, &mut version_for_errors);
    let (text, exit_code) = match outcome {
        Ok(out) => (out, 0),
        Err(e) => {
            warn!(code = e.code, msg = %e.msg, details = e.details.as_deref().unwrap_or(""), "CNI command failed");
            (Some(e.to_json(version_for_errors.as_deref())), 1)
        }
    };
    if let Some(text) = text {
        // If stdout is gone the runtime is gone too; nothing useful is left to do.
        let _ = stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush());
    }
    Completion {
        exit_code,
        timings: cx.timings,
        tally: cx.tally,
        command,
    }
}

/// What every command gets besides its input.
struct Context<'s, S> {
    stores: &'s S,
    now: u64,
    timings: Timings,
    tally: Tally,
}

impl<S: Stores> Context<'_, S> {
    /// Runs `f` on the network's store, with the network's lock timeout.
    fn with_store<R>(
        &mut self,
        decoded: &Decoded,
        f: impl FnOnce(&mut ipkeep_ipam::DiskStore) -> Result<R, CniError>,
    ) -> Result<R, CniError> {
        let dir = network_dir(decoded)?;
        let timeout = decoded.lock_timeout()?;
        self.stores.with(&dir, timeout, &mut self.timings, f)
    }
}

fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    stdin
        .take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| {
            CniError::new(
                code::IO_FAILURE,
                format!("failed to read the network configuration from stdin: {e}"),
            )
        })?;
    Ok(buf)
}

fn dispatch<S: Stores>(
    cx: &mut Context<'_, S>,
    vars: &HashMap<String, String>,
    stdin: &mut dyn Read,
    version_for_errors: &mut Option<String>,
) -> Result<Option<String>, CniError> {
    let t = Instant::now();
    let inv = env::parse(vars)?;
    if inv.command == Command::Version {
        return Ok(Some(version::version_info()));
    }
    let decoded = netconf::decode(&read_stdin(stdin)?)?;
    *version_for_errors = Some(decoded.version.to_string());
    cx.timings.record("parse", t);
    let span = tracing::info_span!(
        "cni",
        command = inv.command.as_str(),
        network = %decoded.name,
        container = %inv.container_id,
        ifname = %inv.ifname,
        pod = %pod_label(&inv.args),
    );
    let _enter = span.enter();
    match inv.command {
        Command::Add => cmd_add(cx, &inv, &decoded).map(Some),
        Command::Del => cmd_del(cx, &inv, &decoded).map(|()| None),
        Command::Check => cmd_check(cx, &inv, &decoded).map(|()| None),
        Command::Gc => cmd_gc(cx, &decoded).map(|()| None),
        Command::Status => cmd_status(&decoded).map(|()| None),
        Command::Version => Ok(Some(version::version_info())),
    }
}

fn pod_label(args: &CniArgs) -> String {
    match (&args.pod_namespace, &args.pod_name) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        _ => String::new(),
    }
}

fn pod_ref(args: &CniArgs, decoded: &Decoded) -> Option<PodRef> {
    let annotations = decoded.conf.runtime_config.pod_annotations.as_ref();
    Some(PodRef {
        namespace: args.pod_namespace.clone()?,
        name: args.pod_name.clone()?,
        uid: args.pod_uid.clone(),
        persistent_pod_state: annotations
            .and_then(|a| a.get(PERSISTENT_POD_STATE_ANNOTATION))
            .filter(|name| !name.is_empty())
            .cloned(),
    })
}

fn attachment(inv: &Invocation) -> Attachment {
    Attachment {
        container_id: inv.container_id.clone(),
        ifname: inv.ifname.clone(),
    }
}

fn network_dir(decoded: &Decoded) -> Result<NetworkDir, CniError> {
    NetworkDir::new(&decoded.data_dir()?, &decoded.name)
        .map_err(|e| CniError::new(code::INVALID_CONFIG, e.to_string()))
}

fn cmd_add<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    decoded: &Decoded,
) -> Result<String, CniError> {
    let now = cx.now;
    let plan = decoded.plan()?;
    let dns = match &plan.resolv_conf {
        None => Dns::default(),
        Some(path) => Dns::parse_resolv_conf(&std::fs::read_to_string(path).map_err(|e| {
            CniError::new(
                code::GENERIC,
                format!("failed to read ipam.resolvConf {}: {e}", path.display()),
            )
        })?),
    };
    let pod = pod_ref(&inv.args, decoded);
    let annotations = decoded.conf.runtime_config.pod_annotations.as_ref();
    let (retention, source) = if pod.is_some() {
        let policy = ipkeep_ipam::RetentionPolicy {
            default: plan.retention,
            max_unmanaged: Retention::Forever,
        };
        let r = policy.resolve(annotations);
        if let Some(why) = &r.adjusted {
            warn!("{why}");
        }
        (r.retention, r.source)
    } else {
        (Retention::Off, ipkeep_ipam::RetentionSource::NetworkDefault)
    };
    let requested = decoded.requested_ips(inv.args.ip)?;
    let req = AddRequest {
        range_sets: &plan.range_sets,
        owner: attachment(inv),
        pod,
        retention,
        requested: &requested,
    };
    let outcome = cx.with_store(decoded, |store| {
        let t = Instant::now();
        let outcome = allocator::add(store, &req, now)?;
        Ok((outcome, t))
    });
    let (outcome, t) = outcome?;
    cx.timings.record("alloc_commit", t);
    cx.tally.expired += outcome.expired.len();
    for a in &outcome.assignments {
        match a.source {
            Source::Existing => {}
            Source::Retained { .. } => {
                cx.tally.allocated += 1;
                cx.tally.retained += 1;
            }
            _ => cx.tally.allocated += 1,
        }
    }
    for lease in &outcome.expired {
        info!(ip = %lease.ip, pod = %lease.pod.as_ref().map(ToString::to_string).unwrap_or_default(), "released expired holding");
    }
    for a in &outcome.assignments {
        match &a.source {
            Source::Retained { from, was_held } => {
                info!(ip = %a.ip, from = %from, was_held, %retention, ?source, "gave the pod its retained address back")
            }
            Source::Existing => {
                info!(ip = %a.ip, "repeated ADD: returning the address the attachment already has")
            }
            other => info!(ip = %a.ip, how = ?other, %retention, ?source, "allocated"),
        }
    }
    let result = IpamResult {
        ips: outcome
            .assignments
            .iter()
            .map(|a| IpConfig {
                address: ipnetwork::IpNetwork::new(a.ip, a.range.subnet.prefix())
                    .unwrap_or(a.range.subnet),
                gateway: a.range.gateway,
            })
            .collect(),
        routes: plan.routes,
        dns,
    };
    Ok(result.to_json(decoded.version))
}

fn cmd_del<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    decoded: &Decoded,
) -> Result<(), CniError> {
    let now = cx.now;
    // DEL is best effort: it needs only the network name and the data directory, so a range
    // configuration that has since become invalid cannot strand addresses.
    let dir = network_dir(decoded)?;
    if !dir.exists() {
        info!("nothing to release: the network has no store yet");
        return Ok(());
    }
    let retention = decoded
        .conf
        .runtime_config
        .pod_annotations
        .as_ref()
        .and_then(|ann| {
            let default = decoded
                .ipam()
                .ok()
                .and_then(|i| i.retention.as_deref())
                .and_then(|r| Retention::parse("ipam.retention", r).ok())
                .unwrap_or(Retention::Off);
            let policy = ipkeep_ipam::RetentionPolicy {
                default,
                max_unmanaged: Retention::Forever,
            };
            let r = policy.resolve(Some(ann));
            r.adjusted.is_none().then_some(r.retention)
        });
    let (outcome, t) = cx.with_store(decoded, |store| {
        let t = Instant::now();
        Ok((allocator::del(store, &attachment(inv), retention, now)?, t))
    })?;
    cx.timings.record("alloc_commit", t);
    cx.tally.held += outcome.held.len();
    cx.tally.released += outcome.released.len();
    for l in &outcome.held {
        let until = match l.state {
            LeaseState::Held { until: Some(t) } => {
                humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t))
                    .to_string()
            }
            _ => "forever".to_string(),
        };
        info!(ip = %l.ip, retention = %l.retention, %until, "holding the address for the pod");
    }
    for l in &outcome.released {
        info!(ip = %l.ip, "released");
    }
    Ok(())
}

fn cmd_check<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    decoded: &Decoded,
) -> Result<(), CniError> {
    if !decoded.version.allows_check() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow CHECK",
        ));
    }
    decoded.plan()?;
    let dir = network_dir(decoded)?;
    let owner = attachment(inv);
    if !dir.exists() {
        return Err(ipkeep_ipam::CheckError::NotFound(owner).into());
    }
    cx.with_store(decoded, |store| {
        allocator::check(store, &owner, &decoded.previous_ips())?;
        Ok(())
    })
}

fn cmd_gc<S: Stores>(cx: &mut Context<'_, S>, decoded: &Decoded) -> Result<(), CniError> {
    let now = cx.now;
    if !decoded.version.allows_gc_and_status() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow GC",
        ));
    }
    let valid: BTreeSet<Attachment> = decoded.valid_attachments()?.into_iter().collect();
    let dir = network_dir(decoded)?;
    if !dir.exists() {
        return Ok(());
    }
    let (outcome, kept) = cx.with_store(decoded, |store| {
        let outcome = allocator::gc(store, &valid, now)?;
        Ok((outcome, store.all().map(|all| all.len()).unwrap_or(0)))
    })?;
    cx.tally.held += outcome.held.len();
    cx.tally.released += outcome.released.len();
    cx.tally.expired += outcome.expired.len();
    info!(
        held = outcome.held.len(),
        released = outcome.released.len(),
        expired = outcome.expired.len(),
        remaining = kept,
        "garbage collection done"
    );
    Ok(())
}

fn cmd_status(decoded: &Decoded) -> Result<(), CniError> {
    if !decoded.version.allows_gc_and_status() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow STATUS",
        ));
    }
    let plan = decoded.plan()?;
    // Cheap: no lock, no database. The plugin can serve ADD when its state directory is usable.
    match std::fs::metadata(&plan.data_dir) {
        Ok(m) if !m.is_dir() => Err(CniError::new(
            code::NOT_AVAILABLE,
            format!(
                "ipam.dataDir {} exists but is not a directory",
                plan.data_dir.display()
            ),
        )),
        _ => Ok(()),
    }
}
