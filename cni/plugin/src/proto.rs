//! The plugin ↔ agent protocol and its blocking client (std only: the plugin stays small; the
//! agent uses the same types and framing).
//!
//! One request per connection on a unix stream socket:
//! 1. the client connects, writes one JSON [`Envelope`] (at most [`MAX_REQUEST_BYTES`]) and
//!    shuts down its write half;
//! 2. the agent answers with frames, `tag (1 byte) · length (4 bytes, big-endian) · payload`:
//!    `o` a chunk of stdout, `e` a chunk of stderr, then exactly one of `x` (the exit code,
//!    4 bytes big-endian, last frame), `r` (refused: the reason; the command was not run) or
//!    `n` (a JSON list of network namespace paths the agent cannot see; nothing was
//!    committed: the plugin, which runs on the host as the container runtime does, sends the
//!    request again with `netnsSeen` saying whether each exists).
//!
//! ```text
//! → {"version":2,"cni":{"env":{"CNI_COMMAND":"ADD","CNI_CONTAINERID":"…",…},
//!       "config":"{…stdin…}","budgetMs":10000}}
//! ← o{…CNI result…} e<log lines> x<0>
//! → {"version":2,"admin":{"list":{"target":{…},"json":true}}}
//! ← o<report, in chunks as it is produced> x<0>
//! ← r<shutting down>                                   (not run: serve it yourself)
//! ← n["/proc/4242/ns/net"]                             (say what the host sees, ask again)
//! → {"version":2,"cni":{…,"netnsSeen":{"/proc/4242/ns/net":false}}}
//! ```
//! A CNI request's `budgetMs` is how long the plugin waits for the answer (its lock timeout);
//! the agent commits nothing after that, so a command the plugin reported as failed never takes
//! effect later.
//!
//! Any failure to get a complete answer (no socket, refused connection, agent killed
//! mid-request, timeout, `r`) means "the agent did not answer": the plugin then runs the
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

/// The protocol version this code speaks (1 answered with one JSON document).
pub const VERSION: u32 = 2;
/// The largest request the agent reads (a CNI config is at most 1 MiB, plus the environment).
pub const MAX_REQUEST_BYTES: usize = crate::netconf::MAX_CONFIG_BYTES + 64 * 1024;
/// The largest frame either side writes.
pub const MAX_FRAME_BYTES: usize = 1 << 20;
/// The most stdout plus stderr a buffered answer (a CNI command's) may carry.
pub const MAX_BUFFERED_BYTES: usize = 16 << 20;

/// Frame tags.
pub mod tag {
    /// A chunk of stdout.
    pub const STDOUT: u8 = b'o';
    /// A chunk of stderr.
    pub const STDERR: u8 = b'e';
    /// The exit code; the last frame.
    pub const EXIT: u8 = b'x';
    /// Refused: not run; the last frame.
    pub const REFUSED: u8 = b'r';
    /// The agent cannot tell whether these network namespaces (a JSON list of paths) exist:
    /// nothing was committed; ask again with `netnsSeen`. The last frame.
    pub const ASK_NETNS: u8 = b'n';
}

/// The most network namespace paths one answer asks about (one per range set is the most a
/// pod's older sandbox has).
pub const MAX_NETNS_ASKED: usize = 16;

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
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Request {
    /// A CNI command: the plugin's `CNI_*` environment and its stdin, unchanged.
    Cni {
        /// Every `CNI_*` variable the plugin was started with.
        env: BTreeMap<String, String>,
        /// The network configuration read from stdin.
        config: String,
        /// How long the plugin waits for the answer, in milliseconds; nothing is committed
        /// after that.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget_ms: Option<u64>,
        /// Whether network namespace paths the agent asked about ([`tag::ASK_NETNS`]) exist,
        /// as the plugin sees them on the host.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        netns_seen: BTreeMap<String, bool>,
    },
    /// An admin subcommand, parsed and resolved by the `ipkeep` that sends it.
    Admin(AdminCommand),
}

/// A buffered answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    /// What the plugin process would have exited with.
    pub exit_code: i32,
    /// What it would have written to stdout.
    pub stdout: String,
    /// What it would have written to stderr: an admin command's errors, or a CNI command's log
    /// lines (formatted for the plugin's `ipam.logFile` or stderr).
    pub stderr: String,
}

/// Why the agent did not answer; every case but [`ClientError::Interrupted`] means "run it
/// yourself".
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
    /// The answer was not complete (the agent died mid-request) or not readable.
    #[error("the agent at {path} sent an incomplete or unreadable answer: {reason}")]
    Garbled {
        /// The socket.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The agent cannot see these network namespaces and asks what the host sees.
    #[error("the agent at {path} asks whether these network namespaces exist: {netns:?}")]
    AsksNetns {
        /// The socket.
        path: String,
        /// The paths.
        netns: Vec<String>,
    },
    /// The agent refused to run the command.
    #[error("the agent at {path} refused the command: {reason}")]
    Refused {
        /// The socket.
        path: String,
        /// The agent's reason.
        reason: String,
    },
    /// The answer stopped after part of it had already been passed on (a streamed admin
    /// report): it cannot be run again here without printing it twice.
    #[error("the agent at {path} stopped in the middle of its answer: {reason}")]
    Interrupted {
        /// The socket.
        path: String,
        /// What went wrong.
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

/// Writes one frame.
pub fn write_frame(out: &mut dyn Write, tag: u8, payload: &[u8]) -> std::io::Result<()> {
    for chunk in payload.chunks(MAX_FRAME_BYTES) {
        let len = u32::try_from(chunk.len()).unwrap_or(u32::MAX).to_be_bytes();
        out.write_all(&[tag])?;
        out.write_all(&len)?;
        out.write_all(chunk)?;
    }
    Ok(())
}

/// Reads one frame; `None` at a clean end of stream before any byte of a frame.
pub fn read_frame(input: &mut dyn Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match input.read(&mut head[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is larger than {MAX_FRAME_BYTES}"),
        ));
    }
    let mut payload = vec![0u8; len];
    input.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

/// A [`Write`] that sends everything written to it as frames with one tag (the agent's stdout
/// and stderr).
#[derive(Debug)]
pub struct FrameWriter<W: Write> {
    /// Where frames go.
    pub out: W,
    /// Their tag.
    pub tag: u8,
}

impl<W: Write> Write for FrameWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_frame(&mut self.out, self.tag, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn connect(socket: &Path, request: Request, timeout: Duration) -> Result<UnixStream, ClientError> {
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
    Ok(stream)
}

/// Sends `request` and reads the whole answer into memory (at most [`MAX_BUFFERED_BYTES`]),
/// waiting at most `timeout` for each read or write. Nothing of a partial answer is used.
pub fn call(socket: &Path, request: Request, timeout: Duration) -> Result<Response, ClientError> {
    let path = socket.display().to_string();
    let mut stream = connect(socket, request, timeout)?;
    let mut response = Response::default();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let garbled = |reason: String| ClientError::Garbled {
        path: path.clone(),
        reason,
    };
    loop {
        let frame = read_frame(&mut stream).map_err(|e| garbled(e.to_string()))?;
        match frame {
            None => {
                return Err(garbled(
                    "connection closed before the end of the answer".into(),
                ));
            }
            Some((tag::STDOUT, bytes)) => stdout.extend_from_slice(&bytes),
            Some((tag::STDERR, bytes)) => stderr.extend_from_slice(&bytes),
            Some((tag::EXIT, bytes)) => {
                let code: [u8; 4] = bytes
                    .try_into()
                    .map_err(|_| garbled("exit frame is not 4 bytes".into()))?;
                response.exit_code = i32::from_be_bytes(code);
                response.stdout = String::from_utf8_lossy(&stdout).into_owned();
                response.stderr = String::from_utf8_lossy(&stderr).into_owned();
                return Ok(response);
            }
            Some((tag::REFUSED, reason)) => {
                return Err(ClientError::Refused {
                    path,
                    reason: String::from_utf8_lossy(&reason).into_owned(),
                });
            }
            Some((tag::ASK_NETNS, list)) => {
                let netns: Vec<String> = serde_json::from_slice(&list)
                    .ok()
                    .filter(|l: &Vec<String>| !l.is_empty() && l.len() <= MAX_NETNS_ASKED)
                    .ok_or_else(|| garbled("unreadable list of network namespaces".into()))?;
                return Err(ClientError::AsksNetns { path, netns });
            }
            Some((other, _)) => return Err(garbled(format!("unknown frame tag {other}"))),
        }
        if stdout.len() + stderr.len() > MAX_BUFFERED_BYTES {
            return Err(garbled(format!(
                "answer larger than {MAX_BUFFERED_BYTES} bytes"
            )));
        }
    }
}

/// Sends `request` and passes its output on as it arrives (an admin report of any size).
/// Returns the exit code. Once anything was passed on, a broken answer is
/// [`ClientError::Interrupted`], never a reason to run the command again.
pub fn call_streaming(
    socket: &Path,
    request: Request,
    timeout: Duration,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<i32, ClientError> {
    let path = socket.display().to_string();
    let mut stream = connect(socket, request, timeout)?;
    let mut passed_on = false;
    let broken = |passed_on: bool, reason: String| {
        if passed_on {
            ClientError::Interrupted {
                path: path.clone(),
                reason,
            }
        } else {
            ClientError::Garbled {
                path: path.clone(),
                reason,
            }
        }
    };
    loop {
        let frame = read_frame(&mut stream).map_err(|e| broken(passed_on, e.to_string()))?;
        let (tag, bytes) = frame.ok_or_else(|| {
            broken(
                passed_on,
                "connection closed before the end of the answer".into(),
            )
        })?;
        let written = match tag {
            tag::STDOUT => stdout.write_all(&bytes),
            tag::STDERR => stderr.write_all(&bytes),
            tag::EXIT => {
                let code: [u8; 4] = bytes
                    .try_into()
                    .map_err(|_| broken(passed_on, "exit frame is not 4 bytes".into()))?;
                return Ok(i32::from_be_bytes(code));
            }
            tag::REFUSED if !passed_on => {
                return Err(ClientError::Refused {
                    path,
                    reason: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            other => return Err(broken(passed_on, format!("unexpected frame tag {other}"))),
        };
        passed_on = true;
        written.map_err(|e| broken(true, format!("writing the output: {e}")))?;
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
                budget_ms: Some(10_000),
                netns_seen: BTreeMap::new(),
            },
        })
        .unwrap();
        assert_eq!(
            text,
            r#"{"version":2,"cni":{"env":{"CNI_COMMAND":"ADD"},"config":"{}","budgetMs":10000}}"#
        );
        let admin: Envelope = serde_json::from_str(
            r#"{"version":2,"admin":{"release":{"target":{"network":"n","dataDir":"/d",
                "lockTimeout":{"secs":10,"nanos":0}},"pod":"db/kv-0","ifname":null,
                "includeActive":false}}}"#,
        )
        .unwrap();
        assert!(
            matches!(&admin.request, Request::Admin(AdminCommand::Release { pod, .. }) if pod == "db/kv-0"),
            "{admin:?}"
        );
    }

    #[test]
    fn frames_round_trip_and_big_payloads_are_split() {
        let mut buf = Vec::new();
        write_frame(&mut buf, tag::STDOUT, &vec![7u8; MAX_FRAME_BYTES + 3]).unwrap();
        write_frame(&mut buf, tag::EXIT, &3i32.to_be_bytes()).unwrap();
        let mut input = &buf[..];
        let (t, a) = read_frame(&mut input).unwrap().unwrap();
        assert_eq!((t, a.len()), (tag::STDOUT, MAX_FRAME_BYTES));
        let (_, b) = read_frame(&mut input).unwrap().unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(
            read_frame(&mut input).unwrap(),
            Some((tag::EXIT, 3i32.to_be_bytes().to_vec()))
        );
        assert_eq!(read_frame(&mut input).unwrap(), None);
        let mut torn = &buf[..3];
        assert!(read_frame(&mut torn).is_err());
        let mut huge = &[b'o', 0xff, 0xff, 0xff, 0xff][..];
        assert!(read_frame(&mut huge).is_err());
    }

    fn status() -> Request {
        Request::Cni {
            env: BTreeMap::new(),
            config: String::new(),
            budget_ms: None,
            netns_seen: BTreeMap::new(),
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

    /// An agent that answers with `frames` and then closes.
    fn agent(frames: Vec<(u8, Vec<u8>)>) -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("a.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).unwrap();
            for (t, p) in frames {
                write_frame(&mut s, t, &p).unwrap();
            }
        });
        (tmp, path)
    }

    #[test]
    fn an_agent_that_dies_mid_answer_is_garbled_not_an_answer() {
        let (_tmp, path) = agent(vec![(tag::STDOUT, b"{\"cniVer".to_vec())]);
        let err = call(&path, status(), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, ClientError::Garbled { .. }), "{err}");
    }

    #[test]
    fn a_streamed_answer_is_passed_on_and_its_end_is_told_apart() {
        let (_tmp, path) = agent(vec![
            (tag::STDOUT, b"part one ".to_vec()),
            (tag::STDOUT, b"part two".to_vec()),
            (tag::STDERR, b"note".to_vec()),
            (tag::EXIT, 0i32.to_be_bytes().to_vec()),
        ]);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = call_streaming(&path, status(), Duration::from_secs(5), &mut out, &mut err);
        assert_eq!(code.unwrap(), 0);
        assert_eq!(
            (&out[..], &err[..]),
            (&b"part one part two"[..], &b"note"[..])
        );
        let (_tmp, path) = agent(vec![(tag::STDOUT, b"half".to_vec())]);
        let err = call_streaming(
            &path,
            status(),
            Duration::from_secs(5),
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(matches!(err, ClientError::Interrupted { .. }), "{err}");
        let (_tmp, path) = agent(vec![(tag::REFUSED, b"not mine".to_vec())]);
        let err = call(&path, status(), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, ClientError::Refused { reason, .. } if reason == "not mine"));
    }
}
