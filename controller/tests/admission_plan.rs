//! The admission plan loop against a real kube-apiserver: the namespace's ConfigMap
//! `ipkeep-admission-plan` follows the plans the record loop decides (both StatefulSets of a
//! namespace in one object, records as they come, a write by anyone else put back on the next
//! change, nothing left when the last PersistentPodState goes), and a PersistentPodState
//! labelled `ipkeep.dev/admission-pending` loses the label once its hooks are in the plan.
#![allow(clippy::unwrap_used)]

mod support;

use ipkeep_placement::admission::{PLAN_CONFIGMAP, PLAN_LABEL};
use ipkeep_values::keys::ADMISSION_PENDING_LABEL;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::*;

/// The namespace's plan, if it exists.
async fn plan(client: &kube::Client) -> Option<ConfigMap> {
    Api::<ConfigMap>::default_namespaced(client.clone())
        .get_opt(PLAN_CONFIGMAP)
        .await
        .unwrap()
}

fn entry<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.data.as_ref()?.get(key).map(String::as_str)
}

#[tokio::test]
async fn the_namespace_plan_follows_the_records_and_releases_pending_hooks() {
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    // A hand-written PersistentPodState with hooks, labelled pending as the admission policy (or
    // the webhook) labels it at creation, and one without hooks for another StatefulSet.
    for (name, lifecycle) in [
        (
            "db",
            json!({"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}),
        ),
        ("web", json!(null)),
    ] {
        let labels = if lifecycle.is_null() {
            json!({})
        } else {
            json!({ADMISSION_PENDING_LABEL: "true"})
        };
        let pps = serde_json::from_value(json!({
            "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
            "metadata": {"name": name, "labels": labels},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name},
                     "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
                     "lifecycle": lifecycle}
        }))
        .unwrap();
        pps_api(&c.client)
            .create(&PostParams::default(), &pps)
            .await
            .unwrap();
    }
    // No StatefulSet yet: no plan, and the label stays (no pod of it can exist).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        plan(&c.client).await.is_none(),
        "a plan without a StatefulSet"
    );
    let db = create_sts(&c.client, "db", 2, 0, &Default::default()).await;
    let web = create_sts(&c.client, "web", 1, 0, &Default::default()).await;
    let cm = eventually("the plan of both StatefulSets", || async {
        let cm = plan(&c.client).await?;
        (entry(&cm, "uid.db").is_some() && entry(&cm, "uid.web").is_some()).then_some(cm)
    })
    .await;
    assert_eq!(entry(&cm, "uid.db"), db.uid().as_deref());
    assert_eq!(entry(&cm, "uid.web"), web.uid().as_deref());
    assert_eq!(entry(&cm, "gate.db"), Some("ipkeep.dev/lifecycle-ready"));
    assert_eq!(entry(&cm, "gate.web"), None);
    assert_eq!(
        cm.labels().get(PLAN_LABEL).map(String::as_str),
        Some("true")
    );
    let pps = eventually("the pending label removed", || async {
        let p = get_pps(&c.client, "db").await?;
        (!p.labels().contains_key(ADMISSION_PENDING_LABEL)).then_some(p)
    })
    .await;
    assert!(pps.labels().is_empty(), "{:?}", pps.labels());

    // Records become pins.
    run_pod(&c.client, &db, 0, "n1", "10.1.0.10").await;
    run_pod(&c.client, &db, 1, "n2", "10.1.0.11").await;
    let cm = eventually("both pods of db in the plan", || async {
        let cm = plan(&c.client).await?;
        (entry(&cm, "pod.db-1").is_some() && entry(&cm, "pod.db-0").is_some()).then_some(cm)
    })
    .await;
    assert_eq!(entry(&cm, "keys.db"), Some("kubernetes.io/hostname"));
    assert_eq!(entry(&cm, "pod.db-0"), Some("0=n1|"));
    assert_eq!(entry(&cm, "pod.db-1"), Some("0=n2|"));

    // Anyone else's write (here the admin's; in a cluster the admission policy
    // ipkeep-admission-plan-writers refuses it) is put back at the next change of the plan.
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client.clone());
    cms.patch(
        PLAN_CONFIGMAP,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"pod.db-0": "0=elsewhere|", "pod.db-9": "0=n3|"}})),
    )
    .await
    .unwrap();
    run_pod(&c.client, &web, 0, "n3", "10.1.0.12").await;
    let cm = eventually("the plan written again", || async {
        let cm = plan(&c.client).await?;
        (entry(&cm, "pod.web-0").is_some()).then_some(cm)
    })
    .await;
    assert_eq!(entry(&cm, "pod.db-0"), Some("0=n1|"));
    assert_eq!(entry(&cm, "pod.db-9"), None);

    // The last PersistentPodState gone, the plan goes.
    for name in ["db", "web"] {
        pps_api(&c.client)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually("the plan deleted", || async {
        plan(&c.client).await.is_none().then_some(())
    })
    .await;
    ctl.stop().await.unwrap();
}
