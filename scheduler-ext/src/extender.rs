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
use std::borrow::Cow;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
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
    items: Option<Vec<NodeItem<'a>>>,
}

/// A node of a full `Nodes` list, read in one pass: every top-level member kept as raw JSON
/// (to be echoed unchanged), and the name and labels parsed from `metadata`.
struct NodeItem<'a> {
    members: Vec<(Cow<'a, str>, &'a RawValue)>,
    meta: NodeMeta,
}

#[derive(Deserialize, Default)]
struct NodeMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

impl<'de: 'a, 'a> Deserialize<'de> for NodeItem<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = NodeItem<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Node object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut item = NodeItem {
                    members: Vec::with_capacity(5),
                    meta: NodeMeta::default(),
                };
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let raw: &'de RawValue = map.next_value()?;
                    if key == "metadata" {
                        item.meta = serde_json::from_str(raw.get()).map_err(de::Error::custom)?;
                    }
                    item.members.push((key, raw));
                }
                Ok(item)
            }
        }
        deserializer.deserialize_map(Members)
    }
}

impl Serialize for NodeItem<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.members.iter().map(|(k, v)| (k, v)))
    }
}

/// Failed nodes with their reason, serialized as a JSON object.
struct Failed<'a>(Vec<(&'a str, &'a str)>);

impl Serialize for Failed<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().copied())
    }
}

/// `ExtenderFilterResult`.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct FilterResult<'a> {
    nodes: Option<NodeListOut<'a>>,
    node_names: Option<Vec<&'a str>>,
    failed_nodes: Failed<'a>,
    failed_and_unresolvable_nodes: Failed<'a>,
    error: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeListOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: BTreeMap<(), ()>,
    items: Vec<&'a NodeItem<'a>>,
}

impl<'a> NodeListOut<'a> {
    fn new(items: Vec<&'a NodeItem<'a>>) -> Self {
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

fn to_body<T: Serialize>(value: &T) -> Result<Vec<u8>, RequestError> {
    serde_json::to_vec(value).map_err(|e| RequestError::Body(e.to_string()))
}

/// Serves `filter`.
pub fn filter(body: &[u8], caches: &Caches) -> Result<Served, RequestError> {
    let (args, pod) = parse(body)?;
    let (pinned, mut served) = pin_for(&pod, caches)?;
    // Nodes that do not match the pin are unresolvable: preempting pods there would not help,
    // so the scheduler must not evict anything for them.
    let pinned = pinned.filter(|p| !p.required.is_empty());
    let refusal = pinned.as_ref().map(Pinned::refusal).unwrap_or_default();
    let unknown = "ipkeep: node not in the node cache yet; retry";
    let mut unresolvable: Vec<(&str, &str)> = Vec::new();
    let mut failed: Vec<(&str, &str)> = Vec::new();
    let items = args.nodes.as_ref().and_then(|n| n.items.as_ref());
    let nodes = items.map(|items| {
        let mut kept = Vec::with_capacity(items.len());
        for item in items {
            match &pinned {
                Some(p) if !p.admits(&item.meta.labels) => {
                    unresolvable.push((&item.meta.name, &refusal));
                }
                _ => kept.push(item),
            }
        }
        NodeListOut::new(kept)
    });
    // With the hostname pinned, only the recorded node can be admitted (it is where the
    // pod's addresses are held), so the other names need no cache lookup.
    let only = pinned
        .as_ref()
        .filter(|p| p.required.iter().any(|r| r.key == pin::HOSTNAME_LABEL))
        .map(|p| p.node.as_str());
    let node_names = args.node_names.as_ref().map(|names| {
        let mut kept = Vec::with_capacity(names.len());
        for name in names {
            let Some(pinned) = &pinned else {
                kept.push(name.as_str());
                continue;
            };
            if only.is_some_and(|node| node != name) {
                unresolvable.push((name, &refusal));
                continue;
            }
            match caches.node(name) {
                None => failed.push((name, unknown)),
                Some(node) if pinned.admits(cache::labels(&node)) => kept.push(name),
                Some(_) => unresolvable.push((name, &refusal)),
            }
        }
        kept
    });
    let (nodes, node_names) = match (nodes, node_names) {
        (None, None) => (Some(NodeListOut::new(Vec::new())), Some(Vec::new())),
        other => other,
    };
    let result = FilterResult {
        nodes,
        node_names,
        failed_nodes: Failed(failed),
        failed_and_unresolvable_nodes: Failed(unresolvable),
        error: "",
    };
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
    for item in args.nodes.and_then(|n| n.items).unwrap_or_default() {
        scores.push(HostPriority {
            score: score(&item.meta.name, &item.meta.labels),
            host: item.meta.name,
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
