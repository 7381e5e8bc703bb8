//! What kube-apiserver's registry strategies do to built-in kinds on create and update:
//! defaulting, status reset, and the validation ipkeep's components could trip over.
//!
//! Only the fields ipkeep reads or writes are defaulted or validated; everything else is
//! stored as sent (see the crate docs for what is not implemented).

use serde_json::{Value, json};

use crate::registry::ResourceType;
use crate::selector::{LabelSelector, labels_of};

/// Defaults and status a new object gets from the server.
pub fn prepare_create(resource: &ResourceType, object: &mut Value) {
    match (resource.group.as_str(), resource.kind.as_str()) {
        ("", "Pod") => {
            let spec = &mut object["spec"];
            default(spec, "restartPolicy", json!("Always"));
            default(spec, "dnsPolicy", json!("ClusterFirst"));
            default(spec, "schedulerName", json!("default-scheduler"));
            default(spec, "terminationGracePeriodSeconds", json!(30));
            default(spec, "securityContext", json!({}));
            default(spec, "enableServiceLinks", json!(true));
            default(spec, "priority", json!(0));
            object["status"] = json!({"phase": "Pending", "qosClass": qos_class(&object["spec"])});
        }
        ("", "Namespace") => {
            default(&mut object["spec"], "finalizers", json!(["kubernetes"]));
            object["status"] = json!({"phase": "Active"});
            let name = crate::meta::name(object).to_owned();
            object["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        ("apps", "StatefulSet") => {
            let spec = &mut object["spec"];
            default(spec, "replicas", json!(1));
            default(spec, "podManagementPolicy", json!("OrderedReady"));
            default(spec, "revisionHistoryLimit", json!(10));
            default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            default(
                spec,
                "persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
            object["status"] = json!({"replicas": 0, "availableReplicas": 0});
        }
        ("", "Node") | ("", "Event") | ("coordination.k8s.io", _) => {}
        _ if resource.has_status() => {
            if let Some(map) = object.as_object_mut() {
                map.remove("status");
            }
        }
        _ => {}
    }
}

fn default(parent: &mut Value, key: &str, value: Value) {
    if !parent.is_object() {
        *parent = json!({});
    }
    if let Some(map) = parent.as_object_mut() {
        map.entry(key.to_owned()).or_insert(value);
    }
}

/// `status.qosClass` from the containers' resources, as the pod strategy computes it.
fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = spec["containers"]
        .as_array()
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let has = |c: &Value, what: &str| {
        c["resources"][what]
            .as_object()
            .is_some_and(|m| !m.is_empty())
    };
    if containers
        .iter()
        .all(|c| !has(c, "requests") && !has(c, "limits"))
    {
        "BestEffort"
    } else if containers.iter().all(|c| {
        has(c, "limits")
            && ["cpu", "memory"]
                .iter()
                .all(|r| !c["resources"]["limits"][*r].is_null())
            && (c["resources"]["requests"].is_null()
                || c["resources"]["requests"] == c["resources"]["limits"])
    }) {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Field problems kube-apiserver would reject the object for (the subset we enforce).
pub fn validate(
    resource: &ResourceType,
    object: &Value,
    old: Option<&Value>,
) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    match (resource.group.as_str(), resource.kind.as_str()) {
        ("", "Pod") => {
            match object["spec"]["containers"].as_array() {
                Some(containers) if !containers.is_empty() => {
                    for (i, c) in containers.iter().enumerate() {
                        for field in ["name", "image"] {
                            if c[field].as_str().is_none_or(str::is_empty) {
                                problems.push((
                                    format!("spec.containers[{i}].{field}"),
                                    "Required value".into(),
                                ));
                            }
                        }
                    }
                }
                _ => problems.push(("spec.containers".into(), "Required value".into())),
            }
            if let Some(old) = old {
                // Pod specs are immutable but for a few fields; ipkeep relies on the node pin.
                // `nodeName` is set only by `pods/binding`, never by an update (as in
                // kube-apiserver: found by tests/tests/cluster/conventions.rs).
                for field in ["nodeName", "affinity", "nodeSelector"] {
                    let was = &old["spec"][field];
                    let is = &object["spec"][field];
                    if was != is {
                        problems.push((
                            format!("spec.{field}"),
                            "Forbidden: pod updates may not change fields other than \
                             `spec.containers[*].image`, `spec.activeDeadlineSeconds`, \
                             `spec.tolerations` (only additions to existing tolerations), \
                             `spec.terminationGracePeriodSeconds`"
                                .into(),
                        ));
                    }
                }
            }
        }
        ("apps", "StatefulSet") => {
            let selector = &object["spec"]["selector"];
            match LabelSelector::from_json(selector) {
                _ if selector.is_null() => {
                    problems.push(("spec.selector".into(), "Required value".into()));
                }
                Ok(s) if s.is_empty() => problems.push((
                    "spec.selector".into(),
                    "Invalid value: {}: empty selector is invalid for statefulset".into(),
                )),
                Ok(s) => {
                    let labels = labels_of(&object["spec"]["template"]);
                    if !s.matches(&labels) {
                        problems.push((
                            "spec.template.metadata.labels".into(),
                            "Invalid value: selector does not match template labels".into(),
                        ));
                    }
                }
                Err(e) => problems.push(("spec.selector".into(), format!("Invalid value: {e}"))),
            }
            if object["spec"]["replicas"].as_i64().is_some_and(|r| r < 0) {
                problems.push((
                    "spec.replicas".into(),
                    "Invalid value: must be greater than or equal to 0".into(),
                ));
            }
            if let Some(old) = old {
                for field in [
                    "selector",
                    "serviceName",
                    "volumeClaimTemplates",
                    "podManagementPolicy",
                ] {
                    if old["spec"][field] != object["spec"][field] {
                        problems.push((
                            "spec".into(),
                            "Forbidden: updates to statefulset spec for fields other than \
                             'replicas', 'ordinals', 'template', 'updateStrategy', \
                             'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
                                .into(),
                        ));
                        break;
                    }
                }
            }
        }
        ("coordination.k8s.io", "Lease")
            if object["spec"]["leaseDurationSeconds"]
                .as_i64()
                .is_some_and(|d| d <= 0) =>
        {
            problems.push((
                "spec.leaseDurationSeconds".into(),
                "Invalid value: must be greater than 0".into(),
            ));
        }
        ("admissionregistration.k8s.io", _) => {
            for (i, hook) in object["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if hook["name"].as_str().is_none_or(|n| !n.contains('.')) {
                    problems.push((
                        format!("webhooks[{i}].name"),
                        "Invalid value: should be a domain with at least three segments separated by dots".into(),
                    ));
                }
                let config = &hook["clientConfig"];
                if config["url"].is_null() == config["service"].is_null() {
                    problems.push((
                        format!("webhooks[{i}].clientConfig"),
                        "Required value: exactly one of url or service is required".into(),
                    ));
                }
                if hook["sideEffects"].is_null() {
                    problems.push((
                        format!("webhooks[{i}].sideEffects"),
                        "Required value".into(),
                    ));
                }
                if hook["admissionReviewVersions"].is_null() {
                    problems.push((
                        format!("webhooks[{i}].admissionReviewVersions"),
                        "Required value".into(),
                    ));
                }
            }
        }
        _ => {}
    }
    problems
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn pods_get_defaults_and_a_pending_status() {
        let registry = Registry::new();
        let pods = registry.get("", "v1", "pods").unwrap();
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]},
                             "status": {"phase": "Running"}});
        prepare_create(pods, &mut pod);
        assert_eq!(pod["status"]["phase"], "Pending");
        assert_eq!(pod["status"]["qosClass"], "BestEffort");
        assert_eq!(pod["spec"]["schedulerName"], "default-scheduler");
        assert!(validate(pods, &pod, None).is_empty());
        let bad = json!({"spec": {"containers": [{"name": "c"}]}});
        assert_eq!(validate(pods, &bad, None)[0].0, "spec.containers[0].image");
        let mut moved = pod.clone();
        moved["spec"]["nodeName"] = json!("n1");
        assert!(
            !validate(pods, &moved, Some(&pod)).is_empty(),
            "only pods/binding sets nodeName, never an update"
        );
        let mut moved_again = moved.clone();
        moved_again["spec"]["nodeName"] = json!("n2");
        assert!(!validate(pods, &moved_again, Some(&moved)).is_empty());
    }

    #[test]
    fn statefulset_selector_must_match_template() {
        let registry = Registry::new();
        let sts = registry.get("apps", "v1", "statefulsets").unwrap();
        let good = json!({"spec": {"selector": {"matchLabels": {"app": "db"}},
                                   "template": {"metadata": {"labels": {"app": "db"}}}}});
        assert!(validate(sts, &good, None).is_empty());
        let mut bad = good.clone();
        bad["spec"]["template"]["metadata"]["labels"]["app"] = json!("web");
        assert_eq!(
            validate(sts, &bad, None)[0].0,
            "spec.template.metadata.labels"
        );
    }
}
