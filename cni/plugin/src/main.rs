//! `ipkeep`: a CNI IPAM plugin when `CNI_COMMAND` is set, an admin tool when run with
//! arguments, and a one-line self-description otherwise.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ipkeep_cni::netconf::{self, Settings};
use ipkeep_cni::stores::OpenPerCall;
use ipkeep_cni::{admin, files, logs, relay, version};
use ipkeep_ipam::disk::system_reading;
use nix::sys::stat::{Mode, umask};

/// Like `eprintln!`, but a closed stderr is ignored instead of aborting the plugin after it
/// has already done its work.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    // Every file ipkeep creates (lock, database) is readable by root only.
    umask(Mode::from_bits_truncate(0o077));
    let vars: HashMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    if vars.contains_key("CNI_COMMAND") {
        return cni(&vars);
    }
    if std::env::args_os().len() > 1 {
        return admin_command(&vars);
    }
    say!("CNI ipkeep plugin version {}", env!("CARGO_PKG_VERSION"));
    say!(
        "CNI protocol versions supported: {}",
        version::SUPPORTED.join(", ")
    );
    say!("Run `ipkeep --help` for the admin subcommands (list, release).");
    ExitCode::SUCCESS
}

fn admin_command(vars: &HashMap<String, String>) -> ExitCode {
    let cli = admin::Cli::parse();
    init_logging(&Settings::default(), vars);
    if !cli.agent_socket.is_empty() {
        let answer = relay::admin_via_agent(
            cli.agent_socket.as_ref(),
            cli.command.clone(),
            Duration::from_secs(60),
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        );
        match answer {
            Some(Ok(code)) => return ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Some(Err(e)) => {
                say!("ipkeep: error: {e}");
                return ExitCode::FAILURE;
            }
            None => {}
        }
    }
    match admin::run(
        &OpenPerCall::default(),
        cli.command,
        &mut std::io::stdout().lock(),
        &system_reading(),
    ) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            say!("ipkeep: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn cni(vars: &HashMap<String, String>) -> ExitCode {
    // A bug must still answer in the protocol: the runtime reads stdout, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let err = ipkeep_cni::CniError::new(
            ipkeep_cni::error::code::GENERIC,
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
        std::io::stdin().lock().take(limit).read_to_end(&mut input)
    };
    // The configuration is decoded once, here; every later step reads the result.
    let config = match read {
        Err(e) => Err(ipkeep_cni::CniError::new(
            ipkeep_cni::error::code::IO_FAILURE,
            format!("failed to read the network configuration from stdin: {e}"),
        )),
        Ok(_) => netconf::decode(&input),
    };
    let settings = config
        .as_ref()
        .map_or_else(|_| Settings::default(), |d| d.settings.clone());
    init_logging(&settings, vars);
    let done = relay::cni(
        vars,
        &input,
        &config,
        &mut std::io::stdout().lock(),
        reading,
    );
    if vars.contains_key("IPKEEP_TIMING") {
        say!("{}", done.timings.line());
    }
    ExitCode::from(u8::try_from(done.exit_code).unwrap_or(1))
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
