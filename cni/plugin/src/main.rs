//! `ipkeep`: a CNI IPAM plugin when `CNI_COMMAND` is set, an admin tool when run with
//! arguments, and a one-line self-description otherwise ([`ipkeep_cni::process`]).

use std::process::ExitCode;

use clap::Parser;
use ipkeep_cni::{admin, process};
use nix::sys::stat::{Mode, umask};

fn main() -> ExitCode {
    // Every file ipkeep creates (lock, database) is readable by root only.
    umask(Mode::from_bits_truncate(0o077));
    let vars = process::environment();
    let stdout = &mut std::io::stdout().lock();
    let code = if vars.contains_key("CNI_COMMAND") {
        process::cni(&vars, &mut std::io::stdin().lock(), stdout)
    } else if std::env::args_os().len() > 1 {
        process::admin(admin::Cli::parse(), &vars, stdout)
    } else {
        process::describe(&mut std::io::stderr())
    };
    ExitCode::from(code)
}
