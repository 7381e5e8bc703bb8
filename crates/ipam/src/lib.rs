//! ipkeep's node-local IPAM: host-local's ranges and allocation order, plus IP retention for
//! pods that are rebuilt under the same name.
//!
//! Layers: [`range`] and [`retention`] are pure values; [`allocator`] decides every command over
//! the [`store::Store`] trait (no I/O of its own); [`clock`] is the store's time, pure too;
//! [`disk`] is the one module that touches the file system (redb database + flock).
//! [`store::MemoryStore`] is the in-memory twin for tests.

pub mod allocator;
pub mod clock;
pub mod disk;
pub mod lease;
pub mod range;
pub mod retention;
pub mod store;

pub use allocator::{
    AddOutcome, AddRequest, AllocError, Assignment, CheckError, Departure, ReleaseOutcome, Source,
};
pub use clock::{ClockMark, Reading};
pub use disk::{DiskStore, NetworkDir, NetworkLock, NetworkNameError, validate_network_name};
pub use lease::{Attachment, Confirmed, Lease, LeaseState, PodIdentity, PodRef, StateRef};
pub use range::{Range, RangeError, RangeSet, RangeSpec};
pub use retention::{Resolved, Retention, RetentionError, RetentionPolicy, RetentionSource};
pub use store::{Commit, LeaseCounts, MemoryStore, Store, StoreError, StoreRead};
