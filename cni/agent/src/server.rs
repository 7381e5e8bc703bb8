//! The unix-socket server: one request per connection (see [`super::proto`]), each run on a
//! blocking thread against the agent's open stores, exactly as the plugin process would run it.
//! Errors here become a `refused` answer, which sends the plugin to its fallback; CNI errors
//! are the command's own answer.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::metrics::Metrics;
use crate::release::Reason;
use crate::stores::AgentStores;
use ipkeep_cni::admin;
use ipkeep_cni::plugin;
use ipkeep_cni::proto::{Envelope, MAX_REQUEST_BYTES, Request, Response, VERSION};
use ipkeep_cni::relay::EarlySettings;

/// Log lines of one command, in memory.
#[derive(Debug, Clone, Default)]
struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    fn text(&self) -> String {
        let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What a request needs.
#[derive(Debug)]
pub struct Served {
    /// The open stores.
    pub stores: Arc<AgentStores>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
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
    let response = match read_request(&mut stream).await {
        Err(refusal) => refusal,
        Ok(request) => {
            let started = Instant::now();
            let served2 = served.clone();
            match tokio::task::spawn_blocking(move || execute(&served2, request)).await {
                Ok((response, command)) => {
                    served.metrics.request(
                        command,
                        response.exit_code == 0,
                        started.elapsed().as_secs_f64(),
                    );
                    response
                }
                Err(e) => Response::refused(format!("agent internal error: {e}")),
            }
        }
    };
    let body = serde_json::to_vec(&response).unwrap_or_default();
    if let Err(e) = stream.write_all(&body).await {
        debug!(error = %e, "client went away before the answer");
    }
    let _ = stream.shutdown().await;
}

async fn read_request(stream: &mut UnixStream) -> Result<Request, Response> {
    let mut body = Vec::new();
    let mut limited = (&mut *stream).take(MAX_REQUEST_BYTES as u64 + 1);
    match tokio::time::timeout(READ_TIMEOUT, limited.read_to_end(&mut body)).await {
        Err(_) => return Err(Response::refused("request not received in time")),
        Ok(Err(e)) => return Err(Response::refused(format!("reading the request: {e}"))),
        Ok(Ok(_)) if body.len() > MAX_REQUEST_BYTES => {
            return Err(Response::refused(format!(
                "request larger than {MAX_REQUEST_BYTES} bytes"
            )));
        }
        Ok(Ok(_)) => {}
    }
    let envelope: Envelope = serde_json::from_slice(&body).map_err(|e| {
        // A newer plugin may speak a later version; it runs the command itself.
        let version = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("version")?.as_u64());
        match version {
            Some(v) if v != u64::from(VERSION) => Response::refused(format!(
                "protocol version {v} not supported; this agent speaks {VERSION}"
            )),
            _ => Response::refused(format!("malformed request: {e}")),
        }
    })?;
    if envelope.version != VERSION {
        return Err(Response::refused(format!(
            "protocol version {} not supported; this agent speaks {VERSION}",
            envelope.version
        )));
    }
    Ok(envelope.request)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs one request against the open stores; returns the answer and the command label.
pub fn execute(served: &Served, request: Request) -> (Response, &'static str) {
    match request {
        Request::Cni { env, config } => {
            let vars: HashMap<String, String> = env.into_iter().collect();
            let mut stdout = Vec::new();
            // The command logs exactly as the plugin process would (its level, its format);
            // the lines go back to the plugin, which writes them to its ipam.logFile or stderr.
            let log = CapturedLog::default();
            let subscriber = EarlySettings::read(config.as_bytes())
                .log_builder(None)
                .with_writer(log.clone())
                .finish();
            let done = tracing::subscriber::with_default(subscriber, || {
                plugin::run(
                    &*served.stores,
                    &vars,
                    &mut config.as_bytes(),
                    &mut stdout,
                    unix_now(),
                )
            });
            let stderr = log.text();
            if done.exit_code != 0 {
                warn!(command = done.command.map_or("invalid", |c| c.as_str()), log = %stderr.trim_end(), "plugin command failed");
            }
            let released_by = match done.command {
                Some(ipkeep_cni::env::Command::Gc) => Reason::Gc,
                _ => Reason::Del,
            };
            served.metrics.tally(&done.tally, released_by);
            let command = done.command.map_or("invalid", |c| c.as_str());
            let response = Response {
                version: VERSION,
                refused: None,
                exit_code: done.exit_code,
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr,
            };
            (response, command)
        }
        Request::Admin(command) => {
            let mut stdout = Vec::new();
            let (exit_code, stderr) = match admin::run(&*served.stores, command, &mut stdout) {
                Ok(released) => {
                    served.metrics.released(Reason::Admin, released);
                    (0, String::new())
                }
                Err(e) => (1, format!("ipkeep: error: {e:#}\n")),
            };
            let response = Response {
                version: VERSION,
                refused: None,
                exit_code,
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr,
            };
            (response, "admin")
        }
    }
}
