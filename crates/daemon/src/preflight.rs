//! The check every ipkeep component makes before it starts: can PersistentPodStates be listed?

use kube::api::{Api, ListParams};

use crate::PersistentPodState;

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

/// Lists one PersistentPodState, to check the CRD is installed and readable.
pub async fn check_crd(client: &kube::Client) -> Result<(), PreflightError> {
    let api: Api<PersistentPodState> = Api::all(client.clone());
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(PreflightError::CrdMissing),
        Err(e) => Err(PreflightError::Unreachable(e)),
    }
}
