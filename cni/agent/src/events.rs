//! Warning Events on pods for what the plugin's notices say: the one thing the agent writes to
//! the API server. A notice is queued by the request that produced it and published by one task,
//! so no CNI request ever waits for the API server; when the queue is full (the API server is
//! slow or down) a notice is dropped with a log line, which says the same.

use ipkeep_cni::plugin::Notice;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::warn;

/// How many notices may wait for the API server.
const QUEUE: usize = 256;

/// Where requests queue their notices.
#[derive(Debug, Clone)]
pub struct Notices(mpsc::Sender<Notice>);

impl Notices {
    /// Queues `notice`; drops it (with a log line) when the queue is full.
    pub fn send(&self, notice: Notice) {
        if let Err(e) = self.0.try_send(notice) {
            warn!(error = %e, "dropped an Event for a pod: too many waiting for the API server");
        }
    }
}

/// Starts the task that publishes queued notices as Events, reported by `ipkeep-agent` on
/// `node`.
pub fn spawn(client: Client, node: &str) -> Notices {
    let (tx, mut rx) = mpsc::channel::<Notice>(QUEUE);
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "ipkeep-agent".into(),
            instance: Some(node.to_string()),
        },
    );
    let node = node.to_string();
    tokio::spawn(async move {
        while let Some(notice) = rx.recv().await {
            let (event, pod) = describe(&notice, &node);
            if let Err(e) = recorder.publish(&event, &pod).await {
                warn!(error = %e, reason = %event.reason, pod = ?pod.name, "failed to publish an Event");
            }
        }
    });
    Notices(tx)
}

/// The Event for a notice, and the pod it is about. Pure.
pub fn describe(notice: &Notice, node: &str) -> (Event, ObjectReference) {
    match notice {
        Notice::OutsideRanges {
            pod,
            ip,
            ranges,
            new_ips,
        } => {
            let got = new_ips
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let note = format!(
                "ipkeep could not keep this pod's IP {ip} on node {node}: it is outside the node's current pod range(s) {ranges} (the node was re-registered with another pod CIDR, or its CNI configuration's range changed). The pod got {got} instead, and the old address was released."
            );
            let event = Event {
                type_: EventType::Warning,
                reason: "IPNotKept".into(),
                note: Some(note),
                action: "AllocateIP".into(),
                secondary: None,
            };
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(pod.namespace.clone()),
                name: Some(pod.name.clone()),
                uid: pod.uid.clone(),
                ..ObjectReference::default()
            };
            (event, reference)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use ipkeep_ipam::PodRef;

    use super::*;

    #[test]
    fn an_address_outside_the_ranges_becomes_a_warning_on_the_pod() {
        let notice = Notice::OutsideRanges {
            pod: PodRef {
                namespace: "db".into(),
                name: "kv-1".into(),
                uid: Some("u-2".into()),
                persistent_pod_state: Some("kv".into()),
                persistent_pod_state_uid: None,
                confirmed: true,
            },
            ip: "10.244.1.5".parse().unwrap(),
            ranges: "10.244.3.1-10.244.3.254".into(),
            new_ips: vec!["10.244.3.2".parse().unwrap()],
        };
        let (event, pod) = describe(&notice, "node-1");
        assert_eq!(event.type_, EventType::Warning);
        assert_eq!(event.reason, "IPNotKept");
        let note = event.note.unwrap();
        assert!(note.contains("10.244.1.5 on node node-1"), "{note}");
        assert!(note.contains("10.244.3.1-10.244.3.254"), "{note}");
        assert!(note.contains("got 10.244.3.2 instead"), "{note}");
        assert_eq!(
            (
                pod.kind.as_deref(),
                pod.namespace.as_deref(),
                pod.name.as_deref(),
                pod.uid.as_deref()
            ),
            (Some("Pod"), Some("db"), Some("kv-1"), Some("u-2"))
        );
    }
}
