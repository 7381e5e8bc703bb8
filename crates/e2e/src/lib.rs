//! The whole ipkeep system end to end, on one machine: what `ipkeep-demo` runs and the end-to-end
//! tests call.
//!
//! A cluster's parts that ipkeep does not provide are simulated, small and in-process: the API
//! server is `ipkeep-apisim`; [`sim::statefulset`] creates and deletes ordinal pods,
//! [`sim::scheduler`] binds pods honouring node affinity and calling our extender over HTTPS,
//! [`sim::kubelet`] runs the real CNI plugins for the pods of its node and reports them Ready.
//! ipkeep's own parts are the real binaries, each a separate process ([`procs`]) talking HTTP
//! to the API server: two `ipkeep-controller` replicas, `ipkeep-scheduler-ext` (called by the API
//! server as a mutating webhook) and one `ipkeep-agent` per node.
//!
//! [`scenario`] is the story the demonstration tells, with its expectations; it runs against a
//! real cluster with real nodes on this machine ([`nodes`]: `scripts/cluster.sh`), against the
//! local simulated system ([`system`]), or, read-only on nodes, against any cluster.
//!
//! This crate is a program's insides, not a library others build on: its errors are reported,
//! never matched, so it uses `anyhow`.

pub mod cni;
pub mod http;
pub mod netns;
pub mod nodes;
pub mod pki;
pub mod procs;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod system;

use std::path::PathBuf;

/// The repository root (deploy/ is read from here).
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The namespace the demonstration's StatefulSet lives in.
pub const DEMO_NAMESPACE: &str = "demo";
/// ipkeep's own namespace (as in deploy/).
pub const SYSTEM_NAMESPACE: &str = "ipkeep-system";
