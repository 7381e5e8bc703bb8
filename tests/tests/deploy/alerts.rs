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

/// The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as `-`.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Issue 41 (gap 9): Alertmanager can route every alert (`severity`) and say what it is and what
/// to do (`summary`, `description`, `runbook_url` into a section of docs/troubleshooting.md that
/// exists).
#[test]
fn every_alert_can_be_routed_and_points_to_its_runbook() {
    let troubleshooting = std::fs::read_to_string(repo_root().join("docs/troubleshooting.md"))
        .expect("docs/troubleshooting.md");
    let anchors: Vec<String> = troubleshooting
        .lines()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .map(anchor)
        .collect();
    let base = "https://github.com/ipkeep/ipkeep/blob/main/docs/troubleshooting.md#";
    let rule = find("PrometheusRule", "ipkeep");
    let rules = rule.value["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules");
    for r in rules {
        let alert = r["alert"].as_str().expect("an alert");
        let severity = r["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{alert}: severity {severity:?}"
        );
        for key in ["summary", "description"] {
            let text = r["annotations"][key].as_str().unwrap_or_default();
            assert!(text.len() >= 20, "{alert}: {key} {text:?}");
        }
        let url = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
        let section = url
            .strip_prefix(base)
            .unwrap_or_else(|| panic!("{alert}: runbook_url {url:?} is not a section of {base}"));
        assert!(
            anchors.iter().any(|a| a == section),
            "{alert}: docs/troubleshooting.md has no section #{section}"
        );
    }
}
