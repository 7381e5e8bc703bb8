//! The alerting rules: `deploy/monitoring/prometheus-rule.yaml` is docs/metrics.md's "Suggested
//! alerts", rule for rule, and every metric an expression names is one a binary registers (an
//! alert on a misspelt metric never fires), and that docs/metrics.md describes. Whether each expression is valid PromQL is checked
//! by scripts/validate-deploy.sh (promql-parser).

use std::collections::BTreeSet;

use serde_json::Value;

use super::manifests::{find, repo_root};

/// The YAML block under "## Suggested alerts" in docs/metrics.md.
fn documented() -> Value {
    let text = std::fs::read_to_string(repo_root().join("docs/metrics.md")).expect("metrics.md");
    let section = text
        .split_once("## Suggested alerts")
        .expect("a Suggested alerts section")
        .1;
    let block = section
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a yaml block")
        .0;
    serde_saphyr::from_str(block).expect("the block is YAML")
}

/// The names each binary registers (`registry.register("name", …)` in its metrics module, and
/// the listener's under every binary's prefix), with the binary's prefix.
fn registered() -> BTreeSet<String> {
    let names_in = |file: &str| -> Vec<String> {
        let text = std::fs::read_to_string(repo_root().join(file)).expect("a metrics module");
        text.split(".register(")
            .skip(1)
            .filter_map(|rest| rest.trim_start().strip_prefix('"')?.split_once('"'))
            .map(|(name, _)| name.to_string())
            .collect()
    };
    let listener = names_in("crates/listener/src/metrics.rs");
    let mut names = BTreeSet::new();
    for (prefix, file) in [
        ("ipkeep_controller", "controller/src/metrics.rs"),
        ("ipkeep_scheduler_ext", "scheduler-ext/src/metrics.rs"),
        ("ipkeep_agent", "cni/agent/src/metrics.rs"),
    ] {
        for name in names_in(file).iter().chain(&listener) {
            names.insert(format!("{prefix}_{name}"));
        }
    }
    names
}

/// A metric name on the wire without the suffix its type adds.
fn family(name: &str) -> &str {
    ["_total", "_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// The `ipkeep_…` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("ipkeep_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.push(expr[start..end].to_string());
        i = end;
    }
    names
}

#[test]
fn the_shipped_rules_are_the_documented_alerts() {
    let rule = find("PrometheusRule", "ipkeep");
    assert_eq!(
        rule.value["spec"]["groups"],
        documented()["groups"],
        "deploy/monitoring/prometheus-rule.yaml and docs/metrics.md (Suggested alerts) differ"
    );
}

#[test]
fn every_alert_names_metrics_the_binaries_export() {
    let registered = registered();
    assert!(
        registered.contains("ipkeep_scheduler_ext_connections_refused")
            && registered.contains("ipkeep_controller_leader")
            && registered.contains("ipkeep_agent_free_addresses"),
        "{registered:?}"
    );
    let doc = documented();
    let metrics_md =
        std::fs::read_to_string(repo_root().join("docs/metrics.md")).expect("metrics.md");
    let mut alerts = 0;
    for group in doc["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "{}: names no ipkeep metric",
                rule["alert"]
            );
            for name in names {
                assert!(
                    metrics_md.contains(family(&name)),
                    "{}: docs/metrics.md does not describe {name}",
                    rule["alert"]
                );
                assert!(
                    registered.contains(family(&name)) || registered.contains(&name),
                    "{}: no binary exports {name}",
                    rule["alert"]
                );
            }
            alerts += 1;
        }
    }
    assert!(alerts >= 15, "{alerts} alerts");
    for must in [
        "IpkeepConnectionsTurnedAway",
        "IpkeepSchedulerExtBusy",
        "IpkeepSchedulerExtCertificateExpiresSoon",
    ] {
        assert!(
            doc["groups"][0]["rules"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["alert"] == must)),
            "{must} is missing"
        );
    }
}
