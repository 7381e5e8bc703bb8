//! What large PersistentPodStates cost the node agent and the scheduler extension: 30 objects
//! of about 1.3 MB (10,000 `spec.persistentPodAnnotations` keys, what the CRD accepted before
//! its bounds, and what stays stored after them) in one namespace, on a real kube-apiserver.
//! Each binary, started fresh, syncs with them and its peak resident memory (`VmHWM`) stays
//! within half its container's limit: 64 MiB of the agent's 128 MiB, 128 MiB of the
//! extension's 256 MiB. Neither reads those keys, nor holds a list page of more than a few
//! objects at once.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipkeep_tests::agent::{Agent, AgentOptions};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

const MIB: u64 = 1 << 20;
const OBJECTS: usize = 30;
const KEYS: usize = 10_000;

/// A `kB` line of `/proc/<pid>/status`, in bytes.
fn proc_status(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The scheduler extension, killed when dropped.
struct Ext(Child);

impl Drop for Ext {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(s, "GET {path} HTTP/1.0\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

async fn wait(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_persistent_pod_states_cost_what_is_read() {
    let Some(ns) =
        ipkeep_tests::apiserver::namespace("large_persistent_pod_states_cost_what_is_read", "big")
            .await
    else {
        return;
    };
    let client = ns.client.clone();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let keys: Vec<_> = (0..KEYS)
        .map(|i| json!({"key": format!("example.com/k{i:06}-{}", "a".repeat(100))}))
        .collect();
    let mut size = 0;
    ipkeep_tests::loose_crd::with_loose_crd(&client, async || {
        for i in 0..OBJECTS {
            let object = json!({
                "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
                "metadata": {"name": format!("s{i}"), "namespace": ns.name},
                "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": format!("s{i}")},
                         "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
                         "persistentPodAnnotations": keys}
            });
            size = object.to_string().len();
            ipkeep_tests::loose_crd::write(&client, object, None).await;
        }
    })
    .await;
    eprintln!(
        "{OBJECTS} PersistentPodStates of {:.2} MB each",
        size as f64 / 1e6
    );

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = ns.kubeconfig_file(dir.path());
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let agent = Agent::start(&data, AgentOptions::kubernetes(&kubeconfig, "n1", "60s"));
    wait("the agent synced", Duration::from_secs(60), || {
        agent.get("/readyz").contains("kubernetes: synced")
    })
    .await;
    let agent_peak = proc_status(agent.pid(), "VmHWM:").unwrap();
    drop(agent);

    let bin = ipkeep_tests::workspace_bin(
        "ipkeep-scheduler-ext",
        "IPKEEP_SCHEDULER_EXT_BIN",
        &["ipkeep-scheduler-ext"],
    );
    let listen = ipkeep_tests::free_addr();
    let ext = Ext(Command::new(bin)
        .args(["--insecure-http", "--listen", &listen.to_string()])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    wait(
        "the scheduler extension synced",
        Duration::from_secs(60),
        || {
            let answer = get(listen, "/readyz");
            answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200")
        },
    )
    .await;
    let ext_peak = proc_status(ext.0.id(), "VmHWM:").unwrap();
    drop(ext);

    eprintln!(
        "peak resident memory once synced: ipkeep-agent {:.1} MiB, ipkeep-scheduler-ext {:.1} MiB",
        agent_peak as f64 / MIB as f64,
        ext_peak as f64 / MIB as f64
    );
    assert!(
        agent_peak <= 64 * MIB,
        "ipkeep-agent peaked at {} MiB",
        agent_peak / MIB
    );
    assert!(
        ext_peak <= 128 * MIB,
        "ipkeep-scheduler-ext peaked at {} MiB",
        ext_peak / MIB
    );
}
