//! The resource types the server knows: the built-in subset ipkeep uses, plus every served
//! version of every CustomResourceDefinition created through the API.
//!
//! A CRD registers its resource the way kube-apiserver does — served versions, scope, the
//! `status` and `scale` subresources, short names, categories and printer columns — and its
//! removal unregisters it. Storage is per group and plural, shared by all versions.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::patch::{BuiltinLists, ListSchema, SchemaLists};

/// Which storage an object lives in: versions of one resource share it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StorageKey {
    /// API group (`""` for core).
    pub group: String,
    /// Plural resource name.
    pub plural: String,
}

/// One additional printer column (CRD `additionalPrinterColumns` or a built-in table column).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Header.
    pub name: String,
    /// OpenAPI type: string, integer, number, boolean, date.
    pub column_type: String,
    /// Optional OpenAPI format (e.g. `name`).
    pub format: String,
    /// Simple JSONPath into the object.
    pub json_path: String,
    /// Column description.
    pub description: String,
    /// 0 for the default view, higher for `-o wide`.
    pub priority: i64,
}

/// The `scale` subresource's paths (apps/v1 StatefulSet or a CRD's `subresources.scale`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    /// e.g. `.spec.replicas`.
    pub spec_replicas: String,
    /// e.g. `.status.replicas`.
    pub status_replicas: String,
    /// e.g. `.status.labelSelector`.
    pub label_selector: Option<String>,
}

/// A served group/version/resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group (`""` for core).
    pub group: String,
    /// Version served at this entry.
    pub version: String,
    /// Kind of the objects.
    pub kind: String,
    /// Plural (the URL segment).
    pub plural: String,
    /// Singular name, lower case.
    pub singular: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names for kubectl (`pps`).
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Whether `/status` is served (and status is ignored on the main resource).
    pub status: bool,
    /// Whether `/scale` is served.
    pub scale: Option<ScalePaths>,
    /// Whether `/binding` is served (pods).
    pub binding: bool,
    /// Printer columns after NAME (CRDs: their `additionalPrinterColumns`, else AGE).
    pub columns: Vec<PrinterColumn>,
    /// Field selectors accepted on list/watch besides name and namespace.
    pub field_selectors: Vec<String>,
    /// The CRD version's `openAPIV3Schema`, for list semantics, defaults and validation.
    pub schema: Option<Value>,
    /// Whether this is the storage version (CRDs) or the preferred version of the group.
    pub storage_version: bool,
    /// Name of the CRD that registered it, if any.
    pub crd: Option<String>,
}

impl ResourceType {
    /// Where objects of this resource are stored.
    pub fn storage(&self) -> StorageKey {
        StorageKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// `apiVersion` of objects served here.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether the resource has a `status` subresource, so the main resource ignores status.
    pub fn has_status(&self) -> bool {
        self.status
    }

    /// Field paths accepted in `fieldSelector`.
    pub fn selectable_fields(&self) -> Vec<&str> {
        let mut fields = vec!["metadata.name"];
        if self.namespaced {
            fields.push("metadata.namespace");
        }
        fields.extend(self.field_selectors.iter().map(String::as_str));
        fields
    }

    /// List merge semantics for patches and apply.
    pub fn lists(&self) -> Box<dyn ListSchema + Send + Sync> {
        match &self.schema {
            Some(schema) => Box::new(SchemaLists(schema.clone())),
            None => Box::new(BuiltinLists),
        }
    }

    /// Whether the resource supports the strategic merge patch (built-ins only, as in a cluster).
    pub fn strategic_merge(&self) -> bool {
        self.crd.is_none()
    }
}

fn column(name: &str, column_type: &str, json_path: &str, priority: i64) -> PrinterColumn {
    PrinterColumn {
        name: name.to_owned(),
        column_type: column_type.to_owned(),
        format: String::new(),
        json_path: json_path.to_owned(),
        description: String::new(),
        priority,
    }
}

fn age() -> PrinterColumn {
    column("Age", "date", ".metadata.creationTimestamp", 0)
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status: bool,
    fields: &'static [&'static str],
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        namespaced: true,
        short_names: &["po"],
        status: true,
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        namespaced: false,
        short_names: &["no"],
        status: true,
        fields: &["spec.unschedulable"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        namespaced: false,
        short_names: &["ns"],
        status: true,
        fields: &["status.phase"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        namespaced: true,
        short_names: &["ev"],
        status: false,
        fields: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        namespaced: true,
        short_names: &["sts"],
        status: true,
        fields: &[],
    },
    Builtin {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        namespaced: true,
        short_names: &[],
        status: false,
        fields: &[],
    },
    Builtin {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        namespaced: true,
        short_names: &["ev"],
        status: false,
        fields: &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
    },
    Builtin {
        group: "apiextensions.k8s.io",
        version: "v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        namespaced: false,
        short_names: &["crd", "crds"],
        status: true,
        fields: &[],
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        version: "v1",
        kind: "MutatingWebhookConfiguration",
        plural: "mutatingwebhookconfigurations",
        namespaced: false,
        short_names: &[],
        status: false,
        fields: &[],
    },
];

fn builtin_columns(kind: &str) -> Vec<PrinterColumn> {
    match kind {
        "Pod" => vec![
            column("Ready", "string", "", 0),
            column("Status", "string", ".status.phase", 0),
            column("Restarts", "string", "", 0),
            age(),
            column("IP", "string", ".status.podIP", 1),
            column("Node", "string", ".spec.nodeName", 1),
        ],
        "Node" => vec![
            column("Status", "string", "", 0),
            column("Roles", "string", "", 0),
            age(),
            column("Version", "string", ".status.nodeInfo.kubeletVersion", 0),
        ],
        "StatefulSet" => vec![column("Ready", "string", "", 0), age()],
        "Namespace" => vec![column("Status", "string", ".status.phase", 0), age()],
        "Lease" => vec![column("Holder", "string", ".spec.holderIdentity", 0), age()],
        _ => vec![age()],
    }
}

/// All served resources, keyed by (group, version, plural).
#[derive(Debug, Clone)]
pub struct Registry {
    resources: BTreeMap<(String, String, String), ResourceType>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// The built-in resources.
    pub fn new() -> Self {
        let mut resources = BTreeMap::new();
        for b in BUILTINS {
            let resource = ResourceType {
                group: b.group.to_owned(),
                version: b.version.to_owned(),
                kind: b.kind.to_owned(),
                plural: b.plural.to_owned(),
                singular: b.kind.to_lowercase(),
                namespaced: b.namespaced,
                short_names: b.short_names.iter().map(|s| (*s).to_owned()).collect(),
                categories: if matches!(b.kind, "Pod" | "StatefulSet") {
                    vec!["all".to_owned()]
                } else {
                    Vec::new()
                },
                status: b.status,
                scale: (b.kind == "StatefulSet").then(|| ScalePaths {
                    spec_replicas: ".spec.replicas".into(),
                    status_replicas: ".status.replicas".into(),
                    label_selector: None,
                }),
                binding: b.kind == "Pod",
                columns: builtin_columns(b.kind),
                field_selectors: b.fields.iter().map(|s| (*s).to_owned()).collect(),
                schema: None,
                storage_version: true,
                crd: None,
            };
            resources.insert(
                (
                    resource.group.clone(),
                    resource.version.clone(),
                    resource.plural.clone(),
                ),
                resource,
            );
        }
        Self { resources }
    }

    /// The resource served at group/version/plural.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.resources
            .get(&(group.to_owned(), version.to_owned(), plural.to_owned()))
    }

    /// Every served resource.
    pub fn all(&self) -> impl Iterator<Item = &ResourceType> {
        self.resources.values()
    }

    /// Served group versions in discovery order: core first, then groups by name; within a
    /// group the preferred (storage) version first.
    pub fn group_versions(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: BTreeMap<String, Vec<(bool, String)>> = BTreeMap::new();
        for r in self.resources.values() {
            let versions = groups.entry(r.group.clone()).or_default();
            if !versions.iter().any(|(_, v)| *v == r.version) {
                versions.push((r.storage_version, r.version.clone()));
            }
        }
        groups
            .into_iter()
            .map(|(group, mut versions)| {
                versions.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| kube_version_cmp(&b.1, &a.1)));
                (group, versions.into_iter().map(|(_, v)| v).collect())
            })
            .collect()
    }

    /// The storage version's apiVersion of a storage key (objects are kept in this version).
    pub fn storage_resource(&self, key: &StorageKey) -> Option<&ResourceType> {
        let mut candidates = self
            .resources
            .values()
            .filter(|r| r.group == key.group && r.plural == key.plural);
        let first = candidates.next()?;
        Some(
            std::iter::once(first)
                .chain(candidates)
                .find(|r| r.storage_version)
                .unwrap_or(first),
        )
    }

    /// Registers the served versions of a CRD (replacing what it registered before).
    pub fn register_crd(&mut self, crd: &Value) -> Result<(), String> {
        let name = crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let resources = crd_resources(crd)?;
        self.unregister_crd(&name);
        for r in resources {
            self.resources
                .insert((r.group.clone(), r.version.clone(), r.plural.clone()), r);
        }
        Ok(())
    }

    /// Removes everything a CRD registered.
    pub fn unregister_crd(&mut self, name: &str) {
        self.resources.retain(|_, r| r.crd.as_deref() != Some(name));
    }
}

/// Orders Kubernetes versions the way discovery does: GA > beta > alpha, then by number.
fn kube_version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn rank(v: &str) -> (u8, u64, u64) {
        let rest = v.strip_prefix('v').unwrap_or(v);
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major = digits.parse().unwrap_or(0);
        let tail = &rest[digits.len()..];
        let (stage, n) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            (2, "0")
        };
        (stage, major, n.parse().unwrap_or(0))
    }
    rank(a).cmp(&rank(b))
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Validates a CRD's spec the way the real server does for the parts we rely on and returns
/// the resource types it serves.
pub fn crd_resources(crd: &Value) -> Result<Vec<ResourceType>, String> {
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let spec = crd.get("spec").ok_or("spec: Required value")?;
    let group = spec
        .get("group")
        .and_then(Value::as_str)
        .ok_or("spec.group: Required value")?;
    let names = spec.get("names").ok_or("spec.names: Required value")?;
    let plural = names
        .get("plural")
        .and_then(Value::as_str)
        .ok_or("spec.names.plural: Required value")?;
    let kind = names
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("spec.names.kind: Required value")?;
    if name != format!("{plural}.{group}") {
        return Err(format!(
            "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
        ));
    }
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        _ => return Err("spec.scope: Unsupported value: must be Namespaced or Cluster".into()),
    };
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or("spec.versions: Required value")?;
    let storage_count = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if storage_count != 1 {
        return Err(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
                .into(),
        );
    }
    let mut resources = Vec::new();
    for version in versions {
        let version_name = version
            .get("name")
            .and_then(Value::as_str)
            .ok_or("spec.versions[].name: Required value")?;
        if version.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let subresources = version.get("subresources");
        let scale = subresources
            .and_then(|s| s.get("scale"))
            .map(|s| ScalePaths {
                spec_replicas: s
                    .get("specReplicasPath")
                    .and_then(Value::as_str)
                    .unwrap_or(".spec.replicas")
                    .to_owned(),
                status_replicas: s
                    .get("statusReplicasPath")
                    .and_then(Value::as_str)
                    .unwrap_or(".status.replicas")
                    .to_owned(),
                label_selector: s
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            });
        let mut columns: Vec<PrinterColumn> = version
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: c["name"].as_str().unwrap_or_default().to_owned(),
                        column_type: c["type"].as_str().unwrap_or("string").to_owned(),
                        format: c["format"].as_str().unwrap_or_default().to_owned(),
                        json_path: c["jsonPath"].as_str().unwrap_or_default().to_owned(),
                        description: c["description"].as_str().unwrap_or_default().to_owned(),
                        priority: c["priority"].as_i64().unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if columns.is_empty() {
            columns.push(age());
        }
        resources.push(ResourceType {
            group: group.to_owned(),
            version: version_name.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            singular: names
                .get("singular")
                .and_then(Value::as_str)
                .map_or_else(|| kind.to_lowercase(), str::to_owned),
            namespaced,
            short_names: string_list(names.get("shortNames")),
            categories: string_list(names.get("categories")),
            status: subresources.and_then(|s| s.get("status")).is_some(),
            scale,
            binding: false,
            columns,
            field_selectors: version
                .get("selectableFields")
                .and_then(Value::as_array)
                .map(|fs| {
                    fs.iter()
                        .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                        .map(|p| p.trim_start_matches('.').to_owned())
                        .collect()
                })
                .unwrap_or_default(),
            schema: version.pointer("/schema/openAPIV3Schema").cloned(),
            storage_version: version.get("storage").and_then(Value::as_bool) == Some(true),
            crd: Some(name.to_owned()),
        });
    }
    Ok(resources)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "persistentpodstates.ipkeep.dev"},
            "spec": {
                "group": "ipkeep.dev",
                "names": {"kind": "PersistentPodState", "plural": "persistentpodstates",
                          "singular": "persistentpodstate", "shortNames": ["pps"]},
                "scope": "Namespaced",
                "versions": [
                    {"name": "v1alpha1", "served": true, "storage": true,
                     "subresources": {"status": {}},
                     "additionalPrinterColumns": [{"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.name"}],
                     "schema": {"openAPIV3Schema": {"type": "object"}}},
                    {"name": "v1alpha0", "served": false, "storage": false}
                ]
            }
        })
    }

    #[test]
    fn a_crd_registers_its_served_versions_and_unregisters() {
        let mut registry = Registry::new();
        registry.register_crd(&crd()).unwrap();
        let r = registry
            .get("ipkeep.dev", "v1alpha1", "persistentpodstates")
            .unwrap();
        assert!(r.namespaced && r.status);
        assert_eq!(r.short_names, ["pps"]);
        assert_eq!(r.columns[0].json_path, ".spec.targetRef.name");
        assert!(
            registry
                .get("ipkeep.dev", "v1alpha0", "persistentpodstates")
                .is_none()
        );
        assert!(
            registry
                .group_versions()
                .iter()
                .any(|(g, v)| g == "ipkeep.dev" && v == &["v1alpha1"])
        );
        registry.unregister_crd("persistentpodstates.ipkeep.dev");
        assert!(
            registry
                .get("ipkeep.dev", "v1alpha1", "persistentpodstates")
                .is_none()
        );
    }

    #[test]
    fn bad_crds_are_refused_with_the_field() {
        let mut bad = crd();
        bad["metadata"]["name"] = json!("pps.ipkeep.dev");
        assert!(
            crd_resources(&bad)
                .unwrap_err()
                .starts_with("metadata.name")
        );
        let mut bad = crd();
        bad["spec"]["versions"][0]["storage"] = json!(false);
        assert!(crd_resources(&bad).unwrap_err().contains("storage version"));
    }

    #[test]
    fn versions_sort_like_discovery() {
        let mut v = vec!["v1alpha1", "v2", "v1beta2", "v1", "v1beta1"];
        v.sort_by(|a, b| kube_version_cmp(b, a));
        assert_eq!(v, ["v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }
}
