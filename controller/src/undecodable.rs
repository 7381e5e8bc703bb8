//! `Undecodable` Events: a Warning on each PersistentPodState that ipkeep cannot decode, once
//! per resource version (and again after the controller restarts; a version replaced before its
//! Event went out gets none, its successor does), saying where and why and what ipkeep does
//! meanwhile. Only the controller may write Events; the node agents and the
//! scheduler extension count such objects and log them. Once one is deleted (or decodes
//! again), the StatefulSet of its name is reconciled for auto-generation: it stood aside for
//! the object, and nothing else tells it the object went.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use ipkeep_api::PersistentPodState;
use ipkeep_daemon::lenient::{Report, Undecodable};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use crate::context::Context;
use crate::pending;

/// The Event's reason.
pub const REASON: &str = "Undecodable";

/// The Event's note for `object`.
pub fn note(object: &Undecodable) -> String {
    format!(
        "ipkeep cannot decode this PersistentPodState ({}); until it is fixed or deleted, ipkeep leaves it out: no records are written, its pods are not pinned and have no lifecycle hooks, and no node agent releases a held address in this namespace on Kubernetes' word",
        object.error
    )
}

/// The objects found undecodable, waiting for [`announce`], by namespace and name: the newest
/// version found of each.
pub type Found = pending::Receiver<(String, String), Box<Undecodable>>;

/// Where the PersistentPodState watch's reports go: an object found to [`announce`], the
/// StatefulSet named like one gone to the generate loop (`regenerate`).
pub fn route(
    found: pending::Sender<(String, String), Box<Undecodable>>,
    regenerate: pending::Sender<ObjectRef<StatefulSet>>,
) -> impl Fn(Report) + Send + Sync + 'static {
    move |report| match report {
        Report::Found(object) => {
            let meta = &object.meta;
            let key = (
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            );
            found.send(key, object);
        }
        Report::Gone(namespace, name) => {
            regenerate.trigger(ObjectRef::new(&name).within(&namespace));
        }
    }
}

/// Publishes an [`REASON`] Event for each object found, until `stop` resolves.
pub async fn announce(ctx: Arc<Context>, found: Found, stop: impl Future<Output = ()>) {
    let mut found = std::pin::pin!(found.take_until(stop));
    while let Some((_, object)) = found.next().await {
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
