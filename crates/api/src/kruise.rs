//! OpenKruise's Advanced StatefulSet (`statefulsets.apps.kruise.io`): only the fields ipkeep
//! reads, decoded leniently (an unknown or malformed field never makes the object undecodable,
//! because an object missing from the cache would read as "target gone").

use serde::{Deserialize, Serialize};

/// One entry of `spec.reserveOrdinals` (the API's int-or-string): an ordinal, or a range
/// `"a-b"` (both ends included). Anything else the API server let through is kept as it came,
/// so that the ordinal rules can treat it as Kruise does (an unreadable entry).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ReserveOrdinal {
    /// An ordinal.
    Int(i64),
    /// A range `"a-b"`, or text that is not one.
    Text(String),
    /// Neither an integer nor text.
    Other(serde_json::Value),
}
