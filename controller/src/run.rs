//! Wiring: check that the CRD is installed, wait for the leader lease, run the record and
//! generate controllers and the lifecycle loop over watch caches, and stop cleanly on shutdown
//! or lost lease.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use ipkeep_api::PersistentPodState;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::caches::{self, Caches};
use crate::context::Context;
use crate::http::Health;
use crate::leader::{Election, LeaderSettings};
use crate::lifecycle::triggers::Tap;
use crate::{generate, lifecycle, pin_skipped, record, synced};

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

/// Runs until `shutdown` resolves (Ok) or the leader lease is lost (Err).
pub async fn run(
    client: Client,
    settings: Settings,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    preflight(&client).await?;
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
        result = run_controllers(client, &settings, &health, stopped) => result?,
        () = deadline => warn!(grace = ?LOOPS_GRACE, "reconciles still running {LOOPS_GRACE:?} after the stop; dropping them"),
    }
    health.metrics.leader.set(0);
    *health.pps.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let lost_lease = stop.now_or_never().unwrap_or(false);
    if let Some(election) = election {
        election.release().await;
    }
    if lost_lease {
        anyhow::bail!("lost the leader lease; exiting so that this replica restarts as a standby");
    }
    info!("stopped");
    Ok(())
}

/// Fails with what to do when the API server is unreachable or the CRD is missing.
async fn preflight(client: &Client) -> anyhow::Result<()> {
    Ok(ipkeep_daemon::preflight::check_crd(client).await?)
}

async fn run_controllers(
    client: Client,
    settings: &Settings,
    health: &Arc<Health>,
    stop: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> anyhow::Result<()> {
    let config = controller::Config::default()
        .concurrency(settings.concurrency)
        .debounce(settings.debounce);
    // Every watch below is tracked (its first full list: `synced`) and tapped for the
    // lifecycle loop (changes that may change a hooked pod's fate: `trigger_tx`).
    let (tracker, synced) = synced::tracker();
    let (trigger_tx, trigger_rx) = mpsc::unbounded_channel();

    let pps_api: Api<PersistentPodState> = Api::all(client.clone());
    let (pps_reader, pps_writer) = reflector::store();
    // PPS changes also reconcile the StatefulSets they concern in the generate loop, which
    // reads this cache: sent from here, after the cache has them.
    let (generate_tx, mut generate_rx) = mpsc::unbounded_channel();
    let pps_stream = tracker
        .track(
            synced::Cache::PersistentPodStates,
            reflector(
                pps_writer,
                watcher(pps_api, watcher::Config::default().any_semantic()).default_backoff(),
            ),
        )
        .inspect(Tap::inspector(&trigger_tx))
        .inspect(caches::statefulsets_of_pps_events(generate_tx))
        .applied_objects();
    let pps_controller = Controller::for_stream(pps_stream, pps_reader.clone());

    let (relisted_tx, mut relisted_rx) = mpsc::unbounded_channel();
    let sts_api: Api<StatefulSet> = Api::all(client.clone());
    let (sts_reader, sts_writer) = reflector::store();
    let sts_events = tracker
        .track(
            synced::Cache::StatefulSets,
            reflector(
                sts_writer,
                watcher(sts_api.clone(), watcher::Config::default().any_semantic())
                    .default_backoff()
                    .modify(caches::trim_statefulset),
            ),
        )
        .inspect(Tap::inspector(&trigger_tx));
    let sts_changes = caches::changed_objects(
        sts_events,
        caches::statefulset_fingerprint,
        relisted_tx.clone(),
    );
    let (pod_reader, pod_writer) = reflector::store();
    let pod_events = tracker
        .track(
            synced::Cache::Pods,
            reflector(
                pod_writer,
                watcher(
                    Api::<caches::CachedPod>::all(client.clone()),
                    caches::pod_watch_config(),
                )
                .default_backoff()
                .modify(caches::trim_pod),
            ),
        )
        .inspect(Tap::inspector(&trigger_tx));
    // Pods the webhook marked with a skipped pin also go to the announcer (PinSkipped Events).
    let (skipped_tx, skipped_rx) = mpsc::unbounded_channel();
    let pod_changes =
        caches::changed_objects(pod_events, caches::pod_fingerprint, relisted_tx.clone()).inspect(
            move |pod| {
                if let Ok(pod) = pod {
                    pin_skipped::forward(pod, &skipped_tx);
                }
            },
        );
    let (node_reader, node_writer) = reflector::store();
    let node_events = tracker
        .track(
            synced::Cache::Nodes,
            reflector(
                node_writer,
                watcher(
                    Api::<Node>::all(client.clone()),
                    watcher::Config::default().any_semantic(),
                )
                .default_backoff()
                .modify(caches::trim_node),
            ),
        )
        .inspect(Tap::inspector(&trigger_tx));
    let node_changes = caches::changed_objects(node_events, caches::node_fingerprint, relisted_tx);
    let relisted = futures::stream::poll_fn(move |cx| relisted_rx.poll_recv(cx));
    // Namespaces, for the generate loop: their label turns auto-generation on for the
    // StatefulSets in them. A re-list needs no full reconcile: it re-delivers every namespace,
    // and a changed label passes the filter.
    let (namespace_reader, namespace_writer) = reflector::store();
    let (namespaces_relisted, _) = mpsc::unbounded_channel();
    let namespace_changes = caches::changed_objects(
        tracker.track(
            synced::Cache::Namespaces,
            reflector(
                namespace_writer,
                watcher(
                    Api::<Namespace>::all(client.clone()),
                    watcher::Config::default().any_semantic(),
                )
                .default_backoff()
                .modify(caches::trim_namespace),
            ),
        ),
        caches::namespace_fingerprint,
        namespaces_relisted,
    );
    drop(tracker);

    let caches = Caches {
        statefulsets: sts_reader,
        pods: pod_reader,
        nodes: node_reader,
        pps: pps_reader,
        namespaces: namespace_reader,
        synced,
    };
    *health.pps.lock().unwrap_or_else(|e| e.into_inner()) = Some(caches.pps.clone());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: crate::FIELD_MANAGER.into(),
            instance: Some(settings.identity.clone()),
        },
    );
    let ctx = Arc::new(Context::new(
        client.clone(),
        caches.clone(),
        recorder,
        health.metrics.clone(),
    ));

    let announce = pin_skipped::announce(ctx.clone(), skipped_rx);
    let (by_sts, by_pod, by_node) = (caches.clone(), caches.clone(), caches.clone());
    let record_loop = pps_controller
        .watches_stream(sts_changes, move |sts: StatefulSet| {
            by_sts.pps_targeting(&sts.namespace().unwrap_or_default(), &sts.name_any())
        })
        .watches_stream(pod_changes, move |pod: caches::CachedPod| {
            by_pod.pps_for_pod(&pod)
        })
        .watches_stream(node_changes, move |node: Node| by_node.pps_for_node(&node))
        .reconcile_all_on(relisted)
        .with_config(config.clone())
        .graceful_shutdown_on(stop.clone())
        .run(record::reconcile, record::error_policy, ctx.clone())
        .for_each(|result| async move { log_result(record::LOOP, result) });

    // The generate loop watches StatefulSets on its own: it needs their annotations, and a
    // StatefulSet's deletion must reach the record loop through the cache that loop reads.
    // Its own cache of trimmed StatefulSets (a StatefulSet as k8s-openapi decodes it is 2.5 KiB
    // before its pod template's fields). A PersistentPodState's change reconciles the
    // StatefulSet that controls it and the one it targets (one written by hand makes a
    // StatefulSet that only its namespace's label turned on stand aside), from the record
    // loop's watch, whose cache the reconcile reads; a namespace whose label changed
    // reconciles every StatefulSet in it.
    let (generate_reader, generate_writer) = reflector::store();
    let in_namespace = generate_reader.clone();
    let generate_stream = reflector(
        generate_writer,
        watcher(sts_api, watcher::Config::default().any_semantic())
            .default_backoff()
            .modify(caches::trim_statefulset),
    )
    .applied_objects();
    let generate_loop = Controller::for_stream(generate_stream, generate_reader)
        .reconcile_on(futures::stream::poll_fn(move |cx| {
            generate_rx.poll_recv(cx)
        }))
        .watches_stream(namespace_changes, move |ns: Namespace| {
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

    // The lifecycle loop watches the pods with hooks on its own (labels and the gate's
    // condition, which the record loop's cache drops), and re-reads those whose fate a change
    // of their StatefulSet, its pods, their Node or their PersistentPodState may change.
    // No debounce: a pod's readiness waits on this loop, and one pod's events are few.
    let config_for_lifecycle = controller::Config::default().concurrency(settings.concurrency);
    let (lifecycle_reader, lifecycle_writer) = reflector::store();
    let (lifecycle_relisted, _) = mpsc::unbounded_channel();
    let lifecycle_stream = lifecycle::changes(
        reflector(
            lifecycle_writer,
            watcher(
                Api::<k8s_openapi::api::core::v1::Pod>::all(client.clone()),
                lifecycle::watch_config(),
            )
            .default_backoff()
            .modify(lifecycle::trim),
        ),
        lifecycle_relisted,
    );
    let hooked = lifecycle_reader.clone();
    let mut triggers = trigger_rx;
    let triggered = futures::stream::poll_fn(move |cx| triggers.poll_recv(cx))
        .flat_map(move |t| futures::stream::iter(lifecycle::triggers::pods_for(&hooked, &t)));
    let lifecycle_loop = Controller::for_stream(lifecycle_stream, lifecycle_reader)
        .reconcile_on(triggered)
        .with_config(config_for_lifecycle)
        .graceful_shutdown_on(stop.clone())
        .run(lifecycle::reconcile, lifecycle::error_policy, ctx)
        .for_each(|result| async move { log_result(lifecycle::LOOP, result) });

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
        mark_ready,
        announce
    );
    Ok(())
}

fn log_result<K, E1: std::fmt::Display, E2: std::fmt::Display>(
    loop_name: &str,
    result: Result<(reflector::ObjectRef<K>, controller::Action), controller::Error<E1, E2>>,
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
