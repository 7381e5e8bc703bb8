//! A kubelet for one node: for each pod bound to the node it runs CNI ADD (through
//! [`NodeNetwork`]) and reports the pod Running and Ready with its IPs; for a pod being deleted
//! it runs CNI DEL and then removes the pod (`gracePeriodSeconds=0`, as a kubelet does once the
//! containers are gone); a sandbox whose pod vanished (force-deleted) is torn down too. A failed
//! ADD is an Event (`FailedCreatePodSandBox`) and is retried.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;

use super::SimLog;
use crate::cni::{NodeNetwork, PodIdentity, Sandbox};

/// The kubelet of one node.
pub struct Kubelet {
    node: String,
    client: Client,
    network: Arc<NodeNetwork>,
    run_id: String,
    log: SimLog,
    sandboxes: Mutex<HashMap<String, (PodIdentity, Sandbox)>>,
    failures: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Kubelet {
    /// For `node`, with its CNI setup.
    pub fn new(
        node: &str,
        client: Client,
        network: Arc<NodeNetwork>,
        run_id: &str,
        log: SimLog,
    ) -> Self {
        Self {
            node: node.to_string(),
            client,
            network,
            run_id: run_id.to_string(),
            log,
            sandboxes: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// One pass over the pods bound to this node.
    pub async fn tick(&self) -> Result<()> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let field = format!("spec.nodeName={}", self.node);
        let pods = all.list(&ListParams::default().fields(&field)).await?;
        let mut sandboxes = self.sandboxes.lock().await;
        let seen: Vec<String> = pods.items.iter().filter_map(|p| p.uid()).collect();
        // Pods that vanished without a graceful deletion (force-deleted): tear down.
        let gone: Vec<String> = sandboxes
            .keys()
            .filter(|u| !seen.contains(u))
            .cloned()
            .collect();
        for uid in gone {
            if let Some((pod, sandbox)) = sandboxes.remove(&uid) {
                let ip = sandbox.ips.join(",");
                self.network.del(&pod, sandbox).await?;
                self.log.line(
                    &self.who(),
                    &format!("pod {}/{} gone: CNI DEL ({ip})", pod.namespace, pod.name),
                );
            }
        }
        for pod in &pods.items {
            let uid = pod.uid().unwrap_or_default();
            let identity = identity(pod);
            if pod.metadata.deletion_timestamp.is_some() {
                if let Some((id, sandbox)) = sandboxes.remove(&uid) {
                    let ip = sandbox.ips.join(",");
                    self.network.del(&id, sandbox).await?;
                    self.log.line(
                        &self.who(),
                        &format!("pod {}/{} deleted: CNI DEL ({ip})", id.namespace, id.name),
                    );
                }
                self.finish_deletion(pod).await?;
            } else if !sandboxes.contains_key(&uid) {
                match self.network.add(&identity, &self.run_id).await {
                    Ok(sandbox) => {
                        let ips = sandbox.ips.clone();
                        sandboxes.insert(uid.clone(), (identity.clone(), sandbox));
                        self.failures.lock().await.remove(&uid);
                        self.log.line(
                            &self.who(),
                            &format!(
                                "pod {}/{}: CNI ADD → {}",
                                identity.namespace,
                                identity.name,
                                ips.join(",")
                            ),
                        );
                        self.report_running(pod, &ips).await?;
                    }
                    Err(e) => self.failed(pod, &format!("{e:#}")).await,
                }
            }
        }
        Ok(())
    }

    fn who(&self) -> String {
        format!("kubelet/{}", self.node)
    }

    async fn report_running(&self, pod: &Pod, ips: &[String]) -> Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = json!({"status": {
            "phase": "Running",
            "podIP": ips[0],
            "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
            "startTime": now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
        }});
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        api.patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .with_context(|| format!("report pod {} Running", pod.name_any()))?;
        Ok(())
    }

    async fn finish_deletion(&self, pod: &Pod) -> Result<()> {
        super::delete_at_once(&self.client, pod).await.map(drop)
    }

    async fn failed(&self, pod: &Pod, why: &str) {
        let uid = pod.uid().unwrap_or_default();
        let mut failures = self.failures.lock().await;
        if failures.get(&uid).is_some_and(|w| w == why) {
            return;
        }
        failures.insert(uid, why.to_string());
        self.log.line(
            &self.who(),
            &format!("pod {}: sandbox failed: {why}", pod.name_any()),
        );
        let note = format!("Failed to create pod sandbox: {why}");
        event(
            &self.client,
            pod,
            "Warning",
            "FailedCreatePodSandBox",
            &note,
            "kubelet",
        )
        .await;
    }

    /// Tears down every sandbox without telling anyone: the machine is gone.
    pub async fn vanish(&self) {
        self.sandboxes.lock().await.clear();
    }
}

/// What the runtime passes to CNI about a pod.
fn identity(pod: &Pod) -> PodIdentity {
    PodIdentity {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        annotations: pod.annotations().clone(),
    }
}

/// Publishes a core/v1 Event about `pod` (best effort, as components do).
pub async fn event(
    client: &Client,
    pod: &Pod,
    type_: &str,
    reason: &str,
    message: &str,
    component: &str,
) {
    let namespace = pod.namespace().unwrap_or_default();
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(client.clone(), &namespace);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let event = json!({
        "metadata": {"generateName": format!("{}.", pod.name_any())},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "namespace": namespace, "uid": pod.uid()},
        "type": type_, "reason": reason, "message": message.chars().take(1000).collect::<String>(),
        "source": {"component": component}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    if let Ok(event) = serde_json::from_value(event) {
        let _ = events.create(&PostParams::default(), &event).await;
    }
}
