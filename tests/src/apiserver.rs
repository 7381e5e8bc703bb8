//! A real API server under the tests: etcd and kube-apiserver from the Kubernetes build
//! `scripts/k8s-build.sh` caches, started once per test binary on loopback ports, without root,
//! with the ipkeep CRD from `deploy/crd.yaml` applied; each test gets a namespace of its own
//! ([`namespace`]), in the way kube-rs' envtest and linkerd's `with_temp_ns` work.
//!
//! Nothing else runs: no scheduler, no kubelet, no StatefulSet controller. A test plays them
//! itself (creates the pods, binds them, writes their status as the admin), so it holds every
//! intermediate state as long as it likes: a pod deleted gracefully stays Terminating until the
//! test deletes it with grace 0. kube-controller-manager, with only the garbage collector and the
//! namespace controller, starts on the first [`ApiServer::start_gc`] (the tests that need
//! owner-reference cascades call it).
//!
//! The processes run under `tests/src/apiserver.sh` (scripts/lib/controlplane.sh, the control
//! plane `scripts/cluster.sh` starts), which reads its stdin: when the test binary exits (or is
//! killed), the pipe closes and the shell stops them and removes their directory.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};

use crate::cluster::{k8s_version_wanted, repo_root, require_go};
use crate::free_port;
use crate::kubectl::Kubectl;

/// The prefix of every test namespace.
const NS_PREFIX: &str = "t-";

/// The namespaces kube-apiserver makes; everything in the others is a test's.
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// The running etcd + kube-apiserver of this test binary.
#[derive(Debug)]
pub struct ApiServer {
    url: String,
    dir: PathBuf,
    kubectl: Kubectl,
    /// The shell that owns the processes: commands in, answers out.
    shell: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    gc: OnceLock<()>,
    /// Serializes the tests of one binary (see [`namespace`]).
    serial: Arc<tokio::sync::Mutex<()>>,
}

static SERVER: OnceLock<Option<ApiServer>> = OnceLock::new();

/// The server of this test binary, started on first use (a few seconds); `None` when the test
/// must be skipped (no Go to build the Kubernetes components; a failure under CI).
pub fn shared(test: &str) -> Option<&'static ApiServer> {
    if !require_go(test) {
        return None;
    }
    SERVER.get_or_init(|| Some(ApiServer::start())).as_ref()
}

impl ApiServer {
    fn start() -> ApiServer {
        let t = Instant::now();
        let repo = repo_root();
        let out = Command::new(repo.join("scripts/k8s-build.sh"))
            .args(
                k8s_version_wanted()
                    .iter()
                    .flat_map(|v| ["--k8s-version", v.as_str()]),
            )
            .args(["--without-kubelet", "--print-dir"])
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/k8s-build.sh");
        assert!(out.status.success(), "scripts/k8s-build.sh failed");
        let bin = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .expect("k8s-build.sh prints the directory")
                .trim(),
        );
        let dir = tempfile::Builder::new()
            .prefix("ipkeep-apiserver-")
            .tempdir()
            .expect("tempdir")
            .keep();
        let ports = [free_port(), free_port(), free_port()];
        let url = format!("https://127.0.0.1:{}", ports[2]);
        // The shell lives as long as the test binary: it stops the servers and exits when the
        // binary's end of its stdin closes, so nothing waits for it here.
        #[expect(
            clippy::zombie_processes,
            reason = "the shell outlives every test, by design"
        )]
        let mut child = Command::new("bash")
            .arg(repo.join("tests/src/apiserver.sh"))
            .arg(&dir)
            .arg(&bin)
            .args(ports.map(|p| p.to_string()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start bash");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let answer = read_line(&mut stdout);
        assert_eq!(
            answer, "ready",
            "etcd + kube-apiserver did not start (logs above)"
        );
        eprintln!(
            "apiserver: etcd + kube-apiserver ready at {url} in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        ApiServer {
            kubectl: Kubectl::new(&bin.join("kubectl"), &dir.join("admin.kubeconfig")),
            url,
            dir,
            shell: Mutex::new((stdin, stdout)),
            gc: OnceLock::new(),
            serial: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory of its state (certificates, etcd's data, logs), which its processes name
    /// on their command lines; removed when they stop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// kubectl as its admin.
    pub fn kubectl(&self) -> &Kubectl {
        &self.kubectl
    }

    /// An admin kubeconfig (YAML) whose namespace is `namespace`.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        kubeconfig_yaml(&self.dir, &self.url, namespace)
    }

    /// kube-controller-manager with the garbage collector and the namespace controller, once
    /// per binary; returns once it collects.
    pub fn start_gc(&self) {
        self.gc.get_or_init(|| {
            let t = Instant::now();
            let mut shell = self.shell.lock().unwrap_or_else(|e| e.into_inner());
            writeln!(shell.0, "gc").expect("talk to the apiserver shell");
            let answer = read_line(&mut shell.1);
            assert_eq!(answer, "gc-ready", "kube-controller-manager did not start");
            eprintln!(
                "apiserver: kube-controller-manager (garbage collector) collecting in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        });
    }

    /// A client as the admin whose default namespace is `namespace`.
    pub async fn client(&self, namespace: &str) -> Client {
        Client::try_from(self.config(namespace).await).expect("kube client")
    }

    /// The client configuration of [`ApiServer::client`], for clients with layers of their own.
    pub async fn config(&self, namespace: &str) -> Config {
        let kubeconfig =
            Kubeconfig::from_yaml(&self.kubeconfig(namespace)).expect("our own kubeconfig");
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kube config")
    }
}

fn read_line(from: &mut impl BufRead) -> String {
    let mut line = String::new();
    let _ = from.read_line(&mut line);
    line.trim().to_string()
}

/// An admin kubeconfig: the client certificate `tests/src/apiserver.sh` made (system:masters).
fn kubeconfig_yaml(dir: &Path, url: &str, namespace: &str) -> String {
    let pki = dir.join("pki");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\nusers:\n- name: admin\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: test\n  context: {{cluster: test, user: admin, namespace: {namespace}}}\ncurrent-context: test\n",
        ca = pki.join("ca.crt").display(),
        cert = pki.join("admin.crt").display(),
        key = pki.join("admin.key").display(),
    )
}

/// A test's namespace on the binary's server, with an admin client whose default namespace it
/// is. The tests of one binary hold it one at a time: ipkeep's controller and webhook act on
/// every namespace and on Nodes, so two tests at once would act on each other's objects.
/// Creating one first removes what earlier tests left that would trip this one: the pods,
/// StatefulSets and PersistentPodStates outside kube-apiserver's own namespaces, every Node and
/// every webhook configuration.
pub struct TestNamespace {
    /// Its name.
    pub name: String,
    /// Admin client, default namespace [`TestNamespace::name`].
    pub client: Client,
    /// The server.
    pub server: &'static ApiServer,
    _serial: tokio::sync::OwnedMutexGuard<()>,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .field("server", &self.server.url)
            .finish()
    }
}

impl TestNamespace {
    /// An admin kubeconfig (YAML) for this namespace.
    pub fn kubeconfig(&self) -> String {
        self.server.kubeconfig(&self.name)
    }

    /// [`TestNamespace::kubeconfig`] written to `dir/kubeconfig`, for the binaries under test;
    /// returns its path.
    pub fn kubeconfig_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(&path, self.kubeconfig()).expect("write the kubeconfig");
        path
    }

    /// Another namespace, named `name` exactly (for fixtures that name theirs; unique within
    /// the binary), with `labels` and its `default` ServiceAccount.
    pub async fn create_namespace(&self, name: &str, labels: serde_json::Value) {
        create_namespace(&self.client, name, labels).await;
    }
}

async fn create_namespace(admin: &Client, name: &str, labels: serde_json::Value) {
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels}}))
            .expect("namespace");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create a test namespace");
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))
            .expect("service account");
    Api::<ServiceAccount>::namespaced(admin.clone(), name)
        .create(&PostParams::default(), &sa)
        .await
        .expect("create the default ServiceAccount");
}

/// A fresh namespace (`t-<n>-<hint>`) with its `default` ServiceAccount (which kube-controller-
/// manager would create; the ServiceAccount admission of pods needs it), or `None` when the
/// test is to be skipped (see [`shared`]).
pub async fn namespace(test: &str, hint: &str) -> Option<TestNamespace> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let server = shared(test)?;
    let serial = server.serial.clone().lock_owned().await;
    let admin = server.client("default").await;
    sweep(&admin).await;
    let name = format!("{NS_PREFIX}{}-{hint}", N.fetch_add(1, Ordering::Relaxed));
    create_namespace(&admin, &name, serde_json::json!({})).await;
    Some(TestNamespace {
        client: server.client(&name).await,
        name,
        server,
        _serial: serial,
    })
}

/// Deletes what earlier tests of this binary left (see [`TestNamespace`]).
async fn sweep(admin: &Client) {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Node, Pod};
    let now = DeleteParams::default().grace_period(0);
    let pods = list_all::<Pod>(admin).await;
    for pod in pods {
        let api = Api::<Pod>::namespaced(admin.clone(), &pod.namespace().unwrap_or_default());
        let _ = api.delete(&pod.name_any(), &now).await;
    }
    delete_namespaced::<StatefulSet>(admin).await;
    delete_namespaced::<ipkeep_api::PersistentPodState>(admin).await;
    delete_cluster_scoped::<Node>(admin).await;
    delete_cluster_scoped::<MutatingWebhookConfiguration>(admin).await;
    delete_cluster_scoped::<ValidatingWebhookConfiguration>(admin).await;
}

/// What earlier tests left of kind `K`: metadata only, so that an object that does not decode
/// (a test's on purpose, see [`crate::loose_crd`]) is deleted like any other.
async fn list_all<K>(admin: &Client) -> Vec<kube::core::PartialObjectMeta<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(admin.clone())
        .list_metadata(&ListParams::default())
        .await
        .expect("list what earlier tests left")
        .items
        .into_iter()
        .filter(|o| {
            o.namespace()
                .is_none_or(|ns| !SYSTEM_NAMESPACES.contains(&ns.as_str()))
        })
        .collect()
}

async fn delete_namespaced<K>(admin: &Client)
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    for o in list_all::<K>(admin).await {
        let api = Api::<K>::namespaced(admin.clone(), &o.namespace().unwrap_or_default());
        let _ = api.delete(&o.name_any(), &DeleteParams::default()).await;
    }
}

async fn delete_cluster_scoped<K>(admin: &Client)
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    for o in list_all::<K>(admin).await {
        let _ = Api::<K>::all(admin.clone())
            .delete(&o.name_any(), &DeleteParams::default())
            .await;
    }
}
