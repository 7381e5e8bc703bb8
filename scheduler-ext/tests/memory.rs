//! What requests can cost: the real binary's peak resident memory (`VmHWM` in
//! `/proc/<pid>/status`) while several clients send maximum-size `/filter`, `/prioritize` and
//! `/mutate-pods` bodies at once, some of them built to make parsing as expensive as possible,
//! some never reading their answer. The Deployment gives the container 256 MiB; the process must
//! stay well under it however the requests are shaped.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipkeep_scheduler_ext::http::Limits;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{HOST, STS_UID, node_json, pps_json};

const MIB: u64 = 1 << 20;
/// The Deployment's memory limit (deploy/scheduler-ext/deployment.yaml).
const CONTAINER_LIMIT: u64 = 256 * MIB;
/// The watchdog kills the server above this, so a regression fails the test instead of the
/// machine.
const WATCHDOG: u64 = 3 * 1024 * MIB;

/// The binary, killed when dropped.
struct Ext(Child);

impl Drop for Ext {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `kB` line of `/proc/<pid>/status`, in bytes.
fn proc_status(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One HTTP/1.1 POST over a fresh connection; the status code and body. With `stall`, the
/// client sends its whole request, then waits that long before it reads a byte of the answer.
fn post(addr: SocketAddr, path: &str, body: &[u8], stall: Duration) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, "connection refused".into());
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // A server that refuses early answers, then closes while the body is still coming: read
    // the answer anyway.
    let sent = s.write_all(head.as_bytes()).is_ok() && s.write_all(body).is_ok();
    if sent {
        std::thread::sleep(stall);
    }
    let mut answer = Vec::new();
    if s.read_to_end(&mut answer).is_err() && answer.is_empty() {
        return (0, format!("no answer (whole request sent: {sent})"));
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The pod `db-0` of StatefulSet `db`, recorded on `n1` (pinned by hostname), or a pod that is
/// nobody's when `ours` is false.
fn pod(ours: bool) -> Value {
    let mut pod: Value =
        serde_json::from_str::<Value>(include_str!("fixtures/extender-filter-node-names.json"))
            .unwrap()["Pod"]
            .clone();
    if !ours {
        pod["metadata"]["ownerReferences"] = json!([]);
    }
    pod
}

/// `prefix` + as many `item(i)` as fit in `size` bytes (at most `most`) + `suffix`, items
/// comma-separated.
fn fill(
    prefix: &str,
    suffix: &str,
    size: usize,
    most: usize,
    mut item: impl FnMut(usize) -> String,
) -> Vec<u8> {
    let mut out = prefix.as_bytes().to_vec();
    let mut i = 0;
    while i < most {
        let next = item(i);
        if out.len() + next.len() + 1 + suffix.len() > size {
            break;
        }
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(next.as_bytes());
        i += 1;
    }
    out.extend_from_slice(suffix.as_bytes());
    out
}

/// `extender::MAX_NODES` and `pod::MAX_CONSTRAINTS`, written out so that this test also runs
/// against builds without them.
const MAX_NODES: usize = 10_000;
const MAX_CONSTRAINTS: usize = 64 * 1024;

/// Request bodies of (almost exactly) the size limits, shaped to cost as much as possible: the
/// most nodes a request may list, node lists that are only names, node affinity as large as is
/// read, and one of each that goes over what is read.
fn bodies(limits: &Limits) -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let extender = limits.extender_body - 64;
    let webhook = limits.webhook_body - 64;
    let args = |pod: &Value, list: &str| format!("{{\"Pod\":{pod},{list}");
    let padded = |prefix: &str, budget: usize| {
        let pad = budget.saturating_sub(prefix.len() + 4);
        format!("{prefix}{}", "x".repeat(pad))
    };
    let mut out = Vec::new();
    // Realistic full Node objects for a pod that is not pinned: all echoed back.
    out.push((
        "/filter",
        "full Nodes, echoed",
        fill(
            &args(&pod(false), "\"Nodes\":{\"items\":["),
            "]}}",
            extender,
            usize::MAX,
            |i| node_json(i).to_string(),
        ),
    ));
    // The most nodes a list may have, each with many labels, for a pinned pod: every node is
    // scored from its labels.
    let per_node = extender / MAX_NODES;
    out.push((
        "/prioritize",
        "most Nodes, many labels",
        fill(
            &args(&pod(true), "\"Nodes\":{\"items\":["),
            "]}}",
            extender,
            MAX_NODES,
            |i| {
                let head =
                    format!("{{\"metadata\":{{\"name\":\"n{i}\",\"labels\":{{\"{HOST}\":\"n{i}\"");
                let mut node = head.clone();
                let mut k = 0;
                while node.len() + 16 < per_node {
                    node.push_str(&format!(",\"l{k}\":\"\""));
                    k += 1;
                }
                node + "}}}"
            },
        ),
    ));
    // The most names a list may have, as long as the body allows, for a pinned pod: every
    // name but one is refused with a reason.
    out.push((
        "/filter",
        "most NodeNames, pinned",
        fill(
            &args(&pod(true), "\"NodeNames\":["),
            "]}",
            extender,
            MAX_NODES,
            |i| format!("\"{}\"", padded(&format!("{i:x}-"), per_node)),
        ),
    ));
    // More names than a list may have: refused while it is read.
    out.push((
        "/filter",
        "too many NodeNames",
        fill(
            &args(&pod(true), "\"NodeNames\":["),
            "]}",
            extender,
            usize::MAX,
            |i| format!("\"{i:x}\""),
        ),
    ));
    // A pinned pod whose node affinity is as large as is read, in the shape that costs most
    // once parsed (many empty values), padded to the body limit with what is skipped: the
    // webhook reads it, adds the pin to every term and diffs it.
    let review = |terms: usize| {
        let mut review: Value = serde_json::from_str(include_str!(
            "fixtures/admission-review-sts-pod-create.json"
        ))
        .unwrap();
        let term = json!({"matchExpressions": [{"key": "k", "operator": "In", "values": ["", "", "", "", "", "", "", "", "", "", "", ""]}]});
        review["request"]["object"]["spec"]["affinity"] = json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": vec![term; terms]}}});
        review["request"]["object"]["metadata"]["annotations"]["padding"] = json!("PADDING");
        review.to_string()
    };
    let fits = (0..)
        .take_while(|n| {
            let r: Value = serde_json::from_str(&review(*n)).unwrap();
            r["request"]["object"]["spec"]["affinity"]["nodeAffinity"]
                .to_string()
                .len()
                <= MAX_CONSTRAINTS
        })
        .last()
        .unwrap();
    let text = review(fits);
    let (head, tail) = text.split_once("PADDING").unwrap();
    out.push((
        "/mutate-pods",
        "largest node affinity read",
        fill(head, tail, webhook, usize::MAX, |_| "x".repeat(1000)),
    ));
    // Node affinity over what is read, as large as the body allows.
    let text = review(1);
    let (head, tail) = text.split_once("\"nodeSelectorTerms\":[").unwrap();
    let head = format!("{head}\"nodeSelectorTerms\":[");
    out.push((
        "/mutate-pods",
        "node affinity over what is read",
        fill(&head, &format!(",{}", &tail), webhook, usize::MAX, |i| {
            format!("{{\"matchExpressions\":[{{\"key\":\"k{i}\",\"operator\":\"In\",\"values\":[\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\"]}}]}}")
        }),
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_maximum_size_requests_stay_well_under_the_container_limit() {
    let Some(ns) = ipkeep_tests::apiserver::namespace(
        "concurrent_maximum_size_requests_stay_well_under_the_container_limit",
        "memory",
    )
    .await
    else {
        return;
    };
    let client = ns.client.clone();
    // The fixtures' namespace.
    ns.create_namespace("prod", json!({})).await;
    for i in 0..4 {
        // The fixture is a Node as a watch delivers it; a create takes no resourceVersion or uid.
        let mut node = node_json(i);
        for field in ["resourceVersion", "uid"] {
            node["metadata"].as_object_mut().unwrap().remove(field);
        }
        let node: Node = serde_json::from_value(node).unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    let mut pps = pps_json();
    let status = pps["status"].take();
    pps.as_object_mut().unwrap().remove("status");
    let pps_api: Api<ipkeep_api::PersistentPodState> = Api::namespaced(client.clone(), "prod");
    pps_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(pps).unwrap(),
        )
        .await
        .unwrap();
    pps_api
        .patch_status(
            "db",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .unwrap();
    assert_eq!(status["targetUID"], STS_UID);

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, ns.server.kubeconfig("default")).unwrap();
    let listen = ipkeep_tests::free_addr();
    let ext = Ext(Command::new(env!("CARGO_BIN_EXE_ipkeep-scheduler-ext"))
        .args([
            "--insecure-http",
            "--webhook-listen",
            &listen.to_string(),
            "--log",
            "warn",
            // Every client here shares one address: give it the whole budget, so that what is
            // measured is what all requests together (from many clients) can cost; and no
            // reserve, which only small requests (cheaper to parse) may hold.
            "--max-in-flight-bytes-per-source",
            &Limits::default().in_flight.to_string(),
            "--reserved-in-flight-bytes",
            "0",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let pid = ext.0.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = TcpStream::connect(listen).is_ok_and(|mut s| {
            let _ = s.write_all(b"GET /readyz HTTP/1.0\r\n\r\n");
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200")
        });
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the server never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Warm up: one small request of each kind.
    let small = post(
        listen,
        "/filter",
        include_bytes!("fixtures/extender-filter-node-names.json"),
        Duration::ZERO,
    );
    assert_eq!(small.0, 200, "{}", small.1);
    let baseline = proc_status(pid, "VmRSS:").unwrap();

    let limits = Limits::default();
    let bodies: Arc<Vec<_>> = Arc::new(bodies(&limits));
    // The watchdog: poll the resident size; kill the server if it runs away.
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let peak_seen = Arc::new(AtomicU64::new(0));
    let watchdog = {
        let (stop, killed, peak_seen) = (stop.clone(), killed.clone(), peak_seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let rss = proc_status(pid, "VmRSS:").unwrap_or(0);
                peak_seen.fetch_max(rss, Ordering::Relaxed);
                if rss > WATCHDOG {
                    killed.store(true, Ordering::Relaxed);
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    // Three rounds of every shape twice at once, plus clients that never read their answer
    // while the others are served.
    let started = Instant::now();
    let mut answers = Vec::new();
    for _round in 0..3 {
        let mut clients = Vec::new();
        for copy in 0..3 {
            for index in 0..bodies.len() {
                let bodies = bodies.clone();
                // The third copy of each shape stalls before reading.
                let stall = if copy == 2 {
                    Duration::from_secs(3)
                } else {
                    Duration::ZERO
                };
                clients.push(std::thread::spawn(move || {
                    let (path, what, body) = &bodies[index];
                    let (code, text) = post(listen, path, body, stall);
                    (*what, code, text.chars().take(300).collect::<String>())
                }));
            }
        }
        for c in clients {
            answers.push(c.join().unwrap());
        }
    }
    // Then each alone: what is within the limits is served, what is over them refused.
    for index in 0..bodies.len() {
        let (path, what, body) = &bodies[index];
        let (code, text) = post(listen, path, body, Duration::ZERO);
        answers.push((*what, code, text.chars().take(300).collect::<String>()));
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    let peak = proc_status(pid, "VmHWM:").unwrap_or_else(|| peak_seen.load(Ordering::Relaxed));
    assert!(
        !killed.load(Ordering::Relaxed),
        "the server passed {} MiB and was killed",
        WATCHDOG / MIB
    );
    // What came of each request: served, refused for its size or shape, or busy.
    let kind = |code: u16, text: &str| match code {
        _ if text.contains("is busy") => "busy",
        200 if !text.contains("\"Error\":\"") && !text.contains("cannot be read") => "served",
        200 | 400 | 413 => "refused",
        _ => "other",
    };
    let mut by_outcome = std::collections::BTreeMap::<(&str, &str), usize>::new();
    for (what, code, text) in &answers {
        *by_outcome.entry((what, kind(*code, text))).or_default() += 1;
    }
    eprintln!(
        "limits: webhook {} B, extender {} B; baseline {} MiB; peak (VmHWM) {} MiB; {elapsed:?}",
        limits.webhook_body,
        limits.extender_body,
        baseline / MIB,
        peak / MIB,
    );
    for ((what, kind), n) in &by_outcome {
        eprintln!("  {what}: {n} {kind}");
    }
    assert!(
        peak < CONTAINER_LIMIT / 2,
        "peak resident memory {} MiB, over half the container's {} MiB",
        peak / MIB,
        CONTAINER_LIMIT / MIB
    );
    // Every client got an answer: served, or refused in so many words.
    for (what, code, text) in &answers {
        assert!(kind(*code, text) != "other", "{what}: {code} {text}");
    }
    let alone = &answers[answers.len() - bodies.len()..];
    for (what, code, text) in alone {
        let over = what.contains("too many") || what.contains("over what");
        let want = if over { "refused" } else { "served" };
        assert_eq!(kind(*code, text), want, "{what} alone: {code} {text}");
    }
}
