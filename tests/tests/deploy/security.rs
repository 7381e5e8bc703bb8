//! What the manifests promise about exposure: every pod runs under the runtime's default
//! seccomp profile, a host-network pod's plain-HTTP probe port listens on loopback only, and
//! the optional NetworkPolicies admit to each port of the other pods only what must reach it.

use std::collections::BTreeSet;

use ipkeep_api::k8s_openapi::api::networking::v1::NetworkPolicy;
use ipkeep_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::cli::{Cli, flag_value, ipkeep_binary};
use super::manifests::{of_kind, repo_root, selects, workloads};

/// Found by review: no workload set a seccomp profile.
#[test]
fn every_workload_runs_with_the_runtime_default_seccomp_profile() {
    for w in workloads() {
        let spec = w.template.spec.as_ref().expect("pod spec");
        let pod_level = spec
            .security_context
            .as_ref()
            .and_then(|s| s.seccomp_profile.as_ref())
            .map(|p| p.type_.as_str());
        for c in w.containers() {
            let container_level = c
                .security_context
                .as_ref()
                .and_then(|s| s.seccomp_profile.as_ref())
                .map(|p| p.type_.as_str());
            let effective = container_level.or(pod_level);
            assert_eq!(
                effective,
                Some("RuntimeDefault"),
                "{}: container {} runs without the RuntimeDefault seccomp profile",
                w.doc,
                c.name
            );
        }
    }
}

/// Found by review: the agent's metrics listened on every node address (it runs with
/// hostNetwork). Its default and its manifest keep the port on loopback, and its probes ask
/// there.
#[test]
fn host_network_probe_ports_listen_on_loopback_only() {
    let agent_default = Cli::of("ipkeep-agent");
    assert!(
        agent_default.help.contains("127.0.0.1:9464"),
        "the agent's --probe-listen defaults to loopback:\n{}",
        agent_default.help
    );
    for w in workloads() {
        let spec = w.template.spec.as_ref().expect("pod spec");
        if spec.host_network != Some(true) {
            continue;
        }
        let c = w.main();
        let binary = ipkeep_binary(c).expect("an ipkeep binary");
        let address = flag_value(c, Cli::of(binary), "--probe-listen").expect("--probe-listen");
        assert!(
            address.starts_with("127.0.0.1:"),
            "{}: --probe-listen={address}",
            w.doc
        );
        for probe in [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]
            .into_iter()
            .flatten()
        {
            let host = probe.http_get.as_ref().and_then(|g| g.host.as_deref());
            assert_eq!(host, Some("127.0.0.1"), "{}: probes ask on loopback", w.doc);
        }
    }
}

/// Found by review (L-8, M-1): nothing limited who could reach the webhook and metrics ports.
/// The component's policies cover every pod-network workload (one policy each), admit each of
/// its container ports and nothing else, and admit the webhook port from addresses only (the
/// control plane's host network), never from pods; the placeholder that must be replaced is
/// not a CIDR (the API server refuses it) and docs/install.md shows how to replace it.
#[test]
fn network_policies_admit_each_port_only_what_must_reach_it() {
    let policies: Vec<NetworkPolicy> = of_kind("NetworkPolicy").map(|d| d.typed()).collect();
    assert!(!policies.is_empty(), "deploy/network-policy ships policies");
    let mut covered = 0;
    for w in workloads() {
        let spec = w.template.spec.as_ref().expect("pod spec");
        if spec.host_network == Some(true) {
            continue;
        }
        let labels = w.labels();
        let mine: Vec<&NetworkPolicy> = policies
            .iter()
            .filter(|p| {
                let selector = p.spec.as_ref().and_then(|s| s.pod_selector.clone());
                selects(&selector.unwrap_or_default(), &labels)
            })
            .collect();
        assert_eq!(mine.len(), 1, "{}: one NetworkPolicy selects it", w.doc);
        covered += 1;
        let policy = mine[0].spec.as_ref().expect("spec");
        assert_eq!(policy.policy_types, Some(vec!["Ingress".to_string()]));
        let ports: BTreeSet<String> = w
            .main()
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.name.clone())
            .collect();
        let mut admitted = BTreeSet::new();
        for rule in policy.ingress.iter().flatten() {
            let from = rule.from.as_deref().unwrap_or_default();
            assert!(!from.is_empty(), "{}: a rule open to everyone", w.doc);
            for port in rule.ports.iter().flatten() {
                let Some(IntOrString::String(name)) = &port.port else {
                    panic!("{}: ports by name, as the containers name them", w.doc)
                };
                admitted.insert(name.clone());
                if name == "https" {
                    for peer in from {
                        assert!(
                            peer.pod_selector.is_none() && peer.namespace_selector.is_none(),
                            "{}: the webhook port admits pods",
                            w.doc
                        );
                        let cidr = &peer.ip_block.as_ref().expect("an ipBlock").cidr;
                        assert_eq!(cidr, "CONTROL-PLANE-CIDR", "the placeholder to replace");
                    }
                }
            }
        }
        assert_eq!(
            admitted, ports,
            "{}: each container port, nothing else",
            w.doc
        );
    }
    assert_eq!(
        covered,
        policies.len(),
        "a policy for each pod-network workload"
    );
    let install = std::fs::read_to_string(repo_root().join("docs/install.md")).expect("install");
    assert!(
        install.contains("/spec/ingress/0/from/0/ipBlock/cidr"),
        "docs/install.md shows how to set the control plane's addresses"
    );
}

/// Security review L-3: scheduler-ext mounted the whole Secret ipkeep-controller keeps, the CA's
/// private key (`ca.key`) with it, into the pod that takes requests from the network. Every
/// Secret volume of every workload names the keys it mounts, and scheduler-ext's certificate
/// volume mounts the serving certificate and its key, nothing else.
#[test]
fn secrets_are_mounted_by_key_and_never_the_ca_key() {
    let mut secret_volumes = 0;
    for w in workloads() {
        let spec = w.template.spec.as_ref().expect("pod spec");
        for v in spec.volumes.iter().flatten() {
            let Some(secret) = &v.secret else { continue };
            secret_volumes += 1;
            let keys: Vec<&str> = (secret.items.iter().flatten())
                .map(|i| i.key.as_str())
                .collect();
            assert!(
                !keys.is_empty(),
                "{}: volume {} mounts every key of Secret {:?}",
                w.doc,
                v.name,
                secret.secret_name
            );
            assert!(
                !keys.contains(&"ca.key"),
                "{}: volume {} mounts ca.key",
                w.doc,
                v.name
            );
            if secret.secret_name.as_deref() == Some("ipkeep-scheduler-ext-tls") {
                assert_eq!(keys, ["tls.crt", "tls.key"], "{}", w.doc);
            }
        }
    }
    assert!(secret_volumes > 0, "scheduler-ext mounts its certificate");
}
