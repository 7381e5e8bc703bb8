//! What `ipkeep-bench-report` does: the bench scripts measure (clusters, kubectl, curl) and pipe
//! what they measured into it; it does the statistics and prints the tables, with the same
//! definitions as the `cargo bench` targets.

use std::io::Read;

use super::{Summary, Table, histogram_quantiles, histogram_sum, ratio};

/// Usage, printed by `--help` and on a wrong command line.
pub const USAGE: &str = "\
ipkeep-bench-report: statistics and tables for scripts/bench-*.sh (docs/benchmarks.md)

  ipkeep-bench-report summary [--fields median,p90,p99]
      stdin: one sample per line. Prints n, median, p90, p99, min, max and mean (nearest-rank
      percentiles), or only the named fields, space-separated.
  ipkeep-bench-report histogram METRIC BEFORE AFTER [--label K=V]... [--quantiles 0.5,0.99] [--scale S] [--mean]
      Two scrapes of a Prometheus /metrics (files): the observations of METRIC in between and
      its quantiles (bucket upper bounds, times S); --mean adds their mean (from _sum, times S;
      - without observations). Prints: count q... [mean]
  ipkeep-bench-report cluster PODS NODES
      stdin: one line per mode: MODE CREATE-MS REBUILD-MS P50-CREATE P99-CREATE P50-REBUILD
      P99-REBUILD [ADMIT-CREATE ADMIT-REBUILD IPKEEP-CREATE IPKEEP-REBUILD]
      (scripts/bench-cluster.sh; the last four are cells without spaces, `/` between values).
      Prints the table, each mode against `none`.
  ipkeep-bench-report controller STATEFULSETS REPLICAS NODES
      stdin: one line per mode: MODE READY-MS LAG-S RSS0-MIB RSS1-MIB WRITES (scripts/bench-controller.sh;
      `-` where a mode has no value). Prints the table, each mode against `none`.
";

/// Runs the command line `args` (without the program name) on `stdin`; what to print, or what
/// was wrong.
pub fn run(args: &[String], stdin: &mut dyn Read) -> Result<String, String> {
    let mut input = String::new();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut read = |stdin: &mut dyn Read| -> Result<String, String> {
        stdin
            .read_to_string(&mut input)
            .map_err(|e| format!("read stdin: {e}"))?;
        Ok(std::mem::take(&mut input))
    };
    match words.as_slice() {
        ["summary", rest @ ..] => summary(&read(stdin)?, rest),
        ["histogram", metric, before, after, rest @ ..] => histogram(metric, before, after, rest),
        ["cluster", pods, nodes] => cluster(&read(stdin)?, number(pods)?, nodes),
        ["controller", sets, replicas, nodes] => controller(
            &read(stdin)?,
            number(sets)? * number(replicas)?,
            &format!("{sets} StatefulSets x {replicas} pods on {nodes} kwok nodes"),
        ),
        _ => Err(USAGE.to_string()),
    }
}

fn number(word: &str) -> Result<f64, String> {
    word.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("not a number: {word:?}"))
}

fn summary(input: &str, options: &[&str]) -> Result<String, String> {
    let samples = input
        .split_whitespace()
        .map(number)
        .collect::<Result<Vec<_>, _>>()?;
    let s = Summary::of(&samples).ok_or("no samples on stdin")?;
    match options {
        [] => Ok(format!(
            "n {} median {:.3} p90 {:.3} p99 {:.3} min {:.3} max {:.3} mean {:.3}\n",
            s.n, s.median, s.p90, s.p99, s.min, s.max, s.mean
        )),
        ["--fields", fields] => {
            let values = fields
                .split(',')
                .map(|f| s.field(f).ok_or(format!("no field {f:?}")))
                .collect::<Result<Vec<_>, _>>()?;
            let words: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
            Ok(format!("{}\n", words.join(" ")))
        }
        _ => Err(USAGE.to_string()),
    }
}

fn histogram(metric: &str, before: &str, after: &str, options: &[&str]) -> Result<String, String> {
    let (mut labels, mut quantiles, mut scale) = (Vec::new(), vec![0.5, 0.99], 1.0);
    let mut mean = false;
    let mut rest = options;
    loop {
        rest = match rest {
            [] => break,
            ["--mean", tail @ ..] => {
                mean = true;
                tail
            }
            [flag, value, tail @ ..] => {
                match *flag {
                    "--label" => labels.push(value.split_once('=').ok_or("--label takes K=V")?),
                    "--quantiles" => {
                        quantiles = value.split(',').map(number).collect::<Result<_, _>>()?;
                    }
                    "--scale" => scale = number(value)?,
                    _ => return Err(USAGE.to_string()),
                }
                tail
            }
            _ => return Err(USAGE.to_string()),
        };
    }
    let file = |path: &str| std::fs::read_to_string(path).map_err(|e| format!("read {path}: {e}"));
    let (count, values) =
        histogram_quantiles(&file(before)?, &file(after)?, metric, &labels, &quantiles);
    let mut words: Vec<String> = values.iter().map(|v| format!("{:.1}", v * scale)).collect();
    if mean {
        let sum = histogram_sum(&file(before)?, &file(after)?, metric, &labels);
        words.push(match count {
            0 => "-".to_string(),
            n => format!("{:.3}", sum * scale / n as f64),
        });
    }
    Ok(format!("{count} {}\n", words.join(" ")))
}

/// Rows of whitespace-separated words, each with exactly `n`.
fn rows(input: &str, n: usize) -> Result<Vec<Vec<&str>>, String> {
    input
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            if words.len() == n {
                Ok(words)
            } else {
                Err(format!("expected {n} words per line, got {l:?}"))
            }
        })
        .collect()
}

fn cluster(input: &str, pods: f64, nodes: &str) -> Result<String, String> {
    let rows = rows(input, 7).or_else(|_| rows(input, 11))?;
    let admission = rows.first().is_some_and(|r| r.len() == 11);
    let rate = |ms: &str| number(ms).map(|ms| pods * 1000.0 / ms);
    let base = rows.iter().find(|r| r[0] == "none");
    let (base_create, base_rebuild) = match base {
        Some(r) => (Some(rate(r[1])?), Some(rate(r[2])?)),
        None => (None, None),
    };
    let mut header = vec![
        "mode",
        ">create pods/s",
        ">vs none",
        ">rebuild pods/s",
        ">vs none",
        ">attempt p50 / p99 ms (create)",
        ">attempt p50 / p99 ms (rebuild)",
    ];
    if admission {
        header.extend([
            ">mutating admission p50 / p99 / mean ms (create)",
            ">mutating admission p50 / p99 / mean ms (rebuild)",
            ">ipkeep's mutation calls / mean ms (create)",
            ">ipkeep's mutation calls / mean ms (rebuild)",
        ]);
    }
    let mut table = Table::new(&header);
    for r in &rows {
        let (create, rebuild) = (rate(r[1])?, rate(r[2])?);
        let mut cells = vec![
            r[0].to_string(),
            format!("{create:.1}"),
            ratio(create, base_create),
            format!("{rebuild:.1}"),
            ratio(rebuild, base_rebuild),
            format!("{} / {}", r[3], r[4]),
            format!("{} / {}", r[5], r[6]),
        ];
        cells.extend(r[7..].iter().map(|cell| cell.replace('/', " / ")));
        table.row(cells);
    }
    let note = if admission {
        "; mutating admission = kube-apiserver's admit step of every CREATE in the wave (pods, bindings, events); ipkeep's mutation = the pin webhook's calls or the ipkeep-pin policy's evaluations"
    } else {
        ""
    };
    Ok(format!(
        "\n{pods} StatefulSet pods on {nodes} kwok nodes; throughput = pods / wall time until kube-scheduler bound all{note}\n\n{table}"
    ))
}

fn controller(input: &str, pods: f64, title: &str) -> Result<String, String> {
    let rows = rows(input, 6)?;
    let seconds = |ms: &str| number(ms).map(|ms| ms / 1000.0);
    let base = match rows.iter().find(|r| r[0] == "none") {
        Some(r) => Some(seconds(r[1])?),
        None => None,
    };
    let mut table = Table::new(&[
        "mode",
        ">create -> all Ready s (1 s resolution)",
        ">vs none",
        ">last Ready -> last record s (1 s resolution)",
        ">controller VmHWM MiB (two replicas)",
        ">API writes per pod",
    ]);
    for r in &rows {
        let ready = seconds(r[1])?;
        let per_pod = match r[5] {
            "-" => "-".to_string(),
            writes => format!("{:.2}", number(writes)? / pods),
        };
        table.row([
            r[0].to_string(),
            format!("{ready:.1}"),
            ratio(ready, base),
            r[2].to_string(),
            format!("{} / {}", r[3], r[4]),
            per_pod,
        ]);
    }
    Ok(format!("\n{title}\n\n{table}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run_on(args: &[&str], stdin: &str) -> Result<String, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        run(&args, &mut stdin.as_bytes())
    }

    #[test]
    fn summary_of_stdin() {
        assert_eq!(
            run_on(&["summary", "--fields", "median,p99,n"], "3\n1\n2\n\n4\n").unwrap(),
            "2.000 4.000 4.000\n"
        );
        assert!(run_on(&["summary"], "").is_err());
        assert!(run_on(&["summary"], "1 x").is_err());
    }

    #[test]
    fn cluster_table_against_the_baseline() {
        let out = run_on(
            &["cluster", "1000", "500"],
            "none 10000 5000 1.0 2.0 1.0 2.0\nfull 20000 5000 3.0 4.0 3.0 4.0\n",
        )
        .unwrap();
        assert!(
            out.contains("| none | 100.0 | 1.00x | 200.0 | 1.00x | 1.0 / 2.0 | 1.0 / 2.0 |"),
            "{out}"
        );
        assert!(
            out.contains("| full | 50.0 | 0.50x | 200.0 | 1.00x |"),
            "{out}"
        );
    }

    #[test]
    fn cluster_table_with_admission() {
        let out = run_on(
            &["cluster", "1000", "500"],
            "none 10000 5000 1.0 2.0 1.0 2.0 5.0/25.0/1.20 5.0/5.0/0.90 - -\npolicy 10000 5000 1.0 2.0 1.0 2.0 5.0/25.0/1.30 5.0/5.0/0.90 1000/0.05 1000/0.06\n",
        )
        .unwrap();
        assert!(
            out.contains("| policy | 100.0 | 1.00x | 200.0 | 1.00x | 1.0 / 2.0 | 1.0 / 2.0 | 5.0 / 25.0 / 1.30 | 5.0 / 5.0 / 0.90 | 1000 / 0.05 | 1000 / 0.06 |"),
            "{out}"
        );
        assert!(out.contains("| none | 100.0 | 1.00x |"), "{out}");
        assert!(run_on(&["cluster", "1000", "500"], "none 1 2 3 4 5 6 7 8\n").is_err());
    }

    #[test]
    fn histogram_with_mean() {
        let dir = std::env::temp_dir().join(format!("ipkeep-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (before, after) = (dir.join("before"), dir.join("after"));
        std::fs::write(
            &before,
            "m_bucket{le=\"0.1\"} 0\nm_bucket{le=\"+Inf\"} 0\nm_sum 0\n",
        )
        .unwrap();
        std::fs::write(
            &after,
            "m_bucket{le=\"0.1\"} 4\nm_bucket{le=\"+Inf\"} 4\nm_sum 0.2\n",
        )
        .unwrap();
        let (b, a) = (before.to_str().unwrap(), after.to_str().unwrap());
        let out = run_on(&["histogram", "m", b, a, "--mean", "--scale", "1000"], "");
        assert_eq!(out.unwrap(), "4 100.0 100.0 50.000\n");
        let out = run_on(
            &["histogram", "m", a, a, "--quantiles", "0.5", "--mean"],
            "",
        );
        assert_eq!(out.unwrap(), "0 NaN -\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn controller_table_with_missing_values() {
        let out = run_on(
            &["controller", "10", "10", "5"],
            "none 50000 - - - -\nfull 60000 2 40 35 250\n",
        )
        .unwrap();
        assert!(
            out.contains("| none | 50.0 | 1.00x | - | - / - | - |"),
            "{out}"
        );
        assert!(
            out.contains("| full | 60.0 | 1.20x | 2 | 40 / 35 | 2.50 |"),
            "{out}"
        );
        assert!(run_on(&["controller", "10", "10"], "").is_err());
    }
}
