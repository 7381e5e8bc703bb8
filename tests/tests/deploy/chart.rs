//! The chart's values, rendered: `helm template` of `charts/ipkeep` with the values a test sets
//! (the helm of `scripts/helm-build.sh`, or `$IPKEEP_HELM`), so every value is tested where it
//! lands, and every value the schema or a template refuses is refused with the key named.
//! deploy/ (the default values) is what the other modules test.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use super::manifests::repo_root;

/// The helm binary, or `None` (said once) when there is none to build it with.
fn helm() -> Option<&'static PathBuf> {
    static HELM: OnceLock<Option<PathBuf>> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(h) = std::env::var_os("IPKEEP_HELM").filter(|h| !h.is_empty()) {
            return Some(PathBuf::from(h));
        }
        if !ipkeep_tests::cluster::require_go("the chart's template tests (helm)") {
            return None;
        }
        let out = Command::new(repo_root().join("scripts/helm-build.sh"))
            .arg("--print-dir")
            .output()
            .expect("run scripts/helm-build.sh");
        assert!(
            out.status.success(),
            "scripts/helm-build.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("helm-build.sh prints the directory")
            .trim()
            .to_string();
        Some(PathBuf::from(dir).join("bin/helm"))
    })
    .as_ref()
}

/// `helm template` of the chart into `ipkeep-system` with `args` (`--set`, `-f`, ...): its
/// documents, or the error helm printed; `None` without helm.
pub fn try_render(args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    let helm = helm()?;
    let out = Command::new(helm)
        .args(["template", "ipkeep"])
        .arg(repo_root().join("charts/ipkeep"))
        .args(["--namespace", "ipkeep-system", "--include-crds"])
        .args(args)
        .output()
        .expect("run helm");
    if !out.status.success() {
        return Some(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("helm template {args:?} is not YAML: {e}"));
    Some(Ok(docs.into_iter().filter(|d| !d.is_null()).collect()))
}

/// The rendering with `sets` (`--set` each); `None` without helm.
pub fn render(sets: &[&str]) -> Option<Rendered> {
    let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s]).collect();
    let docs = try_render(&args)?.unwrap_or_else(|e| panic!("helm template {sets:?}: {e}"));
    Some(Rendered(docs))
}

/// helm's error for `sets`, which must be refused; `None` without helm.
pub fn refused(sets: &[&str]) -> Option<String> {
    let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s]).collect();
    match try_render(&args)? {
        Ok(_) => panic!("the chart accepts {sets:?}"),
        Err(e) => Some(e),
    }
}

/// A rendering's documents.
#[derive(Debug)]
pub struct Rendered(pub Vec<Value>);

impl Rendered {
    /// The documents of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &str) -> impl Iterator<Item = &'a Value> + 'a {
        let kind = kind.to_string();
        self.0.iter().filter(move |d| d["kind"] == kind.as_str())
    }

    /// The document of `kind` named `name`, if rendered.
    pub fn get(&self, kind: &str, name: &str) -> Option<&Value> {
        self.of_kind(kind).find(|d| d["metadata"]["name"] == name)
    }

    /// The document of `kind` named `name` (panics when not rendered).
    pub fn find(&self, kind: &str, name: &str) -> &Value {
        self.get(kind, name)
            .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
    }
}

/// The arguments of the first container of a pod template (`/spec/template/spec/containers/0`).
pub fn args(workload: &Value) -> Vec<String> {
    workload
        .pointer("/spec/template/spec/containers/0/args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(String::from))
        .collect()
}

#[test]
fn scheduler_ext_mounts_the_client_ca_only_when_given_and_only_its_certificate() {
    let Some(plain) = render(&[]) else { return };
    let with = render(&["schedulerExt.clientCA.secretName=webhook-clients"]).expect("helm");
    let plain_args = args(plain.find("Deployment", "ipkeep-scheduler-ext"));
    assert!(!plain_args.iter().any(|a| a.starts_with("--client-ca")));
    let d = with.find("Deployment", "ipkeep-scheduler-ext");
    assert!(args(d).contains(&"--client-ca=/client-ca/ca.crt".to_string()));
    let volumes = d
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .expect("volumes");
    let ca = volumes
        .iter()
        .find(|v| v["name"] == "client-ca")
        .expect("the client-ca volume");
    assert_eq!(ca["secret"]["secretName"], "webhook-clients");
    assert_eq!(
        ca["secret"]["items"],
        serde_json::json!([{"key": "ca.crt", "path": "ca.crt"}])
    );
    let mounts = d
        .pointer("/spec/template/spec/containers/0/volumeMounts")
        .and_then(Value::as_array)
        .expect("mounts");
    assert!(
        mounts
            .iter()
            .any(|m| m["name"] == "client-ca" && m["mountPath"] == "/client-ca")
    );
    let message = refused(&["schedulerExt.clientCA.secretName=Not_A_Name"]).expect("helm");
    assert!(
        message.contains("/schedulerExt/clientCA/secretName"),
        "{message}"
    );
}
