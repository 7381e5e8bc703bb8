//! A StatefulSet controller: pods named `<name>-<ordinal>` for the ordinals
//! `[ordinals.start, ordinals.start + replicas)`, created from the template with the labels and
//! owner reference the real controller sets, pods outside that range deleted (scale down), and
//! the status counts kept. Pods are managed in parallel (`podManagementPolicy: Parallel`
//! semantics, whatever the spec says) and there are no revisions or rolling updates.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::SimLog;

/// The StatefulSet controller.
#[derive(Clone)]
pub struct StatefulSetController {
    client: Client,
    log: SimLog,
}

impl std::fmt::Debug for StatefulSetController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatefulSetController")
            .finish_non_exhaustive()
    }
}

impl StatefulSetController {
    /// Over `client`, saying what it does to `log`.
    pub fn new(client: Client, log: SimLog) -> Self {
        Self { client, log }
    }

    /// One pass over every StatefulSet.
    pub async fn tick(&self) -> Result<()> {
        let all: Api<StatefulSet> = Api::all(self.client.clone());
        for sts in all.list(&ListParams::default()).await? {
            if sts.metadata.deletion_timestamp.is_none() {
                self.sync(&sts).await?;
            }
        }
        Ok(())
    }

    async fn sync(&self, sts: &StatefulSet) -> Result<()> {
        let name = sts.name_any();
        let namespace = sts.namespace().unwrap_or_default();
        let uid = sts.uid().unwrap_or_default();
        let spec = sts.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1);
        let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let selector = spec
            .selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let owned: BTreeMap<String, Pod> = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .into_iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| o.controller == Some(true) && o.uid == uid)
            })
            .map(|p| (p.name_any(), p))
            .collect();
        for ordinal in start..start + replicas {
            let pod_name = format!("{name}-{ordinal}");
            if !owned.contains_key(&pod_name) {
                let pod = pod_from_template(sts, &pod_name, ordinal)?;
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => self.log.line(
                        "statefulset",
                        &format!("created pod {namespace}/{pod_name}"),
                    ),
                    // Still terminating under that name: created once it is gone.
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e).with_context(|| format!("create pod {pod_name}")),
                }
            }
        }
        for (pod_name, pod) in &owned {
            let in_range =
                ordinal_of(&name, pod_name).is_some_and(|o| o >= start && o < start + replicas);
            if !in_range && pod.metadata.deletion_timestamp.is_none() {
                pods.delete(pod_name, &DeleteParams::default())
                    .await
                    .with_context(|| format!("delete pod {pod_name}"))?;
                self.log.line(
                    "statefulset",
                    &format!("scaled down: deleted pod {namespace}/{pod_name}"),
                );
            }
        }
        let ready = owned
            .values()
            .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .count();
        let status = json!({"status": {
            "observedGeneration": sts.metadata.generation,
            "replicas": owned.len(),
            "readyReplicas": ready,
            "currentReplicas": owned.len(),
            "availableReplicas": ready,
        }});
        let current = sts.status.as_ref();
        let same = current.is_some_and(|s| {
            s.replicas as usize == owned.len()
                && s.ready_replicas.unwrap_or(0) as usize == ready
                && s.observed_generation == sts.metadata.generation
        });
        if !same {
            let all: Api<StatefulSet> = Api::namespaced(self.client.clone(), &namespace);
            all.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .with_context(|| format!("update the status of statefulset {name}"))?;
        }
        Ok(())
    }
}

/// The ordinal of `pod` if it is named `<sts>-<n>`.
pub fn ordinal_of(sts: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(sts)?.strip_prefix('-')?.parse().ok()
}

/// Whether the pod's `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod the real controller would create for `ordinal`.
fn pod_from_template(sts: &StatefulSet, pod_name: &str, ordinal: i32) -> Result<Pod> {
    let spec = sts.spec.clone().unwrap_or_default();
    let template = spec.template;
    let mut meta = template.metadata.unwrap_or_default();
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert("statefulset.kubernetes.io/pod-name".into(), pod_name.into());
    labels.insert("apps.kubernetes.io/pod-index".into(), ordinal.to_string());
    let mut pod_spec = template.spec.unwrap_or_default();
    pod_spec.hostname = Some(pod_name.to_string());
    pod_spec.subdomain = spec.service_name.clone();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": sts.namespace(),
            "labels": meta.labels,
            "annotations": meta.annotations,
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts.name_any(),
                "uid": sts.uid(), "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": pod_spec,
    });
    Ok(serde_json::from_value(pod)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_are_parsed_from_the_statefulset_name_only() {
        assert_eq!(ordinal_of("db", "db-2"), Some(2));
        assert_eq!(ordinal_of("db", "db-10"), Some(10));
        assert_eq!(ordinal_of("db", "dbx-1"), None);
        assert_eq!(ordinal_of("db", "db-a"), None);
    }
}
