//! The plugin ↔ agent protocol, and its blocking client (std only: the plugin stays small).
//!
//! One request per connection on a unix stream socket:
//! 1. the client connects and writes one JSON [`Envelope`] of a [`Request`], then shuts down its
//!    write half;
//! 2. the agent reads to end of stream (at most [`MAX_REQUEST_BYTES`]), runs the command exactly
//!    as the plugin process would, writes one JSON [`Response`] and closes.
//!
//! ```text
//! → {"version":1,"cni":{"env":{"CNI_COMMAND":"ADD","CNI_CONTAINERID":"…",…},"config":"{…stdin…}"}}
//! ← {"version":1,"exitCode":0,"stdout":"{…CNI result…}","stderr":""}
//! → {"version":1,"admin":{"list":{"target":{"network":"k8s-pod-network",
//!       "dataDir":"/var/lib/cni/ipkeep","lockTimeout":{"secs":10,"nanos":0}},"json":false}}}
//! ← {"version":1,"exitCode":1,"stdout":"","stderr":"ipkeep: error: …"}
//! ← {"version":1,"refused":"shutting down"}          (command not run: serve it yourself)
//! ```
//! Any failure to get a complete response (no socket, refused connection, agent killed
//! mid-request, timeout, `refused`) means "the agent did not answer": the plugin then runs the
//! command itself under the network's `flock`. That is safe even when the agent did run it:
//! ADD of the same attachment returns the same addresses, DEL of a deleted one does nothing.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::admin::AdminCommand;

/// The protocol version this code speaks.
pub const VERSION: u32 = 1;
/// Where the plugin and the admin commands look for the agent unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/ipkeep/agent.sock";
/// The largest request the agent reads (a CNI config is at most 1 MiB, plus the environment).
pub const MAX_REQUEST_BYTES: usize = crate::netconf::MAX_CONFIG_BYTES + 64 * 1024;
/// The largest response the client reads.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// One request with its protocol version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// [`VERSION`] of the sender.
    pub version: u32,
    /// What to run.
    #[serde(flatten)]
    pub request: Request,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Request {
    /// A CNI command: the plugin's `CNI_*` environment and its stdin, unchanged.
    Cni {
        /// Every `CNI_*` variable the plugin was started with.
        env: BTreeMap<String, String>,
        /// The network configuration read from stdin.
        config: String,
    },
    /// An admin subcommand, parsed and resolved by the `ipkeep` that sends it.
    Admin(AdminCommand),
}

/// The agent's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    /// [`VERSION`] of the agent.
    pub version: u32,
    /// Set when the agent did not run the command; the client must run it itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// What the plugin process would have exited with.
    #[serde(default)]
    pub exit_code: i32,
    /// What it would have written to stdout.
    #[serde(default)]
    pub stdout: String,
    /// What it would have written to stderr: an admin command's errors, or a CNI command's log
    /// lines (formatted for the plugin's `ipam.logFile` or stderr).
    #[serde(default)]
    pub stderr: String,
}

impl Response {
    /// A refusal: the command was not run.
    pub fn refused(why: impl Into<String>) -> Self {
        Response {
            version: VERSION,
            refused: Some(why.into()),
            ..Response::default()
        }
    }
}

/// Why the agent did not answer; every case means "run it yourself".
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No socket, or nobody listening on it.
    #[error("cannot connect to the agent at {path}: {source}")]
    Connect {
        /// The socket.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The request could not be sent or the answer not read in time.
    #[error("the agent at {path} did not answer: {source}")]
    Io {
        /// The socket.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The answer was not a complete response (the agent died mid-request).
    #[error("the agent at {path} sent an incomplete or unreadable answer: {reason}")]
    Garbled {
        /// The socket.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The agent refused to run the command.
    #[error("the agent at {path} refused the command: {reason}")]
    Refused {
        /// The socket.
        path: String,
        /// The agent's reason.
        reason: String,
    },
}

impl ClientError {
    /// Whether the agent is simply not there (no socket file), the normal case on a node that
    /// does not run it.
    pub fn is_absent(&self) -> bool {
        matches!(self, ClientError::Connect { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Sends `request` to the agent at `socket` and waits at most `timeout` for each read or write.
pub fn call(socket: &Path, request: Request, timeout: Duration) -> Result<Response, ClientError> {
    let path = socket.display().to_string();
    let io = |source| ClientError::Io {
        path: path.clone(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: path.clone(),
        source,
    })?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    let body = serde_json::to_vec(&Envelope {
        version: VERSION,
        request,
    })
    .map_err(|e| ClientError::Garbled {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    stream.write_all(&body).map_err(io)?;
    stream.shutdown(Shutdown::Write).map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(MAX_RESPONSE_BYTES as u64)
        .read_to_end(&mut answer)
        .map_err(io)?;
    let response: Response = serde_json::from_slice(&answer).map_err(|e| ClientError::Garbled {
        path: path.clone(),
        reason: if answer.is_empty() {
            "connection closed without an answer".to_string()
        } else {
            e.to_string()
        },
    })?;
    match response.refused {
        Some(reason) => Err(ClientError::Refused { path, reason }),
        None => Ok(response),
    }
}

/// The `CNI_*` part of an environment: exactly what the agent needs to run the command.
pub fn cni_env<'a>(
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter(|(k, _)| k.starts_with("CNI_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn wire_shape_is_the_documented_one() {
        let env = BTreeMap::from([("CNI_COMMAND".to_string(), "ADD".to_string())]);
        let text = serde_json::to_string(&Envelope {
            version: VERSION,
            request: Request::Cni {
                env,
                config: "{}".into(),
            },
        })
        .unwrap();
        assert_eq!(
            text,
            r#"{"version":1,"cni":{"env":{"CNI_COMMAND":"ADD"},"config":"{}"}}"#
        );
        let admin: Envelope = serde_json::from_str(
            r#"{"version":1,"admin":{"release":{"target":{"network":"n","dataDir":"/d",
                "lockTimeout":{"secs":10,"nanos":0}},"pod":"db/kv-0","ifname":null,
                "includeActive":false}}}"#,
        )
        .unwrap();
        assert!(
            matches!(&admin.request, Request::Admin(AdminCommand::Release { pod, .. }) if pod == "db/kv-0"),
            "{admin:?}"
        );
        let r: Response = serde_json::from_str(r#"{"version":1,"refused":"busy"}"#).unwrap();
        assert_eq!(r.refused.as_deref(), Some("busy"));
    }

    fn status() -> Request {
        Request::Cni {
            env: BTreeMap::new(),
            config: String::new(),
        }
    }

    #[test]
    fn a_missing_socket_is_absent_and_a_dead_one_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("none.sock");
        let err = call(&missing, status(), Duration::from_secs(1)).unwrap_err();
        assert!(err.is_absent(), "{err}");
        // A socket file nobody listens on any more (the agent was killed).
        let dead = tmp.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        let err = call(&dead, status(), Duration::from_secs(1)).unwrap_err();
        assert!(
            !err.is_absent() && matches!(err, ClientError::Connect { .. }),
            "{err}"
        );
    }

    #[test]
    fn an_agent_that_dies_mid_request_is_garbled_not_an_answer() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).unwrap();
            s.write_all(br#"{"version":1,"exitCo"#).unwrap();
        });
        let err = call(&path, status(), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, ClientError::Garbled { .. }), "{err}");
        server.join().unwrap();
    }
}
