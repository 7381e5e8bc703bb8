//! `Undecodable` Events: a Warning on each PersistentPodState that ipkeep cannot decode, once
//! per resource version (and again after the controller restarts), saying where and why and
//! what ipkeep does meanwhile. Only the controller may write Events; the node agents and the
//! scheduler extension count such objects and log them. Once one is deleted (or decodes
//! again), the StatefulSet of its name is reconciled for auto-generation: it stood aside for
//! the object, and nothing else tells it the object went.

use std::sync::Arc;

use ipkeep_api::PersistentPodState;
use ipkeep_daemon::lenient::{Report, Undecodable};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::context::Context;

/// The Event's reason.
pub const REASON: &str = "Undecodable";

/// The Event's note for `object`.
pub fn note(object: &Undecodable) -> String {
    format!(
        "ipkeep cannot decode this PersistentPodState ({}); until it is fixed or deleted, ipkeep leaves it out: no records are written, its pods are not pinned and have no lifecycle hooks, and no node agent releases a held address in this namespace on Kubernetes' word",
        object.error
    )
}

/// Publishes an [`REASON`] Event for each object found, and sends the StatefulSet named like
/// each one gone to `regenerate`, until `stop` resolves.
pub async fn announce(
    ctx: Arc<Context>,
    mut reports: mpsc::UnboundedReceiver<Report>,
    regenerate: mpsc::UnboundedSender<ObjectRef<StatefulSet>>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    loop {
        let report = tokio::select! {
            report = reports.recv() => report,
            () = &mut stop => None,
        };
        let object = match report {
            None => return,
            Some(Report::Gone(namespace, name)) => {
                let _ = regenerate.send(ObjectRef::new(&name).within(&namespace));
                continue;
            }
            Some(Report::Found(object)) => *object,
        };
        let meta = &object.meta;
        let reference = ObjectReference {
            api_version: Some(PersistentPodState::api_version(&()).into_owned()),
            kind: Some(PersistentPodState::kind(&()).into_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            ..ObjectReference::default()
        };
        ctx.publish(
            &reference,
            "Decode",
            EventType::Warning,
            REASON,
            &note(&object),
        )
        .await;
    }
}
