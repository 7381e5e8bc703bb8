//! Where the scenario runs, and what it can do there beyond the API: a real cluster with real
//! nodes on this machine, the same control plane with kwok nodes only, or any cluster through
//! its API only.

use anyhow::Result;
use kube::Client;

use crate::nodes::RealCluster;

/// Where the scenario runs.
pub enum Target<'a> {
    /// A cluster with real nodes on this machine (`scripts/cluster.sh`): node-level checks
    /// through the nodes, node stop and start, ipkeep's pods restarted.
    Nodes(&'a RealCluster),
    /// The control plane on this machine with kwok nodes only (`scripts/cluster.sh --nodes 0
    /// --kwok-nodes N`): pins, records and node loss (a kwok Node deleted); the pods run
    /// nowhere, and kwok gives them addresses of its own, so the node side (IP retention,
    /// stores, agents) is not there to check.
    Kwok(&'a RealCluster),
    /// A real cluster with ipkeep installed: API-level checks only; no node is touched.
    Cluster(Client),
}

impl std::fmt::Debug for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Target::Nodes(_) => "Nodes",
            Target::Kwok(_) => "Kwok",
            Target::Cluster(_) => "Cluster",
        })
    }
}

impl Target<'_> {
    /// An admin client.
    pub fn client(&self) -> Client {
        match self {
            Target::Nodes(cluster) | Target::Kwok(cluster) => cluster.client(),
            Target::Cluster(client) => client.clone(),
        }
    }

    /// Whether the scenario can look into the nodes (stores, agents, pods' network namespaces).
    pub fn sees_node_side(&self) -> bool {
        matches!(self, Target::Nodes(_))
    }

    /// Whether the scenario may take a node away (this machine's clusters only).
    pub fn can_lose_nodes(&self) -> bool {
        !matches!(self, Target::Cluster(_))
    }

    /// Whether ipkeep's CNI plugin gives the pods their addresses (not on kwok nodes, where kwok
    /// makes them up), so that a rebuilt pod must get its address back.
    pub fn ipkeep_assigns_ips(&self) -> bool {
        !matches!(self, Target::Kwok(_))
    }

    /// The node store's leases: (IP, pod name, "active" | "held").
    pub async fn leases(&self, node: &str) -> Result<Vec<(String, String, String)>> {
        match self {
            Target::Nodes(cluster) => cluster.leases(node).await,
            _ => Ok(Vec::new()),
        }
    }

    /// The node agent's metrics, if they can be read.
    pub async fn agent_metrics(&self, node: &str) -> Option<String> {
        match self {
            Target::Nodes(cluster) => cluster.agent_metrics(node).await.ok(),
            _ => None,
        }
    }

    /// How many plugin commands on the node did not go through its agent.
    pub async fn fallbacks(&self, node: &str) -> u64 {
        match self {
            Target::Nodes(cluster) => cluster.fallbacks(node).await,
            _ => 0,
        }
    }
}
