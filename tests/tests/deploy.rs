//! What a cluster admin applies (`deploy/`) cannot drift silently from the code or from itself:
//!
//! - every YAML document deserializes into its typed object (k8s-openapi, or
//!   `ipkeep_api::PersistentPodState`) and serializes back to the same JSON, so a misspelt or
//!   misplaced field fails here instead of being dropped;
//! - the example conflists are configurations the plugin accepts, including what flannel renders
//!   from `10-ipkeep-flannel.conflist`;
//! - the workloads pass flags and variables their binaries have (`--help`), probe and serve the
//!   ports the binaries listen on, run as bound service accounts in `ipkeep-system`, with the one
//!   image the Dockerfile builds;
//! - the webhook, the extender, the Service and the certificate agree on names, ports and Secret;
//! - the example PersistentPodState is what the example StatefulSet's annotations generate;
//! - the shipped alerting rules are the documented ones, on metrics the binaries export.
//!
//! Validation against Kubernetes' own OpenAPI schemas is `scripts/validate-deploy.sh`.

#[path = "deploy/alerts.rs"]
mod alerts;
#[path = "deploy/certificates.rs"]
mod certificates;
#[path = "deploy/chart.rs"]
mod chart;
#[path = "deploy/chart_lifecycle.rs"]
mod chart_lifecycle;
#[path = "deploy/cli.rs"]
mod cli;
#[path = "deploy/consistency.rs"]
mod consistency;
#[path = "deploy/links.rs"]
mod links;
#[path = "deploy/manifests.rs"]
mod manifests;
#[path = "deploy/node_paths.rs"]
mod node_paths;
#[path = "deploy/security.rs"]
mod security;

use ipkeep_api::PersistentPodState;
use ipkeep_api::k8s_openapi::api::apps::v1::StatefulSet;
use ipkeep_api::k8s_openapi::api::core::v1::Service;
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use ipkeep_tests::Invocation;
use ipkeep_values::keys;
use serde_json::{Value, json};

use manifests::{check_typed, deploy_dir, documents, find, selects};

#[test]
fn every_document_deserializes_into_its_typed_object_without_losing_a_field() {
    let docs = documents();
    assert!(
        docs.len() >= 25,
        "only {} documents found in deploy/",
        docs.len()
    );
    let failures: Vec<String> = docs
        .iter()
        .filter_map(|d| {
            let check = check_typed(d.str("/apiVersion"), d.kind(), &d.value);
            check.err().map(|e| format!("{d}: {e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_typed_check_catches_a_misspelt_field() {
    let mut deployment = find("Deployment", "ipkeep-controller").value.clone();
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] =
        json!(true);
    let err = check_typed("apps/v1", "Deployment", &deployment).expect_err("a misspelt field");
    assert!(err.contains("readOnlyRootFilesytem"), "{err}");

    let mut pps = find("PersistentPodState", "db").value.clone();
    pps["spec"]["ipRetention"] = json!(24);
    assert!(check_typed("ipkeep.dev/v1alpha1", "PersistentPodState", &pps).is_err());
}

// ---------------------------------------------------------------------------------------------
// Examples and CNI configurations

#[test]
fn example_persistent_pod_state_is_what_the_example_statefulset_annotations_generate() {
    let sts: StatefulSet = find("StatefulSet", "db").typed();
    let pps: PersistentPodState = find("PersistentPodState", "db").typed();
    let annotations = sts.metadata.annotations.clone().unwrap_or_default();
    for key in [
        keys::AUTO_GENERATE,
        keys::REQUIRED_TOPOLOGY,
        keys::PREFERRED_TOPOLOGY,
        keys::IP_RETENTION,
    ] {
        assert!(annotations.contains_key(key), "the example shows {key}");
    }
    let name = sts.metadata.name.clone().expect("name");
    let generated = ipkeep_placement::autogen::generated_spec(&name, Some(&annotations), None)
        .expect("valid annotations")
        .expect("auto-generation on");
    assert_eq!(pps.spec, generated.spec);
    assert_eq!(
        pps.metadata.name.as_deref(),
        Some(name.as_str()),
        "the generated name"
    );

    let spec = sts.spec.expect("spec");
    assert_eq!(spec.replicas, Some(3));
    let service: Service =
        find("Service", &spec.service_name.clone().expect("serviceName")).typed();
    let svc = service.spec.expect("spec");
    assert_eq!(
        svc.cluster_ip.as_deref(),
        Some("None"),
        "a headless Service"
    );
    let selector = LabelSelector {
        match_labels: svc.selector,
        match_expressions: None,
    };
    let labels = spec
        .template
        .metadata
        .and_then(|m| m.labels)
        .unwrap_or_default();
    assert!(selects(&selector, &labels) && selects(&spec.selector, &labels));
}

fn conflist(name: &str) -> Value {
    let path = deploy_dir().join("cni").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("JSON")
}

/// The plugin accepts `conf` (what the main plugin hands it): STATUS validates the configuration
/// without touching state. STATUS needs cniVersion 1.1.0, so the callers set it; no other key
/// depends on the version.
fn assert_plugin_accepts(conf: &Value) {
    let out = Invocation::new("STATUS", "-").run(&cli::binary("ipkeep"), &conf.to_string());
    assert!(out.ok(), "{out:?}");
}

/// The bridge configuration is the template the agent renders (deploy/cni/kustomization.yaml):
/// once a node's pod CIDR is filled in, the plugin accepts it.
#[test]
fn example_conflist_is_a_valid_ipkeep_configuration() {
    let template = conflist("10-ipkeep-bridge.conflist");
    let rendered = ipkeep_agent::cniconf::render(&template.to_string(), &["10.244.1.0/24".into()])
        .expect("the agent renders the template");
    let list: Value = serde_json::from_str(&rendered).expect("JSON");
    assert_eq!(
        list["plugins"][0]["ipam"]["ranges"],
        json!([[{"subnet": "10.244.1.0/24"}]])
    );
    let plugin = list["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["ipam"]["type"] == "ipkeep"))
        .expect("a plugin delegating to ipkeep");
    assert_eq!(
        plugin["capabilities"]["io.kubernetes.cri.pod-annotations"], true,
        "retention needs the annotations capability"
    );
    // What libcni hands the main plugin, and it hands on to us: the plugin with the list's name.
    let mut conf = plugin.clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = "1.1.0".into();
    assert_plugin_accepts(&conf);
}

/// flannel's CNI plugin (flannel-io/cni-plugin, and its previous home, the reference plugins'
/// meta/flannel up to v0.9.1) refuses `delegate.ipam`, takes its IPAM from its
/// own `ipam`, replaces `ranges` with the node's subnets from /run/flannel/subnet.env, appends a
/// route to the flannel network, and passes `runtimeConfig` (the pod annotations) on to the
/// delegate, which hands its whole configuration to the IPAM plugin.
#[test]
fn flannel_conflist_renders_a_configuration_ipkeep_accepts() {
    let list = conflist("10-ipkeep-flannel.conflist");
    let flannel = &list["plugins"][0];
    assert_eq!(flannel["type"], "flannel");
    assert_eq!(
        flannel["capabilities"]["io.kubernetes.cri.pod-annotations"], true,
        "retention needs the annotations"
    );
    for key in ["ipam", "name"] {
        assert!(
            flannel["delegate"].get(key).is_none(),
            "flannel refuses delegate.{key}"
        );
    }
    for key in ["ranges", "subnet", "rangeStart", "rangeEnd"] {
        assert!(
            flannel["ipam"].get(key).is_none(),
            "flannel sets the ranges; ipam.{key} would add a range set"
        );
    }
    // subnet.env: FLANNEL_NETWORK=10.244.0.0/16, FLANNEL_SUBNET=10.244.1.1/24, FLANNEL_MTU=1450,
    // FLANNEL_IPMASQ=true.
    let mut ipam = flannel["ipam"].clone();
    ipam["ranges"] = json!([[{"subnet": "10.244.1.0/24"}]]);
    let mut routes = ipam.get("routes").cloned().unwrap_or_else(|| json!([]));
    routes
        .as_array_mut()
        .expect("routes")
        .push(json!({"dst": "10.244.0.0/16"}));
    ipam["routes"] = routes;
    let mut delegate = flannel["delegate"].clone();
    delegate["name"] = list["name"].clone();
    delegate["type"] = delegate
        .get("type")
        .cloned()
        .unwrap_or_else(|| "bridge".into());
    delegate["ipMasq"] = false.into();
    delegate["mtu"] = 1450.into();
    delegate["isGateway"] = true.into();
    // flannel gives its delegate the list's cniVersion (0.4.0); STATUS needs 1.1.0 (above).
    assert_eq!(
        list["cniVersion"], "0.4.0",
        "flannel's plugin speaks CNI up to 0.4.0"
    );
    delegate["cniVersion"] = "1.1.0".into();
    delegate["ipam"] = ipam;
    delegate["runtimeConfig"] =
        json!({"io.kubernetes.cri.pod-annotations": {keys::IP_RETENTION: "24h"}});
    assert_plugin_accepts(&delegate);
}
