//! StatefulSets and their pods on the test binary's real kube-apiserver ([`crate::apiserver`]:
//! the CRD from `deploy/crd.yaml`, nothing else running), made as the StatefulSet controller,
//! the scheduler and the kubelet would make them: a namespace of its own with Ready nodes, pods
//! bound and Ready, and waits for what ipkeep writes into the PersistentPodStates.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use ipkeep_api::{PersistentPodState, PodState};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::apiserver::{self, ApiServer, TestNamespace};
use crate::faults::Faults;

/// A test's namespace on the binary's API server.
pub struct Cluster {
    /// The test's namespace.
    pub ns: String,
    /// Admin client; its default namespace is [`Cluster::ns`].
    pub client: Client,
    /// The binary's API server.
    pub server: &'static ApiServer,
    _ns: TestNamespace,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("ns", &self.ns)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// An admin kubeconfig for the test's namespace in `dir/kubeconfig`, for the binaries
    /// under test; returns its path.
    pub fn kubeconfig_file(&self, dir: &std::path::Path) -> std::path::PathBuf {
        self._ns.kubeconfig_file(dir)
    }

    /// An admin client (default namespace [`Cluster::ns`]) with `faults` in front of it.
    pub async fn client_with(&self, faults: &Faults) -> Client {
        faults.client(self.server.config(&self.ns).await)
    }
}

/// A namespace of its own on the binary's API server, and Ready nodes n1, n2 (zone a) and n3
/// (zone b); `None` when the test is skipped (no Go to build Kubernetes; a failure under CI).
pub async fn cluster() -> Option<Cluster> {
    let test = std::thread::current()
        .name()
        .unwrap_or("a controller test")
        .to_string();
    let ns = apiserver::namespace(&test, "db").await?;
    for (node, zone) in [("n1", "a"), ("n2", "a"), ("n3", "b")] {
        add_node(&ns.client, node, zone).await;
    }
    Some(Cluster {
        ns: ns.name.clone(),
        client: ns.client.clone(),
        server: ns.server,
        _ns: ns,
    })
}

/// [`cluster`] with kube-controller-manager's garbage collector running (owner-reference
/// cascades).
pub async fn cluster_with_gc() -> Option<Cluster> {
    let c = cluster().await?;
    c.server.start_gc();
    Some(c)
}

pub async fn add_node(client: &Client, name: &str, zone: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
    }))
    .expect("a valid Node");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create the Node");
    set_node_ready(client, name, true).await;
}

pub async fn set_node_ready(client: &Client, name: &str, ready: bool) {
    let nodes: Api<Node> = Api::all(client.clone());
    let status = if ready { "True" } else { "Unknown" };
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test",
        "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set the Node Ready");
}

pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

pub fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Creates a StatefulSet (no StatefulSet controller runs: pods come from [`run_pod`]).
pub async fn create_sts(
    client: &Client,
    name: &str,
    replicas: i32,
    start: i32,
    ann: &BTreeMap<String, String>,
) -> StatefulSet {
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": ann},
        "spec": {
            "replicas": replicas, "serviceName": name, "ordinals": {"start": start},
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "db", "image": "postgres:17"}]}}
        }
    }))
    .expect("a valid StatefulSet");
    Api::<StatefulSet>::default_namespaced(client.clone())
        .create(&PostParams::default(), &sts)
        .await
        .expect("create the StatefulSet")
}

pub async fn patch_sts(client: &Client, name: &str, patch: Value) {
    Api::<StatefulSet>::default_namespaced(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch the StatefulSet");
}

/// Creates pod `<sts>-<ordinal>` bound to `node` and marks it Ready with `ip`, as the
/// StatefulSet controller, the scheduler and the kubelet would.
pub async fn run_pod(
    client: &Client,
    sts: &StatefulSet,
    ordinal: i32,
    node: &str,
    ip: &str,
) -> Pod {
    create_pod(client, sts, ordinal, node).await;
    set_pod_ready(client, &format!("{}-{ordinal}", sts.name_any()), ip, true).await
}

/// Creates pod `<sts>-<ordinal>` bound to `node`, as the StatefulSet controller and the
/// scheduler would, before the kubelet sets up its sandbox (and calls the CNI plugin).
pub async fn create_pod(client: &Client, sts: &StatefulSet, ordinal: i32, node: &str) -> Pod {
    let name = format!("{}-{ordinal}", sts.name_any());
    let owner = sts
        .controller_owner_ref(&())
        .expect("a StatefulSet from the API server has a name and UID");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": sts.name_any(), "statefulset.kubernetes.io/pod-name": name},
                     "ownerReferences": [owner]},
        "spec": {"nodeName": node, "containers": [{"name": "db", "image": "postgres:17"}]}
    }))
    .expect("a valid Pod");
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the Pod")
}

pub async fn set_pod_ready(client: &Client, name: &str, ip: &str, ready: bool) -> Pod {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": now()}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set the Pod Ready")
}

/// Starts a graceful delete (the pod is Terminating).
pub async fn terminate_pod(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("delete the Pod");
}

/// Deletes a pod for good (graceful delete, then the kubelet's grace-0 delete).
pub async fn remove_pod(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let _ = pods.delete(name, &DeleteParams::default()).await;
    let _ = pods
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
    eventually(&format!("pod {name} gone"), || async {
        pods.get_opt(name)
            .await
            .expect("read the Pod")
            .is_none()
            .then_some(())
    })
    .await;
}

pub fn pps_api(client: &Client) -> Api<PersistentPodState> {
    Api::default_namespaced(client.clone())
}

pub async fn get_pps(client: &Client, name: &str) -> Option<PersistentPodState> {
    pps_api(client)
        .get_opt(name)
        .await
        .expect("read the PersistentPodState")
}

pub fn records(pps: &PersistentPodState) -> BTreeMap<String, PodState> {
    pps.status
        .as_ref()
        .map(|s| s.pod_states.clone())
        .unwrap_or_default()
}

/// Record names and nodes, e.g. `[("db-0", "n1")]`.
pub fn placements(pps: &PersistentPodState) -> Vec<(String, String)> {
    records(pps)
        .into_iter()
        .map(|(pod, r)| (pod, r.node_name))
        .collect()
}

/// Waits (up to 30 s) until `pps` satisfies `check`; returns it.
pub async fn wait_pps(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&PersistentPodState) -> bool,
) -> PersistentPodState {
    wait_pps_within(client, name, what, DEFAULT_WAIT, check).await
}

/// How long [`wait_pps`] waits.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(20);

/// [`wait_pps`] with a deadline of `within`.
pub async fn wait_pps_within(
    client: &Client,
    name: &str,
    what: &str,
    within: Duration,
    check: impl Fn(&PersistentPodState) -> bool,
) -> PersistentPodState {
    let last = std::sync::Mutex::new(None);
    let found = eventually_within(within, || async {
        let pps = get_pps(client, name).await;
        *last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = pps.clone();
        pps.filter(|p| check(p))
    })
    .await;
    found.unwrap_or_else(|| {
        let last = last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        panic!(
            "timed out waiting for: {what}; last seen: {}",
            serde_json::to_string_pretty(&last).expect("a PersistentPodState serializes")
        )
    })
}

pub fn condition(pps: &PersistentPodState, type_: &str) -> Option<(String, String, String)> {
    pps.status
        .as_ref()?
        .condition(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Polls `f` every 50 ms until it returns `Some`, for at most 30 s.
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(DEFAULT_WAIT, f)
        .await
        .unwrap_or_else(|| panic!("timed out waiting for: {what}"))
}

async fn eventually_within<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every Event in the client's namespace.
pub async fn events(client: &Client) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::default_namespaced(client.clone());
    api.list(&Default::default())
        .await
        .expect("list the Events")
        .items
}

/// Reasons of the Events about `name` (any kind) in the client's namespace.
pub async fn event_reasons(client: &Client, name: &str) -> Vec<String> {
    events(client)
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reason)
        .collect()
}
