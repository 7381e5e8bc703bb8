//! Reconciling a StatefulSet into the PersistentPodState its annotations, or its namespace's
//! label, ask for: gather from the caches, decide ([`autogen::decide`], where the rules of
//! ownership, adoption and standing aside are), apply.
//!
//! Kubernetes' StatefulSets and OpenKruise's Advanced StatefulSets run the same loop, each from
//! its own cache ([`GeneratesFor`]).
//!
//! The generated PersistentPodState is named after the StatefulSet and carries a controller
//! ownerReference to it, so deleting the StatefulSet garbage-collects it. Its spec is written by
//! server-side apply; deletions carry its UID as a precondition.

use std::sync::Arc;
use std::time::Duration;

use ipkeep_api::kruise::AdvancedStatefulSet;
use ipkeep_api::statefulset::Workload;
use ipkeep_api::{PersistentPodState, PersistentPodStateSpec};
use ipkeep_placement::autogen::{self, Existing, GenerateAction, GenerateInput, Refusal};
use ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use crate::context::Context;
use crate::{Error, FIELD_MANAGER};

/// The metric label of this loop.
pub const LOOP: &str = "generate";

/// A StatefulSet the generate loop reconciles: Kubernetes' or OpenKruise's.
pub trait GeneratesFor:
    Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// Which one.
    const WORKLOAD: Workload;
}

impl GeneratesFor for StatefulSet {
    const WORKLOAD: Workload = Workload::Native;
}

impl GeneratesFor for AdvancedStatefulSet {
    const WORKLOAD: Workload = Workload::Kruise;
}

/// Reconciles one StatefulSet's generated PersistentPodState.
#[instrument(skip_all, fields(statefulset = ?sts.name_any(), namespace = sts.namespace().unwrap_or_default(), workload = ?K::WORKLOAD))]
pub async fn reconcile<K: GeneratesFor>(sts: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(LOOP);
    ctx.caches.wait_until_ready().await?;
    let name = sts.name_any();
    let namespace = sts.namespace().ok_or(Error::MissingMeta("namespace"))?;
    let uid = sts.uid().ok_or(Error::MissingMeta("uid"))?;
    // Gather.
    let caches = &ctx.caches;
    let existing = caches.pps.get(&ObjectRef::new(&name).within(&namespace));
    let targeting: Vec<Arc<PersistentPodState>> = caches
        .pps_targeting(&namespace, K::WORKLOAD, &name)
        .iter()
        .filter_map(|r| caches.pps.get(r))
        .collect();
    let targeting: Vec<&PersistentPodState> = targeting.iter().map(AsRef::as_ref).collect();
    let namespace_labels = caches.namespace_labels(&namespace);
    let input = GenerateInput {
        workload: K::WORKLOAD,
        name: &name,
        namespace: &namespace,
        uid: &uid,
        annotations: sts.meta().annotations.as_ref(),
        deleting: sts.meta().deletion_timestamp.is_some(),
        namespace_labels: namespace_labels.as_ref(),
        existing: match &existing {
            Some(pps) => Existing::Decoded(pps),
            None if caches.undecodable_pps.contains(&namespace, &name) => Existing::Undecodable,
            None => Existing::Absent,
        },
        targeting: &targeting,
    };
    let action = autogen::decide(&input);
    let next = act(sts.as_ref(), &ctx, &action).await?;
    if let Some(notice) = action.notice(&input) {
        let type_ = if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let regarding = sts.object_ref(&());
        ctx.publish(&regarding, "Generate", type_, notice.reason, &notice.note)
            .await;
    }
    Ok(next)
}

/// Carries out `action` for `sts`: the API writes and the log line.
async fn act<K: GeneratesFor>(
    sts: &K,
    ctx: &Context,
    action: &GenerateAction,
) -> Result<Action, Error> {
    let (name, namespace) = (sts.name_any(), sts.namespace().unwrap_or_default());
    let api: Api<PersistentPodState> = Api::namespaced(ctx.client.clone(), &namespace);
    match action {
        GenerateAction::Apply {
            spec,
            adopt_marker,
            verb,
            by,
        } => {
            apply(&api, sts, spec, *adopt_marker).await?;
            info!(verb = ?verb, by = ?by, "applied the generated PersistentPodState");
        }
        GenerateAction::DeleteOwned { uid, why } => {
            info!(why = ?why, "deleting the generated PersistentPodState");
            delete(&api, &name, &namespace, uid.clone()).await?;
        }
        GenerateAction::DeleteStale { uid } => {
            info!("deleting the PersistentPodState of an earlier StatefulSet");
            delete(&api, &name, &namespace, uid.clone()).await?;
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        // The annotations are anyone's with write access to the StatefulSet: the plain log
        // format keeps the error on its line (ipkeep_daemon::OneLineFields).
        GenerateAction::Refuse(Refusal::Invalid(e)) => {
            warn!(error = %e, "cannot generate a PersistentPodState");
        }
        GenerateAction::Refuse(Refusal::NotOwned(_)) => {
            warn!(pps = ?name, hint = "to take it over, annotate the StatefulSet ipkeep.dev/adopt-persistent-pod-state=true; to start afresh, delete it", "PersistentPodState not owned; not overwritten");
        }
        GenerateAction::StandAside(why) => debug!(why = ?why, "nothing to generate"),
        GenerateAction::Unchanged => {}
    }
    Ok(Action::await_change())
}

/// What the controller does after a failed reconcile: count it and retry with backoff.
pub fn error_policy<K: GeneratesFor>(sts: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(LOOP, error);
    warn!(statefulset = ?sts.name_any(), namespace = sts.namespace().unwrap_or_default(), error = %error, kind = error.kind(), "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Applies `spec` as the PersistentPodState named after `sts`, controlled by it.
async fn apply<K: GeneratesFor>(
    api: &Api<PersistentPodState>,
    sts: &K,
    spec: &PersistentPodStateSpec,
    adopt_marker: bool,
) -> Result<(), Error> {
    let (name, namespace) = (sts.name_any(), sts.namespace().unwrap_or_default());
    let owner = sts
        .controller_owner_ref(&())
        .ok_or(Error::MissingMeta("name or uid"))?;
    let mut metadata =
        serde_json::json!({"name": name, "namespace": namespace, "ownerReferences": [owner]});
    if adopt_marker {
        metadata["annotations"] = serde_json::json!({ ADOPT_PERSISTENT_POD_STATE: "true" });
    }
    let body = serde_json::json!({
        "apiVersion": PersistentPodState::api_version(&()),
        "kind": PersistentPodState::kind(&()),
        "metadata": metadata,
        "spec": spec,
    });
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| {
        Error::api(
            "apply the generated",
            format!("persistentpodstate {namespace}/{name}"),
            e,
        )
    })?;
    Ok(())
}

/// Deletes PersistentPodState `name` if its UID is still `uid`; one already gone is fine.
async fn delete(
    api: &Api<PersistentPodState>,
    name: &str,
    namespace: &str,
    uid: Option<String>,
) -> Result<(), Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::api(
            "delete",
            format!("persistentpodstate {namespace}/{name}"),
            e,
        )),
    }
}
