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
//! The processes run under a small shell that reads its stdin: when the test binary exits (or is
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
use rcgen::KeyPair;

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
    token: String,
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

/// What the start script does. Arguments: the state directory, the directory of the binaries,
/// the etcd client and peer ports, kube-apiserver's port, deploy/crd.yaml.
const SCRIPT: &str = r#"
set -u
dir=$1 bin=$2 p_etcd=$3 p_peer=$4 p_api=$5 crd=$6
pids=()
# SIGKILL: throwaway servers. A SIGTERM'd kube-apiserver whose etcd is gone takes minutes to
# shut down, and this shell (with every file descriptor the test binary's parent gave it) waited.
stop() { kill -KILL "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap stop EXIT
fail() {
  echo "apiserver: $1; last lines of $2:" >&2; tail -25 "$dir/$2.log" >&2
  echo failed; exit 1
}
"$bin/etcd" --name=test --data-dir="$dir/etcd" \
  --listen-client-urls="http://127.0.0.1:$p_etcd" --advertise-client-urls="http://127.0.0.1:$p_etcd" \
  --listen-peer-urls="http://127.0.0.1:$p_peer" --initial-advertise-peer-urls="http://127.0.0.1:$p_peer" \
  --initial-cluster="test=http://127.0.0.1:$p_peer" --unsafe-no-fsync=true \
  --log-level=warn >"$dir/etcd.log" 2>&1 </dev/null &
pids+=($!)
"$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$p_etcd" \
  --bind-address=127.0.0.1 --secure-port="$p_api" --endpoint-reconciler-type=none \
  --tls-cert-file="$dir/apiserver.crt" --tls-private-key-file="$dir/apiserver.key" \
  --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$dir/sa.pub" --service-account-signing-key-file="$dir/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 --enable-priority-and-fairness=false \
  --cert-dir="$dir/certs" >"$dir/kube-apiserver.log" 2>&1 </dev/null &
pids+=($!)
k=("$bin/kubectl" --kubeconfig="$dir/kubeconfig")
for _ in $(seq 1200); do
  "${k[@]}" get --raw /readyz >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || fail "etcd exited" etcd
  kill -0 "${pids[1]}" 2>/dev/null || fail "kube-apiserver exited" kube-apiserver
  sleep 0.1
done
"${k[@]}" get --raw /readyz >/dev/null 2>&1 || fail "kube-apiserver not ready in 120 s" kube-apiserver
"${k[@]}" apply -f "$crd" >"$dir/crd.log" 2>&1 || fail "kubectl apply of the CRD failed" crd
"${k[@]}" wait --for=condition=Established --timeout=60s crd/persistentpodstates.ipkeep.dev \
  >>"$dir/crd.log" 2>&1 || fail "the CRD is not Established" crd
echo ready
while read -r cmd; do
  case $cmd in
    gc)
      "$bin/kube-controller-manager" --kubeconfig="$dir/kubeconfig" \
        --controllers=garbagecollector,namespace --leader-elect=false --secure-port=0 \
        --concurrent-gc-syncs=10 >"$dir/kube-controller-manager.log" 2>&1 </dev/null &
      pids+=($!)
      # Ready when it collects: a dependent ConfigMap goes with its owner.
      "${k[@]}" -n default create configmap gc-owner >/dev/null
      uid=$("${k[@]}" -n default get configmap gc-owner -o jsonpath='{.metadata.uid}')
      printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gc-dependent\n  namespace: default\n  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: gc-owner, uid: "%s"}]\n' "$uid" |
        "${k[@]}" create -f - >/dev/null
      "${k[@]}" -n default delete configmap gc-owner >/dev/null
      ok=
      for _ in $(seq 600); do
        "${k[@]}" -n default get configmap gc-dependent >/dev/null 2>&1 || { ok=1; break; }
        kill -0 "${pids[2]}" 2>/dev/null || fail "kube-controller-manager exited" kube-controller-manager
        sleep 0.1
      done
      [ -n "$ok" ] || fail "kube-controller-manager collected nothing in 60 s" kube-controller-manager
      echo gc-ready ;;
  esac
done
"#;

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
        let token = write_credentials(&dir, &url);
        // The shell lives as long as the test binary: it stops the servers and exits when the
        // binary's end of its stdin closes, so nothing waits for it here.
        #[expect(
            clippy::zombie_processes,
            reason = "the shell outlives every test, by design"
        )]
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(SCRIPT)
            .arg("apiserver")
            .arg(&dir)
            .arg(&bin)
            .args(ports.map(|p| p.to_string()))
            .arg(repo.join("deploy/crd.yaml"))
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
            kubectl: Kubectl::new(&bin.join("kubectl"), &dir.join("kubeconfig")),
            url,
            dir,
            token,
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
        kubeconfig_yaml(&self.dir, &self.url, &self.token, namespace)
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

/// The serving certificate, the admin's token, the service-account signing key and the admin
/// kubeconfig, in `dir`; returns the token.
fn write_credentials(dir: &Path, url: &str) -> String {
    let token = token(dir);
    let pki = crate::pki::serving(&["localhost"]);
    let sa = KeyPair::generate().expect("key");
    let files = [
        ("ca.crt", pki.ca),
        ("apiserver.crt", pki.cert),
        ("apiserver.key", pki.key),
        ("sa.key", sa.serialize_pem()),
        ("sa.pub", sa.public_key_pem()),
        (
            "tokens.csv",
            format!("{token},ipkeep-test-admin,admin,\"system:masters\"\n"),
        ),
        ("kubeconfig", kubeconfig_yaml(dir, url, &token, "default")),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write the credentials");
    }
    token
}

/// The admin's bearer token: random enough for a server on loopback that lives as long as a
/// test binary.
fn token(dir: &Path) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(dir.as_os_str().as_encoded_bytes());
    format!("{:016x}{:08x}", h.finish(), std::process::id())
}

fn kubeconfig_yaml(dir: &Path, url: &str, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: admin, namespace: {namespace}}}\ncurrent-context: test\n",
        ca = dir.join("ca.crt").display()
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
