//! The values the CRD's patterns accept are the values ipkeep's Rust parsers accept: one table of
//! cases per field, each fed to the pattern taken from the generated CRD and to the parser. A
//! case where they differ on purpose says so in the table.
#![allow(clippy::unwrap_used)]

use ipkeep_api::PersistentPodState;
use ipkeep_values::{Retention, duration};
use kube::CustomResourceExt;
use regex::Regex;

/// The `pattern` of a field of `spec`, from the CRD kube-apiserver gets.
fn spec_pattern(path: &[&str]) -> Regex {
    let crd = serde_json::to_value(PersistentPodState::crd()).unwrap();
    let mut schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    for field in path {
        schema = &schema["properties"][field];
    }
    let pattern = schema["pattern"]
        .as_str()
        .unwrap_or_else(|| panic!("{path:?} has a pattern"));
    Regex::new(pattern).unwrap()
}

/// `(value, the CRD accepts it, the parser accepts it)`.
type Case = (&'static str, bool, bool);

fn check(field: &str, pattern: &Regex, cases: &[Case], parses: impl Fn(&str) -> bool) {
    for &(value, crd, rust) in cases {
        assert_eq!(
            pattern.is_match(value),
            crd,
            "{field} {value:?}: the CRD pattern"
        );
        assert_eq!(parses(value), rust, "{field} {value:?}: the Rust parser");
    }
}

/// Accepted by both, or refused by both: the cases that differ are listed in each table.
const DURATIONS: [Case; 22] = [
    ("5m", true, true),
    ("1h30m", true, true),
    ("0s", true, true),
    ("10ns", true, true),
    ("250us", true, true),
    ("1500ms", true, true),
    ("2d", true, true),
    ("1d2h3m4s5ms6us7ns", true, true),
    ("007s", true, true),
    ("", false, false),
    ("5", false, false),
    ("m", false, false),
    ("1w", false, false),
    ("1y", false, false),
    ("1M", false, false),
    ("5 m", false, false),
    ("5min", false, false),
    ("5minutes", false, false),
    ("1h 30m", false, false),
    (" 5m", false, false),
    ("-5m", false, false),
    ("1.5h", false, false),
];

#[test]
fn node_loss_after_is_exactly_the_crd_pattern() {
    let pattern = spec_pattern(&["nodeLossPolicy", "after"]);
    let parses = |v: &str| duration::parse(v).is_ok();
    check("nodeLossPolicy.after", &pattern, &DURATIONS, parses);
    // The pattern cannot count: a value past u64::MAX seconds matches it, and is refused.
    let beyond: [Case; 1] = [("18446744073709551616s", true, false)];
    check("nodeLossPolicy.after", &pattern, &beyond, parses);
}

#[test]
fn ip_retention_is_the_crd_pattern_but_for_whitespace_and_its_limit() {
    let pattern = spec_pattern(&["ipRetention"]);
    let parses = |v: &str| Retention::parse("spec.ipRetention", v).is_ok();
    // Every duration "0s" and over is a retention (no whitespace; the others are refused alike).
    let durations: Vec<Case> = DURATIONS
        .iter()
        .filter(|c| !c.0.starts_with(' '))
        .copied()
        .collect();
    check("ipRetention", &pattern, &durations, parses);
    let own: [Case; 8] = [
        ("0", true, true),
        ("forever", true, true),
        ("Forever", false, false),
        ("00", false, false),
        ("36500d", true, true),
        // Past 100 years: the pattern cannot count; the parser asks for "forever".
        ("36501d", true, false),
        // Pod annotations have no schema: the parser ignores surrounding whitespace there.
        (" 30m", false, true),
        ("forever\n", false, true),
    ];
    check("ipRetention", &pattern, &own, parses);
}
