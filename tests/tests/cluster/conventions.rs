//! apisim beside kube-apiserver: the same kubectl steps against both, outcome by outcome.
//!
//! Every API convention ipkeep's tests lean on is a probe here. A probe whose outcomes differ is
//! a divergence; the known ones are listed with the reason they are tolerated (and in
//! `docs/apisim.md`). A new divergence fails the test, and so does a listed one that is gone, so
//! the list stays true.

use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, Instant};

use ipkeep_tests::apisim::Apisim;
use ipkeep_tests::cluster::{Cluster, repo_root};
use ipkeep_tests::kubectl::Kubectl;

const NS: &str = "conv";

/// Divergences we know of, and why apisim may keep them.
const KNOWN: &[(&str, &str)] = &[
    (
        "kubectl create namespace (a generator: protobuf body)",
        "apisim speaks JSON only; tests create namespaces from YAML",
    ),
    (
        "CRD pattern refuses ipRetention: 24 hours",
        "apisim checks no `pattern`; the product parses ipRetention itself and refuses it too",
    ),
];

/// One step's outcome: `ok` or the API's reason for refusing it.
fn outcome(out: &Output) -> String {
    if out.status.success() {
        return "ok".into();
    }
    let err = String::from_utf8_lossy(&out.stderr);
    match err.find("Error from server (") {
        Some(i) => {
            let rest = &err[i + "Error from server (".len()..];
            format!("refused ({})", rest.split(')').next().unwrap_or_default())
        }
        None if err.contains("Unsupported Media Type") || err.contains("415") => {
            "refused (UnsupportedMediaType)".into()
        }
        None if err.contains("is invalid") => "refused (Invalid)".into(),
        None if err.contains("conflict") || err.contains("Apply failed") => {
            "refused (Conflict)".into()
        }
        None => format!(
            "failed: {}",
            err.lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(80)
                .collect::<String>()
        ),
    }
}

/// A pod no node matches, so kube-scheduler leaves it Pending as apisim does.
fn pod(name: &str, extra_meta: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\n{extra_meta}spec:\n  nodeSelector: {{ipkeep.dev/probe: nowhere}}\n  containers: [{{name: c, image: localhost/ipkeep/busybox:1.35}}]\n"
    )
}

fn sts(name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  replicas: 0\n  serviceName: {name}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: c, image: localhost/ipkeep/busybox:1.35}}]}}\n"
    )
}

fn field(k: &Kubectl, what: &[&str], path: &str) -> String {
    let mut args = vec!["get", "-n", NS, "-o", path];
    args.extend_from_slice(what);
    let out = k.try_run(&args, None);
    if out.status.success() {
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    } else {
        outcome(&out)
    }
}

fn gone_within(k: &Kubectl, what: &[&str], timeout: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        let mut args = vec!["get", "-n", NS];
        args.extend_from_slice(what);
        if outcome(&k.try_run(&args, None)) == "refused (NotFound)" {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    false
}

type Probe = fn(&Kubectl) -> String;

fn probes() -> Vec<(&'static str, Probe)> {
    vec![
        (
            "kubectl create namespace (a generator: protobuf body)",
            |k| outcome(&k.try_run(&["create", "namespace", "conv-generated"], None)),
        ),
        ("update with a stale resourceVersion", |k| {
            k.apply(&pod("stale", ""));
            let old = k.run(&["get", "pod", "stale", "-n", NS, "-o", "json"]);
            k.run(&["label", "pod", "stale", "-n", NS, "x=1"]);
            let edited = old.replace(
                "\"name\": \"stale\",",
                "\"name\": \"stale\", \"labels\": {\"y\": \"2\"},",
            );
            outcome(&k.try_run(&["replace", "-f", "-"], Some(&edited)))
        }),
        ("generateName gives distinct names", |k| {
            let yaml = pod("", "").replace("  name: \n", "  generateName: g-\n");
            let mut names = Vec::new();
            for _ in 0..2 {
                let out = k.try_run(&["create", "-f", "-", "-o", "name"], Some(&yaml));
                names.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
            }
            let distinct = names[0] != names[1];
            let prefixed = names.iter().all(|n| n.starts_with("pod/g-") && n.len() > 6);
            format!("distinct={distinct} prefixed={prefixed}")
        }),
        ("label and field selectors", |k| {
            k.apply(&pod("sel-a", "  labels: {app: a}\n"));
            k.apply(&pod("sel-b", "  labels: {app: b}\n"));
            let by_label = k.run(&["get", "pods", "-n", NS, "-l", "app=a", "-o", "name"]);
            let by_field = k.run(&[
                "get",
                "pods",
                "-n",
                NS,
                "--field-selector",
                "metadata.name=sel-b",
                "-o",
                "name",
            ]);
            let unbound = k.run(&[
                "get",
                "pods",
                "-n",
                NS,
                "-l",
                "app",
                "--field-selector",
                "spec.nodeName=",
                "-o",
                "name",
            ]);
            format!(
                "{} | {} | {}",
                by_label.trim(),
                by_field.trim(),
                unbound.split_whitespace().collect::<Vec<_>>().join(",")
            )
        }),
        ("a no-op apply keeps the resourceVersion", |k| {
            k.apply(&pod("noop", "  labels: {app: noop}\n"));
            let before = field(k, &["pod", "noop"], "jsonpath={.metadata.resourceVersion}");
            k.apply(&pod("noop", "  labels: {app: noop}\n"));
            let after = field(k, &["pod", "noop"], "jsonpath={.metadata.resourceVersion}");
            format!("same={}", before == after)
        }),
        ("generation follows the spec, not labels", |k| {
            k.apply(&sts("gen"));
            k.run(&["label", "sts", "gen", "-n", NS, "x=1"]);
            let after_label = field(k, &["sts", "gen"], "jsonpath={.metadata.generation}");
            k.run(&[
                "patch",
                "sts",
                "gen",
                "-n",
                NS,
                "--type=merge",
                "-p",
                r#"{"spec":{"template":{"metadata":{"labels":{"app":"gen","v":"2"}}}}}"#,
            ]);
            let after_spec = field(k, &["sts", "gen"], "jsonpath={.metadata.generation}");
            format!("{after_label} then {after_spec}")
        }),
        ("the scale subresource", |k| {
            k.apply(&sts("sc"));
            let scaled =
                outcome(&k.try_run(&["scale", "sts", "sc", "-n", NS, "--replicas=0"], None));
            format!(
                "{scaled} replicas={}",
                field(k, &["sts", "sc"], "jsonpath={.spec.replicas}")
            )
        }),
        ("strategic merge of containers by name", |k| {
            k.apply(&pod("smp", ""));
            k.run(&[
                "patch",
                "pod",
                "smp",
                "-n",
                NS,
                "-p",
                r#"{"spec":{"containers":[{"name":"c","image":"localhost/ipkeep/busybox:1.36"}]}}"#,
            ]);
            field(
                k,
                &["pod", "smp"],
                "jsonpath={range .spec.containers[*]}{.name}={.image} {end}",
            )
        }),
        ("a JSON patch whose test fails", |k| {
            k.apply(&pod("jp", ""));
            outcome(&k.try_run(
                &[
                    "patch",
                    "pod",
                    "jp",
                    "-n",
                    NS,
                    "--type=json",
                    "-p",
                    r#"[{"op":"test","path":"/metadata/name","value":"other"}]"#,
                ],
                None,
            ))
        }),
        ("server-side apply: conflict, then forced", |k| {
            let mine = pod("ssa", "  labels: {owner: a}\n");
            let theirs = pod("ssa", "  labels: {owner: b}\n");
            let _ = k.try_run(
                &["apply", "--server-side", "--field-manager=a", "-f", "-"],
                Some(&mine),
            );
            let conflict = outcome(&k.try_run(
                &["apply", "--server-side", "--field-manager=b", "-f", "-"],
                Some(&theirs),
            ));
            let forced = outcome(&k.try_run(
                &[
                    "apply",
                    "--server-side",
                    "--field-manager=b",
                    "--force-conflicts",
                    "-f",
                    "-",
                ],
                Some(&theirs),
            ));
            format!(
                "{conflict}, then {forced}, owner={}",
                field(k, &["pod", "ssa"], "jsonpath={.metadata.labels.owner}")
            )
        }),
        ("a finalizer holds a delete until removed", |k| {
            k.apply(&pod("fin", "  finalizers: [example.com/hold]\n"));
            k.run(&["delete", "pod", "fin", "-n", NS, "--wait=false"]);
            let held =
                field(k, &["pod", "fin"], "jsonpath={.metadata.deletionTimestamp}").len() > 10;
            k.run(&[
                "patch",
                "pod",
                "fin",
                "-n",
                NS,
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
            ]);
            format!(
                "held={held} gone={}",
                gone_within(k, &["pod", "fin"], Duration::from_secs(30))
            )
        }),
        ("a dependent is collected with its owner", |k| {
            k.apply(&sts("owner"));
            let uid = field(k, &["sts", "owner"], "jsonpath={.metadata.uid}");
            k.apply(&pod("dependent", &format!("  labels: {{role: dependent}}\n  ownerReferences: [{{apiVersion: apps/v1, kind: StatefulSet, name: owner, uid: \"{uid}\"}}]\n")));
            k.run(&["delete", "sts", "owner", "-n", NS, "--wait=false"]);
            format!(
                "gone={}",
                gone_within(k, &["pod", "dependent"], Duration::from_secs(60))
            )
        }),
        ("only pods/binding sets a pod's nodeName", |k| {
            k.apply(&pod("bound", ""));
            outcome(&k.try_run(
                &[
                    "patch",
                    "pod",
                    "bound",
                    "-n",
                    NS,
                    "-p",
                    r#"{"spec":{"nodeName":"elsewhere"}}"#,
                ],
                None,
            ))
        }),
        ("events.k8s.io Events are core Events", |k| {
            k.apply(&format!("apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {{name: ev, namespace: {NS}}}\neventTime: \"2026-11-24T06:00:00.000000Z\"\nreportingController: ipkeep.dev/test\nreportingInstance: test\naction: Probe\nreason: Probed\ntype: Normal\nnote: hello\nregarding: {{kind: Pod, name: noop, namespace: {NS}}}\n"));
            field(
                k,
                &["events", "--field-selector", "reason=Probed"],
                "jsonpath={range .items[*]}{.message}/{.involvedObject.name}{end}",
            )
        }),
        ("CRD pattern refuses ipRetention: 24 hours", |k| {
            outcome(&k.try_run(&["apply", "-f", "-"], Some(&format!("apiVersion: ipkeep.dev/v1alpha1\nkind: PersistentPodState\nmetadata: {{name: bad, namespace: {NS}}}\nspec:\n  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: x}}\n  ipRetention: 24 hours\n"))))
        }),
        ("CRD status is a subresource", |k| {
            k.apply(&format!("apiVersion: ipkeep.dev/v1alpha1\nkind: PersistentPodState\nmetadata: {{name: st, namespace: {NS}}}\nspec:\n  targetRef: {{apiVersion: apps/v1, kind: StatefulSet, name: none-such}}\n"));
            let main = outcome(&k.try_run(
                &[
                    "patch",
                    "pps",
                    "st",
                    "-n",
                    NS,
                    "--type=merge",
                    "-p",
                    r#"{"status":{"observedGeneration":42}}"#,
                ],
                None,
            ));
            let through_main = field(k, &["pps", "st"], "jsonpath={.status.observedGeneration}");
            format!(
                "{main}, observedGeneration after a main-resource patch: {:?}",
                through_main != "42"
            )
        }),
        ("printer columns of kubectl get", |k| {
            let pods = k.run(&["get", "pods", "-n", NS, "sel-a"]);
            let pps = k.run(&["get", "pps", "-n", NS, "st"]);
            let header = |t: &str| {
                t.lines()
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            format!("{} | {}", header(&pods), header(&pps))
        }),
    ]
}

/// Runs every probe against apisim and the real apiserver; panics on a divergence that is not
/// [`KNOWN`] or a known one that no longer diverges.
pub fn apisim_agrees_with_kube_apiserver(cluster: &Cluster) {
    let apisim = Apisim::start(cluster.bin());
    let sim = apisim.kubectl();
    let crd =
        std::fs::read_to_string(repo_root().join("deploy/crd.yaml")).expect("deploy/crd.yaml");
    sim.apply(&crd);
    let namespace = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n");
    sim.apply(&namespace);
    cluster.apply(&namespace);
    let mut outcomes: BTreeMap<&str, (String, String)> = BTreeMap::new();
    for (name, probe) in probes() {
        outcomes.insert(name, (probe(cluster), probe(sim)));
    }
    let mut report = String::new();
    let mut unexpected = Vec::new();
    for (name, (real, simulated)) in &outcomes {
        let differs = real != simulated;
        let known = KNOWN.iter().any(|(k, _)| k == name);
        report.push_str(&format!(
            "{} {name}\n    kube-apiserver: {real}\n    apisim:         {simulated}\n",
            if differs { "DIFFERS" } else { "same   " }
        ));
        if differs != known {
            unexpected.push(*name);
        }
    }
    eprintln!("apisim beside kube-apiserver:\n{report}");
    assert!(
        unexpected.is_empty(),
        "apisim vs kube-apiserver: {unexpected:?} changed (a new divergence, or a known one gone):\n{report}"
    );
    cluster.run(&["delete", "namespace", NS, "--wait=false"]);
}
