//! Field sets in the Kubernetes managedFields "FieldsV1" encoding: building them from objects
//! with the same rules as structured-merge-diff, set algebra, and locating/removing the values
//! they name. Encoding round-trips: `from_fields_v1(to_fields_v1(s)) == s`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{ListKind, ListSchema, PatchError, canonical_json, key_field};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// An object field, encoded `f:<name>`.
    Field(String),
    /// An associative-list element, encoded `k:{..}`: (key name, canonical JSON value),
    /// sorted by key name.
    Key(Vec<(String, String)>),
    /// A set element, encoded `v:<json>`; holds canonical JSON.
    Value(String),
    /// A positional list element, encoded `i:<n>` (only ever decoded, never produced).
    Index(usize),
}

/// A path from the object root.
pub type FieldPath = Vec<PathElement>;

impl PathElement {
    /// The FieldsV1 key of this element.
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(pairs) => {
                let body: Vec<String> = pairs
                    .iter()
                    .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
                    .collect();
                format!("k:{{{}}}", body.join(","))
            }
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a FieldsV1 key (anything but `.`).
    pub fn decode(key: &str) -> Result<PathElement, PatchError> {
        let bad = |why: &str| PatchError::InvalidFieldsV1(format!("{why} in key {key:?}"));
        let parse = |s: &str| serde_json::from_str::<Value>(s).map_err(|_| bad("invalid json"));
        match key.split_at_checked(2) {
            Some(("f:", name)) => Ok(PathElement::Field(name.to_string())),
            Some(("v:", json)) => Ok(PathElement::Value(canonical_json(&parse(json)?))),
            Some(("k:", json)) => match parse(json)? {
                Value::Object(m) => Ok(key_element(
                    m.iter()
                        .map(|(k, v)| (k.clone(), canonical_json(v)))
                        .collect(),
                )),
                _ => Err(bad("key is not an object")),
            },
            Some(("i:", n)) => n
                .parse()
                .map(PathElement::Index)
                .map_err(|_| bad("invalid index")),
            _ => Err(bad("unknown prefix")),
        }
    }

    /// Renders like structured-merge-diff: `.name`, `[type="Ready"]`, `[="x"]`, `[0]`.
    pub fn render(&self) -> String {
        match self {
            PathElement::Field(name) => format!(".{name}"),
            PathElement::Key(pairs) => {
                let body: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("[{}]", body.join(","))
            }
            PathElement::Value(v) => format!("[={v}]"),
            PathElement::Index(i) => format!("[{i}]"),
        }
    }
}

fn key_element(mut pairs: Vec<(String, String)>) -> PathElement {
    pairs.sort();
    PathElement::Key(pairs)
}

/// Renders a whole path like `.status.conditions[type="Ready"]`.
pub fn render_path(path: &[PathElement]) -> String {
    path.iter().map(PathElement::render).collect()
}

/// Identity of a list element under `kind`: its merge keys for associative lists (when it has
/// any), otherwise its value.
pub(crate) fn element_id(item: &Value, kind: &ListKind) -> PathElement {
    if let (ListKind::Map(keys), Value::Object(m)) = (kind, item) {
        let pairs: Vec<(String, String)> = keys
            .iter()
            .filter_map(|k| key_field(m, k).map(|v| (k.clone(), canonical_json(&v))))
            .collect();
        if !pairs.is_empty() {
            return key_element(pairs);
        }
    }
    PathElement::Value(canonical_json(item))
}

/// Whether list element `item` is the one `pe` names.
pub(crate) fn element_matches(item: &Value, pe: &PathElement) -> bool {
    match pe {
        PathElement::Key(pairs) => item.as_object().is_some_and(|m| {
            pairs
                .iter()
                .all(|(k, v)| key_field(m, k).is_some_and(|x| canonical_json(&x) == *v))
        }),
        PathElement::Value(v) => canonical_json(item) == *v,
        _ => false,
    }
}

/// Fields never recorded in managedFields, like the real apiserver's strip set.
const UNOWNED_METADATA: [&str; 9] = [
    "name",
    "namespace",
    "managedFields",
    "resourceVersion",
    "generation",
    "uid",
    "creationTimestamp",
    "selfLink",
    "clusterName",
];

/// A set of field paths stored as a tree; a node is a member when the path to it is in the set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    /// The empty set.
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    /// Every field of `obj` the way structured-merge-diff records it: scalars, atomic lists,
    /// nulls and empty objects are leaves, every element of a set or associative list is a
    /// member (with its fields below it). `apiVersion`, `kind` and server-owned metadata
    /// (`name`, `namespace`, `uid`, `resourceVersion`, ...) are not recorded.
    pub fn from_object(obj: &Value, lists: &dyn ListSchema) -> FieldSet {
        let mut set = FieldSet::new();
        if let Value::Object(m) = obj {
            let mut path = Vec::new();
            set.add_object(m, &mut path, lists);
        }
        set
    }

    fn add_object(
        &mut self,
        m: &Map<String, Value>,
        path: &mut Vec<String>,
        lists: &dyn ListSchema,
    ) {
        for (k, v) in m {
            let skip = match path.as_slice() {
                [] => k == "apiVersion" || k == "kind",
                [meta] => meta == "metadata" && UNOWNED_METADATA.contains(&k.as_str()),
                _ => false,
            };
            if skip {
                continue;
            }
            path.push(k.clone());
            let mut child = FieldSet::new();
            child.add_value(v, path, lists);
            path.pop();
            if !child.is_empty() {
                self.children.insert(PathElement::Field(k.clone()), child);
            }
        }
    }

    fn add_value(&mut self, v: &Value, path: &mut Vec<String>, lists: &dyn ListSchema) {
        match v {
            Value::Object(m) if !m.is_empty() => self.add_object(m, path, lists),
            Value::Array(items) => {
                let refs: Vec<&str> = path.iter().map(String::as_str).collect();
                let kind = lists.list_kind(&refs);
                if kind == ListKind::Atomic {
                    self.member = true;
                    return;
                }
                for item in items {
                    let child = self.children.entry(element_id(item, &kind)).or_default();
                    child.member = true;
                    if let (ListKind::Map(_), Value::Object(fields)) = (&kind, item) {
                        child.add_object(fields, path, lists);
                    }
                }
            }
            _ => self.member = true,
        }
    }

    /// True when the set has no paths.
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    /// Adds `path` (a no-op for the empty path).
    pub fn insert(&mut self, path: &[PathElement]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let child = self.children.entry(first.clone()).or_default();
        if rest.is_empty() {
            child.member = true;
        } else {
            child.insert(rest);
        }
    }

    fn node(&self, path: &[PathElement]) -> Option<&FieldSet> {
        match path.split_first() {
            None => Some(self),
            Some((first, rest)) => self.children.get(first)?.node(rest),
        }
    }

    /// Whether `path` itself is in the set.
    pub fn contains(&self, path: &[PathElement]) -> bool {
        self.node(path).is_some_and(|n| n.member)
    }

    /// Whether `path` or any path below it is in the set.
    pub fn contains_at_or_below(&self, path: &[PathElement]) -> bool {
        self.node(path).is_some_and(|n| !n.is_empty())
    }

    /// Paths in either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.member |= other.member;
        for (pe, child) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(pe.clone(), merged);
        }
        out
    }

    /// Paths in `self` but not in `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && !other.member,
            children: BTreeMap::new(),
        };
        for (pe, child) in &self.children {
            let rest = match other.children.get(pe) {
                Some(theirs) => child.difference(theirs),
                None => child.clone(),
            };
            if !rest.is_empty() {
                out.children.insert(pe.clone(), rest);
            }
        }
        out
    }

    /// Paths in both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (pe, child) in &self.children {
            if let Some(theirs) = other.children.get(pe) {
                let both = child.intersection(theirs);
                if !both.is_empty() {
                    out.children.insert(pe.clone(), both);
                }
            }
        }
        out
    }

    /// Every member path with whether it has member paths below it, parents before children.
    pub fn members(&self) -> Vec<(FieldPath, bool)> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut FieldPath, out: &mut Vec<(FieldPath, bool)>) {
        if self.member && !prefix.is_empty() {
            out.push((prefix.clone(), !self.children.is_empty()));
        }
        for (pe, child) in &self.children {
            prefix.push(pe.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    /// Every member path rendered for messages, like `.spec.replicas`.
    pub fn paths(&self) -> Vec<String> {
        self.members().iter().map(|(p, _)| render_path(p)).collect()
    }

    /// The FieldsV1 JSON of this set.
    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".to_string(), Value::Object(Map::new()));
        }
        for (pe, child) in &self.children {
            m.insert(pe.encode(), child.to_fields_v1());
        }
        Value::Object(m)
    }

    /// Parses FieldsV1 JSON.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, PatchError> {
        let mut set = FieldSet::new();
        set.parse_children(v)?;
        Ok(set)
    }

    fn parse_children(&mut self, v: &Value) -> Result<(), PatchError> {
        let Value::Object(m) = v else {
            return Err(PatchError::InvalidFieldsV1(format!(
                "expected an object, found {}",
                super::json_type(v)
            )));
        };
        for (k, child) in m {
            if k == "." {
                self.member = true;
                continue;
            }
            let mut node = FieldSet::new();
            node.parse_children(child)?;
            if node.children.is_empty() {
                node.member = true;
            }
            self.children.insert(PathElement::decode(k)?, node);
        }
        Ok(())
    }
}

/// The value at `path` inside `obj`, if present.
pub fn value_at<'a>(obj: &'a Value, path: &[PathElement]) -> Option<&'a Value> {
    let Some((first, rest)) = path.split_first() else {
        return Some(obj);
    };
    let next = match first {
        PathElement::Field(name) => obj.as_object()?.get(name)?,
        PathElement::Index(i) => obj.as_array()?.get(*i)?,
        pe => obj
            .as_array()?
            .iter()
            .find(|item| element_matches(item, pe))?,
    };
    value_at(next, rest)
}

/// Removes the value at `path` from `obj`; objects and lists reached through a field that
/// become empty as a result are removed too. Returns whether anything was removed.
pub fn remove_at(obj: &mut Value, path: &[PathElement]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    match (first, obj) {
        (PathElement::Field(name), Value::Object(m)) => {
            if rest.is_empty() {
                return m.remove(name).is_some();
            }
            let Some(child) = m.get_mut(name) else {
                return false;
            };
            let removed = remove_at(child, rest);
            let emptied = match child {
                Value::Object(c) => c.is_empty(),
                Value::Array(c) => c.is_empty(),
                _ => false,
            };
            if removed && emptied {
                m.remove(name);
            }
            removed
        }
        (PathElement::Index(i), Value::Array(items)) => {
            if rest.is_empty() {
                if *i < items.len() {
                    items.remove(*i);
                    return true;
                }
                return false;
            }
            items.get_mut(*i).is_some_and(|item| remove_at(item, rest))
        }
        (pe, Value::Array(items)) => {
            if rest.is_empty() {
                let before = items.len();
                items.retain(|item| !element_matches(item, pe));
                return items.len() != before;
            }
            items
                .iter_mut()
                .find(|item| element_matches(item, pe))
                .is_some_and(|item| remove_at(item, rest))
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::patch::BuiltinLists;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "3",
                "labels": {"app": "x"}, "finalizers": ["a/b"]},
            "spec": {"replicas": 1, "containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 80}], "args": ["x"]}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        })
    }

    #[test]
    fn from_object_uses_real_encoding() {
        let set = FieldSet::from_object(&pod(), &BuiltinLists);
        let want = json!({
            "f:metadata": {"f:labels": {"f:app": {}}, "f:finalizers": {"v:\"a/b\"": {}}},
            "f:spec": {"f:replicas": {}, "f:containers": {"k:{\"name\":\"c\"}": {
                ".": {}, "f:name": {}, "f:image": {}, "f:args": {},
                "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                    ".": {}, "f:containerPort": {}}}}}},
            "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {
                ".": {}, "f:type": {}, "f:status": {}}}}
        });
        assert_eq!(set.to_fields_v1(), want);
        assert_eq!(FieldSet::from_fields_v1(&want).unwrap(), set);
    }

    #[test]
    fn paths_render_like_kube() {
        let set = FieldSet::from_object(&pod(), &BuiltinLists);
        let paths = set.paths();
        for p in [
            ".spec.replicas",
            ".status.conditions[type=\"Ready\"]",
            ".status.conditions[type=\"Ready\"].status",
            ".metadata.finalizers[=\"a/b\"]",
            ".spec.containers[name=\"c\"].ports[containerPort=80,protocol=\"TCP\"]",
        ] {
            assert!(paths.contains(&p.to_string()), "{p} missing from {paths:?}");
        }
        assert!(
            !paths
                .iter()
                .any(|p| p.contains("uid") || p.contains(".name\"") || p == ".kind")
        );
    }

    #[test]
    fn set_algebra() {
        let a = FieldSet::from_object(&json!({"spec": {"a": 1, "b": 2}}), &BuiltinLists);
        let b = FieldSet::from_object(&json!({"spec": {"b": 3, "c": 4}}), &BuiltinLists);
        assert_eq!(a.intersection(&b).paths(), vec![".spec.b"]);
        assert_eq!(a.difference(&b).paths(), vec![".spec.a"]);
        assert_eq!(a.union(&b).paths(), vec![".spec.a", ".spec.b", ".spec.c"]);
        assert!(a.difference(&a).is_empty());
        assert!(FieldSet::new().is_empty());
    }

    #[test]
    fn decode_rejects_garbage() {
        for bad in [
            json!([]),
            json!({"x:y": {}}),
            json!({"k:[1]": {}}),
            json!({"f:a": 3}),
        ] {
            assert!(FieldSet::from_fields_v1(&bad).is_err(), "{bad}");
        }
        let idx = FieldSet::from_fields_v1(&json!({"f:a": {"i:2": {}}})).unwrap();
        assert_eq!(idx.paths(), vec![".a[2]"]);
    }

    #[test]
    fn value_at_and_remove_at() {
        let mut obj = pod();
        let set = FieldSet::from_object(&obj, &BuiltinLists);
        let (cond, _) = set
            .members()
            .into_iter()
            .find(|(p, _)| render_path(p) == ".status.conditions[type=\"Ready\"].status")
            .unwrap();
        assert_eq!(value_at(&obj, &cond), Some(&json!("True")));
        assert!(remove_at(&mut obj, &cond[..2]));
        assert!(obj.get("status").is_none(), "emptied status pruned: {obj}");
        let labels = [
            PathElement::Field("metadata".into()),
            PathElement::Field("labels".into()),
        ];
        assert!(remove_at(&mut obj, &labels));
        assert!(!remove_at(&mut obj, &labels));
        assert_eq!(obj["metadata"]["name"], "p");
    }
}
