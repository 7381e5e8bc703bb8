//! The `ipkeep` CNI IPAM plugin: host-local's configuration, allocation order and results, plus
//! IP retention for pods rebuilt under the same name (see `docs/cni-plugin.md`).
//!
//! [`plugin::run`] is the whole plugin as a function of environment, stdin and clock; [`admin`]
//! holds the `list`/`release` subcommands; `main.rs` only wires real stdio.

pub mod admin;
pub mod env;
pub mod error;
pub mod files;
pub mod json;
pub mod logs;
pub mod management;
pub mod netconf;
pub mod plugin;
pub mod proto;
pub mod relay;
pub mod result;
pub mod stores;
pub mod timings;
pub mod version;

pub use error::CniError;
pub use plugin::{Completion, run};
