//! The alerting rules and the Grafana dashboard query metrics that exist: every `ipkeep_…` name
//! in an expression of the shipped PrometheusRule (`deploy/monitoring/prometheus-rule.yaml`,
//! rendered from the chart) and of the dashboard (`charts/ipkeep/dashboards/ipkeep.json`) is
//! served by the `/metrics` of a real binary just started: `ipkeep-controller` and
//! `ipkeep-scheduler-ext` against a real kube-apiserver (`ipkeep_tests::apiserver`), and
//! `ipkeep-agent`. A misspelt metric, or one a binary serves only after some event, makes an
//! alert that never fires and a panel that stays empty; here it fails.
//!
//! A real Prometheus (built from its module by `scripts/promtool-build.sh --server`) scrapes the
//! three and evaluates the shipped rules: on binaries just started nothing fires that the setup
//! does not explain, and every series an alert or a panel names has data.
//!
//! prometheus-client writes a labelled family only once it has a series, so each binary creates
//! its known series at zero when it starts; the agent's per-network ones come with a network
//! (one pod's ADD and DEL here, then a sweep).
#![allow(clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "availability/clients.rs"]
mod clients;
#[allow(dead_code)]
#[path = "availability/servers.rs"]
mod servers;

use std::collections::{BTreeMap, BTreeSet};

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::cluster::repo_root;
use ipkeep_tests::prometheus::{Prometheus, named_metrics};
use ipkeep_tests::promql::{metric_names, served_names};
use ipkeep_tests::{Invocation, ipkeep_bin, with_agent_socket};
use serde_json::Value;

use servers::{Controller, SchedulerExt, api_server, metrics};

/// Every query of the shipped rules and the dashboard: (where, expression).
fn queries() -> Vec<(String, String)> {
    let rule = std::fs::read_to_string(repo_root().join("deploy/monitoring/prometheus-rule.yaml"))
        .expect("deploy/monitoring/prometheus-rule.yaml");
    let rule: Value = serde_saphyr::from_str(&rule).expect("the PrometheusRule is YAML");
    let mut queries = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for r in group["rules"].as_array().expect("rules") {
            queries.push((
                format!(
                    "alert {}",
                    r["alert"].as_str().unwrap_or("(a recording rule)")
                ),
                r["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    let dashboard =
        std::fs::read_to_string(repo_root().join("charts/ipkeep/dashboards/ipkeep.json"))
            .expect("charts/ipkeep/dashboards/ipkeep.json");
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        // A collapsed row holds its panels.
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push((
                format!("dashboard panel {}", panel["title"]),
                target["expr"]
                    .as_str()
                    .expect("a target's expr")
                    .to_string(),
            ));
        }
    }
    queries
}

/// The metrics each query names that none of `served` are, with the query's place.
fn unknown(queries: &[(String, String)], served: &BTreeSet<String>) -> BTreeMap<String, String> {
    queries
        .iter()
        .flat_map(|(at, expr)| metric_names(expr).into_iter().map(move |n| (n, at.clone())))
        .filter(|(name, _)| !served.contains(name))
        .collect()
}

#[test]
fn the_queries_are_found() {
    let queries = queries();
    let alerts = queries
        .iter()
        .filter(|(at, _)| at.starts_with("alert "))
        .count();
    let panels = queries.len() - alerts;
    assert!(
        alerts >= 15 && panels >= 30,
        "{alerts} alerts, {panels} panel queries"
    );
    let metrics_md =
        std::fs::read_to_string(repo_root().join("docs/metrics.md")).expect("docs/metrics.md");
    for (at, expr) in &queries {
        let names = metric_names(expr);
        // IpkeepComponentDown reads Prometheus's own `up` of ipkeep's targets.
        let scrape_health = expr.starts_with("up{component=");
        assert!(
            !names.is_empty() || scrape_health,
            "{at} names no ipkeep metric: {expr}"
        );
        for name in names {
            assert!(
                described(&metrics_md, &name),
                "{at}: docs/metrics.md does not describe {name}"
            );
        }
    }
}

/// Whether docs/metrics.md names a metric: as queried, as its family (without the suffix of a
/// counter or histogram sample), or as `…_rest` in a row of metrics that shares its prefix.
fn described(metrics_md: &str, name: &str) -> bool {
    let family = ["_total", "_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    let shortened = [
        "ipkeep_controller_",
        "ipkeep_scheduler_ext_",
        "ipkeep_agent_",
    ]
    .iter()
    .find_map(|prefix| family.strip_prefix(prefix))
    .map(|rest| format!("…_{rest}"));
    [Some(family.to_string()), shortened]
        .into_iter()
        .flatten()
        .any(|f| {
            metrics_md.contains(&format!("`{f}`")) || metrics_md.contains(&format!("`{f}_total`"))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_name_is_served_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = api_server("monitoring", dir.path()).await else {
        return;
    };
    let ext = SchedulerExt::start(&server, dir.path()).await;
    let controller = Controller::start(&server, dir.path(), 1024).await;
    let data = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        data.path(),
        AgentOptions {
            args: vec!["--sweep-interval".into(), "1s".into()],
            ..AgentOptions::default()
        },
    );
    // The agent's per-network series come with a network: one StatefulSet pod's ADD and DEL
    // (its address then held), and a sweep.
    let conf = with_agent_socket(
        &format!(
            r#"{{"cniVersion":"1.0.0","name":"monitoring","ipam":{{"type":"ipkeep","dataDir":"{}","retention":"1h","ranges":[[{{"subnet":"10.61.0.0/24"}}]]}}}}"#,
            data.path().display()
        ),
        agent.socket(),
    );
    for command in ["ADD", "DEL"] {
        let out = Invocation::new(command, "db-0-sandbox")
            .args("K8S_POD_NAMESPACE=monitoring;K8S_POD_NAME=db-0")
            .run(&ipkeep_bin(), &conf);
        assert!(out.ok(), "{command}: {out:?}");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !agent.metrics().contains("ipkeep_agent_held_addresses{")
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    let mut served = BTreeSet::new();
    let agent_text = agent.metrics();
    for (binary, prefix, text) in [
        (
            "ipkeep-controller",
            "ipkeep_controller",
            metrics(controller.listen).await,
        ),
        (
            "ipkeep-scheduler-ext",
            "ipkeep_scheduler_ext",
            ext.metrics().await,
        ),
        ("ipkeep-agent", "ipkeep_agent", agent_text.clone()),
    ] {
        let names = served_names(&text);
        assert!(!names.is_empty(), "{binary} serves no metric:\n{text}");
        served.extend(names);
        // What every binary serves besides its own (issue 41: build_info, process metrics).
        let version = env!("CARGO_PKG_VERSION");
        for series in [
            format!("{prefix}_build_info{{version=\"{version}\"}} 1"),
            "process_cpu_seconds_total ".to_string(),
            "process_resident_memory_bytes ".to_string(),
            "process_start_time_seconds ".to_string(),
            "process_open_fds ".to_string(),
            "process_max_fds ".to_string(),
        ] {
            assert!(text.contains(&series), "{binary} does not serve {series:?}");
        }
    }
    // A count that only grows is a counter (issue 41): the plugin's fallbacks.
    assert!(
        agent_text.contains("# TYPE ipkeep_agent_plugin_fallback_commands counter")
            && agent_text
                .contains("ipkeep_agent_plugin_fallback_commands_total{network=\"monitoring\"} 0"),
        "the agent's fallback count is not a counter:\n{agent_text}"
    );

    // A real Prometheus scrapes the three and evaluates the shipped rules: nothing fires that
    // this setup does not explain, and every series the rules and the dashboard name has data.
    let target = |component: &str, addr: std::net::SocketAddr| serde_json::json!({"targets": [addr.to_string()], "labels": {"component": component}});
    let prometheus = Prometheus::start(serde_json::json!([{
        "job_name": "ipkeep",
        "static_configs": [
            target("ipkeep-controller", controller.listen),
            target("ipkeep-scheduler-ext", ext.probes),
            target("ipkeep-agent", agent.probe_address().expect("the agent's probe port")),
        ],
    }]));
    ipkeep_tests::cluster::wait_until(
        "the three targets up in Prometheus",
        std::time::Duration::from_secs(60),
        || {
            let t = prometheus.targets();
            (t.len() == 3 && t.iter().all(|(_, _, h)| h == "up")).then_some(())
        },
    );
    // Every cut `for:` (10 s) over, twice.
    tokio::time::sleep(std::time::Duration::from_secs(25)).await;
    let firing: Vec<String> = prometheus.firing().into_iter().map(|(n, _)| n).collect();
    assert!(
        firing.iter().all(|n| n == "IpkeepAgentNotSynced"),
        "alerts fire on the binaries just started (IpkeepAgentNotSynced alone is expected: this \
         agent runs without Kubernetes): {firing:?}"
    );
    let lasted = "10m";
    let missing: Vec<String> = named_metrics()
        .into_iter()
        .filter(|name| {
            prometheus
                .query(&format!(
                    "count(count_over_time({{__name__=\"{name}\"}}[{lasted}]))"
                ))
                .is_empty()
        })
        .collect();
    assert!(missing.is_empty(), "no data in Prometheus for {missing:?}");
    drop(prometheus);

    let queries = queries();
    let unknown = unknown(&queries, &served);
    assert!(
        unknown.is_empty(),
        "queried but not served at startup by any binary (misspelt, or registered late):\n{}\nserved: {served:#?}",
        unknown
            .iter()
            .map(|(name, at)| format!("  {name} ({at})"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let named: BTreeSet<String> = queries.iter().flat_map(|(_, e)| metric_names(e)).collect();
    println!(
        "{} queries name {} metrics, all among the {} the three binaries serve",
        queries.len(),
        named.len(),
        served.len()
    );
}
