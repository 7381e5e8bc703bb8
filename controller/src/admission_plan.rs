//! The admission plan loop: keeps one ConfigMap per namespace
//! ([`ipkeep_placement::admission::PLAN_CONFIGMAP`]) equal to the plans the record loop decided
//! for the namespace's StatefulSets, encoded by [`admission::encode`]; the admission policy
//! `ipkeep-pin` reads it. A namespace is reconciled when a plan of it changes and when a
//! PersistentPodState of it goes.
//!
//! The controller never reads ConfigMaps (its RBAC holds no `get`, `list` or `watch` on them:
//! reading every ConfigMap of the cluster is not a power it needs). It replaces a namespace's
//! plan whole when the plan differs from what it last wrote there (after a start, once,
//! whatever is there), and no one else may write it (the admission policy
//! `ipkeep-admission-plan-writers`).
//!
//! It writes only once every PersistentPodState of the namespace has had its plan decided since
//! this replica started: a ConfigMap written from some of them would drop the others' pins.
//! Once the plan of a PersistentPodState's StatefulSet is in place, it removes the
//! PersistentPodState's [`ADMISSION_PENDING_LABEL`], which lets the StatefulSet's pods be
//! created (the admission policy `ipkeep-hooks-pending` refuses them while it is set).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipkeep_api::PersistentPodState;
use ipkeep_api::statefulset::Workload;
use ipkeep_placement::admission::{self, AdmissionPlan, PLAN_BUDGET, PLAN_CONFIGMAP, PLAN_LABEL};
use ipkeep_placement::pin;
use ipkeep_values::keys::ADMISSION_PENDING_LABEL;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use crate::context::Context;
use crate::{Error, FIELD_MANAGER};

/// The metric label of this loop.
pub const LOOP: &str = "admission-plan";

/// The plans the record loop decided, by PersistentPodState UID, since this replica started.
#[derive(Debug, Default)]
pub struct Plans {
    /// By UID: the namespace and the plan.
    decided: Mutex<HashMap<String, (String, Option<AdmissionPlan>)>>,
    /// Per namespace, the StatefulSets whose per-pod entries last did not fit.
    omitted: Mutex<HashMap<String, Vec<String>>>,
    /// Per namespace, the entries last written (empty: deleted).
    written: Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// Per namespace, held while its plan is written.
    writing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per namespace, when its plan was last written.
    written_at: Mutex<HashMap<String, Instant>>,
}

impl Plans {
    /// Remembers the plan decided for PersistentPodState `uid` of `namespace`; true if it
    /// changed.
    pub fn decided(&self, uid: &str, namespace: &str, plan: Option<AdmissionPlan>) -> bool {
        let mut decided = self.decided.lock().unwrap_or_else(|e| e.into_inner());
        if decided.get(uid).map(|(_, p)| p) == Some(&plan) {
            return false;
        }
        decided.insert(uid.to_string(), (namespace.to_string(), plan));
        true
    }

    /// The plans of `states` (one namespace's PersistentPodStates), the one each StatefulSet's
    /// pods read ([`pin::persistent_pod_state_of`]); `None` while one has not been decided yet.
    fn chosen(&self, states: &[Arc<PersistentPodState>]) -> Option<Vec<AdmissionPlan>> {
        let decided = self.decided.lock().unwrap_or_else(|e| e.into_inner());
        let mut by_target: BTreeMap<&str, Vec<&PersistentPodState>> = BTreeMap::new();
        for pps in states {
            decided.get(&pps.uid()?)?;
            by_target
                .entry(pps.spec.target_ref.name.as_str())
                .or_default()
                .push(pps);
        }
        let plans = by_target
            .into_iter()
            // One plan per name: an `apps` StatefulSet's before an Advanced StatefulSet's of the
            // name (the plan's UID keeps the other's pods from it).
            .filter_map(|(sts, candidates)| {
                pin::persistent_pod_state_of(candidates.iter().copied(), Workload::Native, sts)
                    .or_else(|| pin::persistent_pod_state_of(candidates, Workload::Kruise, sts))
            })
            .filter_map(|pps| decided.get(&pps.uid()?).and_then(|(_, p)| p.clone()))
            .collect();
        Some(plans)
    }

    /// Forgets the plans of `namespace`'s PersistentPodStates that are not in `live` (deleted).
    fn forget_gone(&self, namespace: &str, live: &[Arc<PersistentPodState>]) {
        let live: Vec<String> = live.iter().filter_map(|p| p.uid()).collect();
        self.decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, (ns, _)| ns != namespace || live.contains(uid));
    }

    /// The lock held while `namespace`'s plan is written.
    fn lock_of(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        writing.entry(namespace.to_string()).or_default().clone()
    }

    /// Whether `data` is what was last written in `namespace` by this replica.
    fn is_written(&self, namespace: &str, data: &BTreeMap<String, String>) -> bool {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.get(namespace) == Some(data)
    }

    /// Remembers what was written in `namespace`, and when.
    fn wrote(&self, namespace: &str, data: BTreeMap<String, String>) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.insert(namespace.to_string(), data);
        let mut at = self.written_at.lock().unwrap_or_else(|e| e.into_inner());
        at.insert(namespace.to_string(), Instant::now());
    }

    /// How long `namespace`'s last write has still to settle ([`SETTLE`]), if at all.
    fn settling(&self, namespace: &str) -> Option<Duration> {
        let at = self.written_at.lock().unwrap_or_else(|e| e.into_inner());
        let left = SETTLE.checked_sub(at.get(namespace)?.elapsed())?;
        (!left.is_zero()).then_some(left)
    }

    /// Remembers which StatefulSets of `namespace` were omitted; true if that changed.
    fn omitted(&self, namespace: &str, omitted: &[String]) -> bool {
        let mut last = self.omitted.lock().unwrap_or_else(|e| e.into_inner());
        let before = last.get(namespace).map(Vec::as_slice).unwrap_or_default();
        if before == omitted {
            return false;
        }
        last.insert(namespace.to_string(), omitted.to_vec());
        true
    }
}

/// Reconciles the admission plan of one namespace (a PersistentPodState of it deleted, or a
/// write the record loop could not make).
#[instrument(skip_all, fields(namespace = ns.name_any()))]
pub async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(LOOP);
    ctx.caches.wait_until_ready().await?;
    Ok(match write_namespace(&ctx, &ns.name_any()).await? {
        Written::Yes => Action::await_change(),
        Written::Undecided => Action::requeue(Duration::from_secs(5)),
        Written::Settling(left) => Action::requeue(left),
    })
}

/// Whether [`write_namespace`] could write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The namespace's plan is what its PersistentPodStates' decided plans make.
    Yes,
    /// A PersistentPodState of the namespace has not had its plan decided since the start.
    Undecided,
    /// Written, but a PersistentPodState waits on its hooks and the write is younger than
    /// [`SETTLE`]: look again after this long.
    Settling(Duration),
}

/// How long a written plan is given to reach kube-apiserver's own cache of ConfigMaps (the
/// admission policy reads its parameter from an informer) before the pods waiting on it are let
/// through: the admission policy `ipkeep-hooks-pending` reads the PersistentPodStates from
/// another informer, and a pod created in between would get no hooks. Watches deliver within
/// milliseconds unless kube-apiserver is badly overloaded.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Writes the admission plan of `namespace` from the plans decided for its PersistentPodStates
/// (one namespace at a time: concurrent callers for one namespace wait for each other), says
/// what did not fit, and releases PersistentPodStates pending on their hooks.
pub async fn write_namespace(ctx: &Context, namespace: &str) -> Result<Written, Error> {
    let lock = ctx.plans.lock_of(namespace);
    let _one_at_a_time = lock.lock().await;
    let namespace = namespace.to_string();
    let states: Vec<Arc<PersistentPodState>> = ctx
        .caches
        .pps
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .collect();
    ctx.plans.forget_gone(&namespace, &states);
    let Some(plans) = ctx.plans.chosen(&states) else {
        debug!("waiting for the record loop to decide every plan");
        return Ok(Written::Undecided);
    };
    let encoded = admission::encode(&plans, PLAN_BUDGET);
    write(ctx, &namespace, &encoded.data).await?;
    if ctx.plans.omitted(&namespace, &encoded.omitted) {
        ctx.metrics
            .admission_plan_omitted
            .get_or_create(&crate::metrics::NamespaceLabel {
                namespace: namespace.clone(),
            })
            .set(i64::try_from(encoded.omitted.len()).unwrap_or(i64::MAX));
        announce_omitted(ctx, &states, &plans, &encoded.omitted).await;
    }
    if let Some(left) = ctx.plans.settling(&namespace)
        && states
            .iter()
            .any(|p| p.labels().contains_key(ADMISSION_PENDING_LABEL))
    {
        return Ok(Written::Settling(left));
    }
    release_pending(ctx, &states, &plans, &encoded).await?;
    Ok(Written::Yes)
}

/// What the record loop calls after deciding a plan, before it writes the status: remembers the
/// plan and, if it changed (or the PersistentPodState waits on its hooks), writes the
/// namespace's plan. So a pin is in the plan no later than its record is in the status: a pod
/// rebuilt right after it was recorded is pinned by the policy too. If the namespace's plan
/// cannot be written now (another PersistentPodState undecided since the start, or the write
/// failed), the admission plan loop writes it once it can: recording never waits on the plan.
pub async fn plan_decided(ctx: &Context, pps: &PersistentPodState, plan: Option<AdmissionPlan>) {
    let (Some(uid), Some(namespace)) = (pps.uid(), pps.namespace()) else {
        return;
    };
    let pending = pps.labels().contains_key(ADMISSION_PENDING_LABEL);
    let changed = ctx.plans.decided(&uid, &namespace, plan);
    if !(changed || pending) {
        return;
    }
    match write_namespace(ctx, &namespace).await {
        Ok(Written::Yes) => {}
        Ok(Written::Undecided | Written::Settling(_)) => ctx.plan_namespace(&namespace),
        Err(e) => {
            ctx.metrics.error(LOOP, &e);
            warn!(error = %e, kind = e.kind(), hint = "the admission plan loop retries", "failed to write the admission plan");
            ctx.plan_namespace(&namespace);
        }
    }
}

/// Makes the namespace's ConfigMap hold `data`, unless that is what this replica last wrote
/// there: replaced whole (or created), or deleted when there is nothing to hold.
async fn write(
    ctx: &Context,
    namespace: &str,
    data: &BTreeMap<String, String>,
) -> Result<(), Error> {
    if ctx.plans.is_written(namespace, data) {
        debug!("admission plan unchanged");
        return Ok(());
    }
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let what = || format!("ConfigMap {namespace}/{PLAN_CONFIGMAP}");
    if data.is_empty() {
        match api.delete(PLAN_CONFIGMAP, &DeleteParams::default()).await {
            Ok(_) => {
                info!("deleted the namespace's empty admission plan")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::api("delete", what(), e)),
        }
        ctx.plans.wrote(namespace, BTreeMap::new());
        return Ok(());
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(PLAN_CONFIGMAP.into()),
            labels: Some(
                [
                    (PLAN_LABEL.to_string(), "true".to_string()),
                    (
                        "app.kubernetes.io/managed-by".to_string(),
                        FIELD_MANAGER.to_string(),
                    ),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some(data.clone()),
        ..ConfigMap::default()
    };
    // Replaced whole, without a resourceVersion: whatever anyone else put in it goes.
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let written = match api.replace(PLAN_CONFIGMAP, &params, &cm).await {
        Err(kube::Error::Api(s)) if s.code == 404 => api.create(&params, &cm).await,
        other => other,
    };
    match written {
        Ok(_) => {}
        // The namespace is being deleted: nothing in it is created any more.
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
            return Ok(());
        }
        Err(e) => return Err(Error::api("write", what(), e)),
    }
    ctx.plans.wrote(namespace, data.clone());
    ctx.metrics.admission_plan_writes.inc();
    info!(
        entries = data.len(),
        bytes = data.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(),
        "wrote the namespace's admission plan"
    );
    Ok(())
}

/// Says on each PersistentPodState whose StatefulSet's per-pod entries did not fit that its
/// pods are not pinned by the admission policy.
async fn announce_omitted(
    ctx: &Context,
    states: &[Arc<PersistentPodState>],
    plans: &[AdmissionPlan],
    omitted: &[String],
) {
    for sts in omitted {
        let Some(plan) = plans.iter().find(|p| &p.stateful_set == sts) else {
            continue;
        };
        let Some(pps) = states
            .iter()
            .find(|p| p.name_any() == plan.persistent_pod_state)
        else {
            continue;
        };
        warn!(statefulset = %sts, pods = plan.pods.len(), hint = "the webhook or the scheduler extender pins its pods; fewer StatefulSets or replicas per namespace make room", "the namespace's admission plan is full");
        let note = format!(
            "the admission plan of namespace {} holds at most {PLAN_BUDGET} bytes and the pins of StatefulSet {sts}'s {} recorded pods do not fit: the admission policy does not pin its pods (admission.mode webhook, or the scheduler extender, pins them); fewer StatefulSets or replicas per namespace bring them back",
            pps.namespace().unwrap_or_default(),
            plan.pods.len()
        );
        ctx.publish(
            &pps.object_ref(&()),
            crate::record::ACTION,
            EventType::Warning,
            "AdmissionPlanFull",
            &note,
        )
        .await;
    }
}

/// Removes [`ADMISSION_PENDING_LABEL`] from every PersistentPodState whose StatefulSet's plan is
/// now in the ConfigMap (or can never be: the namespace's plan is full).
async fn release_pending(
    ctx: &Context,
    states: &[Arc<PersistentPodState>],
    plans: &[AdmissionPlan],
    encoded: &admission::Encoded,
) -> Result<(), Error> {
    for pps in states {
        if !pps.labels().contains_key(ADMISSION_PENDING_LABEL) {
            continue;
        }
        let target = &pps.spec.target_ref.name;
        // ipkeep's hooks run for `apps` StatefulSets only (an Advanced StatefulSet has its own):
        // another target's pods wait for no plan.
        let hooked = pps.spec.target_ref.statefulset().is_some();
        let planned = plans
            .iter()
            .any(|p| &p.stateful_set == target && !p.stateful_set_uid.is_empty());
        let full = encoded.data.is_empty() && !encoded.omitted.is_empty();
        if hooked && !planned && !full {
            continue; // no StatefulSet yet: its pods do not exist either
        }
        let name = pps.name_any();
        let namespace = pps.namespace().unwrap_or_default();
        let api: Api<PersistentPodState> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = serde_json::json!({"metadata": {"labels": {ADMISSION_PENDING_LABEL: null}}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(pps = %name, statefulset = %target, "admission plan in place; the StatefulSet's pods may be created")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::api(
                    "remove the pending label of",
                    format!("{namespace}/{name}"),
                    e,
                ));
            }
        }
    }
    Ok(())
}

/// What the controller does after a failed reconcile: count it and retry with backoff.
pub fn error_policy(ns: Arc<Namespace>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(LOOP, error);
    warn!(namespace = %ns.name_any(), error = %error, kind = error.kind(), "admission plan reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}
