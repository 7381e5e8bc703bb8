//! `ipkeep-scheduler-ext`: the flags are [`ipkeep_scheduler_ext::Args`]; `--help` lists them.

use clap::Parser;
use ipkeep_scheduler_ext::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(Args::parse().run().await?)
}
