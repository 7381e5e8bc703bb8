//! `ipkeep-controller`: the PersistentPodState controller binary. Everything it does, flags
//! included, is [`ipkeep_controller::Args`].

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(ipkeep_controller::Args::parse().run().await?)
}
