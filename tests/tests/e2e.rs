//! The whole system end to end: `ipkeep-demo` (the README's first command) run as a user runs
//! it — the in-memory API server, the simulators and ipkeep's real binaries as processes — and
//! its verdict checked. The scenario itself, with its expectations, is `crates/e2e`.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

use ipkeep_tests::{demo_bin, require_root};

/// Runs `ipkeep-demo args` and returns its output, failing with it on a non-zero exit.
/// One whole system at a time: each starts a dozen processes, and on a small CI machine two at
/// once starved each other's timed expectations.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn demo(args: &[&str]) -> String {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(demo_bin()).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    assert!(status.success(), "ipkeep-demo {args:?} failed:\n{text}");
    text
}

/// How many expectations held, from the verdict line; fails if any did not.
fn expectations_held(output: &str) -> usize {
    let line = output
        .lines()
        .find(|l| l.starts_with("all ") && l.ends_with(" expectations held"))
        .unwrap_or_else(|| panic!("no verdict in:\n{output}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn scenario_in_network_namespaces_needs_root() {
    let _turn = one_at_a_time();
    if !require_root("scenario_in_network_namespaces_needs_root") {
        return;
    }
    let out = demo(&[]);
    assert!(
        out.contains("network: real network namespaces"),
        "expected real namespaces as root:\n{out}"
    );
    // start (1) + delete pod (3) + node loss (4) + scale down (1) + scale up (1) + audit (≥ 6).
    assert!(expectations_held(&out) >= 16, "{out}");
    for row in [
        "delete pod  db-0",
        "lose node   db-2",
        "scale down  db-2",
        "scale up    db-2",
    ] {
        assert!(out.contains(row), "no table row {row:?}:\n{out}");
    }
}

#[test]
fn scenario_survives_restarts_of_every_component() {
    let _turn = one_at_a_time();
    let mut args = vec!["--restarts"];
    if !nix::unistd::Uid::effective().is_root() {
        args.push("--ipam-only");
    }
    let out = demo(&args);
    assert_eq!(
        out.matches(
            "restarted and ready again: controller-0, controller-1, scheduler-ext, agent-node-1"
        )
        .count(),
        2,
        "{out}"
    );
    assert!(expectations_held(&out) >= 16, "{out}");
}

/// `--kubeconfig` (the check users run against their cluster) against a system left up by
/// `--keep-running`: the same story through nothing but the Kubernetes API.
#[test]
fn kubeconfig_mode_runs_the_scenario_against_a_running_cluster() {
    let _turn = one_at_a_time();
    let work = tempfile::tempdir().unwrap();
    let mut cluster = Command::new(demo_bin())
        .args(["--keep-running", "--ipam-only", "--work-dir"])
        .arg(work.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in BufReader::new(cluster.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with("stop it with Ctrl-C") {
            break;
        }
    }
    assert!(
        seen.contains("export KUBECONFIG="),
        "the kept system never came up:\n{seen}"
    );
    let kubeconfig = work.path().join("kubeconfig");
    let out = demo(&["--kubeconfig", kubeconfig.to_str().unwrap()]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cluster.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = cluster.wait().unwrap();
    assert!(
        status.success(),
        "the kept system exited with {status}; what it printed before it was kept running:\n{seen}"
    );
    assert!(
        out.contains("node loss is shown on the local system only"),
        "{out}"
    );
    assert!(expectations_held(&out) >= 8, "{out}");
    assert!(out.contains("deleted namespace ipkeep-demo-"), "{out}");
}
