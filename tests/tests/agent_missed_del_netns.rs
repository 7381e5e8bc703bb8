//! The node agent's missed-DEL sweep against a real kube-apiserver, with the agent in a
//! private mount namespace where a tmpfs hides the directory the "runtime" keeps its sandboxes'
//! network namespaces in (real ones, bind-mounted on files). Needs root; skips loudly without.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::mountns::{MountNs, SandboxNetns};
use ipkeep_tests::workload::cluster;
use ipkeep_tests::{Invocation, ipkeep_bin, with_agent_socket};

fn conf(data: &Path, socket: &Path) -> String {
    let base = format!(
        r#"{{"cniVersion":"1.0.0","name":"k8s","runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{"ipkeep.dev/ip-retention":"1h"}}}},"ipam":{{"type":"ipkeep","dataDir":"{}","maxUnmanagedRetention":"1h","ranges":[[{{"subnet":"10.91.0.0/24"}}]]}}}}"#,
        data.display()
    );
    with_agent_socket(&base, socket)
}

/// Found by review: the agent took a sandbox whose namespace it could not see for gone. Its pod
/// has left the API (a force delete, say) but the sandbox still runs: the sweep must not apply
/// the DEL that "never came" and free its address under it. Where the agent does see the
/// runtime's directory, a sandbox that is really gone still gets its DEL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netns_root_the_sweep_applies_no_missed_del_to_a_sandbox_it_cannot_see() {
    let Some(ns) =
        MountNs::new("netns_root_the_sweep_applies_no_missed_del_to_a_sandbox_it_cannot_see")
    else {
        return;
    };
    let Some(c) = cluster().await else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (hidden, visible, data) = (
        tmp.path().join("hidden-netns"),
        tmp.path().join("visible-netns"),
        tmp.path().join("data"),
    );
    for dir in [&hidden, &visible, &data] {
        std::fs::create_dir_all(dir).unwrap();
    }
    ns.mount_tmpfs(&hidden, "1m");
    let options = AgentOptions {
        prefix: ns.prefix(),
        ..AgentOptions::kubernetes(&c.kubeconfig_file(tmp.path()), "n1", "1s")
    };
    let agent = Agent::start(&data, options);
    let conf = conf(&data, agent.socket());
    let alive = SandboxNetns::new(&hidden.join("sandbox-alive"));
    let gone = SandboxNetns::new(&visible.join("sandbox-gone"));
    for (cid, pod, sandbox) in [("alive", "db-0", &alive), ("gone", "db-1", &gone)] {
        let args = format!("K8S_POD_NAMESPACE={};K8S_POD_NAME={pod}", c.ns);
        let mut inv = Invocation::new("ADD", cid).args(&args);
        inv.netns = sandbox.path();
        let out = inv.run(&ipkeep_bin(), &conf);
        assert!(out.ok(), "{out:?}");
    }
    // Neither pod is in the API. db-1's sandbox goes without a DEL; db-0's keeps running.
    drop(gone);
    tokio::time::sleep(Duration::from_secs(7)).await;
    let now = agent.leases("k8s");
    let log = agent.log().join("\n");
    assert!(
        now.iter()
            .any(|(_, pod, st)| pod == "db-0" && st == "active"),
        "the live sandbox keeps its address: {now:?}\n{log}"
    );
    assert!(
        !now.iter()
            .any(|(_, pod, st)| pod == "db-1" && st == "active"),
        "the gone sandbox got its DEL: {now:?}\n{log}"
    );
    assert!(agent.metrics().contains("ipkeep_agent_kubernetes_synced 1"));
    drop(alive);
}
