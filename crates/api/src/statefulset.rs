//! Which StatefulSet an owner reference or a PersistentPodState's `targetRef` names: one rule for
//! every part of ipkeep. A StatefulSet is kind `StatefulSet` in API group `apps` exactly (any
//! version, as the API server's own `apps/v1`); OpenKruise's Advanced StatefulSet is kind
//! `StatefulSet` in group `apps.kruise.io` (`v1beta1` or `v1alpha1`), a [`Workload`] of its own:
//! the two name their pods alike, so kind and name alone would take one for the other. A UID,
//! where the caller knows one, is compared on the reference [`controller`] returns.
//!
//! [`is_statefulset`], [`controller`] and [`TargetReference::statefulset`] answer for Kubernetes'
//! StatefulSet only (the lifecycle hooks and their predictions are for it alone);
//! [`workload`], [`controller_workload`] and [`TargetReference::workload`] for either.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::TargetReference;

/// The API group of Kubernetes' StatefulSet.
pub const GROUP: &str = "apps";
/// The kind of Kubernetes' StatefulSet.
pub const KIND: &str = "StatefulSet";

/// Which StatefulSet controller a StatefulSet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// Kubernetes' StatefulSet (`apps`).
    Native,
    /// OpenKruise's Advanced StatefulSet (`apps.kruise.io`).
    Kruise,
}

impl Workload {
    /// Its API group.
    pub fn group(self) -> &'static str {
        match self {
            Workload::Native => GROUP,
            Workload::Kruise => crate::kruise::GROUP,
        }
    }

    /// How messages name it: `StatefulSet`, or `Advanced StatefulSet (apps.kruise.io)`.
    pub fn describe(self) -> &'static str {
        match self {
            Workload::Native => "StatefulSet",
            Workload::Kruise => "Advanced StatefulSet (apps.kruise.io)",
        }
    }
}

/// The StatefulSet workload `api_version` and `kind` name, if any.
pub fn workload(api_version: &str, kind: &str) -> Option<Workload> {
    if kind != KIND {
        return None;
    }
    match group_of(api_version) {
        GROUP => Some(Workload::Native),
        crate::kruise::GROUP => Some(Workload::Kruise),
        _ => None,
    }
}

/// The controlling owner among `owners` when it is a StatefulSet of either workload.
pub fn controller_workload<'a>(
    owners: impl IntoIterator<Item = &'a OwnerReference>,
) -> Option<(Workload, &'a OwnerReference)> {
    let owner = owners.into_iter().find(|o| o.controller == Some(true))?;
    workload(&owner.api_version, &owner.kind).map(|w| (w, owner))
}

/// The API group of an `apiVersion`: `apps` of `apps/v1`, `""` (the core group) of `v1`.
pub fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

/// Whether `api_version` and `kind` name Kubernetes' StatefulSet.
pub fn is_statefulset(api_version: &str, kind: &str) -> bool {
    kind == KIND && group_of(api_version) == GROUP
}

/// The controlling owner among `owners` (the reference with `controller: true`; the API server
/// allows one) when it is a StatefulSet; `None` without one, or when another kind controls.
pub fn controller<'a>(
    owners: impl IntoIterator<Item = &'a OwnerReference>,
) -> Option<&'a OwnerReference> {
    owners
        .into_iter()
        .find(|o| o.controller == Some(true))
        .filter(|o| is_statefulset(&o.api_version, &o.kind))
}

impl TargetReference {
    /// The name of the StatefulSet this targets, `None` when it targets another kind or group.
    pub fn statefulset(&self) -> Option<&str> {
        is_statefulset(&self.api_version, &self.kind).then_some(self.name.as_str())
    }

    /// The workload and name of the StatefulSet this targets, of either workload.
    pub fn workload(&self) -> Option<(Workload, &str)> {
        workload(&self.api_version, &self.kind).map(|w| (w, self.name.as_str()))
    }

    /// Whether this targets the `workload` StatefulSet `name`.
    pub fn targets(&self, workload: Workload, name: &str) -> bool {
        self.workload() == Some((workload, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(
        api_version: &str,
        kind: &str,
        name: &str,
        controller: Option<bool>,
    ) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller,
            block_owner_deletion: None,
        }
    }

    #[test]
    fn only_group_apps_and_kind_statefulset_name_a_statefulset() {
        for (api_version, kind, want) in [
            ("apps/v1", "StatefulSet", true),
            ("apps/v1beta2", "StatefulSet", true),
            ("apps.kruise.io/v1beta1", "StatefulSet", false),
            ("apps.kruise.io/v1alpha1", "StatefulSet", false),
            ("example.com/apps/v1", "StatefulSet", false),
            ("v1", "StatefulSet", false),
            ("apps", "StatefulSet", false),
            ("", "StatefulSet", false),
            ("apps/v1", "statefulset", false),
            ("apps/v1", "Deployment", false),
        ] {
            assert_eq!(
                is_statefulset(api_version, kind),
                want,
                "{api_version} {kind}"
            );
        }
        assert_eq!(group_of("apps/v1"), "apps");
        assert_eq!(group_of("v1"), "");
    }

    #[test]
    fn the_controller_counts_when_it_is_a_statefulset() {
        let sts = owner("apps/v1", "StatefulSet", "db", Some(true));
        let kruise = owner("apps.kruise.io/v1beta1", "StatefulSet", "db", Some(true));
        let not_controller = owner("apps/v1", "StatefulSet", "db", Some(false));
        let unset = owner("apps/v1", "StatefulSet", "db", None);
        let clone_set = owner("apps.kruise.io/v1alpha1", "CloneSet", "db", Some(true));
        assert_eq!(controller([&sts]), Some(&sts));
        assert_eq!(controller([&not_controller, &sts]), Some(&sts));
        assert_eq!(controller([&kruise]), None, "an Advanced StatefulSet");
        assert_eq!(controller([&not_controller, &unset]), None);
        assert_eq!(
            controller([&clone_set, &sts]),
            None,
            "another kind controls"
        );
        assert_eq!(controller(&Vec::new()), None);
        assert_eq!(controller([&sts]).map(|o| o.uid.as_str()), Some("uid-db"));
    }

    #[test]
    fn a_target_names_a_statefulset_only_in_group_apps() {
        let target = |api_version: &str, kind: &str| TargetReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "db".into(),
        };
        assert_eq!(target("apps/v1", "StatefulSet").statefulset(), Some("db"));
        assert_eq!(
            target("apps.kruise.io/v1beta1", "StatefulSet").statefulset(),
            None
        );
        assert_eq!(target("apps/v1", "Deployment").statefulset(), None);
    }

    #[test]
    fn either_workload_by_group() {
        for (api_version, kind, want) in [
            ("apps/v1", "StatefulSet", Some(Workload::Native)),
            (
                "apps.kruise.io/v1beta1",
                "StatefulSet",
                Some(Workload::Kruise),
            ),
            (
                "apps.kruise.io/v1alpha1",
                "StatefulSet",
                Some(Workload::Kruise),
            ),
            ("apps.kruise.io/v1alpha1", "CloneSet", None),
            ("kruise.io/v1beta1", "StatefulSet", None),
            ("apps.kruise.io", "StatefulSet", None),
            ("v1", "StatefulSet", None),
        ] {
            assert_eq!(workload(api_version, kind), want, "{api_version} {kind}");
        }
        let kruise = owner("apps.kruise.io/v1beta1", "StatefulSet", "db", Some(true));
        let other = owner("apps.kruise.io/v1beta1", "StatefulSet", "db", Some(false));
        assert_eq!(
            controller_workload([&other, &kruise]),
            Some((Workload::Kruise, &kruise))
        );
        assert_eq!(controller_workload([&other]), None);
        let target = TargetReference {
            api_version: "apps.kruise.io/v1beta1".into(),
            kind: "StatefulSet".into(),
            name: "db".into(),
        };
        assert!(target.targets(Workload::Kruise, "db"));
        assert!(!target.targets(Workload::Native, "db"));
    }
}
