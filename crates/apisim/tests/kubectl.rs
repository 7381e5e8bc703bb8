//! apisim driven by real kubectl (client-go): the `apisim` binary is started as a process and
//! kubectl talks to it through the kubeconfig it writes. Skipped, loudly, where kubectl is not
//! installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

struct Apisim {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Apisim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Apisim {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let child = Command::new(env!("CARGO_BIN_EXE_apisim"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--bookmark-interval",
                "1s",
                "--log",
                "warn",
            ])
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !kubeconfig.exists() {
            assert!(
                Instant::now() < deadline,
                "apisim did not write its kubeconfig"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, dir }
    }

    fn command(&self, kubectl: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(kubectl);
        command
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args);
        command
    }

    fn run(&self, kubectl: &Path, args: &[&str]) -> Output {
        self.command(kubectl, args).output().unwrap()
    }

    /// Runs kubectl and insists on success; returns stdout.
    fn ok(&self, kubectl: &Path, args: &[&str]) -> String {
        let out = self.run(kubectl, args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, kubectl: &Path, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(kubectl, &args)).unwrap()
    }
}

fn fixture(name: &str) -> String {
    format!("{FIXTURES}/{name}")
}

/// The default kubectl, or None (with a message) when it is not installed.
fn kubectl() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("kubectl"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        eprintln!("SKIPPED: kubectl is not installed (not on PATH); the kubectl suite needs it");
    }
    found
}

/// Lines a long-running kubectl prints, as they come.
fn lines_of(mut child: Child) -> (Child, mpsc::Receiver<String>) {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn wait_for_line(rx: &mpsc::Receiver<String>, wanted: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            let found = line.contains(wanted);
            seen.push(line);
            if found {
                return seen;
            }
        }
    }
    panic!("never saw {wanted:?}; saw {seen:?}");
}

#[test]
fn kubectl_registers_a_crd_and_manages_custom_resources() {
    let Some(kubectl) = kubectl() else { return };
    let k = kubectl.as_path();
    let sim = Apisim::start();
    k8s_ok_version(&sim, k);

    sim.ok(k, &["apply", "-f", &fixture("namespace-db.yaml")]);
    sim.ok(k, &["apply", "-f", &fixture("pps-crd.yaml")]);
    let crd = sim.json(k, &["get", "crd", "persistentpodstates.ipkeep.dev"]);
    assert_eq!(crd["status"]["acceptedNames"]["shortNames"][0], "pps");
    assert!(
        sim.ok(k, &["api-resources", "--api-group=ipkeep.dev"])
            .contains("pps")
    );

    // create/apply validate server-side (OpenAPI v3 with fieldValidation), defaults apply.
    assert!(
        sim.ok(k, &["apply", "-f", &fixture("pps-pg.yaml")])
            .contains("created")
    );
    let pps = sim.json(k, &["-n", "db", "get", "pps", "pg"]);
    assert_eq!(
        pps["spec"]["persistentPodStateRetentionPolicy"],
        "WhenScaled"
    );
    assert_eq!(pps["metadata"]["generation"], 1);

    // The table has the CRD's printer columns.
    let table = sim.ok(k, &["-n", "db", "get", "pps"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "TARGET", "POLICY", "READY", "AGE"]);
    assert!(table.lines().nth(1).unwrap().starts_with("pg "), "{table}");

    // Strict validation: unknown fields and schema violations are refused with the field.
    let bad = sim.run(
        k,
        &[
            "-n",
            "db",
            "patch",
            "pps",
            "pg",
            "--type=merge",
            "-p",
            r#"{"spec":{"persistentPodStateRetentionPolicy":"Sometimes"}}"#,
        ],
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("spec.persistentPodStateRetentionPolicy"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // get -w sees updates made by others.
    let watch = sim
        .command(
            k,
            &[
                "-n",
                "db",
                "get",
                "pps",
                "pg",
                "-w",
                "-o",
                "jsonpath={.spec.targetRef.name}{\"\\n\"}",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut watch, lines) = lines_of(watch);
    wait_for_line(&lines, "pg");
    // kubectl wait --for=condition=Ready blocks on a watch until the status says so.
    let waiter = sim
        .command(
            k,
            &[
                "-n",
                "db",
                "wait",
                "--for=condition=Ready",
                "pps/pg",
                "--timeout=30s",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    sim.ok(
        k,
        &[
            "-n",
            "db",
            "patch",
            "pps",
            "pg",
            "--type=merge",
            "-p",
            r#"{"spec":{"targetRef":{"name":"pg-renamed"}}}"#,
        ],
    );
    wait_for_line(&lines, "pg-renamed");
    watch.kill().unwrap();
    let _ = watch.wait();
    assert_eq!(
        sim.json(k, &["-n", "db", "get", "pps", "pg"])["metadata"]["generation"],
        2
    );

    // Status goes through the subresource only.
    sim.ok(
        k,
        &[
            "-n",
            "db",
            "patch",
            "pps",
            "pg",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
        ],
    );
    let waited = waiter.wait_with_output().unwrap();
    assert!(
        waited.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    assert!(String::from_utf8_lossy(&waited.stdout).contains("condition met"));
    let ignored = sim.run(
        k,
        &[
            "-n",
            "db",
            "patch",
            "pps",
            "pg",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[{"type":"Ready","status":"False"}]}}"#,
        ],
    );
    assert!(ignored.status.success());
    assert_eq!(
        sim.json(k, &["-n", "db", "get", "pps", "pg"])["status"]["conditions"][0]["status"],
        "True"
    );

    // Server-side apply: a field kubectl-patch set conflicts, until forced.
    let applied = format!("{FIXTURES}/pps-pg.yaml");
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("pps.yaml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(&applied)
            .unwrap()
            .replace("name: pg}", "name: other}"),
    )
    .unwrap();
    let conflict = sim.run(
        k,
        &[
            "apply",
            "--server-side",
            "-f",
            changed.to_str().unwrap(),
            "--field-manager=ops",
        ],
    );
    assert!(!conflict.status.success());
    assert!(
        String::from_utf8_lossy(&conflict.stderr).contains("conflict"),
        "{}",
        String::from_utf8_lossy(&conflict.stderr)
    );
    sim.ok(
        k,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            changed.to_str().unwrap(),
            "--field-manager=ops",
        ],
    );
    let pps = sim.json(
        k,
        &["-n", "db", "get", "pps", "pg", "--show-managed-fields"],
    );
    assert_eq!(pps["spec"]["targetRef"]["name"], "other");
    let managers: Vec<&str> = pps["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(managers.contains(&"ops"), "{managers:?}");

    // Delete with a finalizer: Terminating until the finalizer is removed.
    sim.ok(
        k,
        &[
            "-n",
            "db",
            "patch",
            "pps",
            "pg",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["ipkeep.dev/test"]}}"#,
        ],
    );
    sim.ok(k, &["-n", "db", "delete", "pps", "pg", "--wait=false"]);
    let terminating = sim.json(k, &["-n", "db", "get", "pps", "pg"]);
    assert!(terminating["metadata"]["deletionTimestamp"].is_string());
    sim.ok(
        k,
        &[
            "-n",
            "db",
            "patch",
            "pps",
            "pg",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
    );
    let gone = sim.run(k, &["-n", "db", "get", "pps", "pg"]);
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );

    // Delete without finalizers (kubectl waits for it to be gone).
    sim.ok(k, &["apply", "-f", &fixture("pps-pg.yaml")]);
    assert!(
        sim.ok(k, &["-n", "db", "delete", "pps", "pg"])
            .contains("deleted")
    );
    assert!(
        sim.ok(k, &["-n", "db", "get", "pps", "-o", "name"])
            .trim()
            .is_empty()
    );
}

fn k8s_ok_version(sim: &Apisim, k: &Path) {
    let version = sim.ok(k, &["version", "-o", "json"]);
    let version: Value = serde_json::from_str(&version).unwrap();
    assert_eq!(version["serverVersion"]["major"], "1");
}

#[test]
fn every_installed_kubectl_version_creates_applies_gets_and_deletes() {
    let dir = Path::new("/usr/lib/google-cloud-sdk/bin");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("kubectl.1."))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    if versions.is_empty() {
        eprintln!("SKIPPED: no versioned kubectl under {}", dir.display());
        return;
    }
    for k in &versions {
        let sim = Apisim::start();
        // kubectl before 1.29 validates through OpenAPI v2 (protobuf only), which apisim does
        // not serve; those versions run with client validation off (the crate docs say so).
        let minor: u32 = k
            .to_string_lossy()
            .rsplit('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let validate = if minor < 29 {
            "--validate=false"
        } else {
            "--validate=strict"
        };
        sim.ok(
            k,
            &["create", validate, "-f", &fixture("namespace-db.yaml")],
        );
        sim.ok(k, &["create", validate, "-f", &fixture("pod.yaml")]);
        let pod = sim.json(k, &["-n", "db", "get", "pod", "pg-0"]);
        assert_eq!(pod["status"]["phase"], "Pending", "{}", k.display());
        sim.ok(k, &["apply", validate, "-f", &fixture("pod.yaml")]);
        sim.ok(k, &["-n", "db", "label", "pod", "pg-0", "role=primary"]);
        let listed = sim.ok(
            k,
            &[
                "-n",
                "db",
                "get",
                "pods",
                "-l",
                "role=primary",
                "-o",
                "name",
            ],
        );
        assert_eq!(listed.trim(), "pod/pg-0", "{}", k.display());
        sim.ok(k, &["-n", "db", "delete", "pod", "pg-0"]);
        assert!(
            sim.ok(k, &["-n", "db", "get", "pods", "-o", "name"])
                .trim()
                .is_empty(),
            "{}",
            k.display()
        );
    }
}
