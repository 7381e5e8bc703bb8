//! The label keys and values ipkeep accepts in a spec (`ipkeep_placement::spec::check`, which
//! reads them with `label_syntax`) are the ones the API server accepts: each case goes, on the
//! test binary's real kube-apiserver, to Kubernetes' own label validation (a ConfigMap with the
//! label, created with dry run), to the CRD's validation of `lifecycle.preNormal.labelsHandler`
//! (a PersistentPodState with the label there, dry run) and to the spec check, and all three
//! must agree. One difference is on purpose: the CRD leaves `nodeTopologyKeys` to the
//! controller (any non-empty key is stored; a key that is not a label key makes the spec
//! `InvalidSpec`), which the last test pins down.
#![allow(clippy::unwrap_used)]

use ipkeep_api::{PersistentPodState, PersistentPodStateSpec};
use ipkeep_tests::apiserver;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::{Client, Error};
use serde_json::{Value, json};

/// `(key, a label key)`: what Kubernetes says, which the CRD and ipkeep must say too.
fn key_cases() -> Vec<(String, bool)> {
    let a = |n: usize| "a".repeat(n);
    // DNS subdomains of 253 and 254 characters, of labels of at most 63.
    let b63 = "b".repeat(63);
    let sub253 = format!("{b63}.{b63}.{b63}.{}", "b".repeat(61));
    let sub254 = format!("{b63}.{b63}.{b63}.{}", "b".repeat(62));
    let mut cases: Vec<(String, bool)> = [
        ("a", true),
        ("A", true),
        ("1", true),
        ("zone", true),
        ("Zone_1.x-Y", true),
        ("kubernetes.io/hostname", true),
        ("topology.kubernetes.io/zone", true),
        ("registry.example.com/registered", true),
        ("a.b-c/x_y.z", true),
        ("1-2.3/N", true),
        ("", false),
        ("/x", false),
        ("a/", false),
        ("Kubernetes.io/hostname", false),
        ("kubernetes.IO/hostname", false),
        ("a_b/x", false),
        ("-a/x", false),
        ("a-/x", false),
        ("a..b/x", false),
        (".a/x", false),
        ("a./x", false),
        ("a/-x", false),
        ("a/x-", false),
        ("-x", false),
        ("x-", false),
        ("_x", false),
        ("x_", false),
        (".x", false),
        ("x.", false),
        ("a/b/c", false),
        ("has space", false),
        (" a", false),
        ("a:b", false),
        ("é", false),
        ("a/é", false),
    ]
    .into_iter()
    .map(|(k, ok)| (k.to_string(), ok))
    .collect();
    cases.extend([
        (a(63), true),
        (a(64), false),
        (format!("x/{}", a(63)), true),
        (format!("x/{}", a(64)), false),
        // The prefix is a DNS subdomain: at most 253 characters, with no limit of 63 on each of
        // its labels (unlike a DNS name's).
        (format!("{}/x", a(63)), true),
        (format!("{}/x", a(64)), true),
        (format!("{}.c/x", a(200)), true),
        (format!("{sub253}/x"), true),
        (format!("{sub253}/{}", a(63)), true),
        (format!("{sub254}/x"), false),
        (format!("{}/x", a(254)), false),
        (format!("{}/x", a(300)), false),
    ]);
    cases
}

/// `(value, a label value)`.
fn value_cases() -> Vec<(String, bool)> {
    let mut cases: Vec<(String, bool)> = [
        ("", true),
        ("a", true),
        ("1", true),
        ("A-b_c.D", true),
        ("-a", false),
        ("a-", false),
        ("_a", false),
        ("a.", false),
        ("a b", false),
        ("a/b", false),
        ("a:b", false),
        ("é", false),
        (" a", false),
    ]
    .into_iter()
    .map(|(v, ok)| (v.to_string(), ok))
    .collect();
    cases.extend([("v".repeat(63), true), ("v".repeat(64), false)]);
    cases
}

/// `text`, shortened past 40 characters (the long cases are runs of one letter).
fn show(text: &str) -> String {
    let n = text.chars().count();
    if n <= 40 {
        format!("{text:?}")
    } else {
        let head: String = text.chars().take(12).collect();
        let tail: String = text.chars().skip(n - 12).collect();
        format!("{head:?}…{tail:?} ({n} characters)")
    }
}

/// A spec recording by `kubernetes.io/hostname` (or by `topology_key`) whose preNormal hook
/// waits for the label `key: value`.
fn spec(topology_key: &str, key: &str, value: &str) -> Value {
    json!({
        "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
        "requiredPersistentTopology": {"nodeTopologyKeys": [topology_key]},
        "lifecycle": {"preNormal": {"labelsHandler": {key: value}}}
    })
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// Whether the server takes `create` (dry run); a refusal must be a validation error (422).
async fn accepted<T>(create: impl Future<Output = Result<T, Error>>, what: &str) -> bool {
    match create.await {
        Ok(_) => true,
        Err(Error::Api(status)) if status.code == 422 => false,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// What Kubernetes says of the label `key: value` on an object.
async fn kubernetes(client: &Client, key: &str, value: &str) -> bool {
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "l", "labels": {key: value}}})).unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    accepted(
        api.create(&dry_run(), &cm),
        &format!("a ConfigMap labelled {key:?}: {value:?}"),
    )
    .await
}

/// What the CRD says of a PersistentPodState with `spec`.
async fn crd(client: &Client, spec: &Value) -> bool {
    let pps: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db"}, "spec": spec
    }))
    .unwrap();
    let api: Api<PersistentPodState> = Api::default_namespaced(client.clone());
    accepted(
        api.create(&dry_run(), &pps),
        &format!("a PersistentPodState with {spec}"),
    )
    .await
}

/// What ipkeep's spec check says of `spec`.
fn ipkeep(spec: &Value) -> bool {
    let spec: PersistentPodStateSpec = serde_json::from_value(spec.clone()).unwrap();
    ipkeep_placement::spec::check(&spec).is_ok()
}

#[tokio::test]
async fn label_keys_and_values_are_exactly_what_the_api_server_accepts() {
    let Some(ns) = apiserver::namespace("label syntax", "labels").await else {
        return;
    };
    let mut wrong = Vec::new();
    let host = "kubernetes.io/hostname";
    let mut judge = async |case: &str, want: bool, label: (&str, &str), topology: &str| {
        let spec = spec(topology, label.0, label.1);
        let said = [
            ("Kubernetes", kubernetes(&ns.client, label.0, label.1).await),
            ("the CRD", crd(&ns.client, &spec).await),
            ("ipkeep", ipkeep(&spec)),
        ];
        for (who, ok) in said {
            if ok != want {
                wrong.push(format!(
                    "{case} {}: {who} {}",
                    show(if case == "value" { label.1 } else { label.0 }),
                    if ok { "accepts it" } else { "refuses it" }
                ));
            }
        }
    };
    for (key, want) in key_cases() {
        judge("key", want, (&key, "v"), host).await;
    }
    for (value, want) in value_cases() {
        judge("value", want, ("example.com/ready", &value), host).await;
    }
    assert!(
        wrong.is_empty(),
        "disagreements with Kubernetes:\n{}",
        wrong.join("\n")
    );
}

#[tokio::test]
async fn topology_keys_are_checked_by_ipkeep_not_by_the_crd() {
    let Some(ns) = apiserver::namespace("topology keys", "topology").await else {
        return;
    };
    let mut wrong = Vec::new();
    for (key, want) in key_cases() {
        let spec = spec(&key, "example.com/ready", "true");
        // The CRD asks for a non-empty key only; ipkeep refuses exactly what Kubernetes
        // refuses as a label key (the spec is then InvalidSpec, and nothing is pinned).
        let crd_said = crd(&ns.client, &spec).await;
        let non_empty = !key.is_empty();
        if crd_said != non_empty {
            wrong.push(format!("{}: the CRD says {crd_said}", show(&key)));
        }
        if ipkeep(&spec) != want {
            wrong.push(format!("{}: ipkeep says {}", show(&key), !want));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
