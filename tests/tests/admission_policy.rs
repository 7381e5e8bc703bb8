//! The admission policy `ipkeep-pin` (deploy/admission-policy) in a real kube-apiserver (1.36
//! and later serve admissionregistration.k8s.io/v1 MutatingAdmissionPolicy), against the
//! webhook's own edit of the same pod (`pin::decide`, `affinity::apply`, the hooks' marks):
//! for each template shape and pod name, a pod created through the API server (dry run) with
//! the plan the controller writes (`admission::plan`, `admission::encode`) in the namespace's
//! ConfigMap `ipkeep-admission-plan` carries what the webhook gives it, the required pin in
//! `spec.nodeSelector` instead of in every required term. Then: the parameter is that one
//! ConfigMap whatever else the namespace holds, and who may write it and the records
//! (deploy/controller/admission-policies.yaml).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ipkeep_api::PersistentPodState;
use ipkeep_api::k8s_openapi::api::core::v1::{ConfigMap, Pod, PodTemplateSpec};
use ipkeep_api::statefulset::Workload;
use ipkeep_placement::admission::{
    AdmissionPlan, PLAN_BUDGET, PLAN_CONFIGMAP, PLAN_LABEL, PlanTarget, PodPlan, encode, plan,
};
use ipkeep_placement::pin::{Decision, Requirement, decide};
use ipkeep_placement::{affinity, lifecycle};
use ipkeep_tests::apiserver::{self, TestNamespace};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const STS_UID: &str = "6a1e4f0c-0000-4000-8000-000000000001";
const SKIPPED: &str = "ipkeep.dev/pin-skipped";
/// ipkeep-controller's user name in deploy/ (namespace ipkeep-system).
const CONTROLLER: &str = "system:serviceaccount:ipkeep-system:ipkeep-controller";

/// A client of the test's server as `user` in `groups` (the admin impersonating them).
async fn client_as(t: &TestNamespace, user: &str, groups: &[&str]) -> kube::Client {
    let mut config = t.server.config(&t.name).await;
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(
        groups
            .iter()
            .copied()
            .chain(["system:authenticated"])
            .map(String::from)
            .collect(),
    );
    kube::Client::try_from(config).expect("an impersonating client")
}

fn admission_policies_yaml() -> String {
    let path = ipkeep_tests::cluster::repo_root().join("deploy/controller/admission-policies.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Whether this kube-apiserver serves MutatingAdmissionPolicy (1.36 and later); says so if not.
fn serves_policies(t: &TestNamespace) -> bool {
    let served = t.server.kubectl().run(&[
        "api-resources",
        "--api-group=admissionregistration.k8s.io",
        "-o",
        "name",
    ]);
    let yes = served
        .lines()
        .any(|l| l.starts_with("mutatingadmissionpolicies."));
    if !yes {
        eprintln!(
            "skipped: this kube-apiserver does not serve MutatingAdmissionPolicy (Kubernetes 1.36 and later do): {served}"
        );
    }
    yes
}

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
    through_policy_in(t, &t.name, pod).await
}

async fn through_policy_in(t: &TestNamespace, ns: &str, pod: &Pod) -> Pod {
    let api: Api<Pod> = Api::namespaced(t.client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(&dry, pod).await.expect("a dry-run pod create")
}

/// Writes the plan the controller decides for `pps` and `template` into the namespace's
/// ConfigMap, as the controller writes it (server-side apply).
async fn write(t: &TestNamespace, pps: &PersistentPodState, template: &PodTemplateSpec) {
    let plan = plan(
        pps.into(),
        &t.name,
        PlanTarget {
            workload: Workload::Native,
            name: "db",
            uid: STS_UID,
            template,
        },
    );
    write_plans(t, &t.name, plan.as_slice()).await;
}

/// Applies the encoding of `plans` as namespace `ns`'s admission plan, as ipkeep-controller.
async fn write_plans(t: &TestNamespace, ns: &str, plans: &[AdmissionPlan]) {
    let encoded = encode(plans, PLAN_BUDGET);
    assert!(encoded.omitted.is_empty(), "{:?}", encoded.omitted);
    let controller = client_as(t, CONTROLLER, &["system:masters"]).await;
    let api: Api<ConfigMap> = Api::namespaced(controller, ns);
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": PLAN_CONFIGMAP, "labels": {PLAN_LABEL: "true"}},
        "data": encoded.data});
    api.patch(
        PLAN_CONFIGMAP,
        &PatchParams::apply("ipkeep-controller").force(),
        &Patch::Apply(&body),
    )
    .await
    .expect("apply the admission plan");
}

fn field(pod: &Pod, pointer: &str) -> Value {
    serde_json::to_value(pod)
        .expect("a pod serializes")
        .pointer(pointer)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The fields the policy sets on a pod, by name.
/// Asserts that the policy gives `pod` what `want` compares, field by field. A status or plan
/// write reaches the policy's informer asynchronously: retried for 30 s until every compared
/// field matches.
async fn assert_policy_gives(
    t: &TestNamespace,
    pod: &Pod,
    want: &[(&'static str, Value)],
    label: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = loop {
        let got = compared(&through_policy(t, pod).await);
        if got == want || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for ((what, got), (_, want)) in got.iter().zip(want) {
        assert_eq!(got, want, "{label}: {what}");
    }
}

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
    if !serves_policies(&t) {
        return;
    }
    let kubectl = t.server.kubectl();
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
            assert_policy_gives(&t, &pod, &want, &format!("{case}, {name}")).await;
        }
    }

    // A pod whose own constraints are not its template's: no pin from the policy, and why.
    let state = pps(&t.name, json!({}));
    let tpl = template(json!({}));
    write(&t, &state, &tpl).await;
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

    // A pod of another StatefulSet of the name (a stale plan, or a forged owner name): the
    // plan is not its, nothing changes.
    let other = submitted(
        &t.name,
        "db-0",
        &tpl,
        "6a1e4f0c-0000-4000-8000-0000000000ff",
    );
    let got = through_policy(&t, &other).await;
    assert_eq!(
        compared(&got),
        compared(&other),
        "another StatefulSet's pod changed by this one's plan"
    );

    // An OpenKruise Advanced StatefulSet's pods, from the plan of the state targeting it: pinned
    // as the webhook pins them, without ipkeep's hooks (they stand aside for its own).
    let mut kruise = pps(
        &t.name,
        json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}}),
    );
    kruise.spec.target_ref.api_version = "apps.kruise.io/v1beta1".into();
    let plan = plan(
        (&kruise).into(),
        &t.name,
        PlanTarget {
            workload: Workload::Kruise,
            name: "db",
            uid: STS_UID,
            template: &tpl,
        },
    );
    write_plans(&t, &t.name, plan.as_slice()).await;
    for name in ["db-0", "db-1", "db-7"] {
        let mut pod = submitted(&t.name, name, &tpl, STS_UID);
        pod.metadata.owner_references.as_mut().expect("an owner")[0].api_version =
            "apps.kruise.io/v1beta1".into();
        let want = expected(&pod, &through_webhook(&pod, &t.name, &kruise));
        let what = format!("an Advanced StatefulSet's {name}");
        assert_policy_gives(&t, &pod, &want, &what).await;
        if name == "db-0" {
            let pinned = through_policy(&t, &pod).await;
            assert!(
                field(&pinned, "/metadata/annotations/ipkeep.dev~1pinned-by").is_string(),
                "db-0 pinned: {:?}",
                pinned.metadata.annotations
            );
            assert!(
                field(&pinned, "/metadata/labels/ipkeep.dev~1lifecycle-state").is_null(),
                "no hooks of ipkeep's"
            );
        }
    }
}

/// A pinned pod plan for `name` on node `node`.
fn pinned_on(node: &str) -> PodPlan {
    PodPlan::Pinned {
        required: vec![Requirement {
            key: HOST.into(),
            value: node.into(),
        }],
        preferred: vec![],
    }
}

/// The plan of StatefulSet `sts` (its UID `uid`) with `pods` pinned each to node `node-<i>`.
fn big_plan(sts: &str, uid: &str, pods: usize) -> AdmissionPlan {
    AdmissionPlan {
        persistent_pod_state: sts.into(),
        stateful_set: sts.into(),
        stateful_set_uid: uid.into(),
        annotations: [(
            "ipkeep.dev/persistent-pod-state".to_string(),
            sts.to_string(),
        )]
        .into(),
        decided_on: ipkeep_placement::admission::node_constraints(None),
        pods: (0..pods)
            .map(|i| (format!("{sts}-{i}"), pinned_on(&format!("node-{i:05}"))))
            .collect(),
        ..AdmissionPlan::default()
    }
}

/// Mean milliseconds of `n` dry-run creates of `pod` in namespace `ns` (after one to warm up).
async fn mean_create_ms(t: &TestNamespace, ns: &str, pod: &Pod, n: u32) -> f64 {
    through_policy_in(t, ns, pod).await;
    let start = Instant::now();
    for _ in 0..n {
        through_policy_in(t, ns, pod).await;
    }
    start.elapsed().as_secs_f64() * 1000.0 / f64::from(n)
}

/// The policy's parameter is the namespace's one ConfigMap, read lazily: a pod's admission finds
/// its entry among 10,000 while the namespace also holds large PersistentPodStates and many
/// other ConfigMaps (none of them a parameter). The time per create is printed, not asserted
/// (docs/benchmarks.md has the measured comparison).
#[tokio::test]
async fn the_parameter_is_one_configmap_whatever_the_namespace_holds() {
    let Some(t) = apiserver::namespace("admission_policy", "one").await else {
        return;
    };
    if !serves_policies(&t) {
        return;
    }
    t.server.kubectl().apply(&policy_yaml());
    // What a tenant may fill the namespace with: PersistentPodStates as large as the schema
    // lets them be, and ConfigMaps without the plan's label.
    let annotations: Vec<Value> = (0..16)
        .map(|i| json!({"key": format!("{}/{i:0>60}", "a".repeat(250))}))
        .collect();
    let pps_api: Api<PersistentPodState> = Api::namespaced(t.client.clone(), &t.name);
    for i in 0..30 {
        let mut p = pps(&t.name, json!({"persistentPodAnnotations": annotations}));
        p.metadata.name = Some(format!("filler-{i}"));
        p.spec.target_ref.name = format!("filler-{i}");
        p.status = None;
        pps_api
            .create(&PostParams::default(), &p)
            .await
            .expect("a PersistentPodState as large as the schema allows");
    }
    let cm_api: Api<ConfigMap> = Api::namespaced(t.client.clone(), &t.name);
    for i in 0..100 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("app-{i}")},
            "data": {"config": "x".repeat(4096)}}))
            .expect("a ConfigMap");
        cm_api
            .create(&PostParams::default(), &cm)
            .await
            .expect("create a ConfigMap");
    }
    let tpl = template(json!({}));
    let big_uid = "6a1e4f0c-0000-4000-8000-000000000b16";
    write_plans(
        &t,
        &t.name,
        &[
            big_plan("big", big_uid, 10_000),
            big_plan("db", STS_UID, 10),
        ],
    )
    .await;
    let big = {
        let mut pod = submitted(&t.name, "big-9999", &tpl, big_uid);
        pod.metadata.owner_references.as_mut().expect("an owner")[0].name = "big".into();
        pod
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let got = loop {
        let got = through_policy(&t, &big).await;
        if field(&got, "/spec/nodeSelector").is_object() || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        field(&got, "/spec/nodeSelector"),
        json!({HOST: "node-09999"}),
        "the last of 10,000 entries"
    );
    assert_eq!(
        field(&got, "/metadata/annotations/ipkeep.dev~1pinned-by"),
        "big"
    );
    let small = submitted(&t.name, "db-3", &tpl, STS_UID);
    assert_eq!(
        field(&through_policy(&t, &small).await, "/spec/nodeSelector"),
        json!({HOST: "node-00003"})
    );
    let selected = t.server.kubectl().run(&[
        "get",
        "configmaps",
        "-n",
        &t.name,
        "-l",
        PLAN_LABEL,
        "-o",
        "name",
    ]);
    assert_eq!(
        selected.trim(),
        format!("configmap/{PLAN_CONFIGMAP}"),
        "the binding's selector finds one object in the namespace"
    );
    // The same StatefulSet's plan alone in a namespace of its own.
    let empty = format!("{}-plain", t.name);
    t.create_namespace(&empty, json!({})).await;
    write_plans(&t, &empty, &[big_plan("db", STS_UID, 10)]).await;
    let mut alone = small.clone();
    alone.metadata.namespace = Some(empty.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while field(
        &through_policy_in(&t, &empty, &alone).await,
        "/spec/nodeSelector",
    )
    .is_null()
    {
        assert!(
            Instant::now() < deadline,
            "the plain namespace's plan not applied in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let at_10k = mean_create_ms(&t, &t.name, &big, 50).await;
    let at_10 = mean_create_ms(&t, &t.name, &small, 50).await;
    let plain = mean_create_ms(&t, &empty, &alone, 50).await;
    eprintln!(
        "dry-run create through the policy, mean of 50: {at_10k:.2} ms for a pod of a StatefulSet with 10,000 entries, {at_10:.2} ms for one with 10 (both in a namespace that also holds 30 PersistentPodStates as large as the schema allows and 100 other ConfigMaps), {plain:.2} ms for the latter alone in a namespace of its own: {:.2}x and {:.2}x",
        at_10k / at_10,
        at_10 / plain
    );
}

/// Only ipkeep-controller writes a namespace's admission plan and a PersistentPodState's status
/// (deploy/controller/admission-policies.yaml), whatever RBAC grants a tenant; and
/// ipkeep-controller writes no other ConfigMap. A namespace being deleted takes its plan along.
#[tokio::test]
async fn only_ipkeep_controller_writes_the_plans_and_the_records() {
    let Some(t) = apiserver::namespace("admission_policy", "writers").await else {
        return;
    };
    let kubectl = t.server.kubectl();
    // A tenant who may do anything with ConfigMaps and PersistentPodStates in its namespace.
    kubectl.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: tenant, namespace: {ns}}}
rules:
- apiGroups: [\"\"]
  resources: [configmaps]
  verbs: [\"*\"]
- apiGroups: [ipkeep.dev]
  resources: [\"*\"]
  verbs: [\"*\"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: tenant, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant}}]
",
        ns = t.name
    ));
    kubectl.apply(&admission_policies_yaml());
    let tenant = client_as(&t, "tenant", &[]).await;
    let controller = client_as(&t, CONTROLLER, &["system:masters"]).await;
    let cms = |c: &kube::Client| Api::<ConfigMap>::namespaced(c.clone(), &t.name);
    let cm = |name: &str, labels: Value| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "data": {"uid.db": STS_UID, "pod.db-0": "0=attacker-node|"}}))
        .expect("a ConfigMap")
    };
    let refused = |r: Result<ConfigMap, kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => s.message,
        other => panic!("{what}: not refused: {other:?}"),
    };
    // The policies' informers start asynchronously: the first refusal may take a moment.
    let deadline = Instant::now() + Duration::from_secs(60);
    let message = loop {
        match cms(&tenant)
            .create(
                &PostParams::default(),
                &cm(PLAN_CONFIGMAP, json!({PLAN_LABEL: "true"})),
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("ipkeep") => {
                break s.message;
            }
            Ok(_) => {
                let _ = cms(&t.client)
                    .delete(PLAN_CONFIGMAP, &Default::default())
                    .await;
            }
            Err(e) => panic!("the tenant's plan: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "60 s after the policies were applied, a tenant still writes the plan"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        message.contains("only ipkeep-controller writes the admission plan"),
        "{message}"
    );
    // Under another name, with the label the binding selects by: refused too.
    refused(
        cms(&tenant)
            .create(
                &PostParams::default(),
                &cm("innocent", json!({PLAN_LABEL: "true"})),
            )
            .await,
        "a tenant's labelled ConfigMap",
    );
    // An ordinary ConfigMap is the tenant's to write; the label is not.
    cms(&tenant)
        .create(&PostParams::default(), &cm("ordinary", json!({})))
        .await
        .expect("a tenant's own ConfigMap");
    refused(
        cms(&tenant)
            .patch(
                "ordinary",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {PLAN_LABEL: "true"}}})),
            )
            .await,
        "a tenant labelling its ConfigMap",
    );
    // ipkeep-controller writes the plan, and nothing else.
    write_plans(&t, &t.name, &[big_plan("db", STS_UID, 2)]).await;
    refused(
        cms(&controller)
            .create(&PostParams::default(), &cm("other", json!({})))
            .await,
        "ipkeep-controller writing another ConfigMap",
    );
    // The tenant can neither change nor delete the plan.
    refused(
        cms(&tenant)
            .patch(
                PLAN_CONFIGMAP,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"pod.db-0": "0=attacker-node|"}})),
            )
            .await,
        "a tenant changing the plan",
    );
    match cms(&tenant)
        .delete(PLAN_CONFIGMAP, &Default::default())
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("a tenant deleting the plan: not refused: {other:?}"),
    }
    // The records: the tenant writes its PersistentPodState, not its status.
    let pps_api = |c: &kube::Client| Api::<PersistentPodState>::namespaced(c.clone(), &t.name);
    let mut mine = pps(&t.name, json!({}));
    mine.status = None;
    pps_api(&tenant)
        .create(&PostParams::default(), &mine)
        .await
        .expect("a tenant's PersistentPodState");
    let forged = json!({"status": {"podStates": {"db-0": {"nodeName": "attacker-node"}}}});
    match pps_api(&tenant)
        .patch_status("db", &PatchParams::default(), &Patch::Merge(&forged))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {
            assert!(
                s.message.contains("only ipkeep-controller"),
                "{}",
                s.message
            );
        }
        other => panic!("a tenant writing records: not refused: {other:?}"),
    }
    pps_api(&controller)
        .patch_status("db", &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .expect("ipkeep-controller writes the records");
    // A namespace being deleted takes its plan along (the namespace controller deletes it).
    t.server.start_gc();
    let doomed = format!("{}-doomed", t.name);
    t.create_namespace(&doomed, json!({})).await;
    write_plans(&t, &doomed, &[big_plan("db", STS_UID, 2)]).await;
    kubectl.run(&["delete", "namespace", &doomed, "--wait=false"]);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = kubectl.try_run(&["get", "namespace", &doomed], None);
        if !left.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "namespace {doomed} with an admission plan not deleted in 90 s: {}",
            kubectl.run(&["get", "namespace", &doomed, "-o", "yaml"])
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    kubectl.run(&[
        "delete",
        "-f",
        &ipkeep_tests::cluster::repo_root()
            .join("deploy/controller/admission-policies.yaml")
            .to_string_lossy(),
    ]);
}

/// A PersistentPodState created with lifecycle hooks (or given them) is labelled
/// `ipkeep.dev/admission-pending`, and while it is, its StatefulSet's pods are refused (the
/// StatefulSet controller retries); other StatefulSets' pods, and those of a
/// PersistentPodState without hooks, are never refused. ipkeep-controller removes the label
/// once the hooks are in the plan (tests/tests/cluster/lifecycle.rs shows it with the real
/// controller).
#[tokio::test]
async fn a_hooked_persistent_pod_state_holds_its_pods_until_the_plan_is_in_place() {
    let Some(t) = apiserver::namespace("admission_policy", "pending").await else {
        return;
    };
    if !serves_policies(&t) {
        return;
    }
    let kubectl = t.server.kubectl();
    kubectl.apply(&policy_yaml());
    kubectl.apply(&admission_policies_yaml());
    let api: Api<PersistentPodState> = Api::namespaced(t.client.clone(), &t.name);
    let hooks =
        json!({"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "true"}}}});
    let pending = |p: &PersistentPodState| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("ipkeep.dev/admission-pending"))
            .cloned()
    };
    // The labelling policy's informers start asynchronously.
    let deadline = Instant::now() + Duration::from_secs(60);
    let hooked = loop {
        let mut p = pps(&t.name, hooks.clone());
        p.status = None;
        let created = api
            .create(&PostParams::default(), &p)
            .await
            .expect("a hooked PersistentPodState");
        if pending(&created).is_some() {
            break created;
        }
        api.delete("db", &Default::default())
            .await
            .expect("delete it");
        assert!(
            Instant::now() < deadline,
            "60 s after the policy was applied, a hooked PersistentPodState is not labelled"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(pending(&hooked).as_deref(), Some("true"));
    let mut plain = pps(&t.name, json!({}));
    plain.metadata.name = Some("web".into());
    plain.spec.target_ref.name = "web".into();
    plain.status = None;
    let plain = api
        .create(&PostParams::default(), &plain)
        .await
        .expect("a PersistentPodState without hooks");
    assert_eq!(pending(&plain), None, "no hooks, no label");
    // ipkeep's hooks stand aside for an OpenKruise Advanced StatefulSet (it has its own): its
    // state is not labelled, and labelled by hand it holds no `apps` StatefulSet's pods.
    let mut kruise = pps(&t.name, hooks.clone());
    kruise.metadata.name = Some("kv".into());
    kruise.spec.target_ref.api_version = "apps.kruise.io/v1beta1".into();
    kruise.spec.target_ref.name = "kv".into();
    kruise.status = None;
    let kruise = api
        .create(&PostParams::default(), &kruise)
        .await
        .expect("a hooked PersistentPodState of an Advanced StatefulSet");
    assert_eq!(pending(&kruise), None, "an Advanced StatefulSet's hooks");
    api.patch(
        "kv",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"ipkeep.dev/admission-pending": "true"}}})),
    )
    .await
    .expect("label it by hand");

    let tpl = template(json!({}));
    let db0 = submitted(&t.name, "db-0", &tpl, STS_UID);
    let mut web0 = submitted(&t.name, "web-0", &tpl, STS_UID);
    web0.metadata.owner_references.as_mut().expect("an owner")[0].name = "web".into();
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), &t.name);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let message = loop {
        match pods.create(&dry, &db0).await {
            Err(kube::Error::Api(s)) if s.code == 403 => break s.message,
            Ok(_) => {}
            Err(e) => panic!("db-0: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "60 s after the policy was applied, a pending StatefulSet's pod is still created"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        message.contains("has lifecycle hooks") && message.contains("ipkeep.dev/admission-pending"),
        "{message}"
    );
    pods.create(&dry, &web0)
        .await
        .expect("another StatefulSet's pod is never held");
    // The parameters' informer has db's label (db-0 was refused); give it kv's too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut kv0 = submitted(&t.name, "kv-0", &tpl, STS_UID);
    kv0.metadata.owner_references.as_mut().expect("an owner")[0].name = "kv".into();
    pods.create(&dry, &kv0)
        .await
        .expect("an apps StatefulSet's pod is not held by an Advanced StatefulSet's state");
    // ipkeep-controller's part: the label goes, the pods come.
    api.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"ipkeep.dev/admission-pending": null}}})),
    )
    .await
    .expect("remove the label");
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = pods.create(&dry, &db0).await {
        assert!(
            Instant::now() < deadline,
            "30 s after the label went, db-0 is still refused: {e}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Changing the hooks labels it again; an unrelated change does not.
    let unrelated = api
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ipRetention": "3h"}})),
        )
        .await
        .expect("change the retention");
    assert_eq!(pending(&unrelated), None);
    let rehooked = api
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"lifecycle": {"preNormal": {"labelsHandler": {"example.com/registered": "yes"}}}}})),
        )
        .await
        .expect("change the hooks");
    assert_eq!(pending(&rehooked).as_deref(), Some("true"));
    kubectl.run(&[
        "delete",
        "-f",
        &ipkeep_tests::cluster::repo_root()
            .join("deploy/controller/admission-policies.yaml")
            .to_string_lossy(),
    ]);
}
