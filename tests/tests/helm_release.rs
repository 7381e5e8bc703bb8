//! What `helm install`, `upgrade`, `rollback` and `uninstall` of the chart leave on a real
//! kube-apiserver (issue 41, "upgrades that leave nothing behind"), without nodes: no pod runs
//! (no kube-controller-manager), the objects are what counts.
//!
//! - A MutatingWebhookConfiguration `ipkeep-scheduler-ext` that no release owns (0.1.0's
//!   `kubectl apply -k`, its `caBundle` patched by make-certificate.sh) is gone once the chart
//!   is installed in policy mode; switching between the modes by upgrade and rollback leaves
//!   exactly the objects of the mode; uninstall leaves none, but the anchor Helm keeps on
//!   purpose.
//! - The CRD is a release object (`crds.manage`): one made outside Helm (0.2.0's `crds/`,
//!   `kubectl apply`) is refused without `--take-ownership`, adopted with it (and
//!   `--force-conflicts`, as kubectl owns its fields) and brought to the chart's schema;
//!   `helm uninstall` keeps it.
//!
//! `scripts/upgrade-test.sh` runs the same steps on real nodes, under load, from 0.1.0 and 0.2.0.
#![allow(clippy::unwrap_used)]

use ipkeep_tests::apiserver;
use ipkeep_tests::cluster::repo_root;
use ipkeep_tests::helm::{self, Helm};
use ipkeep_tests::kubectl::Kubectl;
use serde_json::Value;

const CRD: &str = "persistentpodstates.ipkeep.dev";

/// 0.1.0's mutating webhook configuration (its deploy/scheduler-ext/webhook.yaml), as
/// `kubectl apply -k` left it.
const WEBHOOK_0_1_0: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: ipkeep-scheduler-ext
  annotations:
    cert-manager.io/inject-ca-from: ipkeep-system/ipkeep-scheduler-ext
webhooks:
  - name: pin.ipkeep.dev
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Ignore
    timeoutSeconds: 3
    reinvocationPolicy: IfNeeded
    matchPolicy: Equivalent
    clientConfig:
      service: {namespace: ipkeep-system, name: ipkeep-scheduler-ext, path: /mutate-pods, port: 443}
    rules:
      - {operations: ["CREATE"], apiGroups: [""], apiVersions: ["v1"], resources: ["pods"], scope: Namespaced}
    objectSelector:
      matchExpressions: [{key: statefulset.kubernetes.io/pod-name, operator: Exists}]
    namespaceSelector:
      matchExpressions:
        - {key: kubernetes.io/metadata.name, operator: NotIn, values: ["kube-system", "ipkeep-system"]}
        - {key: ipkeep.dev/webhook, operator: NotIn, values: ["disabled"]}
"#;

/// The names of ipkeep's mutating webhook configurations, admission policies and bindings.
fn admission_objects(kubectl: &Kubectl, policy_served: bool) -> Vec<String> {
    let mut kinds = vec![
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ];
    if policy_served {
        kinds.extend([
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings",
        ]);
    }
    let mut found = Vec::new();
    for kind in kinds {
        let list = kubectl.get(&[kind]).unwrap();
        for item in list["items"].as_array().unwrap() {
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            if name.contains("ipkeep") {
                found.push(format!("{kind}/{name}"));
            }
        }
    }
    found.sort();
    found
}

/// The pinning webhooks of `ipkeep-scheduler-ext`, if the configuration exists.
fn pinning_webhooks(kubectl: &Kubectl) -> Option<Vec<String>> {
    let mwc = kubectl.get(&["mutatingwebhookconfiguration", "ipkeep-scheduler-ext"])?;
    Some(
        (mwc["webhooks"].as_array().into_iter().flatten())
            .filter_map(|w| w["name"].as_str().map(String::from))
            .collect(),
    )
}

fn schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

#[test]
fn helm_leaves_the_objects_of_the_release_and_nothing_else() {
    let test = "helm_leaves_the_objects_of_the_release_and_nothing_else";
    let Some(server) = apiserver::shared(test) else {
        return;
    };
    let Some(bin) = helm::binary(test) else {
        return;
    };
    let kubectl = server.kubectl();
    let home = tempfile::tempdir().unwrap();
    let helm = Helm::new(bin, kubectl.kubeconfig(), home.path());
    let chart = repo_root().join("charts/ipkeep");
    let chart = chart.to_str().unwrap();
    let release = |args: &[&str]| {
        let mut all = vec![args[0], "ipkeep"];
        if args[0] != "rollback" {
            all.push(chart);
        }
        all.extend(["-n", "ipkeep-system"]);
        all.extend(&args[1..]);
        helm.run(&all)
    };
    let resources = kubectl.run(&[
        "api-resources",
        "--api-group=admissionregistration.k8s.io",
        "-o",
        "name",
    ]);
    let policy_served = resources
        .lines()
        .any(|l| l.starts_with("mutatingadmissionpolicies."));
    kubectl.run(&[
        "apply",
        "-f",
        repo_root().join("deploy/namespace.yaml").to_str().unwrap(),
    ]);

    // What 0.1.0 and 0.2.0 left outside any release: the webhook configuration (kubectl apply,
    // the caBundle by another field manager) and the CRD (applied by the test server from
    // deploy/crd.yaml, here made older: another root description).
    kubectl.apply(WEBHOOK_0_1_0);
    kubectl.run(&[
        "patch",
        "mutatingwebhookconfiguration",
        "ipkeep-scheduler-ext",
        "--type=json",
        "-p",
        r#"[{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Zm9v"}]"#,
    ]);
    kubectl.run(&[
        "patch",
        "crd",
        CRD,
        "--type=json",
        "-p",
        r#"[{"op": "replace", "path": "/spec/versions/0/schema/openAPIV3Schema/description", "value": "an older CRD"}]"#,
    ]);

    // The CRD is the release's: one made outside Helm is refused, and adopted on request.
    let out = helm.try_run(&[
        "install",
        "ipkeep",
        chart,
        "-n",
        "ipkeep-system",
        "--set",
        "admission.mode=policy",
    ]);
    let refusal = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && refusal.contains("CustomResourceDefinition")
            && refusal.contains(CRD),
        "helm install took over a CRD it does not own: {refusal}"
    );
    let mode = if policy_served { "policy" } else { "webhook" };
    // --force-conflicts: another field manager (kubectl) set the CRD's versions; Helm's apply
    // takes them over (docs/install.md, "Upgrade").
    release(&[
        "install",
        "--take-ownership",
        "--force-conflicts",
        "--set",
        &format!("admission.mode={mode}"),
    ]);
    let crd = kubectl.get(&["crd", CRD]).unwrap();
    assert_eq!(
        crd["metadata"]["annotations"]["meta.helm.sh/release-name"],
        "ipkeep"
    );
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    let chart_crd: Value = serde_json::from_str(&kubectl.run(&[
        "create",
        "--dry-run=client",
        "-o",
        "json",
        "-f",
        repo_root().join("deploy/crd.yaml").to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(
        schema(&crd)["description"],
        schema(&chart_crd)["description"],
        "Helm did not bring the CRD to the chart's"
    );

    if policy_served {
        // The configuration 0.1.0 left is gone, whoever owned its fields.
        assert_eq!(
            pinning_webhooks(kubectl),
            None,
            "policy mode left a mutating webhook configuration: {:?}",
            admission_objects(kubectl, policy_served)
        );
        // Back and forth between the modes: upgrade, upgrade, rollback, rollback.
        release(&["upgrade", "--set", "admission.mode=webhook"]);
        assert_eq!(
            pinning_webhooks(kubectl).unwrap(),
            ["pin.ipkeep.dev", "pending.ipkeep.dev"]
        );
        assert!(
            kubectl
                .get(&["mutatingadmissionpolicy", "ipkeep-pin"])
                .is_none()
        );
        release(&["upgrade", "--set", "admission.mode=policy"]);
        assert_eq!(pinning_webhooks(kubectl), None);
        assert!(
            kubectl
                .get(&["mutatingadmissionpolicy", "ipkeep-pin"])
                .is_some()
        );
        release(&["rollback", "2"]);
        assert!(
            pinning_webhooks(kubectl).is_some(),
            "the rollback to webhook mode"
        );
        release(&["rollback", "3"]);
        assert_eq!(
            pinning_webhooks(kubectl),
            None,
            "the rollback to policy mode"
        );
    }

    helm.run(&["uninstall", "ipkeep", "-n", "ipkeep-system", "--wait"]);
    let kept: Vec<String> = if policy_served {
        vec![
            "validatingadmissionpolicies/ipkeep-configmap-parameters-anchor".into(),
            "validatingadmissionpolicybindings/ipkeep-configmap-parameters-anchor".into(),
        ]
    } else {
        Vec::new()
    };
    assert_eq!(
        admission_objects(kubectl, policy_served),
        kept,
        "uninstall left more than the anchor Helm keeps on purpose"
    );
    assert!(
        kubectl.get(&["crd", CRD]).is_some(),
        "uninstall deleted the CRD"
    );
    // As docs/install.md, "Uninstall", has the operator do once ipkeep is gone for good.
    if policy_served {
        kubectl.run(&[
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "ipkeep-configmap-parameters-anchor",
        ]);
    }
    assert_eq!(
        admission_objects(kubectl, policy_served),
        Vec::<String>::new()
    );
}
