//! What Helm installs, upgrades, keeps and deletes, as the chart renders it: the CRD with the
//! release (`crds.manage`), kept on uninstall; in policy mode, the hook that deletes a
//! mutating webhook configuration no release owns. `tests/tests/helm_release.rs` runs the same
//! on a real kube-apiserver, and `scripts/upgrade-test.sh` on real nodes.

use serde_json::Value;

use super::chart::{Rendered, render, try_render};
use super::manifests::repo_root;

/// crdgen's output, which the chart renders.
fn crd_file() -> Value {
    let text = std::fs::read_to_string(repo_root().join("charts/ipkeep/files/crd.yaml"))
        .expect("charts/ipkeep/files/crd.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    docs.into_iter().find(|d| !d.is_null()).expect("a document")
}

/// Issue 41 (gap 8): `helm upgrade` brings the new version's CRD: the chart renders crdgen's
/// CRD as a release object (Helm never upgrades crds/), labelled, and kept on uninstall and on
/// a rollback to a release that did not render it; `crds.manage=false` renders none.
#[test]
fn the_crd_is_a_release_object_that_helm_keeps() {
    let Some(r) = render(&[]) else { return };
    let crd = r.find("CustomResourceDefinition", "persistentpodstates.ipkeep.dev");
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
        "uninstall and rollback must not delete every PersistentPodState"
    );
    assert_eq!(
        crd["metadata"]["labels"]["app.kubernetes.io/part-of"],
        "ipkeep"
    );
    // Helm's YAML round trip writes crdgen's `maximum: 604800.0` as 604800: the same number.
    assert_eq!(
        numbers_as_f64(&crd["spec"]),
        numbers_as_f64(&crd_file()["spec"]),
        "the CRD is crdgen's"
    );
    let unmanaged = render(&["crds.manage=false"]).expect("helm");
    assert_eq!(unmanaged.of_kind("CustomResourceDefinition").count(), 0);
}

/// `value` with every number as an f64, so that 1 and 1.0 compare equal.
fn numbers_as_f64(value: &Value) -> Value {
    match value {
        Value::Number(n) => n.as_f64().map_or(Value::Null, Value::from),
        Value::Array(a) => Value::Array(a.iter().map(numbers_as_f64).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), numbers_as_f64(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The MutatingWebhookConfiguration `ipkeep-scheduler-ext` rendered by `r`, and whether it is
/// a hook.
fn mutating_webhooks(r: &Rendered) -> Vec<(&Value, bool)> {
    r.of_kind("MutatingWebhookConfiguration")
        .filter(|d| d["metadata"]["name"] == "ipkeep-scheduler-ext")
        .map(|d| (d, d["metadata"]["annotations"]["helm.sh/hook"].is_string()))
        .collect()
}

/// Issue 41 (item 7): in policy mode no mutating webhook configuration may survive an install,
/// upgrade or rollback, whoever made it: the chart renders one without webhooks as a hook
/// that Helm deletes (with any older object of the name) before creating it, and again after.
/// In webhook mode the configuration is a release object, and no hook deletes it.
#[test]
fn policy_mode_deletes_any_mutating_webhook_configuration_of_ipkeep() {
    let Some(webhook) = render(&["admission.mode=webhook"]) else {
        return;
    };
    let found = mutating_webhooks(&webhook);
    assert_eq!(found.len(), 1, "{found:?}");
    let (mwc, hook) = found[0];
    assert!(!hook, "webhook mode: a release object");
    assert_eq!(mwc["webhooks"].as_array().map(Vec::len), Some(2));

    let policy = render(&["admission.mode=policy"]).expect("helm");
    let auto = try_render(&[
        "--api-versions",
        "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
    ])
    .expect("helm")
    .expect("auto renders");
    for r in [policy, Rendered(auto)] {
        let found = mutating_webhooks(&r);
        assert_eq!(found.len(), 1, "{found:?}");
        let (mwc, hook) = found[0];
        assert!(hook, "policy mode: only the hook");
        let annotations = &mwc["metadata"]["annotations"];
        assert_eq!(
            annotations["helm.sh/hook"],
            "pre-install,pre-upgrade,pre-rollback"
        );
        assert_eq!(
            annotations["helm.sh/hook-delete-policy"], "before-hook-creation,hook-succeeded",
            "deletes the old one before, and itself after"
        );
        assert_eq!(
            mwc["webhooks"],
            serde_json::json!([]),
            "pins nothing meanwhile"
        );
        assert!(r.get("MutatingAdmissionPolicy", "ipkeep-pin").is_some());
    }
}
