//! `ipkeep-demo`: the whole system end to end on this machine (`ipkeep_e2e::cli`; docs/demo.md).

use std::process::ExitCode;

use clap::Parser;
use ipkeep_e2e::cli::{Cli, run};

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    match run(&Cli::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ipkeep-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}
