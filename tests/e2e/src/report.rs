//! What the demonstration prints: a timeline as it happens, then a table of every pod's place
//! and address before and after each step, with what ipkeep did, and the expectations that
//! failed.

use std::io::Write;
use std::time::Instant;

/// Where a pod was, and with which address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Place {
    /// The node, if bound.
    pub node: Option<String>,
    /// The first pod IP, if any.
    pub ip: Option<String>,
}

impl Place {
    fn cells(&self) -> (String, String) {
        (
            self.node.clone().unwrap_or_else(|| "-".into()),
            self.ip.clone().unwrap_or_else(|| "-".into()),
        )
    }
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The scenario step.
    pub step: String,
    /// The pod.
    pub pod: String,
    /// Before the step.
    pub before: Place,
    /// After it.
    pub after: Place,
    /// What ipkeep did, in words.
    pub ipkeep: String,
}

/// The narration and the results.
pub struct Report {
    start: Instant,
    out: Box<dyn Write + Send>,
    /// The table.
    pub rows: Vec<Row>,
    /// Expectations that held.
    pub passed: Vec<String>,
    /// Expectations that did not.
    pub failed: Vec<String>,
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Report")
            .field("rows", &self.rows)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Report {
    /// Narrates to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            start: Instant::now(),
            out,
            rows: Vec::new(),
            passed: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// A timeline line.
    pub fn say(&mut self, text: &str) {
        let t = self.start.elapsed().as_secs_f64();
        let _ = writeln!(self.out, "[{t:6.1}s] {text}");
        let _ = self.out.flush();
    }

    /// A heading in the timeline.
    pub fn step(&mut self, title: &str) {
        let _ = writeln!(self.out);
        self.say(&format!("== {title}"));
    }

    /// Records an expectation; says it when it fails.
    pub fn expect(&mut self, ok: bool, what: impl Into<String>) -> bool {
        let what = what.into();
        if ok {
            self.say(&format!("   ok: {what}"));
            self.passed.push(what);
        } else {
            self.say(&format!("   FAILED: {what}"));
            self.failed.push(what);
        }
        ok
    }

    /// Adds a table row.
    pub fn row(
        &mut self,
        step: &str,
        pod: &str,
        before: Place,
        after: Place,
        ipkeep: impl Into<String>,
    ) {
        self.rows.push(Row {
            step: step.into(),
            pod: pod.into(),
            before,
            after,
            ipkeep: ipkeep.into(),
        });
    }

    /// Prints the table and the verdict.
    pub fn finish(&mut self) {
        let header = [
            "step",
            "pod",
            "node before",
            "IP before",
            "node after",
            "IP after",
            "what ipkeep did",
        ];
        let lines: Vec<[String; 7]> = self
            .rows
            .iter()
            .map(|r| {
                let (bn, bi) = r.before.cells();
                let (an, ai) = r.after.cells();
                [
                    r.step.clone(),
                    r.pod.clone(),
                    bn,
                    bi,
                    an,
                    ai,
                    r.ipkeep.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for l in &lines {
            for (w, c) in widths.iter_mut().zip(l.iter()).take(6) {
                *w = (*w).max(c.chars().count());
            }
        }
        let fmt = |cells: &[String; 7]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i < 6 {
                    s.push_str(&format!("{c:<w$}  ", w = widths[i]));
                } else {
                    s.push_str(c);
                }
            }
            s.trim_end().to_string()
        };
        let _ = writeln!(self.out);
        let _ = writeln!(self.out, "{}", fmt(&header.map(str::to_string)));
        for l in &lines {
            let _ = writeln!(self.out, "{}", fmt(l));
        }
        let _ = writeln!(self.out);
        if self.failed.is_empty() {
            let _ = writeln!(self.out, "all {} expectations held", self.passed.len());
        } else {
            let _ = writeln!(
                self.out,
                "{} of {} expectations FAILED:",
                self.failed.len(),
                self.passed.len() + self.failed.len()
            );
            for f in &self.failed {
                let _ = writeln!(self.out, "  - {f}");
            }
        }
        let _ = self.out.flush();
    }

    /// Writes free text (log paths, hints).
    pub fn note(&mut self, text: &str) {
        let _ = writeln!(self.out, "{text}");
        let _ = self.out.flush();
    }
}
