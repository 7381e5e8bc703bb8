//! An in-memory Kubernetes API server for ipkeep's tests and local demonstration.
//!
//! It serves, over real HTTP on loopback, the subset of the Kubernetes REST API that ipkeep's
//! controller, scheduler extension and node agent use, faithfully enough that unmodified
//! clients (`kube::Client`, `kube::runtime::watcher`, `kubectl`) cannot tell it from a cluster
//! for that subset:
//!
//! * resources: core/v1 pods (+`status`, `binding`), nodes, namespaces, events; apps/v1
//!   statefulsets (+`status`, `scale`); coordination.k8s.io/v1 leases; events.k8s.io/v1 events
//!   (same storage as core events); apiextensions.k8s.io/v1 customresourcedefinitions (creating
//!   one serves its resource); admissionregistration.k8s.io/v1 mutatingwebhookconfigurations
//!   (called on matching writes);
//! * discovery (`/api`, `/apis`, resource lists, `/version`) and OpenAPI v3 documents that
//!   declare `fieldValidation`, so kubectl validates server-side;
//! * `resourceVersion` semantics: one global revision, 409 on stale writes, no-op writes that
//!   commit nothing, paged and exact-version lists, watches with bookmarks, initial events and
//!   410 Gone from compacted history;
//! * patches: JSON, merge, strategic merge (built-in kinds), server-side apply with
//!   `managedFields` and conflicts; status/spec separation and `generation`;
//! * deletion: finalizers and `deletionTimestamp`, graceful deletion of bound pods (they stay
//!   Terminating until deleted with grace 0, as a kubelet would), owner-reference garbage
//!   collection (background, foreground, orphan), namespace termination;
//! * fault injection ([`Fault`], [`ApiServer::drop_watches`], [`ApiServer::compact`]), also
//!   reachable over HTTP at `/apisim/v1/faults`, `/apisim/v1/drop-watches`, `/apisim/v1/compact`.
//!
//! # What it is not
//!
//! It is **not a cluster** and must never be mistaken for one:
//!
//! * no authentication or authorization: every request is `system:admin`; no RBAC, no
//!   ServiceAccounts, no TLS on its own listener (plain HTTP, loopback only);
//! * no validating admission (webhooks or policies), no CEL (`x-kubernetes-validations`), no
//!   `pattern` in CRD schemas, no conversion webhooks (CRD versions convert by `apiVersion`
//!   only); built-in kinds are validated only where ipkeep could trip (pod containers and node
//!   pin, StatefulSet selector and immutable fields, webhook configurations) and strict field
//!   validation applies to custom resources only;
//! * no controllers: nothing schedules pods, runs kubelets, creates StatefulSet pods or moves
//!   status — tests do that themselves; garbage collection and namespace cleanup happen
//!   synchronously inside the delete that triggers them;
//! * no protobuf, CBOR or aggregated discovery (clients fall back to JSON and legacy
//!   discovery; kubectl's generator commands such as `kubectl create namespace` send protobuf
//!   and get 415), no OpenAPI v2 (kubectl 1.27/1.28 need `--validate=false`), no `/watch/`
//!   legacy paths, no field selectors beyond the ones listed per resource;
//! * status subresource writes change only `status` (real pods also let `/status` touch some
//!   metadata); deleting a CRD removes its objects even if they carry finalizers;
//! * state is in memory and lost when the process exits.

pub mod admission;
mod builtin;
pub mod cluster;
mod convert;
pub mod discovery;
pub mod faults;
mod http;
pub mod lifecycle;
mod meta;
pub mod patch;
pub mod registry;
mod schema;
pub mod selector;
mod server;
pub mod status;
pub mod store;
pub mod table;
mod watch;

pub use faults::Fault;
pub use server::{ApiServer, ClientError, ServerConfig, kubeconfig};
