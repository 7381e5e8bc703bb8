//! The ipkeep metrics a PromQL expression names, and what a scrape of `/metrics` serves: the two
//! sides of the check that alerting rules and dashboards query metrics that exist.

use std::collections::BTreeSet;

/// The `ipkeep_…` metric names in a PromQL expression (alerting rule or dashboard query), in
/// order, as written: with the suffix a counter or histogram sample carries (`_total`,
/// `_bucket`…). Quoted strings (label values, regexes) are skipped, and a name must start an
/// identifier (`foo_ipkeep_x` names no ipkeep metric).
pub fn metric_names(expr: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut chars = expr.char_indices().peekable();
    let mut previous = ' ';
    while let Some((i, c)) = chars.next() {
        if matches!(c, '"' | '\'' | '`') {
            let mut escaped = false;
            for (_, d) in chars.by_ref() {
                if escaped {
                    escaped = false;
                } else if d == '\\' && c != '`' {
                    escaped = true;
                } else if d == c {
                    break;
                }
            }
            previous = c;
            continue;
        }
        if ident(c) && !ident(previous) {
            let end = expr[i..]
                .find(|d: char| !ident(d))
                .map_or(expr.len(), |n| i + n);
            let word = &expr[i..end];
            if word.starts_with("ipkeep_") {
                names.push(word.to_string());
            }
            while chars.peek().is_some_and(|&(j, _)| j < end) {
                chars.next();
            }
            previous = word.chars().last().unwrap_or(c);
            continue;
        }
        previous = c;
    }
    names
}

/// The sample names a `/metrics` answer (Prometheus text or OpenMetrics) serves, from its
/// `# TYPE` lines (prometheus-client writes one only for a family with a series: a labelled
/// family appears after its first event). A counter `x` is queried as `x_total`, a histogram as
/// `x_bucket`, `x_sum` and `x_count`, a gauge as `x`.
pub fn served_names(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(family), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            // Prometheus text names a counter family with its _total already.
            "counter" if family.ends_with("_total") => &[""],
            "counter" => &["_total"],
            "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
            "summary" => &["", "_sum", "_count"],
            "info" => &["_info"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_an_expression_skip_strings_and_other_identifiers() {
        assert_eq!(
            metric_names(
                r#"sum by (le) (rate(ipkeep_a_bucket{x="ipkeep_not",y=~'ipkeep_\'no'}[5m])) / foo_ipkeep_b + ipkeep_c"#
            ),
            ["ipkeep_a_bucket", "ipkeep_c"]
        );
        assert_eq!(
            metric_names("max(ipkeep_controller_leader) < 1 or absent(ipkeep_controller_leader)"),
            ["ipkeep_controller_leader", "ipkeep_controller_leader"]
        );
    }

    #[test]
    fn served_names_follow_each_type() {
        let text = "# HELP ipkeep_x_reconciles Reconciles.\n# TYPE ipkeep_x_reconciles counter\n\
                    ipkeep_x_reconciles_total{controller=\"record\"} 1\n\
                    # TYPE ipkeep_x_duration_seconds histogram\n# TYPE ipkeep_x_leader gauge\n\
                    # TYPE ipkeep_y_requests_total counter\n# EOF\n";
        let served = served_names(text);
        let want = [
            "ipkeep_x_duration_seconds_bucket",
            "ipkeep_x_duration_seconds_count",
            "ipkeep_x_duration_seconds_sum",
            "ipkeep_x_leader",
            "ipkeep_x_reconciles_total",
            "ipkeep_y_requests_total",
        ];
        assert_eq!(served.iter().map(String::as_str).collect::<Vec<_>>(), want);
    }
}
