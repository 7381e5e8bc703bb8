//! Test harness: a namespace of its own on the test binary's real etcd + kube-apiserver
//! (`ipkeep_tests::apiserver`: the CRD from `deploy/crd.yaml`, nothing else running), Ready
//! nodes, and helpers that play the StatefulSet controller, the scheduler and the kubelet, plus
//! the ipkeep controller running in-process.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipkeep_api::{PersistentPodState, PodState};
use ipkeep_controller::http::Health;
use ipkeep_controller::leader::LeaderSettings;
use ipkeep_controller::{Settings, run};
use ipkeep_tests::apiserver::{self, ApiServer, TestNamespace};
use ipkeep_tests::faults::Faults;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

pub struct Cluster {
    /// The test's namespace.
    pub ns: String,
    /// Admin client; its default namespace is [`Cluster::ns`].
    pub client: Client,
    pub server: &'static ApiServer,
    _ns: TestNamespace,
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
    .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node).await.unwrap();
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
        .unwrap();
}

pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// A running controller.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ipkeep_controller::RunError>>,
    pub health: Arc<Health>,
}

pub fn start_controller(
    client: &Client,
    leader: Option<LeaderSettings>,
    identity: &str,
) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (stop, stopped) = oneshot::channel::<()>();
    let health = Arc::new(Health::default());
    let settings = Settings {
        concurrency: 4,
        debounce: Duration::from_millis(20),
        leader,
        identity: identity.into(),
    };
    let task = tokio::spawn(run(client.clone(), settings, health.clone(), async move {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        task,
        health,
    }
}

impl Running {
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        Ok(tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("controller did not stop within 20 s")
            .unwrap()?)
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

pub fn leader(namespace: &str, identity: &str) -> LeaderSettings {
    LeaderSettings {
        namespace: namespace.into(),
        lease_name: "ipkeep-controller".into(),
        identity: identity.into(),
        lease_seconds: 2,
        renew_before_seconds: 1,
    }
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
    .unwrap();
    Api::<StatefulSet>::default_namespaced(client.clone())
        .create(&PostParams::default(), &sts)
        .await
        .unwrap()
}

pub async fn patch_sts(client: &Client, name: &str, patch: Value) {
    Api::<StatefulSet>::default_namespaced(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
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
    let name = format!("{}-{ordinal}", sts.name_any());
    let owner = sts.controller_owner_ref(&()).unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": sts.name_any(), "statefulset.kubernetes.io/pod-name": name},
                     "ownerReferences": [owner]},
        "spec": {"nodeName": node, "containers": [{"name": "db", "image": "postgres:17"}]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    set_pod_ready(client, &name, ip, true).await
}

pub async fn set_pod_ready(client: &Client, name: &str, ip: &str, ready: bool) -> Pod {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": now()}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
}

/// Starts a graceful delete (the pod is Terminating).
pub async fn terminate_pod(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.delete(name, &DeleteParams::default()).await.unwrap();
}

/// Deletes a pod for good (graceful delete, then the kubelet's grace-0 delete).
pub async fn remove_pod(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let _ = pods.delete(name, &DeleteParams::default()).await;
    let _ = pods
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
    eventually(&format!("pod {name} gone"), || async {
        pods.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

pub fn pps_api(client: &Client) -> Api<PersistentPodState> {
    Api::default_namespaced(client.clone())
}

pub async fn get_pps(client: &Client, name: &str) -> Option<PersistentPodState> {
    pps_api(client).get_opt(name).await.unwrap()
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
        *last.lock().unwrap() = pps.clone();
        pps.filter(|p| check(p))
    })
    .await;
    found.unwrap_or_else(|| {
        let last = last.lock().unwrap().clone();
        panic!(
            "timed out waiting for: {what}; last seen: {}",
            serde_json::to_string_pretty(&last).unwrap()
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
    api.list(&Default::default()).await.unwrap().items
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
