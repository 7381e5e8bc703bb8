//! Node affinity arithmetic for a pin: whether the pod's own constraints already exclude the
//! recorded topology, and writing the pin into a pod.
//!
//! Required node-selector terms are ORed and everything inside a term is ANDed, so ANDing the
//! pin C into the pod is appending C to every term: (T1∧C) ∨ … ∨ (Tn∧C) = (T1 ∨ … ∨ Tn) ∧ C.
//! An empty term matches nothing, and stays that way: C is not added to it, since that would
//! turn "nothing" into C.

use std::collections::BTreeMap;

use ipkeep_api::k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    PreferredSchedulingTerm,
};
use ipkeep_values::Retention;
use ipkeep_values::keys::{
    HOSTNAME_LABEL, IP_RETENTION, PERSISTENT_POD_STATE, PIN_SKIPPED, PINNED_BY,
};

use crate::pinned::{Managed, PinOutcome, Pinned, Requirement};

/// Why pinning `spec` to `pinned` would leave the pod no node by construction, if it would.
/// Only the required pin can conflict; preferences never make a pod unschedulable.
pub fn conflict(spec: &PodSpec, pinned: &Pinned) -> Option<String> {
    if pinned.required.is_empty() {
        return None;
    }
    // With the hostname pinned, the node is known too, so `metadata.name` fields can be judged.
    let node = pinned
        .required
        .iter()
        .any(|r| r.key == HOSTNAME_LABEL)
        .then_some(pinned.node.as_str());
    if let Some(bound) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && bound != pinned.node
    {
        return Some(format!(
            "spec.nodeName binds it to node {bound}, not its recorded node {}",
            pinned.node
        ));
    }
    for r in &pinned.required {
        if let Some(want) = spec.node_selector.as_ref().and_then(|s| s.get(&r.key))
            && *want != r.value
        {
            return Some(format!(
                "spec.nodeSelector requires {}={want}, the record says {r}",
                r.key
            ));
        }
    }
    let terms: Vec<&NodeSelectorTerm> = required_terms(spec)
        .iter()
        .filter(|t| !is_empty_term(t))
        .collect();
    let rejections: Vec<String> = terms
        .iter()
        .filter_map(|t| term_rejects(t, &pinned.required, node))
        .collect();
    if terms.is_empty() || rejections.len() < terms.len() {
        return None;
    }
    Some(format!(
        "every required node affinity term excludes the record ({})",
        rejections.join("; ")
    ))
}

fn required_terms(spec: &PodSpec) -> &[NodeSelectorTerm] {
    spec.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map_or(&[], |r| r.node_selector_terms.as_slice())
}

fn is_empty_term(t: &NodeSelectorTerm) -> bool {
    t.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && t.match_fields.as_ref().is_none_or(Vec::is_empty)
}

/// The first requirement of `term` the pinned values fail, described.
fn term_rejects(
    term: &NodeSelectorTerm,
    required: &[Requirement],
    node: Option<&str>,
) -> Option<String> {
    for e in term.match_expressions.iter().flatten() {
        if let Some(r) = required.iter().find(|r| r.key == e.key)
            && !satisfies(e, &r.value)
        {
            return Some(format!("{} {} {:?} vs {r}", e.key, e.operator, values(e)));
        }
    }
    for f in term.match_fields.iter().flatten() {
        if let Some(node) = node.filter(|_| f.key == "metadata.name")
            && !satisfies(f, node)
        {
            return Some(format!(
                "metadata.name {} {:?} vs node {node}",
                f.operator,
                values(f)
            ));
        }
    }
    None
}

fn values(e: &NodeSelectorRequirement) -> &[String] {
    e.values.as_deref().unwrap_or_default()
}

/// Whether a label (or field) with `value` satisfies `e`. Unknown operators are given the
/// benefit of the doubt: the API server refuses them anyway.
fn satisfies(e: &NodeSelectorRequirement, value: &str) -> bool {
    let vals = values(e);
    let number = |s: &str| s.parse::<i64>().ok();
    match e.operator.as_str() {
        "In" => vals.iter().any(|v| v == value),
        "NotIn" => !vals.iter().any(|v| v == value),
        "Exists" => true,
        "DoesNotExist" => false,
        "Gt" => {
            matches!((number(value), vals.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((number(value), vals.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => true,
    }
}

fn inject_required(term: &mut NodeSelectorTerm, required: &[Requirement]) {
    let exprs = term.match_expressions.get_or_insert_default();
    for r in required {
        let e = expression(r);
        if !exprs.contains(&e) {
            exprs.push(e);
        }
    }
}

fn expression(r: &Requirement) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: r.key.clone(),
        operator: "In".into(),
        values: Some(vec![r.value.clone()]),
    }
}

/// Writes `managed` into `pod`: the managing PersistentPodState's name, the retention
/// annotation (unless the pod sets a readable one of its own: an unreadable one is replaced, so
/// the CNI plugin gets the PersistentPodState's retention rather than the network default), and
/// the pin or the reason it was skipped.
/// Applying it twice changes nothing the second time, so the webhook is safe to reinvoke.
pub fn apply(managed: &Managed, pod: &mut Pod) {
    let annotations = pod.metadata.annotations.get_or_insert_default();
    stamp_retention(&managed.pps, managed.retention.as_deref(), annotations);
    match &managed.pin {
        PinOutcome::Unrecorded(_) => {}
        PinOutcome::Skipped(why) => {
            annotations.insert(PIN_SKIPPED.to_string(), why.to_string());
        }
        PinOutcome::Pinned(pinned) => {
            mark_pinned(&managed.pps, pod);
            inject(pod.spec.get_or_insert_default(), pinned);
        }
    }
}

/// Says on `pod` that PersistentPodState `pps` pinned it (the pin itself is written apart).
pub fn mark_pinned(pps: &str, pod: &mut Pod) {
    let annotations = pod.metadata.annotations.get_or_insert_default();
    annotations.insert(PINNED_BY.to_string(), pps.to_string());
    annotations.remove(PIN_SKIPPED);
}

/// Writes into a managed pod's `annotations` what decides how long the CNI plugin holds its
/// addresses: the name of the PersistentPodState `pps` that manages it, and `retention` (its
/// `spec.ipRetention`, when that reads) unless the pod sets a readable retention of its own.
/// The webhook stamps this on the pod at creation; the node agent applies the same rule at the
/// pod's ADD and DEL, so a pod the webhook never stamped is held just as long.
pub fn stamp_retention(
    pps: &str,
    retention: Option<&str>,
    annotations: &mut BTreeMap<String, String>,
) {
    annotations.insert(PERSISTENT_POD_STATE.to_string(), pps.to_string());
    if let Some(retention) = retention {
        let own_is_readable = annotations
            .get(IP_RETENTION)
            .is_some_and(|own| Retention::parse(IP_RETENTION, own).is_ok());
        if !own_is_readable {
            annotations.insert(IP_RETENTION.to_string(), retention.to_string());
        }
    }
}

fn inject(spec: &mut PodSpec, pinned: &Pinned) {
    let node_affinity = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    if !pinned.required.is_empty() {
        let selector = node_affinity
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(NodeSelector::default);
        if selector.node_selector_terms.is_empty() {
            selector
                .node_selector_terms
                .push(NodeSelectorTerm::default());
            inject_required(&mut selector.node_selector_terms[0], &pinned.required);
        } else {
            // Every term that matches something gets the pin; if none does, the pod was
            // unschedulable before we came, and stays so.
            for term in &mut selector.node_selector_terms {
                if !is_empty_term(term) {
                    inject_required(term, &pinned.required);
                }
            }
        }
    }
    let preferred = node_affinity
        .preferred_during_scheduling_ignored_during_execution
        .get_or_insert_default();
    for t in &pinned.preferred {
        let term = PreferredSchedulingTerm {
            weight: t.weight,
            preference: NodeSelectorTerm {
                match_expressions: Some(t.requirements.iter().map(expression).collect()),
                match_fields: None,
            },
        };
        if !preferred.contains(&term) {
            preferred.push(term);
        }
    }
    if preferred.is_empty() {
        node_affinity.preferred_during_scheduling_ignored_during_execution = None;
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;
    use crate::pinned::{Managed, PinOutcome, UnrecordedReason};

    fn stamped(own: Option<&str>) -> Option<String> {
        let mut pod = Pod::default();
        if let Some(own) = own {
            pod.metadata.annotations = Some(
                [(IP_RETENTION.to_string(), own.to_string())]
                    .into_iter()
                    .collect(),
            );
        }
        let managed = Managed {
            pps: "db".into(),
            pod: "db-0".into(),
            retention: Some("24h".into()),
            pin: PinOutcome::Unrecorded(UnrecordedReason::FirstCreation),
            lifecycle: Default::default(),
        };
        apply(&managed, &mut pod);
        pod.metadata.annotations?.get(IP_RETENTION).cloned()
    }

    #[test]
    fn a_pods_own_retention_is_kept_only_when_it_reads() {
        assert_eq!(stamped(None).as_deref(), Some("24h"));
        assert_eq!(stamped(Some("1h")).as_deref(), Some("1h"));
        assert_eq!(stamped(Some("soon")).as_deref(), Some("24h"));
        assert_eq!(stamped(Some("10000y")).as_deref(), Some("24h"));
    }
}
