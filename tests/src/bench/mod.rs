//! The statistics and the report every benchmark shares: percentiles by one definition, the
//! ratio to a baseline, and markdown tables (docs/benchmarks.md holds what they print). The
//! `cargo bench` targets in `tests/benches/` call it directly; the bench scripts
//! (`scripts/bench-*.sh`) pipe their samples into `ipkeep-bench-report`, which calls it too.

pub mod report;

use std::fmt;

/// Percentiles and extremes of a set of samples, in the samples' unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// How many samples.
    pub n: usize,
    /// The 50th percentile.
    pub median: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
    /// The arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// The summary of `samples`; `None` if there are none (or one is NaN).
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Self {
            n: sorted.len(),
            median: percentile(&sorted, 0.5),
            p90: percentile(&sorted, 0.9),
            p99: percentile(&sorted, 0.99),
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        })
    }

    /// The summary of durations, in milliseconds.
    pub fn of_ms(samples: &[std::time::Duration]) -> Option<Self> {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        Self::of(&ms)
    }

    /// A field by name (`n`, `median`, `p50`, `p90`, `p99`, `min`, `max`, `mean`).
    pub fn field(&self, name: &str) -> Option<f64> {
        Some(match name {
            "n" => self.n as f64,
            "median" | "p50" => self.median,
            "p90" => self.p90,
            "p99" => self.p99,
            "min" => self.min,
            "max" => self.max,
            "mean" => self.mean,
            _ => return None,
        })
    }

    /// The fields `names` (see [`Summary::field`]) with `decimals` decimals, as table cells
    /// (`-` for a name that is no field).
    pub fn cells(&self, names: &[&str], decimals: usize) -> Vec<String> {
        names
            .iter()
            .map(|name| {
                self.field(name)
                    .map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
            })
            .collect()
    }
}

/// The nearest-rank percentile `p` (0 < p ≤ 1) of `sorted` (ascending, not empty): the smallest
/// sample with at least `p` of the samples at or below it.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `value / baseline` as `1.23x`, or `-` without a usable baseline.
pub fn ratio(value: f64, baseline: Option<f64>) -> String {
    match baseline {
        Some(b) if b > 0.0 && b.is_finite() && value.is_finite() => format!("{:.2}x", value / b),
        _ => "-".into(),
    }
}

/// Quantiles of a Prometheus histogram between two scrapes (`before`, `after`: text
/// expositions) for the buckets of `metric` whose labels include every `labels` pair: the count
/// of observations in between and, for each of `quantiles`, the upper bound of the first bucket
/// that holds that share of them (NaN without observations).
pub fn histogram_quantiles(
    before: &str,
    after: &str,
    metric: &str,
    labels: &[(&str, &str)],
    quantiles: &[f64],
) -> (u64, Vec<f64>) {
    let read = |text: &str| -> Vec<(f64, f64)> {
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        let prefix = format!("{metric}_bucket{{");
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&prefix) else {
                continue;
            };
            let Some((inside, value)) = rest.split_once("} ") else {
                continue;
            };
            if !labels
                .iter()
                .all(|(k, v)| inside.contains(&format!("{k}=\"{v}\"")))
            {
                continue;
            }
            let Some(le) = inside
                .split(',')
                .find_map(|l| l.strip_prefix("le=\""))
                .and_then(|l| l.strip_suffix('"'))
            else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::NAN)
            };
            let count: f64 = value.trim().parse().unwrap_or(0.0);
            match buckets.iter_mut().find(|(l, _)| *l == le) {
                Some((_, c)) => *c += count,
                None => buckets.push((le, count)),
            }
        }
        buckets
    };
    let (a, b) = (read(before), read(after));
    let mut delta: Vec<(f64, f64)> = b
        .iter()
        .map(|(le, c)| {
            let was = a.iter().find(|(l, _)| l == le).map_or(0.0, |(_, c)| *c);
            (*le, c - was)
        })
        .collect();
    delta.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = delta.last().map_or(0.0, |d| d.1);
    let values = quantiles
        .iter()
        .map(|q| {
            if total <= 0.0 {
                return f64::NAN;
            }
            delta
                .iter()
                .find(|(_, c)| *c >= q * total)
                .map_or(f64::NAN, |(le, _)| *le)
        })
        .collect();
    (total as u64, values)
}

/// The sum of a Prometheus histogram's observations between two scrapes (`before`, `after`),
/// over the series of `metric` whose labels include every `labels` pair: its `_sum` after minus
/// before (0 without such a series). With the count of [`histogram_quantiles`], the mean, which
/// says more than the bounds of coarse buckets.
pub fn histogram_sum(before: &str, after: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let read = |text: &str| -> f64 {
        let name = format!("{metric}_sum");
        text.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(&name)?;
                let (inside, value) = match rest.strip_prefix('{') {
                    Some(r) => r.split_once("} ")?,
                    None => ("", rest.strip_prefix(' ')?),
                };
                labels
                    .iter()
                    .all(|(k, v)| inside.contains(&format!("{k}=\"{v}\"")))
                    .then(|| value.trim().parse::<f64>().ok())
                    .flatten()
            })
            .sum()
    };
    read(after) - read(before)
}

/// A markdown table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    numeric: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns; a column whose name starts with `>` is right-aligned (a
    /// number), the `>` not shown.
    pub fn new(columns: &[&str]) -> Self {
        Self {
            header: columns
                .iter()
                .map(|c| c.trim_start_matches('>').to_string())
                .collect(),
            numeric: columns.iter().map(|c| c.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per column).
    pub fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows
            .push(cells.into_iter().map(|c| c.to_string()).collect());
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| {} |", self.header.join(" | "))?;
        let rule: Vec<&str> = self
            .numeric
            .iter()
            .map(|n| if *n { "---:" } else { "---" })
            .collect();
        writeln!(f, "|{}|", rule.join("|"))?;
        for row in &self.rows {
            writeln!(f, "| {} |", row.join(" | "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s = Summary::of(&(1..=100).map(f64::from).collect::<Vec<_>>()).unwrap();
        assert_eq!(
            (s.median, s.p90, s.p99, s.min, s.max),
            (50.0, 90.0, 99.0, 1.0, 100.0)
        );
        assert_eq!(s.mean, 50.5);
        let one = Summary::of(&[7.0]).unwrap();
        assert_eq!((one.median, one.p99), (7.0, 7.0));
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]).unwrap().median, 2.0);
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
        assert_eq!(s.cells(&["n", "p90", "nope"], 1), ["100.0", "90.0", "-"]);
    }

    #[test]
    fn ratios_need_a_positive_baseline() {
        assert_eq!(ratio(3.0, Some(2.0)), "1.50x");
        assert_eq!(ratio(3.0, Some(0.0)), "-");
        assert_eq!(ratio(3.0, None), "-");
    }

    #[test]
    fn histogram_quantiles_between_two_scrapes() {
        let before = "m_bucket{result=\"scheduled\",le=\"0.01\"} 5\nm_bucket{result=\"scheduled\",le=\"0.1\"} 5\nm_bucket{result=\"scheduled\",le=\"+Inf\"} 5\n";
        let after = "# HELP m x\nm_bucket{result=\"scheduled\",le=\"0.01\"} 55\nm_bucket{result=\"scheduled\",le=\"0.1\"} 104\nm_bucket{result=\"scheduled\",le=\"+Inf\"} 105\nm_bucket{result=\"error\",le=\"+Inf\"} 9\n";
        let (n, q) = histogram_quantiles(
            before,
            after,
            "m",
            &[("result", "scheduled")],
            &[0.5, 0.99, 1.0],
        );
        assert_eq!(n, 100);
        assert_eq!(q, vec![0.01, 0.1, f64::INFINITY]);
        let (n, q) = histogram_quantiles("", "", "m", &[], &[0.5]);
        assert_eq!(n, 0);
        assert!(q[0].is_nan());
    }

    #[test]
    fn histogram_sum_between_two_scrapes() {
        let before = "m_sum{name=\"a\",type=\"admit\"} 1.5\nm_sum{name=\"b\",type=\"admit\"} 7\nm_summary_sum 9\n";
        let after = "m_sum{name=\"a\",type=\"admit\"} 4\nm_sum{name=\"b\",type=\"admit\"} 8\nm_summary_sum 99\nm_count{name=\"a\"} 3\n";
        assert_eq!(histogram_sum(before, after, "m", &[("name", "a")]), 2.5);
        assert_eq!(histogram_sum(before, after, "m", &[("type", "admit")]), 3.5);
        assert_eq!(histogram_sum("", "m_sum 2\n", "m", &[]), 2.0);
        assert_eq!(histogram_sum(before, after, "x", &[]), 0.0);
    }

    #[test]
    fn markdown_table() {
        let mut t = Table::new(&["mode", ">ms"]);
        t.row(["none", "1.0"]);
        assert_eq!(t.to_string(), "| mode | ms |\n|---|---:|\n| none | 1.0 |\n");
    }
}
