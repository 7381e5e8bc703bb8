//! The admission policy `ipkeep-pin` (deploy/admission-policy) in a real kube-apiserver (1.36
//! and later serve admissionregistration.k8s.io/v1 MutatingAdmissionPolicy), against the
//! webhook's own edit of the same pod (`pin::decide`, `affinity::apply`, the hooks' marks):
//! for each template shape and pod name, a pod created through the API server (dry run) with
//! the plan the controller writes (`admission::plan`) in its PersistentPodState's status carries
//! what the webhook gives it, the required pin in `spec.nodeSelector` instead of in every
//! required term.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ipkeep_api::PersistentPodState;
use ipkeep_api::k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use ipkeep_placement::admission::{PlanTarget, plan};
use ipkeep_placement::pin::{Decision, decide};
use ipkeep_placement::{affinity, lifecycle};
use ipkeep_tests::apiserver::{self, TestNamespace};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const STS_UID: &str = "6a1e4f0c-0000-4000-8000-000000000001";
const SKIPPED: &str = "ipkeep.dev/pin-skipped";

fn policy_yaml() -> String {
    let path = ipkeep_tests::cluster::repo_root().join("deploy/admission-policy/pin-policy.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The PersistentPodState `db` of StatefulSet `db`: required hostname, preferred zone (weight
/// 60), records for db-0 (node n1, zone a) and db-1 (node n2, no zone), and `extra` in its spec.
fn pps(ns: &str, extra: Value) -> PersistentPodState {
    let mut v = json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": [HOST]},
            "preferredPersistentTopology": [{"weight": 60, "preference": {"nodeTopologyKeys": [ZONE]}}],
            "ipRetention": "2h"
        },
        "status": {"targetUID": STS_UID, "podStates": {
            "db-0": {"nodeName": "n1", "nodeTopologyLabels": {HOST: "n1", ZONE: "a"}},
            "db-1": {"nodeName": "n2", "nodeTopologyLabels": {HOST: "n2"}}
        }}
    });
    if let (Value::Object(spec), Value::Object(extra)) = (&mut v["spec"], extra) {
        spec.extend(extra);
    }
    serde_json::from_value(v).expect("a PersistentPodState")
}

/// A pod template: `{"metadata": ..., "spec": ...}` merged over one container.
fn template(t: Value) -> PodTemplateSpec {
    let mut base = json!({"metadata": {"labels": {"app": "db"}},
                          "spec": {"containers": [{"name": "db", "image": "busybox"}]}});
    for part in ["metadata", "spec"] {
        if let (Value::Object(into), Some(Value::Object(from))) = (&mut base[part], t.get(part)) {
            into.extend(from.clone());
        }
    }
    serde_json::from_value(base).expect("a pod template")
}

/// The pod the StatefulSet controller submits for `name` from `template` (owned by `owner`).
fn submitted(ns: &str, name: &str, template: &PodTemplateSpec, owner: &str) -> Pod {
    let mut pod = Pod {
        metadata: template.metadata.clone().unwrap_or_default(),
        spec: template.spec.clone(),
        status: None,
    };
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some(ns.into());
    pod.metadata
        .labels
        .get_or_insert_default()
        .insert("statefulset.kubernetes.io/pod-name".into(), name.into());
    pod.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "name": "db", "uid": owner, "controller": true}))
        .expect("an owner reference"),
    ]);
    pod
}

/// What the webhook makes of `pod`.
fn through_webhook(pod: &Pod, ns: &str, pps: &PersistentPodState) -> Pod {
    let mut out = pod.clone();
    if let Decision::Manage(managed) = decide(pod, ns, Some(pps)) {
        affinity::apply(&managed, &mut out);
        lifecycle::apply_at_create(&managed.lifecycle, &mut out);
    }
    out
}

async fn through_policy(t: &TestNamespace, pod: &Pod) -> Pod {
    let api: Api<Pod> = Api::namespaced(t.client.clone(), &t.name);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(&dry, pod).await.expect("a dry-run pod create")
}

/// Writes `pps` with its status and the plan the controller would add to it.
async fn write(t: &TestNamespace, pps: &PersistentPodState, template: &PodTemplateSpec) {
    let api: Api<PersistentPodState> = Api::namespaced(t.client.clone(), &t.name);
    let mut status = pps.status.clone().expect("a status");
    status.admission = plan(
        pps,
        &t.name,
        PlanTarget {
            name: "db",
            uid: STS_UID,
            template,
        },
    );
    let body = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
                      "metadata": {"name": "db"}, "spec": pps.spec});
    let apply = PatchParams::apply("admission-policy-test").force();
    api.patch("db", &apply, &Patch::Apply(&body))
        .await
        .expect("apply the PersistentPodState");
    let body = json!({"apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
                      "status": status});
    api.patch_status("db", &apply, &Patch::Apply(&body))
        .await
        .expect("apply its status");
}

fn field(pod: &Pod, pointer: &str) -> Value {
    serde_json::to_value(pod)
        .expect("a pod serializes")
        .pointer(pointer)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The fields the policy sets on a pod, by name.
fn compared(pod: &Pod) -> Vec<(&'static str, Value)> {
    let selector = pod.spec.as_ref().and_then(|s| s.node_selector.clone());
    vec![
        ("annotations", field(pod, "/metadata/annotations")),
        ("labels", field(pod, "/metadata/labels")),
        ("readiness gates", field(pod, "/spec/readinessGates")),
        (
            "preferred terms",
            field(
                pod,
                "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution",
            ),
        ),
        (
            "the pod's own required terms",
            field(
                pod,
                "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution",
            ),
        ),
        ("the node selector", json!(selector.unwrap_or_default())),
    ]
}

/// What the policy should give `pod`: the webhook's edit `web`, the required pin in the node
/// selector instead of appended to the pod's own required terms.
fn expected(pod: &Pod, web: &Pod) -> Vec<(&'static str, Value)> {
    let own = field(
        pod,
        "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution",
    );
    let mut selector: BTreeMap<String, String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    selector.extend(required_split(web, &own));
    compared(web)
        .into_iter()
        .map(|(what, value)| match what {
            "the pod's own required terms" => (what, own.clone()),
            "the node selector" => (what, json!(selector)),
            _ => (what, value),
        })
        .collect()
}

/// The webhook's required terms, each with the pin appended, as the pod's own terms and the pin.
fn required_split(web: &Pod, own: &Value) -> BTreeMap<String, String> {
    let terms = field(
        web,
        "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
    );
    let own_first = own
        .pointer("/nodeSelectorTerms/0/matchExpressions")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    terms
        .pointer("/0/matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .skip(own_first)
        .map(|e| {
            (
                e["key"].as_str().unwrap_or_default().to_string(),
                e["values"][0].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Waits until the API server applies the freshly created policy (its informers start
/// asynchronously): a pod of the plan gets the managing PersistentPodState's annotation.
async fn wait_for_policy(t: &TestNamespace, probe: &Pod) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = through_policy(t, probe).await;
        if field(
            &got,
            "/metadata/annotations/ipkeep.dev~1persistent-pod-state",
        ) == "db"
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "60 s after it was created, the policy has not mutated a pod: {:?}",
            got.metadata
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn the_policy_gives_a_new_pod_what_the_webhook_gives_it() {
    let Some(t) = apiserver::namespace("admission_policy", "pin").await else {
        return;
    };
    let kubectl = t.server.kubectl();
    let served = kubectl.run(&[
        "api-resources",
        "--api-group=admissionregistration.k8s.io",
        "-o",
        "name",
    ]);
    if !served
        .lines()
        .any(|l| l.starts_with("mutatingadmissionpolicies."))
    {
        eprintln!(
            "skipped: this kube-apiserver does not serve MutatingAdmissionPolicy (Kubernetes 1.36 and later do): {served}"
        );
        return;
    }
    kubectl.apply(&policy_yaml());
    let hooks =
        json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}});
    let own_required = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": ZONE, "operator": "In", "values": ["a", "b"]}]}]});
    // (what the case is, PersistentPodState spec additions, template)
    let cases = [
        ("plain template", json!({}), json!({})),
        (
            "hooks",
            hooks,
            json!({"metadata": {"annotations": {"team": "db"}}}),
        ),
        (
            "template's own required affinity, compatible",
            json!({}),
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": own_required}}}}),
        ),
        (
            "template's own preferred affinity and readiness gate",
            json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}}),
            json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}},
                "readinessGates": [{"conditionType": "example.com/gate"}]}}),
        ),
        (
            "template excludes the record",
            json!({}),
            json!({"spec": {"nodeSelector": {HOST: "n9"}}}),
        ),
        (
            "template's readable retention",
            json!({}),
            json!({"metadata": {"annotations": {"ipkeep.dev/ip-retention": "30m"}}}),
        ),
    ];
    let mut probed = false;
    for (case, extra, tpl) in cases {
        let pps = pps(&t.name, extra);
        let tpl = template(tpl);
        write(&t, &pps, &tpl).await;
        if !probed {
            wait_for_policy(&t, &submitted(&t.name, "db-7", &tpl, STS_UID)).await;
            probed = true;
        }
        for name in ["db-0", "db-1", "db-7"] {
            let pod = submitted(&t.name, name, &tpl, STS_UID);
            // The status write reaches the policy's informer asynchronously: wait until every
            // compared field matches (the previous case's plan may share some of them).
            let want = expected(&pod, &through_webhook(&pod, &t.name, &pps));
            let deadline = Instant::now() + Duration::from_secs(30);
            let got = loop {
                let got = compared(&through_policy(&t, &pod).await);
                if got == want || Instant::now() > deadline {
                    break got;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            for ((what, got), (_, want)) in got.iter().zip(&want) {
                assert_eq!(got, want, "{case}, {name}: {what}");
            }
        }
    }

    // A pod whose own constraints are not its template's: no pin from the policy, and why.
    let pps = pps(&t.name, json!({}));
    let tpl = template(json!({}));
    write(&t, &pps, &tpl).await;
    let mut pod = submitted(&t.name, "db-0", &tpl, STS_UID);
    pod.spec.as_mut().expect("a spec").node_selector =
        Some([("disk".to_string(), "ssd".to_string())].into());
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = loop {
        let got = through_policy(&t, &pod).await;
        if field(&got, "/metadata/annotations/ipkeep.dev~1pin-skipped").is_string()
            || Instant::now() > deadline
        {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        field(
            &got,
            &format!("/metadata/annotations/{}", SKIPPED.replace('/', "~1"))
        )
        .as_str()
        .is_some_and(|s| s.contains("differ from its StatefulSet's template")),
        "a pod unlike its template: {:?}",
        got.metadata.annotations
    );
    assert_eq!(
        got.spec.as_ref().and_then(|s| s.node_selector.clone()),
        Some([("disk".to_string(), "ssd".to_string())].into()),
        "a pod unlike its template: pinned anyway"
    );
    assert!(field(&got, "/metadata/annotations/ipkeep.dev~1pinned-by").is_null());

    // A pod of another StatefulSet of the name: what every pod gets, no pin.
    let other = submitted(
        &t.name,
        "db-0",
        &tpl,
        "6a1e4f0c-0000-4000-8000-0000000000ff",
    );
    let got = through_policy(&t, &other).await;
    assert_eq!(
        field(&got, "/metadata/annotations/ipkeep.dev~1ip-retention"),
        "2h"
    );
    assert!(
        field(&got, "/spec/nodeSelector").is_null(),
        "another StatefulSet's pod pinned: {:?}",
        got.spec
    );
}
