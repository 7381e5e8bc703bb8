//! Every annotation and label key ipkeep reads or writes, in one place: the `ipkeep.dev/…` keys
//! (lifecycle keys included), the OpenKruise spellings ipkeep also accepts, and the Kubernetes
//! keys it reads. Each `ipkeep.dev/…` key that OpenKruise also has is accepted under its
//! `kruise.io/…` spelling too; the ipkeep spelling wins when both are set ([`lookup`]).

use std::collections::BTreeMap;

// StatefulSet annotations, read by the controller (and copied into a generated
// PersistentPodState's spec).

/// StatefulSet annotation: `"true"` makes the controller generate a PersistentPodState for it;
/// any other value opts it out. Namespace label of the same key: `"true"` does the same for every
/// StatefulSet of the namespace that has no such annotation of its own.
pub const AUTO_GENERATE: &str = "ipkeep.dev/auto-generate-persistent-pod-state";
/// StatefulSet: comma-separated node label keys whose recorded values become required affinity.
pub const REQUIRED_TOPOLOGY: &str = "ipkeep.dev/required-persistent-topology";
/// StatefulSet: comma-separated node label keys that become one preferred term of weight 100.
pub const PREFERRED_TOPOLOGY: &str = "ipkeep.dev/preferred-persistent-topology";
/// StatefulSet (copied into `spec.nodeLossPolicy.action` of a generated PersistentPodState):
/// `FallbackToPreferred` (default) or `Wait`.
pub const NODE_LOSS_ACTION: &str = "ipkeep.dev/node-loss-action";
/// StatefulSet (copied into `spec.nodeLossPolicy.after` of a generated PersistentPodState): how
/// long a recorded node is missing or NotReady before the action applies, e.g. `5m`, in the
/// [`crate::duration`] grammar.
pub const NODE_LOSS_AFTER: &str = "ipkeep.dev/node-loss-after";
/// StatefulSet: `"true"` lets it adopt the PersistentPodState, the records and (through them) the
/// held IPs left by an earlier StatefulSet of the same name (deleted with `--cascade=orphan`, or
/// by a Helm re-install that kept the PersistentPodState), instead of starting afresh.
pub const ADOPT_PERSISTENT_POD_STATE: &str = "ipkeep.dev/adopt-persistent-pod-state";
/// StatefulSet (copied into `spec.lifecycle` of a generated PersistentPodState): the lifecycle
/// hooks as JSON, exactly as `spec.lifecycle` would be written, e.g.
/// `{"preNormal":{"labelsHandler":{"registry.example.com/registered":"true"}}}`.
pub const LIFECYCLE: &str = "ipkeep.dev/lifecycle";

// Pod annotations the scheduler extension stamps and the CNI plugin reads.

/// Pod (read by the CNI plugin) and StatefulSet (copied into `spec.ipRetention`): how long a
/// deleted pod's addresses stay held for it, e.g. `30m`, `24h`, `forever`; `0` turns it off. In
/// the [`crate::retention`] grammar.
pub const IP_RETENTION: &str = "ipkeep.dev/ip-retention";
/// Pod (set by the scheduler extension on every pod it manages): the PersistentPodState that
/// manages it. The CNI plugin records it with the pod's addresses; only pods that carry it get
/// the retention their annotations ask for in full, and the node agent releases the addresses as
/// soon as that PersistentPodState is deleted.
pub const PERSISTENT_POD_STATE: &str = "ipkeep.dev/persistent-pod-state";
/// Pod (set by the scheduler extension): the PersistentPodState whose record pinned this pod.
pub const PINNED_BY: &str = "ipkeep.dev/pinned-by";
/// Pod (set by the scheduler extension): why a recorded pin was not applied to this pod.
pub const PIN_SKIPPED: &str = "ipkeep.dev/pin-skipped";

// Pod label, annotations and condition of the lifecycle hooks (`ipkeep-lifecycle`).

/// Pod label that shows where a pod stands in its lifecycle hooks (`PreparingNormal`, `Normal`,
/// `PreparingDelete`).
pub const STATE_LABEL: &str = "ipkeep.dev/lifecycle-state";
/// Pod annotation with the unix second its preDelete hold started, while it is
/// `PreparingDelete`: a copy of [`HELD_CONDITION`]'s time, for people and for older releases.
/// Anyone who may patch the pod can change it, so ipkeep reads it only from a pod held without
/// the condition, and never as a time later than now.
pub const SINCE_ANNOTATION: &str = "ipkeep.dev/lifecycle-since";
/// Pod annotation that says why the pod is `PreparingDelete`.
pub const HELD_ANNOTATION: &str = "ipkeep.dev/lifecycle-held";
/// PersistentPodState label: set (`"true"`) by the admission policy `ipkeep-admission-pending`
/// when a PersistentPodState with lifecycle hooks is created (or gets its hooks), removed by
/// ipkeep-controller once the admission plan of its StatefulSet is in place. While it is set, the
/// admission policy `ipkeep-hooks-pending` refuses to create the StatefulSet's pods (its
/// controller retries), so that even its first pods get their hooks.
pub const ADMISSION_PENDING_LABEL: &str = "ipkeep.dev/admission-pending";
/// ConfigMap label of ipkeep-controller's admission plan of a namespace
/// (`ipkeep-admission-plan`): the admission policy `ipkeep-pin` selects its parameter by it, and
/// the admission policy `ipkeep-admission-plan-writers` lets no one but the controller write a
/// ConfigMap that carries it.
pub const ADMISSION_PLAN_LABEL: &str = "ipkeep.dev/admission-plan";
/// The readiness gate (condition type) ipkeep sets on pods of a StatefulSet with hooks.
pub const READINESS_GATE: &str = "ipkeep.dev/lifecycle-ready";
/// Pod condition type: True while ipkeep-controller holds the pod `PreparingDelete`, its
/// `lastTransitionTime` the hold's start, from which the preDelete timeout runs. It is in the
/// pod's status, which only the status subresource writes (ipkeep-controller; Kubernetes'
/// `edit` and `admin` roles cannot), so a pod's tenant cannot move it.
pub const HELD_CONDITION: &str = "ipkeep.dev/lifecycle-held";

// OpenKruise's spellings, accepted too.

/// OpenKruise's spelling of [`AUTO_GENERATE`].
pub const KRUISE_AUTO_GENERATE: &str = "kruise.io/auto-generate-persistent-pod-state";
/// OpenKruise's spelling of [`REQUIRED_TOPOLOGY`].
pub const KRUISE_REQUIRED_TOPOLOGY: &str = "kruise.io/required-persistent-topology";
/// OpenKruise's spelling of [`PREFERRED_TOPOLOGY`].
pub const KRUISE_PREFERRED_TOPOLOGY: &str = "kruise.io/preferred-persistent-topology";
/// Pod: OpenKruise's retention annotation, whole minutes (`0` for off).
pub const KRUISE_RESERVED_IP: &str = "io.kubernetes.cri/reserved-ip-duration";

/// Pod: the annotations that decide a managed pod's IP retention, besides the link
/// ([`PERSISTENT_POD_STATE`]) the webhook writes.
pub const RETENTION_ANNOTATIONS: [&str; 2] = [IP_RETENTION, KRUISE_RESERVED_IP];

// Kubernetes' own labels and annotations.

/// Node label that names a node: a pin on it pins one node, and it is the topology a
/// StatefulSet generated by its namespace's label is recorded by.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Pod label set by the StatefulSet controller: the revision of the StatefulSet the pod was
/// made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// Pod label set by the StatefulSet controller (Kubernetes 1.28 and later): the pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// Pod annotation of a mirror Pod (read by the node agent): its static pod's UID, which is the
/// UID the container runtime (and so the CNI plugin) knows the pod by.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// kubectl's copy of the object it last applied (the controller drops it from its caches: a
/// StatefulSet's whole JSON again).
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// The label every StatefulSet pod carries (set by the StatefulSet controller); the controller
/// watches only pods that have it.
pub const STATEFULSET_POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// Looks up an annotation under its ipkeep key, then its OpenKruise key.
pub fn lookup<'a>(
    annotations: Option<&'a BTreeMap<String, String>>,
    ipkeep_key: &str,
    kruise_key: Option<&str>,
) -> Option<&'a str> {
    let annotations = annotations?;
    annotations
        .get(ipkeep_key)
        .or_else(|| kruise_key.and_then(|k| annotations.get(k)))
        .map(String::as_str)
}
