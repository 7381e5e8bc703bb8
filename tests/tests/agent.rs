//! The plugin through a live `ipkeep-agent` that is SIGKILLed again and again while plugin
//! processes keep arriving: every request still succeeds (through the fallback while the agent
//! is down), every acknowledged ADD is recorded, no address ever has two owners, and the
//! fallbacks are counted. Also: graceful shutdown finishes and releases the store, and the
//! metrics listener serves nothing but `/metrics`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::{Invocation, Rng, ipkeep_bin, list_json, with_agent_socket};

fn conf(data: &Path, socket: &Path) -> String {
    let base = format!(
        r#"{{"cniVersion":"1.0.0","name":"agentkill","ipam":{{"type":"ipkeep","dataDir":"{}","lockTimeout":"60s","retention":"1h","ranges":[[{{"subnet":"10.60.0.0/22"}}],[{{"subnet":"fd00:60::/112"}}]]}}}}"#,
        data.display()
    );
    with_agent_socket(&base, socket)
}

#[derive(Default)]
struct Ledger {
    /// Container → addresses of every ADD that reported success and was not deleted since.
    live: BTreeMap<String, Vec<String>>,
    /// Containers whose DEL reported success.
    deleted: BTreeSet<String>,
    failures: Vec<String>,
    ops: usize,
}

#[test]
fn agent_sigkilled_mid_requests_loses_nothing_and_plugins_fall_back() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut agent = Agent::start(data.path(), AgentOptions::default());
    let conf = Arc::new(conf(data.path(), agent.socket()));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let (conf, ledger, stop) = (conf.clone(), ledger.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut previous: Option<(String, String)> = None;
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Containers 2j and 2j+1 are two sandboxes of pod j: the first is deleted
                    // (its addresses held), then the second takes them back.
                    if let Some((old, old_args)) = previous.take() {
                        let out = Invocation::new("DEL", &old)
                            .args(&old_args)
                            .run(&ipkeep_bin(), &conf);
                        let mut l = ledger.lock().expect("ledger");
                        l.ops += 1;
                        if out.ok() {
                            l.live.remove(&old);
                            l.deleted.insert(old);
                        } else {
                            l.failures.push(format!("DEL {old}: {out:?}"));
                        }
                    }
                    let cid = format!("w{w}-{k}");
                    let args = format!("K8S_POD_NAMESPACE=kill;K8S_POD_NAME=pod-{w}-{}", k / 2);
                    let out = Invocation::new("ADD", &cid)
                        .args(&args)
                        .run(&ipkeep_bin(), &conf);
                    let mut l = ledger.lock().expect("ledger");
                    l.ops += 1;
                    if out.ok() {
                        l.live.insert(cid.clone(), out.ips());
                    } else {
                        l.failures.push(format!("ADD {cid}: {out:?}"));
                    }
                    drop(l);
                    if k % 2 == 0 {
                        previous = Some((cid, args));
                    }
                    k += 1;
                }
            })
        })
        .collect();
    let mut rng = Rng::from_env("agent_sigkilled_mid_requests");
    // `IPKEEP_AGENT_KILLS` (default 100) kills, each at a random moment under load.
    let kills: usize = std::env::var("IPKEEP_AGENT_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let started = std::time::Instant::now();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(20 + rng.below(200)));
        agent.kill();
        // The outage: plugins find a socket nobody listens on and serve themselves.
        std::thread::sleep(Duration::from_millis(rng.below(100)));
        agent.restart();
    }
    eprintln!("{kills} agent kills in {:.0?}", started.elapsed());
    // Long enough for the last agent to serve requests of its own.
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    let served_by_last = agent.metrics();
    assert!(
        (served_by_last.lines()).any(|l| l
            .strip_prefix(r#"ipkeep_agent_requests_total{command="ADD",outcome="ok"} "#)
            .is_some_and(|n| n != "0")),
        "the restarted agent serves again:\n{served_by_last}"
    );
    assert!(agent.terminate(), "graceful shutdown exits 0");

    let l = ledger.lock().expect("ledger");
    assert!(
        l.failures.is_empty(),
        "every request succeeds: {:#?}",
        l.failures
    );
    assert!(l.ops > 50, "enough traffic to matter: {}", l.ops);
    let fallbacks: u64 = std::fs::read_to_string(data.path().join("agentkill/fallbacks"))
        .expect("fallbacks were counted")
        .trim()
        .parse()
        .expect("a number");
    assert!(fallbacks > 0);

    // The store as `ipkeep list` sees it once the agent is gone (it released the lock).
    let list = list_json(data.path(), "agentkill");
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut active: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for lease in list["leases"].as_array().expect("leases") {
        let ip = lease["ip"].as_str().expect("ip").to_string();
        let cid = lease["owner"]["containerId"]
            .as_str()
            .expect("cid")
            .to_string();
        if lease["state"] == "active" {
            active.entry(cid.clone()).or_default().insert(ip.clone());
        }
        owners.entry(ip).or_default().push(cid);
    }
    assert!(
        owners.values().all(|o| o.len() == 1),
        "no address with two owners"
    );
    for (cid, ips) in &l.live {
        let want: BTreeSet<String> = ips.iter().cloned().collect();
        assert_eq!(
            active.get(cid),
            Some(&want),
            "acknowledged ADD of {cid} recorded"
        );
    }
    for cid in &l.deleted {
        assert!(
            !active.contains_key(cid),
            "{cid} was deleted but is still active"
        );
    }
    eprintln!(
        "{} requests, {} fallbacks, {} live containers, {} deleted",
        l.ops,
        fallbacks,
        l.live.len(),
        l.deleted.len()
    );
}

/// SIGTERM while a request waits in the agent for a network lock another process holds (a
/// plugin that fell back, say) for longer than the pod's grace: the agent exits within its
/// documented grace (`ipkeep_daemon::STOP_GRACE`, 20 s) anyway, instead of finishing the
/// request first (it once waited for the request's whole budget, here 60 s).
#[test]
fn sigterm_ends_the_agent_within_its_grace_whatever_its_requests_wait_for() {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let data = tempfile::tempdir().expect("tempdir");
    let mut agent = Agent::start(data.path(), AgentOptions::default());
    let network = data.path().join("stuck");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&network)
        .expect("network directory");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(network.join("lock"))
        .expect("lock file");
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .expect("hold the network's lock");
    let config = with_agent_socket(
        &format!(
            r#"{{"cniVersion":"1.0.0","name":"stuck","ipam":{{"type":"ipkeep","dataDir":"{}","lockTimeout":"60s","ranges":[[{{"subnet":"10.61.0.0/24"}}]]}}}}"#,
            data.path().display()
        ),
        agent.socket(),
    );
    let mut waiting = Invocation::new("ADD", "c-stuck").spawn(&ipkeep_bin(), &config);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        waiting.try_wait().expect("plugin").is_none(),
        "the ADD waits for the lock"
    );
    let started = std::time::Instant::now();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let exited = (0..250).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        agent.exited()
    });
    assert!(
        exited,
        "the agent still runs {:?} after SIGTERM",
        started.elapsed()
    );
    assert!(
        started.elapsed() < ipkeep_daemon::STOP_GRACE + Duration::from_secs(3),
        "stopped after {:?}",
        started.elapsed()
    );
    drop(held);
    let _ = waiting.kill();
    let _ = waiting.wait();
}

/// One plain-HTTP GET of `path` at `addr`: the whole answer.
fn get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    text
}

/// Issue 41 and security review L-4: `--metrics-listen` (the node's IP, for Prometheus) serves
/// `/metrics` and nothing else; the probes stay on `--probe-listen` (loopback).
#[test]
fn the_metrics_listener_serves_metrics_only() {
    let data = tempfile::tempdir().expect("tempdir");
    let port = ipkeep_tests::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.2:{port}").parse().expect("an address");
    let agent = Agent::start(
        data.path(),
        AgentOptions {
            args: vec!["--metrics-listen".into(), addr.to_string()],
            ..AgentOptions::default()
        },
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listens on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = get(addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("ipkeep_agent_build_info"), "{metrics}");
    for path in ["/healthz", "/readyz"] {
        let answer = get(addr, path);
        assert!(
            answer.starts_with("HTTP/1.1 404"),
            "{path} on {addr}: {answer}"
        );
        assert!(
            agent.get(path).starts_with("HTTP/1.1 200"),
            "{path} on the probe port"
        );
    }
}
