//! Small stand-ins for the parts of a cluster ipkeep does not provide. Each one polls the API
//! server (a few times a second) and acts like its real counterpart would on what it sees; none
//! keeps state the API server does not have, except the kubelet's sandboxes, as a real kubelet.

pub mod kubelet;
pub mod podgc;
pub mod scheduler;
pub mod statefulset;

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;

/// Where the simulators say what they did (`<logs>/simulators.log`).
#[derive(Debug, Clone)]
pub struct SimLog {
    file: Arc<Mutex<File>>,
    start: Instant,
}

impl SimLog {
    /// Appends to `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
            start: Instant::now(),
        })
    }

    /// One line, stamped with the seconds since the start.
    pub fn line(&self, who: &str, what: &str) {
        let t = self.start.elapsed().as_secs_f64();
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(f, "{t:8.3}s {who:<18} {what}");
    }
}

/// Runs `tick` every `every` until the task is aborted; errors are logged and retried.
pub fn every<F, Fut>(name: String, every: Duration, log: SimLog, mut tick: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    tokio::spawn(async move {
        let mut last_error = String::new();
        loop {
            match tick().await {
                Ok(()) => last_error.clear(),
                Err(e) => {
                    let text = format!("{e:#}");
                    if text != last_error {
                        log.line(&name, &format!("error (retrying): {text}"));
                        last_error = text;
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}

/// The names of the nodes that exist.
pub async fn node_names(client: &Client) -> anyhow::Result<Vec<String>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// Deletes exactly this pod (UID precondition) without a grace period, as a kubelet does once
/// its containers are gone and PodGC does for a pod of a missing node. `Ok(false)`: the API
/// server refused (already gone, or another pod by now).
pub async fn delete_at_once(client: &Client, pod: &Pod) -> anyhow::Result<bool> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
