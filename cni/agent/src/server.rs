//! The unix-socket server: one request per connection (see [`ipkeep_cni::proto`]), each run on
//! a blocking thread against the agent's open stores, exactly as the plugin process would run
//! it. A request the agent will not or cannot run is refused, which sends the plugin to its
//! fallback; CNI errors are the command's own answer.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipkeep_cni::admin::{self, AdminError};
use ipkeep_cni::logs::Capture;
use ipkeep_cni::netconf::{self, DEFAULT_LOCK_TIMEOUT};
use ipkeep_cni::plugin::{self, Call};
use ipkeep_cni::proto::{Envelope, FrameWriter, MAX_REQUEST_BYTES, Request, VERSION, tag};
use ipkeep_cni::stores::NotServed;
use ipkeep_ipam::disk::system_reading;
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::cluster::Cluster;
use crate::management::ClusterApi;
use crate::metrics::Metrics;
use crate::netns::NetnsView;
use crate::release::Reason;
use crate::stores::{AgentStores, StoresError};

/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one write of the answer may block (a client that stops reading is cut off).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an admin command may wait for a store.
const ADMIN_BUDGET: Duration = Duration::from_secs(30);

/// What a request needs.
#[derive(Debug)]
pub struct Served {
    /// The open stores.
    pub stores: Arc<AgentStores>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Where notices for pods go, to become Events (`None` without Kubernetes).
    pub notices: Option<crate::events::Notices>,
    /// Which sandboxes' network namespaces the agent can vouch for.
    pub netns: Arc<NetnsView>,
    /// What the API server says, for ADD and DEL to decide who manages a pod (`None` without
    /// Kubernetes).
    pub cluster: Option<Cluster>,
    /// Formats each command's log lines as the plugin would, to send them back to it.
    pub logs: Capture,
}

/// Binds the socket: creates its directory (0755), replaces a stale socket file (a previous
/// agent's), refuses to replace anything else, and restricts the socket to root (0600): the
/// plugin runs as root, and the socket can change any address on the node.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::other(format!(
                "{} exists and is not a socket; remove it or choose another --socket",
                path.display()
            )));
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves until `shutdown` completes, then stops accepting and waits for in-flight requests.
/// The socket file stays: a plugin that finds it but cannot connect counts a fallback.
pub async fn serve(
    listener: UnixListener,
    served: Arc<Served>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tasks.spawn(handle(stream, served.clone()));
                }
                Err(e) => {
                    warn!(error = %e, "accept on the agent socket failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let in_flight = tasks.len();
    if in_flight > 0 {
        tracing::info!(in_flight, "finishing in-flight requests");
    }
    while tasks.join_next().await.is_some() {}
}

async fn handle(mut stream: UnixStream, served: Arc<Served>) {
    let received = read_request(&mut stream).await;
    let started = Instant::now();
    let Ok(std_stream) = stream.into_std() else {
        return;
    };
    let answered = tokio::task::spawn_blocking(move || {
        // The answer is written with plain blocking writes, each bounded.
        let _ = std_stream.set_nonblocking(false);
        let _ = std_stream.set_write_timeout(Some(WRITE_TIMEOUT));
        let mut out = BufWriter::with_capacity(64 * 1024, &std_stream);
        let (answer, command) = match received {
            Err(reason) => (Answer::Refused(reason), "invalid"),
            Ok(request) => execute(&served, request, started, &mut out),
        };
        // Counted before the answer goes out: whoever reads the metric once the plugin has its
        // answer sees the request counted.
        if matches!(answer, Answer::Exit(_)) {
            let ok = matches!(answer, Answer::Exit(0));
            served
                .metrics
                .request(command, ok, started.elapsed().as_secs_f64());
        }
        let written = match &answer {
            Answer::Exit(code) => {
                ipkeep_cni::proto::write_frame(&mut out, tag::EXIT, &code.to_be_bytes())
            }
            Answer::Refused(reason) => {
                debug!(%reason, "refused a request");
                let reason = reason.to_string();
                ipkeep_cni::proto::write_frame(&mut out, tag::REFUSED, reason.as_bytes())
            }
            Answer::AskNetns(netns) => {
                let list = serde_json::to_vec(netns).unwrap_or_default();
                ipkeep_cni::proto::write_frame(&mut out, tag::ASK_NETNS, &list)
            }
        };
        if let Err(e) = written.and_then(|()| out.flush()) {
            debug!(error = %e, "client went away before the answer");
        }
    })
    .await;
    if let Err(e) = answered {
        warn!(error = %e, "agent internal error while answering a request");
    }
}

async fn read_request(stream: &mut UnixStream) -> Result<Request, Refusal> {
    // A request is a CNI configuration and a few variables: one read, usually.
    let mut body = Vec::with_capacity(16 * 1024);
    let mut limited = (&mut *stream).take(MAX_REQUEST_BYTES as u64 + 1);
    match tokio::time::timeout(READ_TIMEOUT, limited.read_to_end(&mut body)).await {
        Err(_) => return Err(Refusal::NotInTime),
        Ok(Err(e)) => return Err(Refusal::Read(e)),
        Ok(Ok(_)) if body.len() > MAX_REQUEST_BYTES => return Err(Refusal::TooLarge),
        Ok(Ok(_)) => {}
    }
    let envelope: Envelope = serde_json::from_slice(&body).map_err(|e| {
        // A plugin of another version may speak another protocol; it runs the command itself.
        let version = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("version")?.as_u64());
        match version {
            Some(v) if v != u64::from(VERSION) => Refusal::Version(v),
            _ => Refusal::Malformed(e),
        }
    })?;
    if envelope.version != VERSION {
        return Err(Refusal::Version(envelope.version.into()));
    }
    Ok(envelope.request)
}

/// Why the agent did not run a request: the plugin runs it itself.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The request did not arrive within [`READ_TIMEOUT`].
    #[error("request not received in time")]
    NotInTime,
    /// The request could not be read.
    #[error("reading the request: {0}")]
    Read(std::io::Error),
    /// The request is larger than any plugin sends.
    #[error("request larger than {MAX_REQUEST_BYTES} bytes")]
    TooLarge,
    /// The plugin speaks another protocol version.
    #[error("protocol version {0} not supported; this agent speaks {VERSION}")]
    Version(u64),
    /// The request does not decode.
    #[error("malformed request: {0}")]
    Malformed(serde_json::Error),
    /// Not this agent's data directory.
    #[error(transparent)]
    Stores(#[from] StoresError),
    /// The command's stores would not lend the network's store.
    #[error(transparent)]
    NotServed(#[from] NotServed),
}

/// How a request ended.
#[derive(Debug)]
pub enum Answer {
    /// Run; the exit code the plugin process would have had.
    Exit(i32),
    /// Not run: the client must run it itself.
    Refused(Refusal),
    /// Nothing committed: the command needs to know whether these network namespaces exist,
    /// which the agent cannot see; the client, on the host, says and asks again.
    AskNetns(Vec<String>),
}

/// Runs one request against the open stores, writing its stdout and stderr frames to `out`;
/// returns how it ended and the command label for metrics. `received` is when the request
/// arrived: a CNI request's budget counts from then.
pub fn execute(
    served: &Served,
    request: Request,
    received: Instant,
    out: &mut dyn Write,
) -> (Answer, &'static str) {
    match request {
        Request::Cni {
            env,
            config,
            budget_ms,
            netns_seen,
        } => {
            let budget = budget_ms.map_or(DEFAULT_LOCK_TIMEOUT, Duration::from_millis);
            let deadline = received.checked_add(budget).unwrap_or(received);
            let call = CniCall {
                vars: env.into_iter().collect(),
                config: &config,
                deadline,
                netns_seen,
            };
            run_cni(served, call, out)
        }
        Request::Admin(mut command) => {
            let target = command.target_mut();
            if let Err(why) = served.stores.owns(&target.data_dir) {
                return (Answer::Refused(why.into()), "admin");
            }
            target.data_dir = served.stores.data_dir().to_path_buf();
            let stores = served.stores.for_request(received + ADMIN_BUDGET);
            let mut stdout = FrameWriter {
                out: BufWriter::with_capacity(64 * 1024, &mut *out),
                tag: tag::STDOUT,
            };
            let result = admin::run(&stores, command, &mut stdout, &system_reading());
            let flushed = stdout.flush();
            drop(stdout);
            let code = match result.and_then(|n| flushed.map(|()| n).map_err(Into::into)) {
                // Refused before anything was written.
                Err(AdminError::NotServed(why)) => return (Answer::Refused(why.into()), "admin"),
                Ok(released) => {
                    served.metrics.released(Reason::Admin, released);
                    0
                }
                Err(e) => {
                    let text = format!("ipkeep: error: {e:#}\n");
                    let _ = ipkeep_cni::proto::write_frame(out, tag::STDERR, text.as_bytes());
                    1
                }
            };
            (Answer::Exit(code), "admin")
        }
    }
}

/// One CNI request as received.
struct CniCall<'r> {
    vars: HashMap<String, String>,
    config: &'r str,
    deadline: Instant,
    /// What the plugin sees on the host of namespaces the agent asked about.
    netns_seen: std::collections::BTreeMap<String, bool>,
}

fn run_cni(served: &Served, request: CniCall<'_>, out: &mut dyn Write) -> (Answer, &'static str) {
    let CniCall {
        vars,
        config,
        deadline,
        netns_seen,
    } = request;
    let mut decoded = netconf::decode(config.as_bytes());
    if let Ok(d) = &mut decoded {
        // Only the agent's own stores, by their canonical path (a plugin may name the data
        // directory through a symlink).
        if let Err(why) = served.stores.owns(&d.settings.data_dir) {
            return (Answer::Refused(why.into()), "invalid");
        }
        d.settings.data_dir = served.stores.data_dir().to_path_buf();
    }
    if vars.get("CNI_COMMAND").map(String::as_str) == Some("ADD")
        && let Some(netns) = vars.get("CNI_NETNS")
    {
        served.netns.note(netns, true);
    }
    let stores = served
        .stores
        .for_request(deadline)
        .seeing(&served.netns, netns_seen);
    // The command logs exactly as the plugin process would (its level, its format); the lines
    // go back to the plugin, which writes them to its ipam.logFile or stderr.
    let call = Call {
        reading: system_reading(),
        deadline: Some(deadline),
        api: &ClusterApi(served.cluster.as_ref()),
        capture_log: Some(&served.logs),
    };
    let done = plugin::run(&stores, &vars, &decoded, &call);
    let command = done.command.map_or("invalid", |c| c.as_str());
    if let Some(why) = done.refused {
        warn!(command, %why, "refused: the plugin serves this itself");
        return (Answer::Refused(why.into()), command);
    }
    if !done.needs_netns.is_empty() {
        // The rest, if any, in the next round.
        let mut asked = done.needs_netns;
        asked.truncate(ipkeep_cni::proto::MAX_NETNS_ASKED);
        debug!(command, netns = ?asked, "cannot see these sandboxes' network namespaces; asking the plugin, which runs on the host");
        return (Answer::AskNetns(asked), command);
    }
    if done.exit_code != 0 {
        warn!(command, log = %String::from_utf8_lossy(&done.log).trim_end(), "plugin command failed");
    }
    let released_by = match done.command {
        Some(ipkeep_cni::env::Command::Gc) => Reason::Gc,
        _ => Reason::Del,
    };
    served.metrics.tally(&done.tally, released_by);
    if let Some(notices) = &served.notices {
        for notice in done.notices {
            notices.send(notice);
        }
    }
    let written = ipkeep_cni::proto::write_frame(out, tag::STDOUT, &done.stdout)
        .and_then(|()| ipkeep_cni::proto::write_frame(out, tag::STDERR, &done.log));
    if let Err(e) = written {
        debug!(error = %e, "client went away before the answer");
    }
    (Answer::Exit(done.exit_code), command)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use ipkeep_ipam::{NetworkDir, StoreRead};

    use super::*;

    fn served(data: &Path) -> Served {
        let metrics = Arc::new(Metrics::default());
        Served {
            stores: Arc::new(AgentStores::new(data, metrics.clone()).unwrap()),
            metrics,
            notices: None,
            netns: Arc::default(),
            cluster: None,
            logs: Capture::default(),
        }
    }

    fn add(budget_ms: Option<u64>, data: &Path) -> Request {
        let env = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        Request::Cni {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            config: format!(
                r#"{{"cniVersion":"1.0.0","name":"net","ipam":{{"dataDir":"{}","ranges":[[{{"subnet":"10.9.0.0/24"}}]]}}}}"#,
                data.display()
            ),
            budget_ms,
            netns_seen: BTreeMap::new(),
        }
    }

    fn stdout_of(frames: &[u8]) -> String {
        let mut input = frames;
        let mut out = Vec::new();
        while let Some((t, p)) = ipkeep_cni::proto::read_frame(&mut input).unwrap() {
            if t == tag::STDOUT {
                out.extend(p);
            }
        }
        String::from_utf8(out).unwrap()
    }

    /// Past the plugin's budget nothing is committed: the plugin has stopped waiting and told the
    /// runtime the command failed.
    #[test]
    fn nothing_is_committed_after_the_plugin_stopped_waiting() {
        let tmp = tempfile::tempdir().unwrap();
        let served = served(tmp.path());
        let long_ago = Instant::now().checked_sub(Duration::from_secs(2)).unwrap();
        let mut out = Vec::new();
        let (answer, command) = execute(&served, add(Some(1_000), tmp.path()), long_ago, &mut out);
        assert!(
            matches!((&answer, command), (Answer::Exit(1), "ADD")),
            "{answer:?}"
        );
        let error: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
        assert_eq!(error["code"], 11, "{error}");
        let dir = NetworkDir::new(tmp.path(), "net").unwrap();
        let leases = served
            .stores
            .slot(&dir)
            .unwrap()
            .snapshot(
                Instant::now() + Duration::from_secs(1),
                Duration::from_secs(1),
            )
            .unwrap()
            .all()
            .unwrap();
        assert!(leases.is_empty(), "{leases:?}");
        // Within its budget the same request is served.
        let mut out = Vec::new();
        let (answer, _) = execute(
            &served,
            add(Some(5_000), tmp.path()),
            Instant::now(),
            &mut out,
        );
        assert!(matches!(answer, Answer::Exit(0)), "{}", stdout_of(&out));
    }

    /// A rebuilt pod whose older sandbox still has its address, in a network namespace the agent
    /// cannot see (`/proc/<pid>/…` is the runtime's PID namespace): the agent asks the plugin,
    /// commits nothing meanwhile, and decides by the plugin's answer.
    #[test]
    fn a_namespace_the_agent_cannot_see_is_asked_about() {
        let tmp = tempfile::tempdir().unwrap();
        let served = served(tmp.path());
        let old_netns = "/proc/999999999/ns/net";
        let pod_add = |cid: &str, netns: &str, seen: &[(&str, bool)]| {
            let Request::Cni {
                mut env, config, ..
            } = add(Some(5_000), tmp.path())
            else {
                unreachable!()
            };
            env.insert("CNI_CONTAINERID".into(), cid.into());
            env.insert("CNI_NETNS".into(), netns.into());
            env.insert(
                "CNI_ARGS".into(),
                "K8S_POD_NAMESPACE=db;K8S_POD_NAME=kv-0".into(),
            );
            let config = config.replace(
                r#""ipam""#,
                r#""runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"ipkeep.dev/ip-retention":"1h","ipkeep.dev/persistent-pod-state":"kv"}},"ipam""#,
            );
            let request = Request::Cni {
                env,
                config,
                budget_ms: Some(5_000),
                netns_seen: seen.iter().map(|(p, e)| (p.to_string(), *e)).collect(),
            };
            let mut out = Vec::new();
            let (answer, _) = execute(&served, request, Instant::now(), &mut out);
            (answer, stdout_of(&out))
        };
        let (answer, first) = pod_add("old", old_netns, &[]);
        assert!(matches!(answer, Answer::Exit(0)), "{first}");
        let (answer, out) = pod_add("new", "/run/netns/new", &[]);
        assert!(
            matches!(&answer, Answer::AskNetns(asked) if asked == &[old_netns]),
            "{answer:?}"
        );
        assert!(out.is_empty(), "no answer but the question: {out}");
        let (answer, out) = pod_add("new", "/run/netns/new", &[(old_netns, true)]);
        assert!(matches!(answer, Answer::Exit(1)), "{answer:?}");
        assert!(out.contains("still configured"), "{out}");
        let (answer, out) = pod_add("new", "/run/netns/new", &[(old_netns, false)]);
        assert!(matches!(answer, Answer::Exit(0)), "{out}");
        let ip = |result: &str| {
            serde_json::from_str::<serde_json::Value>(result).unwrap()["ips"][0]["address"].clone()
        };
        assert_eq!(
            ip(&out),
            ip(&first),
            "the address moved once the old sandbox was gone"
        );
    }

    #[test]
    fn admin_commands_for_another_data_directory_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let served = served(tmp.path());
        let list: Request = serde_json::from_value(serde_json::json!({"admin": {"list": {
            "target": {"network": "net", "dataDir": other.path(),
                       "lockTimeout": {"secs": 1, "nanos": 0}}, "json": true}}}))
        .unwrap();
        let (answer, _) = execute(&served, list, Instant::now(), &mut Vec::new());
        assert!(
            matches!(
                &answer,
                Answer::Refused(Refusal::Stores(StoresError::NotOurDataDir { .. }))
            ),
            "{answer:?}"
        );
        let Answer::Refused(why) = answer else {
            return;
        };
        assert!(why.to_string().contains("--data-dir"), "{why}");
    }
}
