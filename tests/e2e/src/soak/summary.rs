//! What a soak found: a counter per invariant, the faults injected (each with its time), the
//! figures (rebuilds, kept-address rate, time to recover per component, memory), and the
//! exceptions in words. Printed as a table a person reads at a glance and written as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::judge::Trend;
use super::schedule::{FaultKind, Planned};

/// One fault as it was carried out.
#[derive(Debug, Clone, Serialize)]
pub struct Injected {
    /// Seconds from the start when it began.
    pub at: f64,
    /// What.
    pub kind: FaultKind,
    /// Its target (a node, a pod, a process), in words.
    pub target: String,
    /// How long it lasted (seconds), from start to undone.
    pub lasted: f64,
    /// Seconds from its end until every ipkeep component was Ready again (`None`: not within
    /// the bound).
    pub recovered_after: Option<f64>,
    /// Said when the fault could not be injected as planned.
    pub note: Option<String>,
}

/// One invariant: how often it was checked and how often it failed, with the failures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Invariant {
    /// Checks made.
    pub checked: u64,
    /// Checks that failed.
    pub violated: u64,
    /// Checks not held to the rule because a fault explains them (a node down, ...).
    pub excused: u64,
    /// The failures, in words, with the faults around each.
    pub failures: Vec<String>,
    /// The first excuses, in words: what the check found and the faults that excused it.
    pub excuses: Vec<String>,
}

/// How many failures or excuses of one invariant the report keeps in words.
const KEPT_IN_WORDS: usize = 50;

/// How many excuses of one invariant the table shows.
const EXCUSES_IN_TABLE: usize = 3;

impl Invariant {
    /// Counts a passed check.
    pub fn pass(&mut self) {
        self.checked += 1;
    }

    /// Counts a failed check, said as `what`.
    pub fn fail(&mut self, what: String) {
        self.checked += 1;
        self.violated += 1;
        if self.failures.len() < KEPT_IN_WORDS {
            self.failures.push(what);
        }
    }

    /// Counts a check that was excused, said as `why` (what it found, what excused it).
    pub fn excuse(&mut self, why: String) {
        self.excused += 1;
        if self.excuses.len() < KEPT_IN_WORDS {
            self.excuses.push(why);
        }
    }
}

/// Memory of one component over the run.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// Largest resident set seen, MiB.
    pub max_mib: f64,
    /// The trend of the longest-lived process of it (`None`: too few samples).
    pub trend: Option<Trend>,
    /// Samples taken.
    pub samples: usize,
}

/// Everything a soak reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// The seed.
    pub seed: u64,
    /// The soak's planned length, seconds.
    pub duration: u64,
    /// The nodes.
    pub nodes: usize,
    /// `ipv4` or `dual`.
    pub ip_family: String,
    /// Wall-clock seconds of the whole run (settling included).
    pub elapsed: f64,
    /// The planned schedule.
    pub schedule: Vec<Planned>,
    /// The faults as carried out.
    pub faults: Vec<Injected>,
    /// Invariants by name.
    pub invariants: BTreeMap<&'static str, Invariant>,
    /// Workload operations carried out, by kind.
    pub operations: BTreeMap<&'static str, u64>,
    /// Rebuilds seen (a pod of a recorded name created again), and those that kept node and
    /// every address.
    pub rebuilds: u64,
    /// Of [`Summary::rebuilds`], those that came back on their node with every address.
    pub kept: u64,
    /// Longest time to Ready again after a fault, seconds, per component.
    pub recovery_max: BTreeMap<String, f64>,
    /// Memory per component.
    pub memory: BTreeMap<String, Memory>,
    /// Control-plane processes that exited and were started again (as a control-plane node's
    /// supervisor would), with when (seconds from the start) and why, in words.
    pub supervised: Vec<(f64, String)>,
}

/// The invariants, in the order the table shows them.
pub const INVARIANTS: [(&str, &str); 7] = [
    (
        "unique-addresses",
        "no two live pods share an address (API and stores, every second)",
    ),
    (
        "rebuilds-keep",
        "a rebuilt pod comes back on its node with every address",
    ),
    (
        "holdings-explained",
        "after settling, every address held has a reason",
    ),
    (
        "no-pod-stuck",
        "no pod stuck not Ready past the bound (its node up)",
    ),
    (
        "hooks-wait",
        "a hooked pod's deletion waits for its operator or timeout, no longer",
    ),
    (
        "components-recover",
        "every ipkeep component Ready again after each fault",
    ),
    ("memory-flat", "no component's memory trends upward"),
];

impl Summary {
    /// The invariant `name`.
    pub fn invariant(&mut self, name: &'static str) -> &mut Invariant {
        self.invariants.entry(name).or_default()
    }

    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.invariants.values().all(|i| i.violated == 0)
    }

    /// Faults carried out per kind.
    pub fn per_kind(&self) -> BTreeMap<FaultKind, u64> {
        let mut out = BTreeMap::new();
        for f in &self.faults {
            *out.entry(f.kind).or_default() += 1;
        }
        out
    }

    /// The table.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\nsoak: seed {} · {} s · {} nodes · {} · {:.0} s wall clock",
            self.seed, self.duration, self.nodes, self.ip_family, self.elapsed
        );
        let _ = writeln!(
            t,
            "\n{:<20} {:>8} {:>8} {:>8}  rule",
            "invariant", "checked", "excused", "FAILED"
        );
        for (name, rule) in INVARIANTS {
            let i = self.invariants.get(name).cloned().unwrap_or_default();
            let mark = if i.violated == 0 {
                "ok".to_string()
            } else {
                i.violated.to_string()
            };
            let _ = writeln!(
                t,
                "{name:<20} {:>8} {:>8} {mark:>8}  {rule}",
                i.checked, i.excused
            );
        }
        let _ = writeln!(
            t,
            "\n{:<24} {:>6} {:>12} {:>12}",
            "fault", "count", "max lasted", "max recover"
        );
        for (kind, n) in self.per_kind() {
            let of_kind = self.faults.iter().filter(|f| f.kind == kind);
            let lasted = of_kind.clone().map(|f| f.lasted).fold(0.0, f64::max);
            let recover = of_kind
                .clone()
                .filter_map(|f| f.recovered_after)
                .fold(0.0, f64::max);
            let skipped = of_kind.clone().filter(|f| f.note.is_some()).count();
            let note = if skipped > 0 {
                format!("  ({skipped} with a note)")
            } else {
                String::new()
            };
            let _ = writeln!(
                t,
                "{:<24} {n:>6} {lasted:>10.0} s {recover:>10.0} s{note}",
                kind.name()
            );
        }
        let rate = if self.rebuilds == 0 {
            100.0
        } else {
            100.0 * self.kept as f64 / self.rebuilds as f64
        };
        let _ = writeln!(
            t,
            "\nrebuilds {} · kept node and every address {} ({rate:.1} %) · operations {}",
            self.rebuilds,
            self.kept,
            self.operations
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            t,
            "\n{:<28} {:>10} {:>10} {:>8}",
            "component", "recover", "max MiB", "trend"
        );
        let mut names: Vec<&String> = self.recovery_max.keys().chain(self.memory.keys()).collect();
        names.sort();
        names.dedup();
        for name in names {
            let recover = self
                .recovery_max
                .get(name)
                .map_or("-".into(), |s| format!("{s:.0} s"));
            let (max, trend) = self.memory.get(name).map_or(("-".into(), "-".into()), |m| {
                (
                    format!("{:.1}", m.max_mib),
                    m.trend.map_or("-".into(), |t| format!("×{:.2}", t.ratio)),
                )
            });
            let _ = writeln!(t, "{name:<28} {recover:>10} {max:>10} {trend:>8}");
        }
        for (at, what) in &self.supervised {
            let _ = writeln!(t, "supervisor at {at:.0} s: {what}");
        }
        for (name, i) in &self.invariants {
            for e in i.excuses.iter().take(EXCUSES_IN_TABLE) {
                let _ = writeln!(t, "excused {name}: {e}");
            }
            if i.excused > EXCUSES_IN_TABLE as u64 {
                let more = i.excused - EXCUSES_IN_TABLE as u64;
                let _ = writeln!(
                    t,
                    "excused {name}: {more} more (the JSON keeps the first {KEPT_IN_WORDS})"
                );
            }
        }
        for (name, i) in &self.invariants {
            for f in &i.failures {
                let _ = writeln!(t, "FAILED {name}: {f}");
            }
        }
        t
    }

    /// What reproduces a failure: the seed, the command, the faults in order.
    pub fn reproduce(&self) -> String {
        let mut t = format!(
            "\nreproduce: scripts/soak.sh --seed {} --duration {}s --nodes {} --ip-family {}\nthe faults, in order:\n",
            self.seed, self.duration, self.nodes, self.ip_family
        );
        for f in &self.faults {
            let _ = writeln!(t, "  {:>7.1} s  {:<24} {}", f.at, f.kind.name(), f.target);
        }
        t
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_table_says_what_failed_and_how_to_reproduce_it() {
        let mut s = Summary {
            seed: 7,
            duration: 60,
            nodes: 3,
            ip_family: "ipv4".into(),
            ..Summary::default()
        };
        s.invariant("unique-addresses").pass();
        assert!(s.passed());
        s.invariant("rebuilds-keep")
            .fail("s/a-0 came back on n1".into());
        s.faults.push(Injected {
            at: 12.5,
            kind: FaultKind::PowerCycle,
            target: "node-1".into(),
            lasted: 20.0,
            recovered_after: Some(31.0),
            note: None,
        });
        assert!(!s.passed());
        let table = s.table();
        assert!(
            table.contains("FAILED rebuilds-keep: s/a-0 came back on n1"),
            "{table}"
        );
        assert!(table.contains("power-cycle"), "{table}");
        let again = s.reproduce();
        assert!(
            again.contains("--seed 7") && again.contains("node-1"),
            "{again}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["invariants"]["rebuilds-keep"]["violated"], 1);
        assert_eq!(json["faults"][0]["kind"], "power-cycle");
    }

    /// An excuse is a pass the reader cannot check unless it says why: the table shows the
    /// first few of each invariant and how many more, the JSON keeps the first 50 in words.
    #[test]
    fn excuses_say_why_in_the_table_and_the_json() {
        let mut s = Summary::default();
        for i in 0..60 {
            s.invariant("hooks-wait").excuse(format!(
                "soak/hook-{i} on node-0: deleted early; excused by pause-etcd"
            ));
        }
        assert!(s.passed());
        let table = s.table();
        assert!(
            table.contains(
                "excused hooks-wait: soak/hook-0 on node-0: deleted early; excused by pause-etcd"
            ),
            "{table}"
        );
        assert!(!table.contains("soak/hook-3 "), "{table}");
        assert!(
            table.contains("excused hooks-wait: 57 more (the JSON keeps the first 50)"),
            "{table}"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["invariants"]["hooks-wait"]["excused"], 60);
        assert_eq!(
            json["invariants"]["hooks-wait"]["excuses"]
                .as_array()
                .unwrap()
                .len(),
            50
        );
    }
}
