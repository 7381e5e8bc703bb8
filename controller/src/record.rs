//! Reconciling a PersistentPodState: read the caches, decide the whole status and the admission
//! plan in one pure function (`ipkeep_placement::status`), hand the plan to the admission plan
//! loop ([`crate::admission_plan`]), write the status by server-side apply if it changed, then
//! publish Events and metrics for what changed and delete the pods a fallen-back pin stranded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ipkeep_api::statefulset::Workload;
use ipkeep_api::{PersistentPodState, PersistentPodStateStatus};
use ipkeep_placement::condition::{self, ADMISSION_PLANNED, READY};
use ipkeep_placement::record::{self, RecordChange};
use ipkeep_placement::status::{self, StatusInput, Verdict};
use ipkeep_placement::view::{NodeView, PodView, TargetView, adopts};
use ipkeep_values::keys::ADOPT_PERSISTENT_POD_STATE;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use crate::context::Context;
use crate::{Error, FIELD_MANAGER};

/// The metric label of this loop.
pub const LOOP: &str = "record";

/// The `action` of the Events about PersistentPodStates.
pub const ACTION: &str = "Reconcile";

/// Reconciles one PersistentPodState: reads the caches, decides the status
/// ([`status::reconcile`]), writes it, publishes what changed and deletes stranded pods.
#[instrument(skip_all, fields(pps = ?pps.name_any(), namespace = pps.namespace().unwrap_or_default()))]
pub async fn reconcile(pps: Arc<PersistentPodState>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(LOOP);
    ctx.caches.wait_until_ready().await?;
    if pps.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = pps.name_any();
    let namespace = pps.namespace().ok_or(Error::MissingMeta("namespace"))?;
    let uid = pps.uid().ok_or(Error::MissingMeta("uid"))?;
    let previous = ctx.newest_status(&uid, pps.status.as_ref());
    let now = now_in_whole_seconds();
    let target_name = &pps.spec.target_ref.name;
    // The target of its own workload only: an Advanced StatefulSet and an `apps` StatefulSet
    // may share a name.
    let (sts, advanced) = match pps.spec.target_ref.workload() {
        Some((Workload::Kruise, _)) => (
            None,
            ctx.caches
                .advanced
                .get(&ObjectRef::new(target_name).within(&namespace)),
        ),
        _ => (
            ctx.caches
                .statefulsets
                .get(&ObjectRef::new(target_name).within(&namespace)),
            None,
        ),
    };
    let sts = sts.filter(|s| s.meta().deletion_timestamp.is_none());
    let advanced = advanced.filter(|s| s.meta().deletion_timestamp.is_none());
    let target = sts
        .as_deref()
        .map(TargetView::from_statefulset)
        .or_else(|| advanced.as_deref().map(TargetView::from_advanced));
    let template = sts
        .as_deref()
        .and_then(|s| s.spec.as_ref())
        .map(|s| &s.template)
        .or_else(|| advanced.as_deref().and_then(|a| a.spec.template.as_ref()));
    let (pods, nodes) = gather(&ctx, &namespace, target.as_ref(), &previous);
    let mut decided = status::reconcile(&StatusInput {
        name: &name,
        namespace: &namespace,
        spec: &pps.spec,
        adopts: adopts(pps.metadata.annotations.as_ref()),
        generation: pps.meta().generation,
        previous: &previous,
        target: target.as_ref(),
        template,
        pods: &pods,
        nodes: &nodes,
        now: &now,
    });
    match &decided.verdict {
        // The spec's text is anyone's with write access to it: logged escaped (`?`).
        Verdict::InvalidSpec(e) => warn!(error = %e, "invalid spec"),
        Verdict::TargetNotFound if !previous.pod_states.is_empty() => {
            info!(
                dropped = previous.pod_states.len(),
                "target gone; clearing records"
            );
        }
        _ => {}
    }
    crate::admission_plan::plan_decided(&ctx, &pps, decided.plan.take()).await;
    write_status(&pps, &ctx, &previous, &decided.status).await?;
    publish_changes(&pps, &ctx, &decided.changes).await;
    announce_conditions(&pps, &ctx, &previous, &decided.status).await;
    for pod in &decided.stranded {
        delete_stranded(&pps, &ctx, &namespace, pod).await?;
    }
    Ok(decided.requeue.map_or_else(Action::await_change, |after| {
        Action::requeue(after + Duration::from_millis(100))
    }))
}

/// Whole seconds, as the API server stores `metav1.Time`: our remembered copy of the status
/// must compare equal to what the cache later shows, or `newest_status` would keep using the
/// copy and overwrite any change made to the status since (a record removed by hand).
fn now_in_whole_seconds() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// The pods the status is decided from (the StatefulSet's wanted ones and the recorded ones)
/// and the nodes they and the records name, from the caches.
fn gather(
    ctx: &Context,
    namespace: &str,
    target: Option<&TargetView>,
    previous: &PersistentPodStateStatus,
) -> (BTreeMap<String, PodView>, BTreeMap<String, NodeView>) {
    let mut pods = BTreeMap::new();
    for name in target
        .map(|t| record::candidate_pod_names(t, previous))
        .unwrap_or_default()
    {
        if let Some(pod) = ctx
            .caches
            .pods
            .get(&ObjectRef::new(&name).within(namespace))
        {
            pods.insert(name, PodView::from(pod.as_ref()));
        }
    }
    let mut nodes = BTreeMap::new();
    let node_names = pods
        .values()
        .filter_map(|p| p.node_name.clone())
        .chain(previous.pod_states.values().map(|r| r.node_name.clone()));
    for name in node_names {
        if let Some(node) = ctx.caches.nodes.get(&ObjectRef::new(&name)) {
            nodes.insert(name, NodeView::from_node(&node));
        }
    }
    (pods, nodes)
}

/// Deletes a pod left Pending by a pin that has fallen back (see
/// [`record::stranded_pods`]); its StatefulSet creates it again and the webhook pins the new pod
/// by preferred terms only. The UID precondition makes sure only that very pod goes.
async fn delete_stranded(
    pps: &PersistentPodState,
    ctx: &Context,
    namespace: &str,
    pod: &PodView,
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name, &params).await {
        Ok(_) => {}
        // Gone already, or replaced by a pod with another UID: nothing stranded is left.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
        Err(source) => {
            return Err(Error::api(
                "delete",
                format!("stranded pod {namespace}/{}", pod.name),
                source,
            ));
        }
    }
    ctx.metrics.stranded_pods_deleted.inc();
    warn!(pod = ?pod.name, hint = "it was Pending on a pin that fell back; its StatefulSet creates it again", "deleted a stranded pod");
    let note = format!(
        "deleted pod {} (uid {}): it was Pending, pinned to a lost node before the pin fell back to preferred terms; its StatefulSet creates it again without that pin",
        pod.name, pod.uid
    );
    ctx.publish(
        &pps.object_ref(&()),
        ACTION,
        EventType::Warning,
        "StrandedPodDeleted",
        &note,
    )
    .await;
    Ok(())
}

/// What the controller does after a failed reconcile: count it and retry with backoff.
pub fn error_policy(pps: Arc<PersistentPodState>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(LOOP, error);
    warn!(pps = ?pps.name_any(), namespace = pps.namespace().unwrap_or_default(), error = %error, kind = error.kind(), "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Publishes a Warning when `Ready` turns False or `NodeLost` turns True (or changes reason).
async fn announce_conditions(
    pps: &PersistentPodState,
    ctx: &Context,
    previous: &PersistentPodStateStatus,
    status: &PersistentPodStateStatus,
) {
    for (type_, bad) in [
        (READY, "False"),
        (condition::NODE_LOST, "True"),
        (ADMISSION_PLANNED, "False"),
    ] {
        let key = |s: &PersistentPodStateStatus| {
            s.condition(type_)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        if key(previous) == key(status) {
            continue;
        }
        if let Some(c) = status.condition(type_).filter(|c| c.status == bad) {
            ctx.publish(
                &pps.object_ref(&()),
                ACTION,
                EventType::Warning,
                &c.reason,
                &c.message,
            )
            .await;
        }
    }
}

/// Applies `status` unless it equals what is there.
async fn write_status(
    pps: &PersistentPodState,
    ctx: &Context,
    previous: &PersistentPodStateStatus,
    status: &PersistentPodStateStatus,
) -> Result<(), Error> {
    if status == previous {
        debug!("status unchanged");
        return Ok(());
    }
    let name = pps.name_any();
    let namespace = pps.namespace().unwrap_or_default();
    let api: Api<PersistentPodState> = Api::namespaced(ctx.client.clone(), &namespace);
    let body = serde_json::json!({
        "apiVersion": PersistentPodState::api_version(&()),
        "kind": PersistentPodState::kind(&()),
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| Error::api("apply the status of", format!("{namespace}/{name}"), e))?;
    if let Some(uid) = pps.uid() {
        ctx.wrote_status(&uid, status.clone());
    }
    Ok(())
}

async fn publish_changes(pps: &PersistentPodState, ctx: &Context, changes: &[RecordChange]) {
    let regarding = pps.object_ref(&());
    let mut pruned = Vec::new();
    for change in changes {
        match change {
            RecordChange::Recorded { pod, node } => {
                ctx.metrics.records_written.inc();
                debug!(pod, node, "recorded");
            }
            RecordChange::Refreshed { pod, node } => {
                ctx.metrics.records_written.inc();
                debug!(pod, node, "record refreshed");
            }
            RecordChange::Moved { pod, from, to } => {
                ctx.metrics.records_written.inc();
                info!(pod, from, to, "pin moved");
                let note =
                    format!("pod {pod} became Ready on node {to}; its pin moved from node {from}");
                ctx.publish(&regarding, ACTION, EventType::Normal, "PinMoved", &note)
                    .await;
            }
            RecordChange::Pruned { pod } => {
                ctx.metrics.records_pruned.inc();
                pruned.push(pod.as_str());
            }
            RecordChange::TargetReplaced { dropped } => {
                let note = format!(
                    "the StatefulSet was re-created (new UID); dropped {dropped} record(s) of the old one"
                );
                info!(dropped, "target replaced");
                ctx.publish(
                    &regarding,
                    ACTION,
                    EventType::Normal,
                    "TargetReplaced",
                    &note,
                )
                .await;
            }
            RecordChange::Adopted { records } => {
                let note = format!(
                    "the StatefulSet was re-created (new UID) and this PersistentPodState has {ADOPT_PERSISTENT_POD_STATE}: \"true\"; the new StatefulSet adopted {records} record(s), so its pods keep their nodes and held IPs"
                );
                info!(records, "records adopted by the re-created StatefulSet");
                ctx.publish(
                    &regarding,
                    ACTION,
                    EventType::Normal,
                    "RecordsAdopted",
                    &note,
                )
                .await;
            }
            RecordChange::FellBack { pod, node } => {
                ctx.metrics.node_loss_fallbacks.inc();
                warn!(pod, node, "node lost; pin released to preferred-only");
                let note = format!(
                    "node {node} of pod {pod} is lost; the pod is now pinned by preferred terms only and may start elsewhere with a new IP"
                );
                ctx.publish(
                    &regarding,
                    ACTION,
                    EventType::Warning,
                    "FellBackToPreferred",
                    &note,
                )
                .await;
            }
            RecordChange::NodeRecovered { pod, node } => {
                info!(pod, node, "node recovered");
                let note = format!("node {node} of pod {pod} is Ready again; the full pin applies");
                ctx.publish(
                    &regarding,
                    ACTION,
                    EventType::Normal,
                    "NodeRecovered",
                    &note,
                )
                .await;
            }
        }
    }
    if !pruned.is_empty() {
        info!(pods = ?pruned, "records pruned");
        let note = format!(
            "removed the records of {} (scaled down, pods gone)",
            pruned.join(", ")
        );
        ctx.publish(
            &regarding,
            ACTION,
            EventType::Normal,
            "RecordsPruned",
            &note,
        )
        .await;
    }
}
