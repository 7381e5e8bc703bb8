//! Which objects of a lenient watch do not decode ([`Undecodables`]), the gauge that counts
//! them ([`UndecodableMetric`]), and the adapter that keeps them out of a reflector's store
//! ([`sorted`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use super::{Key, Lenient, Undecodable};

/// The gauge `objects_undecodable{kind}` of one binary (registered under its prefix); clones
/// share the values.
#[derive(Debug, Clone, Default)]
pub struct UndecodableMetric(Family<KindLabel, Gauge>);

/// The kind of the objects counted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// E.g. `PersistentPodState`.
    pub kind: &'static str,
}

impl UndecodableMetric {
    /// Adds the gauge to `registry`, with a series at zero for each of `kinds`.
    pub fn register(&self, registry: &mut Registry, kinds: &[&'static str]) {
        for &kind in kinds {
            let _ = self.0.get_or_create(&KindLabel { kind });
        }
        registry.register(
            "objects_undecodable",
            "Objects of this kind that cannot be decoded and are left out of the cache (the log names them), by kind",
            self.0.clone(),
        );
    }

    /// The series of `kind`.
    pub fn gauge(&self, kind: &'static str) -> Gauge {
        self.0.get_or_create(&KindLabel { kind }).clone()
    }
}

/// The objects of one watch that do not decode now, by namespace and name; clones share them.
#[derive(Clone)]
pub struct Undecodables {
    kind: &'static str,
    state: Arc<Mutex<State>>,
    gauge: Gauge,
    reports: Option<Arc<dyn Fn(Report) + Send + Sync>>,
    changed: Option<Arc<Notify>>,
}

/// What [`Undecodables::reported`] sends.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// An object found undecodable (once per resource version).
    Found(Box<Undecodable>),
    /// An undecodable object that was deleted, or decodes again: `(namespace, name)`.
    Gone(String, String),
}

impl fmt::Debug for Undecodables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Undecodables")
            .field("kind", &self.kind)
            .field("count", &self.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    current: BTreeMap<Key, Undecodable>,
    /// Those a relist found so far; they replace `current` when it completes.
    relisting: Option<BTreeMap<Key, Undecodable>>,
    generation: u64,
}

impl Undecodables {
    /// None yet, of `kind` (for logs), counted in `gauge`.
    pub fn new(kind: &'static str, gauge: Gauge) -> Self {
        Undecodables {
            kind,
            state: Arc::default(),
            gauge,
            reports: None,
            changed: None,
        }
    }

    /// Also hands `to` each object once per resource version that it is found undecodable (e.g.
    /// for a Warning Event on it), and once it is gone from the set. `to` runs with the set
    /// locked: it must not call back into it, nor block.
    pub fn reported(mut self, to: impl Fn(Report) + Send + Sync + 'static) -> Self {
        self.reports = Some(Arc::new(to));
        self
    }

    /// Also wakes `changed` on every change.
    pub fn notifying(mut self, changed: Arc<Notify>) -> Self {
        self.changed = Some(changed);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `namespace`/`name` is undecodable (`namespace` empty for a cluster-scoped kind).
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.lock()
            .current
            .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// The names of the undecodable objects in `namespace`.
    pub fn names_in(&self, namespace: &str) -> Vec<String> {
        self.lock()
            .current
            .range((namespace.to_string(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    /// The namespaces that hold an undecodable object.
    pub fn namespaces(&self) -> BTreeSet<String> {
        self.lock()
            .current
            .keys()
            .map(|(ns, _)| ns.clone())
            .collect()
    }

    /// How many objects are undecodable.
    pub fn len(&self) -> usize {
        self.lock().current.len()
    }

    /// Whether every object decodes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts the changes: a different value means a different set.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    fn changed(&self, state: &mut State) {
        state.generation += 1;
        self.gauge.set(state.current.len() as i64);
        if let Some(n) = &self.changed {
            n.notify_one();
        }
    }

    fn report(&self, report: Report) {
        if let Some(to) = &self.reports {
            to(report);
        }
    }

    fn begin_relist(&self) {
        self.lock().relisting = Some(BTreeMap::new());
    }

    fn end_relist(&self) {
        let mut state = self.lock();
        let Some(found) = state.relisting.take() else {
            return;
        };
        for (namespace, name) in state.current.keys().filter(|k| !found.contains_key(k)) {
            tracing::info!(kind = self.kind, namespace = ?namespace, name = ?name, "an undecodable object is gone or decodes again");
            self.report(Report::Gone(namespace.clone(), name.clone()));
        }
        if found != state.current {
            state.current = found;
            self.changed(&mut state);
        }
    }

    fn found(&self, object: Undecodable) {
        let key = object.key();
        let mut state = self.lock();
        let seen = state
            .current
            .get(&key)
            .is_some_and(|u| u.meta.resource_version == object.meta.resource_version);
        if !seen {
            tracing::warn!(
                kind = self.kind,
                namespace = ?key.0,
                name = ?key.1,
                resource_version = ?object.meta.resource_version.as_deref().unwrap_or_default(),
                error = ?object.error,
                "cannot decode this object; it is left out of the cache until it changes"
            );
            self.report(Report::Found(Box::new(object.clone())));
        }
        match state.relisting.as_mut() {
            Some(relisting) => {
                relisting.insert(key, object);
            }
            None => {
                if state.current.get(&key) != Some(&object) {
                    state.current.insert(key, object);
                    self.changed(&mut state);
                }
            }
        }
    }

    fn gone(&self, key: &Key) {
        let mut state = self.lock();
        if state.current.remove(key).is_some() {
            tracing::info!(kind = self.kind, namespace = ?key.0, name = ?key.1, "an undecodable object is gone or decodes again");
            self.report(Report::Gone(key.0.clone(), key.1.clone()));
            self.changed(&mut state);
        }
    }

    /// One event of a lenient watch, as the reflector of `store` takes it: `None` for an object
    /// that does not decode (remembered here), or the deletion of its last decoded version from
    /// the store.
    fn sort<K, D>(
        &self,
        event: Result<Event<Lenient<K, D>>, watcher::Error>,
        store: &Store<K>,
    ) -> Option<Result<Event<K>, watcher::Error>>
    where
        K: Resource<DynamicType = ()> + Clone,
    {
        let stale = |u: &Undecodable| {
            let (namespace, name) = u.key();
            let mut at = ObjectRef::<K>::new(&name);
            if !namespace.is_empty() {
                at = at.within(&namespace);
            }
            store.get(&at).map(|k| Ok(Event::Delete(K::clone(&k))))
        };
        let key = |k: &K| {
            (
                k.meta().namespace.clone().unwrap_or_default(),
                k.meta().name.clone().unwrap_or_default(),
            )
        };
        match event {
            Err(e) => Some(Err(e)),
            Ok(Event::Init) => {
                self.begin_relist();
                Some(Ok(Event::Init))
            }
            Ok(Event::InitDone) => {
                self.end_relist();
                Some(Ok(Event::InitDone))
            }
            Ok(Event::InitApply(l)) => match l.decoded {
                Ok(k) => Some(Ok(Event::InitApply(k))),
                Err(u) => {
                    self.found(u);
                    None
                }
            },
            Ok(Event::Apply(l)) => match l.decoded {
                Ok(k) => {
                    self.gone(&key(&k));
                    Some(Ok(Event::Apply(k)))
                }
                Err(u) => {
                    let stale = stale(&u);
                    self.found(u);
                    stale
                }
            },
            Ok(Event::Delete(l)) => match l.decoded {
                Ok(k) => {
                    self.gone(&key(&k));
                    Some(Ok(Event::Delete(k)))
                }
                Err(u) => {
                    self.gone(&u.key());
                    stale(&u)
                }
            },
        }
    }
}

/// The events of a lenient watch as the reflector of `store` takes them: objects that decode
/// pass, the others are left out and remembered in `undecodables` (and one that turned
/// undecodable is deleted from the store). Put it between the watcher and the reflector.
pub fn sorted<K, D, S>(
    events: S,
    store: Store<K>,
    undecodables: Undecodables,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + use<K, D, S>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    D: 'static,
    S: Stream<Item = Result<Event<Lenient<K, D>>, watcher::Error>> + Send,
{
    events.filter_map(move |event| std::future::ready(undecodables.sort(event, &store)))
}
