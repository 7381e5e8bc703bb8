//! Runs a command through the node agent when it answers, and in this process otherwise.
//!
//! The agent keeps the store open, so a command through it skips the `flock` and the database
//! open that dominate a plugin process's time. When it does not answer (not deployed,
//! restarting, killed mid-request) the command runs here exactly as before, and the fallback is
//! counted in the network directory for the agent's metrics.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::admin::AdminCommand;
use crate::netconf::DEFAULT_LOCK_TIMEOUT;
use crate::plugin::{self, Completion, Tally, Timings};
use crate::proto::{self, Request};
use crate::stores::OpenPerCall;

/// What the plugin reads from its configuration before the real parse (leniently: a broken
/// configuration is reported by the command itself, wherever it runs).
#[derive(Debug, Clone, Default)]
pub struct EarlySettings {
    /// `ipam.logFile`.
    pub log_file: Option<String>,
    /// `ipam.logLevel`.
    pub log_level: Option<String>,
    /// `ipam.agentSocket`: default [`proto::DEFAULT_SOCKET`]; empty turns the agent off.
    pub agent_socket: Option<PathBuf>,
    /// `ipam.lockTimeout`, which also bounds the wait for the agent.
    pub lock_timeout: Duration,
}

impl EarlySettings {
    /// Reads the settings from the raw configuration.
    pub fn read(input: &[u8]) -> Self {
        let value: serde_json::Value = serde_json::from_slice(input).unwrap_or_default();
        let get = |k: &str| value.get("ipam")?.get(k)?.as_str().map(str::to_string);
        let agent_socket = match get("agentSocket") {
            None => Some(PathBuf::from(proto::DEFAULT_SOCKET)),
            Some(s) if s.is_empty() => None,
            Some(s) => Some(PathBuf::from(s)),
        };
        EarlySettings {
            log_file: get("logFile"),
            log_level: get("logLevel"),
            agent_socket,
            lock_timeout: get("lockTimeout")
                .and_then(|t| humantime::parse_duration(&t).ok())
                .unwrap_or(DEFAULT_LOCK_TIMEOUT),
        }
    }
}

impl EarlySettings {
    /// The log level: `IPKEEP_LOG` from the plugin's environment, else `ipam.logLevel`, else
    /// info with a log file and warn without.
    pub fn level(&self, ipkeep_log: Option<&str>) -> tracing::Level {
        ipkeep_log
            .or(self.log_level.as_deref())
            .and_then(|l| l.parse().ok())
            .unwrap_or(if self.log_file.is_some() {
                tracing::Level::INFO
            } else {
                tracing::Level::WARN
            })
    }

    /// The plugin's log format (the agent formats a command's logs the same way).
    pub fn log_builder(
        &self,
        ipkeep_log: Option<&str>,
    ) -> tracing_subscriber::fmt::SubscriberBuilder {
        tracing_subscriber::fmt()
            .with_max_level(self.level(ipkeep_log))
            .with_target(false)
            .with_ansi(false)
    }
}

/// How long the plugin waits for the agent's answer: the lock timeout (what the command may
/// wait for the store either way) plus a margin for the work itself.
fn agent_timeout(settings: &EarlySettings) -> Duration {
    settings.lock_timeout + Duration::from_secs(5)
}

/// Runs one CNI invocation: through the agent, or here when it does not answer.
pub fn cni(
    settings: &EarlySettings,
    vars: &HashMap<String, String>,
    input: &[u8],
    stdout: &mut dyn Write,
    now: u64,
) -> Completion {
    let is_version = vars.get("CNI_COMMAND").map(String::as_str) == Some("VERSION");
    let via_agent = settings
        .agent_socket
        .as_ref()
        .filter(|_| !is_version)
        .zip(std::str::from_utf8(input).ok());
    let Some((socket, config)) = via_agent else {
        return plugin::run(&OpenPerCall::default(), vars, &mut &input[..], stdout, now);
    };
    // A falling-back plugin waits for the network's flock in short slices and asks the agent
    // again in between: an agent that came back holds the flock for good, so waiting the whole
    // lock timeout for it would only fail.
    let deadline = Instant::now() + settings.lock_timeout;
    let mut count_fallback = false;
    loop {
        let mut timings = Timings::begin();
        let started = Instant::now();
        let request = Request::Cni {
            env: proto::cni_env(vars),
            config: config.to_string(),
        };
        match proto::call(socket, request, agent_timeout(settings)) {
            Ok(answer) => {
                let _ = stdout
                    .write_all(answer.stdout.as_bytes())
                    .and_then(|()| stdout.flush());
                // The command's log lines, formatted by the agent as this process would have.
                write_log(settings, &answer.stderr);
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
                return plugin::run(&OpenPerCall::default(), vars, &mut &input[..], stdout, now);
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
        let done = plugin::run(&stores, vars, &mut &input[..], &mut out, now);
        if !stores.lock_busy.get() || last_try {
            let _ = stdout.write_all(&out).and_then(|()| stdout.flush());
            return done;
        }
        debug!("the network is locked (by a returning agent?); asking the agent again");
    }
}

/// How long a falling-back plugin waits for the flock before asking the agent again.
const FALLBACK_LOCK_SLICE: Duration = Duration::from_millis(250);

/// Appends already formatted log lines where this process logs: `ipam.logFile`, else stderr.
fn write_log(settings: &EarlySettings, text: &str) {
    if text.is_empty() {
        return;
    }
    let file = settings.log_file.as_ref().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    });
    let _ = match file {
        Some(mut f) => f.write_all(text.as_bytes()),
        None => std::io::stderr().write_all(text.as_bytes()),
    };
}

/// What an admin command through the agent produced, or `None` when it did not answer.
pub fn admin_via_agent(
    socket: &std::path::Path,
    command: AdminCommand,
    timeout: Duration,
) -> Option<proto::Response> {
    match proto::call(socket, Request::Admin(command), timeout) {
        Ok(answer) => Some(answer),
        Err(e) if e.is_absent() => None,
        Err(e) => {
            warn!(error = %e, "opening the store directly");
            None
        }
    }
}
