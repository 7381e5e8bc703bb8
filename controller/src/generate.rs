//! Reconciling a StatefulSet into the PersistentPodState its annotations, or its namespace's
//! label, ask for ([`ipkeep_placement::autogen`] decides).
//!
//! The generated PPS is named after the StatefulSet and carries a controller ownerReference to
//! it, so deleting the StatefulSet garbage-collects it. Its spec is written by server-side apply
//! and follows the annotations. A PPS with that name that the StatefulSet does not own (written
//! by hand) is never touched: the StatefulSet gets a Warning Event instead. Turning
//! auto-generation off (the annotation, or the namespace's label for a StatefulSet without the
//! annotation) deletes the PPS only if this StatefulSet owns it. A StatefulSet that only its
//! namespace's label turned on stands aside for a PPS someone wrote for it, under any name: it
//! gets none generated (a generated one is deleted), and no Warning. A StatefulSet annotated
//! `ipkeep.dev/adopt-persistent-pod-state: "true"` takes over a PPS of its name that targets it
//! and that nothing else controls (orphaned by `--cascade=orphan`, or left by an earlier
//! StatefulSet of the name), records and all, instead of being refused. A PPS of that name
//! that cannot be decoded (`ipkeep_daemon::lenient`) is never applied over, whoever wrote it.

use std::sync::Arc;
use std::time::Duration;

use ipkeep_api::PersistentPodState;
use ipkeep_placement::autogen::{GeneratedBy, generated_spec};
use ipkeep_placement::view::adopts;
use ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE;
use ipkeep_values::keys::AUTO_GENERATE;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{info, instrument, warn};

use crate::context::Context;
use crate::{Error, FIELD_MANAGER};

/// The metric label of this loop.
pub const LOOP: &str = "generate";

/// Reconciles one StatefulSet's generated PersistentPodState.
#[instrument(skip_all, fields(statefulset = ?sts.name_any(), namespace = sts.namespace().unwrap_or_default()))]
pub async fn reconcile(sts: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(LOOP);
    ctx.caches.wait_until_ready().await?;
    if sts.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change()); // garbage collection removes the PPS
    }
    let name = sts.name_any();
    let namespace = sts.namespace().ok_or(Error::MissingMeta("namespace"))?;
    let uid = sts.uid().ok_or(Error::MissingMeta("uid"))?;
    let api: Api<PersistentPodState> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = ctx
        .caches
        .pps
        .get(&ObjectRef::new(&name).within(&namespace));
    if existing.is_none() && ctx.caches.undecodable_pps.contains(&namespace, &name) {
        // It exists, and whose it is cannot be read: applying over it could take over a state
        // someone else wrote. Its own Warning Event says why; fixed, it reconciles this again.
        info!("the PersistentPodState of this name cannot be decoded; not generating over it");
        return Ok(Action::await_change());
    }
    let controller_uid = existing.as_ref().and_then(|p| {
        p.owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone())
    });
    let owned = controller_uid.as_deref() == Some(uid.as_str());

    let namespace_labels = ctx.caches.namespace_labels(&namespace);
    let generated = match generated_spec(&name, Some(sts.annotations()), namespace_labels.as_ref())
    {
        Ok(Some(generated)) => generated,
        Ok(None) => {
            if owned {
                info!("auto-generation is off; deleting the generated PersistentPodState");
                let note = format!(
                    "auto-generation is off; deleted the generated PersistentPodState {name}"
                );
                delete_generated(&sts, &ctx, &api, existing.as_deref(), &note).await?;
            }
            return Ok(Action::await_change());
        }
        Err(e) => {
            // The annotations are anyone's with write access to the StatefulSet: logged escaped.
            warn!(error = ?e.to_string(), "cannot generate a PersistentPodState");
            let note = format!("{e}; the existing PersistentPodState (if any) is left as it is");
            publish(
                &sts,
                &ctx,
                EventType::Warning,
                "InvalidPersistentPodStateAnnotations",
                &note,
            )
            .await;
            return Ok(Action::await_change());
        }
    };

    let (spec, by) = (generated.spec, generated.by);

    // The StatefulSet's adoption annotation travels to the PPS, where it keeps the records
    // through the StatefulSet's deletion for the next one of the name.
    let adopt_marker = adopts(sts.metadata.annotations.as_ref());
    let adopting = !owned
        && existing
            .as_ref()
            .is_some_and(|p| adopt_marker && adoptable(p, &name));

    // Only the namespace asked: a PPS someone wrote for this StatefulSet manages it instead.
    if by == GeneratedBy::NamespaceLabel && !adopting {
        let states = ctx.caches.pps.state();
        let theirs = states
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|p| written_for(p, &name))
            .map(|p| p.name_any())
            .min();
        if let Some(theirs) = theirs {
            if owned {
                info!(pps = ?theirs, "a PersistentPodState written for this StatefulSet manages it; deleting the generated one");
                let note = format!(
                    "PersistentPodState {theirs} was written for this StatefulSet and manages it; deleted the one generated for the namespace's label, {name}"
                );
                delete_generated(&sts, &ctx, &api, existing.as_deref(), &note).await?;
            }
            return Ok(Action::await_change());
        }
    }
    match (&existing, owned) {
        (Some(_), false) if adopting => {
            info!("adopting the PersistentPodState an earlier StatefulSet with this name left");
        }
        (Some(p), false) if is_stale_generated(p, &name) => {
            // Generated for an earlier StatefulSet with this name; garbage collection removes it,
            // we only make it quicker, then generate anew.
            info!("removing the PersistentPodState of an earlier StatefulSet with this name");
            delete(&api, &name, &namespace, p.uid()).await?;
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        (Some(_), false) => {
            let opt_out = match by {
                GeneratedBy::Annotation => "remove the auto-generate annotation".to_string(),
                GeneratedBy::NamespaceLabel => {
                    format!("annotate the StatefulSet {AUTO_GENERATE}=\"false\"")
                }
            };
            let note = format!(
                "PersistentPodState {name} exists and is not owned by this StatefulSet; it is not overwritten. To take it over with its records and held IPs, annotate the StatefulSet {}=\"true\" (it must target this StatefulSet and have no other owner); to start afresh, delete it; or {opt_out}",
                ADOPT_PERSISTENT_POD_STATE
            );
            warn!(pps = ?name, "a PersistentPodState of this name exists and is not owned by this StatefulSet; not overwritten");
            publish(
                &sts,
                &ctx,
                EventType::Warning,
                "PersistentPodStateNotOwned",
                &note,
            )
            .await;
            return Ok(Action::await_change());
        }
        (Some(p), true)
            if p.spec == spec && adopts(p.metadata.annotations.as_ref()) == adopt_marker =>
        {
            return Ok(Action::await_change());
        }
        _ => {}
    }
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
    let (reason, verb) = if adopting {
        ("PersistentPodStateAdopted", "adopted")
    } else if existing.is_some() {
        ("PersistentPodStateUpdated", "updated")
    } else {
        ("PersistentPodStateCreated", "created")
    };
    let note = match by {
        GeneratedBy::Annotation => format!("{verb} PersistentPodState {name} from the annotations"),
        GeneratedBy::NamespaceLabel => format!(
            "{verb} PersistentPodState {name}: namespace {namespace} is labelled {AUTO_GENERATE}=true"
        ),
    };
    info!(by = ?by, "{verb} the generated PersistentPodState");
    publish(&sts, &ctx, EventType::Normal, reason, &note).await;
    Ok(Action::await_change())
}

/// What the controller does after a failed reconcile: count it and retry with backoff.
pub fn error_policy(sts: Arc<StatefulSet>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(LOOP, error);
    warn!(statefulset = ?sts.name_any(), namespace = sts.namespace().unwrap_or_default(), error = ?error.to_string(), kind = error.kind(), "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Whether a StatefulSet named `name` that asks to adopt may take `pps` over: it targets a
/// StatefulSet of that name, and no controller owns it but (if any) an earlier StatefulSet of
/// that name (names are unique, so one with another UID was deleted).
fn adoptable(pps: &PersistentPodState, name: &str) -> bool {
    let target = &pps.spec.target_ref;
    let controller = pps
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    target.kind == "StatefulSet"
        && target.name == name
        && controller.is_none_or(|o| o.kind == "StatefulSet" && o.name == name)
}

/// Whether `pps` was written for StatefulSet `name` rather than generated: it targets it and no
/// StatefulSet controls it (a generated one, even one left by an earlier StatefulSet of the
/// name, is controlled by the StatefulSet it was generated for).
fn written_for(pps: &PersistentPodState, name: &str) -> bool {
    let target = &pps.spec.target_ref;
    target.kind == "StatefulSet"
        && target.name == name
        && !pps
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.kind == "StatefulSet")
}

/// A PPS controlled by another StatefulSet of the same name: left over from a deleted one.
fn is_stale_generated(pps: &PersistentPodState, name: &str) -> bool {
    pps.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "StatefulSet" && o.name == name)
}

/// Deletes the PersistentPodState generated for `sts` (`existing`, with its UID as a
/// precondition) and says why in a `PersistentPodStateDeleted` Event on the StatefulSet.
async fn delete_generated(
    sts: &StatefulSet,
    ctx: &Context,
    api: &Api<PersistentPodState>,
    existing: Option<&PersistentPodState>,
    why: &str,
) -> Result<(), Error> {
    let namespace = sts.namespace().unwrap_or_default();
    delete(
        api,
        &sts.name_any(),
        &namespace,
        existing.and_then(|p| p.uid()),
    )
    .await?;
    publish(
        sts,
        ctx,
        EventType::Normal,
        "PersistentPodStateDeleted",
        why,
    )
    .await;
    Ok(())
}

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

async fn publish(sts: &StatefulSet, ctx: &Context, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Generate".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &sts.object_ref(&())).await {
        warn!(error = ?e.to_string(), reason, "failed to publish event");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pps(target: &str, owner: Option<(&str, &str)>) -> PersistentPodState {
        let owners: Vec<serde_json::Value> = owner
            .into_iter()
            .map(|(kind, name)| {
                serde_json::json!({"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "old", "controller": true})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
            "metadata": {"name": "db", "namespace": "prod", "ownerReferences": owners},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": target}},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_persistent_pod_state_left_for_this_name_can_be_adopted() {
        assert!(adoptable(&pps("db", None), "db"), "orphaned");
        assert!(
            adoptable(&pps("db", Some(("StatefulSet", "db"))), "db"),
            "left by an earlier StatefulSet of the name"
        );
        assert!(!adoptable(&pps("web", None), "db"), "targets another");
        assert!(
            !adoptable(&pps("db", Some(("CloneSet", "db"))), "db"),
            "controlled by something else"
        );
    }

    #[test]
    fn a_persistent_pod_state_no_statefulset_controls_was_written_for_its_target() {
        assert!(written_for(&pps("db", None), "db"), "by hand");
        assert!(
            written_for(&pps("db", Some(("CloneSet", "db"))), "db"),
            "controlled by something other than a StatefulSet"
        );
        assert!(!written_for(&pps("web", None), "db"), "targets another");
        assert!(
            !written_for(&pps("db", Some(("StatefulSet", "db"))), "db"),
            "generated"
        );
    }
}
