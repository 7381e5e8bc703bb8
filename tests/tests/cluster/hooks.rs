//! What the lifecycle steps share: the hooks' keys and the readiness gate's condition.

use serde_json::Value;

/// The pod label with the lifecycle state.
pub const STATE: &str = "ipkeep.dev/lifecycle-state";
/// The readiness gate (condition type).
pub const GATE: &str = "ipkeep.dev/lifecycle-ready";
/// The label the steps' hooks name, as an operator's registration.
pub const REGISTERED: &str = "registry.example.com/registered";

/// The status of the pod's readiness-gate condition (`""` without one).
pub fn gate(pod: &Value) -> &str {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == GATE))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
}
