//! A real cluster on this machine: `scripts/cluster.sh up` (the control plane built from
//! upstream), with real nodes (`--nodes N`: kubelet and containerd per node, ipkeep installed
//! from `deploy/` as images) or with kwok nodes only (`--nodes 0 --kwok-nodes N`: ipkeep's
//! controller and scheduler-ext as local processes, no root), and what the scenario does to its
//! nodes through the same script: stop and start a node's kubelet and containerd, run
//! `ipkeep list` on a node, read its agent's metrics, restart ipkeep's pods. Dropping it takes
//! the cluster down (unless kept).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::SYSTEM_NAMESPACE;

/// The CNI network the cluster's nodes run (deploy/cni/10-ipkeep-bridge.conflist's `name`).
pub const NETWORK: &str = "k8s-pod-network";

/// A running cluster with real nodes.
pub struct RealCluster {
    script: PathBuf,
    state: PathBuf,
    kubectl: PathBuf,
    client: Client,
    keep: bool,
    keep_logs: bool,
    dual_stack: bool,
    /// The nodes' CNI plugin directory (`scripts/cluster.sh --node-layout`), where `ipkeep` is.
    cni_bin_dir: String,
    /// Whether kube-scheduler calls ipkeep's extender (`scripts/cluster.sh --without-extender`).
    extender: bool,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// What `up` needs.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The repository (for scripts/cluster.sh and deploy/).
    pub repo: PathBuf,
    /// The cluster's state directory.
    pub state: PathBuf,
    /// How many real nodes (0: the control plane alone).
    pub nodes: usize,
    /// How many kwok nodes (`--kwok-nodes`).
    pub kwok_nodes: usize,
    /// First of the control plane's ports.
    pub port_base: u16,
    /// Without ipkeep: Debian's bridge with host-local on every node (a baseline).
    pub without_ipkeep: bool,
    /// Dual-stack (`scripts/cluster.sh --ip-family dual`): IPv4 and IPv6 pod and Service
    /// ranges; else IPv4 only.
    pub dual_stack: bool,
}

impl RealCluster {
    /// Brings the cluster up (`scripts/cluster.sh up`), showing its progress on stderr.
    pub async fn up(setup: &Setup) -> Result<Self> {
        let script = setup.repo.join("scripts/cluster.sh");
        let out = tokio::process::Command::new(&script)
            .arg("up")
            .args(["--nodes", &setup.nodes.to_string()])
            .args(["--kwok-nodes", &setup.kwok_nodes.to_string()])
            // Real nodes always run the release build (in their image); without them,
            // ipkeep's local processes run it too, the build ipkeep-demo comes from.
            .args((setup.nodes == 0).then_some("--release"))
            .args(["--port-base", &setup.port_base.to_string()])
            .args(setup.without_ipkeep.then_some("--without-ipkeep"))
            .args([
                "--ip-family",
                if setup.dual_stack { "dual" } else { "ipv4" },
            ])
            .arg("--state")
            .arg(&setup.state)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()
            .await
            .with_context(|| format!("run {}", script.display()))?;
        if !out.success() {
            bail!(
                "scripts/cluster.sh up failed (its output is above; logs in {}/logs)",
                setup.state.display()
            );
        }
        let down = |e: anyhow::Error| {
            let _ = std::process::Command::new(&script)
                .arg("down")
                .arg("--state")
                .arg(&setup.state)
                .status();
            e
        };
        Ok(Self::attach(&setup.repo, &setup.state)
            .await
            .map_err(down)?
            .down_on_drop(true))
    }

    /// A cluster `scripts/cluster.sh up` already started, in `state`; it stays up on drop.
    pub async fn attach(repo: &Path, state: &Path) -> Result<Self> {
        let bin = std::fs::read_to_string(state.join("bin"))
            .with_context(|| format!("{} holds no cluster", state.display()))?;
        let kubeconfig = state.join("admin.kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        Ok(Self {
            script: repo.join("scripts/cluster.sh"),
            state: state.to_path_buf(),
            kubectl: Path::new(bin.trim()).join("kubectl"),
            client: Client::try_from(config)?,
            keep: true,
            keep_logs: false,
            dual_stack: std::fs::read_to_string(state.join("ip-family"))
                .is_ok_and(|f| f.trim() == "dual"),
            cni_bin_dir: std::fs::read_to_string(state.join("node-layout"))
                .ok()
                .and_then(|l| {
                    l.lines()
                        .find_map(|l| l.strip_prefix("cni_bin_dir=").map(str::to_string))
                })
                .unwrap_or_else(|| "/opt/cni/bin".into()),
            extender: std::fs::read_to_string(state.join("extender"))
                .map_or(true, |e| e.trim() != "0"),
        })
    }

    /// Take the cluster down on drop (what `up` returns does; `attach` does not).
    pub fn down_on_drop(mut self, down: bool) -> Self {
        self.keep = !down;
        self
    }

    /// Keep the cluster's logs (in the state directory's `logs/`) when it is taken down.
    pub fn keep_logs(&mut self) {
        self.keep_logs = true;
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    /// Whether kube-scheduler calls ipkeep's extender (`scripts/cluster.sh --without-extender`
    /// leaves it out: the admission policy or the webhook alone pins pods).
    pub fn extender(&self) -> bool {
        self.extender
    }

    /// Whether the cluster is dual-stack (`scripts/cluster.sh --ip-family dual`): every pod on
    /// the pod network has an IPv4 and an IPv6 address.
    pub fn dual_stack(&self) -> bool {
        self.dual_stack
    }

    /// The cluster's state directory (logs in `logs/`).
    pub fn state(&self) -> &Path {
        &self.state
    }

    /// `scripts/cluster.sh ARGS... --state DIR [-- COMMAND...]`; its stdout.
    async fn script(&self, args: &[&str], command: &[&str]) -> Result<String> {
        let mut cmd = tokio::process::Command::new(&self.script);
        cmd.args(args).arg("--state").arg(&self.state);
        if !command.is_empty() {
            cmd.arg("--").args(command);
        }
        let out = cmd.output().await?;
        if !out.status.success() {
            bail!(
                "scripts/cluster.sh {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stops the node's kubelet and containerd (its pods keep running).
    pub async fn stop_node(&self, node: &str) -> Result<()> {
        self.script(&["node", "stop", node], &[]).await.map(drop)
    }

    /// Starts the node's kubelet and containerd again.
    pub async fn start_node(&self, node: &str) -> Result<()> {
        self.script(&["node", "start", node], &[]).await.map(drop)
    }

    /// Runs a command on the node (its namespaces), returning its stdout.
    pub async fn on_node(&self, node: &str, command: &[&str]) -> Result<String> {
        self.script(&["node", "exec", node], command).await
    }

    /// `kubectl ARGS...` with the admin kubeconfig; its stdout.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = tokio::process::Command::new(&self.kubectl)
            .env("KUBECONFIG", self.kubeconfig())
            .args(args)
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node store's leases as (IP, pod name, "active" | "held"), from `ipkeep list` run on
    /// the node (through its agent, as an operator would).
    pub async fn leases(&self, node: &str) -> Result<Vec<(String, String, String)>> {
        let ipkeep = format!("{}/ipkeep", self.cni_bin_dir);
        let out = self
            .on_node(node, &[&ipkeep, "list", "--json", "--network", NETWORK])
            .await;
        let text = match out {
            Ok(text) => text,
            Err(e) if e.to_string().contains("no ipkeep state") => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        parse_leases(&text)
    }

    /// The node agent's metrics (it listens on the node's loopback).
    pub async fn agent_metrics(&self, node: &str) -> Result<String> {
        self.on_node(
            node,
            &["curl", "-fsS", "-m", "5", "http://127.0.0.1:9464/metrics"],
        )
        .await
    }

    /// How many plugin commands on the node fell back to opening the store themselves.
    pub async fn fallbacks(&self, node: &str) -> u64 {
        let path = format!("/var/lib/cni/ipkeep/{NETWORK}/fallbacks");
        self.on_node(node, &["cat", &path])
            .await
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Deletes every ipkeep pod (controller, scheduler-ext, agent) and waits until their
    /// Deployments and DaemonSet have them Ready again. Returns what was restarted.
    pub async fn restart_ipkeep(&self) -> Result<Vec<String>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let names: Vec<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        for name in &names {
            pods.delete(name, &DeleteParams::default()).await?;
        }
        for workload in [
            "deployment/ipkeep-controller",
            "deployment/ipkeep-scheduler-ext",
            "daemonset/ipkeep-agent",
        ] {
            self.kubectl(&[
                "-n",
                SYSTEM_NAMESPACE,
                "rollout",
                "status",
                workload,
                "--timeout=120s",
            ])
            .await?;
        }
        // rollout status can pass on the old pods' counts; wait until none of them is left.
        self.wait_ipkeep_ready(&names).await?;
        Ok(names)
    }

    /// SIGKILLs every ipkeep process of the cluster at once ([`crate::crash`]) and waits (up to
    /// three minutes) until the kubelets have restarted each container and every ipkeep pod is
    /// Ready again. Returns what was killed.
    pub async fn kill_ipkeep(&self) -> Result<Vec<String>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let before = restarts(&pods.list(&ListParams::default()).await?.items);
        let victims = crate::crash::in_containers();
        if victims.len() < before.len() {
            bail!(
                "found {} ipkeep processes under containerd shims for {} ipkeep pods ({}): is the cluster's node runtime containerd?",
                victims.len(),
                before.len(),
                before.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        crate::crash::kill_all(&victims)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        loop {
            let now = pods.list(&ListParams::default()).await?.items;
            let counts = restarts(&now);
            let restarted = (before.iter()).all(|(pod, n)| counts.get(pod).is_some_and(|m| m > n));
            if restarted && now.iter().all(crate::objects::is_ready) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "ipkeep's pods were not all restarted and Ready within 180 s of SIGKILL (restart counts before {before:?}, now {counts:?})"
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(victims
            .iter()
            .map(|p| format!("{} (pid {})", p.program, p.pid))
            .collect())
    }

    /// Waits (up to two minutes) until every ipkeep pod is Ready and none of `old` is left: a
    /// restarted kubelet, for one, reports its pods not Ready until their probes pass again.
    pub async fn wait_ipkeep_ready(&self, old: &[String]) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let now: Vec<Pod> = pods.list(&ListParams::default()).await?.items;
            let stale = now.iter().any(|p| old.contains(&p.name_any()));
            let ready = now.iter().all(crate::objects::is_ready);
            if !stale && ready && !now.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("ipkeep's pods were not all Ready within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl RealCluster {
    /// The global addresses (IPv4, and IPv6 of global scope) on eth0 inside the pod's network
    /// namespace (`ip` in its container), sorted.
    pub async fn pod_addresses(&self, namespace: &str, pod: &str) -> Result<Vec<String>> {
        let out = self
            .kubectl(&[
                "-n", namespace, "exec", pod, "--", "ip", "-o", "addr", "show", "dev", "eth0",
                "scope", "global",
            ])
            .await?;
        let mut ips = pod_addresses_of(&out);
        if ips.is_empty() {
            bail!("no address on eth0 in {pod}: {out}");
        }
        ips.sort();
        Ok(ips)
    }

    /// Pings each of `ips` once from a pod on another node than `node` (a busybox pod
    /// `probe-<node>`, created and deleted here); which node it ran on, and whether each ping
    /// was answered.
    pub async fn ping_from_another_node(
        &self,
        namespace: &str,
        node: &str,
        ips: &[&str],
    ) -> Result<(String, Vec<bool>)> {
        let nodes = crate::objects::node_names(&self.client).await?;
        let from = nodes
            .into_iter()
            .find(|n| n != node)
            .context("no other node to ping from")?;
        let name = format!("probe-{from}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": from,
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "probe",
                    "image": "localhost/ipkeep/busybox:dev",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"],
                }],
            },
        }))?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        pods.create(&Default::default(), &pod).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !pods
            .get_opt(&name)
            .await?
            .is_some_and(|p| crate::objects::is_ready(&p))
        {
            if tokio::time::Instant::now() > deadline {
                bail!("the probe pod {name} did not become Ready on {from} within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let mut reached = Vec::new();
        for ip in ips {
            reached.push(
                self.kubectl(&[
                    "-n", namespace, "exec", &name, "--", "ping", "-c", "1", "-W", "3", ip,
                ])
                .await
                .is_ok(),
            );
        }
        pods.delete(&name, &DeleteParams::default().grace_period(0))
            .await?;
        Ok((from, reached))
    }

    /// Waits (up to two minutes) until the node's Ready condition is `ready`.
    pub async fn wait_node_ready(&self, node: &str, ready: bool) -> Result<()> {
        let want = if ready { "True" } else { "False|Unknown" };
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let status = nodes
                .get(node)
                .await?
                .status
                .and_then(|s| s.conditions)
                .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status)
                .unwrap_or_default();
            if (status == "True") == ready {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("node {node} not Ready={want} within 120 s (it is {status})");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let mut down = std::process::Command::new(&self.script);
        down.arg("down").arg("--state").arg(&self.state);
        if self.keep_logs {
            down.arg("--keep-logs");
        }
        let _ = down.stdout(Stdio::null()).status();
    }
}

/// The addresses of `ip -o addr` lines (`inet A/N` and `inet6 A/N`).
pub fn pod_addresses_of(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "inet" || w[0] == "inet6")
        .filter_map(|w| w[1].split('/').next())
        .map(str::to_string)
        .collect()
}

/// `ipkeep list --json` → (IP, pod name, "active" | "held").
pub fn parse_leases(text: &str) -> Result<Vec<(String, String, String)>> {
    let list: Value = serde_json::from_str(text).context("ipkeep list --json printed no JSON")?;
    Ok(list["leases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            let state = if l.get("held").is_some() || l["state"] == "held" {
                "held"
            } else {
                "active"
            };
            (
                l["ip"].as_str().unwrap_or_default().to_string(),
                l["pod"]["name"].as_str().unwrap_or_default().to_string(),
                state.to_string(),
            )
        })
        .collect())
}

/// Each pod's container restarts, summed over its containers.
fn restarts(pods: &[Pod]) -> std::collections::BTreeMap<String, i32> {
    (pods.iter())
        .map(|p| {
            let statuses = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref());
            let n = statuses
                .into_iter()
                .flatten()
                .map(|c| c.restart_count)
                .sum();
            (p.name_any(), n)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pod_addresses_of;

    #[test]
    fn addresses_of_both_families_from_ip_addr() {
        let text = "2: eth0    inet 10.244.1.5/24 brd 10.244.1.255 scope global eth0\\       valid_lft forever preferred_lft forever\n\
                    2: eth0    inet6 fd00:10:244:1::5/64 scope global \\       valid_lft forever preferred_lft forever\n";
        assert_eq!(pod_addresses_of(text), ["10.244.1.5", "fd00:10:244:1::5"]);
        assert!(pod_addresses_of("").is_empty());
    }
}
