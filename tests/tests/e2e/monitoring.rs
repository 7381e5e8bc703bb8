//! A real Prometheus sees the real-node cluster as shipped (issue 41): the server built from the
//! Prometheus module (`scripts/promtool-build.sh --server`), running on the host, finds ipkeep's
//! pods through the scrape job of docs/metrics.md (Kubernetes service discovery, with the
//! cluster's kubeconfig since it runs outside) and evaluates the rules of
//! deploy/monitoring/prometheus-rule.yaml. Then:
//!
//! - every target is up: both ipkeep-controller and ipkeep-scheduler-ext replicas on the pod
//!   network, and each node's ipkeep-agent on the node's IP (`agent.metrics.nodeIP`);
//! - on the healthy cluster no alert fires;
//! - the agent of one node killed again and again (CrashLoopBackOff), while a pod starts
//!   there: `IpkeepComponentDown`, then, with the agent back, `IpkeepPluginFallbacks`;
//! - that node's store filled, the range with no address left (ADDs of pods nobody runs, until
//!   one fails): `IpkeepRangeNearlyExhausted` and `IpkeepAddErrors`;
//! - every series the alerts and the dashboard name had data while it ran (but the pin counters
//!   of scheduler-ext where nothing asks it for pins: the admission policy pins and
//!   kube-scheduler has no extender).
//!
//! The rules' `for:` are cut to 10 s here (the expressions are the shipped ones; waiting out
//! 15 minutes would only test Prometheus's clock).

use std::path::Path;
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::{Admission, admission_of, extender_of, repo_root, wait_until};
use ipkeep_tests::prometheus::{Prometheus, named_metrics};
use serde_json::{Value, json};

use super::retention::{NS, Real, sleeper_pod};

const NODE: &str = "node-1";

/// The scrape job of docs/metrics.md (the YAML block with `job_name: ipkeep`), pointed at this
/// cluster from outside it: `kubeconfig_file` added to its service discovery.
fn shipped_job(kubeconfig: &Path) -> Value {
    let text = std::fs::read_to_string(repo_root().join("docs/metrics.md")).expect("metrics.md");
    let block = text
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split_once("```").map(|(yaml, _)| yaml))
        .find(|yaml| yaml.contains("job_name: ipkeep"))
        .expect("docs/metrics.md has the scrape job");
    let jobs: Vec<Value> = serde_saphyr::from_str(block).expect("the scrape job is YAML");
    let mut job = jobs.into_iter().next().expect("one job");
    for sd in job["kubernetes_sd_configs"]
        .as_array_mut()
        .expect("kubernetes_sd_configs")
    {
        sd["kubeconfig_file"] = json!(kubeconfig);
    }
    job
}

/// The count of commands the plugin on `node` ran without the agent (the file it keeps in the
/// network's directory; 0 before the first).
fn fallback_count(real: &Real, node: &str) -> u64 {
    let ipkeep = real.layout.ipkeep();
    let list = [ipkeep.as_str(), "list", "--json", "--network", real.network];
    let list: Value = serde_json::from_str(&real.on_node(node, &list)).expect("ipkeep list");
    let data_dir = list["dataDir"].as_str().expect("dataDir");
    let file = format!("{data_dir}/{}/fallbacks", real.network);
    let text = real.on_node(
        node,
        &["sh", "-c", &format!("cat {file} 2>/dev/null || true")],
    );
    text.trim().parse().unwrap_or(0)
}

/// The pid of the ipkeep-agent whose `/metrics` listens on `ip` (its `--metrics-listen`), if it
/// runs.
fn agent_pid(ip: &str) -> Option<i32> {
    let wanted = format!("--metrics-listen={ip}:");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_agent = args.first()?.ends_with(b"ipkeep-agent");
        let here = args.iter().any(|a| a.starts_with(wanted.as_bytes()));
        (is_agent && here).then_some(pid)
    })
}

pub fn prometheus_sees_the_cluster(state: &Path) {
    let real = Real::new(state);
    let kubectl = &real.kubectl;
    let t_step = Instant::now();
    let prometheus = Prometheus::start(json!([shipped_job(&state.join("admin.kubeconfig"))]));

    kubectl.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"
    ));

    // Every component is a target, and up: 2 + 2 pods and an agent per node.
    let nodes = kubectl
        .get(&["nodes", "-l", "ipkeep.dev/test-node=real"])
        .expect("nodes");
    let node_ips: Vec<(String, String)> = (nodes["items"].as_array().into_iter().flatten())
        .map(|n| {
            let ip = (n["status"]["addresses"].as_array().into_iter().flatten())
                .find(|a| a["type"] == "InternalIP")
                .and_then(|a| a["address"].as_str())
                .unwrap_or_default();
            (
                n["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                ip.to_string(),
            )
        })
        .collect();
    let want = [
        ("ipkeep-controller", 2),
        ("ipkeep-scheduler-ext", 2),
        ("ipkeep-agent", node_ips.len()),
    ];
    let targets = wait_until(
        "every ipkeep target up in Prometheus",
        Duration::from_secs(120),
        || {
            let t = prometheus.targets();
            want.iter()
                .all(|(c, n)| t.iter().filter(|(tc, _, h)| tc == c && h == "up").count() == *n)
                .then_some(t)
        },
    );
    for (name, ip) in &node_ips {
        assert!(
            targets
                .iter()
                .any(|(c, i, _)| c == "ipkeep-agent" && i.starts_with(ip.as_str())),
            "the agent of {name} is not scraped on its node IP {ip}: {targets:?}"
        );
    }
    eprintln!(
        "prometheus: {} targets up through docs/metrics.md's scrape job: {targets:?}",
        targets.len()
    );

    // Addresses held (the held-address series): a pod scaled away whose PersistentPodState
    // keeps its record (WhenDeleted).
    kubectl.apply(&held_statefulset());
    wait_until(
        "both pods of held running",
        Duration::from_secs(180),
        || {
            let pods = kubectl.get(&["pods", "-n", NS, "-l", "app=held"])?;
            let running = (pods["items"].as_array().into_iter().flatten())
                .filter(|p| p["status"]["phase"] == "Running")
                .count();
            (running == 2).then_some(())
        },
    );
    kubectl.run(&["scale", "statefulset", "-n", NS, "held", "--replicas=1"]);
    wait_until(
        "the held addresses in Prometheus",
        Duration::from_secs(120),
        || {
            (!prometheus
                .query(&format!(
                    "ipkeep_agent_held_addresses{{namespace=\"{NS}\",statefulset=\"held\"}} > 0"
                ))
                .is_empty())
            .then_some(())
        },
    );

    // Healthy: several evaluations (and every cut `for:` over), no alert.
    std::thread::sleep(Duration::from_secs(40));
    let firing = prometheus.firing();
    assert!(firing.is_empty(), "alerts on a healthy cluster: {firing:?}");

    // The agent of NODE killed, again and again: its target goes down, and a pod started
    // there meanwhile goes through the plugin alone.
    let ip = node_ips
        .iter()
        .find(|(n, _)| n == NODE)
        .map(|(_, ip)| ip.clone())
        .expect("the node's IP");
    let killing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let kills = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killer = {
        let (killing, kills) = (killing.clone(), kills.clone());
        let ip = ip.clone();
        std::thread::spawn(move || {
            while killing.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(pid) = agent_pid(&ip) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    kills.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let down = prometheus.wait_firing(
        "IpkeepComponentDown",
        &[("component", "ipkeep-agent"), ("severity", "warning")],
        120,
    );
    // A pod started meanwhile: its ADD finds no agent, unless the kubelet restarted the agent
    // (after its back-off) in the instant before the ADD and before the next kill (seen once:
    // the agent served the ADD 100 ms after its start). The plugin's count says which: another
    // pod when the agent answered.
    let fallbacks_before = fallback_count(&real, NODE);
    let mut fallback_pod = None;
    for attempt in 0..4 {
        let name = format!("monitoring-fallback-{attempt}");
        kubectl.apply(&sleeper_pod(&name, NODE));
        wait_until(
            &format!("{name} on the node without its agent running"),
            Duration::from_secs(120),
            || {
                let p = kubectl.get(&["pod", "-n", NS, &name])?;
                (p["status"]["phase"] == "Running").then_some(())
            },
        );
        if fallback_count(&real, NODE) > fallbacks_before {
            fallback_pod = Some(name);
            break;
        }
        eprintln!("prometheus: the agent, just restarted, served {name}'s ADD; another pod");
        kubectl.run(&["delete", "pod", "-n", NS, &name, "--wait=false"]);
    }
    let fallback_pod = fallback_pod.expect("a pod started through the plugin alone in 4 tries");
    killing.store(false, std::sync::atomic::Ordering::Relaxed);
    killer.join().expect("the killer");
    let kills = kills.load(std::sync::atomic::Ordering::Relaxed);
    // After several kills the kubelet's crash-loop back-off keeps the container down for
    // minutes (it doubles up to 5 min): a new pod of the DaemonSet starts at once. The alert
    // needs the agent back, since the agent reports the count the plugin wrote.
    kubectl.run(&[
        "delete",
        "pod",
        "-n",
        "ipkeep-system",
        "-l",
        "app.kubernetes.io/name=ipkeep-agent",
        "--field-selector",
        &format!("spec.nodeName={NODE}"),
        "--wait=false",
    ]);
    let fallbacks =
        prometheus.wait_firing("IpkeepPluginFallbacks", &[("severity", "warning")], 180);
    eprintln!(
        "prometheus: {NODE}'s agent killed {kills} times: IpkeepComponentDown after {:.0} s, IpkeepPluginFallbacks {:.0} s after it was let be",
        down.as_secs_f64(),
        fallbacks.as_secs_f64()
    );
    wait_until("the agent back up", Duration::from_secs(180), || {
        let t = prometheus.targets();
        t.iter()
            .any(|(c, i, h)| c == "ipkeep-agent" && i.starts_with(ip.as_str()) && h == "up")
            .then_some(())
    });

    // NODE's store filled: ADDs of pods nobody runs (in a sandbox's network namespace that
    // exists, so no sweep takes them for missed DELs) until the range has no address left.
    kubectl.run(&["delete", "pod", "-n", NS, &fallback_pod]);
    let failed_at = fill_the_range(&real, NODE);
    let exhausted = prometheus.wait_firing(
        "IpkeepRangeNearlyExhausted",
        &[("severity", "warning"), ("network", real.network)],
        120,
    );
    let add_errors = prometheus.wait_firing("IpkeepAddErrors", &[("severity", "critical")], 120);
    eprintln!(
        "prometheus: {NODE}'s range filled (ADD {failed_at} failed): IpkeepRangeNearlyExhausted after {:.0} s, IpkeepAddErrors after {:.0} s more",
        exhausted.as_secs_f64(),
        add_errors.as_secs_f64()
    );
    empty_the_range(&real, NODE, failed_at);

    // Every series an alert or a panel names had data at some point of the run. Where the
    // admission policy pins and kube-scheduler has no extender, nothing asks scheduler-ext for
    // a pin, so its pin counters have no series (docs/metrics.md says so).
    let unasked = !extender_of(state) && admission_of(state) == Admission::Policy;
    let pin_counters = [
        "ipkeep_scheduler_ext_pins_applied_total",
        "ipkeep_scheduler_ext_pins_skipped_total",
    ];
    let lasted = (t_step.elapsed().as_secs() + 60).to_string();
    let missing: Vec<String> = named_metrics()
        .into_iter()
        .filter(|name| !(unasked && pin_counters.contains(&name.as_str())))
        .filter(|name| {
            prometheus
                .query(&format!(
                    "count(count_over_time({{__name__=\"{name}\"}}[{lasted}s]))"
                ))
                .is_empty()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "no data in Prometheus for {missing:?} (named by the alerts or the dashboard)"
    );
    // The held address goes with its PersistentPodState.
    kubectl.run(&["delete", "statefulset", "-n", NS, "held"]);
    kubectl.run(&["delete", "persistentpodstates.ipkeep.dev", "-n", NS, "held"]);
    eprintln!(
        "prometheus: every series the alerts and the dashboard name had data; the step took {:.0} s",
        t_step.elapsed().as_secs_f64()
    );
}

/// The ADD (or DEL) of pod `fill-N` of the namespace `monitoring-fill`, N from 1 to `last`,
/// on `node`, as a runtime calls the plugin, in the first sandbox network namespace there; the
/// shell prints the N of the first ADD that fails.
fn fill_script(real: &Real, command: &str, last: usize, netns: &str) -> String {
    let bin = &real.layout.cni_bin_dir;
    format!(
        "i=0; while [ $i -lt {last} ]; do i=$((i+1)); \
         CNI_COMMAND={command} CNI_CONTAINERID=monitoring-fill-$i CNI_NETNS={netns} \
         CNI_IFNAME=eth0 CNI_PATH={bin} \
         CNI_ARGS=\"K8S_POD_NAMESPACE=monitoring-fill;K8S_POD_NAME=fill-$i\" \
         {bin}/ipkeep </var/log/monitoring-fill.conf >/dev/null 2>&1 || {{ echo $i; exit 0; }}; \
         done; echo none"
    )
}

/// The node's network configuration as the bridge plugin hands it to ipkeep, written where the
/// node reads it as /var/log/monitoring-fill.conf; and a sandbox's network namespace there.
fn fill_setup(real: &Real, node: &str) -> String {
    let root = real.state.join("nodes").join(node).join("root");
    let list: Value = serde_json::from_str(
        &std::fs::read_to_string(
            root.join(real.layout.cni_conf_dir.trim_start_matches('/'))
                .join("10-ipkeep.conflist"),
        )
        .expect("the node's conflist"),
    )
    .expect("JSON");
    let mut conf = list["plugins"][0].clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    std::fs::write(root.join("var/log/monitoring-fill.conf"), conf.to_string())
        .expect("write the configuration");
    let netns = real.on_node(node, &["sh", "-c", "ls /var/run/netns | head -1"]);
    let netns = netns.trim();
    assert!(!netns.is_empty(), "no sandbox on {node}");
    format!("/var/run/netns/{netns}")
}

/// Fills `node`'s range (see [`fill_script`]); the N of the ADD that failed.
fn fill_the_range(real: &Real, node: &str) -> usize {
    let netns = fill_setup(real, node);
    let out = real.on_node(node, &["sh", "-c", &fill_script(real, "ADD", 600, &netns)]);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("600 ADDs on {node} and none failed: {out}"))
}

/// DELs of what [`fill_the_range`] added.
fn empty_the_range(real: &Real, node: &str, last: usize) {
    let netns = fill_setup(real, node);
    let out = real.on_node(node, &["sh", "-c", &fill_script(real, "DEL", last, &netns)]);
    assert_eq!(out.trim(), "none", "a DEL failed on {node}");
}

/// A StatefulSet `held` of two sleepers in [`NS`] and its PersistentPodState, which keeps the
/// records of pods scaled away (`WhenDeleted`) and their addresses held for an hour.
fn held_statefulset() -> String {
    format!(
        r#"apiVersion: ipkeep.dev/v1alpha1
kind: PersistentPodState
metadata:
  name: held
  namespace: {NS}
spec:
  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: held}}
  requiredPersistentTopology: {{nodeTopologyKeys: [kubernetes.io/hostname]}}
  persistentPodStateRetentionPolicy: WhenDeleted
  ipRetention: 1h
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: held
  namespace: {NS}
spec:
  replicas: 2
  podManagementPolicy: Parallel
  selector: {{matchLabels: {{app: held}}}}
  serviceName: held
  template:
    metadata: {{labels: {{app: held}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: sleep
          image: localhost/ipkeep/busybox:dev
          imagePullPolicy: Never
          command: ["sleep", "1000000"]
"#
    )
}
