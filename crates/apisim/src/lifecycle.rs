//! Deletion and what follows it: finalizers and `deletionTimestamp`, graceful pod deletion,
//! owner-reference garbage collection (background, foreground, orphan), namespace termination
//! and CRD removal.
//!
//! kube-apiserver leaves most of this to controllers that run a moment later; here it happens
//! synchronously inside the write that triggers it, so tests never race a collector. The
//! observable end states and watch events are the same.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::cluster::State;
use crate::meta;
use crate::registry::StorageKey;

/// `DeleteOptions.propagationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Delete the owner now, dependents after (the default).
    #[default]
    Background,
    /// Delete dependents first; the owner carries `foregroundDeletion` until they are gone.
    Foreground,
    /// Keep dependents, dropping their owner reference.
    Orphan,
}

/// What a delete did.
#[derive(Debug, Clone)]
pub struct Deletion {
    /// The object's state after the call (the last state when removed).
    pub object: Arc<Value>,
    /// Whether it is gone (false: it carries a `deletionTimestamp` and waits).
    pub removed: bool,
}

const FOREGROUND: &str = "foregroundDeletion";
const ORPHAN: &str = "orphan";

fn namespaces() -> StorageKey {
    StorageKey {
        group: String::new(),
        plural: "namespaces".into(),
    }
}

fn is_pod(storage: &StorageKey) -> bool {
    storage.group.is_empty() && storage.plural == "pods"
}

/// Every stored object that names `owner_uid` as an owner.
fn dependents_of(state: &State, owner_uid: &str) -> Vec<(StorageKey, Arc<Value>)> {
    let mut found = Vec::new();
    for storage in state.store.storages() {
        for object in state.store.list(&storage, None) {
            if meta::owner_uids(&object).iter().any(|u| u == owner_uid) {
                found.push((storage.clone(), object));
            }
        }
    }
    found
}

/// Deletes (or starts deleting) one object.
pub fn delete(
    state: &mut State,
    storage: &StorageKey,
    namespace: &str,
    name: &str,
    propagation: Propagation,
    grace_seconds: Option<u64>,
) -> Option<Deletion> {
    let current = Arc::clone(state.store.get(storage, namespace, name)?);
    let mut object = (*current).clone();
    let uid = meta::uid(&object).to_owned();
    let mut finalizers = meta::finalizers(&object);
    let dependents = dependents_of(state, &uid);

    if *storage == namespaces() {
        return Some(terminate_namespace(state, object));
    }
    if is_pod(storage) && !meta::is_deleting(&object) {
        let grace = grace_seconds
            .or_else(|| object["spec"]["terminationGracePeriodSeconds"].as_u64())
            .unwrap_or(30);
        let bound = object["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        let terminal = matches!(
            object["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        if grace > 0 && bound && !terminal {
            // A kubelet must confirm: the pod stays, Terminating, until deleted with grace 0.
            object["metadata"]["deletionTimestamp"] = json!(meta::seconds_from_now(grace));
            object["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            let object = state.store.replace(storage, object);
            return Some(Deletion {
                object,
                removed: false,
            });
        }
    }
    match propagation {
        Propagation::Foreground
            if !dependents.is_empty() && !finalizers.iter().any(|f| f == FOREGROUND) =>
        {
            finalizers.push(FOREGROUND.into());
        }
        Propagation::Orphan => {
            for (dep_storage, dependent) in &dependents {
                let mut dependent = (**dependent).clone();
                meta::remove_owner(&mut dependent, &uid);
                state.store.replace(dep_storage, dependent);
            }
        }
        _ => {}
    }
    if finalizers.is_empty() {
        let removed = remove(state, storage, namespace, name)?;
        return Some(Deletion {
            object: removed,
            removed: true,
        });
    }
    let changed = !meta::is_deleting(&object) || meta::finalizers(&object) != finalizers;
    if !meta::is_deleting(&object) {
        object["metadata"]["deletionTimestamp"] = json!(meta::now());
        object["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    }
    meta::set_finalizers(&mut object, &finalizers);
    let object = if changed {
        state.store.replace(storage, object)
    } else {
        current
    };
    if finalizers.iter().any(|f| f == FOREGROUND) {
        for (dep_storage, dependent) in dependents {
            let (ns, n) = (
                meta::namespace(&dependent).to_owned(),
                meta::name(&dependent).to_owned(),
            );
            delete(state, &dep_storage, &ns, &n, Propagation::Background, None);
        }
        let after = state.store.get(storage, namespace, name).cloned();
        return Some(match after {
            Some(object) => Deletion {
                object,
                removed: false,
            },
            None => Deletion {
                object,
                removed: true,
            },
        });
    }
    Some(Deletion {
        object,
        removed: false,
    })
}

/// Removes an object for good and lets everything that depended on it follow.
pub fn remove(
    state: &mut State,
    storage: &StorageKey,
    namespace: &str,
    name: &str,
) -> Option<Arc<Value>> {
    let removed = state.store.remove(storage, namespace, name)?;
    let mut queue = VecDeque::from([(storage.clone(), Arc::clone(&removed))]);
    while let Some((storage, gone)) = queue.pop_front() {
        let uid = meta::uid(&gone).to_owned();
        // Background collection: dependents whose every owner is gone are deleted; others
        // just lose the reference.
        for (dep_storage, dependent) in dependents_of(state, &uid) {
            let alive = meta::owner_uids(&dependent)
                .iter()
                .any(|u| *u != uid && state.store.locate_uid(u).is_some());
            let (ns, n) = (
                meta::namespace(&dependent).to_owned(),
                meta::name(&dependent).to_owned(),
            );
            if alive {
                let mut dependent = (*dependent).clone();
                meta::remove_owner(&mut dependent, &uid);
                state.store.replace(&dep_storage, dependent);
            } else {
                delete(state, &dep_storage, &ns, &n, Propagation::Background, None);
            }
        }
        // Owners waiting in foreground deletion for this dependent.
        for owner_uid in meta::owner_uids(&gone) {
            let Some((owner_storage, owner)) = state
                .store
                .locate_uid(&owner_uid)
                .map(|(s, o)| (s.clone(), Arc::clone(o)))
            else {
                continue;
            };
            let waiting = meta::finalizers(&owner).iter().any(|f| f == FOREGROUND);
            if waiting && dependents_of(state, &owner_uid).is_empty() {
                let rest: Vec<String> = meta::finalizers(&owner)
                    .into_iter()
                    .filter(|f| f != FOREGROUND && f != ORPHAN)
                    .collect();
                let (ns, n) = (
                    meta::namespace(&owner).to_owned(),
                    meta::name(&owner).to_owned(),
                );
                if rest.is_empty() {
                    if let Some(o) = state.store.remove(&owner_storage, &ns, &n) {
                        queue.push_back((owner_storage, o));
                    }
                } else {
                    let mut owner = (*owner).clone();
                    meta::set_finalizers(&mut owner, &rest);
                    state.store.replace(&owner_storage, owner);
                }
            }
        }
        if storage.group == "apiextensions.k8s.io" {
            remove_custom_resources(state, &gone);
        }
        let ns = meta::namespace(&gone).to_owned();
        if !ns.is_empty() {
            finish_namespace(state, &ns);
        }
    }
    Some(removed)
}

/// A write left an object deleting with no finalizer: it goes now.
pub fn remove_if_finalized(
    state: &mut State,
    storage: &StorageKey,
    object: &Value,
) -> Option<Arc<Value>> {
    if meta::is_deleting(object) && meta::finalizers(object).is_empty() {
        let is_pod_waiting_for_kubelet = is_pod(storage)
            && object["metadata"]["deletionGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(0)
                > 0;
        if !is_pod_waiting_for_kubelet {
            return remove(state, storage, meta::namespace(object), meta::name(object));
        }
    }
    None
}

/// A new object whose every owner is already gone is collected at once, as the garbage
/// collector would on its next pass.
pub fn collect_if_orphaned(state: &mut State, storage: &StorageKey, object: &Value) {
    let owners = meta::owner_uids(object);
    if !owners.is_empty() && owners.iter().all(|u| state.store.locate_uid(u).is_none()) {
        delete(
            state,
            storage,
            meta::namespace(object),
            meta::name(object),
            Propagation::Background,
            None,
        );
    }
}

fn terminate_namespace(state: &mut State, mut namespace: Value) -> Deletion {
    let name = meta::name(&namespace).to_owned();
    if !meta::is_deleting(&namespace) {
        namespace["metadata"]["deletionTimestamp"] = json!(meta::now());
        namespace["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        namespace["status"]["phase"] = json!("Terminating");
        state.store.replace(&namespaces(), namespace);
    }
    for storage in state.store.storages() {
        for object in state.store.list(&storage, Some(&name)) {
            let n = meta::name(&object).to_owned();
            delete(state, &storage, &name, &n, Propagation::Background, Some(0));
        }
    }
    finish_namespace(state, &name);
    match state.store.get(&namespaces(), "", &name) {
        Some(object) => Deletion {
            object: Arc::clone(object),
            removed: false,
        },
        None => Deletion {
            object: Arc::new(json!({"metadata": {"name": name}})),
            removed: true,
        },
    }
}

/// Removes a terminating namespace once nothing is left in it.
fn finish_namespace(state: &mut State, name: &str) {
    let Some(namespace) = state.store.get(&namespaces(), "", name).cloned() else {
        return;
    };
    if !meta::is_deleting(&namespace) {
        return;
    }
    let empty = state
        .store
        .storages()
        .iter()
        .all(|s| state.store.list(s, Some(name)).is_empty());
    if empty && meta::finalizers(&namespace).is_empty() {
        state.store.remove(&namespaces(), "", name);
    }
}

fn remove_custom_resources(state: &mut State, crd: &Value) {
    let group = crd["spec"]["group"].as_str().unwrap_or_default().to_owned();
    let plural = crd["spec"]["names"]["plural"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let storage = StorageKey { group, plural };
    for object in state.store.list(&storage, None) {
        let (ns, n) = (
            meta::namespace(&object).to_owned(),
            meta::name(&object).to_owned(),
        );
        remove(state, &storage, &ns, &n);
    }
    state.registry.unregister_crd(meta::name(crd));
}
