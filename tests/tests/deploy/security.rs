//! What the manifests promise about exposure: every pod runs under the runtime's default
//! seccomp profile, and a host-network pod's plain-HTTP probe port listens on loopback only.

use super::cli::{Cli, flag_value, ipkeep_binary};
use super::manifests::workloads;

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
