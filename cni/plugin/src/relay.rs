//! Runs a command through the node agent when it answers, and in this process otherwise.
//!
//! The agent keeps the store open, so a command through it skips the `flock` and the database
//! open that dominate a plugin process's time. When it does not answer (not deployed,
//! restarting, killed mid-request, refusing) the command runs here exactly as before, and the
//! fallback is counted in the network directory for the agent's metrics.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use ipkeep_ipam::Reading;
use tracing::{debug, warn};

use crate::admin::{self, AdminCommand, AdminError, Cli};
use crate::error::CniError;
use crate::files;
use crate::management::NoApiView;
use crate::netconf::NetworkConfig;
use crate::plugin::{self, Call, Completion, Tally};
use crate::proto::{self, Request};
use crate::stores::OpenPerCall;
use crate::timings::Timings;

/// How much longer than its budget the plugin waits for the agent's answer: the agent commits
/// nothing after the budget, and this margin covers writing the answer back.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(2);

/// How long a falling-back plugin waits for the flock before asking the agent again.
const FALLBACK_LOCK_SLICE: Duration = Duration::from_millis(250);

/// Runs one CNI invocation: through the agent, or here when it does not answer. `input` is
/// stdin as read, `config` its decoding. The agent's log lines come back in
/// [`Completion::log`], for this process to write where it logs.
pub fn cni(
    vars: &HashMap<String, String>,
    input: &[u8],
    config: &Result<NetworkConfig, CniError>,
    reading: Reading,
) -> Completion {
    // Run here, the plugin has no view of the API server: the pod's annotations decide.
    let here = |stores: &OpenPerCall, alone: NoApiView| {
        let call = Call {
            reading: reading.clone(),
            deadline: None,
            api: &alone,
            capture_log: None,
        };
        plugin::run(stores, vars, config, &call)
    };
    let is_version = vars.get("CNI_COMMAND").map(String::as_str) == Some("VERSION");
    // A configuration that does not decode gets the same error here as in the agent.
    let via_agent = config
        .as_ref()
        .ok()
        .filter(|_| !is_version)
        .and_then(|d| Some((d.settings.lock_timeout, d.settings.agent_socket.clone()?)))
        .zip(std::str::from_utf8(input).ok());
    let Some(((lock_timeout, socket), text)) = via_agent else {
        let alone = NoApiView::new("the plugin runs without the node agent", false);
        return here(&OpenPerCall::default(), alone);
    };
    // A falling-back plugin waits for the network's flock in short slices and asks the agent
    // again in between: an agent that came back holds the flock for good, so waiting the whole
    // lock timeout for it would only fail.
    let deadline = Instant::now() + lock_timeout;
    let mut count_fallback = false;
    let mut netns_seen = BTreeMap::new();
    loop {
        let mut timings = Timings::begin();
        let started = Instant::now();
        let budget = deadline.saturating_duration_since(started);
        let request = Request::Cni {
            env: proto::cni_env(vars),
            config: text.to_string(),
            budget_ms: Some(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX)),
            netns_seen: netns_seen.clone(),
        };
        let unanswered = match proto::call(&socket, request, budget + ANSWER_MARGIN) {
            Ok(answer) => {
                timings.record("agent", started);
                return Completion {
                    exit_code: answer.exit_code,
                    stdout: answer.stdout.into_bytes(),
                    // Formatted by the agent as this process would have.
                    log: answer.stderr.into_bytes(),
                    timings,
                    tally: Tally::default(),
                    notices: Vec::new(),
                    command: None,
                    refused: None,
                    needs_netns: Vec::new(),
                };
            }
            Err(e) if e.is_absent() => {
                debug!(error = %e, "no agent; running the command here");
                let alone = NoApiView::new(format!("no node agent on this node: {e}"), false);
                return here(&OpenPerCall::default(), alone);
            }
            // The agent cannot see where the runtime keeps these sandboxes' network
            // namespaces; this process runs on the host, as the runtime does. Asked once: an
            // agent that asks again about what it was told is broken, and is fallen back from.
            Err(proto::ClientError::AsksNetns { netns, .. })
                if netns.iter().any(|n| !netns_seen.contains_key(n)) =>
            {
                debug!(
                    ?netns,
                    "the agent asks whether these network namespaces exist"
                );
                for path in netns {
                    let exists = files::netns_exists(&path);
                    netns_seen.insert(path, exists);
                }
                continue;
            }
            Err(e) => {
                // Counted only when an agent was there to answer: a socket file nobody
                // listens on is what a restarting or killed agent leaves (it never removes
                // it); no file means no agent.
                if !count_fallback {
                    warn!(error = %e, "running the command here instead");
                }
                count_fallback = true;
                NoApiView::new(
                    format!("the node agent did not serve the command: {e}"),
                    true,
                )
            }
        };
        let last_try = Instant::now() >= deadline;
        let stores = OpenPerCall {
            count_fallback,
            max_wait: (!last_try).then_some(FALLBACK_LOCK_SLICE),
            ..OpenPerCall::default()
        };
        let done = here(&stores, unanswered);
        if !stores.lock_busy.get() || last_try {
            return done;
        }
        debug!("the network is locked (by a returning agent?); asking the agent again");
    }
}

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminFailed {
    /// The node agent took the command but its answer broke off (never run again here).
    #[error(transparent)]
    Agent(#[from] proto::ClientError),
    /// Run here, on the store.
    #[error(transparent)]
    Here(#[from] AdminError),
}

/// Runs an admin command inside the node agent at `--agent-socket` when it answers, passing its
/// report on as it arrives, else on the store directly. An answer cut off after part of it was
/// printed is an error, never run again. Returns the exit code.
pub fn admin(
    cli: Cli,
    timeout: Duration,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
    reading: &Reading,
) -> Result<i32, AdminFailed> {
    if !cli.agent_socket.is_empty() {
        let socket = std::path::Path::new(&cli.agent_socket);
        if let Some(answer) = admin_via_agent(socket, cli.command.clone(), timeout, stdout, stderr)
        {
            return Ok(answer?);
        }
    }
    admin::run(&OpenPerCall::default(), cli.command, stdout, reading)?;
    Ok(0)
}

/// Runs an admin command through the agent, passing its report on as it arrives. `None` when
/// the agent did not answer (the caller runs the command itself); an answer cut off after part
/// of it was printed is an error, never run again.
pub fn admin_via_agent(
    socket: &std::path::Path,
    command: AdminCommand,
    timeout: Duration,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Option<Result<i32, proto::ClientError>> {
    match proto::call_streaming(socket, Request::Admin(command), timeout, stdout, stderr) {
        Ok(code) => Some(Ok(code)),
        Err(e @ proto::ClientError::Interrupted { .. }) => Some(Err(e)),
        Err(e) if e.is_absent() => None,
        Err(e) => {
            warn!(error = %e, "opening the store directly");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::Read;
    use std::os::unix::net::UnixListener;
    use std::path::Path;

    use ipkeep_ipam::NetworkDir;

    use super::*;
    use crate::netconf;
    use crate::proto::{Envelope, tag, write_frame};
    use crate::stores::fallback_count;

    fn vars() -> HashMap<String, String> {
        [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/run/netns/none"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn conf(data: &Path, socket: &Path) -> String {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"net","ipam":{{"dataDir":"{}","agentSocket":"{}","logFile":"{}","lockTimeout":"2s","ranges":[[{{"subnet":"10.6.0.0/24"}}]]}}}}"#,
            data.display(),
            socket.display(),
            data.join("ipkeep.log").display()
        )
    }

    /// Relays one ADD; returns the exit code, stdout and the log lines to write.
    fn relay_logged(conf: &str) -> (i32, String, String) {
        let config = netconf::decode(conf.as_bytes());
        let done = cni(&vars(), conf.as_bytes(), &config, Reading::wall(1_000));
        (
            done.exit_code,
            String::from_utf8(done.stdout).unwrap(),
            String::from_utf8(done.log).unwrap(),
        )
    }

    /// Relays one ADD; returns the exit code and stdout.
    fn relay(conf: &str) -> (i32, String) {
        let (code, out, _) = relay_logged(conf);
        (code, out)
    }

    /// An agent that answers one request with `frames`, after checking the request.
    fn agent(socket: &Path, frames: Vec<(u8, Vec<u8>)>) -> std::thread::JoinHandle<Envelope> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut body = Vec::new();
            s.read_to_end(&mut body).unwrap();
            for (t, p) in frames {
                let _ = write_frame(&mut s, t, &p);
            }
            serde_json::from_slice(&body).unwrap()
        })
    }

    fn network(data: &Path) -> NetworkDir {
        NetworkDir::new(data, "net").unwrap()
    }

    #[test]
    fn without_an_agent_the_command_runs_here_uncounted() {
        let tmp = tempfile::tempdir().unwrap();
        let (code, out) = relay(&conf(tmp.path(), &tmp.path().join("none.sock")));
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("10.6.0.2"), "{out}");
        assert!(network(tmp.path()).exists());
        assert_eq!(fallback_count(&network(tmp.path())), 0);
    }

    #[test]
    fn the_agents_answer_is_the_answer_with_its_log_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("agent.sock");
        let served = agent(
            &socket,
            vec![
                (
                    tag::STDOUT,
                    b"{\"cniVersion\":\"1.0.0\",\"ips\":[]}".to_vec(),
                ),
                (tag::STDERR, b"a line the agent logged\n".to_vec()),
                (tag::EXIT, 0i32.to_be_bytes().to_vec()),
            ],
        );
        let (code, out, log) = relay_logged(&conf(tmp.path(), &socket));
        assert_eq!(
            (code, out.as_str(), log.as_str()),
            (
                0,
                r#"{"cniVersion":"1.0.0","ips":[]}"#,
                "a line the agent logged\n"
            )
        );
        let request = served.join().unwrap();
        assert!(
            matches!(&request.request, Request::Cni { budget_ms: Some(ms), .. } if *ms <= 2_000 && *ms > 0),
            "the plugin tells the agent how long it waits: {request:?}"
        );
        assert!(!network(tmp.path()).exists(), "nothing done here");
    }

    #[test]
    fn a_refusal_or_a_broken_answer_is_served_here_and_counted() {
        for frames in [
            vec![(tag::REFUSED, b"not my data directory".to_vec())],
            vec![(tag::STDOUT, b"{\"cniVers".to_vec())],
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let socket = tmp.path().join("agent.sock");
            let served = agent(&socket, frames);
            let (code, out) = relay(&conf(tmp.path(), &socket));
            served.join().unwrap();
            assert_eq!(code, 0, "{out}");
            assert!(out.contains("10.6.0.2"), "{out}");
            assert_eq!(fallback_count(&network(tmp.path())), 1);
        }
    }
}
