//! The story the demonstration tells, with its expectations:
//!
//! 1. a 3-replica annotated StatefulSet (deploy/examples/statefulset.yaml) starts; ipkeep
//!    records each pod's node and IPs;
//! 2. a pod is deleted → it comes back on the same node with the same IP;
//! 3. a node is lost (on this machine's clusters only: never done to another cluster) → the
//!    rebuilt pod is pinned to the lost node and Pending, `NodeLost` is reported, and after
//!    `node-loss-after` the pin falls back to preferred terms, the stranded pod is replaced and
//!    starts elsewhere with a new IP;
//! 4. scale down → the record of the removed ordinal is pruned, and its held address released
//!    by the node agent;
//! 5. scale up → a new pod, a new record.
//!
//! On real nodes every ipkeep component and one node's kubelet and containerd are restarted
//! before step 2, and the story must still hold. Where the scenario sees the nodes, the end
//! state is audited: every node's store holds exactly its pods' addresses
//! (every family's: on a dual-stack cluster each pod has an IPv4 and an IPv6 address, and a
//! rebuilt pod must get both back), nothing held, no address with two owners.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use ipkeep_api::PersistentPodState;
use ipkeep_values::keys::{NODE_LOSS_AFTER, PINNED_BY};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::deploy_documents;
use crate::objects::{is_ready, metric_sum, node_names};
use crate::report::{Place, Report};

mod target;
pub use target::Target;

/// How long any one thing may take before the scenario gives up.
const PATIENCE: Duration = Duration::from_secs(90);
/// The node-loss grace the demonstration gives its StatefulSet (the default is 5m) on kwok
/// nodes, where the lost node's pod is force-deleted and re-created at once.
const NODE_LOSS_AFTER_KWOK: &str = "15s";
/// The same on real nodes, where the pod of a lost node is re-created only once pod GC has
/// deleted it (up to 20 s after the out-of-service taint: its period); the grace counts from
/// the node loss, so a shorter one would pin the re-created pod by its preferred terms at once
/// and the pinned, Pending phase would not show.
const NODE_LOSS_AFTER_NODES: &str = "30s";
/// The taint that lets pod GC delete the pods of a node that is down for good (value and
/// effect added where used).
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service=nodeshutdown";
/// The image real nodes run the StatefulSet and the probe pod with (scripts/images.py).
const WORKLOAD_IMAGE: &str = "localhost/ipkeep/busybox:dev";

/// How the scenario runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace to create and use.
    pub namespace: String,
    /// The StatefulSet's container image instead of the example's (a cluster that cannot pull
    /// it); on real nodes the scenario uses its own busybox image regardless.
    pub image: Option<String>,
}

struct Run<'a, 'r> {
    target: Target<'a>,
    image: Option<String>,
    client: Client,
    namespace: String,
    sts: String,
    report: &'r mut Report,
}

/// A pod as the scenario sees it.
#[derive(Debug, Clone)]
struct PodSnap {
    uid: String,
    place: Place,
    ready: bool,
    pending_why: Option<String>,
    pinned_by: Option<String>,
    /// Every address of the pod (status.podIPs; the first is `place.ip`).
    ips: Vec<String>,
}

impl PodSnap {
    fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let pending_why = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
            .and_then(|c| c.message.clone());
        Self {
            uid: pod.uid().unwrap_or_default(),
            place: Place {
                node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                ip: status.and_then(|s| s.pod_ip.clone()),
            },
            ready: is_ready(pod) && pod.metadata.deletion_timestamp.is_none(),
            pending_why,
            pinned_by: pod.annotations().get(PINNED_BY).cloned(),
            ips: pod_ips(pod),
        }
    }
}

/// Every address of `pod`: status.podIPs, else status.podIP.
fn pod_ips(pod: &Pod) -> Vec<String> {
    let status = pod.status.as_ref();
    let ips: Vec<String> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|p| p.ip.clone())
        .collect();
    if ips.is_empty() {
        status.and_then(|s| s.pod_ip.clone()).into_iter().collect()
    } else {
        ips
    }
}

/// Whether `ips` has exactly one IPv4 and one IPv6 address.
fn both_families(ips: &[String]) -> bool {
    let v6 = ips.iter().filter(|ip| ip.contains(':')).count();
    ips.len() == 2 && v6 == 1
}

/// Runs the scenario on `target`, narrating to `report`. An `Err` is a step that could not be
/// carried out (a timeout, an API error); failed expectations are in the report.
pub async fn run(target: Target<'_>, options: &Options, report: &mut Report) -> Result<()> {
    let client = target.client();
    let mut run = Run {
        target,
        image: options.image.clone(),
        client,
        namespace: options.namespace.clone(),
        sts: String::new(),
        report,
    };
    run.start().await?;
    if matches!(run.target, Target::Nodes(_)) {
        run.restart_on_nodes().await?;
    }
    run.delete_pod(0).await?;
    if run.target.can_lose_nodes() {
        run.lose_node(2).await?;
    } else {
        run.report.say("(node loss is shown on this machine's clusters only: this never stops a node of another cluster)");
    }
    run.scale_down().await?;
    run.scale_up().await?;
    run.audit().await?;
    Ok(())
}

impl Run<'_, '_> {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn pps_api(&self) -> Api<PersistentPodState> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The node-loss grace this target's StatefulSet gets.
    fn node_loss_after(&self) -> &'static str {
        match self.target {
            Target::Nodes(_) => NODE_LOSS_AFTER_NODES,
            _ => NODE_LOSS_AFTER_KWOK,
        }
    }

    /// How many IP families every pod on the pod network has: 2 on a dual-stack cluster of
    /// this machine's, else 1 (the scenario does not guess another cluster's).
    fn families(&self) -> usize {
        match self.target {
            Target::Nodes(cluster) if cluster.dual_stack() => 2,
            _ => 1,
        }
    }

    fn pod_name(&self, ordinal: i32) -> String {
        format!("{}-{ordinal}", self.sts)
    }

    /// Polls `check` until it returns `Some`, failing after [`PATIENCE`].
    async fn wait<T, F, Fut>(&mut self, what: &str, mut check: F) -> Result<T>
    where
        F: FnMut(Client, String) -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(v) = check(self.client.clone(), self.namespace.clone()).await? {
                return Ok(v);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out after {PATIENCE:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn snap(&self, name: &str) -> Result<Option<PodSnap>> {
        Ok(self.pods().get_opt(name).await?.as_ref().map(PodSnap::of))
    }

    async fn wait_ready(&mut self, name: &str, not_uid: Option<&str>) -> Result<PodSnap> {
        let name = name.to_string();
        let not_uid = not_uid.map(str::to_string);
        let families = self.families();
        self.wait(&format!("pod {name} Ready"), move |client, ns| {
            let (name, not_uid) = (name.clone(), not_uid.clone());
            async move {
                let pod = Api::<Pod>::namespaced(client, &ns).get_opt(&name).await?;
                Ok(pod.map(|p| PodSnap::of(&p)).filter(|s| {
                    s.ready && s.ips.len() >= families && not_uid.as_deref() != Some(s.uid.as_str())
                }))
            }
        })
        .await
    }

    /// The records of the PersistentPodState (pod → (node, IPs)).
    async fn records(&self) -> Result<BTreeMap<String, (String, Vec<String>)>> {
        let Some(pps) = self.pps_api().get_opt(&self.sts).await? else {
            return Ok(BTreeMap::new());
        };
        Ok(pps
            .status
            .unwrap_or_default()
            .pod_states
            .into_iter()
            .map(|(pod, r)| (pod, (r.node_name, r.pod_ips)))
            .collect())
    }

    async fn wait_recorded(&mut self, name: &str, snap: &PodSnap) -> Result<()> {
        let want = (
            snap.place.node.clone().unwrap_or_default(),
            snap.ips.clone(),
        );
        let (sts, name) = (self.sts.clone(), name.to_string());
        self.wait(
            &format!("the record of {name} to say {} {:?}", want.0, want.1),
            |client, ns| {
                let (sts, name, want) = (sts.clone(), name.clone(), want.clone());
                async move {
                    let pps = Api::<PersistentPodState>::namespaced(client, &ns)
                        .get_opt(&sts)
                        .await?;
                    let record = pps
                        .and_then(|p| p.status)
                        .and_then(|s| s.pod_states.get(&name).cloned());
                    Ok(record
                        .filter(|r| {
                            r.node_name == want.0 && want.1.iter().all(|ip| r.pod_ips.contains(ip))
                        })
                        .map(drop))
                }
            },
        )
        .await
    }

    async fn events(&self, reason: &str) -> Result<Vec<String>> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.message)
            .collect())
    }

    /// Step 1: the namespace and the example StatefulSet; every pod Ready and recorded.
    async fn start(&mut self) -> Result<()> {
        self.report.step("start: a 3-replica StatefulSet annotated for ipkeep (deploy/examples/statefulset.yaml)");
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": self.namespace}}))?;
        match Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("create the namespace"),
        }
        let mut sts_doc: Option<Value> = None;
        for doc in deploy_documents("examples/statefulset.yaml")? {
            match doc["kind"].as_str() {
                Some("StatefulSet") => sts_doc = Some(doc),
                Some("Service") => {
                    let svc: Service = serde_json::from_value(doc)?;
                    let api: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
                    // The local API server may not serve Services; the demonstration needs none.
                    let _ = api.create(&PostParams::default(), &svc).await;
                }
                _ => {}
            }
        }
        let mut doc = sts_doc.context("deploy/examples/statefulset.yaml has no StatefulSet")?;
        if self.target.can_lose_nodes() {
            let after = self.node_loss_after();
            doc["metadata"]["annotations"][NODE_LOSS_AFTER] = json!(after);
            self.report.say(&format!(
                "the demonstration sets {NODE_LOSS_AFTER}: {after} on it (default 5m) so node loss resolves quickly"
            ));
        }
        if let (Some(image), false) = (&self.image, matches!(self.target, Target::Nodes(_))) {
            doc["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
            self.report
                .say(&format!("its container runs {image} (--image)"));
        }
        if matches!(self.target, Target::Nodes(_)) {
            let container = &mut doc["spec"]["template"]["spec"]["containers"][0];
            container["image"] = json!(WORKLOAD_IMAGE);
            container["command"] =
                json!(["sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"]);
            self.report.say(&format!(
                "its container runs {WORKLOAD_IMAGE} (sh, ip, ping; the nodes have no registry to pull the example's pause image from)"
            ));
        }
        let sts: StatefulSet = serde_json::from_value(doc)?;
        self.sts = sts.name_any();
        let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        Api::<StatefulSet>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &sts)
            .await
            .context("create the StatefulSet")?;
        self.report.say(&format!(
            "created StatefulSet {}/{} with {replicas} replicas",
            self.namespace, self.sts
        ));
        for ordinal in 0..replicas {
            let name = self.pod_name(ordinal);
            let snap = self.wait_ready(&name, None).await?;
            self.wait_recorded(&name, &snap).await?;
            let (node, ip) = (
                snap.place.node.clone().unwrap_or_default(),
                snap.ips.join(", "),
            );
            self.report.say(&format!(
                "{name} Ready on {node} with {ip}; recorded in PersistentPodState {}",
                self.sts
            ));
            if let Target::Nodes(cluster) = &self.target {
                let inside = cluster.pod_addresses(&self.namespace, &name).await?;
                let mut want = snap.ips.clone();
                want.sort();
                self.report.expect(
                    inside == want,
                    format!(
                        "{name}: status.podIPs {ip} are the addresses inside its network namespace ({})",
                        inside.join(", ")
                    ),
                );
                if self.families() == 2 {
                    self.report.expect(
                        both_families(&snap.ips),
                        format!("{name} has an IPv4 and an IPv6 address ({ip})"),
                    );
                }
            }
            self.report.row(
                "start",
                &name,
                Place::default(),
                snap.place,
                "recorded node, zone and IP",
            );
        }
        Ok(())
    }

    /// Real nodes: every ipkeep component restarted (its pods deleted and replaced), then
    /// crashed (SIGKILL, restarted by the kubelets), then one node's kubelet and containerd
    /// restarted; every pod of the StatefulSet stays Ready where it was, with its IP, and the
    /// steps after this one rebuild pods on the crashed components.
    async fn restart_on_nodes(&mut self) -> Result<()> {
        let Target::Nodes(cluster) = &self.target else {
            return Ok(());
        };
        self.report
            .step("restart every ipkeep component (their pods deleted and replaced)");
        let restarted = cluster.restart_ipkeep().await?;
        self.report.say(&format!(
            "restarted and ready again: {}",
            restarted.join(", ")
        ));
        self.report
            .step("SIGKILL every ipkeep process at once (a crash: no shutdown, no lease released)");
        let killed = cluster.kill_ipkeep().await?;
        self.report.say(&format!(
            "killed {}; the kubelets restarted each, all Ready again",
            killed.join(", ")
        ));
        let name = self.pod_name(1);
        let before = self.snap(&name).await?.context("the pod is missing")?;
        let node = before.place.node.clone().context("the pod is not bound")?;
        self.report.step(&format!(
            "restart {node}'s kubelet and containerd (its pods keep running)"
        ));
        cluster.stop_node(&node).await?;
        self.report
            .say(&format!("stopped kubelet and containerd on {node}"));
        cluster.start_node(&node).await?;
        cluster.wait_ipkeep_ready(&[]).await?;
        self.report.say(&format!(
            "started them again on {node}; its pods passed their readiness probes again"
        ));
        let after = self.wait_ready(&name, None).await?;
        self.report.expect(
            after.uid == before.uid && after.place == before.place,
            format!(
                "{name} kept running on {} with {} (same pod)",
                show(&before.place.node),
                show(&before.place.ip)
            ),
        );
        Ok(())
    }

    /// Step 2: delete a pod; it returns on the same node with the same IP.
    async fn delete_pod(&mut self, ordinal: i32) -> Result<()> {
        let name = self.pod_name(ordinal);
        let promise = if self.target.ipkeep_assigns_ips() {
            "the same node with the same IP"
        } else {
            "the same node (its IP is kwok's here, not ipkeep's)"
        };
        self.report.step(&format!(
            "delete pod {name}: it must come back on {promise}"
        ));
        let before = self.snap(&name).await?.context("the pod is missing")?;
        self.pods().delete(&name, &DeleteParams::default()).await?;
        self.report.say(&format!(
            "deleted {name} (was on {} with {})",
            show(&before.place.node),
            show(&before.place.ip)
        ));
        let after = self.wait_ready(&name, Some(&before.uid)).await?;
        self.report.say(&format!(
            "{name} re-created and Ready on {} with {}",
            show(&after.place.node),
            show(&after.place.ip)
        ));
        let pinned = after.pinned_by.as_deref() == Some(self.sts.as_str());
        self.report.expect(
            pinned,
            format!(
                "admission pinned the new {name} ({PINNED_BY}: {})",
                show(&after.pinned_by)
            ),
        );
        self.report.expect(
            after.place.node == before.place.node,
            format!("{name} is back on {}", show(&before.place.node)),
        );
        if self.target.ipkeep_assigns_ips() {
            self.report.expect(
                after.ips == before.ips,
                if before.ips.len() > 1 {
                    format!("{name} has its IPs {} again", before.ips.join(", "))
                } else {
                    format!("{name} has its IP {} again", show(&before.place.ip))
                },
            );
        } else {
            self.report.say(NO_IP_RETENTION);
        }
        if let (Target::Nodes(cluster), Some(node)) = (&self.target, &after.place.node) {
            let ips: Vec<&str> = after.ips.iter().map(String::as_str).collect();
            let (from, reached) = cluster
                .ping_from_another_node(&self.namespace, node, &ips)
                .await?;
            for (ip, reached) in ips.iter().zip(reached) {
                self.report.expect(
                    reached,
                    format!("{name} at {ip} answers a ping from a pod on {from}"),
                );
            }
        }
        let did = if self.target.ipkeep_assigns_ips() {
            "pinned to its recorded node; the IP was held while it was away and handed back"
        } else {
            "pinned to its recorded node (the IP is kwok's, not ipkeep's)"
        };
        self.report
            .row("delete pod", &name, before.place, after.place, did);
        Ok(())
    }

    /// Step 3 (this machine's clusters only): the node of `ordinal` is lost.
    async fn lose_node(&mut self, ordinal: i32) -> Result<()> {
        let name = self.pod_name(ordinal);
        let before = self.snap(&name).await?.context("the pod is missing")?;
        let node = before.place.node.clone().context("the pod is not bound")?;
        match &mut self.target {
            Target::Kwok(cluster) => {
                self.report.step(&format!(
                    "node {node} is lost (the machine is gone and its Node deleted)"
                ));
                cluster.kubectl(&["delete", "node", &node]).await?;
                // Pod GC would delete it only after its 40 s quarantine for pods of missing
                // nodes; docs/retention.md names force-deleting as the operator's way.
                cluster
                    .kubectl(&[
                        "-n",
                        &self.namespace,
                        "delete",
                        "pod",
                        &name,
                        "--force",
                        "--grace-period=0",
                    ])
                    .await?;
                self.report.say(&format!(
                    "deleted Node {node} and force-deleted {name} (as docs/retention.md tells an operator); the StatefulSet re-creates it"
                ));
            }
            Target::Nodes(cluster) => {
                self.report.step(&format!(
                    "node {node} stops (kubelet and containerd): it is lost"
                ));
                cluster.stop_node(&node).await?;
                cluster.wait_node_ready(&node, false).await?;
                self.report.say(&format!(
                    "{node} is NotReady; as docs/retention.md tells an operator, it gets the taint {OUT_OF_SERVICE}, so pod GC deletes {name} and the StatefulSet re-creates it"
                ));
                cluster
                    .kubectl(&[
                        "taint",
                        "node",
                        &node,
                        &format!("{OUT_OF_SERVICE}:NoExecute"),
                    ])
                    .await?;
            }
            Target::Cluster(_) => bail!("node loss needs the nodes"),
        }
        let old_uid = before.uid.clone();
        let (sts, pod_name) = (self.sts.clone(), name.clone());
        let why = self
            .wait(
                &format!("the re-created {name} to be Pending, pinned to {node}"),
                |client, ns| {
                    let (pod_name, old_uid) = (pod_name.clone(), old_uid.clone());
                    async move {
                        let pod = Api::<Pod>::namespaced(client, &ns)
                            .get_opt(&pod_name)
                            .await?;
                        Ok(pod
                            .map(|p| PodSnap::of(&p))
                            .filter(|s| s.uid != old_uid)
                            .and_then(|s| s.pending_why))
                    }
                },
            )
            .await?;
        self.report.say(&format!(
            "{name} is Pending, pinned to the lost node: {why}"
        ));
        let condition = self
            .wait("the NodeLost condition", |client, ns| {
                let sts = sts.clone();
                async move {
                    let pps = Api::<PersistentPodState>::namespaced(client, &ns)
                        .get_opt(&sts)
                        .await?;
                    Ok(pps.and_then(|p| p.status).and_then(|s| {
                        s.conditions
                            .into_iter()
                            .find(|c| c.type_ == "NodeLost" && c.status == "True")
                    }))
                }
            })
            .await?;
        self.report.say(&format!(
            "PersistentPodState {}: NodeLost=True ({}): {}",
            self.sts, condition.reason, condition.message
        ));
        let after = self.wait_ready(&name, Some(&before.uid)).await?;
        self.report.say(&format!(
            "{name} Ready on {} with {} after the pin fell back to preferred terms",
            show(&after.place.node),
            show(&after.place.ip)
        ));
        let fell_back = self.events("FellBackToPreferred").await?;
        let replaced = self.events("StrandedPodDeleted").await?;
        for e in fell_back.iter().chain(&replaced) {
            self.report.say(&format!("event: {e}"));
        }
        self.report.expect(
            !fell_back.is_empty(),
            "the controller reported FellBackToPreferred",
        );
        self.report.expect(
            !replaced.is_empty(),
            "the controller replaced the stranded Pending pod",
        );
        self.report.expect(
            after.place.node.as_deref().is_some_and(|n| n != node),
            format!("{name} now runs on another node"),
        );
        if self.target.ipkeep_assigns_ips() {
            self.report.expect(
                after.place.ip != before.place.ip,
                format!("{name} has a new IP (node-local IPAM cannot move it)"),
            );
        }
        self.wait_recorded(&name, &after).await?;
        self.report.say(&format!(
            "the record of {name} moved to {}",
            show(&after.place.node)
        ));
        self.report.row(
            "lose node",
            &name,
            before.place,
            after.place,
            format!(
                "NodeLost; after {} fell back to preferred (zone), replaced the stranded pod; new node{}",
                self.node_loss_after(),
                if self.target.ipkeep_assigns_ips() { ", new IP" } else { "" }
            ),
        );
        if let Target::Nodes(cluster) = &self.target {
            self.report.step(&format!(
                "{node} comes back (kubelet and containerd started, taint removed)"
            ));
            cluster
                .kubectl(&[
                    "taint",
                    "node",
                    &node,
                    &format!("{OUT_OF_SERVICE}:NoExecute-"),
                ])
                .await?;
            cluster.start_node(&node).await?;
            cluster.wait_node_ready(&node, true).await?;
            self.report.say(&format!(
                "{node} is Ready; its kubelet removes the pods that were deleted meanwhile, and the agent frees what they held (the records are elsewhere now)"
            ));
        }
        Ok(())
    }

    async fn scale(&self, replicas: i32) -> Result<()> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &self.namespace);
        api.patch(
            &self.sts,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .context("scale the StatefulSet")?;
        Ok(())
    }

    /// Step 4: scale down by one; the record goes and the node releases the held address.
    async fn scale_down(&mut self) -> Result<()> {
        let sts: StatefulSet = Api::namespaced(self.client.clone(), &self.namespace)
            .get(&self.sts)
            .await?;
        let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let name = self.pod_name(replicas - 1);
        let released = if self.target.sees_node_side() {
            " and its address released"
        } else {
            ""
        };
        self.report.step(&format!(
            "scale down to {}: the record of {name} is pruned{released}",
            replicas - 1
        ));
        let before = self.snap(&name).await?.context("the pod is missing")?;
        self.scale(replicas - 1).await?;
        self.report
            .say(&format!("scaled {} to {}", self.sts, replicas - 1));
        let pod_name = name.clone();
        self.wait(&format!("{name} to be gone"), |client, ns| {
            let pod_name = pod_name.clone();
            async move {
                Ok(Api::<Pod>::namespaced(client, &ns)
                    .get_opt(&pod_name)
                    .await?
                    .is_none()
                    .then_some(()))
            }
        })
        .await?;
        let sts_name = self.sts.clone();
        let pod_name = name.clone();
        self.wait(
            &format!("the record of {name} to be pruned"),
            |client, ns| {
                let (sts_name, pod_name) = (sts_name.clone(), pod_name.clone());
                async move {
                    let pps = Api::<PersistentPodState>::namespaced(client, &ns)
                        .get_opt(&sts_name)
                        .await?;
                    Ok(pps
                        .and_then(|p| p.status)
                        .is_some_and(|s| !s.pod_states.contains_key(&pod_name))
                        .then_some(()))
                }
            },
        )
        .await?;
        self.report.say(&format!(
            "PersistentPodState {}: record of {name} pruned (policy WhenScaled)",
            self.sts
        ));
        let mut did = "record pruned".to_string();
        if let (true, Some(node), Some(ip)) = (
            self.target.sees_node_side(),
            &before.place.node,
            &before.place.ip,
        ) {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            let released = loop {
                let leases = self.target.leases(node).await?;
                if !leases.iter().any(|(l, _, _)| l == ip) {
                    break true;
                }
                if tokio::time::Instant::now() > deadline {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let metrics = self.target.agent_metrics(node).await.unwrap_or_default();
            let count = metric_sum(
                &metrics,
                "ipkeep_agent_releases_total",
                &[("reason", "record-pruned")],
            );
            self.report.say(&format!(
                "agent on {node}: ipkeep_agent_releases_total{{reason=\"record-pruned\"}} = {count}"
            ));
            self.report.expect(
                released,
                format!(
                    "the agent on {node} released {ip} (held for {name} until the record went)"
                ),
            );
            did = format!("record pruned; agent on {node} released the held {ip}");
        }
        self.report
            .row("scale down", &name, before.place, Place::default(), did);
        Ok(())
    }

    /// Step 5: scale up by one; a new pod and a new record.
    async fn scale_up(&mut self) -> Result<()> {
        let sts: StatefulSet = Api::namespaced(self.client.clone(), &self.namespace)
            .get(&self.sts)
            .await?;
        let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let name = self.pod_name(replicas);
        self.report.step(&format!(
            "scale up to {}: {name} starts afresh and is recorded",
            replicas + 1
        ));
        self.scale(replicas + 1).await?;
        let after = self.wait_ready(&name, None).await?;
        self.wait_recorded(&name, &after).await?;
        self.report.say(&format!(
            "{name} Ready on {} with {}; recorded",
            show(&after.place.node),
            show(&after.place.ip)
        ));
        self.report.expect(
            after.pinned_by.is_none(),
            format!("the new {name} was not pinned (no record survived the scale-down)"),
        );
        self.report.row(
            "scale up",
            &name,
            Place::default(),
            after.place,
            "no record, so no pin; recorded once Ready",
        );
        Ok(())
    }

    /// The end state: records match the pods, and (where the scenario sees the nodes) every
    /// node's store holds exactly its pods' addresses.
    async fn audit(&mut self) -> Result<()> {
        self.report.step(if self.target.sees_node_side() {
            "audit: records and node stores against the pods"
        } else {
            "audit: records against the pods (node stores need real nodes)"
        });
        let pods = self.pods().list(&ListParams::default()).await?.items;
        let records = self.records().await?;
        for pod in &pods {
            let s = PodSnap::of(pod);
            let want = (s.place.node.clone().unwrap_or_default(), s.ips.clone());
            let name = pod.name_any();
            let got = records.get(&name);
            self.report.expect(
                got.is_some_and(|(n, ips)| {
                    *n == want.0 && want.1.iter().all(|ip| ips.contains(ip))
                }),
                format!(
                    "the record of {name} matches it ({} {})",
                    want.0,
                    want.1.join(",")
                ),
            );
        }
        self.report.expect(
            records.len() == pods.len(),
            format!("{} records for {} pods", records.len(), pods.len()),
        );
        if !self.target.sees_node_side() {
            return Ok(());
        }
        // Every pod on the pod network has its addresses (each family's) in its node's store,
        // ipkeep's own included (on real nodes they run there too); host-network pods have none.
        let mut by_node: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut one_family = Vec::new();
        for pod in Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items
        {
            if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
                continue;
            }
            let s = PodSnap::of(&pod);
            let who = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            if let Some(n) = s.place.node {
                if self.families() == 2 && !both_families(&s.ips) {
                    one_family.push(format!("{who} {:?}", s.ips));
                }
                for ip in s.ips {
                    owners.entry(ip.clone()).or_default().push(who.clone());
                    by_node.entry(n.clone()).or_default().insert(ip);
                }
            }
        }
        let shared: Vec<String> = owners
            .iter()
            .filter(|(_, pods)| pods.len() > 1)
            .map(|(ip, pods)| format!("{ip}: {}", pods.join(", ")))
            .collect();
        self.report.expect(
            shared.is_empty(),
            format!(
                "no address belongs to two pods ({} addresses){}",
                owners.len(),
                if shared.is_empty() {
                    String::new()
                } else {
                    format!(": {}", shared.join("; "))
                }
            ),
        );
        if self.families() == 2 {
            self.report.expect(
                one_family.is_empty(),
                format!(
                    "every pod on the pod network has an IPv4 and an IPv6 address{}",
                    if one_family.is_empty() {
                        String::new()
                    } else {
                        format!(" (not: {})", one_family.join("; "))
                    }
                ),
            );
        }
        let live_nodes = node_names(&self.client).await?;
        // A node that just came back may still be freeing what its deleted pods held: give the
        // stores the same patience as everything else before judging them.
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let findings = loop {
            let mut findings = Vec::new();
            for node in &live_nodes {
                let leases = self.target.leases(node).await?;
                let active: BTreeSet<String> = leases
                    .iter()
                    .filter(|l| l.2 == "active")
                    .map(|l| l.0.clone())
                    .collect();
                let held: Vec<String> = leases
                    .iter()
                    .filter(|l| l.2 == "held")
                    .map(|l| format!("{} ({})", l.0, l.1))
                    .collect();
                let want = by_node.get(node).cloned().unwrap_or_default();
                findings.push((
                    active == want && held.is_empty(),
                    format!(
                        "{node}: store has active {active:?} held {held:?}; pods there have {want:?}"
                    ),
                ));
                // The story restarts the agents (the DaemonSet's pods are replaced): a plugin
                // command while the agent is away opens the store itself, with the same answer.
                let fallbacks = self.target.fallbacks(node).await;
                findings.push((
                    true,
                    format!("{node}: {fallbacks} plugin command(s) ran without the agent while it restarted"),
                ));
            }
            if findings.iter().all(|f| f.0) || tokio::time::Instant::now() > deadline {
                break findings;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        for (ok, text) in findings {
            self.report.expect(ok, text);
        }
        Ok(())
    }
}

/// What the story says where it cannot show IP retention.
const NO_IP_RETENTION: &str = "(kwok nodes run no CNI plugin: kwok gives pods addresses of its own, so a rebuilt pod keeping its IP is not shown here; that needs real nodes, and root)";

fn show(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}
