//! A full disk under the store, on a small tmpfs in a private mount namespace (needs root; the
//! host never sees the mount): commands fail cleanly and say why, nothing acknowledged is lost,
//! nothing is acknowledged that was not written, the health checks say so, and once space is
//! freed everything works again without anyone touching the store. Directly and through the
//! agent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::mountns::MountNs;
use ipkeep_tests::{Invocation, PluginOutput, ipkeep_bin, with_agent_socket};

fn conf(data: &Path, version: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"full","ipam":{{"type":"ipkeep","dataDir":"{}","agentSocket":"","lockTimeout":"5s","retention":"1h","ranges":[[{{"subnet":"10.88.0.0/16"}}]]}}}}"#,
        data.display()
    )
}

fn pod(i: usize) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=pod-{i}")
}

/// Runs the plugin inside the namespace.
fn cni(ns: &MountNs, command: &str, cid: &str, args: &str, conf: &str) -> PluginOutput {
    let mut child = Invocation::new(command, cid)
        .args(args)
        .command_in(&ns.prefix(), &ipkeep_bin())
        .spawn()
        .expect("spawn the plugin");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = std::io::Write::write_all(&mut stdin, conf.as_bytes());
    }
    PluginOutput::from(child.wait_with_output().expect("wait"))
}

/// `ipkeep list --json`, inside the namespace (directly, or through `socket`).
fn list(ns: &MountNs, data: &Path, socket: Option<&Path>) -> serde_json::Value {
    let out = ns
        .command(ipkeep_bin())
        .arg("--agent-socket")
        .arg(socket.map_or_else(String::new, |s| s.display().to_string()))
        .args(["list", "--json", "--network", "full", "--data-dir"])
        .arg(data)
        .stderr(Stdio::piped())
        .output()
        .expect("ipkeep list");
    assert!(
        out.status.success(),
        "list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("list JSON")
}

/// Active addresses by container, and owners by address.
fn ownership(
    list: &serde_json::Value,
) -> (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, usize>) {
    let mut active: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    for l in list["leases"].as_array().expect("leases") {
        let ip = l["ip"].as_str().unwrap_or_default().to_string();
        if l["state"] == "active" {
            active
                .entry(
                    l["owner"]["containerId"]
                        .as_str()
                        .unwrap_or_default()
                        .into(),
                )
                .or_default()
                .insert(ip.clone());
        }
        *owners.entry(ip).or_default() += 1;
    }
    (active, owners)
}

/// Twenty pods while there is room; their acknowledged addresses.
fn add_twenty(ns: &MountNs, conf: &str) -> BTreeMap<String, Vec<String>> {
    (0..20)
        .map(|i| {
            let cid = format!("c{i}");
            let out = cni(ns, "ADD", &cid, &pod(i), conf);
            assert!(out.ok(), "{out:?}");
            (cid, out.ips())
        })
        .collect()
}

/// Fills the tmpfs, then ADDs until one fails; returns the acknowledged ADDs and the container
/// whose ADD failed.
fn fill_until_an_add_fails(
    ns: &MountNs,
    data: &Path,
    conf: &str,
    acked: &mut BTreeMap<String, Vec<String>>,
) -> String {
    // `cat` stops at ENOSPC; that is the point.
    ns.sh(&format!(
        "cat /dev/zero > {}/filler 2>/dev/null",
        data.display()
    ));
    for i in 100..2_100 {
        let cid = format!("c{i}");
        let out = cni(ns, "ADD", &cid, &pod(i), conf);
        if out.ok() {
            acked.insert(cid, out.ips());
            continue;
        }
        assert_eq!(out.code, Some(1), "a clean failure, not a crash: {out:?}");
        let json = out.json();
        assert_eq!(json["code"], 11, "try again later: {out:?}");
        let msg = json["msg"].as_str().unwrap_or_default();
        assert!(msg.contains("full"), "says the disk is full: {msg}");
        return cid;
    }
    panic!("no ADD failed on a full disk");
}

fn assert_consistent(list: &serde_json::Value, acked: &BTreeMap<String, Vec<String>>) {
    let (active, owners) = ownership(list);
    assert!(
        owners.values().all(|n| *n == 1),
        "no address with two owners"
    );
    for (cid, ips) in acked {
        let want: BTreeSet<String> = ips.iter().cloned().collect();
        assert_eq!(
            active.get(cid),
            Some(&want),
            "acknowledged ADD of {cid} kept"
        );
    }
}

/// The plugin on its own: a full disk fails commands cleanly; freeing space is all it takes.
#[test]
fn full_disk_root_direct() {
    let Some(ns) = MountNs::new("full_disk_root_direct") else {
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    ns.mount_tmpfs(data.path(), "2m");
    let conf = conf(data.path(), "1.1.0");
    let mut acked = add_twenty(&ns, &conf);
    let failed = fill_until_an_add_fails(&ns, data.path(), &conf, &mut acked);
    let status = cni(&ns, "STATUS", "", "", &conf);
    assert_eq!(
        status.error_code(),
        Some(50),
        "STATUS says ADD cannot be served: {status:?}"
    );
    ns.sh(&format!("rm {}/filler", data.path().display()));
    let status = cni(&ns, "STATUS", "", "", &conf);
    assert!(status.ok(), "{status:?}");
    let retried = cni(&ns, "ADD", &failed, &pod(99_999), &conf);
    assert!(
        retried.ok(),
        "the runtime's retry succeeds once there is space: {retried:?}"
    );
    acked.insert(failed, retried.ips());
    assert_consistent(&list(&ns, data.path(), None), &acked);
}

/// Found by review: after a failed commit the agent kept the change in memory, so the
/// runtime's retry "succeeded" without writing anything and, after a restart, the address went
/// to another pod; the error stayed after space was freed; the probes said ok throughout.
#[test]
fn full_disk_root_through_the_agent() {
    let Some(ns) = MountNs::new("full_disk_root_through_the_agent") else {
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    ns.mount_tmpfs(data.path(), "2m");
    let mut agent = Agent::start(
        data.path(),
        AgentOptions {
            prefix: ns.prefix(),
            ..AgentOptions::default()
        },
    );
    let socket = agent.socket().to_path_buf();
    let conf = with_agent_socket(&conf(data.path(), "1.1.0"), &socket);
    let mut acked = add_twenty(&ns, &conf);
    let failed = fill_until_an_add_fails(&ns, data.path(), &conf, &mut acked);
    let ready = agent.get("/readyz");
    assert!(
        ready.starts_with("HTTP/1.1 503"),
        "/readyz says it cannot commit: {ready}"
    );
    // A restart would not free space: liveness stays ok.
    let health = agent.get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let status = cni(&ns, "STATUS", "", "", &conf);
    assert_eq!(status.error_code(), Some(50), "{status:?}");
    // The runtime retries the same ADD: it must fail again, never "succeed" unwritten.
    let again = cni(&ns, "ADD", &failed, &pod(99_999), &conf);
    assert!(
        !again.ok(),
        "the retry while the disk is full fails: {again:?}"
    );
    ns.sh(&format!("rm {}/filler", data.path().display()));
    let retried = cni(&ns, "ADD", &failed, &pod(99_999), &conf);
    assert!(retried.ok(), "the error is not sticky: {retried:?}");
    acked.insert(failed.clone(), retried.ips());
    let ready = agent.get("/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    // What the agent acknowledged is on disk: a restarted agent knows it, and the next pod
    // gets another address.
    agent.restart();
    let next = cni(&ns, "ADD", "c-next", &pod(100_000), &conf);
    assert!(next.ok(), "{next:?}");
    let taken: BTreeSet<String> = acked.values().flatten().cloned().collect();
    assert!(
        next.ips().iter().all(|ip| !taken.contains(ip)),
        "{next:?} vs {taken:?}"
    );
    acked.insert("c-next".into(), next.ips());
    assert_consistent(&list(&ns, data.path(), Some(&socket)), &acked);
    drop(agent);
}
