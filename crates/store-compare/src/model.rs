//! What the parent knows about the pods it drives, and the checks a dump of the store must pass:
//! the store opens, its indexes agree with its leases (no address reachable as two owners'), no
//! pod has two addresses, every acknowledged ADD is there unless a DEL of it was attempted, every
//! pod whose last command was an acknowledged DEL has its address held, and a pod never comes
//! back with a different address (retention is forever and the range never fills).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipkeep_ipam::LeaseState;

use crate::child::Run;
use crate::workload::{Action, Dump, Names};

#[derive(Debug, Clone, PartialEq, Eq)]
enum PodState {
    /// No sandbox.
    Down,
    /// An acknowledged ADD.
    Up(String),
    /// An ADD or DEL of this sandbox was killed or failed: DEL it (as kubelet would).
    Unsure(String),
}

#[derive(Debug, Clone)]
struct Pod {
    name: String,
    state: PodState,
    /// The address of its first acknowledged ADD.
    ip: Option<IpAddr>,
    generation: u32,
    last_was_acked_del: bool,
}

/// The pods of one run (one fresh store).
#[derive(Debug)]
pub struct Model {
    prefix: String,
    pods: Vec<Pod>,
    acked_adds: Vec<(String, IpAddr, usize)>,
    del_attempted: BTreeSet<String>,
    cids: BTreeSet<String>,
    /// Things the acknowledgements alone show to be wrong (a pod given another address).
    pub violations: Vec<String>,
    /// Acknowledged commands.
    pub acked: usize,
}

impl Model {
    /// `pods` pods named `<prefix>-<n>`, all down.
    pub fn new(prefix: &str, pods: usize) -> Self {
        Model {
            prefix: prefix.to_string(),
            pods: (0..pods)
                .map(|n| Pod {
                    name: format!("{prefix}-{n}"),
                    state: PodState::Down,
                    ip: None,
                    generation: 0,
                    last_was_acked_del: false,
                })
                .collect(),
            acked_adds: Vec::new(),
            del_attempted: BTreeSet::new(),
            cids: BTreeSet::new(),
            violations: Vec::new(),
            acked: 0,
        }
    }

    /// How many pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// The name of pod `n`.
    pub fn pod_name(&self, n: usize) -> &str {
        &self.pods[n].name
    }

    /// What kubelet would do next for pod `n`: ADD a new sandbox, or DEL the current one.
    pub fn next(&mut self, n: usize) -> (Action, String) {
        let pod = &mut self.pods[n];
        let next = match &pod.state {
            PodState::Down => {
                pod.generation += 1;
                (
                    Action::Add,
                    format!("{}-{}-c{}", self.prefix, n, pod.generation),
                )
            }
            PodState::Up(cid) | PodState::Unsure(cid) => (Action::Del, cid.clone()),
        };
        self.cids.insert(next.1.clone());
        next
    }

    /// Records what the child said about `action` on `cid` for pod `n`.
    pub fn record(&mut self, n: usize, action: Action, cid: &str, run: &Run) {
        let pod = &mut self.pods[n];
        let ack = run.ack();
        match action {
            Action::Add => {
                pod.last_was_acked_del = false;
                let ip = ack
                    .and_then(|a| a.split(' ').nth(2))
                    .and_then(|ip| ip.split(',').next())
                    .and_then(|ip| ip.parse::<IpAddr>().ok());
                match ip {
                    Some(ip) => {
                        self.acked += 1;
                        if let Some(old) = pod.ip.filter(|old| *old != ip) {
                            self.violations.push(format!(
                                "pod {} came back with {ip} instead of its retained {old}",
                                pod.name
                            ));
                        }
                        pod.ip.get_or_insert(ip);
                        pod.state = PodState::Up(cid.to_string());
                        self.acked_adds.push((cid.to_string(), ip, n));
                    }
                    None => pod.state = PodState::Unsure(cid.to_string()),
                }
            }
            Action::Del => {
                self.del_attempted.insert(cid.to_string());
                if ack.is_some() {
                    self.acked += 1;
                    pod.state = PodState::Down;
                    pod.last_was_acked_del = true;
                } else {
                    pod.state = PodState::Unsure(cid.to_string());
                    pod.last_was_acked_del = false;
                }
            }
        }
    }

    /// Every container ID and pod name used, for `dump`'s index cross-check.
    pub fn names(&self) -> Names {
        Names {
            cids: self.cids.iter().cloned().collect(),
            pods: self.pods.iter().map(|p| p.name.clone()).collect(),
        }
    }

    /// Checks a dump against what was acknowledged; returns the violations (including those
    /// the acknowledgements alone showed).
    pub fn verify(&self, dump: &Dump) -> Vec<String> {
        let mut out = self.violations.clone();
        if !dump.ok {
            out.push(format!(
                "store does not open: {}",
                dump.error.as_deref().unwrap_or("?")
            ));
            return out;
        }
        out.extend(dump.problems.iter().map(|p| format!("index: {p}")));
        let by_ip: BTreeMap<IpAddr, &ipkeep_ipam::Lease> =
            dump.leases.iter().map(|l| (l.ip, l)).collect();
        let mut per_pod: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
        for l in &dump.leases {
            if let Some(p) = &l.pod {
                per_pod.entry(p.name.as_str()).or_default().push(l.ip);
            }
        }
        for (pod, ips) in per_pod.iter().filter(|(_, ips)| ips.len() > 1) {
            out.push(format!("pod {pod} has {} addresses: {ips:?}", ips.len()));
        }
        for (cid, ip, n) in &self.acked_adds {
            if self.del_attempted.contains(cid) {
                continue;
            }
            match by_ip.get(ip) {
                Some(l) if l.owner.container_id == *cid && l.is_active() => {}
                Some(l) => out.push(format!(
                    "lost acknowledged ADD {cid} of {}: {ip} is now {:?} of {}",
                    self.pods[*n].name, l.state, l.owner
                )),
                None => out.push(format!(
                    "lost acknowledged ADD {cid} of {}: {ip} is free",
                    self.pods[*n].name
                )),
            }
        }
        for pod in self.pods.iter().filter(|p| p.last_was_acked_del) {
            let Some(ip) = pod.ip else { continue };
            match by_ip.get(&ip) {
                Some(l)
                    if matches!(l.state, LeaseState::Held { .. })
                        && l.pod.as_ref().is_some_and(|p| p.name == pod.name) => {}
                other => out.push(format!(
                    "lost acknowledged DEL of {}: {ip} should be held for it, is {:?}",
                    pod.name,
                    other.map(|l| (&l.state, &l.owner))
                )),
            }
        }
        out
    }
}
