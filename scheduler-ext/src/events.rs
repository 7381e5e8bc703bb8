//! Events for pins that were not applied, published off the request path: the webhook queues
//! them, this task writes them, so a slow API server never slows pod admission.

use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::webhook::SkippedPin;

/// The Events' reporting controller.
pub const REPORTER: &str = "ipkeep-scheduler-ext";

/// Publishes every queued skipped pin as a Warning Event `PinSkipped` on its
/// PersistentPodState, until the queue closes.
pub async fn publish(client: Client, identity: String, mut queue: mpsc::Receiver<SkippedPin>) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTER.into(),
            instance: Some(identity),
        },
    );
    while let Some(skipped) = queue.recv().await {
        let event = Event {
            type_: EventType::Warning,
            reason: "PinSkipped".into(),
            note: Some(skipped.message.chars().take(1000).collect()),
            action: "Admit".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &skipped.regarding).await {
            tracing::warn!(error = %e, pod = skipped.pod, "failed to publish a PinSkipped event");
        }
    }
}
