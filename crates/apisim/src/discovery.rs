//! Discovery and OpenAPI: `/version`, `/api`, `/apis`, the per-group-version resource lists,
//! and the OpenAPI v3 documents kubectl needs to trust server-side field validation.
//!
//! Discovery is answered in the legacy (`APIVersions`, `APIGroupList`, `APIResourceList`)
//! form, which every client accepts. Each OpenAPI v3 group-version document declares, on every
//! write operation, the `fieldValidation` query parameter and `x-kubernetes-group-version-kind`
//! (what client-go's `QueryParamVerifierV3` looks for); CRD documents also carry the CRD's
//! schema so `kubectl explain` works.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Value, json};

use crate::registry::{Registry, ResourceType};

/// The Kubernetes version the server claims (matches the k8s-openapi feature we build with).
pub const KUBE_MINOR: &str = "33";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "gitVersion": format!("v1.{KUBE_MINOR}.0-apisim"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let entries: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": entries,
        "preferredVersion": entries.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/apis`.
pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .group_versions()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`, if served.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = registry
        .group_versions()
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())?;
    let mut entry = group_entry(&g, &vs);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/api/v1` or `/apis/<group>/<version>`, if served.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources: Vec<&ResourceType> = registry
        .all()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let mut entries = Vec::new();
    for r in resources {
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        entries.push(entry);
        if r.status {
            entries.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if r.scale.is_some() {
            entries.push(json!({"name": format!("{}/scale", r.plural), "singularName": "",
                "namespaced": r.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale",
                "verbs": ["get", "patch", "update"]}));
        }
        if r.binding {
            entries.push(
                json!({"name": format!("{}/binding", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": "Binding", "verbs": ["create"]}),
            );
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}),
    )
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per served group-version, with a hash that changes with content.
pub fn openapi_index(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in registry.group_versions() {
        for version in versions {
            let path = gv_path(&group, &version);
            let document = openapi_document(registry, &group, &version).unwrap_or(Value::Null);
            let mut hasher = DefaultHasher::new();
            document.to_string().hash(&mut hasher);
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={:016X}", hasher.finish())}),
            );
        }
    }
    json!({ "paths": paths })
}

fn parameter(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_operation(r: &ResourceType, action: &str, id: &str) -> Value {
    let mut params = vec![
        parameter(
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
        ),
        parameter(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        parameter(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn (default), Strict.",
        ),
    ];
    if action == "patch" {
        params.push(json!({"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}));
    }
    let mut op = json!({
        "operationId": format!("{action}{id}"),
        "parameters": params,
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
    });
    if r.crd.is_some() {
        let reference = json!({"$ref": format!("#/components/schemas/{}", schema_name(r))});
        op["responses"] = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
    }
    op
}

fn schema_name(r: &ResourceType) -> String {
    let reversed: Vec<&str> = r.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), r.version, r.kind)
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
pub fn openapi_document(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources: Vec<&ResourceType> = registry
        .all()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    let prefix = format!("/{}", gv_path(group, version));
    for r in resources {
        let scope = if r.namespaced {
            "/namespaces/{namespace}"
        } else {
            ""
        };
        let collection = format!("{prefix}{scope}/{}", r.plural);
        let id = format!("{}{}", r.kind, if r.namespaced { "Namespaced" } else { "" });
        paths.insert(
            collection.clone(),
            json!({"post": write_operation(r, "post", &id)}),
        );
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"put": write_operation(r, "put", &id), "patch": write_operation(r, "patch", &id)}),
        );
        if r.status {
            let sid = format!("{id}Status");
            paths.insert(
                format!("{collection}/{{name}}/status"),
                json!({"put": write_operation(r, "put", &sid), "patch": write_operation(r, "patch", &sid)}),
            );
        }
        if let Some(schema) = &r.schema {
            let mut schema = schema.clone();
            schema["x-kubernetes-group-version-kind"] =
                json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
            schemas.insert(schema_name(r), schema);
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{KUBE_MINOR}.0")},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_subresources_and_groups() {
        let registry = Registry::new();
        let core = resource_list(&registry, "", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for expected in [
            "pods",
            "pods/status",
            "pods/binding",
            "nodes",
            "namespaces",
            "events",
        ] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
        let apps = resource_list(&registry, "apps", "v1").unwrap();
        assert!(
            apps["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "statefulsets/scale" && r["kind"] == "Scale")
        );
        let groups = group_list(&registry);
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "coordination.k8s.io")
        );
        assert!(resource_list(&registry, "nope", "v1").is_none());
    }

    #[test]
    fn openapi_declares_field_validation_on_patch_with_the_gvk() {
        let registry = Registry::new();
        let index = openapi_index(&registry);
        assert!(
            index["paths"]["api/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/api/v1?hash=")
        );
        let doc = openapi_document(&registry, "", "v1").unwrap();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Pod");
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        assert!(doc["paths"]["/api/v1/nodes/{name}"]["patch"].is_object());
    }
}
