//! The `ipkeep` CNI IPAM plugin: host-local's configuration, allocation order and results, plus
//! IP retention for pods rebuilt under the same name (see `docs/cni-plugin.md`).
//!
//! [`plugin::run`] is one CNI command as a function of environment, decoded configuration,
//! stores and clock, returning all it produced ([`Completion`]); [`relay`] runs it through the
//! node agent or here; [`process`] is the whole process (stdin read bounded, logging, the panic
//! hook, the admin subcommands of [`admin`]); `main.rs` passes it the real environment and stdio.

pub mod admin;
pub mod env;
pub mod error;
pub mod files;
pub mod json;
pub mod logs;
pub mod management;
pub mod netconf;
pub mod plugin;
pub mod process;
pub mod proto;
pub mod relay;
pub mod result;
pub mod stores;
pub mod timings;
pub mod version;

pub use error::CniError;
pub use plugin::{Completion, run};
