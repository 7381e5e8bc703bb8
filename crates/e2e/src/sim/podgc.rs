//! Pod garbage collection for deleted nodes, as kube-controller-manager's PodGC does: a pod
//! bound to a node that no longer exists is deleted at once (`gracePeriodSeconds=0`), since no
//! kubelet is left to finish a graceful deletion.

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::SimLog;

/// One pass: force-deletes pods bound to missing nodes.
pub async fn collect_orphans(client: &Client, log: &SimLog) -> Result<()> {
    let nodes = super::node_names(client).await?;
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
        if super::delete_at_once(client, &pod).await? {
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
