//! The watch wiring: every watch the controller opens, its reflector (the cache the reconciles
//! read), its trimming and its change filter, ready for the three loops in [`crate::run`].
//!
//! Eight watch streams over four kinds:
//! - PersistentPodStates: the record loop's own objects; each change also reaches the generate
//!   loop (the StatefulSets it concerns) and the lifecycle loop (its hooks);
//! - StatefulSets, pods and nodes for the record loop, each filtered to changes of what
//!   recording reads ([`caches`]); a completed re-list of any of them reconciles every
//!   PersistentPodState again (deletions during the gap are never delivered);
//! - namespaces, for the generate loop (their auto-generation label);
//! - StatefulSets again for the generate loop: it needs their annotations, which the record
//!   loop's cache drops, and a StatefulSet's deletion must reach the record loop through the
//!   cache that loop reads;
//! - pods with lifecycle hooks for the lifecycle loop (their labels and the gate's condition,
//!   which the record loop's pod cache drops).
//!
//! The four watches of the record loop and the namespaces are tracked ([`synced`]: no
//! reconcile runs before their first full list) and, but the namespaces, tapped for the
//! lifecycle loop ([`Tap`]: a change that may change a hooked pod's fate).
//!
//! PersistentPodStates are listed in small pages and decoded one by one
//! (`ipkeep_daemon::lenient`): one that does not decode is left out of the cache (so it is
//! neither recorded nor generated over), named in [`Caches::undecodable_pps`], and reported
//! ([`Watches::undecodable`]) for a Warning Event on it.

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use ipkeep_api::PersistentPodState;
use ipkeep_daemon::lenient::{self, Lenient, Report, Undecodables};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;

use crate::caches::{self, CachedPod, Caches};
use crate::lifecycle::triggers::{Tap, Trigger};
use crate::{lifecycle, pin_skipped, synced};

/// Objects of kind `K` whose decision inputs changed (or that were deleted).
pub type Changes<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// Every watch, opened (they start with the loops that poll them).
pub struct Watches {
    /// The caches the reconciles read.
    pub caches: Caches,
    /// PersistentPodStates, for the record loop.
    pub pps: Changes<PersistentPodState>,
    /// StatefulSets whose recording inputs changed.
    pub statefulsets: Changes<StatefulSet>,
    /// Pods whose recording inputs changed.
    pub pods: Changes<CachedPod>,
    /// Nodes whose labels or readiness changed.
    pub nodes: Changes<Node>,
    /// A completed re-list of the StatefulSets, pods or nodes.
    pub relisted: BoxStream<'static, ()>,
    /// Namespaces whose auto-generation label changed.
    pub namespaces: Changes<Namespace>,
    /// The StatefulSets a PersistentPodState change concerns for auto-generation, sent once the
    /// record loop's cache has the change.
    pub generate_by_pps: BoxStream<'static, ObjectRef<StatefulSet>>,
    /// The generate loop's StatefulSets (whole annotations) and their cache.
    pub generate: (Store<StatefulSet>, Changes<StatefulSet>),
    /// Pods with lifecycle hooks whose hook inputs changed, and their cache.
    pub hooked: (Store<Pod>, Changes<Pod>),
    /// Changes of anything a hooked pod's fate reads.
    pub triggers: BoxStream<'static, Trigger>,
    /// Pods the webhook marked with a skipped pin, for [`pin_skipped::announce`].
    pub pin_skipped: mpsc::UnboundedReceiver<CachedPod>,
    /// Namespaces whose admission plan is to be written again: a PersistentPodState of it was
    /// deleted, or (through `plan_sender`) a plan of it changed.
    pub plan_namespaces: BoxStream<'static, ObjectRef<Namespace>>,
    /// The sender of `plan_namespaces`, for the record loop.
    pub plan_sender: mpsc::UnboundedSender<ObjectRef<Namespace>>,
    /// PersistentPodStates found undecodable (once per resource version) or gone from that
    /// set, for [`crate::undecodable::announce`].
    pub undecodable: mpsc::UnboundedReceiver<Report>,
    /// Reconciles a StatefulSet in the generate loop.
    pub regenerate: mpsc::UnboundedSender<ObjectRef<StatefulSet>>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches").finish_non_exhaustive()
    }
}

/// Opens every watch; `undecodable` counts the PersistentPodStates left out of the cache.
pub fn open(client: &Client, undecodable: Gauge) -> Watches {
    let (tracker, synced) = synced::tracker();
    let (trigger_tx, trigger_rx) = mpsc::unbounded_channel();
    let (relisted_tx, relisted_rx) = mpsc::unbounded_channel();

    let (pps_reader, pps_writer) = reflector::store();
    let (generate_tx, generate_rx) = mpsc::unbounded_channel();
    let (plan_tx, plan_rx) = mpsc::unbounded_channel();
    let plan_on_delete = plan_tx.clone();
    let (undecodable_pps, undecodable_rx) =
        Undecodables::new("PersistentPodState", undecodable).reported();
    let pps = tracker
        .track(
            synced::Cache::PersistentPodStates,
            reflector(
                pps_writer,
                lenient::sorted(
                    watcher(
                        Api::<Lenient<PersistentPodState>>::all(client.clone()),
                        watcher::Config::default()
                            .any_semantic()
                            .page_size(lenient::PAGE_SIZE),
                    )
                    .default_backoff(),
                    pps_reader.clone(),
                    undecodable_pps.clone(),
                ),
            ),
        )
        .inspect(Tap::inspector(&trigger_tx))
        .inspect(caches::statefulsets_of_pps_events(generate_tx.clone()))
        .inspect(move |event| {
            if let Ok(watcher::Event::Delete(pps)) = event
                && let Some(namespace) = pps.metadata.namespace.as_deref()
            {
                let _ = plan_on_delete.send(ObjectRef::new(namespace));
            }
        })
        .applied_objects();

    let (sts_reader, sts_writer) = reflector::store();
    let sts_events = tracker
        .track(
            synced::Cache::StatefulSets,
            reflector(sts_writer, statefulset_watch(client)),
        )
        .inspect(Tap::inspector(&trigger_tx));
    let statefulsets = caches::changed_objects(
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
                    Api::<CachedPod>::all(client.clone()),
                    caches::pod_watch_config(),
                )
                .default_backoff()
                .modify(caches::trim_pod),
            ),
        )
        .inspect(Tap::inspector(&trigger_tx));
    let (skipped_tx, skipped_rx) = mpsc::unbounded_channel();
    let pods = caches::changed_objects(pod_events, caches::pod_fingerprint, relisted_tx.clone())
        .inspect(move |pod| {
            if let Ok(pod) = pod {
                pin_skipped::forward(pod, &skipped_tx);
            }
        });

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
    let nodes = caches::changed_objects(node_events, caches::node_fingerprint, relisted_tx);

    // A re-list of the namespaces needs no full reconcile: it re-delivers every namespace, and
    // a changed label passes the filter.
    let (namespace_reader, namespace_writer) = reflector::store();
    let (namespaces_relisted, _) = mpsc::unbounded_channel();
    let namespaces = caches::changed_objects(
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

    // The generate loop's own cache of trimmed StatefulSets (a StatefulSet as k8s-openapi
    // decodes it is 2.5 KiB before its pod template's fields).
    let (generate_reader, generate_writer) = reflector::store();
    let generate = reflector(generate_writer, statefulset_watch(client)).applied_objects();

    let (hooked_reader, hooked_writer) = reflector::store();
    let (hooked_relisted, _) = mpsc::unbounded_channel();
    let hooked = lifecycle::changes(
        reflector(
            hooked_writer,
            watcher(Api::<Pod>::all(client.clone()), lifecycle::watch_config())
                .default_backoff()
                .modify(lifecycle::trim),
        ),
        hooked_relisted,
    );

    Watches {
        caches: Caches {
            statefulsets: sts_reader,
            pods: pod_reader,
            nodes: node_reader,
            pps: pps_reader,
            undecodable_pps,
            namespaces: namespace_reader,
            synced,
        },
        pps: pps.boxed(),
        statefulsets: statefulsets.boxed(),
        pods: pods.boxed(),
        nodes: nodes.boxed(),
        relisted: receiver(relisted_rx),
        namespaces: namespaces.boxed(),
        generate_by_pps: receiver(generate_rx),
        generate: (generate_reader, generate.boxed()),
        hooked: (hooked_reader, hooked.boxed()),
        triggers: receiver(trigger_rx),
        pin_skipped: skipped_rx,
        plan_namespaces: receiver(plan_rx),
        plan_sender: plan_tx,
        undecodable: undecodable_rx,
        regenerate: generate_tx,
    }
}

/// Every StatefulSet, trimmed ([`caches::trim_statefulset`]).
fn statefulset_watch(
    client: &Client,
) -> impl Stream<Item = Result<watcher::Event<StatefulSet>, watcher::Error>> + use<> {
    watcher(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .modify(caches::trim_statefulset)
}

fn receiver<T: Send + 'static>(mut rx: mpsc::UnboundedReceiver<T>) -> BoxStream<'static, T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}
