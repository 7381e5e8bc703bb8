//! The three stores under comparison, opened the way the plugin (one process per command) or the
//! node agent (one long-lived process) opens them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipkeep_ipam::disk::StoreOptions;
use ipkeep_ipam::store::{Store, StoreError};
use ipkeep_ipam::{DiskStore, NetworkDir};

use crate::sled_store::{self, SledOptions, SledStore};

/// Which store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// sled 0.34.7 as pre-release ipkeep used it.
    Sled,
    /// sled 0.34.7 with the stale-snapshot removal and an fdatasync after each flush.
    SledFixed,
    /// redb 4.6.0: today's `DiskStore`.
    Redb,
}

impl Backend {
    /// Every backend, in table order.
    pub const ALL: [Backend; 3] = [Backend::Sled, Backend::SledFixed, Backend::Redb];

    /// The name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sled => "sled",
            Backend::SledFixed => "sled-fixed",
            Backend::Redb => "redb",
        }
    }

    /// The database's file or directory inside the network directory.
    pub fn db_path(self, net: &Path) -> PathBuf {
        match self {
            Backend::Sled | Backend::SledFixed => net.join(sled_store::DB_DIR),
            Backend::Redb => net.join("leases.redb"),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who opens the store, which decides the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Opener {
    /// The CNI plugin's per-call open (redb: 4 MiB cache, no checksum pass).
    Plugin,
    /// The node agent's open (redb: 8 MiB cache, every page's checksum verified on open).
    Agent,
}

/// The network every check uses.
pub const NETWORK: &str = "net";

/// How long an opener waits for the network lock.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// The network directory under a data directory.
pub fn network_dir(data_dir: &Path) -> NetworkDir {
    #[allow(clippy::expect_used)]
    NetworkDir::new(data_dir, NETWORK).expect("the network name is valid")
}

/// Takes the network's lock and opens its store.
pub fn open(
    backend: Backend,
    data_dir: &Path,
    opener: Opener,
) -> Result<Box<dyn Store>, StoreError> {
    let lock = network_dir(data_dir).lock(LOCK_TIMEOUT)?;
    crate::phase("locked");
    Ok(match backend {
        Backend::Sled | Backend::SledFixed => {
            let options = if backend == Backend::Sled {
                SledOptions::as_shipped()
            } else {
                SledOptions::fixed()
            };
            Box::new(SledStore::open(lock, &options)?)
        }
        Backend::Redb => {
            let options = match opener {
                Opener::Plugin => StoreOptions::default(),
                // As cni/agent/src/stores.rs opens it.
                Opener::Agent => StoreOptions {
                    cache_bytes: 8 << 20,
                    verify: true,
                },
            };
            Box::new(DiskStore::open(lock, &options)?)
        }
    })
}
