//! Server-side printing: `meta.k8s.io/v1` `Table` responses for `Accept: …;as=Table`, with a
//! CRD's `additionalPrinterColumns` (or the built-in columns of pods, nodes, StatefulSets …),
//! and the small JSONPath dialect those columns use.

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::registry::ResourceType;

/// What `includeObject` asks to embed in each row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// Nothing.
    None,
    /// `PartialObjectMetadata` (the default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| {
        first.contains("as=Table") && first.contains("g=meta.k8s.io") && first.contains("v=v1")
    })
}

/// A Table of `objects`. `headers` false omits the column definitions (watch events after the
/// first, as the real server does).
pub fn table(
    resource: &ResourceType,
    objects: &[Value],
    list_metadata: Value,
    include: IncludeObject,
    headers: bool,
) -> Value {
    let mut columns = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."
    })];
    columns.extend(resource.columns.iter().map(|c| {
        json!({"name": c.name, "type": c.column_type, "format": c.format,
               "description": c.description, "priority": c.priority})
    }));
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(resource.columns.iter().map(|c| cell(resource, object, c)));
            let embedded = match include {
                IncludeObject::None => Value::Null,
                IncludeObject::Metadata => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": object["metadata"],
                }),
                IncludeObject::Object => object.clone(),
            };
            let mut row = json!({ "cells": cells });
            if !embedded.is_null() {
                row["object"] = embedded;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_metadata,
        "columnDefinitions": if headers { Value::Array(columns) } else { json!([]) },
        "rows": rows,
    })
}

fn cell(resource: &ResourceType, object: &Value, column: &crate::registry::PrinterColumn) -> Value {
    if let Some(v) = builtin_cell(resource, object, &column.name) {
        return v;
    }
    let values = json_path(object, &column.json_path);
    let Some(first) = values.first() else {
        return Value::Null;
    };
    match column.column_type.as_str() {
        "date" => first.as_str().map_or(Value::Null, |t| json!(age(t))),
        "string" => match first {
            Value::String(_) => (*first).clone(),
            other => json!(other.to_string()),
        },
        _ => (*first).clone(),
    }
}

/// Cells the built-in printers compute rather than read.
fn builtin_cell(resource: &ResourceType, object: &Value, column: &str) -> Option<Value> {
    if resource.crd.is_some() {
        return None;
    }
    let status = &object["status"];
    Some(match (resource.kind.as_str(), column) {
        ("Pod", "Ready") => {
            let statuses = status["containerStatuses"].as_array();
            let total = object["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
            json!(format!("{ready}/{total}"))
        }
        ("Pod", "Status") => {
            if object["metadata"]["deletionTimestamp"].is_string() {
                json!("Terminating")
            } else {
                status["phase"].clone()
            }
        }
        ("Pod", "Restarts") => {
            let restarts: i64 = status["containerStatuses"].as_array().map_or(0, |s| {
                s.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
            });
            json!(restarts.to_string())
        }
        ("Node", "Status") => {
            let ready = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .is_some_and(|c| c["status"] == "True");
            json!(if ready { "Ready" } else { "NotReady" })
        }
        ("Node", "Roles") => json!("<none>"),
        ("StatefulSet", "Ready") => json!(format!(
            "{}/{}",
            status["readyReplicas"].as_i64().unwrap_or(0),
            object["spec"]["replicas"].as_i64().unwrap_or(0)
        )),
        _ => return None,
    })
}

/// Age as kubectl prints it: `45s`, `12m`, `5h`, `3d`.
pub fn age(timestamp: &str) -> String {
    let Ok(then) = humantime::parse_rfc3339_weak(timestamp) else {
        return "<invalid>".into();
    };
    let seconds = SystemTime::now()
        .duration_since(then)
        .map_or(0, |d| d.as_secs());
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Evaluates the JSONPath subset printer columns use: `.a.b`, `.a[0]`, `.a[*].b`,
/// `.a[?(@.type=="Ready")].status`. Unknown syntax yields no value (an empty cell).
pub fn json_path<'a>(object: &'a Value, path: &str) -> Vec<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut current = vec![object];
    let mut rest = path.trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let field = &after[..end];
            current = current.into_iter().filter_map(|v| v.get(field)).collect();
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let Some(end) = after.find(']') else {
                return Vec::new();
            };
            let index = &after[..end];
            rest = &after[end + 1..];
            current = if index == "*" {
                current
                    .into_iter()
                    .flat_map(|v| v.as_array().into_iter().flatten())
                    .collect()
            } else if let Some(filter) =
                index.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
            {
                let Some((field, wanted)) = filter.split_once("==") else {
                    return Vec::new();
                };
                let wanted = wanted.trim().trim_matches(['"', '\'']);
                current
                    .into_iter()
                    .flat_map(|v| v.as_array().into_iter().flatten())
                    .filter(|item| match &item[field.trim()] {
                        Value::String(s) => s == wanted,
                        other => *other == wanted,
                    })
                    .collect()
            } else if let Ok(i) = index.parse::<usize>() {
                current.into_iter().filter_map(|v| v.get(i)).collect()
            } else {
                return Vec::new();
            };
        } else {
            return Vec::new();
        }
    }
    current
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn json_path_subset() {
        let o = json!({"spec": {"targetRef": {"name": "db"}},
                       "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}],
                                  "ips": ["a", "b"]}});
        assert_eq!(json_path(&o, ".spec.targetRef.name"), [&json!("db")]);
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            [&json!("True")]
        );
        assert_eq!(json_path(&o, ".status.ips[1]"), [&json!("b")]);
        assert_eq!(json_path(&o, ".status.conditions[*].type").len(), 2);
        assert!(json_path(&o, ".missing.x").is_empty());
        assert!(json_path(&o, ".status.ips[").is_empty());
    }

    #[test]
    fn tables_have_name_first_and_the_resource_columns() {
        let registry = Registry::new();
        let pods = registry.get("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z"},
                         "spec": {"containers": [{"name": "c"}]},
                         "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}]}});
        let t = table(
            pods,
            &[pod],
            json!({"resourceVersion": "5"}),
            IncludeObject::Metadata,
            true,
        );
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names[..4], ["Name", "Ready", "Status", "Restarts"]);
        assert_eq!(t["rows"][0]["cells"][0], "p");
        assert_eq!(t["rows"][0]["cells"][1], "1/1");
        assert_eq!(t["rows"][0]["cells"][3], "2");
        assert!(t["rows"][0]["cells"][4].as_str().unwrap().ends_with('d'));
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
