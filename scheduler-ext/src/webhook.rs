//! The mutating admission webhook (`/mutate-pods`, `admission.k8s.io/v1` AdmissionReview): on a
//! pod CREATE, applies the pin decision as a JSONPatch. Everything that is not a StatefulSet pod
//! with a PersistentPodState is allowed unchanged. Of the pod, only the fields a decision reads
//! are parsed ([`crate::pod`]), and the patch is the diff of those.
//!
//! Requests are not authenticated, so nothing here acts on what a request claims beyond
//! answering it: a skipped pin is said in the pod's annotation and an admission warning, and the
//! controller, which sees the pods that really exist, turns the annotation into an Event.
//!
//! Every pod CREATE reviewed also gets an admission warning for a retention annotation that does
//! not parse (in the one grammar, `ipkeep_values::Retention`): the pod is admitted, and the CNI
//! plugin falls back to the network's retention for it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ipkeep_placement::pin::{self, Decision, PinOutcome};
use ipkeep_placement::{affinity, lifecycle};
use ipkeep_values::Retention;
use ipkeep_values::keys::{IP_RETENTION, KRUISE_RESERVED_IP, PERSISTENT_POD_STATE};
use k8s_openapi::api::core::v1::Pod;

use crate::cache::Caches;
use crate::error::RequestError;
use crate::pod;
use crate::review::{Outcome, Reviewed, annotation, read_request};

/// Reviews one AdmissionReview body.
pub fn review(body: &[u8], caches: &Caches) -> Result<Reviewed, RequestError> {
    let request = read_request(body)?;
    let mut out = Reviewed::passed(request.uid.clone());
    let is_pod_create = request.operation == "CREATE"
        && request.resource.group.is_empty()
        && request.resource.resource == "pods"
        && request
            .sub_resource
            .as_deref()
            .unwrap_or_default()
            .is_empty();
    let Some(object) = request.object.filter(|_| is_pod_create) else {
        return Ok(out);
    };
    let pod = match pod::read(object.get()) {
        Ok(pod) => pod,
        Err(e) => {
            out.outcome = Outcome::Invalid;
            out.review.response.warnings.push(format!(
                "ipkeep: pod not pinned: its object cannot be read: {e}"
            ));
            return Ok(out);
        }
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_default();
    let name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_default();
    out.pod = Some((namespace.clone(), name));
    let Some((workload, statefulset)) = pin::statefulset_of(&pod) else {
        out.review.response.warnings = retention_warnings(&pod, &pod);
        return Ok(out);
    };
    if !caches.ready() {
        return Err(RequestError::NotReady);
    }
    let pps = caches.pps_for(&namespace, workload, &statefulset);
    let Decision::Manage(managed) = pin::decide(&pod, &namespace, pps.as_deref()) else {
        out.review.response.warnings = retention_warnings(&pod, &pod);
        if pps.is_none() && caches.undecodable(&namespace, &statefulset) {
            out.review.response.warnings.push(format!(
                "ipkeep: pod not pinned: PersistentPodState {statefulset} cannot be decoded (see its Warning Events)"
            ));
        }
        return Ok(out);
    };
    let mut after = pod.clone();
    affinity::apply(&managed, &mut after);
    // The hooks of a spec that does not check are not applied (the pod fails open); the
    // controller reports the spec on the PersistentPodState.
    lifecycle::apply_at_create(&managed.lifecycle, &mut after);
    let patch = json_patch::diff(&to_json(&pod), &to_json(&after));
    if !patch.0.is_empty() {
        let bytes = serde_json::to_vec(&patch).map_err(|e| RequestError::Body(e.to_string()))?;
        out.review.response.patch_type = Some("JSONPatch");
        out.review.response.patch = Some(BASE64.encode(bytes));
    }
    let response = &mut out.review.response;
    match &managed.pin {
        PinOutcome::Pinned(p) => {
            out.outcome = Outcome::Pinned;
            let how = if p.required.is_empty() {
                "preferred"
            } else {
                "required"
            };
            response.audit_annotations.insert(
                "pin".into(),
                format!("{how} pin to node {} by {}", p.node, managed.pps),
            );
        }
        PinOutcome::Unrecorded(_) => out.outcome = Outcome::Unrecorded,
        PinOutcome::Skipped(why) => {
            out.outcome = Outcome::Skipped;
            response
                .warnings
                .push(format!("ipkeep: pod {} {why}", managed.pod));
            if !request.dry_run.unwrap_or(false) {
                out.skipped = Some(why.label());
            }
        }
    }
    // What the pod came with, and what it is created with (the retention stamped included).
    response.warnings.extend(retention_warnings(&pod, &after));
    Ok(out)
}

/// A warning for each retention annotation of `before` (the pod as submitted) that does not
/// parse, saying what happens instead in `after` (the pod as created): the webhook stamped its
/// PersistentPodState's retention over it, or the CNI plugin ignores it (it reads
/// `ipkeep.dev/ip-retention` first, OpenKruise's minutes only without it).
pub fn retention_warnings(before: &Pod, after: &Pod) -> Vec<String> {
    let ignored = "the ipkeep CNI plugin ignores it and holds this pod's IPs for the network's retention (ipam.retention) instead";
    let mut warnings = Vec::new();
    let own = annotation(before, IP_RETENTION);
    if let Some(Err(e)) = own.map(|v| Retention::parse(&format!("annotation {IP_RETENTION}"), v)) {
        let instead = match annotation(after, IP_RETENTION) {
            Some(stamped) if Some(stamped) != own => format!(
                "replaced by the retention of its PersistentPodState ({}), {stamped:?}",
                annotation(after, PERSISTENT_POD_STATE).unwrap_or_default()
            ),
            _ => ignored.to_string(),
        };
        warnings.push(format!("ipkeep: {e}; {instead}"));
    }
    if let Some(Err(e)) = annotation(before, KRUISE_RESERVED_IP)
        .map(|v| Retention::parse_kruise_minutes(&format!("annotation {KRUISE_RESERVED_IP}"), v))
    {
        let instead = if annotation(after, IP_RETENTION).is_some() {
            format!("it is not used anyway: {IP_RETENTION} takes precedence")
        } else {
            ignored.to_string()
        };
        warnings.push(format!("ipkeep: {e}; {instead}"));
    }
    warnings
}

fn to_json(pod: &Pod) -> serde_json::Value {
    // A Pod always serializes.
    serde_json::to_value(pod).unwrap_or_default()
}
