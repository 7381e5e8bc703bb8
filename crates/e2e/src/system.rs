//! The local system: the in-memory API server, the simulators, and ipkeep's real binaries as
//! processes, set up from the files in `deploy/` as an admin would apply them.
//!
//! Layout of the work directory: `kubeconfig`, `pki/` (CA, serving certificate), `logs/` (one
//! file per process, `simulators.log`, the plugin's `ipkeep-cni-<node>.log`), and
//! `nodes/<node>/` (the node's ipkeep `dataDir` and the agent's socket).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ipkeep_apisim::{ApiServer, ServerConfig};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::cni::{NodeCni, NodeNetwork};
use crate::procs::{Process, Stop, free_port};
use crate::sim::kubelet::Kubelet;
use crate::sim::scheduler::{Extender, Scheduler};
use crate::sim::statefulset::StatefulSetController;
use crate::sim::{SimLog, every, podgc};
use crate::{SYSTEM_NAMESPACE, http, pki, repo_root};

/// The scheduler extension's Service, as deploy/ names it.
const EXT_SERVICE: &str = "ipkeep-scheduler-ext";
/// How many controller replicas run (as in deploy/controller/deployment.yaml).
const CONTROLLER_REPLICAS: usize = 2;
/// How often the simulators look.
const SIM_PERIOD: Duration = Duration::from_millis(200);

/// A simulated node.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// `metadata.name` and `kubernetes.io/hostname`.
    pub name: String,
    /// `topology.kubernetes.io/zone`.
    pub zone: String,
    /// `spec.podCIDR` (the node's range in the CNI configuration).
    pub subnet: String,
}

/// Three nodes, two zones.
pub fn default_nodes() -> Vec<NodeSpec> {
    [
        ("node-1", "zone-a"),
        ("node-2", "zone-a"),
        ("node-3", "zone-b"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (name, zone))| NodeSpec {
        name: name.to_string(),
        zone: zone.to_string(),
        subnet: format!("10.244.{}.0/24", i + 1),
    })
    .collect()
}

/// How to set the system up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where `ipkeep`, `ipkeep-agent`, `ipkeep-controller` and `ipkeep-scheduler-ext` are.
    pub bin_dir: PathBuf,
    /// The work directory (see the module comment).
    pub work_dir: PathBuf,
    /// Real network namespaces with the `bridge` plugin (root), or IPAM only.
    pub namespaces: bool,
    /// The nodes.
    pub nodes: Vec<NodeSpec>,
}

/// One node agent.
#[derive(Debug)]
struct Agent {
    process: Process,
    probe: SocketAddr,
}

/// One simulated node: its kubelet and the CNI setup behind it.
struct SimNode {
    kubelet: Arc<Kubelet>,
    task: JoinHandle<()>,
    data_dir: PathBuf,
    socket: PathBuf,
}

/// The running local system; everything stops when it is dropped.
pub struct LocalSystem {
    server: ApiServer,
    client: Client,
    options: Options,
    kubeconfig: PathBuf,
    logs: PathBuf,
    log: SimLog,
    network_name: String,
    controllers: Vec<(Process, SocketAddr)>,
    scheduler_ext: (Process, SocketAddr),
    agents: BTreeMap<String, Agent>,
    nodes: BTreeMap<String, SimNode>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for LocalSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSystem")
            .field("api", &self.server.url())
            .field("work_dir", &self.options.work_dir)
            .finish_non_exhaustive()
    }
}

/// Reads a YAML file of deploy/ (its first document) into `T`.
pub fn deploy_file<T: DeserializeOwned>(path: &str) -> Result<T> {
    let full = repo_root().join("deploy").join(path);
    let text =
        std::fs::read_to_string(&full).with_context(|| format!("read {}", full.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("parse {}", full.display()))
}

/// Every YAML document of a deploy/ file.
pub fn deploy_documents(path: &str) -> Result<Vec<Value>> {
    let full = repo_root().join("deploy").join(path);
    let text =
        std::fs::read_to_string(&full).with_context(|| format!("read {}", full.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("parse {}", full.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

async fn create<K>(api: &Api<K>, object: &K) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl LocalSystem {
    /// Starts everything and waits until every component is ready.
    pub async fn start(options: Options) -> Result<Self> {
        let work = &options.work_dir;
        let logs = work.join("logs");
        for dir in [logs.clone(), work.join("pki"), work.join("nodes")] {
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let log = SimLog::open(&logs.join("simulators.log"))?;
        let ext_listen = free_port()?;
        let server = ApiServer::start_with(ServerConfig {
            service_endpoints: HashMap::from([(
                (SYSTEM_NAMESPACE.to_string(), EXT_SERVICE.to_string()),
                ext_listen,
            )]),
            ..ServerConfig::default()
        })
        .await
        .context("start the in-memory API server")?;
        let client = server.client()?;
        let kubeconfig = work.join("kubeconfig");
        std::fs::write(&kubeconfig, server.kubeconfig("default"))?;

        // What an admin applies first: the CRD and the namespace.
        let crd: CustomResourceDefinition = deploy_file("crd.yaml")?;
        create(&Api::all(client.clone()), &crd).await?;
        let namespace: Namespace = deploy_file("namespace.yaml")?;
        create(&Api::all(client.clone()), &namespace).await?;
        for node in &options.nodes {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let object: Node = serde_json::from_value(json!({
                "metadata": {"name": node.name, "labels": {
                    "kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux",
                    "topology.kubernetes.io/zone": node.zone}},
                "spec": {"podCIDR": node.subnet, "podCIDRs": [node.subnet]},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "simulated kubelet is posting ready status", "lastTransitionTime": now, "lastHeartbeatTime": now}]}
            }))?;
            create(&Api::all(client.clone()), &object).await?;
        }

        // The scheduler extension with a certificate for its Service name, then its webhook.
        let service_dns = format!("{EXT_SERVICE}.{SYSTEM_NAMESPACE}.svc");
        let pki = pki::issue(&[service_dns.as_str()])?;
        let pki_dir = work.join("pki");
        for (file, pem) in [
            ("ca.crt", &pki.ca),
            ("tls.crt", &pki.cert),
            ("tls.key", &pki.key),
        ] {
            std::fs::write(pki_dir.join(file), pem)?;
        }
        let env = vec![("KUBECONFIG".to_string(), OsString::from(&kubeconfig))];
        let ext_probe = free_port()?;
        let ext = Process::start(
            "scheduler-ext",
            &options.bin_dir.join("ipkeep-scheduler-ext"),
            args(&[
                "--listen",
                &ext_listen.to_string(),
                "--probe-listen",
                &ext_probe.to_string(),
                "--tls-cert",
                &pki_dir.join("tls.crt").display().to_string(),
                "--tls-key",
                &pki_dir.join("tls.key").display().to_string(),
                "--log",
                "info",
            ]),
            env.clone(),
            &logs,
        )?;
        let mut system = Self {
            server,
            client: client.clone(),
            kubeconfig: kubeconfig.clone(),
            logs: logs.clone(),
            log: log.clone(),
            network_name: String::new(),
            controllers: Vec::new(),
            scheduler_ext: (ext, ext_probe),
            agents: BTreeMap::new(),
            nodes: BTreeMap::new(),
            tasks: Vec::new(),
            options: options.clone(),
        };
        system.wait_ready("scheduler-ext", ext_probe).await?;
        let mut hook: Value =
            serde_json::to_value(deploy_file::<Value>("scheduler-ext/webhook.yaml")?)?;
        for webhook in hook["webhooks"].as_array_mut().into_iter().flatten() {
            webhook["clientConfig"]["caBundle"] = json!(BASE64.encode(&pki.ca));
        }
        let hook: MutatingWebhookConfiguration = serde_json::from_value(hook)?;
        create(&Api::all(client.clone()), &hook).await?;

        for i in 0..CONTROLLER_REPLICAS {
            let probe = free_port()?;
            let identity = format!("ipkeep-controller-{i}");
            let process = Process::start(
                &format!("controller-{i}"),
                &options.bin_dir.join("ipkeep-controller"),
                args(&[
                    "--listen",
                    &probe.to_string(),
                    "--lease-namespace",
                    SYSTEM_NAMESPACE,
                    "--lease-duration",
                    "4s",
                    "--identity",
                    &identity,
                    "--log",
                    "info",
                ]),
                env.clone(),
                &logs,
            )?;
            system.controllers.push((process, probe));
        }

        // Nodes: an agent and a kubelet each, the conflist from deploy/ with the node's subnet.
        let conflist_path = repo_root().join("deploy/cni/10-ipkeep-bridge.conflist");
        let conflist: Value = serde_json::from_str(&std::fs::read_to_string(&conflist_path)?)
            .with_context(|| format!("parse {}", conflist_path.display()))?;
        system.network_name = conflist["name"].as_str().unwrap_or_default().to_string();
        // Unique per system, so two systems (or a crashed run's leftovers) never share a
        // namespace name; short, because interface and namespace names are.
        static SYSTEMS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SYSTEMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let run_id = format!("{}{n}", std::process::id() % 100_000);
        for node in &options.nodes {
            let dir = work.join("nodes").join(&node.name);
            let data_dir = dir.join("ipam");
            std::fs::create_dir_all(&data_dir)?;
            let socket = dir.join("agent.sock");
            let probe = free_port()?;
            let process = Process::start(
                &format!("agent-{}", node.name),
                &options.bin_dir.join("ipkeep-agent"),
                args(&[
                    "--node-name",
                    &node.name,
                    "--data-dir",
                    &data_dir.display().to_string(),
                    "--socket",
                    &socket.display().to_string(),
                    "--probe-listen",
                    &probe.to_string(),
                    "--sweep-interval",
                    "2s",
                    "--release-grace",
                    "1s",
                    "--missed-del-grace",
                    "30s",
                    "--log",
                    "info",
                ]),
                env.clone(),
                &logs,
            )?;
            system
                .agents
                .insert(node.name.clone(), Agent { process, probe });
            let network = NodeNetwork::new(&NodeCni {
                node: &node.name,
                subnet: &node.subnet,
                conflist: &conflist,
                data_dir: &data_dir,
                agent_socket: &socket,
                log_file: &logs.join(format!("ipkeep-cni-{}.log", node.name)),
                ipkeep_dir: &options.bin_dir,
                namespaces: options.namespaces,
                run_id: &run_id,
            })?;
            let kubelet = Arc::new(Kubelet::new(
                &node.name,
                client.clone(),
                Arc::new(network),
                &run_id,
                log.clone(),
            ));
            let k = kubelet.clone();
            let task = every(
                format!("kubelet/{}", node.name),
                SIM_PERIOD,
                log.clone(),
                move || {
                    let k = k.clone();
                    async move { k.tick().await }
                },
            );
            system.nodes.insert(
                node.name.clone(),
                SimNode {
                    kubelet,
                    task,
                    data_dir,
                    socket,
                },
            );
        }

        // The control plane's simulated parts.
        let scheduler_config: Value = deploy_file("scheduler-ext/scheduler-config.yaml")?;
        let extender = Extender::from_config(&scheduler_config, ext_listen, &pki.ca)?;
        let scheduler = Arc::new(Scheduler::new(client.clone(), Some(extender), log.clone()));
        system.tasks.push(every(
            "scheduler".into(),
            SIM_PERIOD,
            log.clone(),
            move || {
                let s = scheduler.clone();
                async move { s.tick().await }
            },
        ));
        let sts = StatefulSetController::new(client.clone(), log.clone());
        system.tasks.push(every(
            "statefulset".into(),
            SIM_PERIOD,
            log.clone(),
            move || {
                let s = sts.clone();
                async move { s.tick().await }
            },
        ));
        let gc_client = client.clone();
        let gc_log = log.clone();
        system
            .tasks
            .push(every("podgc".into(), SIM_PERIOD, log.clone(), move || {
                let (c, l) = (gc_client.clone(), gc_log.clone());
                async move { podgc::collect_orphans(&c, &l).await }
            }));
        system.wait_all_ready().await?;
        Ok(system)
    }

    /// A client of the API server.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The kubeconfig file for kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The logs directory.
    pub fn logs(&self) -> &Path {
        &self.logs
    }

    /// The simulators' log.
    pub fn sim_log(&self) -> &SimLog {
        &self.log
    }

    /// Whether pods get real network namespaces.
    pub fn namespaces(&self) -> bool {
        self.options.namespaces
    }

    async fn wait_ready(&mut self, name: &str, probe: SocketAddr) -> Result<()> {
        http::wait_ok(probe, "/readyz", Duration::from_secs(30), name)
            .await
            .with_context(|| format!("see {}", self.logs.join(format!("{name}.log")).display()))
    }

    async fn wait_all_ready(&mut self) -> Result<()> {
        self.check_running()?;
        let (_, p) = self.scheduler_ext;
        self.wait_ready("scheduler-ext", p).await?;
        // A standby controller is alive but not ready to lead; /healthz says it runs.
        for i in 0..self.controllers.len() {
            let p = self.controllers[i].1;
            http::wait_ok(
                p,
                "/healthz",
                Duration::from_secs(30),
                &format!("controller-{i}"),
            )
            .await?;
        }
        let agents: Vec<(String, SocketAddr)> = self
            .agents
            .iter()
            .map(|(n, a)| (n.clone(), a.probe))
            .collect();
        for (node, probe) in agents {
            self.wait_ready(&format!("agent-{node}"), probe).await?;
        }
        // One replica leads (after a SIGKILL, once the old lease has expired).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.leader_metrics().await.is_none() {
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "no ipkeep-controller replica became leader within 30s; see {}",
                    self.logs.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// An error, with the end of its log, if any component has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.scheduler_ext.0.check_running()?;
        for (p, _) in &mut self.controllers {
            p.check_running()?;
        }
        for a in self.agents.values_mut() {
            a.process.check_running()?;
        }
        Ok(())
    }

    /// Restarts every ipkeep component (`how`), one after the other, and waits until all are
    /// ready again: what a rolling upgrade, or a crash of everything, does.
    pub async fn restart_all(&mut self, how: Stop) -> Result<Vec<String>> {
        let mut restarted = Vec::new();
        for (p, _) in &mut self.controllers {
            p.restart(how).await?;
            restarted.push(p.name().to_string());
        }
        self.scheduler_ext.0.restart(how).await?;
        restarted.push(self.scheduler_ext.0.name().to_string());
        for a in self.agents.values_mut() {
            a.process.restart(how).await?;
            restarted.push(a.process.name().to_string());
        }
        self.wait_all_ready().await?;
        Ok(restarted)
    }

    /// The machine `node` is gone: its kubelet and agent stop without cleaning up, and the Node
    /// object is deleted (as a cloud node controller does).
    pub async fn delete_node(&mut self, node: &str) -> Result<()> {
        let Some(sim) = self.nodes.remove(node) else {
            bail!("no node {node}");
        };
        sim.task.abort();
        sim.kubelet.vanish().await;
        if let Some(mut agent) = self.agents.remove(node) {
            agent.process.stop(Stop::Kill).await;
        }
        Api::<Node>::all(self.client.clone())
            .delete(node, &DeleteParams::default())
            .await
            .with_context(|| format!("delete node {node}"))?;
        self.log
            .line("cloud", &format!("node {node} deleted (machine gone)"));
        Ok(())
    }

    /// The addresses node `node`'s ipkeep store has (`ipkeep list --json` through its agent):
    /// `(ip, pod name, "active" | "held")`.
    pub async fn leases(&self, node: &str) -> Result<Vec<(String, String, String)>> {
        let Some(sim) = self.nodes.get(node) else {
            bail!("no node {node}");
        };
        let out = tokio::process::Command::new(self.options.bin_dir.join("ipkeep"))
            .arg("list")
            .arg("--agent-socket")
            .arg(&sim.socket)
            .args(["--json", "--network", &self.network_name, "--data-dir"])
            .arg(&sim.data_dir)
            .output()
            .await?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("no ipkeep state") {
                return Ok(Vec::new());
            }
            bail!("ipkeep list on {node}: {stderr}");
        }
        crate::nodes::parse_leases(&String::from_utf8_lossy(&out.stdout))
    }

    /// How many of node `node`'s plugin commands fell back to opening the store themselves
    /// instead of going through the agent (the plugin counts them in `<dataDir>/<network>/fallbacks`).
    pub fn fallbacks(&self, node: &str) -> u64 {
        self.nodes
            .get(node)
            .and_then(|n| {
                std::fs::read_to_string(n.data_dir.join(&self.network_name).join("fallbacks")).ok()
            })
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The node agent's metrics.
    pub async fn agent_metrics(&self, node: &str) -> Option<String> {
        let agent = self.agents.get(node)?;
        http::get(agent.probe, "/metrics")
            .await
            .map(|(_, body)| body)
    }

    /// The metrics of whichever controller replica answers with `leader 1`.
    pub async fn leader_metrics(&self) -> Option<String> {
        for (_, probe) in &self.controllers {
            if let Some((_, body)) = http::get(*probe, "/metrics").await
                && http::metric_sum(&body, "ipkeep_controller_leader", &[]) >= 1.0
            {
                return Some(body);
            }
        }
        None
    }

    /// Where each component's log is, for the report.
    pub fn log_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.logs)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
    }
}

impl Drop for LocalSystem {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for node in self.nodes.values() {
            node.task.abort();
        }
    }
}

fn args(list: &[&str]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}
