//! Server-side apply and managedFields bookkeeping with structured-merge-diff semantics:
//! the applied configuration is the manager's whole intent, changing a field another manager
//! owns is a conflict unless forced, fields a manager stops applying are removed when nobody
//! else owns them, and non-apply writes move ownership of what they changed to their manager.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::fieldset::{FieldSet, PathElement, element_id, remove_at, value_at};
use super::{FieldConflict, ListKind, ListSchema, PatchError, json_type};

/// One server-side apply request.
#[derive(Clone, Copy, Debug)]
pub struct ApplyRequest<'a> {
    /// Field manager name (`fieldManager` query parameter).
    pub manager: &'a str,
    /// Take ownership of conflicting fields instead of failing.
    pub force: bool,
    /// API version the configuration was sent with, recorded in managedFields.
    pub api_version: &'a str,
    /// `Some("status")` for the status subresource; `None` for the main resource.
    pub subresource: Option<&'a str>,
    /// Time recorded in managedFields (RFC3339).
    pub time: &'a str,
}

/// One decoded `metadata.managedFields` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagedFieldsEntry {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// API version of the write.
    pub api_version: String,
    /// Time of the last change to this entry (RFC3339).
    pub time: Option<String>,
    /// Subresource the write targeted, if any.
    pub subresource: Option<String>,
    /// The fields this manager owns.
    pub fields: FieldSet,
}

fn opt_string(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(String::from)
}

impl ManagedFieldsEntry {
    /// Decodes one managedFields entry.
    pub fn from_value(v: &Value) -> Result<ManagedFieldsEntry, PatchError> {
        if !v.is_object() {
            return Err(PatchError::NotAnObject {
                what: "managedFields entry",
                found: json_type(v),
            });
        }
        if let Some(kind) = opt_string(v, "fieldsType").filter(|t| t != "FieldsV1") {
            return Err(PatchError::InvalidFieldsV1(format!(
                "unsupported fieldsType {kind:?}"
            )));
        }
        let fields = match v.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::new(),
            Some(f) => FieldSet::from_fields_v1(f)?,
        };
        Ok(ManagedFieldsEntry {
            manager: opt_string(v, "manager").unwrap_or_default(),
            operation: opt_string(v, "operation").unwrap_or_default(),
            api_version: opt_string(v, "apiVersion").unwrap_or_default(),
            time: opt_string(v, "time"),
            subresource: opt_string(v, "subresource").filter(|s| !s.is_empty()),
            fields,
        })
    }

    /// Encodes the entry exactly like the real apiserver.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), Value::String(self.manager.clone()));
        m.insert("operation".into(), Value::String(self.operation.clone()));
        m.insert("apiVersion".into(), Value::String(self.api_version.clone()));
        if let Some(t) = &self.time {
            m.insert("time".into(), Value::String(t.clone()));
        }
        m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
        m.insert("fieldsV1".into(), self.fields.to_fields_v1());
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), Value::String(s.clone()));
        }
        Value::Object(m)
    }

    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }

    fn conflict(&self, path: String) -> FieldConflict {
        FieldConflict {
            manager: self.manager.clone(),
            operation: self.operation.clone(),
            api_version: self.api_version.clone(),
            subresource: self.subresource.clone(),
            path,
        }
    }
}

/// The decodable entries of `obj`'s `metadata.managedFields` (undecodable ones are skipped,
/// as the real apiserver resets broken managedFields).
pub fn managed_fields(obj: &Value) -> Vec<ManagedFieldsEntry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .filter_map(|e| ManagedFieldsEntry::from_value(e).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `entries` (empty ones dropped, sorted like the real apiserver) into `obj`.
fn set_managed_fields(obj: &mut Value, mut entries: Vec<ManagedFieldsEntry>) {
    entries.retain(|e| !e.fields.is_empty());
    entries.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    let Value::Object(root) = obj else {
        return;
    };
    if entries.is_empty() {
        if let Some(Value::Object(meta)) = root.get_mut("metadata") {
            meta.remove("managedFields");
        }
        return;
    }
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        let list = entries.iter().map(ManagedFieldsEntry::to_value).collect();
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

fn sort_key(e: &ManagedFieldsEntry) -> (&str, &str, &str, &str, &str) {
    (
        &e.operation,
        e.time.as_deref().unwrap_or(""),
        &e.manager,
        &e.api_version,
        e.subresource.as_deref().unwrap_or(""),
    )
}

/// Metadata the server controls; ignored when it appears in an applied configuration.
const SERVER_METADATA: [&str; 8] = [
    "managedFields",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// The part of the applied configuration the request may touch.
fn scope_config(
    applied: &Map<String, Value>,
    subresource: Option<&str>,
) -> Result<Value, PatchError> {
    match subresource {
        None => {
            let mut config = applied.clone();
            config.remove("status");
            if let Some(Value::Object(meta)) = config.get_mut("metadata") {
                for key in SERVER_METADATA {
                    meta.remove(key);
                }
            }
            Ok(Value::Object(config))
        }
        Some("status") => {
            let mut config = Map::new();
            if let Some(status) = applied.get("status") {
                config.insert("status".into(), status.clone());
            }
            Ok(Value::Object(config))
        }
        Some(other) => Err(PatchError::UnsupportedSubresource(other.to_string())),
    }
}

/// Applies `applied` as `req.manager`'s complete configuration on top of `live` (None when
/// the apply creates the object) and returns the new object with managedFields updated.
/// A no-op apply returns `live` unchanged, timestamps included.
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    req: &ApplyRequest,
    lists: &dyn ListSchema,
) -> Result<Value, PatchError> {
    let Value::Object(applied) = applied else {
        return Err(PatchError::NotAnObject {
            what: "applied configuration",
            found: json_type(applied),
        });
    };
    let live_obj = match live {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(PatchError::NotAnObject {
                what: "live object",
                found: json_type(other),
            });
        }
    };
    let config = scope_config(applied, req.subresource)?;
    let config_set = FieldSet::from_object(&config, lists);
    let mut merged = merge_into(Some(live_obj.clone()), &config, &mut Vec::new(), lists)
        .unwrap_or_else(|| Value::Object(Map::new()));
    let changed = changed_fields(&live_obj, &merged, &config_set);

    let old_entries = managed_fields(&live_obj);
    let mut entries = old_entries.clone();
    let mine = entries
        .iter()
        .position(|e| e.is(req.manager, "Apply", req.subresource));
    let previous = mine
        .and_then(|i| entries.get(i))
        .map(|e| e.fields.clone())
        .unwrap_or_default();

    let mut conflicts = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if Some(i) != mine {
            let overlap = entry.fields.intersection(&changed);
            conflicts.extend(overlap.paths().into_iter().map(|p| entry.conflict(p)));
        }
    }
    if !conflicts.is_empty() {
        if !req.force {
            conflicts.sort_by(|a, b| (&a.manager, &a.path).cmp(&(&b.manager, &b.path)));
            return Err(PatchError::Conflict { conflicts });
        }
        for (i, entry) in entries.iter_mut().enumerate() {
            if Some(i) != mine {
                entry.fields = entry.fields.difference(&changed);
            }
        }
    }

    let others = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != mine)
        .fold(FieldSet::new(), |acc, (_, e)| acc.union(&e.fields));
    for (path, _) in previous.difference(&config_set).members() {
        // A field applied as a leaf before (say an empty map) and with children now is still
        // applied: only its own "leaf" membership went away.
        let still_applied = config_set.contains_at_or_below(&path);
        if !still_applied && !others.contains_at_or_below(&path) && !is_key_of_element(&path) {
            remove_at(&mut merged, &path);
        }
    }

    let entry = ManagedFieldsEntry {
        manager: req.manager.to_string(),
        operation: "Apply".into(),
        api_version: req.api_version.to_string(),
        time: Some(req.time.to_string()),
        subresource: req.subresource.map(String::from),
        fields: config_set,
    };
    match mine.and_then(|i| entries.get_mut(i)) {
        Some(slot) => *slot = entry,
        None => entries.push(entry),
    }
    if let Some(live) = live
        && without_managed_fields(live) == without_managed_fields(&merged)
        && same_ignoring_time(&old_entries, &entries)
    {
        return Ok(live.clone());
    }
    set_managed_fields(&mut merged, entries);
    Ok(merged)
}

/// Records a non-apply write: `manager` (operation `Update`) takes ownership of every field
/// whose value differs between `old` and `new` (all fields on create); other managers lose
/// those fields, everyone loses fields that no longer exist, and empty entries are dropped.
/// managedFields come from `new` when it carries them, otherwise from `old`.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
    time: &str,
    lists: &dyn ListSchema,
) {
    if !new.is_object() {
        return;
    }
    let empty = Value::Object(Map::new());
    let old_obj = old.filter(|o| o.is_object()).unwrap_or(&empty);
    let mut entries = match new.pointer("/metadata/managedFields") {
        Some(Value::Array(_)) => managed_fields(new),
        _ => managed_fields(old_obj),
    };
    let new_set = FieldSet::from_object(new, lists);
    let changed = changed_fields(old_obj, new, &new_set);
    let removed = FieldSet::from_object(old_obj, lists).difference(&new_set);
    let mut mine = None;
    for (i, entry) in entries.iter_mut().enumerate() {
        entry.fields = entry.fields.difference(&removed);
        if entry.is(manager, "Update", subresource) {
            mine = Some(i);
        } else {
            entry.fields = entry.fields.difference(&changed);
        }
    }
    if !changed.is_empty() {
        match mine.and_then(|i| entries.get_mut(i)) {
            Some(entry) => {
                entry.fields = entry.fields.union(&changed);
                entry.api_version = api_version.to_string();
                entry.time = Some(time.to_string());
            }
            None => entries.push(ManagedFieldsEntry {
                manager: manager.to_string(),
                operation: "Update".into(),
                api_version: api_version.to_string(),
                time: Some(time.to_string()),
                subresource: subresource.map(String::from),
                fields: changed,
            }),
        }
    }
    set_managed_fields(new, entries);
}

/// Members of `set` whose value differs between `before` and `after`; an element or object
/// with members below it counts as changed only when it is new.
fn changed_fields(before: &Value, after: &Value, set: &FieldSet) -> FieldSet {
    let mut out = FieldSet::new();
    for (path, has_children) in set.members() {
        let old = value_at(before, &path);
        let changed = if has_children {
            old.is_none()
        } else {
            old != value_at(after, &path)
        };
        if changed {
            out.insert(&path);
        }
    }
    out
}

/// Whether `path` is a merge-key field of a list element (kept while the element is kept).
fn is_key_of_element(path: &[PathElement]) -> bool {
    match path {
        [.., PathElement::Key(pairs), PathElement::Field(name)] => {
            pairs.iter().any(|(k, _)| k == name)
        }
        _ => false,
    }
}

fn without_managed_fields(obj: &Value) -> Value {
    let mut copy = obj.clone();
    if let Some(Value::Object(meta)) = copy.get_mut("metadata") {
        meta.remove("managedFields");
    }
    copy
}

fn same_ignoring_time(a: &[ManagedFieldsEntry], b: &[ManagedFieldsEntry]) -> bool {
    let normalize = |entries: &[ManagedFieldsEntry]| {
        let mut out: Vec<ManagedFieldsEntry> = entries
            .iter()
            .filter(|e| !e.fields.is_empty())
            .map(|e| ManagedFieldsEntry {
                time: None,
                ..e.clone()
            })
            .collect();
        out.sort_by(|x, y| sort_key(x).cmp(&sort_key(y)));
        out
    };
    normalize(a) == normalize(b)
}

/// Merges applied configuration `rhs` into `lhs` by the list semantics; `None` = absent.
fn merge_into(
    lhs: Option<Value>,
    rhs: &Value,
    path: &mut Vec<String>,
    lists: &dyn ListSchema,
) -> Option<Value> {
    match rhs {
        Value::Null => None,
        Value::Object(r) => {
            let mut out = match lhs {
                Some(Value::Object(l)) => l,
                _ => Map::new(),
            };
            for (k, rv) in r {
                path.push(k.clone());
                let current = out.get_mut(k).map(std::mem::take);
                let merged = merge_into(current, rv, path, lists);
                path.pop();
                match merged {
                    Some(v) => {
                        out.insert(k.clone(), v);
                    }
                    None => {
                        out.remove(k);
                    }
                }
            }
            Some(Value::Object(out))
        }
        Value::Array(r) => {
            let refs: Vec<&str> = path.iter().map(String::as_str).collect();
            let kind = lists.list_kind(&refs);
            let l = match lhs {
                Some(Value::Array(l)) => l,
                _ => Vec::new(),
            };
            Some(Value::Array(match kind {
                ListKind::Atomic => r.clone(),
                _ => merge_list(l, r, &kind, path, lists),
            }))
        }
        scalar => Some(scalar.clone()),
    }
}

/// Merges a set or associative list the way structured-merge-diff does: shared elements
/// follow the applied order, live-only elements stay where they were, new ones are inserted
/// where the applied configuration puts them.
fn merge_list(
    lhs: Vec<Value>,
    rhs: &[Value],
    kind: &ListKind,
    path: &mut Vec<String>,
    lists: &dyn ListSchema,
) -> Vec<Value> {
    let lpe: Vec<PathElement> = lhs.iter().map(|i| element_id(i, kind)).collect();
    let rpe: Vec<PathElement> = rhs.iter().map(|i| element_id(i, kind)).collect();
    let mut lidx: HashMap<&PathElement, usize> = HashMap::new();
    for (i, pe) in lpe.iter().enumerate() {
        lidx.entry(pe).or_insert(i);
    }
    let ridx: HashSet<&PathElement> = rpe.iter().collect();
    let shared: Vec<&PathElement> = rpe.iter().filter(|pe| lidx.contains_key(pe)).collect();
    let mut next_shared = 0;
    let mut left: Vec<Option<Value>> = lhs.into_iter().map(Some).collect();
    let mut merged_rhs: HashSet<&PathElement> = HashSet::new();
    let mut out = Vec::with_capacity(left.len() + rhs.len());
    let (mut li, mut ri) = (0, 0);
    while li < lpe.len() || ri < rpe.len() {
        if let (Some(lp), Some(rp)) = (lpe.get(li), rpe.get(ri)) {
            if lp == rp {
                let l = left.get_mut(li).and_then(Option::take);
                if merged_rhs.insert(rp) {
                    out.extend(rhs.get(ri).and_then(|r| merge_item(l, r, rp, path, lists)));
                }
                if shared.get(next_shared) == Some(&rp) {
                    next_shared += 1;
                }
                li += 1;
                ri += 1;
                continue;
            }
            if ridx.contains(lp) && shared.get(next_shared).is_some_and(|s| *s != lp) {
                li += 1;
                continue;
            }
        }
        if let Some(lp) = lpe.get(li) {
            if !ridx.contains(lp) {
                out.extend(left.get_mut(li).and_then(Option::take));
                li += 1;
                continue;
            }
            if merged_rhs.contains(lp) {
                li += 1;
                continue;
            }
        }
        if let Some(rp) = rpe.get(ri) {
            if merged_rhs.insert(rp) {
                let l = lidx
                    .get(rp)
                    .and_then(|&i| left.get_mut(i))
                    .and_then(Option::take);
                out.extend(rhs.get(ri).and_then(|r| merge_item(l, r, rp, path, lists)));
            }
            if shared.get(next_shared) == Some(&rp) {
                next_shared += 1;
            }
            ri += 1;
            continue;
        }
        li += 1;
    }
    out
}

/// Keyed elements merge field by field; elements identified by value are taken as applied.
fn merge_item(
    lhs: Option<Value>,
    rhs: &Value,
    id: &PathElement,
    path: &mut Vec<String>,
    lists: &dyn ListSchema,
) -> Option<Value> {
    match id {
        PathElement::Key(_) => merge_into(lhs, rhs, path, lists),
        _ => Some(rhs.clone()),
    }
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
