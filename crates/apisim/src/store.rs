//! The object store: every object by storage key, namespace and name, one global revision
//! counter (etcd's), and the history of changes that watches, paged lists and exact-version
//! lists read from.
//!
//! Promises: every change gets the next revision, which becomes the object's
//! `resourceVersion`; the history holds every change after the compaction point in revision
//! order; a read "as of" a revision older than the compaction point is refused with
//! [`Compacted`] (the server turns it into 410 Gone), never answered with newer data.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::registry::StorageKey;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Removed.
    Deleted,
}

impl ChangeKind {
    /// The watch event type.
    pub fn watch_type(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change in the history.
#[derive(Debug, Clone)]
pub struct Change {
    /// Revision of the change (the object's new `resourceVersion`).
    pub revision: u64,
    /// Storage of the object.
    pub storage: StorageKey,
    /// Kind of change.
    pub kind: ChangeKind,
    /// The object after the change (for deletes: its last state, with the delete's revision).
    pub object: Arc<Value>,
    /// The object before the change (none for creates), to roll snapshots back.
    pub previous: Option<Arc<Value>>,
}

/// A read asked for history that has been compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// The revision asked for.
    pub requested: u64,
    /// The oldest revision still readable.
    pub oldest: u64,
}

type ObjectKey = (String, String);

/// The in-memory "etcd".
#[derive(Debug)]
pub struct Store {
    revision: u64,
    objects: BTreeMap<StorageKey, BTreeMap<ObjectKey, Arc<Value>>>,
    by_uid: HashMap<String, (StorageKey, ObjectKey)>,
    history: VecDeque<Change>,
    /// Reads as of a revision below this are refused.
    compacted: u64,
    max_history: usize,
}

fn key_of(object: &Value) -> ObjectKey {
    let meta = &object["metadata"];
    (
        meta["namespace"].as_str().unwrap_or_default().to_owned(),
        meta["name"].as_str().unwrap_or_default().to_owned(),
    )
}

fn uid_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/uid").and_then(Value::as_str)
}

impl Store {
    /// An empty store keeping at most `max_history` changes.
    pub fn new(max_history: usize) -> Self {
        Self {
            revision: 1,
            objects: BTreeMap::new(),
            by_uid: HashMap::new(),
            history: VecDeque::new(),
            compacted: 1,
            max_history: max_history.max(1),
        }
    }

    /// The latest revision.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// One object.
    pub fn get(&self, storage: &StorageKey, namespace: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(storage)?
            .get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Where the object with this uid lives (any storage).
    pub fn locate_uid(&self, uid: &str) -> Option<(&StorageKey, &Arc<Value>)> {
        let (storage, key) = self.by_uid.get(uid)?;
        Some((storage, self.objects.get(storage)?.get(key)?))
    }

    /// Current objects of a storage, optionally in one namespace, in (namespace, name) order.
    pub fn list(&self, storage: &StorageKey, namespace: Option<&str>) -> Vec<Arc<Value>> {
        self.objects
            .get(storage)
            .map(|objects| {
                objects
                    .iter()
                    .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
                    .map(|(_, o)| Arc::clone(o))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every storage key that holds objects.
    pub fn storages(&self) -> Vec<StorageKey> {
        self.objects
            .iter()
            .filter(|(_, o)| !o.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The objects of a storage as they were at `revision` (for `continue` tokens and
    /// `resourceVersionMatch=Exact`).
    pub fn list_at(
        &self,
        storage: &StorageKey,
        namespace: Option<&str>,
        revision: u64,
    ) -> Result<Vec<Arc<Value>>, Compacted> {
        if revision < self.compacted {
            return Err(Compacted {
                requested: revision,
                oldest: self.compacted,
            });
        }
        let mut objects: BTreeMap<ObjectKey, Arc<Value>> =
            self.objects.get(storage).cloned().unwrap_or_default();
        for change in self.history.iter().rev() {
            if change.revision <= revision {
                break;
            }
            if change.storage != *storage {
                continue;
            }
            let key = key_of(&change.object);
            match &change.previous {
                Some(previous) => objects.insert(key, Arc::clone(previous)),
                None => objects.remove(&key),
            };
        }
        Ok(objects
            .into_iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
            .map(|(_, o)| o)
            .collect())
    }

    /// Changes of a storage after `revision`, oldest first.
    pub fn changes_after(
        &self,
        storage: &StorageKey,
        revision: u64,
    ) -> Result<Vec<Change>, Compacted> {
        if revision < self.compacted {
            return Err(Compacted {
                requested: revision,
                oldest: self.compacted,
            });
        }
        let start = self.history.partition_point(|c| c.revision <= revision);
        Ok(self
            .history
            .iter()
            .skip(start)
            .filter(|c| c.storage == *storage)
            .cloned()
            .collect())
    }

    fn record(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > self.max_history {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.revision;
            }
        }
    }

    fn stamp(&mut self, mut object: Value) -> Value {
        self.revision += 1;
        object["metadata"]["resourceVersion"] = json!(self.revision.to_string());
        object
    }

    /// Stores a new object (the caller checked it does not exist) and returns it with its
    /// `resourceVersion`.
    pub fn insert(&mut self, storage: &StorageKey, object: Value) -> Arc<Value> {
        let object = Arc::new(self.stamp(object));
        let key = key_of(&object);
        if let Some(uid) = uid_of(&object) {
            self.by_uid
                .insert(uid.to_owned(), (storage.clone(), key.clone()));
        }
        self.objects
            .entry(storage.clone())
            .or_default()
            .insert(key, Arc::clone(&object));
        self.record(Change {
            revision: self.revision,
            storage: storage.clone(),
            kind: ChangeKind::Added,
            object: Arc::clone(&object),
            previous: None,
        });
        object
    }

    /// Replaces an existing object; returns the stored version.
    pub fn replace(&mut self, storage: &StorageKey, object: Value) -> Arc<Value> {
        let object = Arc::new(self.stamp(object));
        let key = key_of(&object);
        let previous = self
            .objects
            .entry(storage.clone())
            .or_default()
            .insert(key, Arc::clone(&object));
        self.record(Change {
            revision: self.revision,
            storage: storage.clone(),
            kind: ChangeKind::Modified,
            object: Arc::clone(&object),
            previous,
        });
        object
    }

    /// Removes an object; returns its last state carrying the delete's revision.
    pub fn remove(
        &mut self,
        storage: &StorageKey,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Value>> {
        let key = (namespace.to_owned(), name.to_owned());
        let previous = self.objects.get_mut(storage)?.remove(&key)?;
        if let Some(uid) = uid_of(&previous) {
            self.by_uid.remove(uid);
        }
        let object = Arc::new(self.stamp((*previous).clone()));
        self.record(Change {
            revision: self.revision,
            storage: storage.clone(),
            kind: ChangeKind::Deleted,
            object: Arc::clone(&object),
            previous: Some(previous),
        });
        Some(object)
    }

    /// Forgets all history up to now: watches and `continue` tokens from before get 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.revision;
    }

    /// The oldest revision still readable.
    pub fn oldest_revision(&self) -> u64 {
        self.compacted
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key() -> StorageKey {
        StorageKey {
            group: String::new(),
            plural: "pods".into(),
        }
    }

    fn pod(name: &str, uid: &str, v: u64) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": uid}, "v": v})
    }

    #[test]
    fn revisions_increase_and_history_replays_in_order() {
        let mut store = Store::new(100);
        let start = store.revision();
        let a = store.insert(&key(), pod("a", "u1", 1));
        store.replace(&key(), pod("a", "u1", 2));
        store.insert(&key(), pod("b", "u2", 1));
        let gone = store.remove(&key(), "default", "a").unwrap();
        assert_eq!(a["metadata"]["resourceVersion"], (start + 1).to_string());
        assert_eq!(gone["metadata"]["resourceVersion"], (start + 4).to_string());
        let changes = store.changes_after(&key(), start + 1).unwrap();
        let kinds: Vec<_> = changes.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [ChangeKind::Modified, ChangeKind::Added, ChangeKind::Deleted]
        );
        assert!(store.locate_uid("u1").is_none());
        assert!(store.locate_uid("u2").is_some());
    }

    #[test]
    fn snapshots_roll_back_to_the_asked_revision() {
        let mut store = Store::new(100);
        store.insert(&key(), pod("a", "u1", 1));
        let at = store.revision();
        store.replace(&key(), pod("a", "u1", 2));
        store.insert(&key(), pod("b", "u2", 1));
        store.remove(&key(), "default", "a");
        let then = store.list_at(&key(), None, at).unwrap();
        assert_eq!(then.len(), 1);
        assert_eq!(then[0]["v"], 1);
        assert_eq!(store.list(&key(), None).len(), 1);
    }

    #[test]
    fn compacted_history_is_refused() {
        let mut store = Store::new(2);
        let start = store.revision();
        for i in 0..5 {
            store.insert(&key(), pod(&format!("p{i}"), &format!("u{i}"), 0));
        }
        assert!(store.changes_after(&key(), start).is_err());
        assert_eq!(
            store
                .changes_after(&key(), store.revision() - 2)
                .unwrap()
                .len(),
            2
        );
        store.compact();
        assert!(store.changes_after(&key(), store.revision() - 1).is_err());
        assert!(
            store
                .changes_after(&key(), store.revision())
                .unwrap()
                .is_empty()
        );
        assert!(store.list_at(&key(), None, start).is_err());
    }
}
