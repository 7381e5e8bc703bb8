//! Running: check that the CRD is installed, wait for the leader lease, run the watches
//! ([`crate::watches`]) and the four loops they trigger (record, generate, lifecycle, admission
//! plan), and stop cleanly on shutdown or lost lease.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use ipkeep_daemon::preflight::PreflightError;
use kube::Client;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{debug, info, warn};

use crate::context::Context;
use crate::http::Health;
use crate::leader::{Election, LeaderError, LeaderSettings};
use crate::watches::{self, Watches};
use crate::{admission_plan, generate, lifecycle, pending, pin_skipped, record, undecodable};

/// How long the loops get to finish their reconciles in flight once asked to stop (within the
/// process's own grace, `ipkeep_daemon::STOP_GRACE`, so the lease is released before it ends).
pub const LOOPS_GRACE: Duration = Duration::from_secs(10);

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Reconciles at once per controller (one object is never reconciled twice at once).
    pub concurrency: u16,
    /// Trigger coalescing window: more pods recorded per status write, slightly later records.
    pub debounce: Duration,
    /// Leader election; `None` runs as the only writer.
    pub leader: Option<LeaderSettings>,
    /// This replica's name in Events (`reportingInstance`).
    pub identity: String,
}

/// Why the controller stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The API server is unreachable or the CRD missing.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// Leader election could not start or stopped.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// Another replica took the lease.
    #[error("lost the leader lease; exiting so that this replica restarts as a standby")]
    LostLease,
}

/// Runs until `shutdown` resolves (Ok) or the leader lease is lost (Err).
pub async fn run(
    client: Client,
    settings: Settings,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    ipkeep_daemon::preflight::check_crd(&client).await?;
    let shutdown = shutdown.boxed().shared();
    let mut election: Option<Election> = match &settings.leader {
        Some(leader) => Some(Election::start(client.clone(), leader).await?),
        None => None,
    };
    if let Some(mut standby) = election.take() {
        health.ready.store(true, Ordering::Release);
        info!(identity = %settings.identity, "standing by until this replica holds the leader lease");
        let acquired = tokio::select! {
            acquired = standby.acquired() => Some(acquired),
            () = shutdown.clone() => None,
        };
        match acquired {
            Some(acquired) => acquired?,
            None => {
                standby.release().await;
                return Ok(());
            }
        }
        info!(identity = %settings.identity, "became the leader");
        election = Some(standby);
    }
    health.ready.store(false, Ordering::Release);
    health.metrics.leader.set(1);
    let lost = election.as_ref().map(|e| e.lost().boxed());
    let stop = {
        let shutdown = shutdown.clone();
        async move {
            match lost {
                Some(lost) => tokio::select! {
                    () = shutdown => false,
                    () = lost => true,
                },
                None => {
                    shutdown.await;
                    false
                }
            }
        }
        .boxed()
        .shared()
    };
    // The loops finish the reconciles in flight; one that does not end within LOOPS_GRACE
    // (an API call that hangs) is dropped, so that the lease is still released in time.
    let stopped = stop.clone().map(|_| ()).boxed().shared();
    let deadline = {
        let stopped = stopped.clone();
        async move {
            stopped.await;
            tokio::time::sleep(LOOPS_GRACE).await;
        }
    };
    tokio::select! {
        () = run_controllers(client, &settings, &health, stopped) => {}
        () = deadline => warn!(grace = ?LOOPS_GRACE, "reconciles still running after the stop; dropping them"),
    }
    health.metrics.leader.set(0);
    *health.pps.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let lost_lease = stop.now_or_never().unwrap_or(false);
    if let Some(election) = election {
        election.release().await;
    }
    if lost_lease {
        return Err(RunError::LostLease);
    }
    info!("stopped");
    Ok(())
}

async fn run_controllers(
    client: Client,
    settings: &Settings,
    health: &Arc<Health>,
    stop: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let Watches {
        caches,
        record,
        generate,
        generate_advanced,
        lifecycle,
        plan,
        announce,
        run: watching,
    } = watches::open(
        &client,
        health.metrics.undecodable.gauge("PersistentPodState"),
        stop.clone(),
    );
    *health.pps.lock().unwrap_or_else(|e| e.into_inner()) = Some(caches.pps.clone());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: crate::FIELD_MANAGER.into(),
            instance: Some(settings.identity.clone()),
        },
    );
    let ctx = Arc::new(Context::new(
        client,
        caches.clone(),
        recorder,
        health.metrics.clone(),
        plan.sender,
    ));
    let debounced = controller::Config::default()
        .concurrency(settings.concurrency)
        .debounce(settings.debounce);

    let record_loop = on(caches.pps.clone(), record.pps)
        .reconcile_all_on(record.relisted.keys())
        .with_config(debounced.clone())
        .graceful_shutdown_on(stop.clone())
        .run(record::reconcile, record::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(record::LOOP, result) });

    let generate_loop = on(caches.statefulsets.clone(), generate)
        .with_config(debounced.clone())
        .graceful_shutdown_on(stop.clone())
        .run(generate::reconcile, generate::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(generate::LOOP, result) });
    let generate_advanced_loop = on(caches.advanced.clone(), generate_advanced)
        .with_config(debounced.clone())
        .graceful_shutdown_on(stop.clone())
        .run(generate::reconcile, generate::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(generate::LOOP, result) });

    // No debounce: a pod's readiness waits on this loop, and one pod's events are few.
    let lifecycle_loop = on(lifecycle.pods, lifecycle.changed)
        .with_config(controller::Config::default().concurrency(settings.concurrency))
        .graceful_shutdown_on(stop.clone())
        .run(lifecycle::reconcile, lifecycle::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(lifecycle::LOOP, result) });

    let plan_loop = on(caches.namespaces.clone(), plan.namespaces)
        .with_config(debounced)
        .graceful_shutdown_on(stop.clone())
        .run(
            admission_plan::reconcile,
            admission_plan::error_policy,
            ctx.clone(),
        )
        .for_each(|result| async move { log_result(admission_plan::LOOP, result) });

    let mark_ready = {
        let health = health.clone();
        async move {
            if caches.wait_until_ready().await.is_ok() {
                info!("caches synced");
                health.ready.store(true, Ordering::Release);
            }
        }
    };
    tokio::join!(
        watching,
        record_loop,
        generate_loop,
        generate_advanced_loop,
        lifecycle_loop,
        plan_loop,
        mark_ready,
        pin_skipped::announce(ctx.clone(), announce.pin_skipped, stop.clone()),
        undecodable::announce(ctx.clone(), announce.undecodable, stop),
    );
}

/// A controller over the objects of `store` (a watch feeds it), reconciling those `triggers`
/// name ([`watches`]).
fn on<K>(store: Store<K>, triggers: pending::Receiver<ObjectRef<K>>) -> Controller<K>
where
    K: kube::Resource<DynamicType = ()>
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    Controller::for_stream(futures::stream::empty(), store).reconcile_on(triggers.keys())
}

fn log_result<K, E1: std::fmt::Display, E2: std::fmt::Display>(
    loop_name: &str,
    result: Result<(ObjectRef<K>, controller::Action), controller::Error<E1, E2>>,
) where
    K: kube::Resource,
{
    match result {
        Ok((object, _)) => {
            debug!(controller = loop_name, object = ?object.to_string(), "reconciled")
        }
        Err(controller::Error::ObjectNotFound(object)) => {
            debug!(controller = loop_name, object = ?object.to_string(), "object gone before its reconcile")
        }
        Err(controller::Error::ReconcilerFailed(_, _)) => {} // logged by the error policy
        Err(e) => warn!(controller = loop_name, error = %e, "controller stream error"),
    }
}
