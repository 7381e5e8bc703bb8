//! The PersistentPodState a StatefulSet asks for (auto-generation): by its own annotations, or
//! by its namespace's label ([`generated_spec`]), and what to do with the one of its name
//! ([`decide`]).
//!
//! The StatefulSet's annotation `ipkeep.dev/auto-generate-persistent-pod-state` (or OpenKruise's
//! spelling) decides when it is there: `"true"` turns generation on, any other value (`"false"`)
//! off. Without it, the namespace's label of the same key decides: `"true"` turns it on. In a
//! namespace so labelled, a StatefulSet whose annotations name no topology key is pinned by
//! [`keys::HOSTNAME_LABEL`] (its pods come back to the node they were recorded on); everything
//! else comes from its annotations, with the same defaults either way.
//!
//! Whose the PersistentPodState of the StatefulSet's name is decides what may be written:
//! - the StatefulSet's own (it is the controlling owner): applied to follow the annotations,
//!   deleted once generation is off;
//! - another's, or written by hand: never touched, and the StatefulSet gets a Warning, unless it
//!   is annotated `ipkeep.dev/adopt-persistent-pod-state: "true"` and the PersistentPodState
//!   targets it with no other controller ([`adoptable`]: orphaned by `--cascade=orphan`, or left
//!   by an earlier StatefulSet of the name), which it then takes over, records and all;
//! - generated for an earlier StatefulSet of the name ([`stale_generated`]): deleted (garbage
//!   collection would), then generated anew;
//! - one that does not decode: never applied over, whoever wrote it.
//!
//! A StatefulSet that only its namespace's label turned on stands aside for a PersistentPodState
//! someone wrote for it under any name ([`written_for`]): it gets none generated (a generated
//! one is deleted), and no Warning.

use std::collections::BTreeMap;

use ipkeep_api::statefulset::{self, Workload};
use ipkeep_api::{
    DEFAULT_IP_RETENTION, NodeLossAction, NodeLossPolicy, NodeTopologyTerm, PersistentPodState,
    PersistentPodStateSpec, PreferredTopologyTerm, RecordRetention, TargetReference,
};
use ipkeep_values::keys::{self, lookup};

use crate::label_syntax::split_keys;
use crate::spec::{self, SpecError};
use crate::view::adopts;

/// The weight of the preferred term generated from the preferred-topology annotation.
pub const GENERATED_PREFERRED_WEIGHT: i32 = 100;

/// What turned auto-generation on for a StatefulSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeneratedBy {
    /// Its own annotation, `"true"`.
    Annotation,
    /// Its namespace's label, `"true"`, with no annotation of its own.
    NamespaceLabel,
}

/// A PersistentPodState to generate, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The spec, checked.
    pub spec: PersistentPodStateSpec,
    /// What asked for it.
    pub by: GeneratedBy,
}

/// Annotations that turn auto-generation on but cannot produce a usable spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AutoGenerateError {
    /// Auto-generation is on but no topology annotation has a key.
    #[error(
        "{auto} is \"true\" but neither {required} nor {preferred} lists a node label key; add one (for example kubernetes.io/hostname)",
        auto = keys::AUTO_GENERATE, required = keys::REQUIRED_TOPOLOGY, preferred = keys::PREFERRED_TOPOLOGY
    )]
    NoTopology,
    /// The resulting spec is invalid (a bad key or retention value).
    #[error(
        "{key} is {0:?}; use FallbackToPreferred or Wait",
        key = keys::NODE_LOSS_ACTION
    )]
    NodeLossAction(String),
    /// The lifecycle annotation does not read as `spec.lifecycle`.
    #[error("{key} cannot be read as spec.lifecycle: {0}", key = keys::LIFECYCLE)]
    Lifecycle(String),
    #[error("the annotations give an invalid PersistentPodState: {0}")]
    Invalid(#[from] SpecError),
}

/// What StatefulSet `name` with `annotations`, in a namespace with `namespace_labels`, asks for:
/// `Ok(None)` when auto-generation is off for it.
pub fn generated_spec(
    name: &str,
    annotations: Option<&BTreeMap<String, String>>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<Option<Generated>, AutoGenerateError> {
    generated_spec_for(Workload::Native, name, annotations, namespace_labels)
}

/// [`generated_spec`] for a StatefulSet of `workload`: the same annotations ask for the same
/// spec, targeting that workload.
pub fn generated_spec_for(
    workload: Workload,
    name: &str,
    annotations: Option<&BTreeMap<String, String>>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<Option<Generated>, AutoGenerateError> {
    let namespace_on = namespace_labels
        .and_then(|l| l.get(keys::AUTO_GENERATE))
        .is_some_and(|v| v.trim() == "true");
    let by = match lookup(
        annotations,
        keys::AUTO_GENERATE,
        Some(keys::KRUISE_AUTO_GENERATE),
    ) {
        Some(v) if v.trim() == "true" => GeneratedBy::Annotation,
        Some(_) => return Ok(None),
        None if namespace_on => GeneratedBy::NamespaceLabel,
        None => return Ok(None),
    };
    let mut required = lookup(
        annotations,
        keys::REQUIRED_TOPOLOGY,
        Some(keys::KRUISE_REQUIRED_TOPOLOGY),
    )
    .map(split_keys)
    .unwrap_or_default();
    let preferred = lookup(
        annotations,
        keys::PREFERRED_TOPOLOGY,
        Some(keys::KRUISE_PREFERRED_TOPOLOGY),
    )
    .map(split_keys)
    .unwrap_or_default();
    if required.is_empty() && preferred.is_empty() {
        if !namespace_on {
            return Err(AutoGenerateError::NoTopology);
        }
        required = vec![keys::HOSTNAME_LABEL.to_string()];
    }
    let spec = PersistentPodStateSpec {
        target_ref: TargetReference {
            api_version: match workload {
                Workload::Native => "apps/v1".into(),
                Workload::Kruise => format!(
                    "{}/{}",
                    ipkeep_api::kruise::GROUP,
                    ipkeep_api::kruise::VERSION
                ),
            },
            kind: statefulset::KIND.into(),
            name: name.to_string(),
        },
        persistent_pod_annotations: Vec::new(),
        required_persistent_topology: (!required.is_empty()).then_some(NodeTopologyTerm {
            node_topology_keys: required,
        }),
        preferred_persistent_topology: if preferred.is_empty() {
            Vec::new()
        } else {
            vec![PreferredTopologyTerm {
                weight: GENERATED_PREFERRED_WEIGHT,
                preference: NodeTopologyTerm {
                    node_topology_keys: preferred,
                },
            }]
        },
        persistent_pod_state_retention_policy: RecordRetention::default(),
        node_loss_policy: node_loss_policy(annotations)?,
        ip_retention: lookup(annotations, keys::IP_RETENTION, None)
            .map_or(DEFAULT_IP_RETENTION, str::trim)
            .to_string(),
        lifecycle: lookup(annotations, keys::LIFECYCLE, None)
            .map(crate::lifecycle::parse_annotation)
            .transpose()
            .map_err(AutoGenerateError::Lifecycle)?,
    };
    spec::check(&spec)?;
    Ok(Some(Generated { spec, by }))
}

/// `spec.nodeLossPolicy` from the node-loss annotations; each one absent takes its default.
fn node_loss_policy(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<NodeLossPolicy, AutoGenerateError> {
    let mut policy = NodeLossPolicy::default();
    if let Some(action) = lookup(annotations, keys::NODE_LOSS_ACTION, None).map(str::trim) {
        policy.action = match action {
            "FallbackToPreferred" => NodeLossAction::FallbackToPreferred,
            "Wait" => NodeLossAction::Wait,
            other => return Err(AutoGenerateError::NodeLossAction(other.to_string())),
        };
    }
    if let Some(after) = lookup(annotations, keys::NODE_LOSS_AFTER, None) {
        policy.after = after.trim().to_string();
    }
    Ok(policy)
}

/// What the generate loop gathers about one StatefulSet to [`decide`].
#[derive(Debug, Clone, Copy)]
pub struct GenerateInput<'a> {
    /// Which StatefulSet it is.
    pub workload: Workload,
    /// The StatefulSet's name (and the generated PersistentPodState's).
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its UID.
    pub uid: &'a str,
    /// Its annotations.
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// Whether it is being deleted.
    pub deleting: bool,
    /// Its namespace's labels, if the namespace is known.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The PersistentPodState of its name.
    pub existing: Existing<'a>,
    /// The namespace's PersistentPodStates that target it, under any name.
    pub targeting: &'a [&'a PersistentPodState],
}

/// The PersistentPodState of the StatefulSet's name, as the cache has it.
#[derive(Debug, Clone, Copy)]
pub enum Existing<'a> {
    /// There is none.
    Absent,
    /// There is one, and it does not decode: whose it is cannot be read.
    Undecodable,
    /// This one.
    Decoded(&'a PersistentPodState),
}

/// What to do with the PersistentPodState of a StatefulSet's name.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateAction {
    /// Apply `spec` as the PersistentPodState of the name, controlled by the StatefulSet.
    Apply {
        /// The spec.
        spec: Box<PersistentPodStateSpec>,
        /// Whether it carries the adoption annotation (the StatefulSet's travels to it, where
        /// it keeps the records through the StatefulSet's deletion for the next one of the name).
        adopt_marker: bool,
        /// Created, updated or adopted.
        verb: Verb,
        /// What asked for it.
        by: GeneratedBy,
    },
    /// Delete the PersistentPodState this StatefulSet generated (with its UID as a precondition).
    DeleteOwned {
        /// Its UID.
        uid: Option<String>,
        /// Why.
        why: Unwanted,
    },
    /// Delete the PersistentPodState an earlier StatefulSet of the name generated (garbage
    /// collection would; this is quicker), then decide again.
    DeleteStale {
        /// Its UID.
        uid: Option<String>,
    },
    /// Write nothing, and tell the StatefulSet why in a Warning.
    Refuse(Refusal),
    /// Write nothing: the PersistentPodState of the name is not this StatefulSet's business.
    StandAside(Aside),
    /// The PersistentPodState is as generated.
    Unchanged,
}

/// How an applied PersistentPodState came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// There was none.
    Created,
    /// This StatefulSet's own, with another spec or adoption annotation.
    Updated,
    /// Left by an earlier StatefulSet of the name, or orphaned; taken over.
    Adopted,
}

/// Why a PersistentPodState this StatefulSet generated goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unwanted {
    /// Auto-generation is off.
    Off,
    /// Only the namespace's label asked, and this PersistentPodState (its name) was written for
    /// the StatefulSet.
    WrittenFor(String),
}

/// Why nothing is written, with a Warning.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The annotations ask for generation but give no usable spec.
    Invalid(AutoGenerateError),
    /// The PersistentPodState of the name is someone else's.
    NotOwned(GeneratedBy),
}

/// Why nothing is written, quietly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Aside {
    /// The StatefulSet is being deleted (garbage collection removes its PersistentPodState).
    Deleting,
    /// The PersistentPodState of the name does not decode (its own Warning says why; fixed, it
    /// is decided again).
    Undecodable,
    /// Auto-generation is off, and the PersistentPodState of the name (if any) is not its own.
    Off,
    /// Only the namespace's label asked, and this PersistentPodState (its name) was written for
    /// the StatefulSet.
    WrittenFor(String),
}

/// An Event to publish on the StatefulSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// A Warning, else Normal.
    pub warning: bool,
    /// The Event's reason.
    pub reason: &'static str,
    /// What it says.
    pub note: String,
}

/// What to do with the PersistentPodState of `input`'s StatefulSet's name. Pure: same input,
/// same answer.
pub fn decide(input: &GenerateInput) -> GenerateAction {
    let name = input.name;
    let existing = match input.existing {
        _ if input.deleting => return GenerateAction::StandAside(Aside::Deleting),
        Existing::Undecodable => return GenerateAction::StandAside(Aside::Undecodable),
        Existing::Decoded(pps) => Some(pps),
        Existing::Absent => None,
    };
    let owned = existing.is_some_and(|p| controller_uid(p) == Some(input.uid));
    let uid = || existing.and_then(|p| p.metadata.uid.clone());
    let Generated { spec, by } = match generated_spec_for(
        input.workload,
        name,
        input.annotations,
        input.namespace_labels,
    ) {
        Ok(Some(generated)) => generated,
        Ok(None) if owned => {
            return GenerateAction::DeleteOwned {
                uid: uid(),
                why: Unwanted::Off,
            };
        }
        Ok(None) => return GenerateAction::StandAside(Aside::Off),
        Err(e) => return GenerateAction::Refuse(Refusal::Invalid(e)),
    };
    let adopt_marker = adopts(input.annotations);
    let adopting =
        !owned && adopt_marker && existing.is_some_and(|p| adoptable(p, input.workload, name));
    if by == GeneratedBy::NamespaceLabel && !adopting {
        let theirs = input
            .targeting
            .iter()
            .filter(|p| written_for(p, input.workload, name))
            .filter_map(|p| p.metadata.name.clone())
            .min();
        if let Some(theirs) = theirs {
            return if owned {
                GenerateAction::DeleteOwned {
                    uid: uid(),
                    why: Unwanted::WrittenFor(theirs),
                }
            } else {
                GenerateAction::StandAside(Aside::WrittenFor(theirs))
            };
        }
    }
    let apply = |verb| GenerateAction::Apply {
        spec: Box::new(spec.clone()),
        adopt_marker,
        verb,
        by,
    };
    match existing {
        None => apply(Verb::Created),
        Some(_) if adopting => apply(Verb::Adopted),
        Some(p) if !owned && stale_generated(p, input.workload, name) => {
            GenerateAction::DeleteStale { uid: uid() }
        }
        Some(_) if !owned => GenerateAction::Refuse(Refusal::NotOwned(by)),
        Some(p) if p.spec == spec && adopts(p.metadata.annotations.as_ref()) == adopt_marker => {
            GenerateAction::Unchanged
        }
        Some(_) => apply(Verb::Updated),
    }
}

impl GenerateAction {
    /// The Event this action publishes on the StatefulSet of `input`, once done.
    pub fn notice(&self, input: &GenerateInput) -> Option<Notice> {
        let (name, namespace) = (input.name, input.namespace);
        let (warning, reason, note) = match self {
            GenerateAction::Apply { verb, by, .. } => {
                let (reason, verb) = match verb {
                    Verb::Created => ("PersistentPodStateCreated", "created"),
                    Verb::Updated => ("PersistentPodStateUpdated", "updated"),
                    Verb::Adopted => ("PersistentPodStateAdopted", "adopted"),
                };
                let note = match by {
                    GeneratedBy::Annotation if by_kruise_spelling(input.annotations) => format!(
                        "{verb} PersistentPodState {name} from the annotations, read from OpenKruise's spelling {} (ipkeep reads {} first): if OpenKruise's own PersistentPodState also runs for this workload, both pin its pods; keep one of the two",
                        keys::KRUISE_AUTO_GENERATE,
                        keys::AUTO_GENERATE
                    ),
                    GeneratedBy::Annotation => {
                        format!("{verb} PersistentPodState {name} from the annotations")
                    }
                    GeneratedBy::NamespaceLabel => format!(
                        "{verb} PersistentPodState {name}: namespace {namespace} is labelled {}=true",
                        keys::AUTO_GENERATE
                    ),
                };
                (false, reason, note)
            }
            GenerateAction::DeleteOwned { why, .. } => {
                let note = match why {
                    Unwanted::Off => format!(
                        "auto-generation is off; deleted the generated PersistentPodState {name}"
                    ),
                    Unwanted::WrittenFor(theirs) => format!(
                        "PersistentPodState {theirs} was written for this StatefulSet and manages it; deleted the one generated for the namespace's label, {name}"
                    ),
                };
                (false, "PersistentPodStateDeleted", note)
            }
            GenerateAction::Refuse(Refusal::Invalid(e)) => (
                true,
                "InvalidPersistentPodStateAnnotations",
                format!("{e}; the existing PersistentPodState (if any) is left as it is"),
            ),
            GenerateAction::Refuse(Refusal::NotOwned(by)) => {
                let opt_out = match by {
                    GeneratedBy::Annotation => "remove the auto-generate annotation".to_string(),
                    GeneratedBy::NamespaceLabel => {
                        format!("annotate the StatefulSet {}=\"false\"", keys::AUTO_GENERATE)
                    }
                };
                let note = format!(
                    "PersistentPodState {name} exists and is not owned by this StatefulSet; it is not overwritten. To take it over with its records and held IPs, annotate the StatefulSet {}=\"true\" (it must target this StatefulSet and have no other owner); to start afresh, delete it; or {opt_out}",
                    keys::ADOPT_PERSISTENT_POD_STATE
                );
                (true, "PersistentPodStateNotOwned", note)
            }
            GenerateAction::DeleteStale { .. }
            | GenerateAction::StandAside(_)
            | GenerateAction::Unchanged => return None,
        };
        Some(Notice {
            warning,
            reason,
            note,
        })
    }
}

/// Whether only OpenKruise's spelling of the auto-generate annotation is set.
fn by_kruise_spelling(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| {
        !a.contains_key(keys::AUTO_GENERATE) && a.contains_key(keys::KRUISE_AUTO_GENERATE)
    })
}

/// The UID of `pps`'s controlling owner.
fn controller_uid(pps: &PersistentPodState) -> Option<&str> {
    pps.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Whether a `workload` StatefulSet named `name` that asks to adopt may take `pps` over: it
/// targets that StatefulSet, and no controller owns it but (if any) an earlier StatefulSet of
/// that workload and name (names are unique, so one with another UID was deleted).
pub fn adoptable(pps: &PersistentPodState, workload: Workload, name: &str) -> bool {
    let controller = pps
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    pps.spec.target_ref.targets(workload, name)
        && controller.is_none_or(|o| {
            statefulset::workload(&o.api_version, &o.kind) == Some(workload) && o.name == name
        })
}

/// Whether `pps` was written for the `workload` StatefulSet `name` rather than generated: it
/// targets it and no StatefulSet of that workload controls it (a generated one, even one left
/// by an earlier StatefulSet of the name, is controlled by the StatefulSet it was generated
/// for).
pub fn written_for(pps: &PersistentPodState, workload: Workload, name: &str) -> bool {
    pps.spec.target_ref.targets(workload, name)
        && statefulset::controller_workload(pps.metadata.owner_references.iter().flatten())
            .is_none_or(|(w, _)| w != workload)
}

/// Whether `pps` is controlled by a `workload` StatefulSet named `name`: for one that does not
/// own it, a PersistentPodState left over from an earlier StatefulSet of the name.
pub fn stale_generated(pps: &PersistentPodState, workload: Workload, name: &str) -> bool {
    statefulset::controller_workload(pps.metadata.owner_references.iter().flatten())
        .is_some_and(|(w, o)| w == workload && o.name == name)
}

#[cfg(test)]
#[path = "autogen_tests.rs"]
mod tests;
