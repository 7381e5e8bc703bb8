//! The lifecycle loop: keeps each pod with hooks (labelled `ipkeep.dev/lifecycle-state` by the
//! webhook at CREATE) in the state [`ipkeep_lifecycle::reconcile`] wants, and its readiness
//! gate's condition with it. The decisions are pure; this module reads the pod, its
//! PersistentPodState's `spec.lifecycle` and what the cluster says of its future ([`fate`]:
//! its StatefulSet, that StatefulSet's pods, its Node), and writes back:
//!
//! - the state label; while the pod is held, the hold's start as the condition
//!   `ipkeep.dev/lifecycle-held` (True, its `lastTransitionTime` the start: the one record the
//!   preDelete timeout runs from, in the pod's status, which whoever may patch the pod cannot
//!   write), a copy of it in the annotation `ipkeep.dev/lifecycle-since`, and why in
//!   `ipkeep.dev/lifecycle-held`; and the readiness gate's condition `ipkeep.dev/lifecycle-ready`,
//!   in one write ([`write`]: a strategic merge patch of the status subresource, keyed by the
//!   conditions' types so the kubelet's conditions are untouched, with the pod's UID as a
//!   precondition);
//! - and, once the preDelete hook lets go of a pod that its StatefulSet's scale-down or rolling
//!   update wants gone, the deletion: the StatefulSet controller does not retry a not-Ready
//!   pod's deletion. Before it deletes, the loop reads the StatefulSet from the API server
//!   again and decides again; the deletion has the pod's UID and resource version as
//!   preconditions, so a pod that changed meanwhile is decided again, not deleted.
//!
//! Its pods come from the controller's one pod watch (those with the label, [`hooked`], cached
//! apart and trimmed to what the decision reads); a pod event that changes none of it
//! reconciles nothing. Changes of StatefulSets, their other pods, Nodes and PersistentPodStates
//! reach it through [`triggers`].

pub mod fate;
pub mod triggers;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipkeep_api::PersistentPodState;
use ipkeep_placement::ipkeep_lifecycle::{
    self as lifecycle, Fate, Going, Lifecycle, PodFacts, State, Wanted,
};
use ipkeep_placement::lifecycle::{gated, held_since, pod_facts};
use ipkeep_placement::spec;
use ipkeep_placement::view::{NodeHealth, NodeView};
use ipkeep_values::keys::{
    HELD_ANNOTATION, HELD_CONDITION, READINESS_GATE, SINCE_ANNOTATION, STATE_LABEL,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use crate::caches::{CachedPod, Caches};
use crate::context::Context;
use crate::{Error, FIELD_MANAGER};

/// The loop's name in logs and metrics.
pub const LOOP: &str = "lifecycle";

/// Keeps what the decision reads (the same trimming as the webhook's pod cache).
pub use ipkeep_placement::lifecycle::trim_pod as trim;

/// `pod` as this loop caches it, if the webhook gave it a lifecycle state: a StatefulSet pod
/// (the pod watch's, decoded as [`CachedPod`] and not yet trimmed), trimmed as the decision
/// reads it ([`trim`]).
pub fn hooked(pod: &CachedPod) -> Option<Pod> {
    pod.metadata.labels.as_ref()?.get(STATE_LABEL)?;
    let mut hooked = Pod {
        metadata: pod.metadata.clone(),
        spec: Some(PodSpec {
            node_name: pod.spec.node_name.clone(),
            readiness_gates: Some(pod.spec.readiness_gates.clone()).filter(|g| !g.is_empty()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: pod.status.phase.clone(),
            conditions: Some(pod.status.conditions.clone()).filter(|c| !c.is_empty()),
            ..PodStatus::default()
        }),
    };
    trim(&mut hooked);
    Some(hooked)
}

/// What of a trimmed pod decides its reconcile.
pub fn fingerprint(pod: &Pod) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    pod.metadata.labels.hash(&mut h);
    pod.metadata.annotations.hash(&mut h);
    pod.metadata.uid.hash(&mut h);
    pod.metadata.deletion_timestamp.is_some().hash(&mut h);
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_ref())
        .hash(&mut h);
    gated(pod).hash(&mut h);
    gate_status(pod).hash(&mut h);
    held_since(pod).hash(&mut h);
    h.finish()
}

/// Reconciles one pod.
pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(LOOP);
    ctx.caches.wait_until_ready().await?;
    let name = pod.name_any();
    let namespace = pod.namespace().ok_or(Error::MissingMeta("namespace"))?;
    let hooks = hooks_of(&pod, &ctx.caches);
    let owner = fate::statefulset_owner(&pod);
    let statefulset = match &owner {
        Some((sts, uid)) => fate::owner(&ctx.client, &ctx.caches, &namespace, (sts, uid)).await?,
        None => None,
    };
    let fate = match owner {
        Some(_) => fate::of(&pod, statefulset.as_deref(), &ctx.caches),
        None => Fate::Staying,
    };
    let now = unix_now();
    let facts = facts(&pod, &ctx.caches);
    let wanted = lifecycle::reconcile(&hooks, &facts, fate, now);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let condition = wanted
        .ready
        .filter(|&ready| gate_status(&pod) != Some(if ready { "True" } else { "False" }))
        .map(|ready| condition(&wanted, ready, &hooks));
    let hold = (wanted.held_since != facts.held_since).then(|| hold_condition(wanted.held_since));
    let relabel = wanted.state.is_some()
        && (wanted.state != facts.state()
            || wanted.held_since != facts.since_annotation
            || wanted.held != facts.held);
    let conditions: Vec<&PodCondition> = condition.iter().chain(&hold).collect();
    if let Some(patch) = write(pod.uid(), &wanted, &conditions, relabel) {
        api.patch_status(&name, &params, &Patch::Strategic(&patch))
            .await
            .map_err(|e| {
                Error::api(
                    "set the lifecycle state and readiness gate of",
                    format!("{namespace}/{name}"),
                    e,
                )
            })?;
        if let Some(c) = &condition {
            info!(namespace = ?namespace, pod = ?name, gate = READINESS_GATE, ready = c.status == "True",
                reason = ?c.reason, "readiness gate set");
        }
        if relabel {
            info!(namespace = ?namespace, pod = ?name, from = ?facts.state().map(State::as_str),
                to = wanted.state.map_or("", State::as_str), held = ?wanted.held.map(Going::as_str),
                since = ?wanted.held_since, claimed_since = ?facts.since_annotation,
                "lifecycle state changed");
        }
    }
    if wanted.delete {
        return complete_deletion(&pod, &hooks, &ctx, &api).await;
    }
    Ok(match wanted.recheck_at {
        Some(at) => Action::requeue(Duration::from_secs(at.saturating_sub(now).max(1))),
        None => Action::await_change(),
    })
}

/// The one write that brings a pod where the decision wants it: the `conditions` that change
/// (the gate's, the hold's) and the state label with its annotations (when `relabel`), as a
/// strategic merge patch of the pod's status subresource, which takes the pod's labels and
/// annotations too. One write, because the kubelet syncs a pod once per change it sees, and a
/// sync less than a second after the pod's last one waits for the next PLEG relist (1 s): a
/// condition and a label written apart were two syncs a relist apart, which cost a held pod's
/// deletion up to a second (docs/benchmarks.md, "Real nodes: what the lifecycle hooks cost").
/// The pod's UID makes it a precondition: a pod re-created under the name is not touched.
/// `None`: nothing to write.
fn write(
    uid: Option<String>,
    wanted: &Wanted,
    conditions: &[&PodCondition],
    relabel: bool,
) -> Option<serde_json::Value> {
    if conditions.is_empty() && !relabel {
        return None;
    }
    let mut metadata = serde_json::json!({"uid": uid});
    if relabel {
        metadata["labels"] =
            serde_json::json!({STATE_LABEL: wanted.state.map_or("", State::as_str)});
        metadata["annotations"] = serde_json::json!({
            SINCE_ANNOTATION: wanted.held_since.map(|s| s.to_string()),
            HELD_ANNOTATION: wanted.held.map(Going::as_str),
        });
    }
    let mut patch = serde_json::json!({"metadata": metadata});
    if !conditions.is_empty() {
        patch["status"] = serde_json::json!({ "conditions": conditions });
    }
    Some(patch)
}

/// The hold's condition: True from `since` (the hold's start, which the preDelete timeout runs
/// from), or False from now once the pod is no longer held.
fn hold_condition(since: Option<u64>) -> PodCondition {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    let (status, reason, message, at) = match since {
        Some(since) => (
            "True",
            "PreparingDelete",
            "the preDelete hook holds the pod's deletion and eviction; the hook's timeoutSeconds runs from lastTransitionTime",
            i64::try_from(since)
                .ok()
                .and_then(|s| Timestamp::from_second(s).ok())
                .unwrap_or_else(Timestamp::now),
        ),
        None => (
            "False",
            "NotHeld",
            "the preDelete hook holds nothing",
            Timestamp::now(),
        ),
    };
    PodCondition {
        type_: HELD_CONDITION.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_transition_time: Some(Time(at)),
        ..PodCondition::default()
    }
}

/// Deletes a pod whose preDelete hook let it go, if its StatefulSet, read from the API server
/// now, still wants it gone for a scale-down or a rolling update: through the webhook like any
/// deletion (it passes now: released, or timed out), with the pod's UID and resource version as
/// preconditions.
async fn complete_deletion(
    pod: &Pod,
    hooks: &Lifecycle,
    ctx: &Context,
    api: &Api<Pod>,
) -> Result<Action, Error> {
    let name = pod.name_any();
    let namespace = pod.namespace().unwrap_or_default();
    let Some((sts, uid)) = fate::statefulset_owner(pod) else {
        return Ok(Action::await_change());
    };
    let live: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let statefulset = live
        .get_opt(&sts)
        .await
        .map_err(|e| Error::api("read the StatefulSet", format!("{namespace}/{sts}"), e))?
        .filter(|s| s.uid().as_deref() == Some(uid.as_str()))
        .map(|mut s| {
            crate::caches::trim_statefulset(&mut s);
            s
        });
    let fate = fate::of(pod, statefulset.as_ref(), &ctx.caches);
    let again = lifecycle::reconcile(hooks, &facts(pod, &ctx.caches), fate, unix_now());
    let why = match fate {
        Fate::Going(why) if again.delete && why.completes() => why,
        _ => {
            info!(namespace = ?namespace, pod = ?name, fate = ?fate,
                "the StatefulSet no longer wants the pod gone; not deleting it");
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    };
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: pod.resource_version(),
        }),
        ..DeleteParams::default()
    };
    api.delete(&name, &params).await.map_err(|e| {
        Error::api(
            "complete the held deletion of",
            format!("{namespace}/{name}"),
            e,
        )
    })?;
    info!(namespace = ?namespace, pod = ?name, held = why.as_str(), reason = why.describe(),
        "deleted the pod its preDelete hook let go");
    Ok(Action::await_change())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What the decisions read of a pod ([`pod_facts`], shared with the webhook's deletion review).
fn facts<'p>(pod: &'p Pod, caches: &Caches) -> PodFacts<'p> {
    let node_ready = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .and_then(|n| caches.nodes.get(&ObjectRef::new(n)))
        .is_some_and(|n| NodeView::from_node(&n).health == NodeHealth::Ready);
    pod_facts(pod, node_ready)
}

/// Retries a failed reconcile with backoff; a pod that is gone needs nothing.
pub fn error_policy(pod: Arc<Pod>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(LOOP, error);
    if matches!(error, Error::Api { source: kube::Error::Api(s), .. } if s.code == 404 || s.code == 409)
    {
        // Gone, or re-created under the name (the UID precondition): its next event decides.
        return Action::await_change();
    }
    warn!(namespace = ?pod.namespace(), pod = ?pod.name_any(), error = %error, kind = error.kind(),
        "lifecycle reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// The hooks of the pod's PersistentPodState (none when it has none, or its spec does not
/// check: the gate then follows the state to Ready, so nothing stays held).
fn hooks_of(pod: &Pod, caches: &Caches) -> Lifecycle {
    let Some(namespace) = pod.namespace() else {
        return Lifecycle::default();
    };
    let Some(sts) = ipkeep_api::statefulset::controller(pod.owner_references()) else {
        return Lifecycle::default();
    };
    // The one named after the StatefulSet (what auto-generation creates), else the first by name.
    let mut candidates: Vec<Arc<PersistentPodState>> = caches
        .pps_targeting(
            &namespace,
            ipkeep_api::statefulset::Workload::Native,
            &sts.name,
        )
        .into_iter()
        .filter_map(|r| caches.pps.get(&r))
        .collect();
    candidates.sort_by_key(|p| (p.name_any() != sts.name, p.name_any()));
    candidates
        .first()
        .and_then(|p| spec::check(&p.spec).ok())
        .map(|c| c.lifecycle)
        .unwrap_or_default()
}

fn gate_status(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == READINESS_GATE))
        .map(|c| c.status.as_str())
}

/// The gate's condition: why the pod is (not) Ready, in words an operator can act on.
fn condition(wanted: &Wanted, ready: bool, hooks: &Lifecycle) -> PodCondition {
    let labels = |h: &Option<lifecycle::Hook>| {
        h.as_ref().map_or(String::new(), |h| {
            h.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
    };
    let (reason, message) = match wanted.state {
        Some(State::PreparingNormal) => (
            "PreparingNormal",
            format!(
                "waiting for the preNormal hook: the pod is Ready once it carries the label {} (your operator adds it after registering the pod)",
                labels(&hooks.pre_normal)
            ),
        ),
        Some(State::PreparingDelete) if !ready => (
            "PreparingDelete",
            format!(
                "held by the preDelete hook because {} (markPodNotReady): it goes once the label {} is removed or changed",
                wanted.held.unwrap_or(Going::Requested).describe(),
                labels(&hooks.pre_delete)
            ),
        ),
        Some(state) => (
            state.as_str(),
            "the lifecycle hooks hold nothing".to_string(),
        ),
        None => (
            "NoLifecycleState",
            "the lifecycle hooks hold nothing".to_string(),
        ),
    };
    PodCondition {
        type_: READINESS_GATE.to_string(),
        status: if ready { "True" } else { "False" }.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message),
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        ..PodCondition::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A state change and the gate's condition that goes with it are one write, to the status
    /// subresource (which takes labels and annotations too): written apart, the kubelet synced
    /// the pod twice, a relist apart, and a held pod's deletion waited up to a second longer.
    #[test]
    fn the_state_and_the_condition_are_one_write() {
        let wanted = Wanted {
            state: Some(State::PreparingDelete),
            held_since: Some(100),
            held: Some(Going::Requested),
            ready: Some(false),
            recheck_at: None,
            delete: false,
        };
        let hooks = Lifecycle::default();
        let c = condition(&wanted, false, &hooks);
        let hold = hold_condition(wanted.held_since);
        let patch = write(Some("u1".into()), &wanted, &[&c, &hold], true).unwrap();
        assert_eq!(patch["metadata"]["uid"], "u1");
        assert_eq!(patch["metadata"]["labels"][STATE_LABEL], "PreparingDelete");
        assert_eq!(patch["metadata"]["annotations"][SINCE_ANNOTATION], "100");
        assert_eq!(patch["metadata"]["annotations"][HELD_ANNOTATION], "request");
        let conditions = patch["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0]["type"], READINESS_GATE);
        assert_eq!(conditions[0]["status"], "False");
        // The hold's start, where only the status subresource writes.
        assert_eq!(conditions[1]["type"], HELD_CONDITION);
        assert_eq!(conditions[1]["status"], "True");
        assert_eq!(conditions[1]["lastTransitionTime"], "1970-01-01T00:01:40Z");
        let back: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-0"}, "status": {"conditions": conditions}}))
        .unwrap();
        assert_eq!(held_since(&back), Some(100), "reads back as written");
        let ended = hold_condition(None);
        assert_eq!(
            (ended.status.as_str(), held_since(&Pod::default())),
            ("False", None)
        );

        // The condition alone leaves the labels and annotations as they are.
        let alone = write(Some("u1".into()), &wanted, &[&c, &hold], false).unwrap();
        assert_eq!(alone["metadata"], serde_json::json!({"uid": "u1"}));
        assert_eq!(alone["status"], patch["status"]);
        // The state alone: no condition in the write, so the kubelet's stay as they are.
        let state = write(Some("u1".into()), &wanted, &[], true).unwrap();
        assert!(state.get("status").is_none());
        assert_eq!(state["metadata"], patch["metadata"]);
        // A settled pod loses its annotations (null deletes in a strategic merge patch).
        let settled = Wanted {
            state: Some(State::Normal),
            held: None,
            ..wanted
        };
        let settled = Wanted {
            held_since: None,
            ..settled
        };
        let cleared = write(Some("u1".into()), &settled, &[], true).unwrap();
        assert!(cleared["metadata"]["annotations"][HELD_ANNOTATION].is_null());
        assert!(cleared["metadata"]["annotations"][SINCE_ANNOTATION].is_null());
        assert_eq!(write(Some("u1".into()), &wanted, &[], false), None);
    }

    /// The loop's pod, taken from the one pod watch, is the pod as a watch of its own decoded
    /// and trimmed it; a pod without a lifecycle state is not the loop's.
    #[test]
    fn a_hooked_pod_from_the_pod_watch_is_the_pod_its_own_watch_gave() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db-1", "namespace": "prod", "uid": "u1", "resourceVersion": "9",
                "labels": {STATE_LABEL: "PreparingDelete", "registry.example.com/registered": "true",
                           "statefulset.kubernetes.io/pod-name": "db-1"},
                "annotations": {SINCE_ANNOTATION: "100", HELD_ANNOTATION: "deletion", "team": "x"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s", "controller": true}],
                "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "db", "image": "db"}],
                     "readinessGates": [{"conditionType": READINESS_GATE}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [
                {"type": "Ready", "status": "False"}, {"type": READINESS_GATE, "status": "False"},
                {"type": HELD_CONDITION, "status": "True", "lastTransitionTime": "1970-01-01T00:01:40Z"}]}
        });
        let mut own: Pod = serde_json::from_value(json.clone()).unwrap();
        trim(&mut own);
        let watched: CachedPod = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(hooked(&watched), Some(own));
        let mut plain = json;
        plain["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(STATE_LABEL);
        plain["spec"]
            .as_object_mut()
            .unwrap()
            .remove("readinessGates");
        let plain: CachedPod = serde_json::from_value(plain).unwrap();
        assert_eq!(hooked(&plain), None);
    }

    /// What the decision reads survives trimming (a dropped annotation once made every held
    /// deletion look like an eviction, so none was completed); the rest goes.
    #[test]
    fn trimming_keeps_what_the_decision_reads() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-1", "namespace": "prod", "uid": "u1",
                "labels": {STATE_LABEL: "PreparingDelete", "registry.example.com/registered": "true"},
                "annotations": {SINCE_ANNOTATION: "100", HELD_ANNOTATION: "deletion", "team": "x"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s", "controller": true}],
                "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "db", "image": "db"}],
                     "readinessGates": [{"conditionType": READINESS_GATE}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [
                {"type": "Ready", "status": "False"}, {"type": READINESS_GATE, "status": "False"},
                {"type": HELD_CONDITION, "status": "True", "lastTransitionTime": "1970-01-01T00:01:40Z"}]}
        }))
        .unwrap();
        let whole = pod.clone();
        trim(&mut pod);
        let annotations = pod.metadata.annotations.clone().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            [HELD_ANNOTATION, SINCE_ANNOTATION]
        );
        assert_eq!(pod.metadata.labels, whole.metadata.labels);
        assert_eq!(
            pod.metadata.owner_references,
            whole.metadata.owner_references
        );
        assert!(gated(&pod));
        assert_eq!(gate_status(&pod), Some("False"));
        assert_eq!(
            pod.status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(held_since(&pod), Some(100));
        assert!(pod.metadata.managed_fields.is_none());
        assert!(pod.spec.as_ref().unwrap().containers.is_empty());
        assert_eq!(fingerprint(&pod), {
            let mut again = whole;
            trim(&mut again);
            fingerprint(&again)
        });
    }
}
