//! Writes the `PreparingDelete` marks of [`crate::deletion`]: the server's only write to the API.
//! Marks are queued (at most [`QUEUE`]; more are dropped, and the next refusal of the same
//! deletion marks again) and written one at a time by one task, so no admission request waits
//! for the API server. Each mark is a merge patch of the pod's state label and its two lifecycle
//! annotations (since when, and what was held), with the pod's UID as a precondition.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ipkeep_placement::ipkeep_lifecycle::{HELD_ANNOTATION, SINCE_ANNOTATION, STATE_LABEL, State};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::mpsc;

use crate::deletion::Mark;

/// Marks waiting to be written.
pub const QUEUE: usize = 256;
/// A pod marked this recently is not marked again (the cache may not show the mark yet).
const REMEMBER: Duration = Duration::from_secs(60);

/// The sending side.
#[derive(Debug, Clone)]
pub struct Marker {
    queue: mpsc::Sender<Mark>,
}

impl Marker {
    /// Starts the writing task.
    pub fn spawn(client: Client) -> Self {
        let (queue, marks) = mpsc::channel(QUEUE);
        tokio::spawn(write(client, marks));
        Self { queue }
    }

    /// Queues a mark; never waits.
    pub fn send(&self, mark: Mark) {
        if let Err(e) = self.queue.try_send(mark) {
            tracing::warn!(error = %e, "PreparingDelete mark not queued; the next refusal marks again");
        }
    }
}

async fn write(client: Client, mut marks: mpsc::Receiver<Mark>) {
    let params = PatchParams::default();
    let params = PatchParams {
        field_manager: Some("ipkeep-scheduler-ext".into()),
        ..params
    };
    let mut recent: HashMap<String, Instant> = HashMap::new();
    while let Some(mark) = marks.recv().await {
        recent.retain(|_, at| at.elapsed() < REMEMBER);
        if recent.contains_key(&mark.uid) {
            continue;
        }
        let patch = serde_json::json!({"metadata": {
            "uid": mark.uid,
            "labels": {STATE_LABEL: State::PreparingDelete.as_str()},
            "annotations": {
                SINCE_ANNOTATION: mark.since.to_string(),
                HELD_ANNOTATION: mark.held.as_str(),
            },
        }});
        let api: Api<Pod> = Api::namespaced(client.clone(), &mark.namespace);
        match api.patch(&mark.name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                recent.insert(mark.uid.clone(), Instant::now());
                tracing::info!(namespace = ?mark.namespace, pod = ?mark.name, since = mark.since,
                    "deletion held by the preDelete hook; marked the pod PreparingDelete");
            }
            Err(e) => tracing::warn!(namespace = ?mark.namespace, pod = ?mark.name, error = %e,
                "failed to mark the pod PreparingDelete; the next refusal marks again"),
        }
    }
}
