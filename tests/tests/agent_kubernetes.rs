//! The node agent against a real kube-apiserver with the real controller: holdings on its
//! node are released within seconds when the controller prunes their record (scale down,
//! `WhenScaled`) or the StatefulSet and its PersistentPodState are deleted; a rebuilt pod whose
//! record stays keeps its address; pods on other nodes do not count as on this node.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::workload::*;
use ipkeep_tests::{Invocation, ipkeep_bin, with_agent_socket};
use serde_json::json;

/// The `ipkeep-controller` binary on the test's namespace, without leader election, logging to
/// `controller.log` in its directory; killed when dropped.
struct Controller {
    process: Child,
    _dir: tempfile::TempDir,
}

impl Controller {
    fn start(c: &Cluster) -> Controller {
        let dir = tempfile::tempdir().unwrap();
        let bin = ipkeep_tests::workspace_bin(
            "ipkeep-controller",
            "IPKEEP_CONTROLLER_BIN",
            &["ipkeep-controller"],
        );
        let log = std::fs::File::create(dir.path().join("controller.log")).unwrap();
        let child = Command::new(bin)
            .args(["--no-leader-election", "--listen=127.0.0.1:0"])
            .args(["--concurrency=4", "--debounce=20ms", "--log=info"])
            .env("KUBECONFIG", c.kubeconfig_file(dir.path()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Controller {
            process: child,
            _dir: dir,
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn conf(data: &Path, socket: &Path) -> String {
    conf_with(
        data,
        socket,
        r#""ipkeep.dev/persistent-pod-state":"kv","ipkeep.dev/ip-retention":"forever""#,
    )
}

/// The network with the pod annotations `annotations` (JSON members) passed by the runtime.
fn conf_with(data: &Path, socket: &Path, annotations: &str) -> String {
    let base = format!(
        r#"{{"cniVersion":"1.0.0","name":"k8s","runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{{annotations}}}}},"ipam":{{"type":"ipkeep","dataDir":"{}","ranges":[[{{"subnet":"10.90.0.0/24"}}]]}}}}"#,
        data.display()
    );
    with_agent_socket(&base, socket)
}

fn cni(ns: &str, cmd: &str, cid: &str, pod: &str, conf: &str) -> Vec<String> {
    let args = format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}");
    let out = Invocation::new(cmd, cid)
        .args(&args)
        .run(&ipkeep_bin(), conf);
    assert!(out.ok(), "{cmd} {cid}: {out:?}");
    if cmd == "ADD" { out.ips() } else { Vec::new() }
}

async fn wait_leases(
    agent: &Agent,
    what: &str,
    check: impl Fn(&[(String, String, String)]) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = agent.leases("k8s");
        if check(&now) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 30 s; leases {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_releases_what_kubernetes_says_nobody_will_use() {
    // The PersistentPodState goes with its StatefulSet by owner reference: the garbage collector.
    let Some(c) = cluster_with_gc().await else {
        return;
    };
    let controller = Controller::start(&c);
    let data = tempfile::tempdir().unwrap();
    let options = AgentOptions::kubernetes(&c.kubeconfig_file(data.path()), "n1", "2s");
    let agent = Agent::start(data.path(), options);
    let conf = conf(data.path(), agent.socket());
    let sts = create_sts(
        &c.client,
        "kv",
        3,
        0,
        &annotations(&[
            ("ipkeep.dev/auto-generate-persistent-pod-state", "true"),
            (
                "ipkeep.dev/required-persistent-topology",
                "kubernetes.io/hostname",
            ),
            ("ipkeep.dev/ip-retention", "forever"),
        ]),
    )
    .await;
    let mut ips = Vec::new();
    for i in 0..3 {
        let ip = cni(&c.ns, "ADD", &format!("s{i}"), &format!("kv-{i}"), &conf).remove(0);
        run_pod(&c.client, &sts, i, "n1", &ip).await;
        ips.push(ip);
    }
    wait_pps(&c.client, "kv", "3 records", |p| records(p).len() == 3).await;

    // A pod bound to another node is not "on this node": its address here lost its DEL, once
    // its sandbox's network namespace, which the agent saw at ADD, is gone.
    let runtime = tempfile::tempdir().unwrap();
    let sandbox = runtime.path().join("cni-w0");
    std::fs::write(&sandbox, "").unwrap();
    let args = format!("K8S_POD_NAMESPACE={};K8S_POD_NAME=web-0", c.ns);
    let mut add = Invocation::new("ADD", "w0").args(&args);
    add.netns = sandbox.to_str().unwrap();
    let added = add.run(&ipkeep_bin(), &conf);
    assert!(added.ok(), "{added:?}");
    let web = added.ips().remove(0);
    std::fs::remove_file(&sandbox).unwrap();
    let other = create_sts(&c.client, "web", 1, 0, &annotations(&[])).await;
    run_pod(&c.client, &other, 0, "n2", "10.91.0.9").await;
    wait_leases(&agent, "web-0's address no longer active here", |l| {
        !l.iter().any(|(ip, _, st)| *ip == web && st == "active")
    })
    .await;

    // Rebuild kv-1: its record stays, so its holding stays and it gets its address back.
    cni(&c.ns, "DEL", "s1", "kv-1", &conf);
    remove_pod(&c.client, "kv-1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        agent
            .leases("k8s")
            .iter()
            .any(|(ip, pod, st)| *ip == ips[1] && pod == "kv-1" && st == "held"),
        "a recorded pod's holding is kept"
    );
    assert_eq!(
        cni(&c.ns, "ADD", "s1b", "kv-1", &conf),
        vec![ips[1].clone()]
    );
    run_pod(&c.client, &sts, 1, "n1", &ips[1]).await;

    // Scale down: the controller prunes kv-2's record, the agent releases its holding.
    patch_sts(&c.client, "kv", json!({"spec": {"replicas": 2}})).await;
    cni(&c.ns, "DEL", "s2", "kv-2", &conf);
    remove_pod(&c.client, "kv-2").await;
    wait_pps(&c.client, "kv", "kv-2 pruned", |p| {
        !records(p).contains_key("kv-2")
    })
    .await;
    wait_leases(&agent, "kv-2's holding released", |l| {
        !l.iter().any(|(ip, _, _)| *ip == ips[2])
    })
    .await;
    // Scale up again: WhenScaled let the address go, so kv-2 starts afresh.
    patch_sts(&c.client, "kv", json!({"spec": {"replicas": 3}})).await;
    let fresh = cni(&c.ns, "ADD", "s2b", "kv-2", &conf).remove(0);
    assert_ne!(
        fresh, ips[2],
        "round robin moved on; the old holding was released"
    );
    run_pod(&c.client, &sts, 2, "n1", &fresh).await;

    // Delete the StatefulSet: its pods go, the PersistentPodState is collected with it, and
    // every holding of kv is released.
    for (cid, pod) in [("s0", "kv-0"), ("s1b", "kv-1"), ("s2b", "kv-2")] {
        cni(&c.ns, "DEL", cid, pod, &conf);
    }
    let sts_api: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> =
        kube::Api::default_namespaced(c.client.clone());
    sts_api
        .delete("kv", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    for pod in ["kv-0", "kv-1", "kv-2"] {
        remove_pod(&c.client, pod).await;
    }
    wait_leases(&agent, "every kv holding released", |l| {
        l.iter().all(|(_, pod, _)| !pod.starts_with("kv-"))
    })
    .await;
    let metrics = agent.metrics();
    for reason in ["record-pruned", "missed-del"] {
        assert!(
            metrics.contains(&format!(
                r#"ipkeep_agent_releases_total{{reason="{reason}"}}"#
            )),
            "{reason} counted:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("ipkeep_agent_kubernetes_synced 1"),
        "{metrics}"
    );
    drop(agent);
    drop(controller);
}

/// Found by review: a static pod's mirror Pod has another UID than the one the runtime passes
/// as `K8S_POD_UID`; the agent took its DEL for missed and gave the running pod's address to
/// another pod. The mirror Pod's `kubernetes.io/config.mirror` annotation carries the UID the
/// runtime knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_static_pod_keeps_its_address() {
    let Some(c) = cluster().await else { return };
    let data = tempfile::tempdir().unwrap();
    let options = AgentOptions::kubernetes(&c.kubeconfig_file(data.path()), "n1", "1s");
    let agent = Agent::start(data.path(), options);
    let conf = conf(data.path(), agent.socket());
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::default_namespaced(c.client.clone());
    let mirror: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "etcd-n1", "namespace": c.ns, "annotations": {
            "kubernetes.io/config.mirror": "0f1e2d3c4b5a", "kubernetes.io/config.hash": "0f1e2d3c4b5a",
            "kubernetes.io/config.source": "file"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "etcd", "image": "etcd"}]}
    }))
    .unwrap();
    pods.create(&Default::default(), &mirror).await.unwrap();
    let args = format!(
        "K8S_POD_NAMESPACE={};K8S_POD_NAME=etcd-n1;K8S_POD_UID=0f1e2d3c4b5a",
        c.ns
    );
    let out = Invocation::new("ADD", "static-1")
        .args(&args)
        .run(&ipkeep_bin(), &conf);
    assert!(out.ok(), "{out:?}");
    let ip = out.ips().remove(0);
    // Well past the missed-DEL grace, with sweeps every second.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let now = agent.leases("k8s");
    assert!(
        now.iter()
            .any(|(i, pod, st)| *i == ip && pod == "etcd-n1" && st == "active"),
        "the running static pod's address stays active: {now:?}\n{}",
        agent.log().join("\n")
    );
    assert!(agent.metrics().contains("ipkeep_agent_kubernetes_synced 1"));
}

/// Found by review: an agent started with a `--node-name` no Node has sees no pod on "its"
/// node, and released every running pod's address. It must refuse to decide anything until the
/// Node exists, and say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_node_name_releases_nothing() {
    let Some(c) = cluster().await else { return };
    let data = tempfile::tempdir().unwrap();
    let options = AgentOptions::kubernetes(&c.kubeconfig_file(data.path()), "n1-typo", "1s");
    let agent = Agent::start(data.path(), options);
    let conf = conf(data.path(), agent.socket());
    let sts = create_sts(&c.client, "kv", 2, 0, &annotations(&[])).await;
    let mut ips = Vec::new();
    for i in 0..2 {
        let ip = cni(&c.ns, "ADD", &format!("s{i}"), &format!("kv-{i}"), &conf).remove(0);
        run_pod(&c.client, &sts, i, "n1", &ip).await;
        ips.push(ip);
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let now = agent.leases("k8s");
    for ip in &ips {
        assert!(
            now.iter().any(|(i, _, st)| i == ip && st == "active"),
            "{ip} is still active: {now:?}\n{}",
            agent.log().join("\n")
        );
    }
    assert!(
        agent
            .log()
            .iter()
            .any(|l| l.contains("ERROR") && l.contains("--node-name")),
        "the agent says what is wrong:\n{}",
        agent.log().join("\n")
    );
    assert!(
        agent.metrics().contains("ipkeep_agent_kubernetes_synced 0"),
        "{}",
        agent.metrics()
    );
}

/// Issue 30: pods created before their PersistentPodState existed carry neither the link nor
/// a retention annotation (no webhook runs here, as none stamped them). Through the agent,
/// their DEL is decided by what the API says then: the StatefulSet, annotated meanwhile, has a
/// PersistentPodState, so the address is held for its `ipRetention` and the rebuild gets it
/// back. A pod of an unmanaged StatefulSet in the same namespace, whose annotations forge the
/// link and ask for `forever`, is freed at its DEL (`ipam.maxUnmanagedRetention` 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_created_before_its_persistent_pod_state_keeps_its_address() {
    let Some(c) = cluster().await else { return };
    let controller = Controller::start(&c);
    let data = tempfile::tempdir().unwrap();
    let options = AgentOptions::kubernetes(&c.kubeconfig_file(data.path()), "n1", "1s");
    let agent = Agent::start(data.path(), options);
    let socket = agent.socket().to_path_buf();
    let plain = conf_with(data.path(), &socket, "");
    let forged = conf_with(
        data.path(),
        &socket,
        r#""ipkeep.dev/persistent-pod-state":"late","ipkeep.dev/ip-retention":"forever""#,
    );
    let late = create_sts(&c.client, "late", 2, 0, &annotations(&[])).await;
    let mut ips = Vec::new();
    for i in 0..2 {
        let ip = cni(&c.ns, "ADD", &format!("l{i}"), &format!("late-{i}"), &plain).remove(0);
        run_pod(&c.client, &late, i, "n1", &ip).await;
        ips.push(ip);
    }
    let web = create_sts(&c.client, "web", 1, 0, &annotations(&[])).await;
    let web_ip = cni(&c.ns, "ADD", "w0", "web-0", &forged).remove(0);
    run_pod(&c.client, &web, 0, "n1", &web_ip).await;

    // Adopting ipkeep on the running StatefulSet.
    patch_sts(
        &c.client,
        "late",
        json!({"metadata": {"annotations": {
            "ipkeep.dev/auto-generate-persistent-pod-state": "true",
            "ipkeep.dev/required-persistent-topology": "kubernetes.io/hostname",
            "ipkeep.dev/ip-retention": "2h"}}}),
    )
    .await;
    wait_pps(&c.client, "late", "both running pods recorded", |p| {
        records(p).len() == 2
    })
    .await;
    eventually("the agent synced", || async {
        agent
            .metrics()
            .contains("ipkeep_agent_kubernetes_synced 1")
            .then_some(())
    })
    .await;

    // The kubelet sends DEL before the pod object goes.
    for (i, ip) in ips.iter().enumerate() {
        let (cid, pod) = (format!("l{i}"), format!("late-{i}"));
        cni(&c.ns, "DEL", &cid, &pod, &plain);
        assert!(
            agent
                .leases("k8s")
                .contains(&(ip.clone(), pod.clone(), "held".into())),
            "{pod}'s first DEL holds {ip}\n{}",
            agent.log().join("\n")
        );
        remove_pod(&c.client, &pod).await;
        // The rebuilt pod exists before the kubelet sets up its sandbox: a held address goes
        // only to a pod of the StatefulSet the agent can see.
        create_pod(&c.client, &late, i32::try_from(i).unwrap(), "n1").await;
        assert_eq!(
            cni(&c.ns, "ADD", &format!("{cid}b"), &pod, &plain),
            vec![ip.clone()]
        );
        set_pod_ready(&c.client, &pod, ip, true).await;
    }

    cni(&c.ns, "DEL", "w0", "web-0", &forged);
    let now = agent.leases("k8s");
    assert!(
        !now.iter().any(|(ip, _, _)| *ip == web_ip),
        "web-0's forged link holds nothing: {now:?}"
    );
    drop(agent);
    drop(controller);
}
