//! The chart's values, rendered: `helm template` of `charts/ipkeep` with the values a test sets
//! (the helm of `scripts/helm-build.sh`, or `$IPKEEP_HELM`), so every value is tested where it
//! lands, and every value the schema or a template refuses is refused with the key named.
//! deploy/ (the default values) is what the other modules test.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::manifests::repo_root;

/// The helm binary, or `None` (said once) when there is none to build it with.
fn helm() -> Option<&'static PathBuf> {
    ipkeep_tests::helm::binary("the chart's template tests (helm)")
}

/// `helm template` of the chart into `ipkeep-system` with `args` (`--set`, `-f`, ...): its
/// documents, or the error helm printed; `None` without helm.
pub fn try_render(args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    let helm = helm()?;
    let out = Command::new(helm)
        .args(["template", "ipkeep"])
        .arg(repo_root().join("charts/ipkeep"))
        .args(["--namespace", "ipkeep-system"])
        .args(args)
        .output()
        .expect("run helm");
    if !out.status.success() {
        return Some(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("helm template {args:?} is not YAML: {e}"));
    Some(Ok(docs.into_iter().filter(|d| !d.is_null()).collect()))
}

/// The rendering with `sets` (`--set` each); `None` without helm.
pub fn render(sets: &[&str]) -> Option<Rendered> {
    let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s]).collect();
    let docs = try_render(&args)?.unwrap_or_else(|e| panic!("helm template {sets:?}: {e}"));
    Some(Rendered(docs))
}

/// helm's error for `sets`, which must be refused; `None` without helm.
pub fn refused(sets: &[&str]) -> Option<String> {
    let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s]).collect();
    match try_render(&args)? {
        Ok(_) => panic!("the chart accepts {sets:?}"),
        Err(e) => Some(e),
    }
}

/// A rendering's documents.
#[derive(Debug)]
pub struct Rendered(pub Vec<Value>);

impl Rendered {
    /// The documents of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &str) -> impl Iterator<Item = &'a Value> + 'a {
        let kind = kind.to_string();
        self.0.iter().filter(move |d| d["kind"] == kind.as_str())
    }

    /// The document of `kind` named `name`, if rendered.
    pub fn get(&self, kind: &str, name: &str) -> Option<&Value> {
        self.of_kind(kind).find(|d| d["metadata"]["name"] == name)
    }

    /// The document of `kind` named `name` (panics when not rendered).
    pub fn find(&self, kind: &str, name: &str) -> &Value {
        self.get(kind, name)
            .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
    }
}

/// The arguments of the first container of a pod template (`/spec/template/spec/containers/0`).
pub fn args(workload: &Value) -> Vec<String> {
    workload
        .pointer("/spec/template/spec/containers/0/args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(String::from))
        .collect()
}

#[test]
fn scheduler_ext_mounts_the_client_ca_only_when_given_and_only_its_certificate() {
    let Some(plain) = render(&[]) else { return };
    let with = render(&["schedulerExt.clientCA.secretName=webhook-clients"]).expect("helm");
    let plain_args = args(plain.find("Deployment", "ipkeep-scheduler-ext"));
    assert!(!plain_args.iter().any(|a| a.starts_with("--client-ca")));
    let d = with.find("Deployment", "ipkeep-scheduler-ext");
    assert!(args(d).contains(&"--client-ca=/client-ca/ca.crt".to_string()));
    let volumes = d
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .expect("volumes");
    let ca = volumes
        .iter()
        .find(|v| v["name"] == "client-ca")
        .expect("the client-ca volume");
    assert_eq!(ca["secret"]["secretName"], "webhook-clients");
    assert_eq!(
        ca["secret"]["items"],
        serde_json::json!([{"key": "ca.crt", "path": "ca.crt"}])
    );
    let mounts = d
        .pointer("/spec/template/spec/containers/0/volumeMounts")
        .and_then(Value::as_array)
        .expect("mounts");
    assert!(
        mounts
            .iter()
            .any(|m| m["name"] == "client-ca" && m["mountPath"] == "/client-ca")
    );
    let message = refused(&["schedulerExt.clientCA.secretName=Not_A_Name"]).expect("helm");
    assert!(
        message.contains("/schedulerExt/clientCA/secretName"),
        "{message}"
    );
}

/// The pod spec of a workload's template.
pub fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

const WORKLOADS: [(&str, &str, &str); 3] = [
    ("Deployment", "ipkeep-controller", "controller"),
    ("Deployment", "ipkeep-scheduler-ext", "schedulerExt"),
    ("DaemonSet", "ipkeep-agent", "agent"),
];

/// Issue 41 (gap 10): every object carries the standard labels and commonLabels, every pod its
/// component's podLabels and podAnnotations too; selectors stay `app.kubernetes.io/name` alone
/// (changing one breaks upgrades); `global` is accepted (ipkeep as a subchart).
#[test]
fn every_object_carries_the_standard_and_common_labels() {
    let mut sets = vec![
        "commonLabels.example\\.com/team=databases",
        "global.imageRegistry=registry.example.com",
        "monitoring.enabled=true",
        "monitoring.podMonitors.enabled=true",
        "networkPolicy.enabled=true",
        "networkPolicy.controlPlaneCIDRs={10.0.0.0/24}",
    ];
    let pod_sets: Vec<String> = WORKLOADS
        .iter()
        .flat_map(|(_, _, key)| {
            [
                format!("{key}.podLabels.example\\.com/pod={key}"),
                format!("{key}.podAnnotations.example\\.com/note={key}"),
            ]
        })
        .collect();
    sets.extend(pod_sets.iter().map(String::as_str));
    let Some(r) = render(&sets) else { return };
    let version = env!("CARGO_PKG_VERSION");
    for doc in &r.0 {
        let labels = &doc["metadata"]["labels"];
        let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
        assert_eq!(labels["app.kubernetes.io/part-of"], "ipkeep", "{what}");
        assert_eq!(labels["app.kubernetes.io/instance"], "ipkeep", "{what}");
        assert_eq!(labels["app.kubernetes.io/version"], version, "{what}");
        assert_eq!(
            labels["helm.sh/chart"],
            format!("ipkeep-{version}").as_str(),
            "{what}"
        );
        assert_eq!(labels["example.com/team"], "databases", "{what}");
    }
    for (kind, name, key) in WORKLOADS {
        let w = r.find(kind, name);
        let meta = &w["spec"]["template"]["metadata"];
        assert_eq!(meta["labels"]["app.kubernetes.io/name"], name);
        assert_eq!(meta["labels"]["example.com/team"], "databases", "{name}");
        assert_eq!(meta["labels"]["example.com/pod"], key, "{name}");
        assert_eq!(meta["annotations"]["example.com/note"], key, "{name}");
        assert_eq!(
            w["spec"]["selector"],
            serde_json::json!({"matchLabels": {"app.kubernetes.io/name": name}}),
            "{name}: the selector never changes"
        );
    }
}

/// Issue 41 (gap 4): each component's escape hatches land in its pods, the defaults (Linux
/// nodes only, anti-affinity and zone spread, the restricted security contexts) are values
/// that can be replaced.
#[test]
fn every_component_takes_the_escape_hatches() {
    let Some(defaults) = render(&[]) else { return };
    for (kind, name, _) in WORKLOADS {
        let spec = pod(defaults.find(kind, name));
        assert_eq!(
            spec["nodeSelector"],
            serde_json::json!({"kubernetes.io/os": "linux"}),
            "{name}: Linux nodes by default"
        );
    }
    let controller = pod(defaults.find("Deployment", "ipkeep-controller"));
    assert!(controller["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(controller["securityContext"]["runAsUser"], 65532);
    let mut sets: Vec<String> = Vec::new();
    for (_, _, key) in WORKLOADS {
        sets.extend([
            format!("{key}.extraArgs={{--log-format=plain}}"),
            format!("{key}.extraEnv[0].name=EXTRA_{key}"),
            format!("{key}.extraEnv[0].value=on"),
            format!("{key}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool-{key}"),
            format!("{key}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists"),
            format!("{key}.tolerations[0].key=dedicated-{key}"),
            format!("{key}.tolerations[0].operator=Exists"),
            format!("{key}.nodeSelector=null"),
            format!("{key}.podSecurityContext.runAsNonRoot=true"),
            format!("{key}.securityContext.readOnlyRootFilesystem=true"),
            format!("{key}.resources.limits.memory=1Gi"),
        ]);
    }
    sets.extend([
        "controller.topologySpreadConstraints=null".to_string(),
        "controller.podSecurityContext.runAsUser=null".to_string(),
        "controller.podSecurityContext.runAsGroup=null".to_string(),
        "schedulerExt.topologySpreadConstraints[0].maxSkew=2".to_string(),
        "schedulerExt.topologySpreadConstraints[0].topologyKey=example.com/rack".to_string(),
        "schedulerExt.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule".to_string(),
    ]);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let r = render(&sets).expect("helm");
    for (kind, name, key) in WORKLOADS {
        let w = r.find(kind, name);
        let spec = pod(w);
        let c = &spec["containers"][0];
        let a = args(w);
        assert_eq!(
            a.last().map(String::as_str),
            Some("--log-format=plain"),
            "{name}: {a:?}"
        );
        assert!(
            c["env"]
                .as_array()
                .expect("env")
                .iter()
                .any(|e| e["name"] == format!("EXTRA_{key}").as_str() && e["value"] == "on"),
            "{name}: extraEnv"
        );
        assert_eq!(
            spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                [0]["matchExpressions"][0]["key"],
            format!("pool-{key}").as_str(),
            "{name}: affinity replaced"
        );
        assert!(spec["affinity"]["podAntiAffinity"].is_null(), "{name}");
        assert_eq!(
            spec["tolerations"][0]["key"],
            format!("dedicated-{key}").as_str()
        );
        assert!(
            spec["nodeSelector"].is_null(),
            "{name}: nodeSelector removed"
        );
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            c["securityContext"]["readOnlyRootFilesystem"], true,
            "{name}"
        );
        assert_eq!(c["resources"]["limits"]["memory"], "1Gi", "{name}");
    }
    let controller = pod(r.find("Deployment", "ipkeep-controller"));
    assert!(controller["topologySpreadConstraints"].is_null());
    assert!(
        controller["securityContext"]["runAsUser"].is_null()
            && controller["securityContext"]["runAsGroup"].is_null(),
        "OpenShift: no fixed user"
    );
    let ext = pod(r.find("Deployment", "ipkeep-scheduler-ext"));
    assert_eq!(
        ext["topologySpreadConstraints"][0]["topologyKey"],
        "example.com/rack"
    );
}

/// Issue 41 (gap 7): a PodDisruptionBudget never blocks a drain: none at one replica (or when
/// turned off), maxUnavailable 1 above.
#[test]
fn disruption_budgets_never_block_a_drain() {
    let Some(two) = render(&[]) else { return };
    for name in ["ipkeep-controller", "ipkeep-scheduler-ext"] {
        let pdb = two.find("PodDisruptionBudget", name);
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{name}");
        assert!(pdb["spec"]["minAvailable"].is_null(), "{name}");
    }
    let one = render(&["controller.replicas=1", "schedulerExt.replicas=1"]).expect("helm");
    let off = render(&[
        "controller.podDisruptionBudget.enabled=false",
        "schedulerExt.podDisruptionBudget.enabled=false",
    ])
    .expect("helm");
    for r in [one, off] {
        assert_eq!(r.of_kind("PodDisruptionBudget").count(), 0);
    }
}

/// Issue 41 (gaps 2, 4): the agent's rollout is a value, and its /metrics is on the node's IP
/// unless agent.metrics.nodeIP=false; a PodMonitor per component only when asked, the agent's
/// only where its metrics are reachable.
#[test]
fn the_agent_serves_metrics_on_the_node_ip_and_pod_monitors_follow() {
    let Some(r) = render(&["agent.updateStrategy.rollingUpdate.maxUnavailable=25%"]) else {
        return;
    };
    let agent = r.find("DaemonSet", "ipkeep-agent");
    assert_eq!(
        agent["spec"]["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}})
    );
    let a = args(agent);
    assert!(
        a.contains(&"--probe-listen=127.0.0.1:9464".to_string()),
        "{a:?}"
    );
    assert!(
        a.contains(&"--metrics-listen=$(NODE_IP):9464".to_string()),
        "{a:?}"
    );
    let c = &pod(agent)["containers"][0];
    assert!(
        c["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "NODE_IP"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP")
    );
    assert_eq!(c["ports"][0]["name"], "metrics");
    assert_eq!(c["ports"][0]["containerPort"], 9464);
    assert_eq!(
        r.of_kind("PodMonitor").count(),
        0,
        "PodMonitors only when asked"
    );

    let monitored = render(&[
        "monitoring.podMonitors.enabled=true",
        "monitoring.podMonitors.labels.release=prom",
        "agent.metrics.port=9465",
    ])
    .expect("helm");
    let names: Vec<&str> = monitored
        .of_kind("PodMonitor")
        .filter_map(|m| m["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["ipkeep-controller", "ipkeep-scheduler-ext", "ipkeep-agent"]
    );
    for m in monitored.of_kind("PodMonitor") {
        assert_eq!(m["metadata"]["labels"]["release"], "prom");
        assert_eq!(m["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
        let name = m["metadata"]["name"].as_str().expect("a name");
        let w = monitored
            .get("Deployment", name)
            .or_else(|| monitored.get("DaemonSet", name))
            .expect("its workload");
        let ports = pod(w)["containers"][0]["ports"].as_array().expect("ports");
        assert!(ports.iter().any(|p| p["name"] == "metrics"), "{name}");
    }
    let agent = monitored.find("DaemonSet", "ipkeep-agent");
    assert!(args(agent).contains(&"--metrics-listen=$(NODE_IP):9465".to_string()));

    let loopback = render(&[
        "monitoring.podMonitors.enabled=true",
        "agent.metrics.nodeIP=false",
    ])
    .expect("helm");
    assert!(loopback.get("PodMonitor", "ipkeep-agent").is_none());
    let agent = loopback.find("DaemonSet", "ipkeep-agent");
    assert!(
        !args(agent)
            .iter()
            .any(|a| a.starts_with("--metrics-listen"))
    );
}

/// Issue 41 (gap 8): the chart makes the components' namespace with its Pod Security labels
/// when asked, and puts every component there, whatever the release namespace.
#[test]
fn the_namespace_with_its_pod_security_labels_is_a_value() {
    let Some(r) = render(&["namespace.create=true", "namespace.name=ipkeep-db"]) else {
        return;
    };
    let ns = r.find("Namespace", "ipkeep-db");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    assert_eq!(ns["metadata"]["labels"]["ipkeep.dev/webhook"], "disabled");
    for doc in &r.0 {
        if let Some(n) = doc["metadata"]["namespace"].as_str() {
            let name = &doc["metadata"]["name"];
            let test_hook = doc["metadata"]["annotations"]["helm.sh/hook"] == "test";
            assert!(
                n == "ipkeep-db" || test_hook,
                "{} {name} in {n}",
                doc["kind"]
            );
        }
    }
    let binding = r.find("ValidatingAdmissionPolicy", "ipkeep-status-writers");
    assert!(
        binding
            .to_string()
            .contains("system:serviceaccount:ipkeep-db:ipkeep-controller"),
        "the policies name the controller of that namespace"
    );
    let message = refused(&["namespace.create=true"]).expect("helm");
    assert!(message.contains("namespace.name"), "{message}");
}

/// Issue 41 (gap 10): the schema refuses what every pod ADD would then fail on, and addresses
/// that are not addresses; the templates refuse what the schema cannot express.
#[test]
fn nonsense_values_are_refused_naming_the_key() {
    if render(&[]).is_none() {
        return;
    }
    for (set, key) in [
        ("cni.ranges[0][0].subnet=banana", "/cni/ranges/0/0/subnet"),
        (
            "cni.ranges[0][0].subnet=10.0.0.0/33",
            "/cni/ranges/0/0/subnet",
        ),
        (
            "cni.ranges[0][0].subnet=usePodCidr,cni.ranges[0][0].rangeStart=x",
            "/cni/ranges/0/0/rangeStart",
        ),
        (
            "cni.ranges[0][0].subnet=usePodCidr,cni.ranges[0][0].gateway=10.0.0.256",
            "/cni/ranges/0/0/gateway",
        ),
        ("cni.routes[0].gw=gateway", "/cni/routes/0/gw"),
        (
            "schedulerExt.service.clusterIP=999.1.1.1",
            "/schedulerExt/service/clusterIP",
        ),
        (
            "agent.updateStrategy.type=Sometimes",
            "/agent/updateStrategy/type",
        ),
        ("controller.extraArgs={-v}", "/controller/extraArgs/0"),
        (
            "namespace.podSecurityEnforce=lax",
            "/namespace/podSecurityEnforce",
        ),
        (
            "selfManagedCertificates.caValidity=30d",
            "selfManagedCertificates.caValidity (30d) must be longer",
        ),
    ] {
        let message = refused(&[set]).expect("helm");
        assert!(message.contains(key), "--set {set}: {message}");
    }
    for ok in [
        "cni.ranges[0][0].subnet=fd00:10:244::/64",
        "cni.ranges[0][0].subnet=usePodCidrIPv6",
        "cni.ranges[0][0].subnet=10.244.0.0/24,cni.ranges[0][0].rangeStart=10.244.0.10",
        "selfManagedCertificates.caValidity=366d",
    ] {
        render(&[ok]).expect("helm");
    }
}

/// Issue 41 (gap 10): the chart declares the Kubernetes releases it is tested on.
#[test]
fn the_chart_declares_the_tested_kubernetes_releases() {
    let Some(Err(old)) = try_render(&["--kube-version", "1.34.0"]) else {
        if helm().is_some() {
            panic!("the chart renders for Kubernetes 1.34");
        }
        return;
    };
    assert!(old.contains("kubeVersion"), "{old}");
    try_render(&["--kube-version", "1.35.0"])
        .expect("helm")
        .expect("1.35 is supported");
}
