//! The observers: every second they sample the API (pods, PersistentPodState records) and
//! every node's store (`ipkeep list` in the node's namespaces, as an operator runs it), and feed
//! what they see to the judgements of [`super::judge`]; every ten seconds they sample the
//! memory of ipkeep's processes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use ipkeep_api::PersistentPodState;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::judge::{self, HookedDeletion, LivePod, Rebuild, Record, StoreLease};
use super::nemesis::Target;
use super::workload::{HOOK_TIMEOUT, LABELLED, NAMESPACE, SHAPES};
use super::{Shared, lock};
use crate::nodes::NETWORK;

/// Seconds a workload pod may stay not Ready before it counts as stuck.
pub const STUCK_BOUND: f64 = 240.0;
/// Seconds of slack a hooked deletion gets for the observers' sampling and the controller's pace.
pub const HOOK_SLACK: f64 = 20.0;

/// What the observers remember between samples.
#[derive(Debug, Default)]
pub struct Observer {
    /// The last incarnation of each workload pod name: its UID, the record its predecessor left
    /// when it was first seen, when it was first seen, and whether it was judged.
    incarnations: BTreeMap<String, Incarnation>,
    /// Findings seen once (reported when seen twice in a row).
    suspect: BTreeSet<String>,
    /// Findings already counted.
    counted: BTreeSet<String>,
    /// Per hooked pod UID: when its deletion hold started.
    held_at: BTreeMap<String, f64>,
    /// Per workload pod UID: since when it is not Ready.
    not_ready: BTreeMap<String, f64>,
    /// Memory samples per process: component and resident bytes.
    memory: BTreeMap<i32, (String, Vec<u64>)>,
}

#[derive(Debug, Clone)]
struct Incarnation {
    uid: String,
    record: Option<Record>,
    first_seen: f64,
    judged: bool,
}

fn workload_key(pod: &Pod) -> Option<String> {
    let ns = pod.namespace()?;
    (ns == NAMESPACE || ns == LABELLED).then(|| format!("{ns}/{}", pod.name_any()))
}

fn live(pod: &Pod) -> Option<LivePod> {
    let spec = pod.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ips: Vec<String> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .collect();
    Some(LivePod {
        key: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node: spec.node_name.clone(),
        ips,
    })
}

/// The workload's records: `namespace/pod` → node and addresses.
pub async fn records(client: &Client) -> Result<BTreeMap<String, Record>> {
    let mut out = BTreeMap::new();
    for ns in [NAMESPACE, LABELLED] {
        let api: Api<PersistentPodState> = Api::namespaced(client.clone(), ns);
        for pps in api.list(&ListParams::default()).await?.items {
            for (pod, state) in pps.status.map(|s| s.pod_states).unwrap_or_default() {
                out.insert(
                    format!("{ns}/{pod}"),
                    Record {
                        node: state.node_name,
                        ips: state.pod_ips,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// A node's store, as `ipkeep list --json` on the node shows it (`None`: the node is off, or
/// the command failed).
pub async fn store(target: &Target, node: &str) -> Option<Vec<StoreLease>> {
    let text = target
        .on_node(
            node,
            &[
                "/opt/cni/bin/ipkeep",
                "list",
                "--json",
                "--network",
                NETWORK,
            ],
        )
        .await
        .ok()?;
    let leases = crate::nodes::parse_leases(&text).ok()?;
    Some(leases_of(&text, leases))
}

fn leases_of(text: &str, leases: Vec<(String, String, String)>) -> Vec<StoreLease> {
    let json: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let namespaces: Vec<String> = json["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            l["pod"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    leases
        .into_iter()
        .zip(namespaces)
        .map(|((ip, pod, state), ns)| StoreLease {
            ip,
            pod: if pod.is_empty() {
                String::new()
            } else {
                format!("{ns}/{pod}")
            },
            held: state == "held",
        })
        .collect()
}

fn seconds_of(time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time, start_unix: f64) -> f64 {
    time.0.as_second() as f64 - start_unix
}

impl Observer {
    /// A finding that counts once it is seen in two samples in a row.
    fn confirmed(&mut self, finding: String, seen_now: &mut BTreeSet<String>) -> bool {
        seen_now.insert(finding.clone());
        self.suspect.contains(&finding) && self.counted.insert(finding)
    }

    /// One sample at `now` (seconds since the start).
    pub async fn sample(
        &mut self,
        client: &Client,
        target: &Target,
        shared: &Arc<Mutex<Shared>>,
        now: f64,
    ) -> Result<()> {
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let records = records(client).await?;
        let stores = futures::future::join_all(target.nodes.iter().map(|n| store(target, n))).await;
        let livepods: Vec<LivePod> = pods.iter().filter_map(live).collect();
        let mut seen_now = BTreeSet::new();
        let mut s = lock(shared);
        let start_unix = s.start_unix;

        let shared_now = judge::shared_addresses(&livepods);
        s.summary.invariant("unique-addresses").pass();
        for (ip, owners) in shared_now {
            let finding = format!(
                "{ip} is the address of {} at {now:.0} s (API)",
                owners.join(" and ")
            );
            if self.confirmed(finding.clone(), &mut seen_now) {
                let around = s.faults_around(now);
                s.summary
                    .invariant("unique-addresses")
                    .fail(format!("{finding}; faults around: {around}"));
            }
        }
        for (node, leases) in target.nodes.iter().zip(&stores) {
            let Some(leases) = leases else { continue };
            s.summary.invariant("unique-addresses").pass();
            for (ip, store_pod, api_pod) in judge::store_disagrees(node, leases, &livepods) {
                let finding =
                    format!("{node}'s store gives {ip} to {store_pod}, the API to {api_pod}");
                if self.confirmed(finding.clone(), &mut seen_now) {
                    let around = s.faults_around(now);
                    s.summary
                        .invariant("unique-addresses")
                        .fail(format!("{finding} at {now:.0} s; faults around: {around}"));
                }
            }
        }

        for pod in &pods {
            let Some(key) = workload_key(pod) else {
                continue;
            };
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let this = self
                .incarnations
                .entry(key.clone())
                .or_insert_with(|| Incarnation {
                    uid: String::new(),
                    record: None,
                    first_seen: now,
                    judged: true,
                });
            if this.uid != uid {
                let first = this.uid.is_empty();
                *this = Incarnation {
                    uid: uid.clone(),
                    record: if first {
                        None
                    } else {
                        records.get(&key).cloned()
                    },
                    first_seen: now,
                    judged: false,
                };
            }
            let live = live(pod);
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if let (false, true, Some(p)) = (this.judged, running, &live)
                && let Some(node) = &p.node
                && !p.ips.is_empty()
            {
                this.judged = true;
                if let Some(record) = this.record.clone() {
                    let since = this.first_seen - 120.0;
                    let disturbed = s.node_disturbed(&record.node, since, now);
                    s.summary.rebuilds += 1;
                    match judge::judge_rebuild(&record, node, &p.ips, disturbed.is_some()) {
                        Rebuild::Kept => {
                            s.summary.kept += 1;
                            s.summary.invariant("rebuilds-keep").pass();
                        }
                        Rebuild::Excused => {
                            let found = match judge::judge_rebuild(&record, node, &p.ips, false) {
                                Rebuild::Broken(why) => why,
                                _ => "kept its node and every address".into(),
                            };
                            let why = format!(
                                "{key} at {now:.0} s {found}; excused by {}",
                                disturbed.unwrap_or_default()
                            );
                            s.summary.invariant("rebuilds-keep").excuse(why)
                        }
                        Rebuild::Broken(why) => {
                            let around = s.faults_around(now);
                            s.summary.invariant("rebuilds-keep").fail(format!(
                                "{key} at {now:.0} s {why}; faults around: {around}"
                            ));
                        }
                    }
                }
            }
            self.watch_readiness(pod, &uid, &key, now, &mut s);
            self.watch_hook(pod, &uid, &key, now, start_unix, &mut s);
        }
        self.suspect = seen_now;
        Ok(())
    }

    fn watch_readiness(&mut self, pod: &Pod, uid: &str, key: &str, now: f64, s: &mut Shared) {
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let held = pod
            .labels()
            .get("ipkeep.dev/lifecycle-state")
            .is_some_and(|v| v == "PreparingDelete");
        if crate::objects::is_ready(pod) || terminating || held {
            if self.not_ready.remove(uid).is_some() && !terminating && !held {
                s.summary.invariant("no-pod-stuck").pass();
            }
            return;
        }
        let since = *self.not_ready.entry(uid.to_string()).or_insert(now);
        if now - since > STUCK_BOUND && self.counted.insert(format!("stuck {uid}")) {
            if s.any_node_disturbed(now - STUCK_BOUND - 60.0, now) {
                let why = format!(
                    "{key} not Ready for {:.0} s at {now:.0} s; faults around: {}",
                    now - since,
                    s.faults_around(now)
                );
                s.summary.invariant("no-pod-stuck").excuse(why);
            } else {
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                let around = s.faults_around(now);
                s.summary.invariant("no-pod-stuck").fail(format!(
                    "{key} ({phase}) not Ready for {:.0} s at {now:.0} s; faults around: {around}",
                    now - since
                ));
            }
        }
    }

    fn watch_hook(
        &mut self,
        pod: &Pod,
        uid: &str,
        key: &str,
        now: f64,
        start_unix: f64,
        s: &mut Shared,
    ) {
        let app = pod.labels().get("app").cloned().unwrap_or_default();
        if !SHAPES.iter().any(|sh| sh.hooks && sh.name == app) {
            return;
        }
        let held = pod
            .labels()
            .get("ipkeep.dev/lifecycle-state")
            .is_some_and(|v| v == "PreparingDelete");
        if held && !self.held_at.contains_key(uid) {
            let started = pod
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "ipkeep.dev/lifecycle-held"))
                .and_then(|c| c.last_transition_time.as_ref())
                .map_or(now, |t| seconds_of(t, start_unix));
            self.held_at.insert(uid.to_string(), started);
        }
        let Some(deleted) = &pod.metadata.deletion_timestamp else {
            if !held {
                self.held_at.remove(uid);
            }
            return;
        };
        let Some(held_at) = self.held_at.remove(uid) else {
            return;
        };
        if s.forced.contains(uid) {
            return;
        }
        let node = pod
            .spec
            .as_ref()
            .and_then(|sp| sp.node_name.clone())
            .unwrap_or_default();
        let deletion = HookedDeletion {
            held_at,
            released_at: s.released.get(uid).copied(),
            timeout: HOOK_TIMEOUT as f64,
            deleted_at: seconds_of(deleted, start_unix),
        };
        match judge::judge_hook(&deletion, HOOK_SLACK) {
            Ok(()) => s.summary.invariant("hooks-wait").pass(),
            Err(why) => match s.hook_may_escape(&node, held_at, deletion.deleted_at) {
                Some(faults) => s
                    .summary
                    .invariant("hooks-wait")
                    .excuse(format!("{key} on {node}: {why}; excused by {faults}")),
                None => {
                    let around = s.faults_around(now);
                    s.summary
                        .invariant("hooks-wait")
                        .fail(format!("{key}: {why}; faults around: {around}"));
                }
            },
        }
    }

    /// Samples the resident memory of every ipkeep process.
    pub fn sample_memory(&mut self) {
        for p in crate::crash::in_containers() {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", p.pid)) else {
                continue;
            };
            let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            else {
                continue;
            };
            let component = match (p.program, super::nemesis::process_home(p.pid)) {
                ("ipkeep-agent", Some((node, _))) => format!("ipkeep-agent@{node}"),
                (program, _) => program.to_string(),
            };
            self.memory
                .entry(p.pid)
                .or_insert_with(|| (component, Vec::new()))
                .1
                .push(kib * 1024);
        }
    }

    /// Memory per component: the largest sample, and the trend of its longest-lived process.
    pub fn memory(&self) -> BTreeMap<String, super::summary::Memory> {
        let mut out: BTreeMap<String, super::summary::Memory> = BTreeMap::new();
        let mut longest: BTreeMap<&str, &Vec<u64>> = BTreeMap::new();
        for (component, samples) in self.memory.values() {
            let max = samples.iter().copied().max().unwrap_or(0) as f64 / (1024.0 * 1024.0);
            let m = out
                .entry(component.clone())
                .or_insert(super::summary::Memory {
                    max_mib: 0.0,
                    trend: None,
                    samples: 0,
                });
            m.max_mib = m.max_mib.max(max);
            m.samples += samples.len();
            let l = longest.entry(component).or_insert(samples);
            if samples.len() > l.len() {
                *l = samples;
            }
        }
        for (component, samples) in longest {
            if let Some(m) = out.get_mut(component) {
                m.trend = judge::trend(samples);
            }
        }
        out
    }
}
