//! Running: check that the CRD is installed, wait for the leader lease, run the record and
//! generate controllers and the lifecycle loop over the watches ([`crate::watches`]), and stop
//! cleanly on shutdown or lost lease.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use ipkeep_daemon::preflight::PreflightError;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::caches::CachedPod;
use crate::context::Context;
use crate::http::Health;
use crate::leader::{Election, LeaderError, LeaderSettings};
use crate::{admission_plan, generate, lifecycle, pin_skipped, record, undecodable, watches};

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
        () = deadline => warn!(grace = ?LOOPS_GRACE, "reconciles still running {LOOPS_GRACE:?} after the stop; dropping them"),
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
    let watches::Watches {
        caches,
        pps,
        statefulsets,
        pods,
        nodes,
        relisted,
        namespaces,
        generate_by_pps,
        generate: (generate_cache, generate_changes),
        hooked: (hooked_cache, hooked_changes),
        triggers,
        pin_skipped: skipped,
        plan_namespaces,
        plan_sender,
        undecodable,
        regenerate,
    } = watches::open(
        &client,
        health.metrics.undecodable.gauge("PersistentPodState"),
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
        plan_sender,
    ));
    let config = controller::Config::default()
        .concurrency(settings.concurrency)
        .debounce(settings.debounce);

    let announce = pin_skipped::announce(ctx.clone(), skipped);
    let announce_undecodable =
        undecodable::announce(ctx.clone(), undecodable, regenerate, stop.clone());

    let (by_sts, by_pod, by_node) = (caches.clone(), caches.clone(), caches.clone());
    let record_loop = Controller::for_stream(pps, caches.pps.clone())
        .watches_stream(statefulsets, move |sts: StatefulSet| {
            by_sts.pps_targeting(&sts.namespace().unwrap_or_default(), &sts.name_any())
        })
        .watches_stream(pods, move |pod: CachedPod| by_pod.pps_for_pod(&pod))
        .watches_stream(nodes, move |node: Node| by_node.pps_for_node(&node))
        .reconcile_all_on(relisted)
        .with_config(config.clone())
        .graceful_shutdown_on(stop.clone())
        .run(record::reconcile, record::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(record::LOOP, result) });

    // A PersistentPodState's change reconciles the StatefulSet that controls it and the one it
    // targets (one written by hand makes a StatefulSet that only its namespace's label turned
    // on stand aside); a namespace whose label changed reconciles every StatefulSet in it.
    let in_namespace = generate_cache.clone();
    let generate_loop = Controller::for_stream(generate_changes, generate_cache)
        .reconcile_on(generate_by_pps)
        .watches_stream(namespaces, move |ns: Namespace| {
            let namespace = ns.name_any();
            in_namespace
                .state()
                .into_iter()
                .filter(|sts| sts.metadata.namespace.as_deref() == Some(namespace.as_str()))
                .map(|sts| ObjectRef::from_obj(sts.as_ref()))
                .collect::<Vec<_>>()
        })
        .with_config(config)
        .graceful_shutdown_on(stop.clone())
        .run(generate::reconcile, generate::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(generate::LOOP, result) });

    // A pod with hooks is re-read when a change of its StatefulSet, its pods, its Node or its
    // PersistentPodState may change its fate. No debounce: a pod's readiness waits on this
    // loop, and one pod's events are few.
    let hooked = hooked_cache.clone();
    let triggered = triggers
        .flat_map(move |t| futures::stream::iter(lifecycle::triggers::pods_for(&hooked, &t)));
    let lifecycle_loop = Controller::for_stream(hooked_changes, hooked_cache)
        .reconcile_on(triggered)
        .with_config(controller::Config::default().concurrency(settings.concurrency))
        .graceful_shutdown_on(stop.clone())
        .run(lifecycle::reconcile, lifecycle::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(lifecycle::LOOP, result) });

    // One namespace's admission plan at a time, coalesced like the record loop's triggers.
    let plan_loop = Controller::for_stream(
        futures::stream::empty::<Result<Namespace, kube::runtime::watcher::Error>>(),
        caches.namespaces.clone(),
    )
    .reconcile_on(plan_namespaces)
    .with_config(
        controller::Config::default()
            .concurrency(settings.concurrency)
            .debounce(settings.debounce),
    )
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
        record_loop,
        generate_loop,
        lifecycle_loop,
        plan_loop,
        mark_ready,
        announce,
        announce_undecodable
    );
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
        Err(e) => warn!(controller = loop_name, error = ?e.to_string(), "controller stream error"),
    }
}
