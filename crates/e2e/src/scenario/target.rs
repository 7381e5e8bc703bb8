//! Where the scenario runs, and what it can do there beyond the API: the local simulated
//! system, a real cluster with real nodes on this machine, or any cluster through its API only.

use anyhow::Result;
use kube::Client;

use crate::nodes::RealCluster;
use crate::procs::Stop;
use crate::system::LocalSystem;

/// Where the scenario runs.
pub enum Target<'a> {
    /// The local simulated system: simulators, node-level checks, node deletion.
    Local(&'a mut LocalSystem),
    /// A cluster with real nodes on this machine (`scripts/cluster.sh`): node-level checks
    /// through the nodes, node stop and start, ipkeep's pods restarted.
    Nodes(&'a RealCluster),
    /// A real cluster with ipkeep installed: API-level checks only; no node is touched.
    Cluster(Client),
}

impl std::fmt::Debug for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Target::Local(_) => "Local",
            Target::Nodes(_) => "Nodes",
            Target::Cluster(_) => "Cluster",
        })
    }
}

impl Target<'_> {
    /// An admin client.
    pub fn client(&self) -> Client {
        match self {
            Target::Local(system) => system.client(),
            Target::Nodes(cluster) => cluster.client(),
            Target::Cluster(client) => client.clone(),
        }
    }

    /// Whether the scenario can look into nodes (stores, agents) and stop them.
    pub fn has_nodes(&self) -> bool {
        !matches!(self, Target::Cluster(_))
    }

    /// An error if a local component has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self {
            Target::Local(system) => system.check_running(),
            _ => Ok(()),
        }
    }

    /// The node store's leases: (IP, pod name, "active" | "held").
    pub async fn leases(&self, node: &str) -> Result<Vec<(String, String, String)>> {
        match self {
            Target::Local(system) => system.leases(node).await,
            Target::Nodes(cluster) => cluster.leases(node).await,
            Target::Cluster(_) => Ok(Vec::new()),
        }
    }

    /// The node agent's metrics, if they can be read.
    pub async fn agent_metrics(&self, node: &str) -> Option<String> {
        match self {
            Target::Local(system) => system.agent_metrics(node).await,
            Target::Nodes(cluster) => cluster.agent_metrics(node).await.ok(),
            Target::Cluster(_) => None,
        }
    }

    /// How many plugin commands on the node did not go through its agent.
    pub async fn fallbacks(&self, node: &str) -> u64 {
        match self {
            Target::Local(system) => system.fallbacks(node),
            Target::Nodes(cluster) => cluster.fallbacks(node).await,
            Target::Cluster(_) => 0,
        }
    }

    /// Restarts every ipkeep component (locally by signal `how`; on real nodes by deleting
    /// their pods, which their Deployments and DaemonSet replace); what was restarted.
    pub async fn restart_ipkeep(&mut self, how: Stop) -> Result<Vec<String>> {
        match self {
            Target::Local(system) => system.restart_all(how).await,
            Target::Nodes(cluster) => cluster.restart_ipkeep().await,
            Target::Cluster(_) => Ok(Vec::new()),
        }
    }
}
