//! `ipkeep-agent`: the node agent ([`ipkeep_agent::args::Args`]).

use clap::Parser;
use ipkeep_agent::args::Args;
use nix::sys::stat::{Mode, umask};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Every file the agent creates (lock, database, socket) is for root only.
    umask(Mode::from_bits_truncate(0o077));
    Args::parse().run().await?;
    Ok(())
}
