//! OpenKruise's Advanced StatefulSet (`statefulsets.apps.kruise.io`, read as `v1beta1`): only the
//! fields ipkeep reads, decoded leniently. A field of the wrong shape reads as unset rather than
//! making the object undecodable, because an object missing from the cache would read as "target
//! gone" and clear its records.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::{Deserialize, DeserializeOwned, Deserializer};

/// The API group of OpenKruise's Advanced StatefulSet.
pub const GROUP: &str = "apps.kruise.io";
/// The version ipkeep reads it at (the storage version; `v1alpha1` is served too).
pub const VERSION: &str = "v1beta1";
/// Its resource name.
pub const PLURAL: &str = "statefulsets";

/// An Advanced StatefulSet, as ipkeep reads it.
#[derive(Clone, Debug, Default, serde::Deserialize, Serialize)]
pub struct AdvancedStatefulSet {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What ipkeep reads of the spec.
    #[serde(default, deserialize_with = "lenient")]
    pub spec: AdvancedStatefulSetSpec,
    /// What ipkeep reads of the status.
    #[serde(default, deserialize_with = "lenient")]
    pub status: AdvancedStatefulSetStatus,
}

/// [`AdvancedStatefulSet`]'s spec: the fields that say which ordinals it wants, how it manages
/// pods, whether it has its own lifecycle hooks, and its pod template.
#[derive(Clone, Debug, Default, serde::Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedStatefulSetSpec {
    /// `replicas` (1 when unset).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub replicas: Option<i32>,
    /// `reserveOrdinals`: ordinals and ranges `"a-b"` that get no pod.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reserve_ordinals: Vec<ReserveOrdinal>,
    /// `ordinals.start` (counted by Kruise only behind a feature gate).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub ordinals: Option<Ordinals>,
    /// `podManagementPolicy`.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_management_policy: Option<String>,
    /// `lifecycle` (its own PreDelete / InPlaceUpdate / PreNormal hooks), kept as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<serde_json::Value>,
    /// The pod template.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub template: Option<PodTemplateSpec>,
}

/// `spec.ordinals`.
#[derive(Clone, Debug, Default, serde::Deserialize, Serialize)]
pub struct Ordinals {
    /// `start`.
    #[serde(default, deserialize_with = "lenient")]
    pub start: i32,
}

/// [`AdvancedStatefulSet`]'s status.
#[derive(Clone, Debug, Default, serde::Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedStatefulSetStatus {
    /// `observedGeneration`.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_generation: Option<i64>,
    /// `updateRevision`.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub update_revision: Option<String>,
}

/// One entry of `spec.reserveOrdinals` (the API's int-or-string): an ordinal, or a range
/// `"a-b"` (both ends included). Anything else the API server let through is kept as it came,
/// so that the ordinal rules can treat it as Kruise does (an unreadable entry).
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(untagged)]
pub enum ReserveOrdinal {
    /// An ordinal.
    Int(i64),
    /// A range `"a-b"`, or text that is not one.
    Text(String),
    /// Neither an integer nor text.
    Other(serde_json::Value),
}

/// Decodes a field, or its default when it has another shape.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).unwrap_or_default())
}

impl AdvancedStatefulSet {
    /// Its annotations, if any.
    pub fn annotations(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.annotations.as_ref()
    }
}

impl kube::Resource for AdvancedStatefulSet {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(crate::statefulset::KIND)
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kube::Resource;

    /// The fields ipkeep reads decode; a field of another shape reads as unset and leaves the
    /// rest readable.
    #[test]
    fn decodes_what_ipkeep_reads_and_survives_odd_fields() {
        let asts: AdvancedStatefulSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "team", "uid": "u1"},
            "spec": {"replicas": 4, "reserveOrdinals": [1, "3-5"], "ordinals": {"start": 2},
                     "podManagementPolicy": "Parallel", "lifecycle": {"preDelete": {}},
                     "updateStrategy": {"rollingUpdate": {"partition": 2}},
                     "template": {"metadata": {"labels": {"app": "db"}},
                                  "spec": {"containers": [{"name": "c", "image": "x"}]}}},
            "status": {"observedGeneration": 3, "updateRevision": "db-1"}
        }))
        .unwrap();
        assert_eq!(asts.spec.replicas, Some(4));
        assert_eq!(
            asts.spec.reserve_ordinals,
            [ReserveOrdinal::Int(1), ReserveOrdinal::Text("3-5".into())]
        );
        assert_eq!(asts.spec.ordinals.as_ref().map(|o| o.start), Some(2));
        assert!(asts.spec.lifecycle.is_some() && asts.spec.template.is_some());
        assert_eq!(asts.status.update_revision.as_deref(), Some("db-1"));
        let odd: AdvancedStatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db"},
            "spec": {"replicas": "three", "reserveOrdinals": 7, "template": {"spec": 1}},
            "status": []
        }))
        .unwrap();
        assert_eq!(odd.spec.replicas, None);
        assert!(odd.spec.reserve_ordinals.is_empty() && odd.spec.template.is_none());
        assert_eq!(odd.metadata.name.as_deref(), Some("db"));
        assert_eq!(
            AdvancedStatefulSet::url_path(&(), Some("team")),
            "/apis/apps.kruise.io/v1beta1/namespaces/team/statefulsets"
        );
        assert_eq!(
            AdvancedStatefulSet::api_version(&()),
            "apps.kruise.io/v1beta1"
        );
    }
}
