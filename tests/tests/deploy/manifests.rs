//! Loading `deploy/`: every YAML document with its file, the typed round trip that catches
//! unknown fields, ipkeep's workloads, and the label-selector and RBAC rules the tests evaluate.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ipkeep_api::PersistentPodState;
use ipkeep_api::k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use ipkeep_api::k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use ipkeep_api::k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodTemplateSpec, Service, ServiceAccount,
};
use ipkeep_api::k8s_openapi::api::networking::v1::NetworkPolicy;
use ipkeep_api::k8s_openapi::api::policy::v1::PodDisruptionBudget;
use ipkeep_api::k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use ipkeep_api::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use ipkeep_api::k8s_openapi::serde::Serialize;
use ipkeep_api::k8s_openapi::serde::de::DeserializeOwned;
use serde_json::Value;

/// Where every ipkeep component runs.
pub const NAMESPACE: &str = "ipkeep-system";
/// The binaries of the one image, as the Dockerfile builds them.
pub const BINARIES: [&str; 4] = [
    "ipkeep",
    "ipkeep-agent",
    "ipkeep-controller",
    "ipkeep-scheduler-ext",
];

/// The one image every workload runs, tagged with the workspace version.
pub fn image() -> String {
    format!("ghcr.io/ipkeep/ipkeep:{}", env!("CARGO_PKG_VERSION"))
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory under test: `deploy/`, or `IPKEEP_DEPLOY_DIR` (to see a check fail on a broken
/// copy).
pub fn deploy_dir() -> PathBuf {
    std::env::var_os("IPKEEP_DEPLOY_DIR").map_or_else(|| repo_root().join("deploy"), PathBuf::from)
}

// ---------------------------------------------------------------------------------------------
// The documents

/// One YAML document of a file under `deploy/`.
#[derive(Debug, Clone)]
pub struct Doc {
    /// The file, relative to `deploy/`.
    pub file: String,
    pub index: usize,
    pub value: Value,
}

impl Doc {
    /// The string at a JSON pointer, or "".
    pub fn str(&self, pointer: &str) -> &str {
        self.value
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `kind`.
    pub fn kind(&self) -> &str {
        self.str("/kind")
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.str("/metadata/name")
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&str> {
        self.value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
    }

    /// Under `examples/`: applied by the user, in a namespace of theirs.
    pub fn is_example(&self) -> bool {
        self.file.starts_with("examples/")
    }

    /// The document as a typed object (panics with the document when it is not one).
    pub fn typed<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.value.clone()).unwrap_or_else(|e| panic!("{self}: {e}"))
    }
}

impl fmt::Display for Doc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "deploy/{}#{} {}/{}",
            self.file,
            self.index,
            self.kind(),
            self.name()
        )
    }
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read deploy/")
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_yaml(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Every YAML file under `deploy/`, relative to it.
pub fn yaml_files() -> Vec<String> {
    let deploy = deploy_dir();
    let mut files = Vec::new();
    collect_yaml(&deploy, &mut files);
    files
        .iter()
        .map(|p| {
            p.strip_prefix(&deploy)
                .expect("under deploy/")
                .display()
                .to_string()
        })
        .collect()
}

/// Every document of every YAML file under `deploy/`, parsed by serde-saphyr, but the
/// patches of kustomize components (parts of objects, not objects; `patch_files`).
pub fn documents() -> &'static [Doc] {
    static DOCS: OnceLock<Vec<Doc>> = OnceLock::new();
    DOCS.get_or_init(|| {
        let all = yaml_files()
            .into_iter()
            .flat_map(|f| parse(&f))
            .collect::<Vec<_>>();
        let patches = patch_files(&all);
        all.into_iter()
            .filter(|d| !patches.contains(&d.file))
            .collect()
    })
}

/// The documents of `deploy/{file}`.
pub fn parse(file: &str) -> Vec<Doc> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).expect("read a manifest");
    let values: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("deploy/{file} is not YAML: {e}"));
    (values.into_iter().filter(|v| !v.is_null()).enumerate())
        .map(|(index, value)| Doc {
            file: file.to_string(),
            index,
            value,
        })
        .collect()
}

/// The files kustomizations name under `patches: [{path: ...}]`, relative to `deploy/`.
fn patch_files(docs: &[Doc]) -> Vec<String> {
    let mut out = Vec::new();
    for doc in docs
        .iter()
        .filter(|d| d.file.ends_with("kustomization.yaml"))
    {
        let dir = Path::new(&doc.file).parent().unwrap_or(Path::new(""));
        for patch in doc.value["patches"].as_array().into_iter().flatten() {
            if let Some(path) = patch["path"].as_str() {
                out.push(dir.join(path).display().to_string());
            }
        }
    }
    out
}

/// The document of that kind and name (panics when there is none).
pub fn find(kind: &str, name: &str) -> &'static Doc {
    documents()
        .iter()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in deploy/"))
}

/// Every document of a kind.
pub fn of_kind(kind: &str) -> impl Iterator<Item = &'static Doc> {
    documents().iter().filter(move |d| d.kind() == kind)
}

// ---------------------------------------------------------------------------------------------
// Typed round trip

/// The first place where `got` differs from `want`, with its path.
fn first_difference(want: &Value, got: &Value, path: &str) -> Option<String> {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|k| {
                let p = format!("{path}.{k}");
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => first_difference(x, y, &p),
                    (Some(x), None) => Some(format!("{p} ({x}) is not a field there")),
                    (None, Some(y)) => Some(format!("{p} appeared as {y}")),
                    (None, None) => None,
                }
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{path}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if want == got => None,
        _ => Some(format!("{path}: {want} became {got}")),
    }
}

/// Deserializes into `T` and back: anything the typed object does not know is reported.
fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<(), String> {
    let typed: T =
        serde_json::from_value(value.clone()).map_err(|e| format!("does not deserialize: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    match first_difference(value, &back, "") {
        None => Ok(()),
        Some(d) => Err(format!("the typed object drops or changes a field: {d}")),
    }
}

/// The typed check of one document. Kinds that are not API objects here are checked by the
/// cross-file tests below (and by scripts/validate-deploy.sh).
pub fn check_typed(api_version: &str, kind: &str, value: &Value) -> Result<(), String> {
    match (api_version, kind) {
        ("v1", "Namespace") => round_trip::<Namespace>(value),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(value),
        ("v1", "Service") => round_trip::<Service>(value),
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(value),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(value),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(value)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(value),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(value),
        ("apps/v1", "Deployment") => round_trip::<Deployment>(value),
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(value),
        ("apps/v1", "StatefulSet") => round_trip::<StatefulSet>(value),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<PodDisruptionBudget>(value),
        ("networking.k8s.io/v1", "NetworkPolicy") => round_trip::<NetworkPolicy>(value),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            round_trip::<MutatingWebhookConfiguration>(value)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            round_trip::<ValidatingWebhookConfiguration>(value)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<ValidatingAdmissionPolicy>(value)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<ValidatingAdmissionPolicyBinding>(value)
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            round_trip::<CustomResourceDefinition>(value)
        }
        ("ipkeep.dev/v1alpha1", "PersistentPodState") => round_trip::<PersistentPodState>(value),
        ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
        | ("kustomize.config.k8s.io/v1beta1", "Kustomization")
        | ("kustomize.config.k8s.io/v1alpha1", "Component")
        | ("cert-manager.io/v1", "Issuer" | "Certificate")
        | ("monitoring.coreos.com/v1", "PrometheusRule" | "PodMonitor") => Ok(()),
        // Not in the k8s-openapi API version the workspace builds against (1.33): checked by
        // scripts/validate-deploy.sh (kubernetes-validate, 1.37) and by a real kube-apiserver
        // (tests/tests/admission_policy.rs).
        (
            "admissionregistration.k8s.io/v1",
            "MutatingAdmissionPolicy" | "MutatingAdmissionPolicyBinding",
        ) => Ok(()),
        (v, k) => Err(format!(
            "no typed check for {v} {k}: add one to check_typed"
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads, label selectors, RBAC rules

/// A Deployment or DaemonSet of ipkeep (not an example).
#[derive(Debug)]
pub struct Workload {
    pub doc: &'static Doc,
    pub selector: LabelSelector,
    pub template: PodTemplateSpec,
    pub replicas: Option<i32>,
}

impl Workload {
    /// Init containers, then containers.
    pub fn containers(&self) -> impl Iterator<Item = &Container> {
        let spec = self.template.spec.as_ref().expect("pod spec");
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
    }

    /// The pod template's labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }

    /// The main container: it runs one of the ipkeep binaries.
    pub fn main(&self) -> &Container {
        &self.template.spec.as_ref().expect("pod spec").containers[0]
    }
}

/// ipkeep's Deployments and DaemonSets.
pub fn workloads() -> Vec<Workload> {
    let mut out = Vec::new();
    for doc in documents().iter().filter(|d| !d.is_example()) {
        match doc.kind() {
            "Deployment" => {
                let d: Deployment = doc.typed();
                let spec = d.spec.expect("spec");
                out.push(Workload {
                    doc,
                    selector: spec.selector,
                    template: spec.template,
                    replicas: spec.replicas,
                });
            }
            "DaemonSet" => {
                let d: DaemonSet = doc.typed();
                let spec = d.spec.expect("spec");
                out.push(Workload {
                    doc,
                    selector: spec.selector,
                    template: spec.template,
                    replicas: None,
                });
            }
            _ => {}
        }
    }
    assert_eq!(out.len(), 3, "controller, scheduler extension and agent");
    out
}

/// The workload of that name.
pub fn workload(name: &str) -> Workload {
    workloads()
        .into_iter()
        .find(|w| w.doc.name() == name)
        .expect("workload")
}

/// Whether a label selector selects these labels (the API server's rules).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_label
        && selector.match_expressions.iter().flatten().all(|e| {
            let value = labels.get(&e.key);
            let listed = value.is_some_and(|v| e.values.iter().flatten().any(|x| x == v));
            match e.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                op => panic!("unknown selector operator {op}"),
            }
        })
}

/// Whether the rules allow `verb` on `group`/`resource` (named `name`, if the request names one).
pub fn allows(
    rules: &[PolicyRule],
    group: &str,
    resource: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    rules.iter().any(|r| {
        let has =
            |list: &Option<Vec<String>>, x: &str| list.iter().flatten().any(|v| v == x || v == "*");
        has(&r.api_groups, group)
            && has(&r.resources, resource)
            && r.verbs.iter().any(|v| v == verb || v == "*")
            && r.resource_names
                .as_ref()
                .is_none_or(|names| name.is_some_and(|n| names.iter().any(|x| x == n)))
    })
}

/// The rules granted to a service account of ipkeep-system, per binding kind.
pub fn granted(sa: &str) -> (Vec<PolicyRule>, Vec<(String, Vec<PolicyRule>)>) {
    let bound = |subjects: &Option<Vec<Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(NAMESPACE)
        })
    };
    let mut cluster = Vec::new();
    for b in of_kind("ClusterRoleBinding").map(|d| d.typed::<ClusterRoleBinding>()) {
        if bound(&b.subjects) {
            assert_eq!(b.role_ref.kind, "ClusterRole");
            let role: ClusterRole = find("ClusterRole", &b.role_ref.name).typed();
            cluster.extend(role.rules.unwrap_or_default());
        }
    }
    let mut namespaced = Vec::new();
    for d in of_kind("RoleBinding") {
        let b: RoleBinding = d.typed();
        if bound(&b.subjects) {
            assert_eq!(b.role_ref.kind, "Role", "{d}");
            let role = find("Role", &b.role_ref.name);
            assert_eq!(
                role.namespace(),
                d.namespace(),
                "{d}: a Role of its own namespace"
            );
            let rules = role.typed::<Role>().rules.unwrap_or_default();
            namespaced.push((role.namespace().unwrap_or_default().to_string(), rules));
        }
    }
    (cluster, namespaced)
}
