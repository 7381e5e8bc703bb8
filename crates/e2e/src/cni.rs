//! What a container runtime does with a CNI configuration, for one simulated node: build the
//! plugin's configuration from a conflist the way libcni does (the list's name and version, the
//! `io.kubernetes.cri.pod-annotations` capability filled in as `runtimeConfig`), then run ADD and
//! DEL.
//!
//! Two modes, said plainly in the demonstration's output:
//! - **network namespaces** (root): Debian's real `bridge` plugin runs inside a throwaway
//!   "node" namespace that holds the node's bridge, with a namespace per pod, and delegates IPAM
//!   to the real `ipkeep` plugin; the pod's address is read back from the kernel;
//! - **IPAM only**: the `ipkeep` plugin is run directly with the same configuration; no
//!   interface is created.
//!
//! Only the list's first plugin runs (`portmap` and other chained plugins need iptables and add
//! nothing to what is shown), only its IPv4 range is used, and `ipMasq` is off: the node
//! namespace has no uplink.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use crate::netns::Netns;

/// Where the reference plugins live on Debian (`containernetworking-plugins`).
pub const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";

/// The pod a CNI command is for.
#[derive(Debug, Clone)]
pub struct PodIdentity {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Annotations (what the runtime passes as `io.kubernetes.cri.pod-annotations`).
    pub annotations: BTreeMap<String, String>,
}

/// A pod's network: its sandbox ID, namespace (in namespace mode) and addresses.
#[derive(Debug)]
pub struct Sandbox {
    /// The sandbox (infra container) ID.
    pub id: String,
    /// The pod's network namespace, in namespace mode.
    pub netns: Option<Netns>,
    /// Its IP addresses.
    pub ips: Vec<String>,
}

/// How pods get their network.
#[derive(Debug)]
enum Mode {
    Namespaces { node: Netns },
    IpamOnly,
}

/// One node's CNI setup.
#[derive(Debug)]
pub struct NodeNetwork {
    node: String,
    conf: Value,
    plugin_dir: PathBuf,
    ipkeep_dir: PathBuf,
    mode: Mode,
    counter: AtomicU64,
}

/// What a simulated node's CNI needs to know.
#[derive(Debug, Clone)]
pub struct NodeCni<'a> {
    /// The node's name.
    pub node: &'a str,
    /// The node's pod CIDR (IPv4).
    pub subnet: &'a str,
    /// The conflist (`deploy/cni/10-ipkeep-bridge.conflist`).
    pub conflist: &'a Value,
    /// The `ipkeep` plugin's `dataDir` (also the node agent's `--data-dir`).
    pub data_dir: &'a Path,
    /// The node agent's socket.
    pub agent_socket: &'a Path,
    /// The plugin's log file.
    pub log_file: &'a Path,
    /// Where `ipkeep` is; the reference plugins come from [`DEBIAN_CNI_DIR`].
    pub ipkeep_dir: &'a Path,
    /// Real network namespaces (root) or IPAM only.
    pub namespaces: bool,
    /// Unique per run, so namespaces of a crashed run never collide.
    pub run_id: &'a str,
}

impl NodeNetwork {
    /// The node's plugin configuration from the conflist, and its node namespace.
    pub fn new(cni: &NodeCni<'_>) -> Result<Self> {
        let list = cni.conflist;
        let Some(main) = list["plugins"].as_array().and_then(|p| p.first()) else {
            bail!("the conflist has no plugins");
        };
        if main["ipam"]["type"] != "ipkeep" {
            bail!("the conflist's first plugin does not delegate IPAM to ipkeep");
        }
        let mut conf = main.clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        conf["ipMasq"] = json!(false);
        let ipam = &mut conf["ipam"];
        ipam["ranges"] = json!([[{"subnet": cni.subnet}]]);
        ipam["routes"] = json!([{"dst": "0.0.0.0/0"}]);
        ipam["dataDir"] = json!(cni.data_dir);
        ipam["agentSocket"] = json!(cni.agent_socket);
        ipam["logFile"] = json!(cni.log_file);
        let (mode, plugin_dir) = if cni.namespaces {
            // Debian's bridge (CNI plugins 1.1) knows no cniVersion past 1.0.0; ipkeep, called
            // alone, takes the conflist's.
            conf["cniVersion"] = json!("1.0.0");
            let node = Netns::new(&format!("ikd-{}-{}", cni.node, cni.run_id))?;
            (Mode::Namespaces { node }, PathBuf::from(DEBIAN_CNI_DIR))
        } else {
            (Mode::IpamOnly, cni.ipkeep_dir.to_path_buf())
        };
        Ok(Self {
            node: cni.node.to_string(),
            conf,
            plugin_dir,
            ipkeep_dir: cni.ipkeep_dir.to_path_buf(),
            mode,
            counter: AtomicU64::new(0),
        })
    }

    /// Whether pods get real network namespaces.
    pub fn has_namespaces(&self) -> bool {
        matches!(self.mode, Mode::Namespaces { .. })
    }

    /// CNI ADD for a new sandbox of `pod`.
    pub async fn add(&self, pod: &PodIdentity, run_id: &str) -> Result<Sandbox> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{}-{n}", self.node, &pod.uid[..pod.uid.len().min(8)]);
        let netns = match &self.mode {
            Mode::Namespaces { .. } => {
                Some(Netns::new(&format!("ikp-{}-{n}-{run_id}", self.node))?)
            }
            Mode::IpamOnly => None,
        };
        let sandbox = Sandbox {
            id,
            netns,
            ips: Vec::new(),
        };
        let out = self.exec("ADD", pod, &sandbox).await?;
        let result: Value = serde_json::from_str(&out)
            .with_context(|| format!("the CNI result is not JSON: {out}"))?;
        let mut ips: Vec<String> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| {
                ip["address"]
                    .as_str()?
                    .split('/')
                    .next()
                    .map(str::to_string)
            })
            .collect();
        if let Some(ns) = &sandbox.netns {
            // What the kernel says, not what the plugin printed.
            let configured = ns.ipv4_addresses("eth0")?;
            if configured.is_empty() || !ips.iter().all(|ip| configured.contains(ip)) {
                bail!(
                    "the plugin answered {ips:?} but eth0 in the pod's namespace has {configured:?}"
                );
            }
            ips = configured;
        }
        if ips.is_empty() {
            bail!("the CNI result has no address: {out}");
        }
        Ok(Sandbox { ips, ..sandbox })
    }

    /// CNI DEL for a sandbox; its namespace goes with it.
    pub async fn del(&self, pod: &PodIdentity, sandbox: Sandbox) -> Result<()> {
        self.exec("DEL", pod, &sandbox).await.map(drop)
    }

    async fn exec(&self, command: &str, pod: &PodIdentity, sandbox: &Sandbox) -> Result<String> {
        let mut conf = self.conf.clone();
        conf["runtimeConfig"] = json!({"io.kubernetes.cri.pod-annotations": pod.annotations});
        let main = conf["type"].as_str().unwrap_or("bridge").to_string();
        let cni_args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            pod.namespace, pod.name, sandbox.id, pod.uid
        );
        let cni_path = match &self.mode {
            // The main plugin from Debian, IPAM from wherever ipkeep was built.
            Mode::Namespaces { .. } => format!("{}:{DEBIAN_CNI_DIR}", self.ipkeep_dir.display()),
            Mode::IpamOnly => self.plugin_dir.display().to_string(),
        };
        let mut cmd = match &self.mode {
            Mode::Namespaces { node } => {
                let mut c = tokio::process::Command::new("ip");
                c.args(["netns", "exec", node.name()])
                    .arg(self.plugin_dir.join(&main));
                c
            }
            Mode::IpamOnly => tokio::process::Command::new(self.plugin_dir.join("ipkeep")),
        };
        let netns_path = sandbox.netns.as_ref().map_or_else(
            || format!("/var/run/netns/ipam-only-{}", sandbox.id),
            Netns::path,
        );
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &sandbox.id)
            .env("CNI_NETNS", netns_path)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", cni_path)
            .env("CNI_ARGS", cni_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("cannot run the CNI plugin")?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(conf.to_string().as_bytes()).await?;
        }
        let out = child.wait_with_output().await?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "CNI {command} for {}/{} on {} failed: {stdout}{}",
                pod.namespace,
                pod.name,
                self.node,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }
}
