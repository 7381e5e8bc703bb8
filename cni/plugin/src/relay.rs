//! Runs a command through the node agent when it answers, and in this process otherwise.
//!
//! The agent keeps the store open, so a command through it skips the `flock` and the database
//! open that dominate a plugin process's time. When it does not answer (not deployed,
//! restarting, killed mid-request, refusing) the command runs here exactly as before, and the
//! fallback is counted in the network directory for the agent's metrics.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use ipkeep_ipam::Reading;
use tracing::{debug, warn};

use crate::admin::AdminCommand;
use crate::error::CniError;
use crate::files;
use crate::netconf::{Decoded, Settings};
use crate::plugin::{self, Call, Completion, Tally, Timings};
use crate::proto::{self, Request};
use crate::stores::OpenPerCall;

/// How much longer than its budget the plugin waits for the agent's answer: the agent commits
/// nothing after the budget, and this margin covers writing the answer back.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(2);

/// How long a falling-back plugin waits for the flock before asking the agent again.
const FALLBACK_LOCK_SLICE: Duration = Duration::from_millis(250);

/// Runs one CNI invocation: through the agent, or here when it does not answer. `input` is
/// stdin as read, `config` its decoding.
pub fn cni(
    vars: &HashMap<String, String>,
    input: &[u8],
    config: &Result<Decoded, CniError>,
    stdout: &mut dyn Write,
    reading: Reading,
) -> Completion {
    let here = |stores: &OpenPerCall, out: &mut dyn Write| {
        let call = Call {
            reading: reading.clone(),
            deadline: None,
        };
        plugin::run(stores, vars, config, out, &call)
    };
    let is_version = vars.get("CNI_COMMAND").map(String::as_str) == Some("VERSION");
    // A configuration that does not decode gets the same error here as in the agent.
    let via_agent = config
        .as_ref()
        .ok()
        .filter(|_| !is_version)
        .and_then(|d| Some((d.settings.clone(), d.settings.agent_socket.clone()?)))
        .zip(std::str::from_utf8(input).ok());
    let Some(((settings, socket), text)) = via_agent else {
        return here(&OpenPerCall::default(), stdout);
    };
    // A falling-back plugin waits for the network's flock in short slices and asks the agent
    // again in between: an agent that came back holds the flock for good, so waiting the whole
    // lock timeout for it would only fail.
    let deadline = Instant::now() + settings.lock_timeout;
    let mut count_fallback = false;
    loop {
        let mut timings = Timings::begin();
        let started = Instant::now();
        let budget = deadline.saturating_duration_since(started);
        let request = Request::Cni {
            env: proto::cni_env(vars),
            config: text.to_string(),
            budget_ms: Some(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX)),
        };
        match proto::call(&socket, request, budget + ANSWER_MARGIN) {
            Ok(answer) => {
                let _ = stdout
                    .write_all(answer.stdout.as_bytes())
                    .and_then(|()| stdout.flush());
                // The command's log lines, formatted by the agent as this process would have.
                write_log(&settings, &answer.stderr);
                timings.record("agent", started);
                return Completion {
                    exit_code: answer.exit_code,
                    timings,
                    tally: Tally::default(),
                    command: None,
                };
            }
            Err(e) if e.is_absent() => {
                debug!(error = %e, "no agent; running the command here");
                return here(&OpenPerCall::default(), stdout);
            }
            Err(e) => {
                // Counted only when an agent was there to answer: a socket file nobody
                // listens on is what a restarting or killed agent leaves (it never removes
                // it); no file means no agent.
                if !count_fallback {
                    warn!(error = %e, "running the command here instead");
                }
                count_fallback = true;
            }
        }
        let last_try = Instant::now() >= deadline;
        let stores = OpenPerCall {
            count_fallback,
            max_wait: (!last_try).then_some(FALLBACK_LOCK_SLICE),
            ..OpenPerCall::default()
        };
        let mut out = Vec::new();
        let done = here(&stores, &mut out);
        if !stores.lock_busy.get() || last_try {
            let _ = stdout.write_all(&out).and_then(|()| stdout.flush());
            return done;
        }
        debug!("the network is locked (by a returning agent?); asking the agent again");
    }
}

/// Appends already formatted log lines where this process logs: `ipam.logFile`, else stderr.
fn write_log(settings: &Settings, text: &str) {
    if text.is_empty() {
        return;
    }
    let file = settings
        .log_file
        .as_deref()
        .and_then(|path| files::open_log(path).ok());
    let _ = match file {
        Some(mut f) => f.write_all(text.as_bytes()),
        None => std::io::stderr().write_all(text.as_bytes()),
    };
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
