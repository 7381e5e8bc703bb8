//! The CNI "skel": one invocation from environment, decoded configuration and clock to stdout
//! bytes and an exit code. Everything the plugin does happens here, over any [`Stores`]; `main`
//! only wires real stdio, and the node agent runs the same function.
//!
//! Errors become CNI error JSON in exactly one place, [`run`]; stdout carries nothing else.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ipkeep_ipam::{
    AddRequest, Attachment, Departure, LeaseState, NetworkDir, PodRef, Reading, Retention, Source,
    StoreRead, allocator, clock,
};
use tracing::{debug, info, warn};

use crate::env::{self, CniArgs, Command, Invocation};
use crate::error::{CniError, code};
use crate::files;
use crate::management::{self, ApiView, Management};
use crate::netconf::Decoded;
use crate::result::{Dns, IpConfig, IpamResult};
use crate::stores::{Deadlined, Stores};
use crate::version;

/// Phase durations of one invocation, printed to stderr when `IPKEEP_TIMING` is set, so the
/// benchmark can say where the time goes.
#[derive(Debug, Default, Clone)]
pub struct Timings {
    started: Option<Instant>,
    phases: Vec<(&'static str, Duration)>,
}

impl Timings {
    /// Starts timing now.
    pub fn begin() -> Self {
        Timings {
            started: Some(Instant::now()),
            phases: Vec::new(),
        }
    }

    /// Records a phase that took `took`.
    pub fn push(&mut self, phase: &'static str, took: Duration) {
        self.phases.push((phase, took));
    }

    /// Records a phase that began at `since` and ends now; returns now.
    pub fn record(&mut self, phase: &'static str, since: Instant) -> Instant {
        let now = Instant::now();
        self.phases.push((phase, now - since));
        now
    }

    /// `ipkeep-timing parse_us=… lock_us=… open_us=… alloc_commit_us=… total_us=…`.
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
    /// Of those, addresses whose holding for another pod gave way because the range was full.
    pub reclaimed: usize,
    /// Of those, addresses freed less than `ipam.reuseCooldown` ago, handed out because no
    /// other address of the range was free.
    pub cooling: usize,
    /// Addresses now held for a deleted pod.
    pub held: usize,
    /// Addresses freed by DEL or GC.
    pub released: usize,
    /// Holdings freed because they had expired.
    pub expired: usize,
}

/// What a pod's owner should hear about beyond the plugin's log; the node agent publishes each
/// as a Warning Event on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The address kept for the pod lies outside the network's current ranges: released, and
    /// the pod got `new_ips` instead.
    OutsideRanges {
        /// The pod.
        pod: PodRef,
        /// The address that could not be kept.
        ip: IpAddr,
        /// The network's range sets now.
        ranges: String,
        /// What the pod got.
        new_ips: Vec<IpAddr>,
    },
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
    /// What the pod's owner should hear about.
    pub notices: Vec<Notice>,
    /// The command, when the environment named a known one.
    pub command: Option<Command>,
}

/// When an invocation runs: the clock reading it starts with, and the moment after which it
/// must not commit anything (its caller stops waiting then); and who says whether a
/// PersistentPodState manages its pod.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// The clock when the invocation started.
    pub reading: Reading,
    /// No commit after this.
    pub deadline: Option<Instant>,
    /// The node agent's view of the API server, or none ([`management::NoApiView`]).
    pub api: &'a dyn ApiView,
}

/// Runs one CNI invocation against `stores`, with the configuration already decoded from
/// stdin (`config` is not read for `VERSION`).
pub fn run<S: Stores>(
    stores: &S,
    vars: &HashMap<String, String>,
    config: &Result<Decoded, CniError>,
    stdout: &mut dyn Write,
    call: &Call<'_>,
) -> Completion {
    let mut cx = Context {
        stores,
        call,
        timings: Timings::begin(),
        tally: Tally::default(),
        notices: Vec::new(),
    };
    let inv = env::parse(vars);
    let command = inv.as_ref().ok().map(|i| i.command);
    // Every line this command logs names the pod and the container, failures included.
    let span = match &inv {
        Ok(inv) => tracing::error_span!(
            "cni",
            command = inv.command.as_str(),
            network = config.as_ref().map_or("", |d| d.name.as_str()),
            pod = %pod_label(&inv.args),
            container = %inv.container_id,
            ifname = %inv.ifname,
        ),
        Err(_) => tracing::error_span!("cni"),
    };
    let _enter = span.enter();
    let version_for_errors = config.as_ref().ok().map(|d| d.version.to_string());
    let outcome = inv.and_then(|inv| dispatch(&mut cx, &inv, config));
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
        notices: cx.notices,
        command,
    }
}

/// What every command gets besides its input.
struct Context<'s, S> {
    stores: &'s S,
    call: &'s Call<'s>,
    timings: Timings,
    tally: Tally,
    notices: Vec<Notice>,
}

impl<S: Stores> Context<'_, S> {
    /// Runs `f` on the network's store, with the network's lock timeout and the call's
    /// deadline on commits.
    fn with_store<R>(
        &mut self,
        decoded: &Decoded,
        f: impl FnOnce(&mut Deadlined<'_, S::Store>) -> Result<R, CniError>,
    ) -> Result<R, CniError> {
        let dir = network_dir(decoded)?;
        let deadline = self.call.deadline;
        self.stores.with(
            &dir,
            decoded.settings.lock_timeout,
            &mut self.timings,
            |store| f(&mut Deadlined { store, deadline }),
        )
    }
}

fn dispatch<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    config: &Result<Decoded, CniError>,
) -> Result<Option<String>, CniError> {
    if inv.command == Command::Version {
        return Ok(Some(version::version_info()));
    }
    let decoded = config.as_ref().map_err(Clone::clone)?;
    debug!(config = ?decoded.ipam, args = ?inv.args, netns = %inv.netns, "decoded the invocation");
    match inv.command {
        Command::Add => cmd_add(cx, inv, decoded).map(Some),
        Command::Del => cmd_del(cx, inv, decoded).map(|()| None),
        Command::Check => cmd_check(cx, inv, decoded).map(|()| None),
        Command::Gc => cmd_gc(cx, decoded).map(|()| None),
        Command::Status => cmd_status(cx, decoded).map(|()| None),
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
            .and_then(|a| a.get(ipkeep_values::keys::PERSISTENT_POD_STATE))
            .map(|name| name.trim())
            .filter(|name| !name.is_empty())
            .map(str::to_string),
        confirmed: false,
    })
}

fn attachment(inv: &Invocation) -> Attachment {
    Attachment {
        container_id: inv.container_id.clone(),
        ifname: inv.ifname.clone(),
    }
}

fn network_dir(decoded: &Decoded) -> Result<NetworkDir, CniError> {
    NetworkDir::new(&decoded.settings.data_dir, &decoded.name)
        .map_err(|e| CniError::new(code::INVALID_CONFIG, e.to_string()))
}

fn until_text(state: LeaseState) -> String {
    match state {
        LeaseState::Held { until: Some(t) } => ipkeep_values::time::rfc3339(t),
        _ => "forever".to_string(),
    }
}

fn cmd_add<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    decoded: &Decoded,
) -> Result<String, CniError> {
    let plan = decoded.plan()?;
    let dns = match &plan.resolv_conf {
        None => Dns::default(),
        Some(path) => Dns::parse_resolv_conf(&read_resolv_conf(path)?),
    };
    for why in &decoded.ignored_annotations {
        warn!("{why}");
    }
    let mut pod = pod_ref(&inv.args, decoded);
    let annotations = decoded.conf.runtime_config.pod_annotations.as_ref();
    let (retention, source) = match pod.as_mut() {
        Some(pod) => {
            let said = cx
                .call
                .api
                .management(&pod.namespace, &pod.name, annotations);
            let decided = management::decide(&said, &plan.retention, annotations);
            decided.record(pod);
            (decided.resolved.retention, decided.resolved.source)
        }
        None => (Retention::Off, ipkeep_ipam::RetentionSource::NetworkDefault),
    };
    let requested = decoded.requested_ips(inv.args.ip)?;
    debug!(%retention, ?source, ?requested, ranges = plan.range_sets.len(), "allocating");
    let stores = cx.stores;
    let netns_exists = |path: &str| stores.netns_exists(path);
    let req = AddRequest {
        range_sets: &plan.range_sets,
        owner: attachment(inv),
        pod,
        retention,
        requested: &requested,
        netns: Some(inv.netns.clone()).filter(|n| !n.is_empty()),
        netns_exists: &netns_exists,
        reuse_cooldown: plan.reuse_cooldown,
    };
    let reading = &cx.call.reading;
    let (outcome, t) = cx.with_store(decoded, |store| {
        let t = Instant::now();
        let mark = store.clock()?;
        let now = clock::advance(mark.as_ref(), reading).now;
        if let Some(ahead) = clock::doubted_wall(mark.as_ref(), reading) {
            warn!(
                ahead = %ipkeep_values::time::duration(ahead),
                "after a reboot the wall clock is far past this store's last time and the kernel does not say it is synchronised (NTP): until it does, or the node has been up an hour, holdings end only by the time the store can prove"
            );
        } else if let Some(ahead) = clock::wall_ahead(now, reading) {
            warn!(
                ahead = %ipkeep_values::time::duration(ahead),
                "the wall clock is ahead of the store's clock (it jumped forward): holdings end by the time elapsed on this boot, not by the wall clock"
            );
        }
        Ok((allocator::add(store, &req, reading)?, t))
    })?;
    cx.timings.record("alloc_commit", t);
    cx.tally.expired += outcome.expired.len();
    for lease in &outcome.expired {
        info!(ip = %lease.ip, pod = %lease.pod.as_ref().map(ToString::to_string).unwrap_or_default(), "released an expired holding");
    }
    if !outcome.outside_ranges.is_empty() {
        let ranges = plan
            .range_sets
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        let new_ips: Vec<IpAddr> = outcome.assignments.iter().map(|a| a.ip).collect();
        for lease in &outcome.outside_ranges {
            warn!(
                ip = %lease.ip,
                ranges = %ranges,
                "the address kept for this pod is outside the network's current ranges (the node's pod CIDR or the CNI configuration changed): released, and the pod gets a new address"
            );
            if let Some(pod) = &req.pod {
                cx.notices.push(Notice::OutsideRanges {
                    pod: pod.clone(),
                    ip: lease.ip,
                    ranges: ranges.clone(),
                    new_ips: new_ips.clone(),
                });
            }
        }
    }
    for a in &outcome.assignments {
        match &a.source {
            Source::Existing => {
                info!(ip = %a.ip, "repeated ADD: returning the address the attachment already has");
            }
            Source::Retained { from, was_held } => {
                cx.tally.allocated += 1;
                cx.tally.retained += 1;
                info!(ip = %a.ip, from = %from, was_held, %retention, ?source, "gave the pod its retained address back");
            }
            Source::Cooling { freed_at } => {
                cx.tally.allocated += 1;
                cx.tally.cooling += 1;
                warn!(
                    ip = %a.ip,
                    freed_at = %ipkeep_values::time::rfc3339(*freed_at),
                    cooldown = %ipkeep_values::time::duration(plan.reuse_cooldown),
                    "no address of the range is free but ones freed less than ipam.reuseCooldown ago: the one freed longest ago goes to this pod before its cooldown ended"
                );
            }
            Source::Reclaimed { from } => {
                cx.tally.allocated += 1;
                cx.tally.reclaimed += 1;
                warn!(
                    ip = %a.ip,
                    held_for = %from.pod.as_ref().map(ToString::to_string).unwrap_or_default(),
                    held_until = %until_text(from.state),
                    "the range is full: the address held for a deleted pod goes to this pod instead; that pod gets a new address when it comes back"
                );
            }
            other => {
                cx.tally.allocated += 1;
                info!(ip = %a.ip, how = ?other, %retention, ?source, "allocated");
            }
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

fn read_resolv_conf(path: &Path) -> Result<String, CniError> {
    files::read_regular(path, files::MAX_RESOLV_CONF_BYTES).map_err(|e| {
        CniError::new(
            code::GENERIC,
            format!("failed to read ipam.resolvConf {}: {e}", path.display()),
        )
    })
}

fn cmd_del<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    decoded: &Decoded,
) -> Result<(), CniError> {
    // DEL is best effort: it needs only the network name and the data directory, so a range
    // configuration that has since become invalid cannot strand addresses.
    let dir = network_dir(decoded)?;
    if !cx.stores.exists(&dir) {
        info!("nothing to release: the network has no store yet");
        return Ok(());
    }
    let departure = departure(cx.call.api, inv, decoded);
    let reading = &cx.call.reading;
    let owner = attachment(inv);
    let (outcome, t) = cx.with_store(decoded, |store| {
        let t = Instant::now();
        Ok((allocator::del(store, &owner, &departure, reading)?, t))
    })?;
    cx.timings.record("alloc_commit", t);
    cx.tally.held += outcome.held.len();
    cx.tally.released += outcome.released.len();
    for l in &outcome.held {
        let pps = l
            .pod
            .as_ref()
            .and_then(|p| p.persistent_pod_state.as_deref());
        let confirmed = l.pod.as_ref().is_some_and(|p| p.confirmed);
        info!(ip = %l.ip, retention = %l.retention, until = %until_text(l.state), persistent_pod_state = pps.unwrap_or(""), confirmed, "holding the address for the pod");
    }
    for l in &outcome.released {
        info!(ip = %l.ip, "released");
    }
    if outcome.held.is_empty() && outcome.released.is_empty() {
        debug!("nothing to release: the container owns no active address");
    }
    Ok(())
}

/// What DEL decides in place of what ADD recorded. With the node agent's view, the API server's
/// answer decides, and is recorded. Without it, the annotations the runtime passes again at DEL
/// decide when they still read (within the network's limits), else the retention resolved at
/// ADD does.
fn departure(api: &dyn ApiView, inv: &Invocation, decoded: &Decoded) -> Departure {
    let annotations = decoded.conf.runtime_config.pod_annotations.as_ref();
    let Ok(policy) = decoded.retention_policy() else {
        return Departure::default();
    };
    let said = match (&inv.args.pod_namespace, &inv.args.pod_name) {
        (Some(namespace), Some(name)) => api.management(namespace, name, annotations),
        // Nothing to hold for an unnamed attachment: DEL frees it whatever anyone says.
        _ => return Departure::default(),
    };
    let decided = management::decide(&said, &policy, annotations);
    match said {
        Management::Unknown(_) => Departure {
            retention: annotations.and(
                decided
                    .resolved
                    .adjusted
                    .is_none()
                    .then_some(decided.resolved.retention),
            ),
            confirmed: None,
        },
        Management::Managed { .. } | Management::Unmanaged => Departure {
            retention: Some(decided.resolved.retention),
            confirmed: decided.confirmed,
        },
    }
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
    if !cx.stores.exists(&dir) {
        return Err(ipkeep_ipam::CheckError::NotFound(owner).into());
    }
    cx.with_store(decoded, |store| {
        allocator::check(&*store, &owner, &decoded.previous_ips())?;
        Ok(())
    })
}

fn cmd_gc<S: Stores>(cx: &mut Context<'_, S>, decoded: &Decoded) -> Result<(), CniError> {
    if !decoded.version.allows_gc_and_status() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow GC",
        ));
    }
    let valid: BTreeSet<Attachment> = decoded.valid_attachments()?.into_iter().collect();
    let dir = network_dir(decoded)?;
    if !cx.stores.exists(&dir) {
        return Ok(());
    }
    let reading = &cx.call.reading;
    let outcome = cx.with_store(decoded, |store| Ok(allocator::gc(store, &valid, reading)?))?;
    cx.tally.held += outcome.held.len();
    cx.tally.released += outcome.released.len();
    cx.tally.expired += outcome.expired.len();
    info!(
        held = outcome.held.len(),
        released = outcome.released.len(),
        expired = outcome.expired.len(),
        "garbage collection done"
    );
    Ok(())
}

fn cmd_status<S: Stores>(cx: &mut Context<'_, S>, decoded: &Decoded) -> Result<(), CniError> {
    if !decoded.version.allows_gc_and_status() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow STATUS",
        ));
    }
    decoded.plan()?;
    // Cheap: no lock, no database. The plugin can serve ADD when its store can be written.
    let dir = network_dir(decoded)?;
    cx.stores
        .status(&dir)
        .map_err(|why| CniError::new(code::NOT_AVAILABLE, why))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_management;
