//! A held address goes back only to a pod of the PersistentPodState it was held for (the
//! security review's L-2), through the real `ipkeep` and `ipkeep-agent` on a real API server
//! (no kubelet: the test creates the pods and runs the CNI commands a kubelet would cause). A
//! pod of the held name that no state manages, or that names the StatefulSet but not its UID,
//! gets a new address and leaves the holding alone, at its ADD and at its DEL; and such a pod
//! in the API does not decide the late DEL of the sandbox of the pod whose name it took.

use std::path::Path;
use std::time::{Duration, Instant};

use ipkeep_api::PersistentPodState;
use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::apiserver::{self, TestNamespace};
use ipkeep_tests::{Invocation, PluginOutput, ipkeep_bin};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The UID of StatefulSet `db`, as its PersistentPodState records it.
const STS_UID: &str = "5b0e1c6a-0000-4000-8000-0000000000d8";
const NET: &str = "held";
const POD: &str = "db-7";

/// A node with its agent watching the API server, a PersistentPodState `db` for StatefulSet
/// `db` holding for 1 h, and `db-7` recorded on the node.
struct Node1 {
    t: TestNamespace,
    node: String,
    agent: Agent,
    data: tempfile::TempDir,
    _kube: tempfile::TempDir,
}

async fn node(test: &str) -> Option<Node1> {
    let t = apiserver::namespace(test, "held").await?;
    let node = format!("node-{}", t.name);
    let n: Node = serde_json::from_value(json!({"metadata": {"name": node}})).expect("a Node");
    Api::<Node>::all(t.client.clone())
        .create(&PostParams::default(), &n)
        .await
        .expect("create the Node");
    let pps: PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db", "namespace": t.name},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
                 "ipRetention": "1h"}
    }))
    .expect("a PersistentPodState");
    Api::<PersistentPodState>::namespaced(t.client.clone(), &t.name)
        .create(&PostParams::default(), &pps)
        .await
        .expect("create the PersistentPodState");
    let data = tempfile::tempdir().expect("tempdir");
    let kube = tempfile::tempdir().expect("tempdir");
    let kubeconfig = t.kubeconfig_file(kube.path());
    let agent = Agent::start(
        data.path(),
        AgentOptions::kubernetes(&kubeconfig, &node, "1h"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !agent.get("/readyz").contains("kubernetes: synced") {
        assert!(
            Instant::now() < deadline,
            "the agent did not sync in 60 s:\n{}",
            agent.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Node1 {
        t,
        node,
        agent,
        data,
        _kube: kube,
    })
}

impl Node1 {
    /// Creates pod `db-7` on the node, controlled by StatefulSet `db` with UID `owner` (no
    /// owner with `None`); returns its UID once the agent has had time to see it.
    async fn create_pod(&self, owner: Option<&str>) -> String {
        let owners = owner.map_or(json!([]), |uid| {
            json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                    "uid": uid, "controller": true}])
        });
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": POD, "ownerReferences": owners,
                         "labels": {"apps.kubernetes.io/pod-index": "7"}},
            "spec": {"nodeName": self.node,
                     "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .expect("a pod");
        let created = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create the pod");
        // The agent's pod watch delivers in milliseconds; each ADD below also checks that the
        // agent judged the pod (its word is recorded as confirmed).
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        created.metadata.uid.expect("a UID")
    }

    /// Deletes pod `db-7` at once, as `kubectl delete --force --grace-period=0` does.
    async fn delete_pod(&self) {
        self.pods()
            .delete(POD, &DeleteParams::default().grace_period(0))
            .await
            .expect("delete the pod");
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }

    /// Records `db-7` on this node in the PersistentPodState, for the pod with UID `uid` (what
    /// the controller does when the pod is Ready).
    async fn record(&self, uid: &str) {
        let status = json!({"status": {"targetUID": STS_UID, "podStates": {
            POD: {"nodeName": self.node, "podUID": uid}
        }}});
        Api::<PersistentPodState>::namespaced(self.t.client.clone(), &self.t.name)
            .patch_status("db", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("record db-7");
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.t.client.clone(), &self.t.name)
    }

    fn conf(&self) -> String {
        conf(self.data.path(), self.agent.socket())
    }

    /// One CNI command for sandbox `cid` of the pod with UID `uid`.
    fn cni(&self, command: &str, cid: &str, uid: &str) -> PluginOutput {
        let sandbox = Sandbox {
            pod: POD,
            netns: Invocation::new(command, cid).netns,
        };
        self.cni_with(&self.conf(), &sandbox, command, cid, uid)
    }

    /// [`Node1::cni`] with the network configuration `conf`, for the pod and network namespace
    /// of `sandbox`.
    fn cni_with(
        &self,
        conf: &str,
        sandbox: &Sandbox<'_>,
        command: &str,
        cid: &str,
        uid: &str,
    ) -> PluginOutput {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid}",
            self.t.name, sandbox.pod
        );
        let mut invocation = Invocation::new(command, cid).args(&args);
        invocation.netns = sandbox.netns;
        let out = invocation.run(&ipkeep_bin(), conf);
        assert!(out.ok(), "{command} {cid}: {out:?}");
        out
    }

    /// ADD of sandbox `cid`: its address.
    fn add(&self, cid: &str, uid: &str) -> String {
        let ips = self.cni("ADD", cid, uid).ips();
        assert_eq!(ips.len(), 1, "{ips:?}");
        ips[0].clone()
    }

    /// The lease of `ip`, as `ipkeep list --json` shows it through the agent.
    fn lease(&self, ip: &str) -> Option<Value> {
        let out = std::process::Command::new(ipkeep_bin())
            .arg("--agent-socket")
            .arg(self.agent.socket())
            .args(["list", "--json", "--network", NET, "--data-dir"])
            .arg(self.data.path())
            .output()
            .expect("ipkeep list");
        assert!(out.status.success(), "{out:?}");
        let list: Value = serde_json::from_slice(&out.stdout).expect("list JSON");
        list["leases"]
            .as_array()
            .expect("leases")
            .iter()
            .find(|l| l["ip"] == ip)
            .cloned()
    }

    /// Whether `ip` is held for sandbox `cid`.
    fn held_for(&self, ip: &str, cid: &str) -> bool {
        self.lease(ip)
            .is_some_and(|l| l["state"] == "held" && l["owner"]["containerId"] == cid)
    }

    /// The agent's word recorded with `ip`: `(confirmed, PersistentPodState)`.
    fn word(&self, ip: &str) -> (bool, Option<String>) {
        let lease = self.lease(ip).unwrap_or_else(|| panic!("no lease of {ip}"));
        let pod = &lease["pod"];
        (
            pod["confirmed"] == true,
            pod["persistentPodState"].as_str().map(str::to_string),
        )
    }

    fn assert_served_by_the_agent(&self) {
        assert!(
            !self.data.path().join(NET).join("fallbacks").exists(),
            "the plugin ran a command itself instead of through the agent:\n{}",
            self.agent.log().join("\n")
        );
    }
}

/// Which pod a sandbox is for, and its network namespace (`CNI_NETNS`).
struct Sandbox<'a> {
    pod: &'a str,
    netns: &'a str,
}

fn conf(data: &Path, socket: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"{NET}","ipam":{{"type":"ipkeep","dataDir":"{}","agentSocket":"{}","reuseCooldown":"0","ranges":[[{{"subnet":"10.78.0.0/29"}}]]}}}}"#,
        data.display(),
        socket.display()
    )
}

/// [`conf`] as containerd passes it for a pod without annotations: the runtime's
/// `io.kubernetes.cri.pod-annotations`, empty (a pod created before its PersistentPodState
/// existed, which the webhook never stamped).
fn conf_unstamped(data: &Path, socket: &Path) -> String {
    conf(data, socket).replacen(
        r#""ipam":"#,
        r#""runtimeConfig":{"io.kubernetes.cri.pod-annotations":{}},"ipam":"#,
        1,
    )
}

/// `db-7` of StatefulSet `db`, deleted: its address is held. Pods named `db-7` by someone
/// else, one without an owner and one naming StatefulSet `db` with another UID, come and go
/// on the node: each gets another address and frees only that one. The StatefulSet's next
/// `db-7` gets the held address back.
#[tokio::test]
async fn a_stranger_with_the_held_name_neither_gets_the_address_nor_frees_it() {
    let Some(n) = node("a_stranger_with_the_held_name_neither_gets_the_address_nor_frees_it").await
    else {
        return;
    };
    let real = n.create_pod(Some(STS_UID)).await;
    n.record(&real).await;
    let kept = n.add("real-a", &real);
    assert_eq!(n.word(&kept), (true, Some("db".into())));
    n.cni("DEL", "real-a", &real);
    assert!(n.held_for(&kept, "real-a"), "{:?}", n.lease(&kept));
    n.delete_pod().await;

    for (what, owner) in [
        ("no owner", None),
        (
            "StatefulSet db with another UID",
            Some("0d1e2a3d-0000-4000-8000-00000000beef"),
        ),
    ] {
        let stranger = n.create_pod(owner).await;
        let cid = format!("stranger-{}", owner.is_some());
        let got = n.add(&cid, &stranger);
        assert_ne!(
            got, kept,
            "db-7 with {what} got the address held for the StatefulSet's db-7"
        );
        assert_eq!(
            n.word(&got),
            (true, None),
            "the agent judges db-7 with {what} managed by nobody"
        );
        assert!(n.held_for(&kept, "real-a"), "{what}: {:?}", n.lease(&kept));
        n.cni("DEL", &cid, &stranger);
        assert!(
            n.held_for(&kept, "real-a"),
            "the DEL of db-7 with {what} touched the holding: {:?}",
            n.lease(&kept)
        );
        assert_eq!(n.lease(&got), None, "{what}: its own address is freed");
        n.delete_pod().await;
    }

    let rebuilt = n.create_pod(Some(STS_UID)).await;
    assert_eq!(
        n.add("real-b", &rebuilt),
        kept,
        "the rebuilt db-7 gets it back"
    );
    n.assert_served_by_the_agent();
}

/// `db-7` of StatefulSet `db` is force-deleted while its sandbox still runs, and someone else
/// creates a `db-7` at once. The old sandbox's DEL, which comes late, is about the deleted pod,
/// not the stranger that has its name now: the address is held for the StatefulSet's pod.
#[tokio::test]
async fn a_late_del_is_not_judged_by_the_stranger_that_took_the_name() {
    let Some(n) = node("a_late_del_is_not_judged_by_the_stranger_that_took_the_name").await else {
        return;
    };
    let real = n.create_pod(Some(STS_UID)).await;
    n.record(&real).await;
    let kept = n.add("real-a", &real);
    n.delete_pod().await;
    let stranger = n.create_pod(None).await;
    n.cni("DEL", "real-a", &real);
    assert!(
        n.held_for(&kept, "real-a"),
        "the deleted db-7's late DEL was judged by the stranger: {:?}",
        n.lease(&kept)
    );
    assert_ne!(n.add("stranger", &stranger), kept);
    n.assert_served_by_the_agent();
}

/// `db-7`, created before its PersistentPodState existed (no annotation at all), runs on the
/// node, where the agent says `db` manages it. The agent restarts, and the DEL of db-7's
/// sandbox comes before the new agent's caches have synced (here its API server does not
/// answer at all). The pod's annotations alone say nothing would keep the address; the DEL
/// leaves it with the sandbox instead. Once an agent's view is synced and shows db-7 gone, that
/// agent applies the DEL itself: the address is held for `db`, and the rebuilt db-7 gets it
/// back.
#[tokio::test]
async fn a_del_before_the_agent_has_synced_waits_for_its_view() {
    let Some(mut n) = node("a_del_before_the_agent_has_synced_waits_for_its_view").await else {
        return;
    };
    let real = n.create_pod(Some(STS_UID)).await;
    n.record(&real).await;
    // The runtime's namespaces: db-7's sandbox, and a live one of another pod, through which
    // every agent sees the directory as the runtime does.
    let netns = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| netns.path().join(name).display().to_string();
    let (db7, other) = (path("real-a"), path("keeper"));
    std::fs::write(&db7, "").expect("db-7's namespace");
    std::fs::write(&other, "").expect("another namespace");
    let db7 = Sandbox {
        pod: POD,
        netns: &db7,
    };
    let synced = conf_unstamped(n.data.path(), n.agent.socket());
    let keeper = Sandbox {
        pod: "web-0",
        netns: &other,
    };
    n.cni_with(&synced, &keeper, "ADD", "keeper", "web-uid");
    let kept = n
        .cni_with(&synced, &db7, "ADD", "real-a", &real)
        .ips()
        .remove(0);
    assert_eq!(n.word(&kept), (true, Some("db".into())));

    n.agent.kill();
    let nowhere = tempfile::tempdir().expect("tempdir");
    let kubeconfig = nowhere.path().join("kubeconfig");
    let real_kubeconfig = n.t.kubeconfig_file(n._kube.path());
    let text = std::fs::read_to_string(&real_kubeconfig).expect("the kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("a server line")
        .to_string();
    let unanswered = format!("https://127.0.0.1:{}", ipkeep_tests::free_port());
    std::fs::write(&kubeconfig, text.replace(&server, &unanswered)).expect("write");
    let blind = Agent::start(
        n.data.path(),
        AgentOptions::kubernetes(&kubeconfig, &n.node, "1s"),
    );
    assert!(
        blind.get("/readyz").contains("kubernetes: syncing"),
        "{}",
        blind.get("/readyz")
    );
    let out = n.cni_with(
        &conf_unstamped(n.data.path(), blind.socket()),
        &db7,
        "DEL",
        "real-a",
        &real,
    );
    let leases = blind.leases(NET);
    assert!(
        leases.contains(&(kept.clone(), POD.to_string(), "active".to_string())),
        "the DEL in the agent's start-up window freed the address of db-7, which db manages: {leases:?}\n{}",
        blind.log().join("\n")
    );
    assert!(
        out.stderr.contains("DEL deferred")
            || blind.log().iter().any(|l| l.contains("DEL deferred")),
        "the deferral is not said: {out:?}\n{}",
        blind.log().join("\n")
    );
    drop(blind);
    // After a DEL the runtime removes the sandbox's namespace.
    std::fs::remove_file(db7.netns).expect("remove db-7's namespace");

    n.delete_pod().await;
    n.agent = Agent::start(
        n.data.path(),
        AgentOptions::kubernetes(&real_kubeconfig, &n.node, "1s"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !n.held_for(&kept, "real-a") {
        assert!(
            Instant::now() < deadline,
            "the synced agent did not apply the deferred DEL in 60 s: {:?}\n{}",
            n.lease(&kept),
            n.agent.log().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(n.word(&kept), (true, Some("db".into())));
    let rebuilt = n.create_pod(Some(STS_UID)).await;
    assert_eq!(
        n.add("real-b", &rebuilt),
        kept,
        "the rebuilt db-7 gets it back"
    );
}
