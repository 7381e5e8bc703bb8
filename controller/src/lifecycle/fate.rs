//! What the cluster says of a pod's future ([`Fate`]), read from objects only authorised
//! principals write: its StatefulSet (spec and status) and that StatefulSet's other pods, and its
//! Node. Nothing a pod's own labels say about itself counts here, so a principal that may only
//! patch pods cannot make ipkeep delete one.

use std::sync::Arc;

use ipkeep_api::statefulset;
use ipkeep_placement::ipkeep_lifecycle::Fate;
use ipkeep_placement::ipkeep_lifecycle::going::{self, Going, Member};
use ipkeep_placement::lifecycle::{member, set_facts};
use ipkeep_placement::view::terminating;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};

use crate::Error;
use crate::caches::{CachedPod, Caches, trim_statefulset};

/// The pod's controller owner when it is a StatefulSet: (name, UID).
pub fn statefulset_owner(pod: &Pod) -> Option<(String, String)> {
    statefulset::controller(pod.owner_references()).map(|o| (o.name.clone(), o.uid.clone()))
}

/// The pod's StatefulSet as the API server has it: from the cache when the cache has the one
/// that owns the pod (same UID), else read from the API server (the cache may lag a new one);
/// `None` when the owner is gone (deleted, or re-created under its name with another UID).
pub async fn owner(
    client: &Client,
    caches: &Caches,
    namespace: &str,
    (name, uid): (&str, &str),
) -> Result<Option<Arc<StatefulSet>>, Error> {
    let cached = caches
        .statefulsets
        .get(&ObjectRef::new(name).within(namespace));
    if let Some(sts) = cached.filter(|s| s.uid().as_deref() == Some(uid)) {
        return Ok(Some(sts));
    }
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let live = api
        .get_opt(name)
        .await
        .map_err(|e| Error::api("read the StatefulSet", format!("{namespace}/{name}"), e))?;
    Ok(live
        .filter(|s| s.uid().as_deref() == Some(uid))
        .map(|mut s| {
            trim_statefulset(&mut s);
            Arc::new(s)
        }))
}

/// The pod's fate given its StatefulSet (`None`: gone) and the caches.
pub fn of(pod: &Pod, statefulset: Option<&StatefulSet>, caches: &Caches) -> Fate {
    let Some(sts) = statefulset else {
        return Fate::Going(Going::OwnerDeleted);
    };
    if sts.metadata.deletion_timestamp.is_some() {
        return Fate::Going(Going::OwnerDeleted);
    }
    let Some(set) = set_facts(sts) else {
        return Fate::Unknown;
    };
    let (namespace, sts_name, sts_uid) = (
        sts.namespace().unwrap_or_default(),
        sts.name_any(),
        sts.uid().unwrap_or_default(),
    );
    let members: Vec<Member> = caches
        .pods_owned_by(&namespace, &sts_uid)
        .iter()
        .filter_map(|p| member_of(p, &sts_name))
        .collect();
    let labels = pod.metadata.labels.as_ref();
    let ordinal = member(&pod.name_any(), &sts_name, labels, false, false).map(|m| m.ordinal);
    let by_statefulset = going::statefulset_wants_gone(&set, &members);
    if let Some(why) = ordinal.and_then(|o| by_statefulset.get(&o)) {
        return Fate::Going(*why);
    }
    let cordoned = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .and_then(|n| caches.nodes.get(&ObjectRef::new(n)))
        .and_then(|n| n.spec.as_ref().and_then(|s| s.unschedulable))
        .unwrap_or(false);
    if cordoned {
        return Fate::Going(Going::Drain);
    }
    Fate::Staying
}

fn member_of(pod: &CachedPod, statefulset: &str) -> Option<Member> {
    member(
        &pod.name_any(),
        statefulset,
        pod.metadata.labels.as_ref(),
        terminating(
            pod.metadata.deletion_timestamp.is_some(),
            pod.status.phase.as_deref(),
        ),
        pod.status.ready(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A pod's StatefulSet is an `apps` one: an OpenKruise Advanced StatefulSet of the same name
    /// (`apps.kruise.io`, same kind) is another workload, whose pods ipkeep's hooks leave alone.
    #[test]
    fn only_an_apps_statefulset_owns_a_pod() {
        let pod = |api_version: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {
                "name": "db-0", "namespace": "prod",
                "ownerReferences": [{"apiVersion": api_version, "kind": "StatefulSet",
                                     "name": "db", "uid": "s1", "controller": true}]}}))
            .unwrap()
        };
        assert_eq!(
            statefulset_owner(&pod("apps/v1")),
            Some(("db".into(), "s1".into()))
        );
        for kruise in ["apps.kruise.io/v1beta1", "apps.kruise.io/v1alpha1"] {
            assert_eq!(statefulset_owner(&pod(kruise)), None, "{kruise}");
        }
    }
}
