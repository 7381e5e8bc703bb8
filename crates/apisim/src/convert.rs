//! Version conversion between what is stored and what a client asked for.
//!
//! Objects are stored once per storage key in the storage version. Custom resources convert
//! with the `None` strategy (only `apiVersion` changes, as a CRD without a webhook does).
//! `events.k8s.io/v1` Events are served from the core `v1` Event storage with the field renames
//! kube-apiserver applies, so an Event a controller publishes through `events.k8s.io` is what
//! `kubectl get events` shows.

use serde_json::{Map, Value, json};

use crate::registry::{ResourceType, StorageKey};

/// Field renames between core/v1 Event (left) and events.k8s.io/v1 Event (right).
const EVENT_RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn is_events_v1(resource: &ResourceType) -> bool {
    resource.group == "events.k8s.io"
}

/// Where objects of `resource` are stored.
pub fn storage_of(resource: &ResourceType) -> StorageKey {
    if is_events_v1(resource) {
        StorageKey {
            group: String::new(),
            plural: "events".into(),
        }
    } else {
        resource.storage()
    }
}

fn rename(object: &mut Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let mut renamed = Map::new();
    for (from, to) in pairs {
        if let Some(v) = map.remove(from) {
            renamed.insert(to.to_owned(), v);
        }
    }
    map.extend(renamed);
}

/// The stored form of an object written through `resource`.
pub fn to_storage(resource: &ResourceType, storage_api_version: &str, mut object: Value) -> Value {
    if is_events_v1(resource) {
        rename(
            &mut object,
            EVENT_RENAMES.iter().map(|(core, v1)| (*v1, *core)),
        );
        object["apiVersion"] = json!("v1");
    } else {
        object["apiVersion"] = json!(storage_api_version);
    }
    object
}

/// The object as a client of `resource` sees it.
pub fn from_storage(resource: &ResourceType, object: &Value) -> Value {
    let mut object = object.clone();
    if is_events_v1(resource) {
        rename(&mut object, EVENT_RENAMES.iter().copied());
    }
    object["apiVersion"] = json!(resource.api_version());
    object["kind"] = json!(resource.kind);
    object
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn events_round_trip_between_the_two_groups() {
        let registry = Registry::new();
        let v1 = registry.get("events.k8s.io", "v1", "events").unwrap();
        let core = registry.get("", "v1", "events").unwrap();
        let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "pinned", "reason": "Pinned",
            "reportingController": "ipkeep.dev/scheduler-ext", "type": "Normal"});
        let stored = to_storage(v1, "v1", event.clone());
        assert_eq!(stored["involvedObject"]["name"], "p");
        assert_eq!(stored["message"], "pinned");
        let as_core = from_storage(core, &stored);
        assert_eq!(as_core["apiVersion"], "v1");
        assert_eq!(as_core["reportingComponent"], "ipkeep.dev/scheduler-ext");
        assert_eq!(from_storage(v1, &stored), event);
        assert_eq!(storage_of(v1), storage_of(core));
    }
}
