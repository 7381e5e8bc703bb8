//! The short chaos soak CI runs (`ipkeep-soak`, docs/soak.md): a fixed seed, three real nodes,
//! dual-stack, three minutes of faults of every kind (the schedule injects each once first),
//! then settling; every invariant must hold. `scripts/soak.sh` runs longer ones by hand.

use std::process::Command;

use ipkeep_tests::{require_root, workspace_bin};

/// The seed CI runs; any other must pass as well (`scripts/soak.sh --seed N`).
const SEED: &str = "43";

#[test]
fn a_short_soak_of_every_fault_holds_every_invariant() {
    if !require_root("a_short_soak_of_every_fault_holds_every_invariant")
        || !ipkeep_tests::cluster::require_go("a_short_soak_of_every_fault_holds_every_invariant")
    {
        return;
    }
    let soak = workspace_bin(
        "ipkeep-soak",
        "IPKEEP_SOAK_BIN",
        &[
            "ipkeep-e2e",
            "ipkeep-cni",
            "ipkeep-agent",
            "ipkeep-controller",
            "ipkeep-scheduler-ext",
        ],
    );
    let work = tempfile::tempdir().expect("tempdir");
    let json = work.path().join("soak.json");
    // Ports of their own below the ephemeral range, apart from the e2e tests'.
    let port_base = (22000 + (std::process::id() % 900) * 10).to_string();
    let out = Command::new(&soak)
        .args(["--seed", SEED, "--duration", "3m", "--nodes", "3"])
        .args(["--ip-family", "dual", "--port-base", &port_base])
        .arg("--state")
        .arg(work.path().join("cluster"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run ipkeep-soak");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the soak failed:\n{text}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON summary")).expect("JSON");
    let kinds: Vec<&str> = summary["faults"]
        .as_array()
        .expect("faults")
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    for kind in [
        "kill-agent",
        "kill-controller-leader",
        "kill-controller-standby",
        "kill-scheduler-ext",
        "restart-runtime",
        "power-cycle",
        "restart-apiserver",
        "pause-etcd",
        "fill-store",
        "step-clock",
    ] {
        assert!(kinds.contains(&kind), "no {kind} among the faults:\n{text}");
    }
    let invariants = summary["invariants"].as_object().expect("invariants");
    for (name, i) in invariants {
        assert_eq!(i["violated"], 0, "{name} failed:\n{text}");
    }
    assert!(
        invariants["unique-addresses"]["checked"].as_u64() > Some(100),
        "too few samples:\n{text}"
    );
    assert!(
        summary["rebuilds"].as_u64() > Some(0),
        "no rebuild seen:\n{text}"
    );
    eprintln!("{text}");
}
