//! Readings of Kubernetes objects that the story and the benchmarks share: a pod's readiness,
//! the nodes, an agent's metrics.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// Whether the pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The names of the nodes that exist.
pub async fn node_names(client: &Client) -> anyhow::Result<Vec<String>> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// The sum of the samples of `metric` whose labels contain every `labels` pair, from a
/// Prometheus text exposition.
pub fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_matches_name_and_labels_exactly() {
        let text = "# HELP x\nipkeep_a_total{reason=\"del\",n=\"1\"} 2\nipkeep_a_total{reason=\"gc\"} 3\nipkeep_a_total_more 7\nipkeep_a_total 1\n";
        assert_eq!(metric_sum(text, "ipkeep_a_total", &[]), 6.0);
        assert_eq!(
            metric_sum(text, "ipkeep_a_total", &[("reason", "del")]),
            2.0
        );
        assert_eq!(metric_sum(text, "ipkeep_b", &[]), 0.0);
    }
}
