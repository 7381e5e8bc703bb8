//! PersistentPodStates as an earlier, looser CRD let them be written: kube-apiserver checks an
//! object against the CRD only when it is written, so what was stored before the CRD was
//! tightened (or with validation off) is served as it is. [`with_loose_crd`] lets any spec and
//! status be written for a while, then puts the CRD back; [`write`] writes one object.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::{Value, json};

const CRD: &str = "persistentpodstates.ipkeep.dev";

/// Runs `write` while the PersistentPodState CRD accepts any object as spec and status, then
/// restores the CRD as it was (and waits until kube-apiserver checks objects against it again).
pub async fn with_loose_crd<T>(client: &Client, write: impl AsyncFnOnce() -> T) -> T {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let strict = crds.get(CRD).await.expect("the CRD");
    let mut loose = serde_json::to_value(&strict).expect("the CRD as JSON");
    for version in loose["spec"]["versions"].as_array_mut().expect("versions") {
        let properties = &mut version["schema"]["openAPIV3Schema"]["properties"];
        for part in ["spec", "status"] {
            properties[part] =
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        }
    }
    set_schema(&crds, loose["spec"].clone()).await;
    wait_until(client, true).await;
    let out = write().await;
    set_schema(&crds, serde_json::to_value(&strict.spec).expect("spec")).await;
    wait_until(client, false).await;
    out
}

async fn set_schema(crds: &Api<CustomResourceDefinition>, spec: Value) {
    let mut crd = crds.get(CRD).await.expect("the CRD");
    crd.spec = serde_json::from_value(spec).expect("a CRD spec");
    crds.replace(CRD, &PostParams::default(), &crd)
        .await
        .expect("replace the CRD");
}

/// Waits until a PersistentPodState without a target is accepted (`loose`) or refused: kube-
/// apiserver applies a changed CRD a moment after the change.
async fn wait_until(client: &Client, loose: bool) {
    let api = dynamic(client, "default");
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "loose-crd-probe"}, "spec": {"probe": true}
    }))
    .expect("the probe");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.create(&dry_run, &probe).await.is_ok() != loose {
        assert!(
            Instant::now() < deadline,
            "kube-apiserver did not apply the {} CRD within 30 s",
            if loose { "loosened" } else { "restored" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// PersistentPodStates of `namespace` as JSON values: what ipkeep cannot decode reads here.
pub fn dynamic(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<ipkeep_api::PersistentPodState>(&());
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// Creates the PersistentPodState `object` (its namespace is `metadata.namespace`) and, with a
/// `status`, writes that as its status.
pub async fn write(client: &Client, object: Value, status: Option<Value>) {
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .expect("metadata.namespace")
        .to_string();
    let name = object["metadata"]["name"]
        .as_str()
        .expect("metadata.name")
        .to_string();
    let api = dynamic(client, &namespace);
    let mut object: DynamicObject = serde_json::from_value(object).expect("an object");
    object.types.get_or_insert_with(|| kube::core::TypeMeta {
        api_version: ipkeep_api::PersistentPodState::api_version(&()).into_owned(),
        kind: ipkeep_api::PersistentPodState::kind(&()).into_owned(),
    });
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create PersistentPodState {namespace}/{name}: {e}"));
    if let Some(status) = status {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("write the status of {namespace}/{name}: {e}"));
    }
}
