//! With the admission policy (Kubernetes 1.36 and later), pod creation needs nothing of ipkeep's
//! running: with both ipkeep Deployments (controller and scheduler-ext) scaled to zero, a
//! StatefulSet pod rebuilt on the real nodes is created, pinned to its recorded node by
//! kube-apiserver itself, scheduled there (kube-scheduler's extender is down and ignorable) and
//! running with its IP again (the agent DaemonSet and the plugin hold it). The rebuild's time is
//! printed beside one with the Deployments running, from the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::{Admission, admission_of, wait_until};
use ipkeep_tests::kubectl::Kubectl;

const NS: &str = "standalone";
const DEPLOYMENTS: [&str; 2] = ["ipkeep-controller", "ipkeep-scheduler-ext"];

/// Pod `name` once it runs: (uid, node, IP).
fn running(kubectl: &Kubectl, name: &str, not_uid: &str) -> (String, String, String) {
    let p = super::running_pod(kubectl, NS, name, not_uid);
    let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    (
        field(&p["metadata"]["uid"]),
        field(&p["spec"]["nodeName"]),
        field(&p["status"]["podIP"]),
    )
}

/// Deletes pod `name` and waits for its replacement to run: the replacement, and the time
/// from the deletion to its running.
fn rebuild(kubectl: &Kubectl, name: &str, uid: &str) -> ((String, String, String), Duration) {
    let t = Instant::now();
    kubectl.run(&["delete", "pod", "-n", NS, name, "--wait=false"]);
    let got = running(kubectl, name, uid);
    (got, t.elapsed())
}

fn scale(kubectl: &Kubectl, replicas: u32) {
    for d in DEPLOYMENTS {
        kubectl.run(&[
            "-n",
            "ipkeep-system",
            "scale",
            "deployment",
            d,
            &format!("--replicas={replicas}"),
        ]);
    }
}

fn ipkeep_pods(kubectl: &Kubectl, ready: bool) -> usize {
    let pods = kubectl
        .get(&[
            "pods",
            "-n",
            "ipkeep-system",
            "-l",
            "app.kubernetes.io/component in (controller,scheduler-extension)",
        ])
        .unwrap_or_default();
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            !ready
                || p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .count()
}

pub fn pods_need_no_ipkeep_deployment(state: &Path) {
    if admission_of(state) != Admission::Policy {
        eprintln!(
            "admission: this cluster pins through the webhook; the step is for the admission policy"
        );
        return;
    }
    let bin = std::fs::read_to_string(state.join("bin")).unwrap();
    let kubectl = Kubectl::new(
        &Path::new(bin.trim()).join("kubectl"),
        &state.join("admin.kubeconfig"),
    );
    let before = ipkeep_pods(&kubectl, true);
    assert!(
        before >= 4,
        "admission: {before} ipkeep controller/scheduler-ext pods Ready at the start"
    );
    kubectl.run(&["create", "namespace", NS]);
    kubectl.apply(&super::pinned_statefulset(NS, "db"));
    let mut pods: Vec<(String, String, String)> = ["db-0", "db-1"]
        .iter()
        .map(|n| running(&kubectl, n, ""))
        .collect();
    wait_until(
        "both pods recorded and planned for admission",
        Duration::from_secs(60),
        || {
            let pps = kubectl.get(&["persistentpodstates.ipkeep.dev", "-n", NS, "db"])?;
            let plan = kubectl.get(&["configmap", "-n", NS, "ipkeep-admission-plan"])?;
            let planned = ["db-0", "db-1"]
                .iter()
                .all(|p| plan["data"][format!("pod.{p}")].is_string());
            (pps["status"]["recordedPods"] == 2 && planned).then_some(())
        },
    );

    // The baseline: ipkeep running.
    let (got, with_ipkeep) = rebuild(&kubectl, "db-0", &pods[0].0);
    assert_eq!(
        (&got.1, &got.2),
        (&pods[0].1, &pods[0].2),
        "db-0 came back elsewhere"
    );
    pods[0] = got;

    scale(&kubectl, 0);
    wait_until(
        "no ipkeep controller or scheduler-ext pod left",
        Duration::from_secs(90),
        || (ipkeep_pods(&kubectl, false) == 0).then_some(()),
    );
    let mut without = Vec::new();
    for (i, name) in ["db-1", "db-0"].iter().enumerate() {
        let which = if i == 0 { 1 } else { 0 };
        let ((uid, node, ip), took) = rebuild(&kubectl, name, &pods[which].0);
        assert_eq!(
            (&node, &ip),
            (&pods[which].1, &pods[which].2),
            "admission: with ipkeep's Deployments stopped, {name} came back elsewhere"
        );
        let pod = kubectl.get(&["pod", "-n", NS, name]).unwrap();
        assert_eq!(
            pod["spec"]["nodeSelector"]["kubernetes.io/hostname"],
            node.as_str(),
            "admission: {name} was not pinned by the policy: {}",
            pod["spec"]
        );
        assert_eq!(pod["metadata"]["annotations"]["ipkeep.dev/pinned-by"], "db");
        pods[which] = (uid, node, ip);
        without.push(took);
    }
    eprintln!(
        "admission: rebuild to running with ipkeep's Deployments running {with_ipkeep:?}; with both scaled to zero {without:?} (pinned by kube-apiserver, same node and IP)"
    );

    scale(&kubectl, 2);
    wait_until(
        "ipkeep's controller and scheduler-ext pods Ready again",
        Duration::from_secs(180),
        || (ipkeep_pods(&kubectl, true) >= before).then_some(()),
    );
    kubectl.run(&["delete", "namespace", NS, "--wait=false"]);
}
