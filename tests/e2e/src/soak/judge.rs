//! The soak's invariants as pure judgements over what was observed: addresses shared by two
//! live pods, a rebuilt pod against its record, a hooked pod's deletion against its hook, a
//! store's holdings against what explains them, and a memory series' trend. No I/O: the
//! observers (`watch`) feed them, and each is tested here with plain values.

use std::collections::{BTreeMap, BTreeSet};

/// A pod as one sample of the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePod {
    /// `namespace/name`.
    pub key: String,
    /// Its UID.
    pub uid: String,
    /// Its node, once bound.
    pub node: Option<String>,
    /// Its addresses (`status.podIPs`).
    pub ips: Vec<String>,
}

/// Addresses that two live pods have at once: `(ip, pods)`.
pub fn shared_addresses(pods: &[LivePod]) -> Vec<(String, Vec<String>)> {
    let mut owners: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for pod in pods {
        for ip in &pod.ips {
            owners.entry(ip).or_default().insert(&pod.key);
        }
    }
    owners
        .into_iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(ip, pods)| (ip.to_string(), pods.into_iter().map(String::from).collect()))
        .collect()
}

/// One lease of a node's store, as `ipkeep list --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLease {
    /// The address.
    pub ip: String,
    /// `namespace/name` of its pod (empty without one).
    pub pod: String,
    /// Held (for a deleted pod) rather than active.
    pub held: bool,
}

/// Addresses a node's store gives one pod while the API shows another live pod on that node
/// with it: `(ip, store's pod, API's pod)`.
pub fn store_disagrees(
    node: &str,
    leases: &[StoreLease],
    pods: &[LivePod],
) -> Vec<(String, String, String)> {
    let on_node: BTreeMap<&str, &str> = pods
        .iter()
        .filter(|p| p.node.as_deref() == Some(node))
        .flat_map(|p| p.ips.iter().map(|ip| (ip.as_str(), p.key.as_str())))
        .collect();
    leases
        .iter()
        .filter_map(|l| {
            let api = on_node.get(l.ip.as_str())?;
            (*api != l.pod).then(|| (l.ip.clone(), l.pod.clone(), api.to_string()))
        })
        .collect()
}

/// What a PersistentPodState records of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The node.
    pub node: String,
    /// The addresses.
    pub ips: Vec<String>,
}

/// How a rebuilt pod came back, against the record its predecessor left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebuild {
    /// On the recorded node, with every recorded address.
    Kept,
    /// Its node was disturbed (powered off, runtime restarted) around the rebuild: not held to
    /// the rule.
    Excused,
    /// Anything else, said in words.
    Broken(String),
}

/// Judges a rebuilt pod (`node`, `ips`) against `record`; `node_disturbed` says whether the
/// recorded node was disturbed around the rebuild.
pub fn judge_rebuild(record: &Record, node: &str, ips: &[String], node_disturbed: bool) -> Rebuild {
    if node_disturbed {
        return Rebuild::Excused;
    }
    if node != record.node {
        return Rebuild::Broken(format!("came back on {node}, recorded on {}", record.node));
    }
    let have: BTreeSet<&String> = ips.iter().collect();
    let lost: Vec<&String> = record.ips.iter().filter(|ip| !have.contains(ip)).collect();
    if lost.is_empty() {
        Rebuild::Kept
    } else {
        Rebuild::Broken(format!(
            "came back on {node} with {ips:?}, recorded with {:?}",
            record.ips
        ))
    }
}

/// A hooked pod's deletion, as observed (seconds since the soak started).
#[derive(Debug, Clone, PartialEq)]
pub struct HookedDeletion {
    /// When ipkeep started holding the deletion (the pod turned `PreparingDelete`).
    pub held_at: f64,
    /// When the operator stand-in removed the hook's label, if it did.
    pub released_at: Option<f64>,
    /// The hook's `timeoutSeconds`.
    pub timeout: f64,
    /// When the pod got its deletion timestamp.
    pub deleted_at: f64,
}

/// Whether the deletion waited for the operator or the timeout, and no longer (with `slack`
/// seconds for the observers' sampling and the controller's own pace); `Err` says how not.
pub fn judge_hook(d: &HookedDeletion, slack: f64) -> Result<(), String> {
    let due = match d.released_at {
        Some(released) => released.min(d.held_at + d.timeout),
        None => d.held_at + d.timeout,
    };
    if d.deleted_at + slack < due {
        return Err(format!(
            "deleted {:.0} s after the hold started, {:.0} s before the operator or the timeout let it go",
            d.deleted_at - d.held_at,
            due - d.deleted_at
        ));
    }
    if d.deleted_at > due + slack {
        return Err(format!(
            "deleted {:.0} s after the operator or the timeout let it go",
            d.deleted_at - due
        ));
    }
    Ok(())
}

/// What may explain a holding in a settled cluster: the PersistentPodState records of each
/// `namespace/name`, by node.
pub fn unexplained_holdings<'a>(
    node: &str,
    leases: &'a [StoreLease],
    records: &BTreeMap<String, Record>,
    running_here: &BTreeSet<String>,
) -> Vec<&'a StoreLease> {
    leases
        .iter()
        .filter(|l| {
            if !l.held {
                // An active address with no pod of its name running on the node is a leak.
                return !running_here.contains(&l.pod);
            }
            // A holding is for a pod that is recorded here and not running (a running pod
            // would have taken it back).
            let recorded_here = records.get(&l.pod).is_some_and(|r| r.node == node);
            !recorded_here || running_here.contains(&l.pod)
        })
        .collect()
}

/// A memory series' trend: the median of its last third over the median of its first third,
/// and the growth in bytes between them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Trend {
    /// Last third's median ÷ first third's median.
    pub ratio: f64,
    /// Last third's median − first third's median, in MiB.
    pub growth_mib: f64,
}

impl Trend {
    /// An upward trend: half as much again, and at least 16 MiB more.
    pub fn upward(&self) -> bool {
        self.ratio > 1.5 && self.growth_mib > 16.0
    }
}

/// The trend of `samples` (bytes, in time order); `None` for fewer than six.
pub fn trend(samples: &[u64]) -> Option<Trend> {
    if samples.len() < 6 {
        return None;
    }
    let third = samples.len() / 3;
    let median = |s: &[u64]| {
        let mut v = s.to_vec();
        v.sort_unstable();
        v[v.len() / 2] as f64
    };
    let first = median(&samples[..third]);
    let last = median(&samples[samples.len() - third..]);
    Some(Trend {
        ratio: if first > 0.0 { last / first } else { 1.0 },
        growth_mib: (last - first) / (1024.0 * 1024.0),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(key: &str, node: &str, ips: &[&str]) -> LivePod {
        LivePod {
            key: key.into(),
            uid: format!("{key}-uid"),
            node: Some(node.into()),
            ips: ips.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn lease(ip: &str, pod: &str, held: bool) -> StoreLease {
        StoreLease {
            ip: ip.into(),
            pod: pod.into(),
            held,
        }
    }

    #[test]
    fn an_address_of_two_live_pods_is_found() {
        let pods = [
            pod("s/a-0", "n0", &["10.0.0.2", "fd00::2"]),
            pod("s/b-0", "n1", &["10.0.1.2"]),
            pod("s/c-0", "n0", &["10.0.0.2"]),
        ];
        assert_eq!(
            shared_addresses(&pods),
            [("10.0.0.2".to_string(), vec!["s/a-0".into(), "s/c-0".into()])]
        );
        assert!(shared_addresses(&pods[..2]).is_empty());
    }

    #[test]
    fn a_store_that_gives_a_live_pods_address_to_another_is_found() {
        let pods = [pod("s/a-0", "n0", &["10.0.0.2"])];
        assert!(store_disagrees("n0", &[lease("10.0.0.2", "s/a-0", false)], &pods).is_empty());
        assert_eq!(
            store_disagrees("n0", &[lease("10.0.0.2", "s/b-1", false)], &pods),
            [("10.0.0.2".into(), "s/b-1".into(), "s/a-0".into())]
        );
        // Another node's store is not about this pod.
        assert!(store_disagrees("n1", &[lease("10.0.0.2", "s/b-1", false)], &pods).is_empty());
    }

    #[test]
    fn rebuilds_are_judged_against_their_record() {
        let record = Record {
            node: "n0".into(),
            ips: vec!["10.0.0.2".into(), "fd00::2".into()],
        };
        let both = ["fd00::2".to_string(), "10.0.0.2".to_string()];
        assert_eq!(judge_rebuild(&record, "n0", &both, false), Rebuild::Kept);
        assert!(matches!(
            judge_rebuild(&record, "n0", &both[..1], false),
            Rebuild::Broken(_)
        ));
        assert!(matches!(
            judge_rebuild(&record, "n1", &both, false),
            Rebuild::Broken(_)
        ));
        assert_eq!(judge_rebuild(&record, "n1", &both, true), Rebuild::Excused);
    }

    #[test]
    fn a_hooked_deletion_waits_for_the_operator_or_the_timeout_and_no_longer() {
        let d = |released_at, deleted_at| HookedDeletion {
            held_at: 100.0,
            released_at,
            timeout: 30.0,
            deleted_at,
        };
        assert!(judge_hook(&d(Some(105.0), 107.0), 5.0).is_ok());
        assert!(judge_hook(&d(None, 131.0), 5.0).is_ok());
        assert!(judge_hook(&d(None, 110.0), 5.0).is_err(), "too early");
        assert!(judge_hook(&d(Some(105.0), 150.0), 5.0).is_err(), "too late");
        assert!(
            judge_hook(&d(None, 170.0), 5.0).is_err(),
            "past its timeout"
        );
    }

    #[test]
    fn holdings_are_explained_by_records_on_their_node() {
        let records: BTreeMap<String, Record> = [(
            "s/a-1".to_string(),
            Record {
                node: "n0".into(),
                ips: vec![],
            },
        )]
        .into();
        let running: BTreeSet<String> = ["s/a-0".to_string()].into();
        let leases = [
            lease("10.0.0.2", "s/a-0", false),
            lease("10.0.0.3", "s/a-1", true),
            lease("10.0.0.4", "s/a-2", true),
            lease("10.0.0.5", "s/gone-0", false),
        ];
        let bad: Vec<&str> = unexplained_holdings("n0", &leases, &records, &running)
            .iter()
            .map(|l| l.ip.as_str())
            .collect();
        assert_eq!(bad, ["10.0.0.4", "10.0.0.5"]);
        assert_eq!(
            unexplained_holdings("n1", &leases[1..2], &records, &running).len(),
            1,
            "recorded on another node"
        );
    }

    #[test]
    fn memory_trends() {
        let mib = 1024 * 1024;
        let flat: Vec<u64> = (0..30).map(|i| (40 + i % 3) * mib).collect();
        assert!(!trend(&flat).unwrap().upward());
        let leak: Vec<u64> = (0..30).map(|i| (40 + 4 * i) * mib).collect();
        assert!(trend(&leak).unwrap().upward());
        assert_eq!(trend(&leak[..5]), None);
    }
}
