//! The nemesis's fault kinds and its seeded schedule: pure, so one seed always gives the same
//! sequence of faults (kinds, nodes, times, how long each lasts), whatever the cluster does.
//!
//! The schedule starts with every chosen kind once, in a seeded order, so that a short soak
//! injects each at least once; after that each fault is a seeded pick. The workload's choices
//! come from a second stream of the same seed ([`Rng::stream`]), so adding a fault kind does not
//! change the workload.

use std::fmt;
use std::time::Duration;

/// One kind of fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of a node's `ipkeep-agent`.
    KillAgent,
    /// SIGKILL of the `ipkeep-controller` that holds the leader Lease.
    KillControllerLeader,
    /// SIGKILL of an `ipkeep-controller` that does not.
    KillControllerStandby,
    /// SIGKILL of an `ipkeep-scheduler-ext`.
    KillSchedulerExt,
    /// A node's kubelet and containerd stopped and started again (its pods keep running).
    RestartRuntime,
    /// A node powered off (every process of it killed, `/run` gone) and on again.
    PowerCycle,
    /// kube-apiserver stopped (SIGTERM) and started again with the same command line.
    RestartApiserver,
    /// etcd paused (SIGSTOP) for a moment, then resumed (SIGCONT).
    PauseEtcd,
    /// A node's store file system filled to the last byte for a while, then freed.
    FillStore,
    /// A node's wall clock stepped.
    StepClock,
}

impl FaultKind {
    /// Every kind, in the order the summary lists them.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::KillAgent,
        FaultKind::KillControllerLeader,
        FaultKind::KillControllerStandby,
        FaultKind::KillSchedulerExt,
        FaultKind::RestartRuntime,
        FaultKind::PowerCycle,
        FaultKind::RestartApiserver,
        FaultKind::PauseEtcd,
        FaultKind::FillStore,
        FaultKind::StepClock,
    ];

    /// The name `--faults` takes.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillAgent => "kill-agent",
            FaultKind::KillControllerLeader => "kill-controller-leader",
            FaultKind::KillControllerStandby => "kill-controller-standby",
            FaultKind::KillSchedulerExt => "kill-scheduler-ext",
            FaultKind::RestartRuntime => "restart-runtime",
            FaultKind::PowerCycle => "power-cycle",
            FaultKind::RestartApiserver => "restart-apiserver",
            FaultKind::PauseEtcd => "pause-etcd",
            FaultKind::FillStore => "fill-store",
            FaultKind::StepClock => "step-clock",
        }
    }

    /// Whether the node may turn NotReady: powered off, its runtime restarted, or its store
    /// full (the CNI STATUS fails, so containerd reports the network not ready and the kubelet
    /// the node NotReady).
    pub fn makes_node_not_ready(self) -> bool {
        self.disturbs_node() || self == FaultKind::FillStore
    }

    /// Whether the fault may disturb the control plane or ipkeep's controller: its leader
    /// killed, kube-apiserver or etcd away, or a node powered off or its runtime restarted
    /// (the leader may run there).
    pub fn disturbs_control_plane(self) -> bool {
        self.disturbs_node()
            || matches!(
                self,
                FaultKind::KillControllerLeader
                    | FaultKind::RestartApiserver
                    | FaultKind::PauseEtcd
            )
    }

    /// Whether the fault acts on one node.
    pub fn on_a_node(self) -> bool {
        matches!(
            self,
            FaultKind::KillAgent
                | FaultKind::RestartRuntime
                | FaultKind::PowerCycle
                | FaultKind::FillStore
                | FaultKind::StepClock
        )
    }

    /// Whether the node's pods may lose their sandboxes (their rebuilds are then not held to
    /// coming back on the node with every address).
    pub fn disturbs_node(self) -> bool {
        matches!(self, FaultKind::RestartRuntime | FaultKind::PowerCycle)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a `--faults` list cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    /// A name that is no fault kind.
    #[error("unknown fault kind {0:?} (kinds: all, {kinds})", kinds = FaultKind::ALL.map(FaultKind::name).join(", "))]
    UnknownKind(String),
    /// Nothing chosen.
    #[error("--faults names no fault kind")]
    Empty,
}

/// Reads `all` or a comma-separated list of kind names.
pub fn parse_kinds(list: &str) -> Result<Vec<FaultKind>, ScheduleError> {
    let mut kinds = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word == "all" {
            kinds.extend(FaultKind::ALL);
            continue;
        }
        let kind = (FaultKind::ALL.into_iter())
            .find(|k| k.name() == word)
            .ok_or_else(|| ScheduleError::UnknownKind(word.to_string()))?;
        kinds.push(kind);
    }
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() {
        return Err(ScheduleError::Empty);
    }
    Ok(kinds)
}

/// splitmix64: small, fast, and the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent stream of the same seed (`n` names it).
    pub fn stream(seed: u64, n: u64) -> Rng {
        let mut r = Rng(seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
        r.bits();
        r
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.bits() % n }
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with `percent` % probability.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        items.get(self.below(items.len() as u64) as usize)
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Planned {
    /// When, from the start of the soak.
    #[serde(serialize_with = "seconds")]
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
    /// Which node (an index into the nodes), for faults on a node.
    pub node: Option<usize>,
    /// How long the fault lasts before it is undone (a node off, etcd paused, a store full,
    /// the runtime stopped); zero for an instant one.
    #[serde(serialize_with = "seconds")]
    pub hold: Duration,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

/// The seconds between two faults, and how long each lasting one lasts.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Fewest seconds between two faults.
    pub min_gap: u64,
    /// Most seconds between two faults.
    pub max_gap: u64,
}

impl Pace {
    /// The pace for a soak of `duration`: one fault every 6–15 s in a short soak (so that every
    /// kind fits in a few minutes), every 10–40 s in a long one.
    pub fn for_duration(duration: Duration) -> Pace {
        if duration <= Duration::from_secs(20 * 60) {
            Pace {
                min_gap: 6,
                max_gap: 15,
            }
        } else {
            Pace {
                min_gap: 10,
                max_gap: 40,
            }
        }
    }
}

fn hold_of(kind: FaultKind, rng: &mut Rng) -> Duration {
    Duration::from_secs(match kind {
        FaultKind::PowerCycle => rng.between(10, 40),
        FaultKind::RestartRuntime => rng.between(1, 15),
        FaultKind::PauseEtcd => rng.between(1, 6),
        FaultKind::FillStore => rng.between(5, 30),
        _ => 0,
    })
}

/// The faults of a soak of `duration` with `kinds` on `nodes` nodes, from `seed`: every kind
/// once (seeded order) first, then seeded picks, until `duration`.
pub fn schedule(
    seed: u64,
    duration: Duration,
    kinds: &[FaultKind],
    nodes: usize,
    pace: Pace,
) -> Vec<Planned> {
    let mut rng = Rng::stream(seed, 1);
    let mut first: Vec<FaultKind> = kinds.to_vec();
    for i in (1..first.len()).rev() {
        first.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut out = Vec::new();
    let mut at = Duration::from_secs(rng.between(pace.min_gap, pace.max_gap));
    while at < duration {
        let kind = match first.get(out.len()) {
            Some(kind) => *kind,
            None => *rng.pick(kinds).unwrap_or(&FaultKind::KillAgent),
        };
        let node = kind
            .on_a_node()
            .then(|| rng.below(nodes.max(1) as u64) as usize);
        let hold = hold_of(kind, &mut rng);
        out.push(Planned {
            at,
            kind,
            node,
            hold,
        });
        at += Duration::from_secs(rng.between(pace.min_gap, pace.max_gap));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_schedule_and_every_kind_early() {
        let kinds = parse_kinds("all").unwrap();
        let d = Duration::from_secs(300);
        let pace = Pace::for_duration(d);
        let a = schedule(43, d, &kinds, 3, pace);
        assert_eq!(a, schedule(43, d, &kinds, 3, pace));
        assert_ne!(a, schedule(44, d, &kinds, 3, pace));
        let early: Vec<FaultKind> = a.iter().take(kinds.len()).map(|p| p.kind).collect();
        for kind in &kinds {
            assert!(early.contains(kind), "{kind} is not among the first faults");
        }
        assert!(a.iter().all(|p| p.at < d));
        assert!(a.iter().all(|p| p.node.is_some() == p.kind.on_a_node()));
        assert!(a.iter().filter_map(|p| p.node).all(|n| n < 3));
        // 10 kinds at 6-15 s apart fit in 5 minutes.
        assert!(a.len() >= kinds.len(), "{}", a.len());
    }

    #[test]
    fn fault_lists_are_read_strictly() {
        assert_eq!(
            parse_kinds("pause-etcd, kill-agent,pause-etcd").unwrap(),
            [FaultKind::KillAgent, FaultKind::PauseEtcd]
        );
        assert_eq!(parse_kinds("").unwrap_err(), ScheduleError::Empty);
        assert!(matches!(
            parse_kinds("kill-everything"),
            Err(ScheduleError::UnknownKind(w)) if w == "kill-everything"
        ));
    }

    #[test]
    fn streams_of_one_seed_differ() {
        let (mut a, mut b) = (Rng::stream(7, 1), Rng::stream(7, 2));
        assert_ne!(a.bits(), b.bits());
        let mut r = Rng::new(1);
        assert!((0..1000).all(|_| (3..=5).contains(&r.between(3, 5))));
    }
}
