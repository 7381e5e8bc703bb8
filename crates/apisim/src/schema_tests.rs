use serde_json::{Value, json};

use super::{FieldProblem, MAX_NESTING, SchemaOutcome, admit_custom_resource};

/// The `openAPIV3Schema` of ipkeep's PersistentPodState, trimmed to what the tests exercise.
fn persistent_pod_state_schema() -> Value {
    let topology_keys =
        json!({"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}});
    json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["targetRef"],
                "properties": {
                    "targetRef": {
                        "type": "object",
                        "required": ["apiVersion", "kind", "name"],
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "name": {"type": "string", "minLength": 1, "maxLength": 63},
                        },
                    },
                    "requiredPersistentTopology": {
                        "type": "object",
                        "required": ["nodeTopologyKeys"],
                        "properties": {"nodeTopologyKeys": topology_keys},
                    },
                    "preferredPersistentTopology": {
                        "type": "array",
                        "maxItems": 3,
                        "items": {
                            "type": "object",
                            "required": ["weight", "preference"],
                            "properties": {
                                "weight": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 100},
                                "preference": {
                                    "type": "object",
                                    "required": ["nodeTopologyKeys"],
                                    "properties": {"nodeTopologyKeys": topology_keys},
                                },
                            },
                        },
                    },
                    "persistentPodStateRetentionPolicy": {
                        "type": "string",
                        "enum": ["WhenScaled", "WhenDeleted"],
                        "default": "WhenScaled",
                    },
                },
            },
            "status": {
                "type": "object",
                "properties": {
                    "observedGeneration": {"type": "integer", "format": "int64"},
                    "podStates": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {
                                "nodeName": {"type": "string"},
                                "nodeTopologyLabels": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                },
                                "podIPs": {
                                    "type": "array",
                                    "x-kubernetes-list-type": "set",
                                    "items": {"type": "string"},
                                },
                            },
                        },
                    },
                    "conditions": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["type"],
                        "items": {
                            "type": "object",
                            "required": ["type", "status"],
                            "properties": {
                                "type": {"type": "string"},
                                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                                "lastTransitionTime": {"type": "string", "format": "date-time"},
                                "message": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    })
}

/// A valid PersistentPodState with every defaulted field already set.
fn valid_object() -> Value {
    json!({
        "apiVersion": "apps.ipkeep.io/v1alpha1",
        "kind": "PersistentPodState",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web"},
            "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
            "preferredPersistentTopology": [
                {"weight": 100, "preference": {"nodeTopologyKeys": ["topology.kubernetes.io/zone"]}},
                {"weight": 1, "preference": {"nodeTopologyKeys": ["topology.kubernetes.io/region"]}},
            ],
            "persistentPodStateRetentionPolicy": "WhenDeleted",
        },
        "status": {
            "observedGeneration": 3,
            "podStates": {
                "web-0": {
                    "nodeName": "node-a",
                    "nodeTopologyLabels": {"kubernetes.io/hostname": "node-a"},
                    "podIPs": ["10.0.0.5", "fd00::5"],
                },
            },
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"},
                {"type": "Synced", "status": "False", "message": "waiting"},
            ],
        },
    })
}

/// Edits of a test object: each JSON pointer set to a value, or removed when it is `None`.
type Edits = Vec<(&'static str, Option<Value>)>;

/// Problems as (field, message) pairs, for comparing with expectations.
type Problems = Vec<(String, String)>;

/// `base` with `edits` applied in order.
fn edited(mut base: Value, edits: &[(&str, Option<Value>)]) -> Value {
    for (pointer, replacement) in edits {
        let Some((parent, name)) = pointer.rsplit_once('/') else {
            panic!("bad pointer {pointer}")
        };
        let index = name.parse::<usize>().ok();
        match (base.pointer_mut(parent), replacement, index) {
            (Some(Value::Object(fields)), Some(value), _) => {
                drop(fields.insert(name.to_owned(), value.clone()))
            }
            (Some(Value::Object(fields)), None, _) => drop(fields.remove(name)),
            (Some(Value::Array(items)), Some(value), Some(index)) => items[index] = value.clone(),
            (Some(Value::Array(items)), None, Some(index)) => drop(items.remove(index)),
            _ => panic!("cannot edit {pointer}"),
        }
    }
    base
}

fn problems(found: Vec<FieldProblem>) -> Problems {
    found.into_iter().map(|p| (p.field, p.message)).collect()
}

fn expected_problems(expected: &[(&str, &str)]) -> Problems {
    expected
        .iter()
        .map(|(f, m)| ((*f).to_owned(), (*m).to_owned()))
        .collect()
}

#[test]
fn valid_objects_pass_unchanged_except_for_defaults() {
    let schema = persistent_pod_state_schema();
    let cases = [
        ("complete object", valid_object(), valid_object()),
        (
            "retention policy defaulted when absent",
            edited(
                valid_object(),
                &[("/spec/persistentPodStateRetentionPolicy", None)],
            ),
            edited(
                valid_object(),
                &[(
                    "/spec/persistentPodStateRetentionPolicy",
                    Some(json!("WhenScaled")),
                )],
            ),
        ),
        (
            "retention policy defaulted when null (the field is not nullable)",
            edited(
                valid_object(),
                &[("/spec/persistentPodStateRetentionPolicy", Some(Value::Null))],
            ),
            edited(
                valid_object(),
                &[(
                    "/spec/persistentPodStateRetentionPolicy",
                    Some(json!("WhenScaled")),
                )],
            ),
        ),
        (
            "minimal object: only the required fields, no status",
            json!({"apiVersion": "a/v1", "kind": "PersistentPodState", "metadata": {"name": "x"},
                   "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "x"}}}),
            json!({"apiVersion": "a/v1", "kind": "PersistentPodState", "metadata": {"name": "x"},
                   "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "x"},
                            "persistentPodStateRetentionPolicy": "WhenScaled"}}),
        ),
        (
            "metadata is neither pruned nor validated",
            edited(
                valid_object(),
                &[(
                    "/metadata",
                    Some(json!({"name": 5, "anything": {"goes": []}})),
                )],
            ),
            edited(
                valid_object(),
                &[(
                    "/metadata",
                    Some(json!({"name": 5, "anything": {"goes": []}})),
                )],
            ),
        ),
    ];
    for (name, mut object, expected) in cases {
        let outcome = admit_custom_resource(&schema, &mut object);
        assert_eq!(outcome, Ok(SchemaOutcome::default()), "{name}");
        assert_eq!(object, expected, "{name}");
    }
}

#[test]
fn unknown_fields_are_pruned_and_reported() {
    let schema = persistent_pod_state_schema();
    let cases: [(&str, Edits, &[&str]); 5] = [
        (
            "top-level field",
            vec![("/extra", Some(json!(1)))],
            &["extra"],
        ),
        (
            "spec field",
            vec![("/spec/foo", Some(json!({"bar": 1})))],
            &["spec.foo"],
        ),
        (
            "fields inside list items, in path order",
            vec![
                ("/spec/preferredPersistentTopology/1/zzz", Some(json!(true))),
                (
                    "/spec/preferredPersistentTopology/0/preference/color",
                    Some(json!("red")),
                ),
            ],
            &[
                "spec.preferredPersistentTopology[0].preference.color",
                "spec.preferredPersistentTopology[1].zzz",
            ],
        ),
        (
            "fields inside additionalProperties values",
            vec![("/status/podStates/web-0/legacy", Some(json!("x")))],
            &["status.podStates.web-0.legacy"],
        ),
        (
            "fields of list-map items",
            vec![("/status/conditions/0/reason", Some(json!("Ok")))],
            &["status.conditions[0].reason"],
        ),
    ];
    for (name, edits, pruned) in cases {
        let mut object = edited(valid_object(), &edits);
        let outcome = admit_custom_resource(&schema, &mut object);
        let pruned: Vec<String> = pruned.iter().map(|p| (*p).to_owned()).collect();
        assert_eq!(
            outcome,
            Ok(SchemaOutcome {
                unknown_fields: pruned
            }),
            "{name}"
        );
        assert_eq!(object, valid_object(), "{name}");
    }
}

#[test]
fn each_violated_constraint_gives_the_servers_field_and_message() {
    let schema = persistent_pod_state_schema();
    let topology = "/spec/preferredPersistentTopology";
    type Expected = Vec<(&'static str, &'static str)>;
    let cases: Vec<(&str, Edits, Expected)> = vec![
        (
            "missing required spec",
            vec![("/spec", None)],
            vec![("spec", "Required value")],
        ),
        (
            "missing required fields of targetRef, in path order",
            vec![("/spec/targetRef", Some(json!({"kind": "StatefulSet"})))],
            vec![
                ("spec.targetRef.apiVersion", "Required value"),
                ("spec.targetRef.name", "Required value"),
            ],
        ),
        (
            "weight below minimum",
            vec![("/spec/preferredPersistentTopology/0/weight", Some(json!(0)))],
            vec![(
                "spec.preferredPersistentTopology[0].weight",
                "Invalid value: 0: spec.preferredPersistentTopology[0].weight in body should be greater than or equal to 1",
            )],
        ),
        (
            "weight above maximum",
            vec![(
                "/spec/preferredPersistentTopology/1/weight",
                Some(json!(101)),
            )],
            vec![(
                "spec.preferredPersistentTopology[1].weight",
                "Invalid value: 101: spec.preferredPersistentTopology[1].weight in body should be less than or equal to 100",
            )],
        ),
        (
            "weight of the wrong type",
            vec![(
                "/spec/preferredPersistentTopology/0/weight",
                Some(json!("high")),
            )],
            vec![(
                "spec.preferredPersistentTopology[0].weight",
                "Invalid value: \"string\": spec.preferredPersistentTopology[0].weight in body must be of type integer: \"string\"",
            )],
        ),
        (
            "integer rejects a fractional number",
            vec![(
                "/spec/preferredPersistentTopology/0/weight",
                Some(json!(1.5)),
            )],
            vec![(
                "spec.preferredPersistentTopology[0].weight",
                "Invalid value: \"number\": spec.preferredPersistentTopology[0].weight in body must be of type integer: \"number\"",
            )],
        ),
        (
            "null where nothing is nullable",
            vec![("/spec/targetRef/name", Some(Value::Null))],
            vec![(
                "spec.targetRef.name",
                "Invalid value: \"null\": spec.targetRef.name in body must be of type string: \"null\"",
            )],
        ),
        (
            "missing weight in a list item",
            vec![("/spec/preferredPersistentTopology/1/weight", None)],
            vec![(
                "spec.preferredPersistentTopology[1].weight",
                "Required value",
            )],
        ),
        (
            "enum",
            vec![(
                "/spec/persistentPodStateRetentionPolicy",
                Some(json!("Sometimes")),
            )],
            vec![(
                "spec.persistentPodStateRetentionPolicy",
                "Unsupported value: \"Sometimes\": supported values: \"WhenScaled\", \"WhenDeleted\"",
            )],
        ),
        (
            "empty string in a nested array",
            vec![(
                "/spec/preferredPersistentTopology/0/preference/nodeTopologyKeys",
                Some(json!(["zone", ""])),
            )],
            vec![(
                "spec.preferredPersistentTopology[0].preference.nodeTopologyKeys[1]",
                "Invalid value: \"\": spec.preferredPersistentTopology[0].preference.nodeTopologyKeys[1] in body should be at least 1 chars long",
            )],
        ),
        (
            "maxLength counts characters",
            vec![("/spec/targetRef/name", Some(json!("é".repeat(64))))],
            vec![("spec.targetRef.name", "Too long: may not be longer than 63")],
        ),
        (
            "minItems",
            vec![(
                "/spec/requiredPersistentTopology/nodeTopologyKeys",
                Some(json!([])),
            )],
            vec![(
                "spec.requiredPersistentTopology.nodeTopologyKeys",
                "Invalid value: 0: spec.requiredPersistentTopology.nodeTopologyKeys in body should have at least 1 items",
            )],
        ),
        (
            "maxItems",
            vec![(
                topology,
                Some(json!([
                    {"weight": 1, "preference": {"nodeTopologyKeys": ["a"]}},
                    {"weight": 2, "preference": {"nodeTopologyKeys": ["b"]}},
                    {"weight": 3, "preference": {"nodeTopologyKeys": ["c"]}},
                    {"weight": 4, "preference": {"nodeTopologyKeys": ["d"]}},
                ])),
            )],
            vec![(
                "spec.preferredPersistentTopology",
                "Too many: 4: must have at most 3 items",
            )],
        ),
        (
            "list of the wrong type",
            vec![(topology, Some(json!({"weight": 1})))],
            vec![(
                "spec.preferredPersistentTopology",
                "Invalid value: \"object\": spec.preferredPersistentTopology in body must be of type array: \"object\"",
            )],
        ),
        (
            "additionalProperties value of the wrong type",
            vec![("/status/podStates/web-1", Some(json!("node-b")))],
            vec![(
                "status.podStates.web-1",
                "Invalid value: \"string\": status.podStates.web-1 in body must be of type object: \"string\"",
            )],
        ),
        (
            "map of strings holding a number",
            vec![(
                "/status/podStates/web-0/nodeTopologyLabels/zone",
                Some(json!(7)),
            )],
            vec![(
                "status.podStates.web-0.nodeTopologyLabels.zone",
                "Invalid value: \"integer\": status.podStates.web-0.nodeTopologyLabels.zone in body must be of type string: \"integer\"",
            )],
        ),
        (
            "duplicate item of a set",
            vec![(
                "/status/podStates/web-0/podIPs",
                Some(json!(["10.0.0.5", "fd00::5", "10.0.0.5"])),
            )],
            vec![(
                "status.podStates.web-0.podIPs[2]",
                "Duplicate value: \"10.0.0.5\"",
            )],
        ),
        (
            "duplicate key of a list-type map",
            vec![("/status/conditions/1/type", Some(json!("Ready")))],
            vec![(
                "status.conditions[1]",
                "Duplicate value: {\"type\":\"Ready\"}",
            )],
        ),
        (
            "several problems, reported in path order",
            vec![
                ("/status/conditions/0/status", None),
                ("/spec/targetRef/name", Some(json!(""))),
                ("/spec/preferredPersistentTopology/0/weight", Some(json!(0))),
            ],
            vec![
                (
                    "spec.preferredPersistentTopology[0].weight",
                    "Invalid value: 0: spec.preferredPersistentTopology[0].weight in body should be greater than or equal to 1",
                ),
                (
                    "spec.targetRef.name",
                    "Invalid value: \"\": spec.targetRef.name in body should be at least 1 chars long",
                ),
                ("status.conditions[0].status", "Required value"),
            ],
        ),
    ];
    for (name, edits, expected) in cases {
        let mut object = edited(valid_object(), &edits);
        let found = admit_custom_resource(&schema, &mut object).map_err(problems);
        assert_eq!(found, Err(expected_problems(&expected)), "{name}");
    }
}

/// Runs one small schema over one value placed at `spec.field`.
fn admit_field(
    field_schema: Value,
    value: Value,
) -> (Result<SchemaOutcome, Vec<(String, String)>>, Value) {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"field": field_schema}}}});
    let mut object =
        json!({"apiVersion": "a/v1", "kind": "K", "metadata": {}, "spec": {"field": value}});
    let outcome = admit_custom_resource(&schema, &mut object).map_err(problems);
    (outcome, object["spec"]["field"].take())
}

#[test]
fn keywords_outside_the_persistent_pod_state_schema() {
    let wrong_type = |expected: &str, actual: &str| {
        format!(
            "Invalid value: \"{actual}\": spec.field in body must be of type {expected}: \"{actual}\""
        )
    };
    type Expected = Result<Value, Vec<(&'static str, String)>>;
    let cases: Vec<(&str, Value, Value, Expected)> = vec![
        (
            "int-or-string takes an integer",
            json!({"x-kubernetes-int-or-string": true}),
            json!(8080),
            Ok(json!(8080)),
        ),
        (
            "int-or-string takes a string",
            json!({"x-kubernetes-int-or-string": true}),
            json!("http"),
            Ok(json!("http")),
        ),
        (
            "int-or-string rejects a boolean",
            json!({"x-kubernetes-int-or-string": true}),
            json!(true),
            Err(vec![(
                "spec.field",
                wrong_type("integer,string", "boolean"),
            )]),
        ),
        (
            "number takes an integer",
            json!({"type": "number"}),
            json!(3),
            Ok(json!(3)),
        ),
        (
            "nullable takes null",
            json!({"type": "string", "nullable": true}),
            Value::Null,
            Ok(Value::Null),
        ),
        (
            "nullable null is not defaulted",
            json!({"type": "string", "nullable": true, "default": "x"}),
            Value::Null,
            Ok(Value::Null),
        ),
        (
            "exclusive minimum",
            json!({"type": "number", "minimum": 0.5, "exclusiveMinimum": true}),
            json!(0.5),
            Err(vec![(
                "spec.field",
                "Invalid value: 0.5: spec.field in body should be greater than 0.5".to_owned(),
            )]),
        ),
        (
            "exclusive maximum",
            json!({"type": "integer", "maximum": 10, "exclusiveMaximum": true}),
            json!(10),
            Err(vec![(
                "spec.field",
                "Invalid value: 10: spec.field in body should be less than 10".to_owned(),
            )]),
        ),
        (
            "minProperties",
            json!({"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}),
            json!({}),
            Err(vec![(
                "spec.field",
                "Invalid value: 0: spec.field in body should have at least 1 properties".to_owned(),
            )]),
        ),
        (
            "maxProperties",
            json!({"type": "object", "maxProperties": 1, "additionalProperties": true}),
            json!({"a": 1, "b": 2}),
            Err(vec![(
                "spec.field",
                "Too many: 2: must have at most 1 items".to_owned(),
            )]),
        ),
        (
            "enum of numbers quotes the supported values",
            json!({"type": "integer", "enum": [1, 2]}),
            json!(3),
            Err(vec![(
                "spec.field",
                "Unsupported value: 3: supported values: \"1\", \"2\"".to_owned(),
            )]),
        ),
        (
            "pattern, format, allOf and CEL rules are ignored",
            json!({"type": "string", "pattern": "^a$", "format": "date-time", "allOf": [{"maxLength": 1}],
                   "x-kubernetes-validations": [{"rule": "false"}]}),
            json!("bcd"),
            Ok(json!("bcd")),
        ),
        (
            "preserve-unknown-fields keeps extras and still prunes inside declared fields",
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                   "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}}),
            json!({"extra": {"deep": [1, {"x": 2}]}, "known": {"a": "1", "b": "2"}}),
            Ok(json!({"extra": {"deep": [1, {"x": 2}]}, "known": {"a": "1"}})),
        ),
        (
            "additionalProperties true keeps extras",
            json!({"type": "object", "additionalProperties": true}),
            json!({"anything": {"at": "all"}}),
            Ok(json!({"anything": {"at": "all"}})),
        ),
        (
            "a list without an items schema keeps scalars and empties objects",
            json!({"type": "array"}),
            json!([1, {"x": 2}]),
            Ok(json!([1, {}])),
        ),
        (
            "defaults inside list items and additionalProperties values, deep",
            json!({"type": "object", "properties": {
                "list": {"type": "array", "items": {"type": "object", "properties": {
                    "port": {"type": "integer", "default": 80},
                    "tls": {"type": "object", "default": {}, "properties": {"enabled": {"type": "boolean", "default": false}}},
                }}},
                "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"mode": {"type": "string", "default": "auto"}}}},
            }}),
            json!({"list": [{}, {"port": 8080}], "map": {"a": {}, "b": {"mode": "manual"}}}),
            Ok(json!({
                "list": [{"port": 80, "tls": {"enabled": false}}, {"port": 8080, "tls": {"enabled": false}}],
                "map": {"a": {"mode": "auto"}, "b": {"mode": "manual"}},
            })),
        ),
        (
            "a default is pruned before it is applied, and its pruning is not reported",
            json!({"type": "object", "properties": {"inner": {"type": "object", "default": {"keep": 1, "drop": 2},
                   "properties": {"keep": {"type": "integer"}}}}}),
            json!({}),
            Ok(json!({"inner": {"keep": 1}})),
        ),
        (
            "a default is validated like any value",
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "default": 1}}}),
            json!({}),
            Err(vec![(
                "spec.field.n",
                "Invalid value: 1: spec.field.n in body should be greater than or equal to 5"
                    .to_owned(),
            )]),
        ),
        (
            "an embedded resource keeps apiVersion, kind and metadata",
            json!({"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object"}}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}, "junk": 1}),
            Ok(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}})),
        ),
    ];
    for (name, field_schema, value, expected) in cases {
        let (outcome, admitted) = admit_field(field_schema, value);
        match expected {
            Ok(expected) => {
                assert!(outcome.is_ok(), "{name}: {outcome:?}");
                assert_eq!(admitted, expected, "{name}");
            }
            Err(expected) => {
                let expected: Vec<(String, String)> = expected
                    .into_iter()
                    .map(|(f, m)| (f.to_owned(), m))
                    .collect();
                assert_eq!(outcome, Err(expected), "{name}");
            }
        }
    }
}

#[test]
fn malformed_schemas_are_reported_not_panicked_on() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "type is a number",
            json!({"type": 5}),
            "\"type\" must be a known type, got 5",
        ),
        (
            "type is unknown",
            json!({"type": "float"}),
            "\"type\" must be a known type, got \"float\"",
        ),
        (
            "schema is not an object",
            json!(["string"]),
            "a schema must be an object, got [\"string\"]",
        ),
        (
            "properties is a list",
            json!({"type": "object", "properties": []}),
            "\"properties\" must be an object, got []",
        ),
        (
            "items is a tuple",
            json!({"type": "array", "items": [{"type": "string"}]}),
            "\"items\" must be an object, got [{\"type\":\"string\"}]",
        ),
        (
            "minLength is negative",
            json!({"minLength": -1}),
            "\"minLength\" must be a non-negative integer, got -1",
        ),
        (
            "minimum is a string",
            json!({"minimum": "1"}),
            "\"minimum\" must be a number, got \"1\"",
        ),
        (
            "required is not names",
            json!({"required": [1]}),
            "\"required\" must be a list of strings, got [1]",
        ),
        (
            "nullable is a string",
            json!({"nullable": "yes"}),
            "\"nullable\" must be a boolean, got \"yes\"",
        ),
        (
            "enum is a string",
            json!({"enum": "a"}),
            "\"enum\" must be a list, got \"a\"",
        ),
        (
            "list-type map without keys",
            json!({"type": "array", "x-kubernetes-list-type": "map"}),
            "a list of type map needs \"x-kubernetes-list-map-keys\"",
        ),
        (
            "unknown list-type",
            json!({"type": "array", "x-kubernetes-list-type": "bag"}),
            "\"x-kubernetes-list-type\" must be atomic, set or map, got \"bag\"",
        ),
    ];
    for (name, field_schema, why) in cases {
        let (outcome, _) = admit_field(field_schema, json!([{"a": 1}]));
        let message = format!("Internal error: invalid schema: {why}");
        assert_eq!(
            outcome,
            Err(vec![("spec.field".to_owned(), message)]),
            "{name}"
        );
    }
}

#[test]
fn hostile_inputs_never_panic() {
    let schemas = [
        Value::Null,
        json!(5),
        json!({"type": "object", "properties": {"spec": 5}}),
        json!({"properties": {"spec": {"additionalProperties": 3, "items": "x", "default": {"a": 1}}}}),
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": "spec"}}}),
        persistent_pod_state_schema(),
    ];
    let objects = [
        Value::Null,
        json!("text"),
        json!([1, 2]),
        json!({"spec": null}),
        json!({"spec": [[], {}, null]}),
        json!({"spec": {"n": 1e308, "big": u64::MAX, "neg": i64::MIN}}),
        valid_object(),
    ];
    for schema in &schemas {
        for object in &objects {
            let _ = admit_custom_resource(schema, &mut object.clone());
        }
    }
}

#[test]
fn the_root_keeps_its_type_fields_even_under_a_non_object_schema() {
    let mut object =
        json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "n"}, "spec": {}});
    let outcome = admit_custom_resource(&json!(5), &mut object);
    assert_eq!(
        object,
        json!({"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "n"}})
    );
    let expected = vec![(
        "<root>".to_owned(),
        "Internal error: invalid schema: a schema must be an object, got 5".to_owned(),
    )];
    assert_eq!(outcome.map_err(problems), Err(expected));
}

#[test]
fn nesting_is_bounded() {
    let nested = |depth: usize| (1..depth).fold(json!({}), |inner, _| json!({"x": inner}));
    let open_schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let mut deep_enough = json!({"spec": nested(MAX_NESTING - 1)});
    assert!(admit_custom_resource(&open_schema, &mut deep_enough).is_ok());
    let mut too_deep = json!({"spec": nested(2 * MAX_NESTING)});
    let found = admit_custom_resource(&open_schema, &mut too_deep).map_err(problems);
    let message = format!("Internal error: object is nested deeper than {MAX_NESTING} levels");
    assert_eq!(found, Err(vec![("<root>".to_owned(), message)]));
    let deep_schema = (0..2 * MAX_NESTING).fold(
        json!({"type": "string"}),
        |inner, _| json!({"type": "object", "properties": {"x": inner}}),
    );
    assert!(admit_custom_resource(&deep_schema, &mut json!({})).is_err());
    // Just inside the limit (each schema level nests twice: node, properties), everything is
    // walked: pruning, defaulting and validation.
    let walked_schema = (2..MAX_NESTING / 2).fold(
        json!({"type": "string", "default": 7}),
        |inner, _| json!({"type": "object", "default": {}, "properties": {"x": inner}}),
    );
    let mut object = json!({"junk": 1});
    let Err(found) = admit_custom_resource(&walked_schema, &mut object).map_err(problems) else {
        panic!("the innermost default is not a string")
    };
    assert_eq!(found.len(), 1);
    assert!(found[0].0.ends_with(".x.x"), "{found:?}");
    assert!(
        found[0].1.ends_with("must be of type string: \"integer\""),
        "{found:?}"
    );
}

#[test]
fn problems_display_like_kubectl_shows_them() {
    let problem = FieldProblem {
        field: "spec.weight".to_owned(),
        message: "Required value".to_owned(),
    };
    assert_eq!(problem.to_string(), "spec.weight: Required value");
}

#[test]
fn nested_arrays_report_full_paths() {
    let matrix = json!({"type": "array", "items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": 5, "default": 1}}}}});
    let (outcome, admitted) =
        admit_field(matrix.clone(), json!([[{"n": 2, "x": 0}], [{}, {"n": 3}]]));
    let unknown_fields = vec!["spec.field[0][0].x".to_owned()];
    assert_eq!(outcome, Ok(SchemaOutcome { unknown_fields }));
    assert_eq!(admitted, json!([[{"n": 2}], [{"n": 1}, {"n": 3}]]));
    let (outcome, _) = admit_field(matrix, json!([[{"n": 9}], [{}, {}, {}]]));
    let expected = expected_problems(&[
        (
            "spec.field[0][0].n",
            "Invalid value: 9: spec.field[0][0].n in body should be less than or equal to 5",
        ),
        ("spec.field[1]", "Too many: 3: must have at most 2 items"),
    ]);
    assert_eq!(outcome, Err(expected));
}
