//! Cross-file consistency: the workloads against their binaries, the Service, webhook, extender
//! and certificate against each other, namespaces, RBAC, selectors, the kustomization and the
//! Dockerfile.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use ipkeep_api::k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use ipkeep_api::k8s_openapi::api::apps::v1::StatefulSet;
use ipkeep_api::k8s_openapi::api::core::v1::{Namespace, Service};
use ipkeep_api::k8s_openapi::api::policy::v1::PodDisruptionBudget;
use ipkeep_api::k8s_openapi::api::rbac::v1::PolicyRule;
use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use ipkeep_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use ipkeep_values::keys;
use serde_json::Value;

use super::cli::{Cli, binary, first_flag, flag_value, ipkeep_binary, port_of, resolve_port};
use super::manifests::{
    BINARIES, Doc, NAMESPACE, Workload, allows, documents, find, granted, image, of_kind, parse,
    repo_root, selects, workload, workloads, yaml_files,
};

#[test]
fn workloads_run_the_one_image_with_flags_and_variables_their_binary_has() {
    for w in workloads() {
        for c in w.containers() {
            let at = format!("{} container {}", w.doc, c.name);
            assert_eq!(c.image.as_deref(), Some(image().as_str()), "{at}: image");
            let Some(binary) = ipkeep_binary(c) else {
                // The agent's install-cni: a shell script copying a binary out of the image.
                let script = c
                    .command
                    .iter()
                    .flatten()
                    .chain(c.args.iter().flatten())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ");
                assert!(
                    script.contains("/usr/local/bin/ipkeep "),
                    "{at}: copies the plugin from /usr/local/bin: {script}"
                );
                continue;
            };
            let cli = Cli::of(binary);
            let mut argv = Vec::new();
            let mut given = BTreeSet::new();
            for arg in c.args.iter().flatten() {
                let flag = first_flag(arg);
                assert!(
                    cli.options.contains_key(&flag),
                    "{at}: {binary} has no {flag}"
                );
                assert!(
                    arg.contains('=') || !cli.options[&flag].takes_value,
                    "{at}: write {flag}=VALUE"
                );
                given.insert(flag);
                // The kubelet substitutes $(NAME) from the container's variables: a node's
                // address here (the agent's $(NODE_IP)).
                let mut arg = arg.clone();
                for env in c.env.iter().flatten() {
                    arg = arg.replace(&format!("$({})", env.name), "192.0.2.10");
                }
                argv.push(arg);
            }
            for env in c.env.iter().flatten() {
                // A variable the arguments use ($(NODE_IP)), which the kubelet substitutes.
                let substituted = format!("$({})", env.name);
                if c.args.iter().flatten().any(|a| a.contains(&substituted)) {
                    continue;
                }
                let Some(flag) = cli.flag_for_env(&env.name) else {
                    assert!(
                        cli.help.contains(&format!("${}", env.name)),
                        "{at}: {binary} reads no {}",
                        env.name
                    );
                    continue;
                };
                given.insert(flag.to_string());
                match (&env.value, cli.options[flag].takes_value) {
                    (Some(v), true) => argv.push(format!("{flag}={v}")),
                    (Some(v), false) if v == "true" => argv.push(flag.to_string()),
                    _ => {}
                }
            }
            for group in &cli.required {
                assert!(
                    group.iter().any(|f| given.contains(f)),
                    "{at}: {binary} needs one of {group:?}"
                );
            }
            // clap checks every value before it answers --help: a bad duration, address or enum
            // value fails here.
            let out = Command::new(self::binary(binary))
                .args(&argv)
                .arg("--help")
                .output()
                .expect("run");
            assert!(
                out.status.success(),
                "{at}: {binary} {argv:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn probes_and_the_service_reach_the_ports_the_binaries_listen_on() {
    for w in workloads() {
        let c = w.main();
        let binary = ipkeep_binary(c).expect("an ipkeep binary");
        let cli = Cli::of(binary);
        // The plain-HTTP server with /healthz and /readyz.
        let health = port_of(&flag_value(c, cli, "--probe-listen").expect("a health address"));
        for flag in ["--webhook-listen", "--probe-listen", "--metrics-listen"] {
            if let Some(address) = flag_value(c, cli, flag) {
                let port = IntOrString::Int(port_of(&address));
                assert!(
                    resolve_port(c, &port).is_some(),
                    "{}: no containerPort for {flag}={address}",
                    w.doc
                );
            }
        }
        for probe in [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]
            .into_iter()
            .flatten()
        {
            let get = probe.http_get.as_ref().expect("HTTP probes");
            assert_eq!(
                resolve_port(c, &get.port),
                Some(health),
                "{}: probe port",
                w.doc
            );
            assert!(
                matches!(get.scheme.as_deref(), None | Some("HTTP")),
                "{}: plain HTTP",
                w.doc
            );
            assert!(
                cli.help.contains("/healthz") && cli.help.contains("/readyz"),
                "{binary}"
            );
        }
    }

    let ext = workload("ipkeep-scheduler-ext");
    let c = ext.main();
    let listen = port_of(
        &flag_value(c, Cli::of("ipkeep-scheduler-ext"), "--webhook-listen")
            .expect("--webhook-listen"),
    );
    let service: Service = find("Service", "ipkeep-scheduler-ext").typed();
    let spec = service.spec.expect("spec");
    let selector = LabelSelector {
        match_labels: spec.selector.clone(),
        match_expressions: None,
    };
    assert!(
        selects(&selector, &ext.labels()),
        "the Service selects the scheduler-ext pods"
    );
    let port = &spec.ports.expect("ports")[0];
    let target = port.target_port.clone().expect("targetPort");
    assert_eq!(
        resolve_port(c, &target),
        Some(listen),
        "the Service forwards to --webhook-listen"
    );
}

#[test]
fn webhook_extender_service_and_certificate_agree() {
    let service = find("Service", "ipkeep-scheduler-ext");
    let (svc, ns) = (service.name(), service.namespace().expect("namespaced"));
    let svc_port = service.value["spec"]["ports"][0]["port"]
        .as_i64()
        .expect("port");
    let help = &Cli::of("ipkeep-scheduler-ext").help;

    let hook: MutatingWebhookConfiguration =
        find("MutatingWebhookConfiguration", "ipkeep-scheduler-ext").typed();
    let lifecycle: ValidatingWebhookConfiguration =
        find("ValidatingWebhookConfiguration", "ipkeep-scheduler-ext").typed();
    let clients = hook
        .webhooks
        .iter()
        .flatten()
        .map(|w| &w.client_config)
        .chain(
            lifecycle
                .webhooks
                .iter()
                .flatten()
                .map(|w| &w.client_config),
        );
    let mut paths = BTreeSet::new();
    for config in clients {
        let client = config.service.clone().expect("a service reference");
        assert_eq!((client.name.as_str(), client.namespace.as_str()), (svc, ns));
        assert_eq!(client.port.map(i64::from), Some(svc_port));
        let path = client.path.expect("path");
        assert!(
            help.contains(&format!("POST {path}")),
            "the server serves {path}"
        );
        paths.insert(path);
    }
    assert_eq!(
        paths,
        BTreeSet::from([
            "/mutate-pods".to_string(),
            "/mutate-persistentpodstates".to_string(),
            "/validate-pods".to_string()
        ])
    );

    let config = of_kind("KubeSchedulerConfiguration")
        .next()
        .expect("scheduler config");
    let extender = &config.value["extenders"][0];
    let server_name = format!("{svc}.{ns}.svc");
    assert_eq!(
        extender["urlPrefix"],
        format!("https://{server_name}:{svc_port}")
    );
    assert_eq!(extender["tlsConfig"]["serverName"], server_name.as_str());
    assert_eq!(extender["enableHTTPS"], true);
    for verb in ["filterVerb", "prioritizeVerb"] {
        let verb = extender[verb].as_str().expect("verb");
        assert!(
            help.contains(&format!("/{verb}")),
            "the server serves /{verb}"
        );
    }

    // The Secret the Deployment mounts is the one the Certificate writes, for the names the API
    // server and kube-scheduler check, and the webhook's CA comes from that Certificate.
    let ext = workload("ipkeep-scheduler-ext");
    let pod = ext.template.spec.as_ref().expect("pod spec");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.secret.is_some())
        .expect("a Secret volume");
    let secret = volume
        .secret
        .as_ref()
        .and_then(|s| s.secret_name.clone())
        .expect("secretName");
    assert_eq!(secret, "ipkeep-scheduler-ext-tls");
    let mount = ext
        .main()
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .expect("mounted");
    let cli = Cli::of("ipkeep-scheduler-ext");
    for (flag, file) in [("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")] {
        let path = flag_value(ext.main(), cli, flag).expect(flag);
        assert_eq!(
            path,
            format!("{}/{file}", mount.mount_path),
            "{flag} reads the Secret's {file}"
        );
    }
    let cert = of_kind("Certificate")
        .find(|c| c.str("/spec/secretName") == secret)
        .expect("a Certificate for the Secret");
    assert_eq!(cert.namespace(), Some(ns));
    let dns: Vec<&str> = cert.value["spec"]["dnsNames"]
        .as_array()
        .expect("dnsNames")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(dns.contains(&server_name.as_str()), "{dns:?}");
    // The base: ipkeep-controller fills caBundle (no CA injector); the cert-manager component's
    // patches add the injector's annotation naming that Certificate.
    for annotations in [&hook.metadata.annotations, &lifecycle.metadata.annotations] {
        let inject = annotations
            .as_ref()
            .and_then(|a| a.get("cert-manager.io/inject-ca-from"));
        assert_eq!(
            inject, None,
            "the base's webhooks are the controller's to fill"
        );
    }
    for patch in [
        "cert-manager/mutating-webhook-annotations.yaml",
        "cert-manager/validating-webhook-annotations.yaml",
    ] {
        let doc = &parse(patch)[0];
        assert_eq!(
            doc.value["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("{ns}/{}", cert.name()),
            "{patch}"
        );
    }
    // Every Certificate's issuer is in the file, and every CA Issuer's Secret is a Certificate's.
    for c in of_kind("Certificate") {
        let issuer = find("Issuer", c.str("/spec/issuerRef/name"));
        assert_eq!(issuer.namespace(), c.namespace(), "{c}");
    }
    for issuer in of_kind("Issuer").filter(|i| i.value["spec"]["ca"].is_object()) {
        let ca = issuer.str("/spec/ca/secretName");
        assert!(
            of_kind("Certificate")
                .any(|c| c.str("/spec/secretName") == ca && c.value["spec"]["isCA"] == true),
            "{issuer}"
        );
    }
}

#[test]
fn everything_but_the_examples_is_in_ipkeep_system() {
    const CLUSTER_SCOPED: [&str; 13] = [
        "Namespace",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "KubeSchedulerConfiguration",
        "Kustomization",
        "Component",
    ];
    for d in documents() {
        if d.is_example() {
            assert_eq!(d.namespace(), None, "{d}: examples are applied with -n");
        } else if CLUSTER_SCOPED.contains(&d.kind()) {
            assert_eq!(d.namespace(), None, "{d}: cluster-scoped");
        } else {
            assert_eq!(d.namespace(), Some(NAMESPACE), "{d}");
        }
    }
    assert_eq!(find("Namespace", NAMESPACE).kind(), "Namespace");
}

#[test]
fn the_webhook_skips_ipkeep_system_and_disabled_namespaces_and_sees_statefulset_pods() {
    let hook: MutatingWebhookConfiguration =
        find("MutatingWebhookConfiguration", "ipkeep-scheduler-ext").typed();
    let webhook = &hook.webhooks.as_ref().expect("webhooks")[0];
    let namespaces = webhook
        .namespace_selector
        .as_ref()
        .expect("namespaceSelector");
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let ns: Namespace = find("Namespace", NAMESPACE).typed();
    let mut own = ns.metadata.labels.clone().unwrap_or_default();
    own.insert("kubernetes.io/metadata.name".into(), NAMESPACE.into());
    assert!(
        !selects(namespaces, &own),
        "ipkeep's own pods must not wait for the webhook"
    );
    own.insert("kubernetes.io/metadata.name".into(), "renamed".into());
    assert!(
        !selects(namespaces, &own),
        "the namespace's label alone keeps the webhook out"
    );
    assert!(selects(
        namespaces,
        &labels(&[("kubernetes.io/metadata.name", "demo")])
    ));
    assert!(!selects(
        namespaces,
        &labels(&[
            ("kubernetes.io/metadata.name", "demo"),
            ("ipkeep.dev/webhook", "disabled")
        ])
    ));

    let objects = webhook.object_selector.as_ref().expect("objectSelector");
    let sts: StatefulSet = find("StatefulSet", "db").typed();
    let template = sts
        .spec
        .expect("spec")
        .template
        .metadata
        .and_then(|m| m.labels)
        .unwrap_or_default();
    assert!(!selects(objects, &template));
    let mut pod = template;
    pod.insert(keys::STATEFULSET_POD_NAME_LABEL.into(), "db-0".into());
    assert!(
        selects(objects, &pod),
        "the StatefulSet controller's pod-name label lets it in"
    );

    // The lifecycle webhooks skip the same namespaces; pod DELETE reaches the server only for
    // pods the pinning webhook gave a lifecycle state, and evictions (no labels) all do.
    let lifecycle: ValidatingWebhookConfiguration =
        find("ValidatingWebhookConfiguration", "ipkeep-scheduler-ext").typed();
    for hook in lifecycle.webhooks.iter().flatten() {
        assert_eq!(
            hook.namespace_selector.as_ref(),
            Some(namespaces),
            "{}",
            hook.name
        );
        assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"), "fail open");
        let resources: Vec<&str> = hook
            .rules
            .iter()
            .flatten()
            .flat_map(|r| r.resources.iter().flatten())
            .map(String::as_str)
            .collect();
        match resources.as_slice() {
            ["pods"] => {
                let objects = hook.object_selector.as_ref().expect("objectSelector");
                assert!(!selects(objects, &pod));
                pod.insert(ipkeep_values::keys::STATE_LABEL.into(), "Normal".into());
                assert!(selects(objects, &pod), "a pod with a lifecycle state");
            }
            ["pods/eviction"] => assert!(
                hook.object_selector.is_none(),
                "an Eviction has no labels: a selector would match none"
            ),
            other => panic!("unexpected resources {other:?}"),
        }
    }
}

#[test]
fn service_accounts_exist_are_bound_and_allow_what_the_binaries_do_at_start() {
    let accounts: BTreeSet<&str> = of_kind("ServiceAccount").map(Doc::name).collect();
    let mut used = BTreeSet::new();
    for w in workloads() {
        let sa = w
            .template
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .expect("serviceAccountName");
        assert!(
            accounts.contains(sa.as_str()),
            "{}: ServiceAccount {sa} missing",
            w.doc
        );
        used.insert(sa.clone());
        // Every component lists PersistentPodStates at start (the CRD check), then watches them.
        let (cluster, _) = granted(&sa);
        for verb in ["list", "watch"] {
            assert!(
                allows(&cluster, "ipkeep.dev", "persistentpodstates", verb, None),
                "{sa}: {verb}"
            );
        }
    }
    assert_eq!(
        used.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        accounts,
        "unused ServiceAccounts"
    );
    // Every binding names an existing account and role (checked by granted()); every role is bound.
    for d in of_kind("ClusterRoleBinding").chain(of_kind("RoleBinding")) {
        for s in d.value["subjects"].as_array().expect("subjects") {
            assert!(
                accounts.contains(s["name"].as_str().unwrap_or_default()),
                "{d}"
            );
            assert_eq!(s["namespace"], NAMESPACE, "{d}");
        }
        let kind = d.str("/roleRef/kind");
        find(kind, d.str("/roleRef/name"));
    }
    for role in of_kind("ClusterRole").chain(of_kind("Role")) {
        let bound = of_kind("ClusterRoleBinding")
            .chain(of_kind("RoleBinding"))
            .any(|b| {
                b.str("/roleRef/kind") == role.kind() && b.str("/roleRef/name") == role.name()
            });
        assert!(bound, "{role} is bound to nobody");
    }

    // Leader election: the Lease the controller uses, where it uses it.
    let controller = workload("ipkeep-controller");
    let c = controller.main();
    let cli = Cli::of("ipkeep-controller");
    let lease = flag_value(c, cli, "--lease-name").expect("a lease name");
    let lease_ns = flag_value(c, cli, "--lease-namespace").unwrap_or_else(|| NAMESPACE.into());
    assert!(
        flag_value(c, cli, "--no-leader-election").is_none(),
        "two replicas need leader election"
    );
    let sa = controller
        .template
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .expect("sa");
    let (_, namespaced) = granted(&sa);
    let rules: Vec<PolicyRule> = namespaced
        .into_iter()
        .filter(|(ns, _)| *ns == lease_ns)
        .flat_map(|(_, r)| r)
        .collect();
    assert!(
        allows(&rules, "coordination.k8s.io", "leases", "create", None),
        "create the Lease"
    );
    for verb in ["get", "patch"] {
        assert!(
            allows(&rules, "coordination.k8s.io", "leases", verb, Some(&lease)),
            "{verb} Lease {lease_ns}/{lease}"
        );
    }
}

#[test]
fn selectors_budgets_and_spreading_match_their_own_pods() {
    let workloads = workloads();
    for w in &workloads {
        let labels = w.labels();
        assert!(selects(&w.selector, &labels), "{}: selector", w.doc);
        let pod = w.template.spec.as_ref().expect("pod spec");
        let anti = pod
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref());
        let terms = anti.iter().flat_map(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
        });
        for term in terms {
            let selector = term
                .pod_affinity_term
                .label_selector
                .as_ref()
                .expect("labelSelector");
            assert!(selects(selector, &labels), "{}: anti-affinity", w.doc);
        }
        for spread in pod.topology_spread_constraints.iter().flatten() {
            assert!(
                selects(
                    spread.label_selector.as_ref().expect("labelSelector"),
                    &labels
                ),
                "{}",
                w.doc
            );
        }
    }
    for d in of_kind("PodDisruptionBudget") {
        let pdb: PodDisruptionBudget = d.typed();
        let spec = pdb.spec.expect("spec");
        let selector = spec.selector.expect("selector");
        let targets: Vec<&Workload> = workloads
            .iter()
            .filter(|w| selects(&selector, &w.labels()))
            .collect();
        assert_eq!(targets.len(), 1, "{d}: selects exactly one workload");
        // Issue 41: a budget never blocks a drain, whatever the replicas.
        assert_eq!(spec.min_available, None, "{d}: minAvailable");
        assert_eq!(
            spec.max_unavailable,
            Some(IntOrString::Int(1)),
            "{d}: maxUnavailable"
        );
        let replicas = targets[0].replicas.expect("a Deployment");
        assert!(replicas > 1, "{d}: a budget for one replica");
    }
}

// ---------------------------------------------------------------------------------------------
// kustomization, Dockerfile

#[test]
fn kustomization_lists_every_manifest_but_the_documented_exceptions() {
    // Why each is left out is said in kustomization.yaml: the scheduler configuration is a
    // file for kube-scheduler, examples are the user's, the admission-policy, cert-manager,
    // cni, monitoring and network-policy components are opt-in (`components:`).
    const LEFT_OUT: [&str; 16] = [
        "kustomization.yaml",
        "admission-policy/kustomization.yaml",
        "admission-policy/pin-policy.yaml",
        "cert-manager/kustomization.yaml",
        "cert-manager/certificate.yaml",
        "cert-manager/controller-args.yaml",
        "cert-manager/mutating-webhook-annotations.yaml",
        "cert-manager/validating-webhook-annotations.yaml",
        "cni/kustomization.yaml",
        "monitoring/grafana-dashboard.yaml",
        "monitoring/kustomization.yaml",
        "monitoring/pod-monitors.yaml",
        "monitoring/prometheus-rule.yaml",
        "network-policy/kustomization.yaml",
        "network-policy/network-policy.yaml",
        "scheduler-ext/scheduler-config.yaml",
    ];
    let kustomization = of_kind("Kustomization")
        .next()
        .expect("deploy/kustomization.yaml");
    let listed: BTreeSet<String> = kustomization.value["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a path").to_string())
        .collect();
    let expected: BTreeSet<String> = yaml_files()
        .into_iter()
        .filter(|f| !f.starts_with("examples/") && !LEFT_OUT.contains(&f.as_str()))
        .collect();
    assert_eq!(
        listed, expected,
        "add new manifests to deploy/kustomization.yaml (or to the exceptions here, with a reason there)"
    );
}

/// The cni component (deploy/cni/kustomization.yaml) patches the agent: every flag it adds is
/// one the agent has, the volumes it mounts are the ones it adds, and its ConfigMap file is the
/// bridge template.
#[test]
fn the_cni_component_adds_agent_flags_and_volumes_that_exist() {
    let component = of_kind("Component")
        .find(|c| c.file == "cni/kustomization.yaml")
        .expect("deploy/cni/kustomization.yaml");
    let cli = Cli::of("ipkeep-agent");
    let patch: Vec<Value> = serde_saphyr::from_str(
        component.value["patches"][0]["patch"]
            .as_str()
            .expect("an inline JSON patch"),
    )
    .expect("the patch is YAML");
    let (mut mounts, mut volumes) = (BTreeSet::new(), BTreeSet::new());
    for op in &patch {
        let path = op["path"].as_str().expect("path");
        let value = &op["value"];
        if path.ends_with("/args/-") {
            let flag = value.as_str().expect("an arg");
            assert!(
                cli.options.contains_key(&first_flag(flag)),
                "ipkeep-agent has no {flag}"
            );
        } else if path.ends_with("/volumeMounts/-") {
            mounts.insert(value["name"].as_str().expect("name").to_string());
        } else if path.ends_with("/volumes/-") {
            volumes.insert(value["name"].as_str().expect("name").to_string());
        }
    }
    assert_eq!(
        mounts, volumes,
        "each added volume is mounted, and only those"
    );
    assert_eq!(
        component.value["configMapGenerator"][0]["files"][0],
        "10-ipkeep.conflist=10-ipkeep-bridge.conflist"
    );
}

#[test]
fn the_dockerfile_builds_every_binary_the_manifests_run_into_usr_local_bin() {
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("Dockerfile");
    let words: Vec<&str> = dockerfile.split_whitespace().collect();
    let mut built: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--bin")
        .map(|w| w[1])
        .collect();
    // The plugin runs on the host: it is built statically by its own script.
    if dockerfile.contains("\"$(scripts/build-plugin.sh)\" /out/ipkeep") {
        built.insert("ipkeep");
    }
    assert_eq!(
        built,
        BINARIES.into_iter().collect(),
        "one image with every binary"
    );
    for flag in ["--locked", "--release"] {
        assert!(words.contains(&flag), "cargo build {flag}");
    }
    assert!(
        dockerfile.contains("/usr/local/bin/"),
        "binaries in /usr/local/bin"
    );
    // The agent's init container runs /bin/sh, cp, chmod and mv; the scheduler extension's
    // preStop runs sleep: the runtime image needs a shell and coreutils.
    let runtime = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG RUNTIME_IMAGE="))
        .expect("ARG RUNTIME_IMAGE");
    assert!(runtime.starts_with("debian:"), "{runtime} may lack /bin/sh");
    for w in workloads() {
        for c in w.containers() {
            if let Some(b) = ipkeep_binary(c) {
                assert!(built.contains(b), "{}: {b} is not in the image", w.doc);
            }
        }
    }
}
