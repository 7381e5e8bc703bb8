//! The kube-scheduler extender (`/filter`, `/prioritize`; `k8s.io/kube-scheduler/extender/v1`,
//! PascalCase keys). The same decision as the webhook, at scheduling time: a pod the webhook
//! did not see is still pinned. Pods that are not pinned pass through with the node list they
//! came with, never a null one (a null list means "every node filtered out").
//!
//! With `nodeCacheCapable: true` the scheduler sends `NodeNames` and labels come from the node
//! cache. Otherwise it sends full `Nodes`: each item is kept as raw JSON and echoed byte for
//! byte, and only its name and labels are parsed.

use std::collections::BTreeMap;
use std::sync::Arc;

use ipkeep_placement::pin::{self, Decision, PinOutcome, Pinned};
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::cache::{self, Caches};
use crate::error::RequestError;

/// `ExtenderArgs`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ExtenderArgs<'a> {
    #[serde(default, alias = "pod")]
    pod: Option<Pod>,
    #[serde(default, borrow, alias = "nodes")]
    nodes: Option<NodeListIn<'a>>,
    #[serde(default, alias = "nodeNames", alias = "nodenames")]
    node_names: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct NodeListIn<'a> {
    #[serde(default, borrow)]
    items: Option<Vec<&'a RawValue>>,
}

/// The part of a node an extender reads.
#[derive(Deserialize)]
struct NodeHead {
    #[serde(default)]
    metadata: NodeMeta,
}

#[derive(Deserialize, Default)]
struct NodeMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// `ExtenderFilterResult`.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct FilterResult<'a> {
    nodes: Option<NodeListOut<'a>>,
    node_names: Option<Vec<&'a str>>,
    failed_nodes: BTreeMap<String, String>,
    failed_and_unresolvable_nodes: BTreeMap<String, String>,
    error: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeListOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: BTreeMap<(), ()>,
    items: Vec<&'a RawValue>,
}

impl<'a> NodeListOut<'a> {
    fn new(items: Vec<&'a RawValue>) -> Self {
        Self {
            api_version: "v1",
            kind: "NodeList",
            metadata: BTreeMap::new(),
            items,
        }
    }
}

/// `HostPriority`.
#[derive(Serialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    /// The node.
    pub host: String,
    /// 0..=10.
    pub score: i64,
}

/// A served extender call.
#[derive(Debug)]
pub struct Served {
    /// The JSON body.
    pub body: Vec<u8>,
    /// The `outcome` metric label.
    pub outcome: &'static str,
    /// The skip reason label, when a recorded pin was not applied.
    pub skipped: Option<&'static str>,
}

fn malformed(reason: String) -> RequestError {
    RequestError::Malformed {
        expected: "extender/v1 ExtenderArgs",
        reason,
    }
}

fn parse(body: &[u8]) -> Result<(ExtenderArgs<'_>, Pod), RequestError> {
    let mut args: ExtenderArgs<'_> =
        serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    let pod = args
        .pod
        .take()
        .ok_or_else(|| malformed("it has no Pod".into()))?;
    Ok((args, pod))
}

/// The node pin for `pod`, with the outcome label: `None` when the pod is not pinned.
fn pin_for(pod: &Pod, caches: &Caches) -> Result<(Option<Pinned>, Served), RequestError> {
    let mut served = Served {
        body: Vec::new(),
        outcome: "passed",
        skipped: None,
    };
    let Some(statefulset) = pin::statefulset_name(pod) else {
        return Ok((None, served));
    };
    if !caches.ready() {
        return Err(RequestError::NotReady);
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pps = caches.pps_for(&namespace, &statefulset);
    let Decision::Manage(managed) = pin::decide(pod, &namespace, pps.as_deref()) else {
        return Ok((None, served));
    };
    match managed.pin {
        PinOutcome::Pinned(p) => {
            served.outcome = "pinned";
            Ok((Some(p), served))
        }
        PinOutcome::Unrecorded(_) => {
            served.outcome = "unrecorded";
            Ok((None, served))
        }
        PinOutcome::Skipped(why) => {
            served.outcome = "skipped";
            served.skipped = Some(why.label());
            Ok((None, served))
        }
    }
}

fn head(raw: &RawValue) -> Result<NodeMeta, RequestError> {
    serde_json::from_str::<NodeHead>(raw.get())
        .map(|h| h.metadata)
        .map_err(|e| malformed(format!("a node in Nodes.items cannot be read: {e}")))
}

fn to_body<T: Serialize>(value: &T) -> Result<Vec<u8>, RequestError> {
    serde_json::to_vec(value).map_err(|e| RequestError::Body(e.to_string()))
}

/// Serves `filter`.
pub fn filter(body: &[u8], caches: &Caches) -> Result<Served, RequestError> {
    let (args, pod) = parse(body)?;
    let (pinned, mut served) = pin_for(&pod, caches)?;
    let mut result = FilterResult {
        nodes: None,
        node_names: None,
        failed_nodes: BTreeMap::new(),
        failed_and_unresolvable_nodes: BTreeMap::new(),
        error: "",
    };
    // Nodes that do not match the pin are unresolvable: preempting pods there would not help,
    // so the scheduler must not evict anything for them.
    let pinned = pinned.filter(|p| !p.required.is_empty());
    if let Some(items) = args.nodes.and_then(|n| n.items) {
        let mut kept = Vec::with_capacity(items.len());
        for raw in items {
            let Some(pinned) = &pinned else {
                kept.push(raw);
                continue;
            };
            let meta = head(raw)?;
            match pinned.admits(&meta.labels) {
                Ok(()) => kept.push(raw),
                Err(why) => {
                    result.failed_and_unresolvable_nodes.insert(meta.name, why);
                }
            }
        }
        result.nodes = Some(NodeListOut::new(kept));
    }
    if let Some(names) = &args.node_names {
        let mut kept = Vec::with_capacity(names.len());
        for name in names {
            let Some(pinned) = &pinned else {
                kept.push(name.as_str());
                continue;
            };
            match caches.node(name) {
                None => {
                    result.failed_nodes.insert(
                        name.clone(),
                        format!("ipkeep: node {name} is not in the node cache yet; retry"),
                    );
                }
                Some(node) => match pinned.admits(cache::labels(&node)) {
                    Ok(()) => kept.push(name),
                    Err(why) => {
                        result
                            .failed_and_unresolvable_nodes
                            .insert(name.clone(), why);
                    }
                },
            }
        }
        result.node_names = Some(kept);
    }
    if result.nodes.is_none() && result.node_names.is_none() {
        result.node_names = Some(Vec::new());
        result.nodes = Some(NodeListOut::new(Vec::new()));
    }
    served.body = to_body(&result)?;
    Ok(served)
}

/// Serves `prioritize`: every input node with a score, 0 for pods that are not pinned.
pub fn prioritize(body: &[u8], caches: &Caches) -> Result<Served, RequestError> {
    let (args, pod) = parse(body)?;
    let (pinned, served) = pin_for(&pod, caches)?;
    let score = |name: &str, labels: &BTreeMap<String, String>| {
        pinned.as_ref().map_or(0, |p| p.score(name, labels))
    };
    let mut scores: Vec<HostPriority> = Vec::new();
    for raw in args.nodes.and_then(|n| n.items).unwrap_or_default() {
        let meta = head(raw)?;
        scores.push(HostPriority {
            score: score(&meta.name, &meta.labels),
            host: meta.name,
        });
    }
    for name in args.node_names.unwrap_or_default() {
        let node: Option<Arc<_>> = pinned.as_ref().and_then(|_| caches.node(&name));
        scores.push(HostPriority {
            score: node.map_or(0, |n| score(&name, cache::labels(&n))),
            host: name,
        });
    }
    Ok(Served {
        body: to_body(&scores)?,
        ..served
    })
}
