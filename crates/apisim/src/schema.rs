//! Structural-schema admission for custom resources: defaulting, pruning and validation of an
//! object against one CRD version's `openAPIV3Schema`, the way kube-apiserver's
//! apiextensions-apiserver treats structural schemas.
//!
//! Promises, for [`admit_custom_resource`]:
//! - Pruning first: fields not declared in `properties` are removed and reported (dot-separated,
//!   list elements as `spec.items[0].foo`), unless the node has
//!   `x-kubernetes-preserve-unknown-fields: true` or `additionalProperties` (`true` or a schema).
//!   `apiVersion`, `kind` and `metadata` are kept at the root and in
//!   `x-kubernetes-embedded-resource` objects.
//! - Then defaulting: a property's `default` (itself pruned against the property's schema) fills
//!   the field when it is absent, or null without `nullable: true`; deep, into list items and
//!   `additionalProperties` values, and into defaults just inserted.
//! - Then validation, collecting every problem in path order, worded like the server's field
//!   errors: `type` (`integer` takes JSON integers only, `number` any number), `nullable`,
//!   `x-kubernetes-int-or-string`, `required`, `enum`, `minimum`/`maximum` with boolean
//!   `exclusiveMinimum`/`exclusiveMaximum`, `minLength`/`maxLength` (characters),
//!   `minItems`/`maxItems`, `minProperties`/`maxProperties`, `items`, `additionalProperties`,
//!   and `x-kubernetes-list-type` `set`/`map` (with `x-kubernetes-list-map-keys`) uniqueness.
//!   `metadata` at the root is not validated by the schema.
//! - Never panics: a malformed schema keyword is reported as an `Internal error` problem at the
//!   path where it is used, and an object or schema nested deeper than [`MAX_NESTING`] is refused.
//!   On error the object may already have been pruned and defaulted.
//!
//! Does NOT implement: `pattern` (no regex engine here; ignored), `format` (ignored),
//! `allOf`/`anyOf`/`oneOf`/`not` (ignored), `x-kubernetes-validations` CEL rules (ignored),
//! ratcheting of unchanged fields on update, validation of the CRD schema itself (structural
//! rules), and metadata validation. Differences from the server's wording: duplicate list items
//! show their value as JSON (the server prints Go's `%#v`), and an int-or-string type error says
//! `must be of type integer,string`.

use std::{cmp::Ordering, fmt};

use serde_json::{Map, Value};

/// One node of an OpenAPI v3 schema: the JSON object of its keywords.
type SchemaNode = Map<String, Value>;

/// Objects and schemas nested deeper than this are refused (serde_json's parser stops at 128).
pub const MAX_NESTING: usize = 128;

/// Fields every Kubernetes object carries, never pruned at a resource root.
const RESOURCE_META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// One problem, rendered like kube-apiserver's field errors, e.g. field `spec.weight` and
/// message `Invalid value: 0: spec.weight in body should be greater than or equal to 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// What admission changed besides defaults: the paths of pruned unknown fields, e.g. `spec.foo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaOutcome {
    pub unknown_fields: Vec<String>,
}

/// Prunes unknown fields (recording them), applies defaults, then validates `object`, the whole
/// custom resource (apiVersion, kind, metadata, spec, status...), against `schema`, a CRD
/// version's `openAPIV3Schema`. Returns the problems (never empty) when the object is invalid.
pub fn admit_custom_resource(
    schema: &Value,
    object: &mut Value,
) -> Result<SchemaOutcome, Vec<FieldProblem>> {
    let root = FieldPath::default();
    for (what, value) in [("object", &*object), ("schema", schema)] {
        if nesting_depth(value) > MAX_NESTING {
            let why = format!("{what} is nested deeper than {MAX_NESTING} levels");
            return Err(vec![root.problem(format!("Internal error: {why}"))]);
        }
    }
    let mut unknown_fields = Vec::new();
    prune(object, schema.as_object(), &root, true, &mut unknown_fields);
    apply_defaults(object, schema.as_object());
    let mut validation = Validation::default();
    validation.value(object, schema, &root, true);
    if validation.problems.is_empty() {
        Ok(SchemaOutcome { unknown_fields })
    } else {
        Err(validation.problems)
    }
}

/// A field path as the server prints it: `spec.items[0].name`; the root prints as `<root>`.
#[derive(Debug, Clone, Default)]
struct FieldPath(String);

impl FieldPath {
    fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Self(name.to_owned())
        } else {
            Self(format!("{}.{name}", self.0))
        }
    }

    fn index(&self, index: usize) -> Self {
        Self(format!("{}[{index}]", self.0))
    }

    fn problem(&self, message: String) -> FieldProblem {
        FieldProblem {
            field: self.to_string(),
            message,
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "<root>" } else { &self.0 })
    }
}

/// How deep `value` nests, counted without recursion so that any input is safe to measure.
fn nesting_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 1usize)];
    while let Some((value, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        if depth > MAX_NESTING {
            break;
        }
        match value {
            Value::Array(items) => pending.extend(items.iter().map(|item| (item, depth + 1))),
            Value::Object(fields) => pending.extend(fields.values().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    deepest
}

/// Whether a boolean keyword is present and `true` (anything else counts as false here; the
/// validator reports malformed keywords).
fn flag(schema: &SchemaNode, keyword: &str) -> bool {
    schema.get(keyword) == Some(&Value::Bool(true))
}

/// What a schema node says about one field of an object.
enum FieldSchema<'s> {
    /// Declared in `properties`, or an `additionalProperties` value: it follows that schema
    /// (`None` when that schema is malformed; the validator reports it).
    Follows(Option<&'s SchemaNode>),
    /// Undeclared under `additionalProperties: true` or preserve-unknown-fields: kept as it is.
    Kept,
    /// Undeclared otherwise: pruned.
    Pruned,
}

/// Lenient reading of a node for pruning and defaulting: malformed parts count as absent.
fn field_schema<'s>(schema: &'s SchemaNode, name: &str) -> FieldSchema<'s> {
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(declared) = properties.and_then(|properties| properties.get(name)) {
        return FieldSchema::Follows(declared.as_object());
    }
    match schema.get("additionalProperties") {
        Some(Value::Object(values)) => FieldSchema::Follows(Some(values)),
        Some(Value::Bool(true)) => FieldSchema::Kept,
        _ if flag(schema, "x-kubernetes-preserve-unknown-fields") => FieldSchema::Kept,
        _ => FieldSchema::Pruned,
    }
}

/// Removes undeclared fields, recording their paths, as apiextensions' pruning algorithm does:
/// where there is no (well-formed) schema at all, every field of an object goes.
fn prune(
    value: &mut Value,
    schema: Option<&SchemaNode>,
    path: &FieldPath,
    resource_root: bool,
    pruned: &mut Vec<String>,
) {
    match value {
        Value::Object(fields) => {
            let mut names: Vec<String> = fields.keys().cloned().collect();
            names.sort();
            let resource_root =
                resource_root || schema.is_some_and(|s| flag(s, "x-kubernetes-embedded-resource"));
            for name in names {
                if resource_root && RESOURCE_META_FIELDS.contains(&name.as_str()) {
                    continue;
                }
                let child_path = path.child(&name);
                match (
                    schema.map(|s| field_schema(s, &name)),
                    fields.get_mut(&name),
                ) {
                    (Some(FieldSchema::Follows(child_schema)), Some(child)) => {
                        prune(child, child_schema, &child_path, false, pruned);
                    }
                    (Some(FieldSchema::Kept), _) => {}
                    _ => {
                        fields.remove(&name);
                        pruned.push(child_path.0);
                    }
                }
            }
        }
        Value::Array(items) => {
            let item_schema = schema
                .and_then(|s| s.get("items"))
                .and_then(Value::as_object);
            if item_schema.is_none()
                && schema.is_some_and(|s| flag(s, "x-kubernetes-preserve-unknown-fields"))
            {
                return;
            }
            for (index, item) in items.iter_mut().enumerate() {
                prune(item, item_schema, &path.index(index), false, pruned);
            }
        }
        _ => {}
    }
}

/// Fills absent (or null, non-nullable) properties from their `default`, deep, as
/// apiextensions' defaulting algorithm does; each default is pruned against its own schema first.
fn apply_defaults(value: &mut Value, schema: Option<&SchemaNode>) {
    let Some(schema) = schema else { return };
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            for (name, property) in properties.into_iter().flatten() {
                let Some(property) = property.as_object() else {
                    continue;
                };
                let Some(default) = property.get("default").filter(|d| !d.is_null()) else {
                    continue;
                };
                if fields
                    .get(name)
                    .is_none_or(|v| v.is_null() && !flag(property, "nullable"))
                {
                    let mut default = default.clone();
                    prune(
                        &mut default,
                        Some(property),
                        &FieldPath::default(),
                        false,
                        &mut Vec::new(),
                    );
                    fields.insert(name.clone(), default);
                }
            }
            for (name, child) in fields.iter_mut() {
                if let FieldSchema::Follows(child_schema) = field_schema(schema, name) {
                    apply_defaults(child, child_schema);
                }
            }
        }
        Value::Array(items) => {
            let item_schema = schema.get("items").and_then(Value::as_object);
            for item in items {
                apply_defaults(item, item_schema);
            }
        }
        _ => {}
    }
}

/// The JSON types a schema's `type` may name.
const TYPES: [&str; 6] = ["object", "array", "string", "integer", "number", "boolean"];

fn is_name_list(value: &Value) -> bool {
    value
        .as_array()
        .is_some_and(|items| items.iter().all(Value::is_string))
}

/// Checks that a schema node is an object whose keywords read here all have the right shape;
/// a node breaking one is reported, not evaluated.
fn well_formed(schema: &Value) -> Result<&SchemaNode, String> {
    let node = schema
        .as_object()
        .ok_or_else(|| format!("a schema must be an object, got {schema}"))?;
    for (keyword, value) in node {
        let (fits, expected) = match keyword.as_str() {
            "nullable"
            | "exclusiveMinimum"
            | "exclusiveMaximum"
            | "x-kubernetes-int-or-string"
            | "x-kubernetes-preserve-unknown-fields"
            | "x-kubernetes-embedded-resource" => (value.is_boolean(), "a boolean"),
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties" => (value.is_u64(), "a non-negative integer"),
            "minimum" | "maximum" => (value.is_number(), "a number"),
            "properties" | "items" => (value.is_object(), "an object"),
            "additionalProperties" => (
                value.is_object() || value.is_boolean(),
                "a boolean or an object",
            ),
            "enum" => (value.is_array(), "a list"),
            "required" | "x-kubernetes-list-map-keys" => (is_name_list(value), "a list of strings"),
            "type" => (
                value.as_str().is_some_and(|t| TYPES.contains(&t)),
                "a known type",
            ),
            "x-kubernetes-list-type" => (
                matches!(value.as_str(), Some("atomic" | "set" | "map")),
                "atomic, set or map",
            ),
            _ => (true, ""),
        };
        if !fits {
            return Err(format!("\"{keyword}\" must be {expected}, got {value}"));
        }
    }
    let is_map = node.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map");
    if is_map && names(node, "x-kubernetes-list-map-keys").next().is_none() {
        return Err("a list of type map needs \"x-kubernetes-list-map-keys\"".to_owned());
    }
    Ok(node)
}

/// The JSON type of a value, as kube-openapi names it.
fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Whether a value of JSON type `actual` satisfies the `expected` type of a schema node.
fn type_accepts(expected: &str, actual: &str) -> bool {
    match expected {
        "integer,string" => matches!(actual, "integer" | "string"),
        "number" => matches!(actual, "integer" | "number"),
        _ => expected == actual,
    }
}

/// A count keyword (`minLength`...) of a well-formed node.
fn count(schema: &SchemaNode, keyword: &str) -> Option<u64> {
    schema.get(keyword).and_then(Value::as_u64)
}

/// The strings of a list-of-names keyword (`required`, `x-kubernetes-list-map-keys`).
fn names<'s>(schema: &'s SchemaNode, keyword: &str) -> impl Iterator<Item = &'s str> {
    schema
        .get(keyword)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// The problems found so far, in the order of the walk (which is path order).
#[derive(Debug, Default)]
struct Validation {
    problems: Vec<FieldProblem>,
}

impl Validation {
    fn report(&mut self, path: &FieldPath, message: String) {
        self.problems.push(path.problem(message));
    }

    /// Validates one value against one schema node and, through it, everything below.
    fn value(&mut self, value: &Value, schema: &Value, path: &FieldPath, resource_root: bool) {
        let schema = match well_formed(schema) {
            Ok(schema) => schema,
            Err(why) => return self.report(path, format!("Internal error: invalid schema: {why}")),
        };
        if value.is_null() && flag(schema, "nullable") {
            return;
        }
        let expected = if flag(schema, "x-kubernetes-int-or-string") {
            Some("integer,string")
        } else {
            schema.get("type").and_then(Value::as_str)
        };
        let actual = type_of(value);
        match expected {
            Some(expected) if !type_accepts(expected, actual) => {
                let detail = format!("{path} in body must be of type {expected}: \"{actual}\"");
                return self.report(path, format!("Invalid value: \"{actual}\": {detail}"));
            }
            None if value.is_null() => return,
            _ => {}
        }
        let allowed = schema.get("enum").and_then(Value::as_array);
        if let Some(allowed) = allowed.filter(|allowed| !allowed.contains(value)) {
            let quote = |v: &Value| {
                Value::String(v.as_str().map_or_else(|| v.to_string(), str::to_owned)).to_string()
            };
            let supported = allowed.iter().map(quote).collect::<Vec<_>>().join(", ");
            self.report(
                path,
                format!("Unsupported value: {value}: supported values: {supported}"),
            );
        }
        match value {
            Value::Number(_) => self.number(value, schema, path),
            Value::String(text) => {
                let length = text.chars().count() as u64;
                if let Some(min) = count(schema, "minLength").filter(|min| length < *min) {
                    let detail = format!("{path} in body should be at least {min} chars long");
                    self.report(path, format!("Invalid value: {value}: {detail}"));
                }
                if let Some(max) = count(schema, "maxLength").filter(|max| length > *max) {
                    self.report(path, format!("Too long: may not be longer than {max}"));
                }
            }
            Value::Array(items) => self.list(items, schema, path),
            Value::Object(fields) => self.fields(fields, schema, path, resource_root),
            Value::Bool(_) | Value::Null => {}
        }
    }

    /// `minimum`/`maximum`, each with its boolean `exclusive...` companion.
    fn number(&mut self, value: &Value, schema: &SchemaNode, path: &FieldPath) {
        let Some(actual) = value.as_f64() else { return };
        let minimum = (
            "minimum",
            "exclusiveMinimum",
            "greater than",
            Ordering::Less,
        );
        let maximum = (
            "maximum",
            "exclusiveMaximum",
            "less than",
            Ordering::Greater,
        );
        for (keyword, exclusive_keyword, relation, beyond) in [minimum, maximum] {
            let Some(limit) = schema.get(keyword).and_then(Value::as_f64) else {
                continue;
            };
            let exclusive = flag(schema, exclusive_keyword);
            let order = actual.partial_cmp(&limit);
            if order == Some(beyond) || (exclusive && order == Some(Ordering::Equal)) {
                let relation = if exclusive {
                    relation.to_owned()
                } else {
                    format!("{relation} or equal to")
                };
                let detail = format!("{path} in body should be {relation} {limit}");
                self.report(path, format!("Invalid value: {value}: {detail}"));
            }
        }
    }

    /// `minItems`/`maxItems` or `minProperties`/`maxProperties`, worded as the server words them.
    fn size(
        &mut self,
        size: usize,
        schema: &SchemaNode,
        [min_keyword, max_keyword, unit]: [&str; 3],
        path: &FieldPath,
    ) {
        let size = size as u64;
        if let Some(min) = count(schema, min_keyword).filter(|min| size < *min) {
            let detail = format!("{path} in body should have at least {min} {unit}");
            self.report(path, format!("Invalid value: {size}: {detail}"));
        }
        if let Some(max) = count(schema, max_keyword).filter(|max| size > *max) {
            self.report(
                path,
                format!("Too many: {size}: must have at most {max} items"),
            );
        }
    }

    /// `minItems`/`maxItems`, `x-kubernetes-list-type` uniqueness, then each item against `items`.
    fn list(&mut self, items: &[Value], schema: &SchemaNode, path: &FieldPath) {
        self.size(items.len(), schema, ["minItems", "maxItems", "items"], path);
        let list_type = schema.get("x-kubernetes-list-type").and_then(Value::as_str);
        // What makes an item unique: the whole item in a set, its key fields in a map.
        let identity = |item: &Value| match (list_type, item) {
            (Some("set"), _) => Some(item.clone()),
            (Some("map"), Value::Object(fields)) => {
                let keys = names(schema, "x-kubernetes-list-map-keys");
                Some(Value::Object(
                    keys.map(|k| (k.to_owned(), fields.get(k).cloned().unwrap_or_default()))
                        .collect(),
                ))
            }
            _ => None,
        };
        let mut seen: Vec<Value> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let item_path = path.index(index);
            if let Some(identity) = identity(item) {
                if seen.contains(&identity) {
                    self.report(&item_path, format!("Duplicate value: {identity}"));
                }
                seen.push(identity);
            }
            if let Some(item_schema) = schema.get("items") {
                self.value(item, item_schema, &item_path, false);
            }
        }
    }

    /// `minProperties`/`maxProperties`, `required`, then each field against its property schema
    /// or `additionalProperties`, in field-name order.
    fn fields(
        &mut self,
        fields: &SchemaNode,
        schema: &SchemaNode,
        path: &FieldPath,
        resource_root: bool,
    ) {
        self.size(
            fields.len(),
            schema,
            ["minProperties", "maxProperties", "properties"],
            path,
        );
        let resource_root = resource_root || flag(schema, "x-kubernetes-embedded-resource");
        let properties = schema.get("properties").and_then(Value::as_object);
        let undeclared = schema.get("additionalProperties").filter(|s| s.is_object());
        let mut names: Vec<&str> = fields
            .keys()
            .map(String::as_str)
            .chain(names(schema, "required"))
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let child_path = path.child(name);
            let Some(child) = fields.get(name) else {
                self.report(&child_path, "Required value".to_owned());
                continue;
            };
            if resource_root && name == "metadata" {
                continue;
            }
            if let Some(child_schema) = properties.and_then(|p| p.get(name)).or(undeclared) {
                self.value(child, child_schema, &child_path, false);
            }
        }
    }
}

#[cfg(test)]
#[path = "schema_tests.rs"]
mod tests;
