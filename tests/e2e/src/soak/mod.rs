//! A randomized chaos soak on a real-node cluster (`ipkeep-soak`, `scripts/soak.sh`): a workload
//! of StatefulSets that scale, roll and lose pods ([`workload`]), a nemesis that injects every
//! kind of fault on a seeded schedule ([`schedule`], [`nemesis`]), and observers that check the
//! invariants continuously and at the end ([`watch`], [`judge`]), reported as a table and JSON
//! ([`summary`]). docs/soak.md says what each invariant means and how to read a failure.

pub mod cli;
pub mod judge;
pub mod nemesis;
pub mod schedule;
pub mod summary;
pub mod watch;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use self::nemesis::Target;
use self::schedule::{FaultKind, Pace, Planned, Rng};
use self::summary::{Injected, Summary};
use crate::SYSTEM_NAMESPACE;

/// What the soak runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The seed of the fault schedule and the workload.
    pub seed: u64,
    /// How long faults are injected (settling comes after).
    pub duration: Duration,
    /// The fault kinds.
    pub kinds: Vec<FaultKind>,
}

/// A fault's time window, for the observers' excuses and reports.
#[derive(Debug, Clone)]
pub struct Window {
    kind: FaultKind,
    target: String,
    start: f64,
    end: f64,
}

/// What the soak's tasks share.
#[derive(Debug, Default)]
pub struct Shared {
    /// The report being built.
    pub summary: Summary,
    /// Unix seconds at the start (API timestamps are converted with it).
    pub start_unix: f64,
    /// Every fault's window.
    windows: Vec<Window>,
    /// Hooked pods the workload force-deleted (their hook is skipped on purpose), by UID.
    pub forced: BTreeSet<String>,
    /// When the operator stand-in deregistered each hooked pod, by UID.
    pub released: BTreeMap<String, f64>,
}

/// Locks `shared`, whatever a panicking task left.
pub fn lock(shared: &Arc<Mutex<Shared>>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn overlapping(&self, from: f64, to: f64) -> impl Iterator<Item = &Window> {
        self.windows
            .iter()
            .filter(move |w| w.start <= to && w.end >= from)
    }

    /// The faults within two minutes of `at`, in words.
    pub fn faults_around(&self, at: f64) -> String {
        in_words(self.overlapping(at - 120.0, at + 5.0)).unwrap_or_else(|| "none".into())
    }

    /// The faults that powered `node` off or restarted its runtime between `from` and `to`, in
    /// words; `None` when none did.
    pub fn node_disturbed(&self, node: &str, from: f64, to: f64) -> Option<String> {
        in_words(
            self.overlapping(from, to)
                .filter(|w| w.kind.disturbs_node() && w.target == node),
        )
    }

    /// Whether any node was.
    pub fn any_node_disturbed(&self, from: f64, to: f64) -> bool {
        self.overlapping(from, to).any(|w| w.kind.disturbs_node())
    }

    /// Why a hooked pod on `node`, held from `from` and deleted at `to`, may have gone without
    /// its hook for a reason ipkeep documents: the controller's leader or the control plane
    /// disturbed, or the pod's node not Ready (`lifecycle.md`: a deletion passes then). The
    /// faults that explain it, in words; `None` when nothing does.
    pub fn hook_may_escape(&self, node: &str, from: f64, to: f64) -> Option<String> {
        in_words(self.overlapping(from, to).filter(|w| {
            w.kind.disturbs_control_plane() || (w.kind.makes_node_not_ready() && w.target == node)
        }))
    }
}

/// Fault windows in words ("power-cycle node-1 at 89 s, pause-etcd at 95 s"); `None` for none.
/// A window lasts from the fault's start until every ipkeep component was Ready again after it.
fn in_words<'a>(windows: impl Iterator<Item = &'a Window>) -> Option<String> {
    let text: Vec<String> = windows
        .map(|w| {
            let target = if w.target.is_empty() {
                String::new()
            } else {
                format!(" {}", w.target)
            };
            format!("{}{target} at {:.0} s", w.kind, w.start)
        })
        .collect();
    (!text.is_empty()).then(|| text.join(", "))
}

/// How many ipkeep pods of each component a healthy cluster of `nodes` nodes runs.
fn expected_components(nodes: usize) -> [(&'static str, usize); 3] {
    [
        ("ipkeep-agent", nodes),
        ("ipkeep-controller", 2),
        ("ipkeep-scheduler-ext", 2),
    ]
}

/// Waits (up to `bound`) until every ipkeep component has all its pods Ready; the seconds each
/// component took (`None`: not within the bound).
pub async fn components_ready(
    client: &Client,
    nodes: usize,
    bound: Duration,
) -> BTreeMap<&'static str, Option<f64>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let t = Instant::now();
    let mut out: BTreeMap<&'static str, Option<f64>> = BTreeMap::new();
    loop {
        let list = pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for (component, want) in expected_components(nodes) {
            if out.get(component).is_some_and(Option::is_some) {
                continue;
            }
            let ready = list
                .iter()
                .filter(|p| {
                    p.name_any().starts_with(component) && p.metadata.deletion_timestamp.is_none()
                })
                .filter(|p| crate::objects::is_ready(p))
                .count();
            out.insert(
                component,
                (ready >= want).then(|| t.elapsed().as_secs_f64()),
            );
        }
        if out.values().all(Option::is_some) || t.elapsed() > bound {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Carries out one planned fault and waits for the components to recover.
async fn inject(target: Target, planned: Planned, shared: Arc<Mutex<Shared>>, started: Instant) {
    let at = started.elapsed().as_secs_f64();
    let node = planned.node.and_then(|n| target.nodes.get(n)).cloned();
    let index = {
        let mut s = lock(&shared);
        s.windows.push(Window {
            kind: planned.kind,
            target: node.clone().unwrap_or_default(),
            start: at,
            end: f64::INFINITY,
        });
        s.windows.len() - 1
    };
    eprintln!(
        "soak: {at:7.1} s  {} {}",
        planned.kind,
        node.clone().unwrap_or_default()
    );
    let done = target
        .inject(planned.kind, planned.node, planned.hold)
        .await;
    let ended = started.elapsed().as_secs_f64();
    let (target_text, note) = match done {
        Ok(d) => (d.target, d.note),
        Err(e) => (
            node.clone().unwrap_or_default(),
            Some(format!("failed: {e:#}")),
        ),
    };
    let skipped = note.as_deref().is_some_and(|n| n.starts_with("skipped"));
    // A killed container is seen not Ready a moment later; only then does waiting mean anything.
    if !skipped {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let ready =
        components_ready(&target.client, target.nodes.len(), Duration::from_secs(240)).await;
    let recovered = started.elapsed().as_secs_f64() - ended;
    let mut s = lock(&shared);
    s.windows[index].end = started.elapsed().as_secs_f64();
    let all = ready.values().all(Option::is_some);
    for (component, seconds) in &ready {
        if let Some(secs) = seconds {
            let max = s
                .summary
                .recovery_max
                .entry(component.to_string())
                .or_insert(0.0);
            *max = max.max(*secs);
        }
    }
    if all {
        s.summary.invariant("components-recover").pass();
    } else {
        let late: Vec<&str> = ready
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| *k)
            .collect();
        s.summary.invariant("components-recover").fail(format!(
            "{} at {at:.0} s ({target_text}): {} not Ready within 240 s",
            planned.kind,
            late.join(", ")
        ));
    }
    if let Some(note) = &note {
        eprintln!("soak: {at:7.1} s  {}: {note}", planned.kind);
    }
    s.summary.faults.push(Injected {
        at,
        kind: planned.kind,
        target: target_text,
        lasted: ended - at,
        recovered_after: all.then_some(recovered),
        note,
    });
}

/// Runs the soak on the cluster of `target`; the summary.
pub async fn run(target: &Target, options: &Options, ip_family: &str) -> Result<Summary> {
    let client = target.client.clone();
    let shared = Arc::new(Mutex::new(Shared {
        start_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs_f64(),
        ..Shared::default()
    }));
    let plan = schedule::schedule(
        options.seed,
        options.duration,
        &options.kinds,
        target.nodes.len(),
        Pace::for_duration(options.duration),
    );
    {
        let mut s = lock(&shared);
        s.summary.seed = options.seed;
        s.summary.duration = options.duration.as_secs();
        s.summary.nodes = target.nodes.len();
        s.summary.ip_family = ip_family.to_string();
        s.summary.schedule = plan.clone();
    }
    eprintln!(
        "soak: seed {}: {} faults planned over {} s",
        options.seed,
        plan.len(),
        options.duration.as_secs()
    );
    workload::create(&client)
        .await
        .context("create the workload")?;
    // The hooked StatefulSets' first pods stay not Ready until the operator registers them
    // (preNormal), so the operator answers from the start; its seeded stream for the soak
    // proper begins with the faults.
    let first_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first_operator = tokio::spawn(operate_hooks(
        client.clone(),
        shared.clone(),
        first_stop.clone(),
        (options.seed, FIRST_PODS_STREAM),
        Instant::now(),
    ));
    let first_pods = wait_workload_ready(&client, Duration::from_secs(300)).await;
    first_stop.store(true, std::sync::atomic::Ordering::Release);
    let _ = first_operator.await;
    first_pods.context("the workload's first pods")?;
    let started = Instant::now();
    {
        // Timestamps of the API are converted with the start of the faults.
        let mut s = lock(&shared);
        s.start_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs_f64();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observers = tokio::spawn(observe(
        target.clone(),
        shared.clone(),
        stop.clone(),
        started,
    ));
    let operator = tokio::spawn(operate_hooks(
        client.clone(),
        shared.clone(),
        stop.clone(),
        (options.seed, OPERATOR_STREAM),
        started,
    ));
    let churn = tokio::spawn(churn(
        client.clone(),
        shared.clone(),
        options.seed,
        started,
        options.duration,
    ));
    // One fault on a node at a time: a node's next fault waits for the one before (its hold
    // and the components' recovery), in its task, so that the faults on other nodes and on the
    // control plane keep their times.
    let node_turns: Vec<Arc<tokio::sync::Mutex<()>>> = (target.nodes.iter())
        .map(|_| Arc::new(tokio::sync::Mutex::new(())))
        .collect();
    let mut faults = Vec::new();
    for planned in plan {
        let wait = planned.at.saturating_sub(started.elapsed());
        tokio::time::sleep(wait).await;
        let turn = planned.node.and_then(|n| node_turns.get(n)).cloned();
        let (target, shared) = (target.clone(), shared.clone());
        faults.push(tokio::spawn(async move {
            let _turn = match turn {
                Some(t) => Some(t.lock_owned().await),
                None => None,
            };
            inject(target, planned, shared, started).await;
        }));
    }
    tokio::time::sleep(options.duration.saturating_sub(started.elapsed())).await;
    let _ = churn.await;
    for f in faults {
        let _ = f.await;
    }
    eprintln!(
        "soak: {:.0} s: faults over; settling",
        started.elapsed().as_secs_f64()
    );
    settle(target, &shared, started).await?;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let memory = observers.await.context("the observers")?;
    let _ = operator.await;
    let mut s = lock(&shared);
    s.summary.memory = memory;
    let upward: Vec<String> = s
        .summary
        .memory
        .iter()
        .filter(|(_, m)| m.trend.is_some_and(|t| t.upward()))
        .map(|(c, m)| format!("{c} {:?}", m.trend))
        .collect();
    let checked = s.summary.memory.len();
    let inv = s.summary.invariant("memory-flat");
    inv.checked += checked as u64;
    for c in upward {
        inv.fail(format!("memory trends upward: {c}"));
    }
    s.summary.elapsed = started.elapsed().as_secs_f64();
    Ok(s.summary.clone())
}

async fn wait_workload_ready(client: &Client, bound: Duration) -> Result<()> {
    let t = Instant::now();
    loop {
        let mut all = true;
        for shape in &workload::SHAPES {
            let pods: Api<Pod> = Api::namespaced(client.clone(), shape.namespace);
            let list = pods
                .list(&ListParams::default().labels(&format!("app={}", shape.name)))
                .await?
                .items;
            let ready = list
                .iter()
                .filter(|p| crate::objects::is_ready(p) && p.metadata.deletion_timestamp.is_none())
                .count();
            all &= ready == shape.replicas as usize && list.len() == shape.replicas as usize;
        }
        if all {
            return Ok(());
        }
        anyhow::ensure!(
            t.elapsed() < bound,
            "the workload was not Ready within {} s",
            bound.as_secs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The observers' loop until `stop`: the API and stores every second, memory every ten.
async fn observe(
    target: Target,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    started: Instant,
) -> BTreeMap<String, summary::Memory> {
    let mut observer = watch::Observer::default();
    let mut last_memory = 0.0;
    // Read while they run: a supervisor starts them again as they were.
    let supervised = target.supervised_commands().unwrap_or_else(|e| {
        eprintln!("soak: the control plane will not be supervised: {e:#}");
        Vec::new()
    });
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let t = Instant::now();
        let now = started.elapsed().as_secs_f64();
        for what in nemesis::keep_up(&target.state, &supervised) {
            eprintln!("soak: {now:7.1} s  {what}");
            lock(&shared).summary.supervised.push((now, what));
        }
        if let Err(e) = observer.sample(&target.client, &target, &shared, now).await {
            tracing_note(&format!("a sample failed (the API may be down): {e:#}"));
        }
        if now - last_memory >= 10.0 {
            observer.sample_memory();
            last_memory = now;
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(t.elapsed())).await;
    }
    observer.memory()
}

fn tracing_note(text: &str) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
        eprintln!("soak: {text}");
        *last = Some(Instant::now());
    }
}

/// The seeded streams of the operator stand-in: while the first pods start, and during the soak.
const FIRST_PODS_STREAM: u64 = 4;
const OPERATOR_STREAM: u64 = 3;

async fn operate_hooks(
    client: Client,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    (seed, stream): (u64, u64),
    started: Instant,
) {
    let mut rng = Rng::stream(seed, stream);
    let mut op = workload::Operator::default();
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let now = started.elapsed().as_secs_f64();
        let _ = workload::operator_round(&client, &mut op, &mut rng, now, &shared).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn churn(
    client: Client,
    shared: Arc<Mutex<Shared>>,
    seed: u64,
    started: Instant,
    duration: Duration,
) {
    let mut rng = Rng::stream(seed, 2);
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(rng.between(3, 8))).await;
        let op = workload::operate(&client, &mut rng, &shared)
            .await
            .unwrap_or("failed");
        *lock(&shared).summary.operations.entry(op).or_default() += 1;
    }
}

/// After the faults: every node on, the workload back to its size and Ready, ipkeep Ready;
/// then every node's store must hold only what explains itself (within four minutes: a DEL the
/// agent applies itself waits for its grace).
async fn settle(target: &Target, shared: &Arc<Mutex<Shared>>, started: Instant) -> Result<()> {
    for node in &target.nodes {
        if !target
            .state
            .join("pids")
            .join(format!("{node}-holder"))
            .exists()
        {
            target.node("start", node).await?;
        }
    }
    workload::scale_back(&target.client).await?;
    let settled = wait_workload_ready(&target.client, Duration::from_secs(420)).await;
    if let Err(e) = &settled {
        lock(shared)
            .summary
            .invariant("no-pod-stuck")
            .fail(format!("after the faults: {e:#}"));
    }
    let ready =
        components_ready(&target.client, target.nodes.len(), Duration::from_secs(240)).await;
    if ready.values().any(Option::is_none) {
        lock(shared)
            .summary
            .invariant("components-recover")
            .fail(format!("after settling: {ready:?}"));
    }
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let findings = unexplained(target).await?;
        let now = started.elapsed().as_secs_f64();
        if findings.is_empty() || Instant::now() > deadline {
            let mut s = lock(shared);
            s.summary.invariant("holdings-explained").pass();
            for f in findings {
                s.summary
                    .invariant("holdings-explained")
                    .fail(format!("{f} ({now:.0} s)"));
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Every store's addresses that neither a running pod nor a record on that node explains.
async fn unexplained(target: &Target) -> Result<Vec<String>> {
    let records = watch::records(&target.client).await?;
    let pods = Api::<Pod>::all(target.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let mut out = Vec::new();
    for node in &target.nodes {
        let running: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        let Some(leases) = watch::store(target, node).await else {
            out.push(format!("{node}: its store cannot be listed"));
            continue;
        };
        for l in judge::unexplained_holdings(node, &leases, &records, &running) {
            out.push(format!(
                "{node}: {} {} for {}",
                if l.held { "holds" } else { "has active" },
                l.ip,
                l.pod
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(kind: FaultKind, target: &str, start: f64, end: f64) -> Window {
        Window {
            kind,
            target: target.into(),
            start,
            end,
        }
    }

    /// The hour-long soak's seed 20261129: hookord-1 on node-0 was deleted 2 s into its hold,
    /// as node-0's store was full. A full store fails the CNI STATUS, containerd reports the
    /// network not ready, the kubelet marks node-0 NotReady, and a held pod's deletion passes on
    /// a node not Ready (documented). A full store on another node excuses nothing.
    #[test]
    fn a_full_store_on_the_pods_node_excuses_a_hook_skipped() {
        let shared = Shared {
            windows: vec![
                window(FaultKind::FillStore, "node-0", 421.0, 470.0),
                window(FaultKind::KillAgent, "node-2", 421.0, 480.0),
                window(FaultKind::PauseEtcd, "", 500.0, 510.0),
            ],
            ..Shared::default()
        };
        assert_eq!(
            shared.hook_may_escape("node-0", 424.0, 426.0).as_deref(),
            Some("fill-store node-0 at 421 s")
        );
        assert_eq!(shared.hook_may_escape("node-1", 424.0, 426.0), None);
        assert_eq!(shared.hook_may_escape("node-0", 480.0, 482.0), None);
        assert_eq!(
            shared.hook_may_escape("node-1", 505.0, 506.0).as_deref(),
            Some("pause-etcd at 500 s")
        );
    }
}
