//! The node agent `ipkeep-agent`: keeps each network's store open and serves the plugin over a
//! unix socket, and releases holdings Kubernetes says nobody will use again.

pub mod proto;
