//! `ipkeep-soak`: a randomized chaos soak on a real-node cluster (`ipkeep_e2e::soak`;
//! docs/soak.md).

use std::process::ExitCode;

use clap::Parser;
use ipkeep_e2e::soak::cli::{Cli, main as soak};

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    match soak(&Cli::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ipkeep-soak: {e:#}");
            ExitCode::FAILURE
        }
    }
}
