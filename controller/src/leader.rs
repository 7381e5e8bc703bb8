//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager): only the holder
//! runs the controllers, so only one replica writes. A replica that loses the lease stops its
//! controllers and exits non-zero, so that Kubernetes restarts it as a standby.

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use tokio::sync::watch;

/// The field manager of `identity`'s writes to the Lease. kube-lease-manager takes a free Lease
/// with a server-side apply that is not forced, so when two replicas find it free at once the
/// second gets 409 Conflict, but only if their managers differ: with one manager for every
/// replica both applies succeed and both lead (seen on a real control plane at start-up).
pub fn field_manager(identity: &str) -> String {
    format!("{}-{identity}", crate::FIELD_MANAGER)
}

/// Where the lease lives and who we are.
#[derive(Debug, Clone)]
pub struct LeaderSettings {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub lease_name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// How long a lease is valid without renewal, in seconds.
    pub lease_seconds: u64,
    /// How long before expiry the holder renews, in seconds.
    pub renew_before_seconds: u64,
}

/// Leader election that could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The Lease could not be set up.
    #[error("failed to set up leader election on Lease {namespace}/{name}: {source}")]
    Setup {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// Why.
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The election task ended.
    #[error("leader election stopped")]
    Stopped,
}

/// A running election: a watch of "am I the leader".
#[derive(Debug)]
pub struct Election {
    leader: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
}

impl Election {
    /// Starts campaigning.
    pub async fn start(client: Client, settings: &LeaderSettings) -> Result<Self, LeaderError> {
        let manager = LeaseManagerBuilder::new(client, &settings.lease_name)
            .with_namespace(&settings.namespace)
            .with_parameters(
                LeaseParams::new(
                    &settings.identity,
                    settings.lease_seconds,
                    settings.renew_before_seconds,
                )
                .with_field_manager(field_manager(&settings.identity)),
            )
            .build()
            .await
            .map_err(|source| LeaderError::Setup {
                namespace: settings.namespace.clone(),
                name: settings.lease_name.clone(),
                source,
            })?;
        let (leader, task) = manager.watch().await;
        Ok(Self { leader, task })
    }

    /// Waits until this replica is the leader.
    pub async fn acquired(&mut self) -> Result<(), LeaderError> {
        self.leader
            .wait_for(|leader| *leader)
            .await
            .map_err(|_| LeaderError::Stopped)?;
        Ok(())
    }

    /// Resolves when leadership is lost.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut leader = self.leader.clone();
        async move {
            let _ = leader.wait_for(|leader| !*leader).await;
        }
    }

    /// Releases the lease (if held) and stops campaigning.
    pub async fn release(self) {
        drop(self.leader);
        match self.task.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "failed to release the leader lease"),
            Err(e) => tracing::warn!(error = %e, "leader election task failed"),
        }
    }
}
