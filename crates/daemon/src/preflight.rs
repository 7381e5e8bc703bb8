//! What every ipkeep component does with the API server before it starts: find the cluster
//! ([`client`]) and check that PersistentPodStates can be listed ([`check_crd`]).

use kube::api::{Api, ListParams};

use ipkeep_api::PersistentPodState;

/// Why PersistentPodStates cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// The API server does not know the resource.
    #[error(
        "the PersistentPodState CRD (persistentpodstates.ipkeep.dev) is not installed; apply deploy/crd.yaml first"
    )]
    CrdMissing,
    /// Any other failure.
    #[error(
        "failed to list PersistentPodStates (is the API server reachable, and may this service account list persistentpodstates.ipkeep.dev?): {0}"
    )]
    Unreachable(#[source] kube::Error),
}

/// Finds the cluster like kubectl: `$KUBECONFIG` (or `~/.kube/config`), else the in-cluster
/// service account.
pub async fn client() -> Result<kube::Client, ClientError> {
    kube::Client::try_default().await.map_err(ClientError)
}

/// Why no API client could be made.
#[derive(Debug, thiserror::Error)]
#[error("failed to find the cluster (set KUBECONFIG, or run in a pod with a service account): {0}")]
pub struct ClientError(#[source] kube::Error);

/// Lists one PersistentPodState's metadata, to check the CRD is installed and readable: its
/// metadata only, so that an object whose spec or status does not decode fails no start (the
/// caches leave such an object out, see [`crate::lenient`]).
pub async fn check_crd(client: &kube::Client) -> Result<(), PreflightError> {
    let api: Api<PersistentPodState> = Api::all(client.clone());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(PreflightError::CrdMissing),
        Err(e) => Err(PreflightError::Unreachable(e)),
    }
}
