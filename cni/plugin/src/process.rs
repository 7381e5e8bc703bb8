//! The `ipkeep` process as a function of its environment, stdin and stdout: a CNI invocation
//! (stdin read bounded, decoded once, logging set up, a panic still answered in the protocol),
//! an admin subcommand, or the self-description. `main.rs` passes the real ones.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use ipkeep_ipam::disk::system_reading;

use crate::admin::Cli;
use crate::error::{CniError, code};
use crate::netconf::{self, Settings};
use crate::relay::{self, AdminFailed};
use crate::{files, logs, version};

/// Like `eprintln!`, but a closed stderr is ignored instead of aborting the plugin after it
/// has already done its work.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// How long an admin command waits for the node agent's whole report.
const ADMIN_VIA_AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// The process environment, without the variables whose name or value is not UTF-8 (no CNI
/// variable is).
pub fn environment() -> HashMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Runs one CNI invocation (`CNI_COMMAND` is set): reads the network configuration from
/// `stdin` (except for VERSION), at most one byte more than [`netconf::MAX_CONFIG_BYTES`],
/// decodes it once, logs where it says, and runs the command through the agent or here
/// ([`relay::cni`]). A panic still writes a CNI error to stdout: the runtime reads stdout, not
/// a backtrace. Returns the exit code.
pub fn cni(vars: &HashMap<String, String>, stdin: &mut dyn Read, stdout: &mut dyn Write) -> u8 {
    std::panic::set_hook(Box::new(|info| {
        let err = CniError::new(
            code::GENERIC,
            format!("ipkeep internal error, please report it: {info}"),
        );
        let _ = writeln!(std::io::stdout(), "{}", err.to_json(None));
        say!("ipkeep: {info}");
    }));
    let reading = system_reading();
    let is_version = vars.get("CNI_COMMAND").map(String::as_str) == Some("VERSION");
    let mut input = Vec::new();
    let read = if is_version {
        Ok(0)
    } else {
        // Bounded: one byte more than the largest configuration, which decode then refuses.
        let limit = netconf::MAX_CONFIG_BYTES as u64 + 1;
        stdin.take(limit).read_to_end(&mut input)
    };
    // The configuration is decoded once, here; every later step reads the result.
    let config = match read {
        Err(e) => Err(CniError::new(
            code::IO_FAILURE,
            format!("failed to read the network configuration from stdin: {e}"),
        )),
        Ok(_) => netconf::decode(&input),
    };
    let settings = config
        .as_ref()
        .map_or_else(|_| Settings::default(), |d| d.settings.clone());
    init_logging(&settings, vars);
    let done = relay::cni(vars, &input, &config, reading);
    // If stdout is gone the runtime is gone too; nothing useful is left to do.
    let _ = stdout.write_all(&done.stdout).and_then(|()| stdout.flush());
    write_log(&settings, &done.log);
    if vars.contains_key("IPKEEP_TIMING") {
        say!("{}", done.timings.line());
    }
    u8::try_from(done.exit_code).unwrap_or(1)
}

/// Runs an admin subcommand: inside the node agent when it answers at `--agent-socket`, else
/// on the store directly ([`relay::admin`]). Errors go to stderr as `ipkeep: error: …`.
/// Returns the exit code.
pub fn admin(cli: Cli, vars: &HashMap<String, String>, stdout: &mut dyn Write) -> u8 {
    init_logging(&Settings::default(), vars);
    let stderr = &mut std::io::stderr().lock();
    match relay::admin(
        cli,
        ADMIN_VIA_AGENT_TIMEOUT,
        stdout,
        stderr,
        &system_reading(),
    ) {
        Ok(code) => u8::try_from(code).unwrap_or(1),
        // The agent's error says all; a local one is followed by its causes.
        Err(AdminFailed::Agent(e)) => {
            say!("ipkeep: error: {e}");
            1
        }
        Err(AdminFailed::Here(e)) => {
            say!("ipkeep: error: {}", with_causes(&e));
            1
        }
    }
}

/// What `ipkeep` run without arguments prints: what it is and which CNI versions it speaks.
pub fn describe(out: &mut dyn Write) -> u8 {
    let _ = writeln!(
        out,
        "CNI ipkeep plugin version {}",
        env!("CARGO_PKG_VERSION")
    )
    .and_then(|()| {
        writeln!(
            out,
            "CNI protocol versions supported: {}",
            version::SUPPORTED.join(", ")
        )
    })
    .and_then(|()| {
        writeln!(
            out,
            "Run `ipkeep --help` for the admin subcommands (list, release)."
        )
    });
    0
}

/// `error: cause: cause…`.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// Appends log lines formatted elsewhere (by the node agent, as this process would have) where
/// this process logs: `ipam.logFile`, else stderr.
fn write_log(settings: &Settings, lines: &[u8]) {
    if lines.is_empty() {
        return;
    }
    let file = settings
        .log_file
        .as_deref()
        .and_then(|path| files::open_log(path).ok());
    let _ = match file {
        Some(mut f) => f.write_all(lines),
        None => std::io::stderr().write_all(lines),
    };
}

/// Logs go to `ipam.logFile` or stderr, never stdout (see [`logs`]).
fn init_logging(settings: &Settings, vars: &HashMap<String, String>) {
    let builder = logs::builder(settings, vars.get("IPKEEP_LOG").map(String::as_str));
    let opened = settings.log_file.as_deref().and_then(|path| {
        files::open_log(path)
            .inspect_err(|e| {
                say!(
                    "ipkeep: cannot open ipam.logFile {}: {e}; logging to stderr",
                    path.display()
                )
            })
            .ok()
    });
    let _ = match opened {
        Some(f) => builder.with_writer(std::sync::Mutex::new(f)).try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
}
