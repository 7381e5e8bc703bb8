//! A scheduler: binds each pending pod to a node. Like kube-scheduler it keeps Ready,
//! schedulable nodes that satisfy the pod's `nodeSelector` and required node affinity, asks the
//! extenders of the `KubeSchedulerConfiguration` (`filter`, then `prioritize`) over HTTPS, scores
//! preferred node affinity (0–100) plus extender scores × weight × 10, and prefers the node with
//! fewer pods on a tie. A pod no node fits gets `PodScheduled=False` (`Unschedulable`) and a
//! `FailedScheduling` Event, and is tried again.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::SimLog;
use crate::http::HttpsClient;

/// One `extenders[]` entry of a `KubeSchedulerConfiguration`.
#[derive(Debug, Clone)]
pub struct Extender {
    /// `urlPrefix` with the host replaced by where the Service's endpoint listens.
    pub url_prefix: String,
    /// `filterVerb`.
    pub filter_verb: Option<String>,
    /// `prioritizeVerb`.
    pub prioritize_verb: Option<String>,
    /// `weight`.
    pub weight: i64,
    /// `nodeCacheCapable`: send node names only.
    pub node_cache_capable: bool,
    /// `ignorable`: an unreachable extender is skipped, not fatal.
    pub ignorable: bool,
    /// `httpTimeout`.
    pub timeout: Duration,
    client: HttpsClient,
}

impl Extender {
    /// Reads the first extender of `config` (the `KubeSchedulerConfiguration` as JSON); its
    /// Service host resolves to `endpoint`, and the CA is `ca_pem`.
    pub fn from_config(config: &Value, endpoint: SocketAddr, ca_pem: &str) -> Result<Self> {
        let e = &config["extenders"][0];
        let prefix = e["urlPrefix"].as_str().context("extenders[0].urlPrefix")?;
        let url: hyper::Uri = prefix.parse().context("extenders[0].urlPrefix")?;
        let host = url.host().context("urlPrefix has no host")?;
        let server_name = e["tlsConfig"]["serverName"].as_str().unwrap_or(host);
        let timeout = e["httpTimeout"]
            .as_str()
            .map(|t| t.trim_end_matches('s').parse::<f64>())
            .transpose()
            .context("extenders[0].httpTimeout")?
            .map_or(Duration::from_secs(30), Duration::from_secs_f64);
        let path = url.path().trim_end_matches('/');
        Ok(Self {
            url_prefix: format!("https://{endpoint}{path}"),
            filter_verb: e["filterVerb"].as_str().map(str::to_string),
            prioritize_verb: e["prioritizeVerb"].as_str().map(str::to_string),
            weight: e["weight"].as_i64().unwrap_or(1),
            node_cache_capable: e["nodeCacheCapable"].as_bool().unwrap_or(false),
            ignorable: e["ignorable"].as_bool().unwrap_or(false),
            timeout,
            client: HttpsClient::new(ca_pem, server_name)?,
        })
    }

    fn args(&self, pod: &Pod, nodes: &[&Node]) -> Value {
        let names: Vec<String> = nodes.iter().map(|n| n.name_any()).collect();
        if self.node_cache_capable {
            json!({"Pod": pod, "NodeNames": names})
        } else {
            json!({"Pod": pod, "Nodes": {"items": nodes}})
        }
    }

    /// `filter`: the node names that pass, and why the others failed.
    async fn filter(
        &self,
        pod: &Pod,
        nodes: &[&Node],
    ) -> Result<(Vec<String>, BTreeMap<String, String>)> {
        let Some(verb) = &self.filter_verb else {
            return Ok((
                nodes.iter().map(|n| n.name_any()).collect(),
                BTreeMap::new(),
            ));
        };
        let url = format!("{}/{verb}", self.url_prefix);
        let (code, body) = self
            .client
            .post_json(&url, &self.args(pod, nodes), self.timeout)
            .await?;
        let answer: Value = serde_json::from_slice(&body)
            .with_context(|| format!("{url}: HTTP {code}, not JSON"))?;
        if let Some(error) = answer["Error"].as_str().filter(|e| !e.is_empty()) {
            bail!("{url}: {error}");
        }
        let passed: Vec<String> = match answer["NodeNames"].as_array() {
            Some(names) => names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect(),
            None => answer["Nodes"]["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                .collect(),
        };
        let mut failed = BTreeMap::new();
        for key in ["FailedNodes", "FailedAndUnresolvableNodes"] {
            for (node, why) in answer[key].as_object().into_iter().flatten() {
                failed.insert(node.clone(), why.as_str().unwrap_or_default().to_string());
            }
        }
        Ok((passed, failed))
    }

    /// `prioritize`: scores 0..=10 by node.
    async fn prioritize(&self, pod: &Pod, nodes: &[&Node]) -> Result<HashMap<String, i64>> {
        let Some(verb) = &self.prioritize_verb else {
            return Ok(HashMap::new());
        };
        let url = format!("{}/{verb}", self.url_prefix);
        let (code, body) = self
            .client
            .post_json(&url, &self.args(pod, nodes), self.timeout)
            .await?;
        if code != 200 {
            bail!("{url}: HTTP {code}: {}", String::from_utf8_lossy(&body));
        }
        let list: Vec<Value> = serde_json::from_slice(&body)
            .with_context(|| format!("{url}: not a HostPriorityList"))?;
        Ok(list
            .iter()
            .filter_map(|h| Some((h["Host"].as_str()?.to_string(), h["Score"].as_i64()?)))
            .collect())
    }
}

/// The scheduler.
pub struct Scheduler {
    client: Client,
    extender: Option<Extender>,
    log: SimLog,
    /// The last reason each pod (by UID) was unschedulable, so it is reported once.
    reported: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("extender", &self.extender)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Over `client`, with the extender if configured.
    pub fn new(client: Client, extender: Option<Extender>, log: SimLog) -> Self {
        Self {
            client,
            extender,
            log,
            reported: Mutex::default(),
        }
    }

    /// Tries to bind every pending pod.
    pub async fn tick(&self) -> Result<()> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let all = pods.list(&ListParams::default()).await?;
        let pending: Vec<&Pod> = all
            .items
            .iter()
            .filter(|p| {
                let spec = p.spec.as_ref();
                spec.and_then(|s| s.node_name.as_deref())
                    .is_none_or(str::is_empty)
                    && p.metadata.deletion_timestamp.is_none()
                    && spec
                        .and_then(|s| s.scheduler_name.as_deref())
                        .is_none_or(|n| n == "default-scheduler")
            })
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let nodes: Vec<Node> = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let mut load: HashMap<String, usize> = HashMap::new();
        for p in &all.items {
            if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                *load.entry(n).or_default() += 1;
            }
        }
        for pod in pending {
            if let Some(node) = self.schedule(pod, &nodes, &load).await? {
                *load.entry(node).or_default() += 1;
            }
        }
        Ok(())
    }

    async fn schedule(
        &self,
        pod: &Pod,
        nodes: &[Node],
        load: &HashMap<String, usize>,
    ) -> Result<Option<String>> {
        let mut why: Vec<String> = Vec::new();
        let mut fit: Vec<&Node> = Vec::new();
        for node in nodes {
            match node_fits(pod, node) {
                Ok(()) => fit.push(node),
                Err(reason) => why.push(reason),
            }
        }
        let mut extender_scores = HashMap::new();
        if let (Some(ext), false) = (&self.extender, fit.is_empty()) {
            match ext.filter(pod, &fit).await {
                Ok((passed, failed)) => {
                    why.extend(failed.values().cloned());
                    fit.retain(|n| passed.contains(&n.name_any()));
                }
                Err(e) if ext.ignorable => {
                    self.log
                        .line("scheduler", &format!("extender skipped (ignorable): {e:#}"));
                }
                Err(e) => why.push(format!("extender: {e:#}")),
            }
            if !fit.is_empty() {
                match ext.prioritize(pod, &fit).await {
                    Ok(scores) => extender_scores = scores,
                    Err(e) => self
                        .log
                        .line("scheduler", &format!("extender prioritize failed: {e:#}")),
                }
            }
            if !ext.ignorable && why.iter().any(|w| w.starts_with("extender: ")) {
                fit.clear();
            }
        }
        let best = fit.iter().max_by_key(|n| {
            let name = n.name_any();
            let affinity = preferred_score(pod, n);
            let ext = extender_scores.get(&name).copied().unwrap_or(0)
                * self.extender.as_ref().map_or(0, |e| e.weight)
                * 10;
            (
                affinity + ext,
                std::cmp::Reverse(load.get(&name).copied().unwrap_or(0)),
                std::cmp::Reverse(name),
            )
        });
        let Some(node) = best.map(|n| n.name_any()) else {
            why.sort();
            why.dedup();
            let message = format!("0/{} nodes are available: {}.", nodes.len(), why.join(", "));
            self.unschedulable(pod, &message).await?;
            return Ok(None);
        };
        self.bind(pod, &node).await?;
        Ok(Some(node))
    }

    async fn bind(&self, pod: &Pod, node: &str) -> Result<()> {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "uid": pod.uid()},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        match api
            .create_subresource::<Value, Value>("binding", &name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {}
            // Bound meanwhile, or deleted: nothing to do.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("bind {namespace}/{name} to {node}")),
        }
        self.log
            .line("scheduler", &format!("bound {namespace}/{name} to {node}"));
        self.reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pod.uid().unwrap_or_default());
        Ok(())
    }

    async fn unschedulable(&self, pod: &Pod, message: &str) -> Result<()> {
        let uid = pod.uid().unwrap_or_default();
        {
            let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            if reported.get(&uid).is_some_and(|m| m == message) {
                return Ok(());
            }
            reported.insert(uid, message.to_string());
        }
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        self.log.line(
            "scheduler",
            &format!("{namespace}/{name} unschedulable: {message}"),
        );
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let status = json!({"status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]}});
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(e.into()),
        }
        crate::sim::kubelet::event(
            &self.client,
            pod,
            "Warning",
            "FailedScheduling",
            message,
            "default-scheduler",
        )
        .await;
        Ok(())
    }
}

/// Whether `node` is Ready, schedulable and satisfies the pod's node selector and required
/// node affinity; otherwise why not, in kube-scheduler's words.
pub fn node_fits(pod: &Pod, node: &Node) -> std::result::Result<(), String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Err("1 node(s) had untolerated taint {node.kubernetes.io/not-ready}".into());
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Err("1 node(s) were unschedulable".into());
    }
    let labels = node.labels();
    let spec = pod.spec.as_ref();
    let selector_ok = spec
        .and_then(|s| s.node_selector.as_ref())
        .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let required = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok =
        required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)));
    if selector_ok && affinity_ok {
        Ok(())
    } else {
        Err("1 node(s) didn't match Pod's node affinity/selector".into())
    }
}

/// The sum of the weights of the preferred terms `node` matches (0..=100 after normalising
/// by the total weight, as NodeAffinity's score is).
pub fn preferred_score(pod: &Pod, node: &Node) -> i64 {
    let preferred = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let Some(terms) = preferred else { return 0 };
    let total: i64 = terms.iter().map(|t| i64::from(t.weight)).sum();
    let matched: i64 = terms
        .iter()
        .filter(|t| term_matches(&t.preference, node))
        .map(|t| i64::from(t.weight))
        .sum();
    if total == 0 { 0 } else { matched * 100 / total }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.labels();
    let exprs_ok = term
        .match_expressions
        .iter()
        .flatten()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)));
    let name = node.name_any();
    let fields_ok = term
        .match_fields
        .iter()
        .flatten()
        .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&name)));
    let empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty);
    !empty && exprs_ok && fields_ok
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: &str, ready: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": zone}},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap_or_default()
    }

    fn pod(affinity: Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [], "affinity": affinity}}),
        )
        .unwrap_or_default()
    }

    #[test]
    fn required_terms_are_ored_and_expressions_anded() {
        let p = pod(
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}, {"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]}
            ]}}}),
        );
        assert!(node_fits(&p, &node("n1", "a", true)).is_ok());
        assert!(node_fits(&p, &node("n1", "b", true)).is_err());
        assert!(node_fits(&p, &node("n2", "a", true)).is_err());
        assert!(node_fits(&p, &node("n3", "c", true)).is_ok());
        assert!(
            node_fits(&p, &node("n1", "a", false)).is_err(),
            "NotReady nodes never fit"
        );
    }

    #[test]
    fn preferred_terms_score_by_weight() {
        let p = pod(
            json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}},
                {"weight": 100, "preference": {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}}
            ]}}),
        );
        assert_eq!(preferred_score(&p, &node("n1", "a", true)), 100);
        assert_eq!(preferred_score(&p, &node("n2", "a", true)), 50);
        assert_eq!(preferred_score(&p, &node("n2", "b", true)), 0);
    }
}
