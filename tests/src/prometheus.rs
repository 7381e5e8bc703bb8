//! A real Prometheus for the tests: the server `scripts/promtool-build.sh --server` builds from
//! the Prometheus module, started on loopback with a configuration and the shipped rules
//! (deploy/monitoring/prometheus-rule.yaml), and asked through its HTTP API. Stopped when
//! dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::{repo_root, wait_until};
use crate::promql::metric_names;

/// The Prometheus server of `scripts/promtool-build.sh --server` (built once, then cached).
pub fn binary() -> PathBuf {
    let out = Command::new(repo_root().join("scripts/promtool-build.sh"))
        .args(["--server", "--print-dir"])
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/promtool-build.sh");
    assert!(
        out.status.success(),
        "scripts/promtool-build.sh --server failed"
    );
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("the cache directory")
        .trim()
        .to_string();
    PathBuf::from(dir).join("bin/prometheus")
}

/// The shipped rule groups, each rule's `for:` cut to 10 s.
pub fn shipped_rules() -> Value {
    let text = std::fs::read_to_string(repo_root().join("deploy/monitoring/prometheus-rule.yaml"))
        .expect("the PrometheusRule");
    let rule: Value = serde_saphyr::from_str(&text).expect("YAML");
    let mut groups = rule["spec"]["groups"].clone();
    for group in groups.as_array_mut().expect("groups") {
        for r in group["rules"].as_array_mut().expect("rules") {
            if r.get("for").is_some() {
                r["for"] = json!("10s");
            }
        }
    }
    json!({ "groups": groups })
}

/// Every `ipkeep_…` metric the shipped alerts and the dashboard query.
pub fn named_metrics() -> Vec<String> {
    let mut exprs: Vec<String> = shipped_rules()["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["expr"].as_str().map(String::from))
        .collect();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("charts/ipkeep/dashboards/ipkeep.json"))
            .expect("the dashboard"),
    )
    .expect("JSON");
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.extend(target["expr"].as_str().map(String::from));
        }
    }
    let mut names: Vec<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    names.sort();
    names.dedup();
    names
}

/// Prometheus on the host, stopped when dropped.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Prometheus {
    /// Prometheus scraping with `scrape_configs` every 5 s and evaluating [`shipped_rules`]
    /// as often.
    pub fn start(scrape_configs: Value) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = json!({
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s",
                       "scrape_timeout": "4s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": scrape_configs,
        });
        // JSON is YAML.
        std::fs::write(dir.path().join("prometheus.yml"), config.to_string()).expect("write");
        std::fs::write(dir.path().join("rules.yaml"), shipped_rules().to_string()).expect("write");
        let addr: SocketAddr = format!("127.0.0.1:{}", crate::free_port())
            .parse()
            .expect("an address");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new(binary())
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, addr, dir };
        wait_until("Prometheus ready", Duration::from_secs(60), || {
            p.try_get("/-/ready").filter(|b| b.contains("Ready"))
        });
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The body of GET `path`, if the answer is 200.
    pub fn try_get(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200")
            .then(|| body.to_string())
            .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
    }

    pub fn api(&self, path: &str) -> Value {
        let body = self
            .try_get(path)
            .unwrap_or_else(|| panic!("GET {path} failed; Prometheus' log:\n{}", self.log()));
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    pub fn query(&self, promql: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(promql)));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// The active targets: (component label, instance, health).
    pub fn targets(&self) -> Vec<(String, String, String)> {
        let data = self.api("/api/v1/targets?state=active");
        let label = |t: &Value, k: &str| t["labels"][k].as_str().unwrap_or_default().to_string();
        (data["activeTargets"].as_array().into_iter().flatten())
            .map(|t| {
                (
                    label(t, "component"),
                    label(t, "instance"),
                    t["health"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// The alerts firing now, by name (with their labels).
    pub fn firing(&self) -> Vec<(String, Value)> {
        let data = self.api("/api/v1/alerts");
        (data["alerts"].as_array().into_iter().flatten())
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                let name = a["labels"]["alertname"].as_str().unwrap_or_default();
                (name.to_string(), a["labels"].clone())
            })
            .collect()
    }

    /// Waits until `alert` fires with `labels` among its labels; returns how long it took.
    pub fn wait_firing(&self, alert: &str, labels: &[(&str, &str)], secs: u64) -> Duration {
        let t0 = Instant::now();
        wait_until(
            &format!("alert {alert} {labels:?} firing"),
            Duration::from_secs(secs),
            || {
                self.firing()
                    .iter()
                    .any(|(name, l)| name == alert && labels.iter().all(|(k, v)| l[*k] == *v))
                    .then_some(())
            },
        );
        t0.elapsed()
    }
}
