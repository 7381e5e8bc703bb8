//! Patch semantics for apisim: list merge rules, strategic merge patch, managedFields field
//! sets and server-side apply. Everything here is a pure function over `serde_json::Value`;
//! nothing panics on any input, malformed input yields a [`PatchError`].

pub mod apply;
pub mod fieldset;
pub mod strategic;

pub use apply::{
    ApplyRequest, ManagedFieldsEntry, managed_fields, record_update, server_side_apply,
};
pub use fieldset::{FieldPath, FieldSet, PathElement};
pub use strategic::strategic_merge;

use serde_json::{Map, Value};

/// How a list at a given path merges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListKind {
    /// The list is replaced as a whole and owned as a single field.
    Atomic,
    /// A list of distinct primitive values; merging takes the union.
    Set,
    /// An associative list whose elements are identified by these fields.
    Map(Vec<String>),
}

/// Where list semantics come from: built-in Kubernetes types (by path) and CRD schemas.
pub trait ListSchema {
    /// List semantics of the list found at `path` (object field names from the root, list
    /// indices omitted).
    fn list_kind(&self, path: &[&str]) -> ListKind;
}

/// List semantics of the built-in Kubernetes types apisim serves (Pods, StatefulSets, Nodes,
/// Leases, Events, Namespaces) and of every object's metadata, matched by the tail of the path
/// so pod templates nested anywhere resolve the same way.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuiltinLists;

fn map_kind(keys: &[&str]) -> ListKind {
    ListKind::Map(keys.iter().map(|k| (*k).to_string()).collect())
}

impl ListSchema for BuiltinLists {
    fn list_kind(&self, path: &[&str]) -> ListKind {
        let Some((&last, rest)) = path.split_last() else {
            return ListKind::Atomic;
        };
        let parent = rest.last().copied().unwrap_or("");
        const CONTAINERS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
        let in_container = CONTAINERS.contains(&parent);
        match (parent, last) {
            ("metadata", "ownerReferences") => map_kind(&["uid"]),
            ("metadata", "finalizers") => ListKind::Set,
            ("spec", "containers" | "initContainers" | "ephemeralContainers") => {
                map_kind(&["name"])
            }
            (_, "env") if in_container => map_kind(&["name"]),
            (_, "ports") if in_container => map_kind(&["containerPort", "protocol"]),
            (_, "volumeMounts") if in_container => map_kind(&["mountPath"]),
            (_, "volumeDevices") if in_container => map_kind(&["devicePath"]),
            (_, "resizePolicy") if in_container => map_kind(&["resourceName"]),
            ("resources", "claims") => map_kind(&["name"]),
            ("spec", "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims") => {
                map_kind(&["name"])
            }
            ("spec", "hostAliases") => map_kind(&["ip"]),
            ("spec", "topologySpreadConstraints") => {
                map_kind(&["topologyKey", "whenUnsatisfiable"])
            }
            ("spec", "taints") => map_kind(&["key", "effect"]),
            ("spec", "podCIDRs") => ListKind::Set,
            ("status", "podIPs" | "hostIPs") => map_kind(&["ip"]),
            ("status", "addresses") => map_kind(&["type"]),
            (_, "conditions") if rest.contains(&"status") => map_kind(&["type"]),
            _ => ListKind::Atomic,
        }
    }
}

/// List semantics read from a CRD version's `openAPIV3Schema` (`x-kubernetes-list-type` and
/// `x-kubernetes-list-map-keys`). Accepts the schema itself, `{"openAPIV3Schema": ..}` or a
/// whole CRD version (`{"schema": {"openAPIV3Schema": ..}}`). Unknown paths are atomic;
/// `metadata.*` uses [`BuiltinLists`].
#[derive(Clone, Debug, PartialEq)]
pub struct SchemaLists(pub Value);

impl SchemaLists {
    fn root(&self) -> &Value {
        if let Some(s) = self.0.pointer("/schema/openAPIV3Schema") {
            s
        } else if let Some(s) = self.0.get("openAPIV3Schema") {
            s
        } else {
            &self.0
        }
    }
}

fn schema_child<'a>(mut node: &'a Value, field: &str) -> Option<&'a Value> {
    while let Some(items) = node.get("items").filter(|i| i.is_object()) {
        node = items;
    }
    node.get("properties")
        .and_then(|p| p.get(field))
        .or_else(|| node.get("additionalProperties").filter(|a| a.is_object()))
}

impl ListSchema for SchemaLists {
    fn list_kind(&self, path: &[&str]) -> ListKind {
        if path.first() == Some(&"metadata") {
            return BuiltinLists.list_kind(path);
        }
        let mut node = self.root();
        for field in path {
            match schema_child(node, field) {
                Some(next) => node = next,
                None => return ListKind::Atomic,
            }
        }
        match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListKind::Set,
            Some("map") => {
                let keys: Vec<String> = node
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|ks| {
                        ks.iter()
                            .filter_map(|k| k.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                if keys.is_empty() {
                    ListKind::Atomic
                } else {
                    ListKind::Map(keys)
                }
            }
            _ => ListKind::Atomic,
        }
    }
}

/// One field another manager owns that an apply would change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldConflict {
    /// Name of the manager owning the field.
    pub manager: String,
    /// That manager's operation: `Apply` or `Update`.
    pub operation: String,
    /// API version recorded for that manager.
    pub api_version: String,
    /// Subresource of that manager's entry, if any.
    pub subresource: Option<String>,
    /// The conflicting field, rendered like `.spec.replicas`.
    pub path: String,
}

impl FieldConflict {
    /// The manager as the real apiserver prints it, e.g. `"kubectl" using v1`.
    pub fn manager_description(&self) -> String {
        let mut out = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            out.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == "Update" {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }

    /// The message of the matching `FieldManagerConflict` status cause.
    pub fn cause_message(&self) -> String {
        format!("conflict with {}", self.manager_description())
    }
}

/// Renders conflicts exactly like the real apiserver's apply conflict message.
pub fn render_conflicts(conflicts: &[FieldConflict]) -> String {
    match conflicts {
        [one] => format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            one.manager_description(),
            one.path
        ),
        _ => {
            let mut by_manager: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
            for c in conflicts {
                by_manager
                    .entry(c.manager_description())
                    .or_default()
                    .push(&c.path);
            }
            let mut lines = Vec::new();
            for (manager, paths) in by_manager {
                lines.push(format!("conflicts with {manager}:"));
                lines.extend(paths.into_iter().map(|p| format!("- {p}")));
            }
            format!(
                "Apply failed with {} conflicts: {}",
                conflicts.len(),
                lines.join("\n")
            )
        }
    }
}

/// Errors from patching, applying and decoding managedFields.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch document is not a JSON object.
    #[error("patch must be a json object, found {found}")]
    PatchNotObject {
        /// JSON type that was found instead.
        found: &'static str,
    },
    /// The object being patched or the applied configuration is not a JSON object.
    #[error("{what} must be a json object, found {found}")]
    NotAnObject {
        /// Which input was wrong.
        what: &'static str,
        /// JSON type that was found instead.
        found: &'static str,
    },
    /// A `$patch` value or `$`-prefixed key that strategic merge patch does not know.
    #[error("unknown patch directive {directive} at {path}")]
    UnknownDirective {
        /// The offending directive (key or `$patch` value).
        directive: String,
        /// Where it was found.
        path: String,
    },
    /// A known directive with a malformed value.
    #[error("invalid {directive} at {path}: {reason}")]
    InvalidDirective {
        /// The directive key.
        directive: String,
        /// Where it was found.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An element of an associative list carries none of the list's merge keys.
    #[error("element of list {path} has none of the merge keys {keys:?}")]
    MissingMergeKey {
        /// The list, rendered like `.spec.containers`.
        path: String,
        /// The list's merge keys.
        keys: Vec<String>,
    },
    /// A managedFields `fieldsV1` document could not be decoded.
    #[error("invalid fieldsV1: {0}")]
    InvalidFieldsV1(String),
    /// Server-side apply was asked to target a subresource other than `status`.
    #[error("unsupported subresource {0:?} for apply")]
    UnsupportedSubresource(String),
    /// The apply would change fields owned by other managers and was not forced.
    #[error("{}", render_conflicts(conflicts))]
    Conflict {
        /// Every conflicting (manager, field) pair.
        conflicts: Vec<FieldConflict>,
    },
}

/// JSON type name of `v`, for error messages.
pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Renders a field-name path like `.spec.containers`.
pub(crate) fn dotted(path: &[String]) -> String {
    if path.is_empty() {
        return ".".to_string();
    }
    path.iter().map(|p| format!(".{p}")).collect()
}

/// Value of merge-key `field` in a list element; Kubernetes defaults a missing `protocol`
/// key to `TCP`, so that is done here too.
pub(crate) fn key_field(item: &Map<String, Value>, field: &str) -> Option<Value> {
    match item.get(field) {
        None | Some(Value::Null) => (field == "protocol").then(|| Value::String("TCP".to_string())),
        Some(v) => Some(v.clone()),
    }
}

/// JSON text of `v` with object keys sorted (independent of serde_json's map ordering) and
/// null object members left out.
pub(crate) fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            // Null members mean "absent" in Kubernetes objects, so they do not count.
            let mut keys: Vec<&String> = m
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, _)| k)
                .collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(child) = m.get(k) {
                    write_canonical(child, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_list_kinds() {
        let cases: &[(&[&str], ListKind)] = &[
            (&["metadata", "finalizers"], ListKind::Set),
            (&["metadata", "ownerReferences"], map_kind(&["uid"])),
            (&["spec", "containers"], map_kind(&["name"])),
            (
                &["spec", "template", "spec", "initContainers"],
                map_kind(&["name"]),
            ),
            (
                &["spec", "template", "spec", "containers", "env"],
                map_kind(&["name"]),
            ),
            (
                &["spec", "containers", "ports"],
                map_kind(&["containerPort", "protocol"]),
            ),
            (
                &["spec", "containers", "volumeMounts"],
                map_kind(&["mountPath"]),
            ),
            (&["spec", "volumes"], map_kind(&["name"])),
            (&["status", "conditions"], map_kind(&["type"])),
            (
                &["status", "loadBalancer", "conditions"],
                map_kind(&["type"]),
            ),
            (&["spec", "conditions"], ListKind::Atomic),
            (&["status", "podIPs"], map_kind(&["ip"])),
            (&["spec", "tolerations"], ListKind::Atomic),
            (&["spec", "readinessGates"], ListKind::Atomic),
            (&["spec", "taints"], map_kind(&["key", "effect"])),
            (&["status", "addresses"], map_kind(&["type"])),
            (&["spec", "volumeClaimTemplates"], ListKind::Atomic),
            (&["spec", "containers", "args"], ListKind::Atomic),
            (&[], ListKind::Atomic),
        ];
        for (path, want) in cases {
            assert_eq!(&BuiltinLists.list_kind(path), want, "{path:?}");
        }
    }

    #[test]
    fn schema_list_kinds() {
        let schema = SchemaLists(json!({"schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "items": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["id"],
                        "items": {"type": "object", "properties": {
                            "tags": {"type": "array", "x-kubernetes-list-type": "set"}}}},
                    "byName": {"type": "object", "additionalProperties": {
                        "type": "array", "x-kubernetes-list-type": "set"}}
                }}
            }
        }}}));
        assert_eq!(schema.list_kind(&["spec", "items"]), map_kind(&["id"]));
        assert_eq!(schema.list_kind(&["spec", "items", "tags"]), ListKind::Set);
        assert_eq!(schema.list_kind(&["spec", "byName", "x"]), ListKind::Set);
        assert_eq!(schema.list_kind(&["spec", "other"]), ListKind::Atomic);
        assert_eq!(schema.list_kind(&["metadata", "finalizers"]), ListKind::Set);
    }

    #[test]
    fn canonical_json_sorts_keys() {
        assert_eq!(
            canonical_json(&json!({"b": 1, "a": [true, "x"]})),
            r#"{"a":[true,"x"],"b":1}"#
        );
    }

    /// Deterministic pseudo-random JSON built from Kubernetes-looking keys and directives.
    fn arbitrary(seed: &mut u64, depth: u32) -> Value {
        const KEYS: [&str; 16] = [
            "metadata",
            "spec",
            "status",
            "containers",
            "env",
            "name",
            "finalizers",
            "conditions",
            "type",
            "$patch",
            "$retainKeys",
            "$setElementOrder/containers",
            "$deleteFromPrimitiveList/finalizers",
            "managedFields",
            "fieldsV1",
            "f:spec",
        ];
        const WORDS: [&str; 6] = [
            "replace",
            "delete",
            "merge",
            "a",
            "Ready",
            "k:{\"name\":\"a\"}",
        ];
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = (*seed >> 33) as usize;
        match if depth == 0 { r % 4 } else { r % 7 } {
            0 => Value::Null,
            1 => json!(r % 3),
            2 => json!(WORDS[r % WORDS.len()]),
            3 => json!(r.is_multiple_of(2)),
            4 | 5 => {
                let mut m = Map::new();
                for i in 0..(r % 4) {
                    m.insert(
                        KEYS[(r / 7 + i * 5) % KEYS.len()].to_string(),
                        arbitrary(seed, depth - 1),
                    );
                }
                Value::Object(m)
            }
            _ => Value::Array((0..(r % 4)).map(|_| arbitrary(seed, depth - 1)).collect()),
        }
    }

    #[test]
    fn arbitrary_input_never_panics() {
        let mut seed = 7;
        for _ in 0..3000 {
            let obj = |seed: &mut u64| {
                json!({"metadata": arbitrary(seed, 4), "spec": arbitrary(seed, 5),
                    "status": arbitrary(seed, 4), "x": arbitrary(seed, 1)})
            };
            let (a, b) = (obj(&mut seed), obj(&mut seed));
            let _ = strategic::strategic_merge(&a, &b, &BuiltinLists);
            let _ = fieldset::FieldSet::from_fields_v1(&a);
            for sub in [None, Some("status")] {
                let req = ApplyRequest {
                    manager: "m",
                    force: false,
                    api_version: "v1",
                    subresource: sub,
                    time: "t",
                };
                if let Ok(out) = server_side_apply(Some(&a), &b, &req, &BuiltinLists) {
                    let again = server_side_apply(Some(&out), &b, &req, &BuiltinLists);
                    assert_eq!(
                        again.as_ref().ok(),
                        Some(&out),
                        "apply is idempotent: {a} + {b}"
                    );
                }
            }
            let mut n = b.clone();
            record_update(Some(&a), &mut n, "u", "v1", None, "t", &BuiltinLists);
            let _ = fieldset::FieldSet::from_object(&a, &BuiltinLists)
                .difference(&FieldSet::from_object(&b, &BuiltinLists));
        }
    }
}
