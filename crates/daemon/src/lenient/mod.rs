//! Caches that one object cannot stall. A list page or watch event is decoded item by item
//! ([`Lenient`]): an object that does not decode is kept out of the cache and remembered as
//! undecodable ([`Undecodables`]: by name, counted in the gauge `…_objects_undecodable{kind}`,
//! logged once per resource version with its name and the decoding error's path and message,
//! never its body), and every other object is cached as usual. Each component decodes through a
//! lean type of its own that reads only the fields its decisions read, so an object's size, and
//! any field the component never looks at, cost it nothing beyond the decoding of one item; lists
//! come in pages of [`PAGE_SIZE`].
//!
//! Why items one by one: kube-client decodes a list page, or a watch event, as one typed value,
//! so a single item that kube-apiserver accepted but the type refuses (a timestamp `"soon"`, an
//! `int32` field holding 3000000000: the API server does not check either for a custom
//! resource) fails the whole list, and the watch relists for ever without becoming synced.
//!
//! What a component concludes about an undecodable object is its own decision: the adapter
//! [`sorted`] takes it out of the cache (an object that turned undecodable is deleted from the
//! reflector's store, so no stale copy decides anything), and [`Undecodables`] says which
//! objects those are, so a decision that would have read one can fail safe.

mod undecodables;

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use ipkeep_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    ObjectMeta, OwnerReference, Time,
};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

pub use undecodables::{KindLabel, Report, UndecodableMetric, Undecodables, sorted};

/// The page size of a lenient list (`watcher::Config::page_size`). kube-apiserver stores
/// objects of up to about 1.5 MiB (etcd's default request limit). kube-client holds a page's
/// body twice while it decodes it (the bytes received, then a copy as text), and glibc's
/// allocator keeps part of that after it is freed (its mmap threshold grows with the largest
/// block freed), so a page costs up to about 3 MiB per object at once, and as much again kept
/// by the allocator. Five objects a page keep that within about 30 MiB, next to the node
/// agent's 128 MiB limit: with 30 objects of 1.3 MB, pages of 1, 5 and 10 cost the agent 7, 23
/// and 42 to 63 MiB over its baseline (`tests/tests/big_objects.rs`, debug build). Objects of a
/// few KiB take a list request per five, a few requests per start at one PersistentPodState per
/// StatefulSet.
pub const PAGE_SIZE: u32 = 5;

/// The longest path and message of a decoding error kept (each, in bytes): both come from the
/// object (map keys, values quoted by serde), which its writer chose.
const MAX_ERROR_PART: usize = 200;

/// One list item or watch event object of kind `K`, decoded through `D` (a lean type that reads
/// some of `K`'s fields and builds a `K` from them; `K` itself to read everything). Decoding
/// never fails for a well-formed JSON value: an object that `D` refuses is [`Undecodable`].
pub struct Lenient<K, D = K> {
    /// The object, or why it could not be read.
    pub decoded: Result<K, Undecodable>,
    decoder: PhantomData<fn() -> D>,
}

impl<K, D> Lenient<K, D>
where
    D: DeserializeOwned + Into<K>,
{
    /// Decodes one object from its JSON text.
    pub fn decode(json: &str) -> Self {
        Self::decode_from(&mut serde_json::Deserializer::from_str(json), || {
            serde_json::from_str::<Identity>(json)
        })
    }

    /// Decodes one object from its JSON value.
    pub fn decode_value(value: &serde_json::Value) -> Self {
        Self::decode_from(value, || Identity::deserialize(value))
    }

    fn decode_from<'a, De>(
        de: De,
        identity: impl FnOnce() -> Result<Identity, serde_json::Error>,
    ) -> Self
    where
        De: Deserializer<'a>,
    {
        let decoded = match serde_path_to_error::deserialize::<_, D>(de) {
            Ok(lean) => Ok(lean.into()),
            Err(e) => Err(Undecodable {
                meta: identity().map(Identity::into_meta).unwrap_or_default(),
                error: format!(
                    "{}: {}",
                    bounded(&e.path().to_string()),
                    bounded(&e.inner().to_string())
                ),
            }),
        };
        Lenient {
            decoded,
            decoder: PhantomData,
        }
    }
}

/// The name under which serde_json hands a value's own text to a visitor (what its `RawValue`
/// asks for). Another deserializer, or serde_json without it, calls
/// [`Visitor::visit_newtype_struct`] instead, and the item is read as a `serde_json::Value`.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de, K, D> Deserialize<'de> for Lenient<K, D>
where
    D: DeserializeOwned + Into<K>,
{
    fn deserialize<De: Deserializer<'de>>(deserializer: De) -> Result<Self, De::Error> {
        deserializer.deserialize_newtype_struct(RAW_VALUE_TOKEN, ItemVisitor(PhantomData))
    }
}

/// Reads one item: from its own text where serde_json gives it (kube-client's lists, and watch
/// events as kube-apiserver writes them, `type` before `object`), else as a value (an event whose
/// `object` comes first, which serde buffers before it knows the variant). Serde cannot resume a
/// value it failed in, so the item is kept whole (its text, one item at a time) and decoded
/// from that.
struct ItemVisitor<K, D>(PhantomData<fn() -> (K, D)>);

impl<'de, K, D> Visitor<'de> for ItemVisitor<K, D>
where
    D: DeserializeOwned + Into<K>,
{
    type Value = Lenient<K, D>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Lenient::decode_value(&serde_json::Value::Object(
                serde_json::Map::new(),
            )));
        };
        if first == RAW_VALUE_TOKEN {
            let text: Text<'de> = map.next_value()?;
            return Ok(Lenient::decode(text.as_str()));
        }
        // A deserializer that gave the object's own map: read it as a value.
        let mut object = serde_json::Map::new();
        object.insert(first, map.next_value()?);
        while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
            object.insert(k, v);
        }
        Ok(Lenient::decode_value(&serde_json::Value::Object(object)))
    }

    fn visit_newtype_struct<De: Deserializer<'de>>(
        self,
        deserializer: De,
    ) -> Result<Self::Value, De::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Ok(Lenient::decode_value(&value))
    }
}

/// A string as the deserializer has it: borrowed from the input, or owned.
enum Text<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Text<'_> {
    fn as_str(&self) -> &str {
        match self {
            Text::Borrowed(s) => s,
            Text::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<De: Deserializer<'de>>(deserializer: De) -> Result<Self, De::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text::Borrowed(s))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text::Owned(s.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text::Owned(s))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

impl<K: Clone, D> Clone for Lenient<K, D> {
    fn clone(&self) -> Self {
        Lenient {
            decoded: self.decoded.clone(),
            decoder: PhantomData,
        }
    }
}

impl<K: fmt::Debug, D> fmt::Debug for Lenient<K, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lenient")
            .field("decoded", &self.decoded)
            .finish()
    }
}

impl<K: Resource, D> Resource for Lenient<K, D> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match &self.decoded {
            Ok(k) => k.meta(),
            Err(u) => &u.meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match &mut self.decoded {
            Ok(k) => k.meta_mut(),
            Err(u) => &mut u.meta,
        }
    }
}

/// An object's namespace (empty for a cluster-scoped kind) and name.
type Key = (String, String);

/// An object that could not be decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Undecodable {
    /// Its name, namespace, UID and resource version (what could be read of them).
    pub meta: ObjectMeta,
    /// Where and why decoding failed: the field's path, then serde's message (each at most
    /// 200 bytes), e.g. `status.podStates.db-0.recordedAt: failed to parse …`.
    pub error: String,
}

impl Undecodable {
    fn key(&self) -> Key {
        (
            self.meta.namespace.clone().unwrap_or_default(),
            self.meta.name.clone().unwrap_or_default(),
        )
    }
}

/// `text` cut to [`MAX_ERROR_PART`] bytes (on a character boundary), marked when cut.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_ERROR_PART {
        return text.to_string();
    }
    let mut end = MAX_ERROR_PART;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The identifying metadata of an object that did not decode (what of it reads: kube-apiserver
/// never serves an object whose metadata does not).
#[derive(Deserialize)]
struct Identity {
    #[serde(default)]
    metadata: IdentityMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct IdentityMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl Identity {
    fn into_meta(self) -> ObjectMeta {
        let meta = self.metadata;
        ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            ..ObjectMeta::default()
        }
    }
}

/// The metadata fields a lean type reads, for its `metadata`: identity, generation, deletion,
/// the annotations (of which [`LeanMeta::into_meta`] keeps the ones asked for) and the
/// controller's owner reference. Labels, finalizers and `managedFields` are skipped unread.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct LeanMeta {
    /// `metadata.name`.
    #[serde(default)]
    pub name: Option<String>,
    /// `metadata.namespace`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// `metadata.uid`.
    #[serde(default)]
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// `metadata.generation`.
    #[serde(default)]
    pub generation: Option<i64>,
    /// `metadata.deletionTimestamp`.
    #[serde(default)]
    pub deletion_timestamp: Option<Time>,
    /// `metadata.annotations`.
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    /// `metadata.ownerReferences`.
    #[serde(default, rename = "ownerReferences")]
    pub owner_references: Option<Vec<OwnerReference>>,
}

impl LeanMeta {
    /// The metadata, with only the annotations named in `keep` and the controller's owner
    /// reference.
    pub fn into_meta(self, keep: &[&str]) -> ObjectMeta {
        let annotations = self
            .annotations
            .map(|mut a| {
                a.retain(|k, _| keep.contains(&k.as_str()));
                a
            })
            .filter(|a| !a.is_empty());
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            generation: self.generation,
            deletion_timestamp: self.deletion_timestamp,
            annotations,
            owner_references: self
                .owner_references
                .map(|mut o| {
                    o.retain(|o| o.controller == Some(true));
                    o
                })
                .filter(|o| !o.is_empty()),
            ..ObjectMeta::default()
        }
    }
}

#[cfg(test)]
mod tests;
