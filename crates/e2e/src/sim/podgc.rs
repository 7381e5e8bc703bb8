//! Pod garbage collection for deleted nodes, as kube-controller-manager's PodGC does: a pod
//! bound to a node that no longer exists is deleted at once (`gracePeriodSeconds=0`), since no
//! kubelet is left to finish a graceful deletion.

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};

use super::SimLog;

/// One pass: force-deletes pods bound to missing nodes.
pub async fn collect_orphans(client: &Client, log: &SimLog) -> Result<()> {
    let nodes: Vec<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    for pod in pods.items {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        if nodes.contains(&node) {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if api.delete(&pod.name_any(), &params).await.is_ok() {
            log.line(
                "podgc",
                &format!(
                    "node {node} is gone: force-deleted pod {namespace}/{}",
                    pod.name_any()
                ),
            );
        }
    }
    Ok(())
}
