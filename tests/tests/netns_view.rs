//! The node agent looks up sandboxes' network namespaces in its own mount namespace, not the
//! container runtime's. Here the runtime keeps its namespaces (real ones, bind-mounted on files)
//! in a directory that the agent's private mount namespace hides under a tmpfs, as a runtime
//! that keeps them outside the agent's mounts does. Needs root (mounts); skips loudly without.

use std::path::Path;

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::mountns::{MountNs, SandboxNetns as Sandbox};
use ipkeep_tests::{Invocation, PluginOutput, ipkeep_bin};

fn conf(data: &Path, socket: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"nv","ipam":{{"type":"ipkeep","dataDir":"{}","agentSocket":"{}","ranges":[[{{"subnet":"10.75.0.0/24"}}]]}},"runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{"ipkeep.dev/ip-retention":"1h","ipkeep.dev/persistent-pod-state":"kv"}}}}}}"#,
        data.display(),
        socket.display()
    )
}

fn add(container: &str, sandbox: &Sandbox, conf: &str) -> PluginOutput {
    let mut inv = Invocation::new("ADD", container).args("K8S_POD_NAMESPACE=db;K8S_POD_NAME=kv-0");
    inv.netns = sandbox.path();
    inv.run(&ipkeep_bin(), conf)
}

/// Found by review: through the agent, a rebuilt pod took over the address of its older
/// sandbox, still alive, because the agent could not see the runtime's namespace directory;
/// the plugin alone refused. Where the agent cannot see, it asks the plugin, which runs on the
/// host as the runtime does.
#[test]
fn netns_root_agent_that_cannot_see_the_runtimes_namespaces_never_moves_a_live_address() {
    let Some(ns) = MountNs::new(
        "netns_root_agent_that_cannot_see_the_runtimes_namespaces_never_moves_a_live_address",
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let runtime_dir = tmp.path().join("runtime-netns");
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&runtime_dir).expect("runtime dir");
    std::fs::create_dir_all(&data).expect("data dir");
    // The agent's view of the runtime's directory: an empty tmpfs.
    ns.mount_tmpfs(&runtime_dir, "1m");
    let agent = Agent::start(
        &data,
        AgentOptions {
            prefix: ns.prefix(),
            ..AgentOptions::default()
        },
    );
    let conf = conf(&data, agent.socket());

    let a = Sandbox::new(&runtime_dir.join("sandbox-a"));
    let first = add("A", &a, &conf);
    assert!(first.ok(), "{first:?}");
    assert_eq!(first.ips(), ["10.75.0.2"]);
    // The pod is rebuilt while its old sandbox is still being torn down.
    let b = Sandbox::new(&runtime_dir.join("sandbox-b"));
    let second = add("B", &b, &conf);
    assert_eq!(
        second.error_code(),
        Some(11),
        "two live sandboxes must not share 10.75.0.2: {second:?}"
    );
    assert!(
        second
            .stdout
            .contains("still configured in its older sandbox"),
        "{second:?}"
    );
    assert!(
        agent
            .log()
            .iter()
            .any(|l| l
                .contains("cannot see the network namespace the container runtime just created")),
        "the agent says what to mount: {:?}",
        agent.log()
    );
    // Once the old sandbox is gone, the address moves.
    drop(a);
    let third = add("B", &b, &conf);
    assert!(third.ok(), "{third:?}");
    assert_eq!(third.ips(), ["10.75.0.2"]);
    // Every answer came from the agent: no fallback, no wait for its lock.
    assert!(!data.join("nv/fallbacks").exists(), "no fallback");
    let metrics = agent.metrics();
    assert!(
        metrics.contains(r#"ipkeep_agent_requests_total{command="ADD",outcome="error"} 1"#)
            && metrics.contains(r#"ipkeep_agent_requests_total{command="ADD",outcome="ok"} 2"#),
        "{metrics}"
    );
    drop(agent);
}
