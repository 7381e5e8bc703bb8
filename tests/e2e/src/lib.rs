//! The whole ipkeep system end to end, on one machine: what `ipkeep-demo` runs and the end-to-end
//! tests call.
//!
//! [`scenario`] is the story the demonstration tells, with its expectations. It runs against a
//! real cluster on this machine ([`nodes`]: `scripts/cluster.sh`) with real nodes (kubelet,
//! containerd, ipkeep installed from `deploy/`; needs root), against the same control plane with
//! kwok nodes only (the control-plane half of the story: pins, records, node loss; no root), or,
//! read-only on nodes, against any cluster.
//!
//! This crate is a program's insides, not a library others build on: its errors are reported,
//! never matched, so it uses `anyhow`.

pub mod cli;
pub mod crash;
pub mod nodes;
pub mod objects;
pub mod report;
pub mod scenario;
pub mod soak;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use serde_json::Value;

/// The repository root (deploy/ is read from here), without `..` where it can be resolved (the
/// path appears in what the demo tells the user to run).
pub fn repo_root() -> PathBuf {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    root.canonicalize().unwrap_or(root)
}

/// Every YAML document of a deploy/ file.
pub fn deploy_documents(path: &str) -> Result<Vec<Value>> {
    let full = repo_root().join("deploy").join(path);
    let text =
        std::fs::read_to_string(&full).with_context(|| format!("read {}", full.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("parse {}", full.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The namespace the demonstration's StatefulSet lives in.
pub const DEMO_NAMESPACE: &str = "demo";
/// ipkeep's own namespace (as in deploy/).
pub const SYSTEM_NAMESPACE: &str = "ipkeep-system";
