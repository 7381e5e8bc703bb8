//! The `PersistentPodState` custom resource: which workload to follow, which node labels to pin,
//! and (in status) what was recorded for each of its pods.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a PersistentPodState asks for. JSON names follow OpenKruise's `apps.kruise.io/v1alpha1`.
// Every list, map and string has a bound in the schema (the `MAX_*` constants below,
// docs/reference.md), so what anyone may write into a PersistentPodState stays small for every
// component that caches it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipkeep.dev",
    version = "v1alpha1",
    kind = "PersistentPodState",
    namespaced,
    status = "PersistentPodStateStatus",
    shortname = "pps",
    category = "ipkeep",
    doc = "Records, for every pod of a StatefulSet, the node it ran on (with the node's topology labels) and its IPs, so that a rebuilt pod is pinned to the same node or zone and gets the same IPs back (ipkeep.dev).",
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.targetRef.name","description":"The StatefulSet whose pods are recorded"}"#,
    printcolumn = r#"{"name":"Recorded","type":"integer","jsonPath":".status.recordedPods","description":"Pods with a record"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PersistentPodStateSpec {
    /// The workload whose pods are recorded, in the same namespace: a StatefulSet (`apps/v1`) or
    /// an OpenKruise Advanced StatefulSet (`apps.kruise.io/v1beta1`).
    pub target_ref: TargetReference,
    /// Pod annotation keys whose values are recorded in status (record only, as in OpenKruise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_PERSISTENT_POD_ANNOTATIONS))]
    pub persistent_pod_annotations: Vec<PersistentPodAnnotation>,
    /// Node label keys whose recorded values a rebuilt pod must match (required node affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_persistent_topology: Option<NodeTopologyTerm>,
    /// Node label keys whose recorded values a rebuilt pod should match, with a weight each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_PREFERRED_TERMS))]
    pub preferred_persistent_topology: Vec<PreferredTopologyTerm>,
    /// When records are removed: `WhenScaled` (ordinal no longer in the StatefulSet's range, and
    /// no pod holds the name) or `WhenDeleted` (only when the StatefulSet is gone).
    #[serde(default)]
    pub persistent_pod_state_retention_policy: RecordRetention,
    /// ipkeep addition: what to do when a recorded node is gone or NotReady.
    #[serde(default)]
    pub node_loss_policy: NodeLossPolicy,
    /// ipkeep addition: how long the CNI plugin holds a deleted pod's addresses for its rebuild
    /// (`30m`, `24h`, `forever`; `0` turns retention off). The scheduler extension stamps it on
    /// the pod as `ipkeep.dev/ip-retention`.
    #[serde(default = "default_ip_retention")]
    #[schemars(
        regex(pattern = r"^(0|forever|([0-9]+(ns|us|ms|s|m|h|d))+)$"),
        length(max = MAX_DURATION_LENGTH)
    )]
    pub ip_retention: String,
    /// ipkeep addition: lifecycle hooks for the StatefulSet's pods, shaped after OpenKruise's
    /// `lifecycle` with `labelsHandler` (docs/lifecycle.md). `preNormal` keeps a new pod not
    /// Ready until your operator gives it the hook's labels; `preDelete` holds a pod's deletion
    /// and eviction while the pod has its labels. Both usually name the same label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleSpec>,
}

/// `spec.lifecycle`: two hooks, each a set of pod labels (a pod "carries" a hook while it has
/// them all with these values).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleSpec {
    /// A new pod is `PreparingNormal`, and not Ready, until it carries these labels: your
    /// operator adds them once it registered the pod (state `Normal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_normal: Option<PreNormalHook>,
    /// While a pod carries these labels, its deletion and eviction are held and the pod is
    /// `PreparingDelete`; your operator removes one once it deregistered the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_delete: Option<PreDeleteHook>,
}

/// The CEL rule every `labelsHandler` key passes: a label key as Kubernetes checks one, an
/// optional prefix (a DNS subdomain of at most 253 characters) and `/`, then a name of at most
/// 63 characters. The first `matches` bounds the prefix's length, the second checks the syntax
/// of both parts.
const LABELS_HANDLER_RULE: &str = "self.all(k, k.matches('^([^/]{1,253}/)?[^/]*$') && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))";

/// What a label value may be.
const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// The schema of both hooks' `labelsHandler`: 1 to 16 labels, keys checked by
/// [`LABELS_HANDLER_RULE`], values by [`LABEL_VALUE_PATTERN`].
fn labels_handler_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "minProperties": 1,
        "maxProperties": 16,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
        "x-kubernetes-validations": [{
            "rule": LABELS_HANDLER_RULE,
            "message": "every key must be a label key, such as registry.example.com/registered"
        }]
    })
}

/// `spec.lifecycle.preNormal`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreNormalHook {
    /// Label keys and values: a new pod is `PreparingNormal` until it has them all.
    #[schemars(schema_with = "labels_handler_schema")]
    pub labels_handler: BTreeMap<String, String>,
    /// Keep the pod not Ready while `PreparingNormal` (default true: the point of the hook).
    #[serde(default = "yes")]
    pub mark_pod_not_ready: bool,
}

/// `spec.lifecycle.preDelete`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreDeleteHook {
    /// Label keys and values: while a pod has them all, its deletion and eviction are refused.
    #[schemars(schema_with = "labels_handler_schema")]
    pub labels_handler: BTreeMap<String, String>,
    /// Take the pod out of its Services (not Ready) as soon as its deletion is held, so traffic
    /// drains before your operator deregisters it (default false).
    #[serde(default)]
    pub mark_pod_not_ready: bool,
    /// How long a deletion may be held, counted from the first refusal (default 600); after it,
    /// every deletion and eviction passes, so a drain is never blocked for ever.
    #[serde(default = "default_pre_delete_timeout")]
    #[schemars(range(min = 1, max = 604_800))]
    pub timeout_seconds: i64,
}

fn yes() -> bool {
    true
}

/// The default `spec.lifecycle.preDelete.timeoutSeconds`.
pub const DEFAULT_PRE_DELETE_TIMEOUT_SECONDS: i64 = 600;

fn default_pre_delete_timeout() -> i64 {
    DEFAULT_PRE_DELETE_TIMEOUT_SECONDS
}

/// The default `spec.ipRetention`.
pub const DEFAULT_IP_RETENTION: &str = "24h";

fn default_ip_retention() -> String {
    DEFAULT_IP_RETENTION.to_string()
}

/// A reference to the recorded workload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetReference {
    /// `apps/v1`, or `apps.kruise.io/v1beta1` (or `v1alpha1`) for an Advanced StatefulSet.
    #[schemars(length(min = 1, max = MAX_NAME_LENGTH))]
    pub api_version: String,
    /// `StatefulSet`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// The StatefulSet's name.
    #[schemars(length(min = 1, max = MAX_NAME_LENGTH))]
    pub name: String,
}

/// A pod annotation to record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PersistentPodAnnotation {
    /// The annotation key.
    #[schemars(length(min = 1, max = MAX_KEY_LENGTH))]
    pub key: String,
}

/// A set of node label keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTopologyTerm {
    /// Node label keys, e.g. `kubernetes.io/hostname`, `topology.kubernetes.io/zone`.
    #[schemars(
        length(min = 1, max = MAX_TOPOLOGY_KEYS),
        inner(length(min = 1, max = MAX_KEY_LENGTH))
    )]
    pub node_topology_keys: Vec<String>,
}

/// A weighted preferred term.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PreferredTopologyTerm {
    /// 1..100, as in a pod's preferred node affinity.
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    /// The node label keys of this term.
    pub preference: NodeTopologyTerm,
}

/// When a record is removed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum RecordRetention {
    /// Drop a record once its ordinal is outside `[ordinals.start, ordinals.start + replicas)`
    /// and no pod holds its name.
    #[default]
    WhenScaled,
    /// Keep every record while the StatefulSet exists.
    WhenDeleted,
}

/// What happens to a pod pinned to a node that is gone or NotReady.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeLossPolicy {
    /// `FallbackToPreferred` (default): after `after`, pin only by preferred terms, so the pod
    /// may start elsewhere (with a new IP). `Wait`: stay pinned; the pod is Pending until the
    /// node returns or the record is removed by hand.
    #[serde(default)]
    pub action: NodeLossAction,
    /// How long the node must have been NotReady, or missing, before the action applies.
    #[serde(default = "default_node_loss_after")]
    #[schemars(
        regex(pattern = r"^([0-9]+(ns|us|ms|s|m|h|d))+$"),
        length(max = MAX_DURATION_LENGTH)
    )]
    pub after: String,
}

/// The default `spec.nodeLossPolicy.after`.
pub const DEFAULT_NODE_LOSS_AFTER: &str = "5m";

fn default_node_loss_after() -> String {
    DEFAULT_NODE_LOSS_AFTER.to_string()
}

impl Default for NodeLossPolicy {
    fn default() -> Self {
        Self {
            action: NodeLossAction::default(),
            after: default_node_loss_after(),
        }
    }
}

/// See [`NodeLossPolicy::action`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum NodeLossAction {
    /// Pin by preferred terms only once the node has been lost for `after`.
    #[default]
    FallbackToPreferred,
    /// Keep the required pin.
    Wait,
}

/// What the controller observed and recorded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentPodStateStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// ipkeep addition: the UID of the StatefulSet the records belong to. Records of a deleted
    /// StatefulSet never carry over to a new one with the same name.
    #[serde(default, rename = "targetUID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_UID_LENGTH))]
    pub target_uid: Option<String>,
    /// ipkeep addition: the number of records (for `kubectl get pps`).
    #[serde(default)]
    #[schemars(range(min = 0, max = MAX_POD_STATES))]
    pub recorded_pods: i32,
    /// One record per pod name.
    #[serde(default)]
    #[schemars(extend("maxProperties" = MAX_POD_STATES))]
    pub pod_states: BTreeMap<String, PodState>,
    /// ipkeep addition: `Ready` (spec valid, target found, recording), `NodeLost` and
    /// `AdmissionPlanned`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_CONDITIONS))]
    pub conditions: Vec<Condition>,
}

/// Where a pod last ran while Ready.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodState {
    /// The node the pod was Ready on.
    #[schemars(length(max = MAX_NAME_LENGTH))]
    pub node_name: String,
    /// That node's values for every configured topology key it has.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "topology_labels_schema")]
    pub node_topology_labels: BTreeMap<String, String>,
    /// Values of `spec.persistentPodAnnotations` keys present on the pod (a value of more than
    /// 1024 characters is not recorded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "recorded_annotations_schema")]
    pub annotations: BTreeMap<String, String>,
    /// ipkeep addition: the pod's IPs (`status.podIPs`) when recorded.
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), inner(length(max = 64)))]
    pub pod_ips: Vec<String>,
    /// ipkeep addition: the UID of the recorded pod.
    #[serde(default, rename = "podUID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_UID_LENGTH))]
    pub pod_uid: Option<String>,
    /// ipkeep addition: when this record was written (or last moved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub recorded_at: Option<Time>,
    /// ipkeep addition: since when the node has been NotReady or missing, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub node_lost_at: Option<Time>,
    /// ipkeep addition: the node-loss policy fell back; the scheduler extension pins this pod by
    /// preferred terms only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preferred_only: bool,
}

/// A status condition (the shape of `metav1.Condition`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `NodeLost` or `AdmissionPlanned`.
    #[serde(rename = "type")]
    #[schemars(length(max = 316))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(length(max = 16))]
    pub status: String,
    /// A CamelCase reason.
    #[schemars(length(max = 1024))]
    pub reason: String,
    /// What happened and what to do about it.
    #[schemars(length(max = MAX_CONDITION_MESSAGE_LENGTH))]
    pub message: String,
    /// When `status` last changed.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub last_transition_time: Time,
    /// The generation this condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Most `spec.persistentPodAnnotations`.
pub const MAX_PERSISTENT_POD_ANNOTATIONS: usize = 16;
/// Most `spec.preferredPersistentTopology` terms.
pub const MAX_PREFERRED_TERMS: usize = 8;
/// Most node label keys in one topology term.
pub const MAX_TOPOLOGY_KEYS: usize = 8;
/// Longest label or annotation key: a DNS subdomain prefix of 253, `/`, a name of 63.
pub const MAX_KEY_LENGTH: usize = 317;
/// Longest label value.
pub const MAX_LABEL_VALUE_LENGTH: usize = 63;
/// Longest object name (a DNS subdomain) and `targetRef.apiVersion`.
pub const MAX_NAME_LENGTH: usize = 253;
/// Longest UID kept (Kubernetes writes 36 characters).
pub const MAX_UID_LENGTH: usize = 64;
/// Longest duration (`ipRetention`, `nodeLossPolicy.after`).
pub const MAX_DURATION_LENGTH: usize = 32;
/// Most records (`status.podStates`); in practice the object's size (etcd's 1.5 MiB request
/// limit) allows about 6,000 records of a few hundred bytes.
pub const MAX_POD_STATES: usize = 10_000;
/// Longest recorded pod annotation value: a longer one is not recorded.
pub const MAX_RECORDED_ANNOTATION_LENGTH: usize = 1024;
/// Most status conditions.
pub const MAX_CONDITIONS: usize = 8;
/// Longest condition message (as `metav1.Condition`).
pub const MAX_CONDITION_MESSAGE_LENGTH: usize = 32_768;

/// A map of label-like keys (at most `max` of them, keys of at most [`MAX_KEY_LENGTH`]) to
/// strings of at most `value_max` characters.
fn bounded_map(max: usize, value_max: usize) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": max,
        "additionalProperties": {"type": "string", "maxLength": value_max},
        "x-kubernetes-validations": [{
            "rule": format!("self.all(k, size(k) <= {MAX_KEY_LENGTH})"),
            "message": format!("keys are at most {MAX_KEY_LENGTH} characters")
        }]
    })
}

/// `status.podStates[].nodeTopologyLabels`: node label values, one per configured key.
fn topology_labels_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    bounded_map(
        MAX_TOPOLOGY_KEYS * (MAX_PREFERRED_TERMS + 1),
        MAX_LABEL_VALUE_LENGTH,
    )
}

/// `status.podStates[].annotations`: one value per `spec.persistentPodAnnotations` key.
fn recorded_annotations_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    bounded_map(
        MAX_PERSISTENT_POD_ANNOTATIONS,
        MAX_RECORDED_ANNOTATION_LENGTH,
    )
}

impl PersistentPodStateStatus {
    /// The condition of that type, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn openkruise_v1alpha1_json_deserializes_and_defaults_apply() {
        let spec: PersistentPodStateSpec = serde_json::from_value(serde_json::json!({
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web"},
            "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
            "preferredPersistentTopology": [
                {"weight": 100, "preference": {"nodeTopologyKeys": ["topology.kubernetes.io/zone"]}}
            ],
            "persistentPodStateRetentionPolicy": "WhenDeleted"
        }))
        .unwrap();
        assert_eq!(spec.ip_retention, "24h");
        assert_eq!(
            spec.node_loss_policy.action,
            NodeLossAction::FallbackToPreferred
        );
        assert_eq!(spec.node_loss_policy.after, "5m");
        assert_eq!(
            spec.persistent_pod_state_retention_policy,
            RecordRetention::WhenDeleted
        );
    }

    #[test]
    fn crd_schema_carries_the_validation_rules() {
        let crd = serde_json::to_value(PersistentPodState::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let pref = &spec["properties"]["preferredPersistentTopology"]["items"];
        assert_eq!(pref["properties"]["weight"]["minimum"], 1.0);
        assert_eq!(pref["properties"]["weight"]["maximum"], 100.0);
        let keys =
            &spec["properties"]["requiredPersistentTopology"]["properties"]["nodeTopologyKeys"];
        assert_eq!(keys["items"]["minLength"], 1);
        assert_eq!(
            spec["properties"]["targetRef"]["required"],
            serde_json::json!(["apiVersion", "kind", "name"])
        );
        let policy = &spec["properties"]["persistentPodStateRetentionPolicy"];
        assert_eq!(
            policy["enum"],
            serde_json::json!(["WhenScaled", "WhenDeleted"])
        );
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!(["pps"])
        );
    }
}
