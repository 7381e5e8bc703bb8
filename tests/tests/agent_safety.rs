//! The node agent against requests a plugin would never send and stores larger than a test
//! usually builds: it serves only its own data directory (by any path to it), refuses what it
//! must not run so the plugin serves itself, and streams a report of any size.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::{Invocation, ipkeep_bin, store, with_agent_socket};

fn conf(data: &Path, socket: &Path, network: &str) -> String {
    let base = format!(
        r#"{{"cniVersion":"1.0.0","name":"{network}","ipam":{{"type":"ipkeep","dataDir":"{}","lockTimeout":"3s","ranges":[[{{"subnet":"10.70.0.0/16"}}]]}}}}"#,
        data.display()
    );
    with_agent_socket(&base, socket)
}

fn requests_served(agent: &Agent, command: &str) -> u64 {
    let metrics = agent.metrics();
    let key = format!(r#"ipkeep_agent_requests_total{{command="{command}",outcome="ok"}} "#);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Found by review: a plugin naming the data directory through a symlink made the agent wait
/// for its own lock, and every command failed with code 11 without falling back.
#[test]
fn a_data_directory_named_through_a_symlink_is_the_same_store() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&data, &link).expect("symlink");
    let agent = Agent::start(&data, AgentOptions::default());
    let direct = conf(&data, agent.socket(), "net");
    let via_link = conf(&link, agent.socket(), "net");
    let a = Invocation::new("ADD", "c1").run(&ipkeep_bin(), &direct);
    assert!(a.ok(), "{a:?}");
    let started = Instant::now();
    let b = Invocation::new("ADD", "c2").run(&ipkeep_bin(), &via_link);
    assert!(b.ok(), "through the symlink: {b:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no wait for its own lock"
    );
    assert_ne!(a.ips(), b.ips());
    assert_eq!(
        requests_served(&agent, "ADD"),
        2,
        "both served by the agent"
    );
    assert!(!data.join("net/fallbacks").exists(), "no fallback");
}

/// Found by review: the agent opened whatever `dataDir` a request named. It serves its own
/// `--data-dir` only; for any other the plugin serves itself, as without an agent.
#[test]
fn a_foreign_data_directory_is_refused_and_the_plugin_serves_itself() {
    let data = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let agent = Agent::start(data.path(), AgentOptions::default());
    let out =
        Invocation::new("ADD", "c1").run(&ipkeep_bin(), &conf(other.path(), agent.socket(), "net"));
    assert!(out.ok(), "{out:?}");
    assert_eq!(
        requests_served(&agent, "ADD"),
        0,
        "the agent did not run it"
    );
    assert!(
        other.path().join("net/leases.redb").is_file(),
        "the plugin wrote its own store"
    );
    assert!(
        !data.path().join("net").exists(),
        "nothing in the agent's data directory"
    );
}

/// Sends a raw request and returns the frames of the answer.
fn raw_request(socket: &Path, body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream.write_all(body).expect("send");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let mut frames = Vec::new();
    loop {
        match ipkeep_cni_frame(&mut stream) {
            Some(f) => frames.push(f),
            None => return frames,
        }
    }
}

fn ipkeep_cni_frame(stream: &mut UnixStream) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut payload = vec![0; len];
    stream.read_exact(&mut payload).ok()?;
    Some((head[0], payload))
}

/// Found by review: an interface name with a NUL (possible over the socket, never in a real
/// environment) collided the store's index keys. It is refused like any invalid name.
#[test]
fn an_interface_name_with_a_nul_is_refused() {
    let data = tempfile::tempdir().expect("tempdir");
    let agent = Agent::start(data.path(), AgentOptions::default());
    let config = conf(data.path(), agent.socket(), "net");
    let body = serde_json::json!({"version": 2, "cni": {"env": {
        "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0\u{0}x",
        "CNI_NETNS": "/run/netns/x", "CNI_PATH": "/opt/cni/bin"}, "config": config}});
    let frames = raw_request(agent.socket(), body.to_string().as_bytes());
    let stdout: Vec<u8> = frames
        .iter()
        .filter(|(t, _)| *t == b'o')
        .flat_map(|(_, p)| p.clone())
        .collect();
    let answer: serde_json::Value = serde_json::from_slice(&stdout).expect("a CNI error");
    assert_eq!(answer["code"], 4, "{answer}");
    assert_eq!(
        frames.last().map(|(t, p)| (*t, p.clone())),
        Some((b'x', 1i32.to_be_bytes().to_vec()))
    );
    assert!(!data.path().join("net").exists(), "nothing stored");
}

/// Writes `n` held leases into a fresh store of network `net`.
fn prefill(data: &Path, n: usize) {
    let first = Ipv4Addr::new(10, 70, 0, 2);
    let leases = (0..n)
        .map(|i| store::held_lease(store::nth_ip(first, i), i, "db", 1_700_000_000))
        .collect();
    store::write(data, "net", leases, 10_000, |_| {});
}

/// Found by review: `ipkeep list --json` through the agent failed at about 50,000 leases (the
/// answer was one JSON document over 16 MiB). It streams now, in constant memory.
#[test]
fn list_streams_sixty_thousand_leases_through_the_agent() {
    let data = tempfile::tempdir().expect("tempdir");
    prefill(data.path(), 60_000);
    let agent = Agent::start(data.path(), AgentOptions::default());
    let out = std::process::Command::new(ipkeep_bin())
        .arg("--agent-socket")
        .arg(agent.socket())
        .args(["list", "--json", "--network", "net", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("ipkeep list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.len() > 16 << 20, "{} bytes", out.stdout.len());
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let leases = list["leases"].as_array().expect("leases");
    assert_eq!(leases.len(), 60_000);
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for l in leases {
        *by_state
            .entry(l["state"].as_str().unwrap_or("").into())
            .or_default() += 1;
    }
    assert_eq!(by_state.get("held"), Some(&60_000));
    assert!(requests_served(&agent, "admin") >= 1, "served by the agent");
}

/// Logs written to a file or a pipe (a container runtime's log, `kubectl logs`) carry no
/// terminal colour codes, which would make them unreadable and ungreppable at 3 a.m.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let data = tempfile::tempdir().expect("tempdir");
    let agent = Agent::start(data.path(), AgentOptions::default());
    let out = Invocation::new("ADD", "colours")
        .args("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=db-0")
        .run(&ipkeep_bin(), &conf(data.path(), agent.socket(), "colours"));
    assert!(out.ok(), "{out:?}");
    let log = agent.log();
    assert!(!log.is_empty(), "the agent logged nothing");
    let coloured: Vec<&String> = log.iter().filter(|l| l.contains('\u{1b}')).collect();
    assert!(
        coloured.is_empty(),
        "escape codes in the agent's log: {coloured:?}"
    );
}

/// Found by review: one stray entry in the data directory (`notes.txt`, `net1.redb.bak`) was
/// taken for a store that cannot be opened, so `/healthz` failed for ever and the DaemonSet's
/// liveness probe restarted the agent about every 70 s. Entries that are not network stores are
/// ignored; `/healthz` says only that the agent serves.
#[test]
fn stray_entries_in_the_data_directory_are_not_stores() {
    let data = tempfile::tempdir().expect("tempdir");
    let direct = conf(data.path(), Path::new(""), "net1");
    let first = Invocation::new("ADD", "c1").run(&ipkeep_bin(), &direct);
    assert!(first.ok(), "{first:?}");
    std::fs::write(data.path().join("notes.txt"), "a note\n").expect("notes.txt");
    std::fs::copy(
        data.path().join("net1/leases.redb"),
        data.path().join("net1.redb.bak"),
    )
    .expect("a backup");
    std::fs::create_dir(data.path().join("old-net")).expect("an empty directory");
    let agent = Agent::start(
        data.path(),
        AgentOptions {
            args: ["--sweep-interval", "1s"].map(String::from).to_vec(),
            ..AgentOptions::default()
        },
    );
    // Three sweeps: each would have tried to open the stray entries as stores.
    std::thread::sleep(Duration::from_millis(3_500));
    let health = agent.get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let ready = agent.get("/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = agent.metrics();
    assert!(
        metrics.contains(r#"ipkeep_agent_store_healthy{network="net1"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains("notes.txt"), "{metrics}");
    assert!(
        !data.path().join("old-net/leases.redb").exists(),
        "no store is created in a stray directory"
    );
    let said: Vec<String> = agent
        .log()
        .into_iter()
        .filter(|l| l.contains("not network stores"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {said:?}");
    assert!(said[0].contains("notes.txt") && said[0].contains("net1.redb.bak"));
    let next =
        Invocation::new("ADD", "c2").run(&ipkeep_bin(), &conf(data.path(), agent.socket(), "net1"));
    assert!(next.ok(), "{next:?}");
    assert_eq!(requests_served(&agent, "ADD"), 1, "served by the agent");
}
