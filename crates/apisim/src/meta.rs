//! Object metadata conventions: names, uids, timestamps, finalizers and owner references, as
//! `metav1.ObjectMeta` defines them.

use std::hash::{BuildHasher, RandomState};
use std::time::SystemTime;

use serde_json::{Value, json};

/// The time now, as `metav1.Time` (RFC 3339, seconds).
pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// `now + seconds`, as `metav1.Time`.
pub fn seconds_from_now(seconds: u64) -> String {
    let at = SystemTime::now() + std::time::Duration::from_secs(seconds);
    humantime::format_rfc3339_seconds(at).to_string()
}

fn random_u64() -> u64 {
    RandomState::new().hash_one(SystemTime::now())
}

/// A fresh uid in the usual 8-4-4-4-12 form.
pub fn new_uid(counter: u64) -> String {
    let r = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (r >> 32) as u32,
        (r >> 16) as u16,
        r & 0xfff,
        (counter >> 48) & 0xfff,
        counter & 0xffff_ffff_ffff
    )
}

/// The five-character suffix `generateName` appends (consonants and digits, like
/// apimachinery's `utilrand.String`).
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
            r /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// Checks a DNS-1123 subdomain (most object names): lower-case alphanumerics, `-` and `.`,
/// at most 253 characters, starting and ending alphanumeric.
pub fn validate_subdomain(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case \
             alphanumeric characters, '-' or '.', and must start and end with an alphanumeric \
             character"
        ))
    }
}

/// Checks a DNS-1123 label (namespaces): like a subdomain without dots, at most 63 characters.
pub fn validate_label(name: &str) -> Result<(), String> {
    if name.len() <= 63 && !name.contains('.') && validate_subdomain(name).is_ok() {
        Ok(())
    } else {
        Err(format!(
            "Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case \
             alphanumeric characters or '-', and must start and end with an alphanumeric character"
        ))
    }
}

/// `metadata.name`.
pub fn name(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.namespace`.
pub fn namespace(object: &Value) -> &str {
    object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.uid`.
pub fn uid(object: &Value) -> &str {
    object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.resourceVersion`.
pub fn resource_version(object: &Value) -> &str {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.finalizers`.
pub fn finalizers(object: &Value) -> Vec<String> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|f| {
            f.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Replaces `metadata.finalizers` (removing the key when empty, as the server serialises it).
pub fn set_finalizers(object: &mut Value, finalizers: &[String]) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if finalizers.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".into(), json!(finalizers));
        }
    }
}

/// Whether `metadata.deletionTimestamp` is set.
pub fn is_deleting(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// The uids in `metadata.ownerReferences`.
pub fn owner_uids(object: &Value) -> Vec<String> {
    owner_references(object)
        .iter()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// `metadata.ownerReferences`.
pub fn owner_references(object: &Value) -> Vec<Value> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Drops the owner reference to `owner_uid`.
pub fn remove_owner(object: &mut Value, owner_uid: &str) {
    let refs: Vec<Value> = owner_references(object)
        .into_iter()
        .filter(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid))
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if refs.is_empty() {
            meta.remove("ownerReferences");
        } else {
            meta.insert("ownerReferences".into(), Value::Array(refs));
        }
    }
}

/// Reads a dotted JSON path such as `.spec.replicas` (used by scale subresources).
pub fn get_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .try_fold(object, |current, part| current.get(part))
}

/// Writes a dotted JSON path, creating objects on the way.
pub fn set_path(object: &mut Value, path: &str, value: Value) {
    let mut current = object;
    let parts: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        if !current.is_object() {
            *current = json!({});
        }
        let Some(map) = current.as_object_mut() else {
            return;
        };
        if i + 1 == parts.len() {
            map.insert((*part).to_owned(), value);
            return;
        }
        current = map.entry((*part).to_owned()).or_insert_with(|| json!({}));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dns_rules() {
        assert!(validate_subdomain("pg-0.db").is_ok());
        assert!(validate_subdomain("Pg").is_err());
        assert!(validate_subdomain("-a").is_err());
        assert!(validate_label("kube-system").is_ok());
        assert!(validate_label("a.b").is_err());
        let s = name_suffix();
        assert_eq!(s.len(), 5);
        assert!(validate_label(&s).is_ok());
        assert_ne!(new_uid(1), new_uid(2));
    }

    #[test]
    fn paths_read_and_write() {
        let mut o = json!({"spec": {"replicas": 3}});
        assert_eq!(get_path(&o, ".spec.replicas"), Some(&json!(3)));
        set_path(&mut o, ".status.replicas", json!(2));
        assert_eq!(o["status"]["replicas"], 2);
        let mut owned = json!({"metadata": {"ownerReferences": [{"uid": "a"}, {"uid": "b"}]}});
        remove_owner(&mut owned, "a");
        assert_eq!(owner_uids(&owned), ["b"]);
        remove_owner(&mut owned, "b");
        assert!(owned["metadata"].get("ownerReferences").is_none());
    }
}
