//! Which PersistentPodState manages the pod of a CNI ADD or DEL, decided from what the API
//! server says now (the agent's caches), not from the annotations the webhook stamped when the
//! pod was created: a pod created before its PersistentPodState existed carries none, and is
//! managed all the same. Pure: the caches are read by [`ClusterApi`], the decision is
//! [`management`].
//!
//! The pod is the one the API shows on this node under the command's pod name, if its UID is
//! the one the runtime passed (`K8S_POD_UID`): a pod created under that name since is another
//! pod. A pod is managed when, at that moment,
//! * it is on this node, its controlling owner is a StatefulSet (group `apps`) or an OpenKruise
//!   Advanced StatefulSet (`apps.kruise.io`), by [`ipkeep_api::statefulset`], and the
//!   PersistentPodState targeting that one (the webhook's rule,
//!   [`pin::persistent_pod_state_of`]; a state of the other workload of the name is not its) is not being
//!   deleted ([`pin::decide`], the webhook's own decision, says it manages the pod);
//! * that StatefulSet is the one the state records (its UID is the state's `status.targetUID`,
//!   [`pin::controlled_by_recorded_target`]): whoever creates a pod writes its owner reference,
//!   so the name proves nothing. Only while the state waits to be adopted by a re-created
//!   StatefulSet ([`pin::awaiting_adoption`]) does the name do;
//! * its ordinal is in range: its name is `<statefulset>-<ordinal>` with the canonical ordinal
//!   the StatefulSet controller writes, agreeing with its `apps.kubernetes.io/pod-index` label
//!   when it has one (Kruise sets it unless its `PodIndexLabel` gate is off).
//!   Ordinals beyond `replicas` are held like any other: under `WhenScaled` the controller prunes
//!   their records once their pods are gone, and the sweep then releases the holdings;
//! * or, for a pod on this node without a controlling StatefulSet (orphaned by
//!   `kubectl delete sts --cascade=orphan`, its state kept for adoption), a state records this
//!   very pod (the record's pod UID is the pod's);
//! * or, at a DEL, for a pod the API no longer shows on this node (force-deleted, or gone
//!   before a DEL that came late), a state records this very pod, or (said as
//!   `judged_by_name`) its name is what the target StatefulSet of a PersistentPodState in its
//!   namespace would name it.
//!
//! At an ADD the pod exists in the API server: when the agent's view does not show it (its pod
//! watch is a moment behind) nothing is decided.
//!
//! A managed pod's retention annotations are what the webhook stamps
//! ([`affinity::stamp_retention`]): its own readable `ipkeep.dev/ip-retention`, else the
//! state's `spec.ipRetention`. Nothing the pod's author writes counts for more than the webhook
//! would let it.
//!
//! While the agent's view is not usable (caches not synced, a watch relisting after an error,
//! its Node unknown) nothing is decided: at an ADD the pod's annotations decide, as in the
//! plugin alone. A DEL while the caches sync is deferred ([`Management::Syncing`]): the
//! addresses stay with the sandbox, and once the view is synced the sweep applies the DEL as
//! one that never came, decided like any DEL (the annotations alone would free the address of
//! a managed pod the webhook did not stamp). With the Node unknown (a wrong `--node-name`,
//! which may never end) the annotations decide at DEL too.
//! The same holds for the pods of a namespace that has a PersistentPodState the agent cannot
//! decode: that state might manage any of them, so none is called unmanaged (which would cap
//! its retention), and none managed by a state whose retention is unknown.

use std::collections::BTreeMap;

use ipkeep_api::PersistentPodState;
use ipkeep_cni::management::{ApiView, Management, SandboxPod, Unavailable};
use ipkeep_ipam::StateRef;
use ipkeep_placement::affinity::stamp_retention;
use ipkeep_placement::pin::{self, Decision};
use ipkeep_values::keys::{POD_INDEX_LABEL, RETENTION_ANNOTATIONS};
use ipkeep_values::ordinal;
use k8s_openapi::api::core::v1::Pod;

use crate::cluster::{Cluster, Readiness, runtime_uid};

/// Decides who manages `asked`, the pod of a command. `pod` is the pod of that name the API
/// shows on this node, if any; `states` are the PersistentPodStates of its namespace and
/// `undecodable` the names of those there that the agent cannot decode. The runtime's
/// annotations count only for a pod the API no longer shows.
pub fn management(
    readiness: Readiness,
    asked: &SandboxPod<'_>,
    pod: Option<&Pod>,
    states: &[&PersistentPodState],
    undecodable: &[String],
) -> Management {
    if readiness != Readiness::Ready {
        let unavailable = Unavailable {
            why: format!(
                "the node agent's view of the API server is not usable ({})",
                readiness.as_str()
            ),
            expected: true,
        };
        // A DEL waits for caches that are syncing: the annotations alone would free the
        // address of a managed pod the webhook did not stamp. Not for an unknown Node: that is
        // a wrong --node-name, which nothing but the operator ends.
        return if readiness == Readiness::Syncing && !asked.adding {
            Management::Syncing(unavailable)
        } else {
            Management::Unknown(unavailable)
        };
    }
    if let Some(state) = undecodable.first() {
        return Management::Unknown(Unavailable {
            why: format!(
                "the node agent cannot decode PersistentPodState {}/{state} (its log says why), which may manage this pod",
                asked.namespace
            ),
            expected: true,
        });
    }
    let pod = pod.filter(|p| {
        asked
            .uid
            .is_none_or(|uid| runtime_uid(p).as_deref() == Some(uid))
    });
    match pod {
        Some(pod) => of_pod_on_node(asked, pod, states),
        None if asked.adding => Management::Unknown(Unavailable {
            why: "the node agent's view of the API server does not show this pod yet".into(),
            expected: true,
        }),
        None => of_pod_gone(asked, states),
    }
}

fn of_pod_on_node(asked: &SandboxPod<'_>, pod: &Pod, states: &[&PersistentPodState]) -> Management {
    let name = asked.name;
    let Some((workload, statefulset)) = pin::statefulset_of(pod) else {
        return of_orphan(name, pod, states);
    };
    let pps = pin::persistent_pod_state_of(states.iter().copied(), workload, &statefulset);
    let Decision::Manage(managed) = pin::decide(pod, asked.namespace, pps) else {
        return Management::Unmanaged;
    };
    let recorded_target = |pps: &PersistentPodState| {
        pin::controlled_by_recorded_target(pod, pps) || pin::awaiting_adoption(pps)
    };
    if !pps.is_some_and(recorded_target) {
        return Management::Unmanaged;
    }
    let index = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(POD_INDEX_LABEL))
        .map(String::as_str);
    if ordinal::of_pod(name, &statefulset, index).is_none() {
        return Management::Unmanaged;
    }
    let mut annotations = retention_annotations(pod.metadata.annotations.as_ref());
    stamp_retention(&managed.pps, managed.retention.as_deref(), &mut annotations);
    Management::Managed {
        persistent_pod_state: StateRef {
            name: managed.pps,
            uid: pps.and_then(|p| p.metadata.uid.clone()),
        },
        annotations,
        judged_by_name: false,
    }
}

/// A pod without a controlling StatefulSet: `kubectl delete sts --cascade=orphan` leaves its
/// pods so, and a PersistentPodState kept for adoption still records them. Managed only by a
/// state whose record of that name is this very pod (the UID the controller recorded when the
/// pod was its StatefulSet's and Ready): nothing a pod's author writes can claim that.
fn of_orphan(name: &str, pod: &Pod, states: &[&PersistentPodState]) -> Management {
    let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
        return Management::Unmanaged;
    };
    let recorded = |p: &&&PersistentPodState| {
        p.status
            .as_ref()
            .and_then(|s| s.pod_states.get(name))
            .and_then(|r| r.pod_uid.as_deref())
            == Some(uid)
    };
    let Some(pps) = states
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find(recorded)
    else {
        return Management::Unmanaged;
    };
    let mut annotations = retention_annotations(pod.metadata.annotations.as_ref());
    stamp_retention(
        &state_ref(pps).name,
        pin::stamped_retention(pps).as_deref(),
        &mut annotations,
    );
    Management::Managed {
        persistent_pod_state: state_ref(pps),
        annotations,
        judged_by_name: false,
    }
}

fn state_ref(pps: &PersistentPodState) -> StateRef {
    StateRef {
        name: pps.metadata.name.clone().unwrap_or_default(),
        uid: pps.metadata.uid.clone(),
    }
}

/// A pod the API no longer shows on this node, at its DEL: managed by the state that records
/// this very pod (the record's pod UID is the one the runtime passed), else, judged by its name
/// alone, by the state whose StatefulSet would name it so.
fn of_pod_gone(asked: &SandboxPod<'_>, states: &[&PersistentPodState]) -> Management {
    let name = asked.name;
    let target = states
        .iter()
        .filter_map(|p| p.spec.target_ref.workload())
        .find(|(_, statefulset)| ordinal::from_name(name, statefulset).is_some());
    let Some(pps) =
        target.and_then(|(w, s)| pin::persistent_pod_state_of(states.iter().copied(), w, s))
    else {
        return Management::Unmanaged;
    };
    if pps.metadata.deletion_timestamp.is_some() {
        return Management::Unmanaged;
    }
    let recorded = pps
        .status
        .as_ref()
        .and_then(|s| s.pod_states.get(name))
        .and_then(|r| r.pod_uid.as_deref())
        .filter(|uid| !uid.is_empty());
    let state = state_ref(pps);
    let mut stamped = retention_annotations(asked.annotations);
    stamp_retention(
        &state.name,
        pin::stamped_retention(pps).as_deref(),
        &mut stamped,
    );
    Management::Managed {
        persistent_pod_state: state,
        annotations: stamped,
        judged_by_name: recorded.is_none_or(|r| Some(r) != asked.uid),
    }
}

fn retention_annotations(all: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    all.into_iter()
        .flatten()
        .filter(|(k, _)| RETENTION_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The agent's caches as the plugin's view of the API server; `None` with `--no-kubernetes`.
#[derive(Debug, Clone, Copy)]
pub struct ClusterApi<'a>(pub Option<&'a Cluster>);

impl ApiView for ClusterApi<'_> {
    fn management(&self, asked: &SandboxPod<'_>) -> Management {
        let Some(cluster) = self.0 else {
            return Management::Unknown(Unavailable {
                why: "the node agent runs without Kubernetes (--no-kubernetes)".into(),
                expected: false,
            });
        };
        let pod = cluster.pod(asked.namespace, asked.name);
        let states = cluster.states_in(asked.namespace);
        let states: Vec<&PersistentPodState> = states.iter().map(AsRef::as_ref).collect();
        management(
            cluster.readiness(),
            asked,
            pod.as_deref(),
            &states,
            &cluster.undecodable_in(asked.namespace),
        )
    }
}

#[cfg(test)]
#[path = "management_tests.rs"]
mod tests;
