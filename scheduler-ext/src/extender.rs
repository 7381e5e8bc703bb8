//! The kube-scheduler extender (`/filter`, `/prioritize`; `k8s.io/kube-scheduler/extender/v1`,
//! PascalCase keys). The same decision as the webhook, at scheduling time: a pod the webhook
//! did not see is still pinned. Pods that are not pinned pass through with the node list they
//! came with, never a null one (a null list means "every node filtered out").
//!
//! With `nodeCacheCapable: true` the scheduler sends `NodeNames` and labels come from the node
//! cache. Otherwise it sends full `Nodes`: each item is kept as raw JSON and echoed byte for
//! byte; only its name is read, and of its labels only those a pin names.
//!
//! Nothing of the request is copied but the names with escapes and the fields the decision
//! reads ([`crate::pod`]), and a list holds at most [`MAX_NODES`] nodes, so what a request costs
//! is its body and little more.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use ipkeep_placement::pin::{self, Decision, PinOutcome, Pinned};
use ipkeep_values::keys::HOSTNAME_LABEL;
use k8s_openapi::api::core::v1::Pod;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::cache::{self, Caches};
use crate::error::RequestError;
use crate::pod;
use crate::review::Outcome;

/// The most nodes one request may list (`Nodes.items` or `NodeNames`): twice the 5,000 nodes
/// Kubernetes supports in a cluster. It bounds what the node list costs beyond its own bytes.
pub const MAX_NODES: usize = 10_000;

/// The most bytes of the reason given for each refused node (it names the pinned labels).
const MAX_REASON: usize = 256;

/// `ExtenderArgs`. Everything is borrowed from the request body: the pod is read by
/// [`pod::read`], a full node stays raw JSON (echoed as it came), a name is copied only if it
/// has escapes.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ExtenderArgs<'a> {
    #[serde(default, borrow, alias = "pod")]
    pod: Option<&'a RawValue>,
    #[serde(default, borrow, alias = "nodes")]
    nodes: Option<NodeListIn<'a>>,
    #[serde(default, borrow, alias = "nodeNames", alias = "nodenames")]
    node_names: Option<Capped<Name<'a>>>,
}

#[derive(Deserialize)]
struct NodeListIn<'a> {
    #[serde(default, borrow)]
    items: Option<Capped<NodeItem<'a>>>,
}

/// A node name.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

/// A list of at most [`MAX_NODES`] items, refused as soon as it has more.
struct Capped<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Capped<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Items<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Items<T> {
            type Value = Capped<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {MAX_NODES} nodes")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Capped<T>, S::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    if items.len() == MAX_NODES {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_NODES} nodes in one request"
                        )));
                    }
                    items.push(item);
                }
                Ok(Capped(items))
            }
        }
        deserializer.deserialize_seq(Items(std::marker::PhantomData))
    }
}

/// A node of a full `Nodes` list: the object as raw JSON (to be echoed unchanged), its name,
/// and its labels left raw until a pin needs some of them ([`labels`]).
struct NodeItem<'a> {
    raw: &'a RawValue,
    name: Cow<'a, str>,
    labels: Option<&'a RawValue>,
}

impl<'de: 'a, 'a> Deserialize<'de> for NodeItem<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Item<'a> {
            #[serde(default, borrow)]
            metadata: Option<Meta<'a>>,
        }
        #[derive(Deserialize)]
        struct Meta<'a> {
            #[serde(default, borrow)]
            name: Option<Name<'a>>,
            #[serde(default, borrow)]
            labels: Option<&'a RawValue>,
        }
        let raw = <&'de RawValue>::deserialize(deserializer)?;
        if !raw.get().starts_with('{') {
            return Err(de::Error::custom(format!(
                "expected a Node object, got {}",
                raw.get().chars().take(20).collect::<String>()
            )));
        }
        let item: Item<'de> = serde_json::from_str(raw.get()).map_err(de::Error::custom)?;
        let (name, labels) = match item.metadata {
            Some(meta) => (meta.name.map_or(Cow::Borrowed(""), |n| n.0), meta.labels),
            None => (Cow::Borrowed(""), None),
        };
        Ok(NodeItem { raw, name, labels })
    }
}

/// The values of `keys` among a node's raw labels (every other label is skipped unread).
fn labels(raw: Option<&RawValue>, keys: &[&str]) -> Result<BTreeMap<String, String>, RequestError> {
    struct Wanted<'k>(&'k [&'k str]);
    impl<'de> Visitor<'de> for Wanted<'_> {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of labels")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }
        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
            let mut found = BTreeMap::new();
            while let Some(key) = map.next_key::<Name<'de>>()? {
                if self.0.contains(&key.0.as_ref()) {
                    let value: Name<'de> = map.next_value()?;
                    found.insert(key.0.into_owned(), value.0.into_owned());
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let Some(raw) = raw else {
        return Ok(BTreeMap::new());
    };
    let mut json = serde_json::Deserializer::from_str(raw.get());
    json.deserialize_any(Wanted(keys))
        .map_err(|e| malformed(format!("node labels: {e}")))
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
pub struct HostPriority<'a> {
    /// The node.
    pub host: &'a str,
    /// 0..=10.
    pub score: i64,
}

/// A served extender call.
#[derive(Debug)]
pub struct Served {
    /// The JSON body.
    pub body: Vec<u8>,
    /// What the extender did.
    pub outcome: Outcome,
    /// The skip reason label, when a recorded pin was not applied.
    pub skipped: Option<&'static str>,
    /// The pod carries `ipkeep.dev/pinned-by`: admission (the webhook or the admission policy)
    /// pinned it already. A pod the extender pins without it was not seen at admission.
    pub pinned_at_admission: bool,
}

fn malformed(reason: impl fmt::Display) -> RequestError {
    RequestError::malformed("extender/v1 ExtenderArgs", reason)
}

fn parse(body: &[u8]) -> Result<(ExtenderArgs<'_>, Pod), RequestError> {
    let args: ExtenderArgs<'_> = serde_json::from_slice(body).map_err(malformed)?;
    let raw = args.pod.ok_or_else(|| malformed("it has no Pod"))?;
    let pod = pod::read(raw.get()).map_err(|e| malformed(format!("its Pod: {e}")))?;
    Ok((args, pod))
}

/// The node pin for `pod`, with the outcome label: `None` when the pod is not pinned.
fn pin_for(pod: &Pod, caches: &Caches) -> Result<(Option<Pinned>, Served), RequestError> {
    let pinned_at_admission = (pod.metadata.annotations.as_ref())
        .is_some_and(|a| a.contains_key(ipkeep_values::keys::PINNED_BY));
    let mut served = Served {
        body: Vec::new(),
        outcome: Outcome::Passed,
        skipped: None,
        pinned_at_admission,
    };
    let Some((workload, statefulset)) = pin::statefulset_of(pod) else {
        return Ok((None, served));
    };
    if !caches.ready() {
        return Err(RequestError::NotReady);
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pps = caches.pps_for(&namespace, workload, &statefulset);
    let Decision::Manage(managed) = pin::decide(pod, &namespace, pps.as_deref()) else {
        return Ok((None, served));
    };
    match managed.pin {
        PinOutcome::Pinned(p) => {
            served.outcome = Outcome::Pinned;
            Ok((Some(p), served))
        }
        PinOutcome::Unrecorded(_) => {
            served.outcome = Outcome::Unrecorded;
            Ok((None, served))
        }
        PinOutcome::Skipped(why) => {
            served.outcome = Outcome::Skipped;
            served.skipped = Some(why.label());
            Ok((None, served))
        }
    }
}

fn to_body<T: Serialize>(value: &T) -> Result<Vec<u8>, RequestError> {
    serde_json::to_vec(value).map_err(|e| RequestError::Body(e.to_string()))
}

/// The first `max` bytes of `text`, on a character boundary.
fn truncated(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Serves `filter`.
pub fn filter(body: &[u8], caches: &Caches) -> Result<Served, RequestError> {
    let (args, pod) = parse(body)?;
    let (pinned, mut served) = pin_for(&pod, caches)?;
    // Nodes that do not match the pin are unresolvable: preempting pods there would not help,
    // so the scheduler must not evict anything for them.
    let pinned = pinned.filter(|p| !p.required.is_empty());
    let refusal = pinned
        .as_ref()
        .map(|p| truncated(p.refusal(), MAX_REASON))
        .unwrap_or_default();
    let required: Vec<&str> = pinned
        .iter()
        .flat_map(|p| p.required.iter().map(|r| r.key.as_str()))
        .collect();
    let unknown = "ipkeep: node not in the node cache yet; retry";
    let mut unresolvable: Vec<(&str, &str)> = Vec::new();
    let mut failed: Vec<(&str, &str)> = Vec::new();
    let items = args.nodes.as_ref().and_then(|n| n.items.as_ref());
    let nodes = match items {
        None => None,
        Some(items) => {
            let mut kept = Vec::with_capacity(items.0.len());
            for item in &items.0 {
                match &pinned {
                    Some(p) if !p.admits(&labels(item.labels, &required)?) => {
                        unresolvable.push((&item.name, &refusal));
                    }
                    _ => kept.push(item.raw),
                }
            }
            Some(NodeListOut::new(kept))
        }
    };
    // With the hostname pinned, only the recorded node can be admitted (it is where the
    // pod's addresses are held), so the other names need no cache lookup.
    let only = pinned
        .as_ref()
        .filter(|p| p.required.iter().any(|r| r.key == HOSTNAME_LABEL))
        .map(|p| p.node.as_str());
    let node_names = args.node_names.as_ref().map(|names| {
        let mut kept = Vec::with_capacity(names.0.len());
        for Name(name) in &names.0 {
            let name = name.as_ref();
            let Some(pinned) = &pinned else {
                kept.push(name);
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
    let keys: Vec<&str> = pinned
        .iter()
        .flat_map(|p| {
            let preferred = p.preferred.iter().flat_map(|t| t.requirements.iter());
            p.required.iter().chain(preferred).map(|r| r.key.as_str())
        })
        .collect();
    let mut scores: Vec<HostPriority<'_>> = Vec::new();
    for item in args
        .nodes
        .iter()
        .flat_map(|n| n.items.iter())
        .flat_map(|i| &i.0)
    {
        let score = match &pinned {
            Some(p) => p.score(&item.name, &labels(item.labels, &keys)?),
            None => 0,
        };
        scores.push(HostPriority {
            host: &item.name,
            score,
        });
    }
    for Name(name) in args.node_names.iter().flat_map(|n| &n.0) {
        let score = match (&pinned, pinned.as_ref().and_then(|_| caches.node(name))) {
            (Some(p), Some(node)) => p.score(name, cache::labels(&node)),
            _ => 0,
        };
        scores.push(HostPriority { host: name, score });
    }
    Ok(Served {
        body: to_body(&scores)?,
        ..served
    })
}
