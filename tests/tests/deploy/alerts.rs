//! The alerting rules: `deploy/monitoring/prometheus-rule.yaml` is docs/metrics.md's "Suggested
//! alerts", rule for rule. That every metric an expression names is served by a binary, and
//! described in docs/metrics.md, is tests/tests/monitoring.rs; that each expression is valid
//! PromQL, scripts/validate-deploy.sh (promql-parser, promtool).

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
fn the_documented_alerts_include_the_attack_and_certificate_alerts() {
    let doc = documented();
    let rules = doc["groups"][0]["rules"].as_array().expect("rules");
    assert!(rules.len() >= 15, "{} alerts", rules.len());
    for must in [
        "IpkeepConnectionsTurnedAway",
        "IpkeepSchedulerExtBusy",
        "IpkeepSchedulerExtCertificateExpiresSoon",
    ] {
        assert!(
            rules.iter().any(|r| r["alert"] == must),
            "{must} is missing"
        );
    }
}
