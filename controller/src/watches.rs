//! The watches: one per kind, each feeding its cache and then, event by event, every loop the
//! change concerns. What a loop is to reconcile waits in a [`pending`] set of keys: coalesced,
//! never dropped, and a watch never waits for a loop.
//!
//! - PersistentPodStates ([`Caches::pps`], listed in small pages and decoded one by one by
//!   `ipkeep_daemon::lenient`: one that does not decode is left out of the cache, named in
//!   [`Caches::undecodable_pps`] and announced, [`crate::undecodable`]). Each one applied is
//!   recorded; applied or deleted, the StatefulSets it concerns are generated
//!   ([`caches::statefulsets_of_pps`]); its spec changed, its target's pods with hooks are
//!   reconciled; deleted, its namespace's admission plan is written again.
//! - StatefulSets ([`Caches::statefulsets`], trimmed). Each change is generated; a change of what
//!   recording reads records the PersistentPodStates targeting it; of what the hooks read, its
//!   pods with hooks are reconciled.
//! - StatefulSet pods (labelled `statefulset.kubernetes.io/pod-name`, decoded as [`CachedPod`]),
//!   cached trimmed for recording ([`Caches::pods`]) and, those with a lifecycle state, apart for
//!   the lifecycle loop ([`lifecycle::hooked`]; every pod with hooks is a StatefulSet pod). A
//!   change of what recording reads records its StatefulSet's PersistentPodStates and, marked
//!   `pin-skipped`, is announced ([`pin_skipped`]); a change of what the hooks read reconciles the
//!   pod and its StatefulSet's pods with hooks.
//! - OpenKruise's Advanced StatefulSets ([`Caches::advanced`], trimmed), once the API server
//!   serves `statefulsets.apps.kruise.io` (asked at start and every minute until it does; while
//!   it does not, the cache is empty and counts as synced, so a cluster without Kruise loses
//!   nothing). Each change is generated; a change of what recording reads records the
//!   PersistentPodStates targeting it.
//! - Nodes ([`Caches::nodes`], trimmed): a change of labels or readiness records the
//!   PersistentPodStates with a record or a pod there; cordoned, its pods with hooks are
//!   reconciled.
//! - Namespaces ([`Caches::namespaces`], trimmed to the auto-generation label): its label
//!   changed, its StatefulSets are generated. Each admission plan is a namespace's.
//!
//! A completed re-list of the StatefulSets, pods or nodes records every PersistentPodState again
//! (deletions during the gap are never delivered). No reconcile runs before every watch had its
//! first full list ([`synced`]), and each loop's controller runtime runs on a store no other
//! waits for (kube-runtime wakes only one waiter of a store).

use std::future::Future;
use std::pin::pin;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use ipkeep_api::PersistentPodState;
use ipkeep_api::kruise::{self, AdvancedStatefulSet};
use ipkeep_api::statefulset::Workload;
use ipkeep_daemon::lenient::{self, Lenient, Undecodables};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::ResourceExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector, store::Writer};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client};
use prometheus_client::metrics::gauge::Gauge;
use tracing::{info, warn};

use crate::caches::{self, CachedPod, Caches, Changes};
use crate::lifecycle::triggers::{self, Tap, Trigger};
use crate::pending::{self, Receiver, Sender};
use crate::synced::{Cache, Tracker};
use crate::{lifecycle, pin_skipped, synced, undecodable};

/// Every watch, opened (they run in [`Watches::run`]), and what each loop is to reconcile.
pub struct Watches {
    /// The caches the reconciles read.
    pub caches: Caches,
    /// The record loop's.
    pub record: RecordTriggers,
    /// The generate loop's: StatefulSets.
    pub generate: Receiver<ObjectRef<StatefulSet>>,
    /// The generate loop's: Advanced StatefulSets.
    pub generate_advanced: Receiver<ObjectRef<AdvancedStatefulSet>>,
    /// The lifecycle loop's.
    pub lifecycle: LifecycleTriggers,
    /// The admission plan loop's.
    pub plan: PlanTriggers,
    /// What to announce in Events.
    pub announce: Announcements,
    /// Runs every watch until the stop given to [`open`].
    pub run: BoxFuture<'static, ()>,
}

/// What the record loop is to reconcile.
#[derive(Debug)]
pub struct RecordTriggers {
    /// These PersistentPodStates.
    pub pps: Receiver<ObjectRef<PersistentPodState>>,
    /// Every PersistentPodState: a watch it reads was re-listed.
    pub relisted: Receiver<()>,
}

/// The lifecycle loop's pods and what of them it is to reconcile.
#[derive(Debug)]
pub struct LifecycleTriggers {
    /// Pods with a lifecycle state, trimmed ([`lifecycle::hooked`]).
    pub pods: Store<Pod>,
    /// These pods.
    pub changed: Receiver<ObjectRef<Pod>>,
}

/// Which namespaces' admission plans are to be written again.
#[derive(Debug)]
pub struct PlanTriggers {
    /// These.
    pub namespaces: Receiver<ObjectRef<Namespace>>,
    /// For the record loop, which decides the plans ([`crate::context::Context::plan_namespace`]).
    pub sender: Sender<ObjectRef<Namespace>>,
}

/// What to publish Events about.
#[derive(Debug)]
pub struct Announcements {
    /// Pods marked `pin-skipped` ([`pin_skipped::announce`]).
    pub pin_skipped: Receiver<ObjectRef<CachedPod>>,
    /// PersistentPodStates that do not decode ([`undecodable::announce`]).
    pub undecodable: undecodable::Found,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches").finish_non_exhaustive()
    }
}

/// The sending sides, shared by the watches.
#[derive(Clone)]
struct Senders {
    record: Sender<ObjectRef<PersistentPodState>>,
    relisted: Sender<()>,
    generate: Sender<ObjectRef<StatefulSet>>,
    generate_advanced: Sender<ObjectRef<AdvancedStatefulSet>>,
    lifecycle: Sender<ObjectRef<Pod>>,
    plan: Sender<ObjectRef<Namespace>>,
    pin_skipped: Sender<ObjectRef<CachedPod>>,
}

impl Senders {
    /// Generates the StatefulSets (of either workload) `pps` concerns.
    fn generate_for(&self, pps: &PersistentPodState) {
        caches::statefulsets_of_pps(pps)
            .into_iter()
            .for_each(|s| self.generate.trigger(s));
        caches::advanced_of_pps(pps)
            .into_iter()
            .for_each(|s| self.generate_advanced.trigger(s));
    }

    /// Reconciles the pods with hooks `trigger` concerns.
    fn hooked(&self, hooked: &Store<Pod>, trigger: Option<Trigger>) {
        for pod in trigger.iter().flat_map(|t| triggers::pods_for(hooked, t)) {
            self.lifecycle.trigger(pod);
        }
    }
}

/// Opens every watch, to run until `stop`; `undecodable` counts the PersistentPodStates left
/// out of the cache.
pub fn open(
    client: &Client,
    undecodable: Gauge,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Watches {
    let (record, record_rx) = pending::channel();
    let (relisted, relisted_rx) = pending::channel();
    let (generate, generate_rx) = pending::channel();
    let (generate_advanced, generate_advanced_rx) = pending::channel();
    let (lifecycle, lifecycle_rx) = pending::channel();
    let (plan, plan_rx) = pending::channel();
    let (pin_skipped, pin_skipped_rx) = pending::channel();
    let (found, found_rx) = pending::channel();
    let to = Senders {
        record,
        relisted,
        generate,
        generate_advanced,
        lifecycle,
        plan,
        pin_skipped,
    };
    let (tracker, synced) = synced::tracker();
    let (pps, pps_writer) = reflector::store();
    let (statefulsets, sts_writer) = reflector::store();
    let (advanced, advanced_writer) = reflector::store();
    let (pods, pod_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let (namespaces, namespace_writer) = reflector::store();
    let (hooked, hooked_writer) = reflector::store();
    let caches = Caches {
        pps,
        statefulsets,
        advanced,
        pods,
        nodes,
        namespaces,
        undecodable_pps: Undecodables::new("PersistentPodState", undecodable)
            .reported(undecodable::route(found, to.generate.clone())),
        synced,
    };
    let watching = futures::future::join(
        futures::future::join5(
            watch_pps(client, pps_writer, &caches, &hooked, &to, &tracker),
            watch_statefulsets(client, sts_writer, &caches, &hooked, &to, &tracker),
            watch_pods(client, (pod_writer, hooked_writer), &caches, &to, &tracker),
            watch_nodes(client, node_writer, &caches, &hooked, &to, &tracker),
            watch_namespaces(client, namespace_writer, &caches, &to, &tracker),
        ),
        watch_advanced(client, advanced_writer, &caches, &to, &tracker),
    );
    let run = async move {
        tokio::select! {
            _ = watching => {}
            () = stop => {}
        }
    };
    Watches {
        caches,
        record: RecordTriggers {
            pps: record_rx,
            relisted: relisted_rx,
        },
        generate: generate_rx,
        generate_advanced: generate_advanced_rx,
        lifecycle: LifecycleTriggers {
            pods: hooked,
            changed: lifecycle_rx,
        },
        plan: PlanTriggers {
            namespaces: plan_rx,
            sender: to.plan.clone(),
        },
        announce: Announcements {
            pin_skipped: pin_skipped_rx,
            undecodable: found_rx,
        },
        run: run.boxed(),
    }
}

/// Hands every event of `events` to `fan_out` until the stream ends (a watch that fails is
/// retried with backoff; its errors are logged).
async fn drive<K>(
    kind: &'static str,
    events: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    mut fan_out: impl FnMut(Event<K>),
) {
    let mut events = pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => fan_out(event),
            Err(e) => warn!(kind, error = %e, "watch failed; retrying"),
        }
    }
}

fn watch_pps(
    client: &Client,
    writer: Writer<PersistentPodState>,
    caches: &Caches,
    hooked: &Store<Pod>,
    to: &Senders,
    tracker: &Tracker,
) -> impl Future<Output = ()> + use<> {
    let events = reflector(
        writer,
        lenient::sorted(
            watcher(
                Api::<Lenient<PersistentPodState>>::all(client.clone()),
                watcher::Config::default()
                    .any_semantic()
                    .page_size(lenient::PAGE_SIZE),
            )
            .default_backoff(),
            caches.pps.clone(),
            caches.undecodable_pps.clone(),
        ),
    );
    let (hooked, to, tracker) = (hooked.clone(), to.clone(), tracker.clone());
    let mut tap = Tap::new();
    drive("PersistentPodState", events, move |event| {
        match &event {
            Event::Apply(pps) | Event::InitApply(pps) => {
                to.record.trigger(ObjectRef::from_obj(pps));
                to.generate_for(pps);
            }
            Event::Delete(pps) => {
                to.generate_for(pps);
                if let Some(namespace) = pps.metadata.namespace.as_deref() {
                    to.plan.trigger(ObjectRef::new(namespace));
                }
            }
            Event::InitDone => tracker.synced(Cache::PersistentPodStates),
            Event::Init => {}
        }
        to.hooked(&hooked, tap.trigger(&event));
    })
}

fn watch_statefulsets(
    client: &Client,
    writer: Writer<StatefulSet>,
    caches: &Caches,
    hooked: &Store<Pod>,
    to: &Senders,
    tracker: &Tracker,
) -> impl Future<Output = ()> + use<> {
    let events = reflector(
        writer,
        watcher(
            Api::<StatefulSet>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .modify(caches::trim_statefulset),
    );
    let (caches, hooked, to, tracker) =
        (caches.clone(), hooked.clone(), to.clone(), tracker.clone());
    let (mut recorded, mut tap) = (Changes::new(caches::statefulset_fingerprint), Tap::new());
    drive("StatefulSet", events, move |event| {
        if matches!(event, Event::InitDone) {
            tracker.synced(Cache::StatefulSets);
            to.relisted.trigger(());
        }
        if let Some(sts) = recorded.changed(&event) {
            let namespace = sts.namespace().unwrap_or_default();
            for pps in caches.pps_targeting(&namespace, Workload::Native, &sts.name_any()) {
                to.record.trigger(pps);
            }
        }
        if let Event::Apply(sts) | Event::InitApply(sts) = &event {
            to.generate.trigger(ObjectRef::from_obj(sts));
        }
        to.hooked(&hooked, tap.trigger(&event));
    })
}

/// How often to ask again whether the API server serves Advanced StatefulSets: after it said
/// not (Kruise may be installed later), and after the question failed.
const KRUISE_ASK_AGAIN: std::time::Duration = std::time::Duration::from_secs(60);
const KRUISE_ASK_AFTER_ERROR: std::time::Duration = std::time::Duration::from_secs(5);

fn watch_advanced(
    client: &Client,
    writer: Writer<AdvancedStatefulSet>,
    caches: &Caches,
    to: &Senders,
    tracker: &Tracker,
) -> impl Future<Output = ()> + use<> {
    let (client, caches, to, tracker) =
        (client.clone(), caches.clone(), to.clone(), tracker.clone());
    async move {
        let mut said_absent = false;
        loop {
            match advanced_statefulsets_served(&client).await {
                Ok(true) => break,
                Ok(false) => {
                    if !said_absent {
                        info!(
                            group = kruise::GROUP,
                            "the API server does not serve OpenKruise's Advanced StatefulSets (statefulsets.apps.kruise.io/v1beta1); PersistentPodStates targeting one find no target until it does"
                        );
                        said_absent = true;
                    }
                    tracker.synced(Cache::AdvancedStatefulSets);
                    tokio::time::sleep(KRUISE_ASK_AGAIN).await;
                }
                Err(e) => {
                    warn!(error = %e, "failed to ask whether the API server serves Advanced StatefulSets; asking again");
                    tokio::time::sleep(KRUISE_ASK_AFTER_ERROR).await;
                }
            }
        }
        info!(
            group = kruise::GROUP,
            "watching OpenKruise's Advanced StatefulSets"
        );
        let events = reflector(
            writer,
            watcher(
                Api::<AdvancedStatefulSet>::all(client),
                watcher::Config::default().any_semantic(),
            )
            .default_backoff()
            .modify(caches::trim_advanced),
        );
        let mut recorded = Changes::new(caches::advanced_fingerprint);
        drive("AdvancedStatefulSet", events, move |event| {
            if matches!(event, Event::InitDone) {
                tracker.synced(Cache::AdvancedStatefulSets);
                to.relisted.trigger(());
            }
            if let Some(asts) = recorded.changed(&event) {
                let namespace = asts.namespace().unwrap_or_default();
                for pps in caches.pps_targeting(&namespace, Workload::Kruise, &asts.name_any()) {
                    to.record.trigger(pps);
                }
            }
            if let Event::Apply(asts) | Event::InitApply(asts) = &event {
                to.generate_advanced.trigger(ObjectRef::from_obj(asts));
            }
        })
        .await;
    }
}

/// Whether the API server serves `statefulsets` in `apps.kruise.io/v1beta1`; an error only
/// when it could not say.
async fn advanced_statefulsets_served(client: &Client) -> Result<bool, kube::Error> {
    let group_version = format!("{}/{}", kruise::GROUP, kruise::VERSION);
    match client.list_api_group_resources(&group_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == kruise::PLURAL)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

fn watch_pods(
    client: &Client,
    (mut writer, mut hooked_writer): (Writer<CachedPod>, Writer<Pod>),
    caches: &Caches,
    to: &Senders,
    tracker: &Tracker,
) -> impl Future<Output = ()> + use<> {
    let events = watcher(
        Api::<CachedPod>::all(client.clone()),
        caches::pod_watch_config(),
    )
    .default_backoff();
    let (caches, to, tracker) = (caches.clone(), to.clone(), tracker.clone());
    let hooked = hooked_writer.as_reader();
    let mut recorded = Changes::new(caches::pod_fingerprint);
    let mut tap = Tap::new();
    let mut hooks_read = Changes::new(lifecycle::fingerprint);
    drive("Pod", events, move |event| {
        if let Some(event) = hooked_event(&event, &hooked) {
            hooked_writer.apply_watcher_event(&event);
            if let Some(pod) = hooks_read.changed(&event) {
                to.lifecycle.trigger(ObjectRef::from_obj(pod));
            }
        }
        let event = event.modify(caches::trim_pod);
        writer.apply_watcher_event(&event);
        if matches!(event, Event::InitDone) {
            tracker.synced(Cache::Pods);
            to.relisted.trigger(());
        }
        if let Some(pod) = recorded.changed(&event) {
            for pps in caches.pps_for_pod(pod) {
                to.record.trigger(pps);
            }
            if let Some(pod) = pin_skipped::to_announce(pod) {
                to.pin_skipped.trigger(pod);
            }
        }
        to.hooked(&hooked, tap.trigger(&event));
    })
}

/// What of a pod watch event concerns the lifecycle loop's pods ([`lifecycle::hooked`]): a pod
/// with a lifecycle state comes and changes, and goes when deleted or its state label goes.
fn hooked_event(event: &Event<CachedPod>, hooked: &Store<Pod>) -> Option<Event<Pod>> {
    let cached = |pod: &CachedPod| {
        let at = ObjectRef::new(&pod.name_any()).within(&pod.namespace().unwrap_or_default());
        hooked.get(&at).map(|p| Pod::clone(&p))
    };
    match event {
        Event::Init => Some(Event::Init),
        Event::InitDone => Some(Event::InitDone),
        Event::InitApply(pod) => lifecycle::hooked(pod).map(Event::InitApply),
        Event::Apply(pod) => match lifecycle::hooked(pod) {
            Some(hooked) => Some(Event::Apply(hooked)),
            None => cached(pod).map(Event::Delete),
        },
        Event::Delete(pod) => lifecycle::hooked(pod)
            .or_else(|| cached(pod))
            .map(Event::Delete),
    }
}

fn watch_nodes(
    client: &Client,
    writer: Writer<Node>,
    caches: &Caches,
    hooked: &Store<Pod>,
    to: &Senders,
    tracker: &Tracker,
) -> impl Future<Output = ()> + use<> {
    let events = reflector(
        writer,
        watcher(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .modify(caches::trim_node),
    );
    let (caches, hooked, to, tracker) =
        (caches.clone(), hooked.clone(), to.clone(), tracker.clone());
    let (mut recorded, mut tap) = (Changes::new(caches::node_fingerprint), Tap::new());
    drive("Node", events, move |event| {
        if matches!(event, Event::InitDone) {
            tracker.synced(Cache::Nodes);
            to.relisted.trigger(());
        }
        if let Some(node) = recorded.changed(&event) {
            for pps in caches.pps_for_node(node) {
                to.record.trigger(pps);
            }
        }
        to.hooked(&hooked, tap.trigger(&event));
    })
}

/// A re-list of the namespaces needs no full reconcile: it re-delivers every namespace, and a
/// changed label passes the filter.
fn watch_namespaces(
    client: &Client,
    writer: Writer<Namespace>,
    caches: &Caches,
    to: &Senders,
    tracker: &Tracker,
) -> impl Future<Output = ()> + use<> {
    let events = reflector(
        writer,
        watcher(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .modify(caches::trim_namespace),
    );
    let (caches, to, tracker) = (caches.clone(), to.clone(), tracker.clone());
    let mut labelled = Changes::new(caches::namespace_fingerprint);
    drive("Namespace", events, move |event| {
        if matches!(event, Event::InitDone) {
            tracker.synced(Cache::Namespaces);
        }
        if let Some(namespace) = labelled.changed(&event) {
            for sts in caches.statefulsets_in(&namespace.name_any()) {
                to.generate.trigger(sts);
            }
            for asts in caches.advanced_in(&namespace.name_any()) {
                to.generate_advanced.trigger(asts);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ipkeep_values::keys::STATE_LABEL;

    fn pod(name: &str, state: Option<&str>) -> CachedPod {
        let mut labels = serde_json::json!({"statefulset.kubernetes.io/pod-name": name});
        if let Some(state) = state {
            labels[STATE_LABEL] = state.into();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "prod", "labels": labels},
        }))
        .unwrap()
    }

    /// The lifecycle loop's cache, fed from the one pod watch, holds a pod while it has a
    /// lifecycle state, as a watch of those pods alone would: a re-list finds only those, and a
    /// pod that loses the label leaves.
    #[test]
    fn a_pod_is_the_lifecycle_loops_while_it_has_a_lifecycle_state() {
        let (hooked, mut writer) = reflector::store::<Pod>();
        let mut feed = |event: Event<CachedPod>| {
            if let Some(event) = hooked_event(&event, &hooked) {
                writer.apply_watcher_event(&event);
            }
        };
        let names = |store: &Store<Pod>| {
            let mut names: Vec<String> = store.state().iter().map(|p| p.name_any()).collect();
            names.sort();
            names
        };
        feed(Event::Init);
        feed(Event::InitApply(pod("db-0", None)));
        feed(Event::InitApply(pod("db-1", Some("Normal"))));
        feed(Event::InitDone);
        assert_eq!(names(&hooked), ["db-1"]);
        feed(Event::Apply(pod("db-0", Some("PreparingNormal"))));
        assert_eq!(names(&hooked), ["db-0", "db-1"]);
        feed(Event::Apply(pod("db-0", None)));
        assert_eq!(names(&hooked), ["db-1"], "the label went");
        feed(Event::Apply(pod("db-2", None)));
        feed(Event::Delete(pod("db-2", None)));
        assert_eq!(names(&hooked), ["db-1"]);
        feed(Event::Delete(pod("db-1", Some("Normal"))));
        assert!(names(&hooked).is_empty());
        // A re-list replaces what the cache holds.
        feed(Event::Apply(pod("db-3", Some("Normal"))));
        feed(Event::Init);
        feed(Event::InitApply(pod("db-4", Some("Normal"))));
        feed(Event::InitDone);
        assert_eq!(names(&hooked), ["db-4"]);
    }
}
