//! Kubernetes' own conformance tests with ipkeep managing every StatefulSet they create: a focused
//! subset of `scripts/conformance.sh` (which runs them all; docs/conformance.md), on a real-node
//! cluster of its own. The subset: the StatefulSet test that rebuilds every pod (rolling update
//! and roll back of the template) and the granular HTTP checks between pods and from nodes to
//! pods. Beyond upstream's verdicts, it checks ipkeep's part: PersistentPodStates were generated
//! for the tests' StatefulSets, and every rebuilt pod came back on its node with its IP.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use ipkeep_tests::{cluster::repo_root, require_root};

const FOCUS: &str = r"\[sig-apps\] StatefulSet Basic StatefulSet functionality \[StatefulSetBasic\] should perform rolling updates and roll backs of template modifications \[Conformance\]|\[sig-network\] Networking Granular Checks: Pods should function for (intra-pod|node-pod) communication: http";

/// The number after `word` in a line of the summary ("passed: 3; failed: 0", "passed" -> 3).
fn count(line: &str, word: &str) -> usize {
    let words: Vec<&str> = line
        .split([' ', ';', ':'])
        .filter(|w| !w.is_empty())
        .collect();
    let at = words
        .iter()
        .position(|w| *w == word)
        .unwrap_or_else(|| panic!("no {word:?} in {line:?}"));
    words[at + 1].parse().unwrap()
}

#[test]
fn conformance_subset_with_every_statefulset_managed() {
    if !require_root("conformance_subset_with_every_statefulset_managed")
        || !ipkeep_tests::cluster::require_go("conformance_subset_with_every_statefulset_managed")
    {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("results");
    // Ports of their own below the ephemeral range, as for the other cluster tests.
    let port_base = (22000 + (std::process::id() % 900) * 10).to_string();
    let status = Command::new(repo_root().join("scripts/conformance.sh"))
        .arg("--state")
        .arg(work.path().join("cluster"))
        .arg("--out")
        .arg(&out)
        .args([
            "--focus",
            FOCUS,
            "--keep-logs",
            "--",
            "--port-base",
            &port_base,
        ])
        .status()
        .unwrap();
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap_or_default();
    assert!(
        status.success(),
        "scripts/conformance.sh failed:\n{summary}"
    );
    let verdict = summary
        .lines()
        .find(|l| l.starts_with("passed:"))
        .unwrap_or_else(|| panic!("no verdict in:\n{summary}"));
    assert_eq!(count(verdict, "passed"), 3, "{summary}");
    assert_eq!(count(verdict, "failed"), 0, "{summary}");
    let pps = summary
        .lines()
        .find(|l| l.starts_with("PersistentPodStates generated"))
        .unwrap();
    assert!(
        count(pps, "run") >= 1,
        "no PersistentPodState generated:\n{summary}"
    );
    let rebuilds = summary
        .lines()
        .find(|l| l.starts_with("StatefulSet pods:"))
        .unwrap();
    // The rolling update rebuilds each of its 3 pods at least twice (update, roll back).
    assert!(count(rebuilds, "rebuilds") >= 6, "{summary}");
    assert_eq!(count(rebuilds, "moved"), 0, "{summary}");
    assert_eq!(
        count(rebuilds, "IP"),
        count(rebuilds, "rebuilds"),
        "{summary}"
    );
}
