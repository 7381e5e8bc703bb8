//! Shared by the tests and the benchmark: realistic nodes, a PersistentPodState with a record,
//! and caches filled by hand (no API server needed).
#![allow(clippy::unwrap_used, dead_code)]

use ipkeep_api::PersistentPodState;
use ipkeep_scheduler_ext::cache::Caches;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

pub const HOST: &str = "kubernetes.io/hostname";
pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const STS_UID: &str = "9a1f0c4e-2b7d-4e1a-8f3c-5d6e7f8a9b0c";

/// A node as the API server returns it (about 3.5 KB of JSON): zone `z<i % 3>`.
pub fn node_json(i: usize) -> Value {
    let name = format!("n{i}");
    let images: Vec<Value> = (0..10)
        .map(|k| json!({"names": [format!("registry.example.com/team/app-{k}@sha256:{:064x}", k * 7919 + i), format!("registry.example.com/team/app-{k}:v1.{k}.{i}")], "sizeBytes": 104857600 + k * 1000}))
        .collect();
    let condition = |t: &str, s: &str, reason: &str| json!({"type": t, "status": s, "lastHeartbeatTime": "2026-11-21T09:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z", "reason": reason, "message": format!("kubelet reports {reason}")});
    json!({
        "metadata": {
            "name": name, "uid": format!("00000000-0000-4000-8000-{i:012}"), "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                HOST: name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.2xlarge",
                "topology.kubernetes.io/region": "eu-west-1", ZONE: format!("z{}", i % 3),
                "node-role.example.com/db": "", "disk": if i.is_multiple_of(2) { "nvme" } else { "ssd" }
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"i-{i:017x}\"}}")
            }
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256), "podCIDRs": [format!("10.{}.{}.0/24", i / 256, i % 256)], "providerID": format!("aws:///eu-west-1a/i-{i:017x}")},
        "status": {
            "capacity": {"cpu": "8", "ephemeral-storage": "104845292Ki", "hugepages-2Mi": "0", "memory": "32386500Ki", "pods": "110"},
            "allocatable": {"cpu": "7910m", "ephemeral-storage": "95551679124", "hugepages-2Mi": "0", "memory": "31369668Ki", "pods": "110"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady")
            ],
            "addresses": [{"type": "InternalIP", "address": format!("172.16.{}.{}", i / 256, i % 256)}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("ec2{i:029x}"), "bootID": format!("b{i:031x}"),
                "kernelVersion": "6.1.0-27-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.33.2", "kubeProxyVersion": "v1.33.2", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images
        }
    })
}

/// PersistentPodState `db` in `prod`: required hostname, preferred zone (weight 60), a record
/// of `db-0` on `n1` (zone z1).
pub fn pps_json() -> Value {
    json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db", "namespace": "prod", "uid": "pps-uid"},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": [HOST]},
            "preferredPersistentTopology": [{"weight": 60, "preference": {"nodeTopologyKeys": [ZONE]}}]
        },
        "status": {"targetUID": STS_UID, "podStates": {
            "db-0": {"nodeName": "n1", "nodeTopologyLabels": {HOST: "n1", ZONE: "z1"}, "podIPs": ["10.0.1.7"]}
        }}
    })
}

/// Caches holding `pps` and nodes `n0`..`n<nodes-1>`, synced.
pub async fn caches(pps: &[Value], nodes: usize) -> Caches {
    caches_with_pods(pps, nodes, &[]).await
}

/// Caches holding `pps`, nodes `n0`..`n<nodes-1>` and the pods with hooks `pods`, synced.
pub async fn caches_with_pods(pps: &[Value], nodes: usize, pods: &[Value]) -> Caches {
    let (caches, mut writers) = Caches::new(Default::default());
    writers.pps.apply_watcher_event(&Event::Init);
    for p in pps {
        let p: PersistentPodState = serde_json::from_value(p.clone()).unwrap();
        writers.pps.apply_watcher_event(&Event::InitApply(p));
    }
    writers.pps.apply_watcher_event(&Event::InitDone);
    writers.nodes.apply_watcher_event(&Event::Init);
    for i in 0..nodes {
        let n: Node = serde_json::from_value(node_json(i)).unwrap();
        writers.nodes.apply_watcher_event(&Event::InitApply(n));
    }
    writers.nodes.apply_watcher_event(&Event::InitDone);
    writers.pods.apply_watcher_event(&Event::Init);
    for p in pods {
        let mut p: Pod = serde_json::from_value(p.clone()).unwrap();
        ipkeep_placement::lifecycle::trim_pod(&mut p);
        writers.pods.apply_watcher_event(&Event::InitApply(p));
    }
    writers.pods.apply_watcher_event(&Event::InitDone);
    caches.wait_until_ready().await;
    // The writers must outlive the caches' readers only for updates; dropping them is fine.
    caches
}

/// The Service name the certificates of [`pki`] are for.
pub const SERVICE: &str = "ipkeep-scheduler-ext.ipkeep-system.svc";

pub use ipkeep_tests::pki::Pki;

/// A fresh CA and a serving certificate it signed for [`SERVICE`] and 127.0.0.1 (where
/// kube-apiserver calls the webhook in tests/webhook_admission.rs).
pub fn pki() -> Pki {
    ipkeep_tests::pki::serving(&[SERVICE])
}
