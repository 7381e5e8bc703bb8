//! Strategic merge patch as kubectl sends it (`kubectl patch --type=strategic`, client-side
//! `kubectl apply`). Promises: list semantics come from a [`ListSchema`], every directive
//! (`$patch`, `$retainKeys`, `$setElementOrder/..`, `$deleteFromPrimitiveList/..`) is applied
//! and never appears in the result, and malformed patches are errors, not panics.

use serde_json::{Map, Value};

use super::{ListKind, ListSchema, PatchError, dotted, json_type, key_field};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Applies strategic merge `patch` to `original` (a JSON object, or `null` for none).
pub fn strategic_merge(
    original: &Value,
    patch: &Value,
    lists: &dyn ListSchema,
) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::PatchNotObject {
            found: json_type(patch),
        });
    };
    let base = match original {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        other => {
            return Err(PatchError::NotAnObject {
                what: "object",
                found: json_type(other),
            });
        }
    };
    let merged = Merger { lists }.merge_map(base, patch, &mut Vec::new())?;
    Ok(Value::Object(merged.unwrap_or_default()))
}

struct Merger<'a> {
    lists: &'a dyn ListSchema,
}

fn invalid(directive: &str, path: &[String], reason: &'static str) -> PatchError {
    PatchError::InvalidDirective {
        directive: directive.to_string(),
        path: dotted(path),
        reason,
    }
}

fn unknown(directive: &str, path: &[String]) -> PatchError {
    PatchError::UnknownDirective {
        directive: directive.to_string(),
        path: dotted(path),
    }
}

/// The `$patch` directive of a list element or map, if any.
fn directive_of<'v>(v: &'v Value, path: &[String]) -> Result<Option<&'v str>, PatchError> {
    directive(v.get(PATCH), path)
}

fn directive<'v>(d: Option<&'v Value>, path: &[String]) -> Result<Option<&'v str>, PatchError> {
    match d {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(invalid(PATCH, path, "value must be a string")),
    }
}

fn string_list<'v>(
    v: &'v Value,
    directive: &str,
    path: &[String],
) -> Result<&'v [Value], PatchError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| invalid(directive, path, "value must be a list"))
}

impl Merger<'_> {
    fn kind(&self, path: &[String]) -> ListKind {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        self.lists.list_kind(&refs)
    }

    /// Merges `patch` into `original`; `None` means the map is deleted.
    fn merge_map(
        &self,
        mut original: Map<String, Value>,
        patch: &Map<String, Value>,
        path: &mut Vec<String>,
    ) -> Result<Option<Map<String, Value>>, PatchError> {
        match directive(patch.get(PATCH), path)? {
            None | Some("merge") => {}
            Some("replace") => original = Map::new(),
            Some("delete") => return Ok(None),
            Some(other) => return Err(unknown(other, path)),
        }
        if let Some(retain) = patch.get(RETAIN_KEYS) {
            let keys = string_list(retain, RETAIN_KEYS, path)?;
            if keys.iter().any(|k| !k.is_string()) {
                return Err(invalid(RETAIN_KEYS, path, "entries must be strings"));
            }
            original.retain(|k, _| keys.iter().any(|r| r.as_str() == Some(k)));
        }
        for (key, values) in patch {
            if let Some(field) = key.strip_prefix(DELETE_PRIMITIVE) {
                let values = string_list(values, key, path)?;
                if let Some(Value::Array(items)) = original.get_mut(field) {
                    items.retain(|item| !values.contains(item));
                }
            }
        }
        for (key, value) in patch {
            if key.starts_with('$') {
                if key == PATCH || key == RETAIN_KEYS || key.starts_with(DELETE_PRIMITIVE) {
                    continue;
                }
                if let Some(field) = key.strip_prefix(SET_ORDER) {
                    let order = string_list(value, key, path)?;
                    if !patch.contains_key(field)
                        && let Some(Value::Array(items)) = original.get_mut(field)
                    {
                        path.push(field.to_string());
                        let kind = self.kind(path);
                        path.pop();
                        *items = reorder(std::mem::take(items), order, &kind);
                    }
                    continue;
                }
                return Err(unknown(key, path));
            }
            if value.is_null() {
                original.remove(key);
                continue;
            }
            path.push(key.clone());
            let order = match patch.get(&format!("{SET_ORDER}{key}")) {
                Some(o) => Some(string_list(o, SET_ORDER, path)?),
                None => None,
            };
            // Take in place so key order survives under serde_json's `preserve_order`.
            let current = original.get_mut(key).map(std::mem::take);
            let merged = self.merge_value(current, value, path, order);
            path.pop();
            match merged? {
                Some(v) => {
                    original.insert(key.clone(), v);
                }
                None => {
                    original.remove(key);
                }
            }
        }
        Ok(Some(original))
    }

    /// Merges one patch value into the original value of the same field.
    fn merge_value(
        &self,
        original: Option<Value>,
        patch: &Value,
        path: &mut Vec<String>,
        order: Option<&[Value]>,
    ) -> Result<Option<Value>, PatchError> {
        match (original, patch) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                Ok(self.merge_map(o, p, path)?.map(Value::Object))
            }
            (_, Value::Object(p)) => Ok(self.merge_map(Map::new(), p, path)?.map(Value::Object)),
            (original, Value::Array(p)) => {
                let base = match original {
                    Some(Value::Array(items)) => items,
                    _ => Vec::new(),
                };
                let kind = self.kind(path);
                let mut merged = self.merge_list(base, p, path, &kind)?;
                if let Some(order) = order {
                    merged = reorder(merged, order, &kind);
                }
                Ok(Some(Value::Array(merged)))
            }
            (_, scalar) => Ok(Some(scalar.clone())),
        }
    }

    /// A patch value with no original: directives are processed and nulls dropped.
    fn fresh(&self, v: &Value, path: &mut Vec<String>) -> Result<Option<Value>, PatchError> {
        self.merge_value(None, v, path, None)
    }

    fn merge_list(
        &self,
        original: Vec<Value>,
        patch: &[Value],
        path: &mut Vec<String>,
        kind: &ListKind,
    ) -> Result<Vec<Value>, PatchError> {
        let mut replace = false;
        let mut elements = Vec::with_capacity(patch.len());
        for item in patch {
            match directive_of(item, path)? {
                Some("replace") => replace = true,
                // A bare `{"$patch": ..}` carries nothing else to merge.
                Some(_) if item.as_object().is_some_and(|m| m.len() == 1) => {}
                _ => elements.push(item),
            }
        }
        if replace || *kind == ListKind::Atomic {
            let mut out = Vec::with_capacity(elements.len());
            for item in elements {
                out.extend(self.fresh(item, path)?);
            }
            return Ok(out);
        }
        let ListKind::Map(keys) = kind else {
            let mut out = original;
            for item in elements {
                if !out.contains(item) {
                    out.extend(self.fresh(item, path)?);
                }
            }
            return Ok(out);
        };
        let mut out = original;
        for item in elements {
            let Value::Object(fields) = item else {
                return Err(PatchError::MissingMergeKey {
                    path: dotted(path),
                    keys: keys.clone(),
                });
            };
            let key: Vec<(&String, Value)> = keys
                .iter()
                .filter_map(|k| key_field(fields, k).map(|v| (k, v)))
                .collect();
            if key.is_empty() {
                return Err(PatchError::MissingMergeKey {
                    path: dotted(path),
                    keys: keys.clone(),
                });
            }
            let matches = |e: &Value| {
                e.as_object()
                    .is_some_and(|m| key.iter().all(|(k, v)| key_field(m, k).as_ref() == Some(v)))
            };
            match directive_of(item, path)? {
                Some("delete") => out.retain(|e| !matches(e)),
                None | Some("merge") => match out.iter().position(matches) {
                    Some(i) => {
                        let existing = match std::mem::take(&mut out[i]) {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        match self.merge_map(existing, fields, path)? {
                            Some(m) => out[i] = Value::Object(m),
                            None => {
                                out.remove(i);
                            }
                        }
                    }
                    None => out.extend(self.fresh(item, path)?),
                },
                Some(other) => return Err(unknown(other, path)),
            }
        }
        Ok(out)
    }
}

/// Puts elements named in `order` first, in that order; the rest keep their relative order.
fn reorder(items: Vec<Value>, order: &[Value], kind: &ListKind) -> Vec<Value> {
    let mut rest: Vec<Option<Value>> = items.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(rest.len());
    for wanted in order {
        let found = rest.iter_mut().find(|slot| {
            slot.as_ref()
                .is_some_and(|item| same_element(item, wanted, kind))
        });
        if let Some(slot) = found {
            out.extend(slot.take());
        }
    }
    out.extend(rest.into_iter().flatten());
    out
}

fn same_element(item: &Value, wanted: &Value, kind: &ListKind) -> bool {
    match (kind, item, wanted) {
        (ListKind::Map(keys), Value::Object(i), Value::Object(w)) => keys
            .iter()
            .filter(|k| w.contains_key(k.as_str()))
            .all(|k| key_field(i, k) == key_field(w, k)),
        _ => item == wanted,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::patch::BuiltinLists;
    use serde_json::json;

    fn sts(containers: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": containers}}}})
    }

    #[test]
    fn table() {
        let cases: Vec<(&str, Value, Value, Value)> = vec![
            (
                "objects merge and null deletes",
                json!({"a": {"b": 1, "c": 2}, "d": 3}),
                json!({"a": {"b": null, "e": 4}, "d": null, "missing": null}),
                json!({"a": {"c": 2, "e": 4}}),
            ),
            (
                "atomic lists replace",
                json!({"spec": {"tolerations": [{"key": "a"}], "args": ["x"]}}),
                json!({"spec": {"tolerations": [{"key": "b"}]}}),
                json!({"spec": {"tolerations": [{"key": "b"}], "args": ["x"]}}),
            ),
            (
                "finalizers union",
                json!({"metadata": {"finalizers": ["a", "b"]}}),
                json!({"metadata": {"finalizers": ["b", "c"]}}),
                json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            ),
            (
                "conditions merge by type",
                json!({"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "x"},
                    {"type": "Initialized", "status": "True"}]}}),
                json!({"status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": null},
                    {"type": "PodScheduled", "status": "True"}]}}),
                json!({"status": {"conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "PodScheduled", "status": "True"}]}}),
            ),
            (
                "nested pod template env merge",
                sts(json!([{"name": "app", "image": "a:1",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}])),
                json!({"spec": {"template": {"spec": {"containers": [{"name": "app",
                    "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}]}}}}),
                sts(json!([{"name": "app", "image": "a:1", "env": [
                    {"name": "A", "value": "1"}, {"name": "B", "value": "3"},
                    {"name": "C", "value": "4"}]}])),
            ),
            (
                "$patch: replace on a map",
                json!({"spec": {"selector": {"a": "1", "b": "2"}}}),
                json!({"spec": {"selector": {"$patch": "replace", "c": "3"}}}),
                json!({"spec": {"selector": {"c": "3"}}}),
            ),
            (
                "$patch: delete on a map",
                json!({"spec": {"selector": {"a": "1"}, "x": 1}}),
                json!({"spec": {"selector": {"$patch": "delete"}}}),
                json!({"spec": {"x": 1}}),
            ),
            (
                "$patch: merge on a map",
                json!({"spec": {"selector": {"a": "1"}}}),
                json!({"spec": {"selector": {"$patch": "merge", "b": "2"}}}),
                json!({"spec": {"selector": {"a": "1", "b": "2"}}}),
            ),
            (
                "$patch: replace as list element",
                sts(json!([{"name": "a"}, {"name": "b"}])),
                json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "c"}, {"$patch": "replace"}]}}}}),
                sts(json!([{"name": "c"}])),
            ),
            (
                "$patch: delete as list element",
                sts(json!([{"name": "a"}, {"name": "b"}])),
                json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "a", "$patch": "delete"}]}}}}),
                sts(json!([{"name": "b"}])),
            ),
            (
                "$retainKeys",
                json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"x": 1}}}}),
                json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
                json!({"spec": {"strategy": {"type": "Recreate"}}}),
            ),
            (
                "$setElementOrder with the list",
                sts(json!([{"name": "a"}, {"name": "b"}, {"name": "z"}])),
                json!({"spec": {"template": {"spec": {
                    "$setElementOrder/containers": [{"name": "c"}, {"name": "b"}, {"name": "a"}],
                    "containers": [{"name": "c"}]}}}}),
                sts(json!([{"name": "c"}, {"name": "b"}, {"name": "a"}, {"name": "z"}])),
            ),
            (
                "$setElementOrder without the list",
                json!({"metadata": {"finalizers": ["a", "b"]}}),
                json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"]}}),
                json!({"metadata": {"finalizers": ["b", "a"]}}),
            ),
            (
                "$deleteFromPrimitiveList",
                json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"],
                    "finalizers": ["d"]}}),
                json!({"metadata": {"finalizers": ["a", "c", "d"]}}),
            ),
            (
                "directives inside new values never leak",
                json!({}),
                json!({"spec": {"selector": {"$patch": "merge", "a": null, "b": "1"},
                    "containers": [{"name": "x", "env": [{"name": "gone", "$patch": "delete"}]}]}}),
                json!({"spec": {"selector": {"b": "1"}, "containers": [{"name": "x", "env": []}]}}),
            ),
            (
                "ports match with defaulted protocol",
                json!({"spec": {"containers": [{"name": "c",
                    "ports": [{"containerPort": 80, "protocol": "TCP", "name": "a"}]}]}}),
                json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "name": "b"}]}]}}),
                json!({"spec": {"containers": [{"name": "c",
                    "ports": [{"containerPort": 80, "protocol": "TCP", "name": "b"}]}]}}),
            ),
        ];
        for (name, original, patch, want) in cases {
            let got = strategic_merge(&original, &patch, &BuiltinLists).unwrap();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn kubectl_client_side_apply_shape() {
        let last = r#"{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{"name":"s"}}"#;
        let live = sts(json!([
            {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "old", "image": "old:1"},
            {"name": "side", "image": "side:1"}]));
        let patch = json!({
            "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": last}},
            "spec": {"replicas": 3, "template": {"spec": {
                "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
                "containers": [
                    {"name": "app", "image": "app:2"},
                    {"$patch": "delete", "name": "old"}]}}}
        });
        let got = strategic_merge(&live, &patch, &BuiltinLists).unwrap();
        let mut want = sts(json!([
            {"name": "side", "image": "side:1"},
            {"name": "app", "image": "app:2", "env": [{"name": "A", "value": "1"}]}]));
        want["spec"]["replicas"] = json!(3);
        want["metadata"]["annotations"] =
            json!({"kubectl.kubernetes.io/last-applied-configuration": last});
        assert_eq!(got, want);
        assert!(!got.to_string().contains('$'));
    }

    #[test]
    fn errors() {
        let l = &BuiltinLists;
        assert!(matches!(
            strategic_merge(&json!({}), &json!([1]), l),
            Err(PatchError::PatchNotObject { found: "array" })
        ));
        assert!(strategic_merge(&json!(3), &json!({}), l).is_err());
        let bad = [
            json!({"a": {"$patch": "explode"}}),
            json!({"$unknown": 1}),
            json!({"$retainKeys": "x"}),
            json!({"$setElementOrder/x": 1}),
            json!({"spec": {"containers": [{"image": "no-name"}]}}),
            json!({"spec": {"containers": ["str"]}}),
            json!({"spec": {"containers": [{"name": "a", "$patch": 1}]}}),
        ];
        for patch in bad {
            assert!(strategic_merge(&json!({}), &patch, l).is_err(), "{patch}");
        }
        let msg = strategic_merge(&json!({}), &json!({"spec": {"containers": [{}]}}), l)
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "element of list .spec.containers has none of the merge keys [\"name\"]"
        );
    }

    #[test]
    fn top_level_delete_and_null_original() {
        let got = strategic_merge(
            &json!({"a": 1}),
            &json!({"$patch": "delete"}),
            &BuiltinLists,
        );
        assert_eq!(got.unwrap(), json!({}));
        let got = strategic_merge(&Value::Null, &json!({"a": 1}), &BuiltinLists);
        assert_eq!(got.unwrap(), json!({"a": 1}));
    }
}
