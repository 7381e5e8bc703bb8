//! What the controller's caches keep of each object, what of it decides a reconcile, and how
//! events map to PersistentPodStates (the watches themselves are opened in [`crate::watches`]).
//!
//! Objects are trimmed before they are cached (only the fields decisions read are kept). Pods,
//! the most numerous, are not even decoded into k8s-openapi's `Pod` (2 KiB of struct before
//! any field is set): the watch decodes them into [`CachedPod`], which has only those fields. Pod and node events that change nothing the
//! decisions read (node heartbeats, container restarts) are filtered out before they trigger
//! a reconcile; deletions always pass. After a watch is re-listed (for example after 410 Gone)
//! every PersistentPodState is reconciled again, because deletions that happened during the gap
//! are never delivered as events.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use ipkeep_api::PersistentPodState;
use ipkeep_api::kruise::AdvancedStatefulSet;
use ipkeep_api::statefulset::{self, Workload};
use ipkeep_daemon::lenient::Undecodables;
use ipkeep_placement::view::{NodeHealth, NodeView, PodView, terminating};
use ipkeep_values::keys::{
    AUTO_GENERATE, IP_RETENTION, LAST_APPLIED_ANNOTATION, POD_INDEX_LABEL, REVISION_LABEL,
    STATE_LABEL, STATEFULSET_POD_NAME_LABEL,
};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Namespace, Node, NodeSpec, NodeStatus, Pod, PodCondition, PodIP, PodReadinessGate,
    PodSpec, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::synced::Synced;

/// A pod as the controller caches it: what recording reads, decoded straight from the watch
/// (serde skips every other field). A `Pod` for the API (`kind: Pod`); the decisions read it as
/// a [`PodView`] (`PodView::from(&pod)`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, kube::Resource)]
#[resource(inherit = Pod)]
pub struct CachedPod {
    /// Metadata, without managed fields once trimmed.
    pub metadata: ObjectMeta,
    /// `spec.nodeName`.
    #[serde(default)]
    pub spec: CachedPodSpec,
    /// The Ready condition and the IPs.
    #[serde(default)]
    pub status: CachedPodStatus,
}

/// [`CachedPod`]'s spec.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    /// The node the pod is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The readiness gates, for the lifecycle loop's pods ([`crate::lifecycle::hooked`]);
    /// trimmed away from the record loop's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness_gates: Vec<PodReadinessGate>,
}

/// [`CachedPod`]'s status.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    /// `status.phase`: a finished pod is terminating ([`terminating`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Conditions (only Ready is kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PodCondition>,
    /// `status.podIP`.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// `status.podIPs`.
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<PodIP>,
}

impl From<&CachedPod> for PodView {
    /// The one place a cached pod becomes what the decisions read (the same view
    /// [`PodView::from_pod`] reads from a whole pod).
    fn from(pod: &CachedPod) -> Self {
        let meta = &pod.metadata;
        let mut ips: Vec<String> = pod.status.pod_ips.iter().map(|ip| ip.ip.clone()).collect();
        if ips.is_empty() {
            ips.extend(pod.status.pod_ip.clone());
        }
        PodView {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            controller_uid: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone()),
            node_name: pod.spec.node_name.clone().filter(|n| !n.is_empty()),
            ready: pod.status.ready(),
            terminating: terminating(
                meta.deletion_timestamp.is_some(),
                pod.status.phase.as_deref(),
            ),
            ips,
            annotations: meta.annotations.clone().unwrap_or_default(),
            created_ms: meta
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond()),
        }
    }
}

impl CachedPodStatus {
    /// The `Ready` condition is `True`.
    pub fn ready(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    }
}

/// Read access to every cache.
#[derive(Debug, Clone)]
pub struct Caches {
    /// StatefulSets (trimmed).
    pub statefulsets: Store<StatefulSet>,
    /// OpenKruise's Advanced StatefulSets (trimmed; empty when the API server does not serve
    /// them).
    pub advanced: Store<AdvancedStatefulSet>,
    /// Pods that carry [`STATEFULSET_POD_NAME_LABEL`] (trimmed).
    pub pods: Store<CachedPod>,
    /// Nodes (trimmed).
    pub nodes: Store<Node>,
    /// PersistentPodStates (those that decode).
    pub pps: Store<PersistentPodState>,
    /// The PersistentPodStates that do not decode (left out of `pps`).
    pub undecodable_pps: Undecodables,
    /// Namespaces (trimmed to their auto-generation label).
    pub namespaces: Store<Namespace>,
    /// Whether they all had their first full list.
    pub synced: Synced,
}

impl Caches {
    /// Waits until every cache has its first full list ([`crate::synced`]: any number of
    /// reconciles may wait at once).
    pub async fn wait_until_ready(&self) -> Result<(), crate::Error> {
        self.synced.wait().await
    }

    /// The pods of the StatefulSet with UID `owner` in `namespace` (by their controller owner).
    pub fn pods_owned_by(&self, namespace: &str, owner: &str) -> Vec<Arc<CachedPod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.owner_references()
                        .iter()
                        .any(|o| o.controller == Some(true) && o.uid == owner)
            })
            .collect()
    }

    /// The labels of `namespace` that decisions read, if the namespace is known.
    pub fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces
            .get(&ObjectRef::new(namespace))
            .and_then(|ns| ns.metadata.labels.clone())
    }

    /// The StatefulSets of `namespace`.
    pub fn statefulsets_in(&self, namespace: &str) -> Vec<ObjectRef<StatefulSet>> {
        self.statefulsets
            .state()
            .iter()
            .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect()
    }

    /// The Advanced StatefulSets of `namespace`.
    pub fn advanced_in(&self, namespace: &str) -> Vec<ObjectRef<AdvancedStatefulSet>> {
        self.advanced
            .state()
            .iter()
            .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect()
    }

    /// The PersistentPodStates in `namespace` that target the `workload` StatefulSet `name`.
    pub fn pps_targeting(
        &self,
        namespace: &str,
        workload: Workload,
        name: &str,
    ) -> Vec<ObjectRef<PersistentPodState>> {
        self.pps
            .state()
            .iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && p.spec.target_ref.targets(workload, name)
            })
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect()
    }

    /// The PersistentPodStates a pod event concerns: those targeting its controller.
    pub fn pps_for_pod(&self, pod: &CachedPod) -> Vec<ObjectRef<PersistentPodState>> {
        let Some(namespace) = pod.namespace() else {
            return Vec::new();
        };
        statefulset::controller_workload(pod.owner_references())
            .map(|(workload, o)| self.pps_targeting(&namespace, workload, &o.name))
            .unwrap_or_default()
    }

    /// The PersistentPodStates a node event concerns: those with a record on the node, and
    /// those whose pods run there (a pod can become Ready before its node is cached).
    pub fn pps_for_node(&self, node: &Node) -> Vec<ObjectRef<PersistentPodState>> {
        let name = node.name_any();
        let mut out: Vec<ObjectRef<PersistentPodState>> = self
            .pps
            .state()
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.pod_states.values().any(|r| r.node_name == name))
            })
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect();
        for pod in self.pods.state() {
            if pod.spec.node_name.as_deref() == Some(name.as_str()) {
                out.extend(self.pps_for_pod(&pod));
            }
        }
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out.dedup();
        out
    }
}

/// The StatefulSets a PersistentPodState concerns for auto-generation: the one that controls it
/// (its generated PPS changed or went away) and the one it targets.
pub fn statefulsets_of_pps(pps: &PersistentPodState) -> Vec<ObjectRef<StatefulSet>> {
    of_pps(pps, Workload::Native)
}

/// [`statefulsets_of_pps`] for OpenKruise's Advanced StatefulSets.
pub fn advanced_of_pps(pps: &PersistentPodState) -> Vec<ObjectRef<AdvancedStatefulSet>> {
    of_pps(pps, Workload::Kruise)
}

fn of_pps<K: Resource<DynamicType = ()>>(
    pps: &PersistentPodState,
    workload: Workload,
) -> Vec<ObjectRef<K>> {
    let Some(namespace) = pps.namespace() else {
        return Vec::new();
    };
    let mut out: Vec<ObjectRef<K>> = statefulset::controller_workload(pps.owner_references())
        .filter(|(w, _)| *w == workload)
        .map(|(_, o)| ObjectRef::new(&o.name).within(&namespace))
        .into_iter()
        .collect();
    if let Some((w, target)) = pps.spec.target_ref.workload()
        && w == workload
        && !out.iter().any(|r| r.name == target)
    {
        out.push(ObjectRef::new(target).within(&namespace));
    }
    out
}

/// Watch configuration for pods: StatefulSet pods only.
pub fn pod_watch_config() -> watcher::Config {
    watcher::Config::default()
        .labels(STATEFULSET_POD_NAME_LABEL)
        .any_semantic()
}

/// The labels a cached pod keeps: what the lifecycle hooks read of every pod of a StatefulSet
/// (which pods its controller deletes next: revision, ordinal, ipkeep's hold).
const KEPT_LABELS: [&str; 3] = [REVISION_LABEL, POD_INDEX_LABEL, STATE_LABEL];

/// Keeps what recording and the lifecycle hooks read of a pod: metadata without managed fields
/// and with only [`KEPT_LABELS`], of its spec the node name, of its conditions only Ready (and
/// its IPs).
pub fn trim_pod(pod: &mut CachedPod) {
    pod.metadata.managed_fields = None;
    pod.spec.readiness_gates = Vec::new();
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.retain(|k, _| KEPT_LABELS.contains(&k.as_str()));
    }
    if pod.metadata.labels.as_ref().is_some_and(|l| l.is_empty()) {
        pod.metadata.labels = None;
    }
    pod.status.conditions.retain(|c| c.type_ == "Ready");
    pod.status.conditions.shrink_to_fit();
}

/// Keeps a node's metadata (without managed fields), whether it is cordoned, and its Ready
/// condition.
pub fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.spec = node.spec.take().map(|s| NodeSpec {
        unschedulable: s.unschedulable,
        ..NodeSpec::default()
    });
    if let Some(status) = node.status.take() {
        node.status = Some(NodeStatus {
            conditions: status
                .conditions
                .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
            ..NodeStatus::default()
        });
    }
}

/// Keeps a StatefulSet's metadata (without managed fields and kubectl's copy of the last
/// applied object), replicas and ordinals, what says which pods its controller deletes next
/// (pod management policy, update strategy, the status's generation and update revision), and
/// of its pod template what the pin decision reads ([`trim_template`]).
pub fn trim_statefulset(sts: &mut StatefulSet) {
    sts.metadata.managed_fields = None;
    if let Some(a) = sts.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED_ANNOTATION);
    }
    if let Some(spec) = sts.spec.take() {
        sts.spec = Some(StatefulSetSpec {
            replicas: spec.replicas,
            ordinals: spec.ordinals,
            persistent_volume_claim_retention_policy: None,
            service_name: spec.service_name,
            pod_management_policy: spec.pod_management_policy,
            update_strategy: spec.update_strategy,
            template: trim_template(spec.template),
            ..StatefulSetSpec::default()
        });
    }
    sts.status = sts.status.take().map(|s| StatefulSetStatus {
        observed_generation: s.observed_generation,
        update_revision: s.update_revision,
        ..StatefulSetStatus::default()
    });
}

/// Keeps an Advanced StatefulSet's metadata (as [`trim_statefulset`]) and, of its pod template,
/// what the pin decision reads (the rest of the view holds only what ipkeep reads anyway).
pub fn trim_advanced(asts: &mut AdvancedStatefulSet) {
    asts.metadata.managed_fields = None;
    if let Some(a) = asts.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED_ANNOTATION);
    }
    asts.spec.template = asts.spec.template.take().map(trim_template);
}

/// Of a pod template, what the pin decision and the hooks' creation-time marks read
/// (`ipkeep_placement::admission`): labels, the retention annotation, the node the pod is bound
/// to, its node selector, node affinity and readiness gates.
fn trim_template(template: PodTemplateSpec) -> PodTemplateSpec {
    let metadata = template.metadata.map(|m| ObjectMeta {
        labels: m.labels,
        annotations: m.annotations.map(|a| {
            a.into_iter()
                .filter(|(k, _)| k.as_str() == IP_RETENTION)
                .collect()
        }),
        ..ObjectMeta::default()
    });
    let spec = template.spec.map(|s| PodSpec {
        node_name: s.node_name,
        node_selector: s.node_selector,
        affinity: s.affinity.map(|a| Affinity {
            node_affinity: a.node_affinity,
            ..Affinity::default()
        }),
        readiness_gates: s.readiness_gates,
        ..PodSpec::default()
    });
    PodTemplateSpec { metadata, spec }
}

/// Keeps a namespace's name and its auto-generation label, the only one the generate loop reads.
pub fn trim_namespace(ns: &mut Namespace) {
    ns.metadata.managed_fields = None;
    ns.metadata.annotations = None;
    if let Some(labels) = ns.metadata.labels.as_mut() {
        labels.retain(|k, _| k == AUTO_GENERATE);
    }
    if ns.metadata.labels.as_ref().is_some_and(|l| l.is_empty()) {
        ns.metadata.labels = None;
    }
    ns.spec = None;
    ns.status = None;
}

/// What of a namespace decides auto-generation: its label.
pub fn namespace_fingerprint(ns: &Namespace) -> u64 {
    fingerprint(&ns.labels().get(AUTO_GENERATE))
}

/// What of a pod decides recording: a change elsewhere triggers nothing.
pub fn pod_fingerprint(pod: &CachedPod) -> u64 {
    fingerprint(&PodView::from(pod))
}

/// What of a StatefulSet decides recording: identity, replicas, ordinals, deletion.
pub fn statefulset_fingerprint(sts: &StatefulSet) -> u64 {
    let view = ipkeep_placement::view::TargetView::from_statefulset(sts);
    // The template as trimmed: what the admission plan is decided from.
    let template = sts
        .spec
        .as_ref()
        .map(|s| serde_json::to_string(&s.template).unwrap_or_default());
    fingerprint(&(
        view.uid,
        view.ordinals,
        sts.metadata.deletion_timestamp.is_some(),
        template,
    ))
}

/// What of an Advanced StatefulSet decides recording and its state's conditions: identity,
/// ordinals, an unreadable `reserveOrdinals` entry, deletion.
pub fn advanced_fingerprint(asts: &AdvancedStatefulSet) -> u64 {
    let view = ipkeep_placement::view::TargetView::from_advanced(asts);
    fingerprint(&(
        view.uid,
        view.ordinals,
        view.invalid_reserve_ordinal,
        asts.metadata.deletion_timestamp.is_some(),
    ))
}

/// What of a node decides recording and node loss: labels and readiness.
pub fn node_fingerprint(node: &Node) -> u64 {
    let view = NodeView::from_node(node);
    fingerprint(&(view.labels, matches!(view.health, NodeHealth::Ready)))
}

fn fingerprint<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// Namespace and name: what a watch's objects are known by.
type Key = (Option<String>, String);

fn key<K: Resource>(obj: &K) -> Key {
    (
        obj.meta().namespace.clone(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

/// What of each object of a watch decided last time (its fingerprint): passes on the objects
/// whose fingerprint changed, and every deletion. A re-list forgets the objects it no longer
/// finds.
#[derive(Debug)]
pub struct Changes<K> {
    fingerprint: fn(&K) -> u64,
    seen: HashMap<Key, u64>,
    relisting: Option<HashMap<Key, u64>>,
}

impl<K: Resource> Changes<K> {
    /// Nothing seen yet; `fingerprint` hashes what of an object decides.
    pub fn new(fingerprint: fn(&K) -> u64) -> Self {
        Changes {
            fingerprint,
            seen: HashMap::new(),
            relisting: None,
        }
    }

    /// The object of `event` if it was deleted or what decides changed.
    pub fn changed<'e>(&mut self, event: &'e watcher::Event<K>) -> Option<&'e K> {
        match event {
            watcher::Event::Init => {
                self.relisting = Some(HashMap::new());
                None
            }
            watcher::Event::InitDone => {
                if let Some(found) = self.relisting.take() {
                    self.seen = found;
                }
                None
            }
            watcher::Event::InitApply(obj) => {
                let (key, print) = (key(obj), (self.fingerprint)(obj));
                let before = self.seen.get(&key).copied();
                self.relisting
                    .get_or_insert_with(HashMap::new)
                    .insert(key, print);
                (before != Some(print)).then_some(obj)
            }
            watcher::Event::Apply(obj) => {
                let print = (self.fingerprint)(obj);
                (self.seen.insert(key(obj), print) != Some(print)).then_some(obj)
            }
            watcher::Event::Delete(obj) => {
                self.seen.remove(&key(obj));
                Some(obj)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A cached namespace keeps only the label auto-generation reads; a change of any other
    /// label triggers nothing.
    #[test]
    fn a_cached_namespace_keeps_only_the_auto_generation_label() {
        let ns = |labels: serde_json::Value| -> Namespace {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "team", "labels": labels,
                             "annotations": {"note": "x"},
                             "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}
            }))
            .unwrap()
        };
        let mut labelled = ns(serde_json::json!({
            "kubernetes.io/metadata.name": "team", AUTO_GENERATE: "true"
        }));
        trim_namespace(&mut labelled);
        assert_eq!(
            labelled.metadata.labels,
            Some([(AUTO_GENERATE.to_string(), "true".to_string())].into())
        );
        assert!(labelled.metadata.annotations.is_none() && labelled.spec.is_none());
        let mut plain = ns(serde_json::json!({"kubernetes.io/metadata.name": "team"}));
        trim_namespace(&mut plain);
        assert_eq!(plain.metadata.labels, None);
        let relabelled = ns(serde_json::json!({"team": "payments", AUTO_GENERATE: "true"}));
        assert_eq!(
            namespace_fingerprint(&labelled),
            namespace_fingerprint(&relabelled)
        );
        assert_ne!(
            namespace_fingerprint(&labelled),
            namespace_fingerprint(&plain)
        );
    }

    /// Only a change of what decides passes, and every deletion; a re-list passes what changed
    /// meanwhile and forgets what it no longer finds.
    #[test]
    fn only_changes_of_what_decides_pass() {
        let ns = |name: &str, label: &str, other: &str| -> Namespace {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name,
                "labels": {AUTO_GENERATE: label, "team": other}}}))
            .unwrap()
        };
        let mut changes = Changes::new(namespace_fingerprint);
        let mut passes = |event: watcher::Event<Namespace>| changes.changed(&event).is_some();
        assert!(passes(watcher::Event::Apply(ns("a", "true", "x"))), "new");
        assert!(
            !passes(watcher::Event::Apply(ns("a", "true", "y"))),
            "not what decides"
        );
        assert!(
            passes(watcher::Event::Apply(ns("a", "false", "y"))),
            "the label"
        );
        assert!(
            passes(watcher::Event::Delete(ns("a", "false", "y"))),
            "deleted"
        );
        assert!(passes(watcher::Event::Apply(ns("b", "true", "x"))));
        assert!(passes(watcher::Event::Apply(ns("c", "true", "x"))));
        assert!(!passes(watcher::Event::Init));
        assert!(
            !passes(watcher::Event::InitApply(ns("b", "true", "x"))),
            "unchanged"
        );
        assert!(
            passes(watcher::Event::InitApply(ns("d", "true", "x"))),
            "new"
        );
        assert!(!passes(watcher::Event::InitDone));
        assert!(!passes(watcher::Event::Apply(ns("d", "true", "z"))));
        assert!(
            passes(watcher::Event::Apply(ns("c", "true", "x"))),
            "gone during the gap, so new again"
        );
    }

    /// A generated PPS concerns its StatefulSet once; one written by hand concerns its target.
    #[test]
    fn a_persistent_pod_state_concerns_its_controller_and_its_target() {
        let pps = |owner: Option<&str>, target: &str| -> PersistentPodState {
            let owners: Vec<serde_json::Value> = owner
                .into_iter()
                .map(|o| serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": o, "uid": "u", "controller": true}))
                .collect();
            serde_json::from_value(serde_json::json!({
                "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
                "metadata": {"name": "p", "namespace": "team", "ownerReferences": owners},
                "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": target}},
            }))
            .unwrap()
        };
        let names = |p: &PersistentPodState| -> Vec<(String, Option<String>)> {
            statefulsets_of_pps(p)
                .into_iter()
                .map(|r| (r.name, r.namespace))
                .collect()
        };
        let team = Some("team".to_string());
        assert_eq!(names(&pps(Some("db"), "db")), [("db".into(), team.clone())]);
        assert_eq!(names(&pps(None, "db")), [("db".into(), team.clone())]);
        assert_eq!(
            names(&pps(Some("old"), "db")),
            [("old".into(), team.clone()), ("db".into(), team)]
        );
    }

    /// Caches holding `pps` (the other caches empty).
    fn caches_with(pps: &[PersistentPodState]) -> Caches {
        let (pps_store, mut pps_writer) = kube::runtime::reflector::store();
        for p in pps {
            pps_writer.apply_watcher_event(&watcher::Event::Apply(p.clone()));
        }
        Caches {
            statefulsets: kube::runtime::reflector::store().0,
            advanced: kube::runtime::reflector::store().0,
            pods: kube::runtime::reflector::store().0,
            nodes: kube::runtime::reflector::store().0,
            pps: pps_store,
            undecodable_pps: Undecodables::new("PersistentPodState", Default::default()),
            namespaces: kube::runtime::reflector::store().0,
            synced: crate::synced::tracker().1,
        }
    }

    /// PersistentPodState `name` in `team` targeting `target` (`apiVersion`, name), controlled
    /// by `owner` (`apiVersion`, name) if given.
    fn pps_of(name: &str, target: (&str, &str), owner: Option<(&str, &str)>) -> PersistentPodState {
        let owners: Vec<serde_json::Value> = owner
            .into_iter()
            .map(|(api_version, o)| serde_json::json!({"apiVersion": api_version, "kind": "StatefulSet", "name": o, "uid": "u", "controller": true}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
            "metadata": {"name": name, "namespace": "team", "ownerReferences": owners},
            "spec": {"targetRef": {"apiVersion": target.0, "kind": "StatefulSet", "name": target.1}},
        }))
        .unwrap()
    }

    /// A pod concerns the PersistentPodStates that target its controller's workload and name:
    /// OpenKruise's Advanced StatefulSet (`apps.kruise.io`) has the same kind and names its pods
    /// alike, and is another workload than the `apps` StatefulSet of its name.
    #[test]
    fn a_pod_concerns_the_state_of_its_own_workload_only() {
        const KRUISE: &str = "apps.kruise.io/v1beta1";
        let pod = |api_version: &str| -> CachedPod {
            serde_json::from_value(serde_json::json!({"metadata": {
                "name": "db-0", "namespace": "team", "uid": "p1",
                "ownerReferences": [{"apiVersion": api_version, "kind": "StatefulSet",
                                     "name": "db", "uid": "s1", "controller": true}]}}))
            .unwrap()
        };
        let names = |refs: Vec<ObjectRef<PersistentPodState>>| -> Vec<String> {
            refs.into_iter().map(|r| r.name).collect()
        };
        let apps = caches_with(&[pps_of("db", ("apps/v1", "db"), None)]);
        assert_eq!(names(apps.pps_for_pod(&pod("apps/v1"))), ["db"]);
        assert_eq!(
            names(apps.pps_for_pod(&pod(KRUISE))),
            Vec::<String>::new(),
            "an Advanced StatefulSet's pod"
        );
        let kruise = caches_with(&[pps_of("db", (KRUISE, "db"), None)]);
        assert_eq!(
            names(kruise.pps_targeting("team", Workload::Native, "db")),
            Vec::<String>::new(),
            "a state targeting an Advanced StatefulSet"
        );
        assert_eq!(
            names(kruise.pps_for_pod(&pod("apps/v1"))),
            Vec::<String>::new()
        );
        assert_eq!(names(kruise.pps_for_pod(&pod(KRUISE))), ["db"]);
        assert_eq!(
            names(kruise.pps_for_pod(&pod("apps.kruise.io/v1alpha1"))),
            ["db"],
            "by group, as Kruise matches"
        );
    }

    /// A PersistentPodState concerns the `apps` StatefulSets that control or are targeted by it,
    /// not an Advanced StatefulSet of the same name.
    #[test]
    fn a_persistent_pod_state_concerns_apps_statefulsets_only() {
        const KRUISE: &str = "apps.kruise.io/v1beta1";
        let names = |p: &PersistentPodState| -> Vec<String> {
            statefulsets_of_pps(p).into_iter().map(|r| r.name).collect()
        };
        assert_eq!(
            names(&pps_of("p", ("apps/v1", "db"), Some((KRUISE, "old")))),
            ["db"],
            "controlled by an Advanced StatefulSet"
        );
        assert_eq!(
            names(&pps_of("p", (KRUISE, "db"), Some(("apps/v1", "old")))),
            ["old"],
            "targeting an Advanced StatefulSet"
        );
        let advanced = |p: &PersistentPodState| -> Vec<String> {
            advanced_of_pps(p).into_iter().map(|r| r.name).collect()
        };
        assert_eq!(
            advanced(&pps_of("p", (KRUISE, "db"), Some((KRUISE, "old")))),
            ["old", "db"]
        );
        assert_eq!(
            advanced(&pps_of("p", ("apps/v1", "db"), Some(("apps/v1", "db")))),
            Vec::<String>::new()
        );
    }

    /// A pod as the API server sends it: what the cached pod keeps gives the decisions the same
    /// view as the whole pod, and what it drops is what nothing reads.
    #[test]
    fn a_cached_pod_gives_the_decisions_the_same_view_as_the_whole_pod() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "db-1", "namespace": "prod", "uid": "u-1", "resourceVersion": "7",
                "creationTimestamp": "2026-11-25T10:00:00Z",
                "labels": {"app": "db", "statefulset.kubernetes.io/pod-name": "db-1",
                           "controller-revision-hash": "db-7c9"},
                "annotations": {"ipkeep.dev/pinned-by": "db", "team": "payments"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                     "uid": "s-1", "controller": true}],
                "managedFields": [{"manager": "kubelet", "operation": "Update"}]
            },
            "spec": {"nodeName": "node-1", "containers": [{"name": "db", "image": "postgres:17"}]},
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-25T10:00:05Z"}
                ],
                "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::5"}],
                "containerStatuses": [{"name": "db", "ready": true, "restartCount": 0, "image": "x",
                                       "imageID": "y"}]
            }
        });
        let whole: Pod = serde_json::from_value(json.clone()).unwrap();
        let mut cached: CachedPod = serde_json::from_value(json).unwrap();
        trim_pod(&mut cached);
        assert_eq!(PodView::from(&cached), PodView::from_pod(&whole));
        let mut finished = whole.clone();
        finished.status.as_mut().unwrap().phase = Some("Failed".into());
        let mut cached_finished: CachedPod =
            serde_json::from_value(serde_json::to_value(&finished).unwrap()).unwrap();
        trim_pod(&mut cached_finished);
        assert!(PodView::from(&cached_finished).terminating);
        assert_eq!(
            PodView::from(&cached_finished),
            PodView::from_pod(&finished)
        );
        assert!(cached.metadata.managed_fields.is_none());
        assert_eq!(
            cached.metadata.labels,
            Some([(REVISION_LABEL.to_string(), "db-7c9".to_string())].into()),
            "only what the lifecycle hooks read"
        );
        assert_eq!(cached.status.conditions.len(), 1, "only Ready is kept");
    }
}
