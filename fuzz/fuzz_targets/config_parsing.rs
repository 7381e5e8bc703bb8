//! Fuzzes the network configuration on stdin and `CNI_ARGS`: nothing here may panic.
#![no_main]

use ipkeep_cni::{env, netconf};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(decoded) = netconf::decode(data) {
        let _ = decoded.requested_ips(None);
        let _ = decoded.valid_attachments();
        let _ = decoded.previous_ips();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = env::parse_args(text);
    }
});
