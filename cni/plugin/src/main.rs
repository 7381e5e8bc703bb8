//! `ipkeep`: a CNI IPAM plugin when `CNI_COMMAND` is set, an admin tool when run with
//! arguments, and a one-line self-description otherwise.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use ipkeep_cni::relay::{self, EarlySettings};
use ipkeep_cni::stores::OpenPerCall;
use ipkeep_cni::{admin, version};
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
        let cli = admin::Cli::parse();
        init_logging(&EarlySettings::default(), &vars);
        if !cli.agent_socket.is_empty() {
            let timeout = std::time::Duration::from_secs(60);
            let command = cli.command.clone();
            if let Some(answer) =
                relay::admin_via_agent(cli.agent_socket.as_ref(), command, timeout)
            {
                let _ = std::io::stdout().write_all(answer.stdout.as_bytes());
                let _ = std::io::stderr().write_all(answer.stderr.as_bytes());
                return ExitCode::from(u8::try_from(answer.exit_code).unwrap_or(1));
            }
        }
        return match admin::run(
            &OpenPerCall::default(),
            cli.command,
            &mut std::io::stdout().lock(),
        ) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                say!("ipkeep: error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    say!("CNI ipkeep plugin version {}", env!("CARGO_PKG_VERSION"));
    say!(
        "CNI protocol versions supported: {}",
        version::SUPPORTED.join(", ")
    );
    say!("Run `ipkeep --help` for the admin subcommands (list, release).");
    ExitCode::SUCCESS
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
    let mut input = Vec::new();
    if vars.get("CNI_COMMAND").map(String::as_str) != Some("VERSION") {
        // Bounded read; an I/O error or oversize input is reported by the plugin itself.
        let limit = ipkeep_cni::netconf::MAX_CONFIG_BYTES as u64 + 1;
        let _ = std::io::stdin().lock().take(limit).read_to_end(&mut input);
    }
    let settings = EarlySettings::read(&input);
    init_logging(&settings, vars);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let done = relay::cni(&settings, vars, &input, &mut std::io::stdout().lock(), now);
    if vars.contains_key("IPKEEP_TIMING") {
        say!("{}", done.timings.line());
    }
    ExitCode::from(u8::try_from(done.exit_code).unwrap_or(1))
}

/// Logs go to `ipam.logFile` (default level info) or stderr (default level warn); never to
/// stdout, which carries only the CNI protocol. `IPKEEP_LOG` overrides the level.
fn init_logging(settings: &EarlySettings, vars: &HashMap<String, String>) {
    let builder = settings.log_builder(vars.get("IPKEEP_LOG").map(String::as_str));
    let opened = settings.log_file.as_deref().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .inspect_err(|e| {
                say!("ipkeep: cannot open ipam.logFile {path}: {e}; logging to stderr")
            })
            .ok()
    });
    let _ = match opened {
        Some(f) => builder.with_writer(std::sync::Mutex::new(f)).try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
}
