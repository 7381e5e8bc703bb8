//! The unix-socket server: one request per connection (see [`ipkeep_cni::proto`]), each run on
//! a blocking thread against the agent's open stores, exactly as the plugin process would run
//! it. A request the agent will not or cannot run is refused, which sends the plugin to its
//! fallback; CNI errors are the command's own answer.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ipkeep_cni::netconf::{self, DEFAULT_LOCK_TIMEOUT};
use ipkeep_cni::plugin::{self, Call};
use ipkeep_cni::proto::{Envelope, FrameWriter, MAX_REQUEST_BYTES, Request, VERSION, tag};
use ipkeep_cni::{admin, logs};
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
use crate::stores::AgentStores;

thread_local! {
    /// The log lines of the command running on this thread.
    static CAPTURED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes into [`CAPTURED`]: one command runs on a blocking thread at a time, so the lines it
/// logs are exactly those written on its thread while it runs.
#[derive(Debug, Clone, Copy, Default)]
struct ThreadLog;

impl Write for ThreadLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|c| c.borrow_mut().extend_from_slice(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The subscriber that formats a command's lines as the plugin would at `level`: one per level
/// for the agent's whole life (a new subscriber per request would make tracing recompute every
/// call site's interest each time, and race with other requests while it does).
fn command_logger(level: tracing::Level) -> tracing::Dispatch {
    static LOGGERS: OnceLock<Vec<(tracing::Level, tracing::Dispatch)>> = OnceLock::new();
    let loggers = LOGGERS.get_or_init(|| {
        [
            tracing::Level::ERROR,
            tracing::Level::WARN,
            tracing::Level::INFO,
            tracing::Level::DEBUG,
            tracing::Level::TRACE,
        ]
        .into_iter()
        .map(|level| {
            let settings = netconf::Settings {
                log_level: Some(level),
                ..netconf::Settings::default()
            };
            let subscriber = logs::builder(&settings, None)
                .with_writer(|| ThreadLog)
                .finish();
            (level, tracing::Dispatch::new(subscriber))
        })
        .collect()
    });
    loggers
        .iter()
        .find(|(l, _)| *l == level)
        .map(|(_, d)| d.clone())
        .unwrap_or_else(|| loggers[1].1.clone())
}

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

async fn read_request(stream: &mut UnixStream) -> Result<Request, String> {
    // A request is a CNI configuration and a few variables: one read, usually.
    let mut body = Vec::with_capacity(16 * 1024);
    let mut limited = (&mut *stream).take(MAX_REQUEST_BYTES as u64 + 1);
    match tokio::time::timeout(READ_TIMEOUT, limited.read_to_end(&mut body)).await {
        Err(_) => return Err("request not received in time".into()),
        Ok(Err(e)) => return Err(format!("reading the request: {e}")),
        Ok(Ok(_)) if body.len() > MAX_REQUEST_BYTES => {
            return Err(format!("request larger than {MAX_REQUEST_BYTES} bytes"));
        }
        Ok(Ok(_)) => {}
    }
    let envelope: Envelope = serde_json::from_slice(&body).map_err(|e| {
        // A plugin of another version may speak another protocol; it runs the command itself.
        let version = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("version")?.as_u64());
        match version {
            Some(v) if v != u64::from(VERSION) => {
                format!("protocol version {v} not supported; this agent speaks {VERSION}")
            }
            _ => format!("malformed request: {e}"),
        }
    })?;
    if envelope.version != VERSION {
        return Err(format!(
            "protocol version {} not supported; this agent speaks {VERSION}",
            envelope.version
        ));
    }
    Ok(envelope.request)
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Run; the exit code the plugin process would have had.
    Exit(i32),
    /// Not run: the client must run it itself.
    Refused(String),
    /// Nothing committed: the command needs to know whether these network namespaces exist,
    /// which the agent cannot see; the client, on the host, says and asks again.
    AskNetns(Vec<String>),
}

/// Counts bytes written through it.
struct Counting<W> {
    inner: W,
    written: usize,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
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
                return (Answer::Refused(why), "admin");
            }
            target.data_dir = served.stores.data_dir().to_path_buf();
            let stores = served.stores.for_request(received + ADMIN_BUDGET);
            let mut stdout = Counting {
                inner: FrameWriter {
                    out: BufWriter::with_capacity(64 * 1024, &mut *out),
                    tag: tag::STDOUT,
                },
                written: 0,
            };
            let result = admin::run(&stores, command, &mut stdout, &system_reading());
            let flushed = stdout.flush();
            let written = stdout.written;
            drop(stdout);
            if let (Some(why), 0) = (stores.unavailable(), written) {
                return (Answer::Refused(why), "admin");
            }
            let code = match result.and_then(|n| flushed.map(|()| n).map_err(Into::into)) {
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
            return (Answer::Refused(why), "invalid");
        }
        d.settings.data_dir = served.stores.data_dir().to_path_buf();
    }
    let settings = decoded
        .as_ref()
        .map_or_else(|_| netconf::Settings::default(), |d| d.settings.clone());
    // The command logs exactly as the plugin process would (its level, its format); the lines
    // go back to the plugin, which writes them to its ipam.logFile or stderr.
    let logger = command_logger(logs::level(&settings, None));
    if vars.get("CNI_COMMAND").map(String::as_str) == Some("ADD")
        && let Some(netns) = vars.get("CNI_NETNS")
    {
        served.netns.note(netns, true);
    }
    let stores = served
        .stores
        .for_request(deadline)
        .seeing(&served.netns, netns_seen);
    let call = Call {
        reading: system_reading(),
        deadline: Some(deadline),
        api: &ClusterApi(served.cluster.as_ref()),
    };
    let mut stdout = Vec::new();
    CAPTURED.with(|c| c.borrow_mut().clear());
    let done = tracing::dispatcher::with_default(&logger, || {
        plugin::run(&stores, &vars, &decoded, &mut stdout, &call)
    });
    let stderr = CAPTURED.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let command = done.command.map_or("invalid", |c| c.as_str());
    if let Some(why) = stores.unavailable() {
        warn!(command, %why, "refused: the plugin serves this itself");
        return (Answer::Refused(why), command);
    }
    let mut asked = stores.asked();
    if !asked.is_empty() {
        // The rest, if any, in the next round.
        asked.truncate(ipkeep_cni::proto::MAX_NETNS_ASKED);
        debug!(command, netns = ?asked, "cannot see these sandboxes' network namespaces; asking the plugin, which runs on the host");
        return (Answer::AskNetns(asked), command);
    }
    if done.exit_code != 0 {
        warn!(command, log = %String::from_utf8_lossy(&stderr).trim_end(), "plugin command failed");
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
    let written = ipkeep_cni::proto::write_frame(out, tag::STDOUT, &stdout)
        .and_then(|()| ipkeep_cni::proto::write_frame(out, tag::STDERR, &stderr));
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
        assert_eq!((answer, command), (Answer::Exit(1), "ADD"));
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
        assert_eq!(answer, Answer::Exit(0), "{}", stdout_of(&out));
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
        assert!(matches!(answer, Answer::Refused(why) if why.contains("--data-dir")));
    }
}
