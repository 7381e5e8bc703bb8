//! The CNI "skel": one invocation from environment, decoded configuration and clock to stdout
//! bytes and an exit code. Every CNI command runs here, over any [`Stores`]: the plugin process
//! (through `relay`) and the node agent run the same function.
//!
//! Errors become CNI error JSON in exactly one place, [`run`]; stdout carries nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::time::Instant;

use ipkeep_ipam::{
    AddOutcome, AddRequest, AllocError, Attachment, Departure, LeaseState, NetworkDir, PodRef,
    Reading, Retention, RetentionPolicy, RetentionSource, Source, StoreRead, allocator, clock,
};
use tracing::{debug, info, warn};

use crate::env::{self, CniArgs, Command, Invocation};
use crate::error::{CniError, code};
use crate::management::{self, ApiView, Decided, Management, SandboxPod, Unavailable};
use crate::netconf::{self, IpamPlan, NetworkConfig};
use crate::result::{Dns, IpConfig, IpamResult};
use crate::stores::{Deadlined, NotServed, Stores};
use crate::timings::Timings;
use crate::version;
use crate::{files, logs};

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

/// What one invocation produced: everything its caller acts on afterwards.
#[derive(Debug)]
pub struct Completion {
    /// Process exit code.
    pub exit_code: i32,
    /// What goes to stdout: the CNI result, or the CNI error.
    pub stdout: Vec<u8>,
    /// The command's log lines, formatted as the plugin process logs them, when the call asked
    /// for them ([`Call::capture_log`]); else empty (they went to this process's log).
    pub log: Vec<u8>,
    /// Phase timings.
    pub timings: Timings,
    /// What changed in the store.
    pub tally: Tally,
    /// What the pod's owner should hear about.
    pub notices: Vec<Notice>,
    /// The command, when the environment named a known one.
    pub command: Option<Command>,
    /// Set when the stores would not lend the network's store ([`Stores::serves`]): the command
    /// did not run, and whoever sent it must serve it elsewhere.
    pub refused: Option<NotServed>,
    /// Older sandboxes' network namespaces the command had to judge and the stores could not
    /// ([`Stores::netns_exists`]): nothing was committed; whoever can see them says whether
    /// each exists, and the command runs again with that.
    pub needs_netns: Vec<String>,
}

/// When an invocation runs: the clock reading it starts with, and the moment after which it
/// must not commit anything (its caller stops waiting then); who says whether a
/// PersistentPodState manages its pod; and where its log lines go.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// The clock when the invocation started.
    pub reading: Reading,
    /// No commit after this.
    pub deadline: Option<Instant>,
    /// The node agent's view of the API server, or none ([`management::NoApiView`]).
    pub api: &'a dyn ApiView,
    /// Log into [`Completion::log`] through these loggers, at the configuration's level
    /// (`ipam.logLevel`); `None`: into this process's own log.
    pub capture_log: Option<&'a logs::Capture>,
}

/// Runs one CNI invocation against `stores`, with the configuration already decoded from
/// stdin (`config` is not read for `VERSION`).
pub fn run<S: Stores>(
    stores: &S,
    vars: &HashMap<String, String>,
    config: &Result<NetworkConfig, CniError>,
    call: &Call<'_>,
) -> Completion {
    let Some(capture) = call.capture_log else {
        return run_logged(stores, vars, config, call);
    };
    let settings = config
        .as_ref()
        .map_or_else(|_| netconf::Settings::default(), |d| d.settings.clone());
    let (mut done, log) = capture.run(logs::level(&settings, None), || {
        run_logged(stores, vars, config, call)
    });
    done.log = log;
    done
}

/// [`run`], logging through the current subscriber.
fn run_logged<S: Stores>(
    stores: &S,
    vars: &HashMap<String, String>,
    config: &Result<NetworkConfig, CniError>,
    call: &Call<'_>,
) -> Completion {
    let mut cx = Context {
        stores,
        call,
        timings: Timings::begin(),
        tally: Tally::default(),
        notices: Vec::new(),
        refused: None,
        needs_netns: Vec::new(),
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
    Completion {
        exit_code,
        stdout: text.map(String::into_bytes).unwrap_or_default(),
        log: Vec::new(),
        timings: cx.timings,
        tally: cx.tally,
        notices: cx.notices,
        command,
        refused: cx.refused,
        needs_netns: cx.needs_netns,
    }
}

/// What every command gets besides its input.
struct Context<'s, S> {
    stores: &'s S,
    call: &'s Call<'s>,
    timings: Timings,
    tally: Tally,
    notices: Vec<Notice>,
    refused: Option<NotServed>,
    needs_netns: Vec<String>,
}

impl<S: Stores> Context<'_, S> {
    /// Runs `f` on the network's store, with the network's lock timeout and the call's
    /// deadline on commits.
    fn with_store<R>(
        &mut self,
        config: &NetworkConfig,
        f: impl FnOnce(&mut Deadlined<'_, S::Store>) -> Result<R, CniError>,
    ) -> Result<R, CniError> {
        let dir = network_dir(config)?;
        if let Err(refused) = self.stores.serves(&dir) {
            let err = CniError::new(code::TRY_AGAIN_LATER, refused.to_string());
            self.refused = Some(refused);
            return Err(err);
        }
        let deadline = self.call.deadline;
        self.stores.with(
            &dir,
            config.settings.lock_timeout,
            &mut self.timings,
            |store| f(&mut Deadlined { store, deadline }),
        )
    }
}

fn dispatch<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    config: &Result<NetworkConfig, CniError>,
) -> Result<Option<String>, CniError> {
    if inv.command == Command::Version {
        return Ok(Some(version::version_info()));
    }
    let config = config.as_ref().map_err(Clone::clone)?;
    debug!(config = ?config.ipam, args = ?inv.args, netns = %inv.netns, "decoded the invocation");
    match inv.command {
        Command::Add => cmd_add(cx, inv, config).map(Some),
        Command::Del => cmd_del(cx, inv, config).map(|()| None),
        Command::Check => cmd_check(cx, inv, config).map(|()| None),
        Command::Gc => cmd_gc(cx, config).map(|()| None),
        Command::Status => cmd_status(cx, config).map(|()| None),
        Command::Version => Ok(Some(version::version_info())),
    }
}

fn pod_label(args: &CniArgs) -> String {
    match (&args.pod_namespace, &args.pod_name) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        _ => String::new(),
    }
}

fn pod_ref(args: &CniArgs, config: &NetworkConfig) -> Option<PodRef> {
    let annotations = config.conf.runtime_config.pod_annotations.as_ref();
    Some(PodRef {
        namespace: args.pod_namespace.clone()?,
        name: args.pod_name.clone()?,
        uid: args.pod_uid.clone(),
        persistent_pod_state: annotations
            .and_then(|a| a.get(ipkeep_values::keys::PERSISTENT_POD_STATE))
            .map(|name| name.trim())
            .filter(|name| !name.is_empty())
            .map(str::to_string),
        persistent_pod_state_uid: None,
        confirmed: false,
    })
}

fn attachment(inv: &Invocation) -> Attachment {
    Attachment {
        container_id: inv.container_id.clone(),
        ifname: inv.ifname.clone(),
    }
}

fn network_dir(config: &NetworkConfig) -> Result<NetworkDir, CniError> {
    NetworkDir::new(&config.settings.data_dir, &config.name)
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
    config: &NetworkConfig,
) -> Result<String, CniError> {
    let plan = config.ipam_plan()?;
    let dns = match &plan.resolv_conf {
        None => Dns::default(),
        Some(path) => Dns::parse_resolv_conf(&read_resolv_conf(path)?),
    };
    for why in &config.ignored_annotations {
        warn!("{why}");
    }
    let mut pod = pod_ref(&inv.args, config);
    let (retention, source) =
        match decide_retention(cx.call.api, &inv.args, config, &plan.retention, true) {
            Some(decided) => {
                if let Some(pod) = pod.as_mut() {
                    decided.record(pod);
                }
                (decided.resolved.retention, decided.resolved.source)
            }
            None => (Retention::Off, RetentionSource::NetworkDefault),
        };
    let requested = config.requested_ips(inv.args.ip)?;
    debug!(%retention, ?source, ?requested, ranges = plan.range_sets.len(), "allocating");
    let mut req = AddRequest {
        range_sets: &plan.range_sets,
        owner: attachment(inv),
        pod,
        retention,
        requested: &requested,
        netns: Some(inv.netns.clone()).filter(|n| !n.is_empty()),
        netns_known: BTreeMap::new(),
        reuse_cooldown: plan.reuse_cooldown,
    };
    let outcome = allocate(cx, config, &mut req)?;
    let (tally, notices) = report_add(&outcome, plan, req.pod.as_ref(), retention, source);
    cx.tally = tally;
    cx.notices = notices;
    Ok(add_result(&outcome, plan, dns).to_json(config.version))
}

/// Runs ADD's allocation on the network's store, after advancing the store's clock and saying
/// when the wall clock cannot be trusted. Where the allocation must know whether older
/// sandboxes' network namespaces exist, the stores say, and it runs again; those they cannot
/// judge end the command with [`Completion::needs_netns`].
fn allocate<S: Stores>(
    cx: &mut Context<'_, S>,
    config: &NetworkConfig,
    req: &mut AddRequest<'_>,
) -> Result<AddOutcome, CniError> {
    let reading = &cx.call.reading;
    let stores = cx.stores;
    let mut unjudged = Vec::new();
    let allocated = cx.with_store(config, |store| {
        let t = Instant::now();
        let mark = store.clock()?;
        let now = clock::advance(mark.as_ref(), reading).now;
        if let Some(ahead) = clock::doubted_wall(mark.as_ref(), reading) {
            warn!(
                ahead = %ipkeep_values::time::duration(ahead),
                hint = logs::hint::DOUBTED_WALL,
                "after a reboot the wall clock is far past this store's last time, and not synchronised"
            );
        } else if let Some(ahead) = clock::wall_ahead(now, reading) {
            warn!(
                ahead = %ipkeep_values::time::duration(ahead),
                hint = logs::hint::WALL_AHEAD,
                "the wall clock is ahead of the store's clock (it jumped forward)"
            );
        }
        // The namespaces the allocation asks about, judged by the stores, and again.
        loop {
            let paths = match allocator::add(store, req, reading) {
                Err(AllocError::NeedsNetns(paths)) => paths,
                added => return Ok((added?, t)),
            };
            let known = req.netns_known.len();
            for path in &paths {
                if let Some(exists) = stores.netns_exists(path) {
                    req.netns_known.insert(path.clone(), exists);
                }
            }
            if req.netns_known.len() == known {
                unjudged.clone_from(&paths);
                return Err(AllocError::NeedsNetns(paths).into());
            }
        }
    });
    cx.needs_netns = unjudged;
    let (outcome, t) = allocated?;
    cx.timings.record("alloc_commit", t);
    Ok(outcome)
}

/// What ADD's outcome means for the node's counts and the pod's owner, with a log line per
/// address: expired holdings released, kept addresses outside the current ranges, and how each
/// address was found.
fn report_add(
    outcome: &AddOutcome,
    plan: &IpamPlan,
    pod: Option<&PodRef>,
    retention: Retention,
    source: RetentionSource,
) -> (Tally, Vec<Notice>) {
    let mut tally = Tally {
        expired: outcome.expired.len(),
        ..Tally::default()
    };
    let mut notices = Vec::new();
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
                hint = "the node's pod CIDR or the CNI configuration changed; the pod gets a new address",
                "the address kept for this pod is outside the network's current ranges: released"
            );
            if let Some(pod) = pod {
                notices.push(Notice::OutsideRanges {
                    pod: pod.clone(),
                    ip: lease.ip,
                    ranges: ranges.clone(),
                    new_ips: new_ips.clone(),
                });
            }
        }
    }
    for lease in &outcome.kept_for_another {
        let state = lease
            .pod
            .as_ref()
            .and_then(|p| p.persistent_pod_state.as_deref())
            .unwrap_or_default();
        let this_pod = pod
            .and_then(|p| p.persistent_pod_state.as_deref())
            .unwrap_or("none");
        warn!(
            ip = %lease.ip,
            confirmed = lease.pod.as_ref().is_some_and(|p| p.confirmed),
            this_pod_managed_by = this_pod,
            hint = "it stays kept for that state's pod, and this pod gets another address",
            "{} is kept under this pod's name for the pod of PersistentPodState {state}, which does not manage this pod",
            lease.ip
        );
    }
    for a in &outcome.assignments {
        match &a.source {
            Source::Existing => {
                info!(ip = %a.ip, "repeated ADD: returning the address the attachment already has");
            }
            Source::Retained { from, was_held } => {
                tally.allocated += 1;
                tally.retained += 1;
                info!(ip = %a.ip, from = %from, was_held, %retention, ?source, "gave the pod its retained address back");
            }
            Source::Cooling { freed_at } => {
                tally.allocated += 1;
                tally.cooling += 1;
                warn!(
                    ip = %a.ip,
                    freed_at = %ipkeep_values::time::rfc3339(*freed_at),
                    cooldown = %ipkeep_values::time::duration(plan.reuse_cooldown),
                    hint = "every other address was freed less than ipam.reuseCooldown ago: the one freed longest ago goes to this pod",
                    "no address of the range is free: one still in its reuse cooldown goes to this pod"
                );
            }
            Source::Reclaimed { from } => {
                tally.allocated += 1;
                tally.reclaimed += 1;
                warn!(
                    ip = %a.ip,
                    held_for = %from.pod.as_ref().map(ToString::to_string).unwrap_or_default(),
                    held_until = %until_text(from.state),
                    hint = "that pod gets a new address when it comes back",
                    "the range is full: the address held for a deleted pod goes to this pod instead"
                );
            }
            other => {
                tally.allocated += 1;
                info!(ip = %a.ip, how = ?other, %retention, ?source, "allocated");
            }
        }
    }
    (tally, notices)
}

/// ADD's result: the assigned addresses with their ranges' prefixes and gateways, the
/// configured routes and DNS.
fn add_result(outcome: &AddOutcome, plan: &IpamPlan, dns: Dns) -> IpamResult {
    IpamResult {
        ips: outcome
            .assignments
            .iter()
            .map(|a| IpConfig {
                address: ipnetwork::IpNetwork::new(a.ip, a.range.subnet.prefix())
                    .unwrap_or(a.range.subnet),
                gateway: a.range.gateway,
            })
            .collect(),
        routes: plan.routes.clone(),
        dns,
    }
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
    config: &NetworkConfig,
) -> Result<(), CniError> {
    // DEL is best effort: it needs only the network name and the data directory, so a range
    // configuration that has since become invalid cannot strand addresses.
    let dir = network_dir(config)?;
    if !cx.stores.exists(&dir) {
        info!("nothing to release: the network has no store yet");
        return Ok(());
    }
    let departure = match departure(cx.call.api, inv, config) {
        Ok(departure) => departure,
        Err(unavailable) => {
            warn!(
                why = %unavailable.why,
                hint = "the node agent applies this DEL itself once its view is synced, as one that never came",
                "DEL deferred: the addresses stay with the sandbox until the node agent can say who manages the pod"
            );
            return Ok(());
        }
    };
    let reading = &cx.call.reading;
    let owner = attachment(inv);
    let (outcome, t) = cx.with_store(config, |store| {
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

/// What the node agent's view (or, without it, nobody) says manages the pod of the command;
/// `None` for an attachment that names no pod.
fn said(
    api: &dyn ApiView,
    args: &CniArgs,
    config: &NetworkConfig,
    adding: bool,
) -> Option<Management> {
    Some(api.management(&SandboxPod {
        namespace: args.pod_namespace.as_ref()?,
        name: args.pod_name.as_ref()?,
        uid: args.pod_uid.as_deref(),
        adding,
        annotations: config.conf.runtime_config.pod_annotations.as_ref(),
    }))
}

/// The pod's retention, for ADD (`adding`) to record and for DEL to decide by in place of what
/// ADD recorded: what the node agent's view of the API server says manages the pod (or, without
/// that view, the pod's annotations), within the network's `policy`. ADD and DEL resolve it
/// here alike, with the same log lines. `None` for an attachment that names no pod: nothing is
/// held for it.
fn decide_retention(
    api: &dyn ApiView,
    args: &CniArgs,
    config: &NetworkConfig,
    policy: &RetentionPolicy,
    adding: bool,
) -> Option<Decided> {
    let said = said(api, args, config, adding)?;
    let annotations = config.conf.runtime_config.pod_annotations.as_ref();
    Some(management::decide(&said, policy, annotations))
}

/// What DEL decides in place of what ADD recorded: the retention [`decide_retention`] resolves,
/// and the agent's word on who manages the pod. Without the agent's view and without the pod's
/// annotations at DEL nothing decides anew, and the retention resolved at ADD stands. `Err`:
/// the agent's view is syncing ([`Management::Syncing`]), and the DEL waits for it.
fn departure(
    api: &dyn ApiView,
    inv: &Invocation,
    config: &NetworkConfig,
) -> Result<Departure, Unavailable> {
    let Ok(policy) = &config.retention else {
        return Ok(Departure::default());
    };
    // Nothing to hold for an unnamed attachment: DEL frees it whatever anyone says.
    let Some(said) = said(api, &inv.args, config, false) else {
        return Ok(Departure::default());
    };
    if let Management::Syncing(unavailable) = said {
        return Err(unavailable);
    }
    let annotations = config.conf.runtime_config.pod_annotations.as_ref();
    let decided = management::decide(&said, policy, annotations);
    Ok(Departure {
        retention: (decided.confirmed.is_some() || annotations.is_some())
            .then_some(decided.resolved.retention),
        confirmed: decided.confirmed,
        judged_by_name: decided.judged_by_name,
    })
}

fn cmd_check<S: Stores>(
    cx: &mut Context<'_, S>,
    inv: &Invocation,
    config: &NetworkConfig,
) -> Result<(), CniError> {
    if !config.version.allows_check() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow CHECK",
        ));
    }
    config.ipam_plan()?;
    let dir = network_dir(config)?;
    let owner = attachment(inv);
    if !cx.stores.exists(&dir) {
        return Err(ipkeep_ipam::CheckError::NotFound(owner).into());
    }
    cx.with_store(config, |store| {
        allocator::check(&*store, &owner, &config.previous_ips())?;
        Ok(())
    })
}

fn cmd_gc<S: Stores>(cx: &mut Context<'_, S>, config: &NetworkConfig) -> Result<(), CniError> {
    if !config.version.allows_gc_and_status() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow GC",
        ));
    }
    let valid: BTreeSet<Attachment> = config.valid_attachments()?.into_iter().collect();
    let dir = network_dir(config)?;
    if !cx.stores.exists(&dir) {
        return Ok(());
    }
    let reading = &cx.call.reading;
    let outcome = cx.with_store(config, |store| Ok(allocator::gc(store, &valid, reading)?))?;
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

fn cmd_status<S: Stores>(cx: &mut Context<'_, S>, config: &NetworkConfig) -> Result<(), CniError> {
    if !config.version.allows_gc_and_status() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "config version does not allow STATUS",
        ));
    }
    config.ipam_plan()?;
    // Cheap: no lock, no database. The plugin can serve ADD when its store can be written.
    let dir = network_dir(config)?;
    cx.stores
        .status(&dir)
        .map_err(|why| CniError::new(code::NOT_AVAILABLE, why))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_management;
