//! Annotation and label keys whose values are parsed by [`crate`]'s grammars.

/// Pod (read by the CNI plugin) and StatefulSet (copied into `spec.ipRetention`): how long a
/// deleted pod's addresses stay held for it, in the [`crate::retention`] grammar.
pub const IP_RETENTION: &str = "ipkeep.dev/ip-retention";
/// Pod: OpenKruise's retention annotation, whole minutes (`0` for off).
pub const KRUISE_RESERVED_IP: &str = "io.kubernetes.cri/reserved-ip-duration";
/// Pod (set by the scheduler extension on every pod it manages): the PersistentPodState that
/// manages it. The CNI plugin records it with the pod's addresses; only pods that carry it get
/// the retention their annotations ask for in full.
pub const PERSISTENT_POD_STATE: &str = "ipkeep.dev/persistent-pod-state";
/// Pod label set by the StatefulSet controller (Kubernetes 1.28 and later): the pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
