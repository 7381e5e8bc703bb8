//! What every reconcile shares: the client, the caches, the Events recorder, the metrics, and the
//! statuses this replica wrote but its cache may not show yet.

use std::collections::HashMap;
use std::sync::Mutex;

use ipkeep_api::PersistentPodStateStatus;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use crate::admission_plan::Plans;
use crate::caches::Caches;
use crate::metrics::Metrics;
use crate::pending;

/// Shared by every loop.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Watch caches.
    pub caches: Caches,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: std::sync::Arc<Metrics>,
    /// Status last written per PersistentPodState UID, until the cache shows it.
    ///
    /// The cache can lag behind our own write; computing the next status from a stale cache
    /// could drop a record written a moment ago. Only this replica (the leader) writes status,
    /// so its own last write is the newest status there is.
    written: Mutex<HashMap<String, PersistentPodStateStatus>>,
    /// The admission plans the record loop decided ([`crate::admission_plan`]).
    pub plans: Plans,
    /// Namespaces whose admission plan is to be written again.
    plan_namespaces: pending::Sender<ObjectRef<Namespace>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// Builds the context; `plan_namespaces` receives the namespaces whose admission plan is
    /// to be written again.
    pub fn new(
        client: Client,
        caches: Caches,
        recorder: Recorder,
        metrics: std::sync::Arc<Metrics>,
        plan_namespaces: pending::Sender<ObjectRef<Namespace>>,
    ) -> Self {
        Self {
            client,
            caches,
            recorder,
            metrics,
            written: Mutex::default(),
            plans: Plans::default(),
            plan_namespaces,
        }
    }

    /// Asks for the admission plan of `namespace` to be written again.
    pub fn plan_namespace(&self, namespace: &str) {
        self.plan_namespaces.trigger(ObjectRef::new(namespace));
    }

    /// The newest status of PPS `uid`: our last write if the cache has not caught up with it.
    pub fn newest_status(
        &self,
        uid: &str,
        cached: Option<&PersistentPodStateStatus>,
    ) -> PersistentPodStateStatus {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get(uid) {
            Some(ours) if Some(ours) == cached => written.remove(uid).unwrap_or_default(),
            Some(ours) => ours.clone(),
            None => cached.cloned().unwrap_or_default(),
        }
    }

    /// Publishes an Event about `regarding`, its note cut to 1,000 characters; a failure is
    /// logged, never fails the reconcile. `action` names what the controller did (`Reconcile`,
    /// `Generate`, `Decode`).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        action: &str,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            warn!(error = %e, reason, "failed to publish event");
        }
    }

    /// Remembers a status we wrote.
    pub fn wrote_status(&self, uid: &str, status: PersistentPodStateStatus) {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_string(), status);
    }
}
