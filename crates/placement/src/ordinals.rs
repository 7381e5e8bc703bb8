//! Which ordinals a StatefulSet wants, as sets of ordinals: Kubernetes' `[start, start +
//! replicas)`, and OpenKruise Advanced StatefulSet's rule, where `spec.reserveOrdinals` are
//! skipped and `replicas` is counted over the ordinals left.
//!
//! Kruise's rule, from its StatefulSet controller (`getStatefulSetReplicasRange`): walk up from
//! the start ordinal, skip every reserved one, stop once `replicas` unreserved ordinals are
//! counted; the pods are those ordinals, every other pod (a reserved ordinal inside the range
//! included) is condemned. Its entries parse as its `GetReserveOrdinalIntSet` does: an integer is
//! one ordinal, a string `"a-b"` every ordinal from `a` to `b` (Go's `Atoi` on each side: a `+`
//! sign and leading zeros read, `a <= b`), and one entry that does not parse makes the whole set
//! empty ("nothing reserved"), as Kruise logs and carries on.
//!
//! `spec.ordinals.start` counts in Kruise only behind its `StatefulSetStartOrdinal` feature gate
//! (alpha, off by default), which ipkeep cannot see. [`ValidOrdinals::kruise`] is therefore the
//! union of both readings, from 0 and from `start`: an ordinal either reading wants is wanted, so
//! no record is ever pruned that the Advanced StatefulSet may still use. The price is that, with
//! a start above 0, records of the reading the cluster does not use are kept (never pruned by
//! `WhenScaled`) until `start` or `replicas` change.
//!
//! Sets are kept as sorted ranges, never expanded: a range `"0-2000000000"` costs one entry.

use std::ops::Range;

use ipkeep_api::kruise::ReserveOrdinal;

/// An entry of `reserveOrdinals` that does not parse, so Kruise reserves nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[error(
    "spec.reserveOrdinals[{index}] is {entry}, neither an ordinal nor a range \"a-b\" with a <= b, so Kruise reserves no ordinal at all"
)]
pub struct InvalidReserveOrdinal {
    /// Its index in the list.
    pub index: usize,
    /// The entry, as JSON; a long one cut to its first [`SHOWN_CHARS`] characters and `…`.
    pub entry: String,
}

/// How much of an entry [`InvalidReserveOrdinal`] shows: enough to find it, never a whole
/// object someone wrote into the list.
pub const SHOWN_CHARS: usize = 40;

fn shown(entry: &serde_json::Value) -> String {
    let json = entry.to_string();
    match json.char_indices().nth(SHOWN_CHARS) {
        Some((cut, _)) => format!("{}…", &json[..cut]),
        None => json,
    }
}

/// Ordinals reserved by `spec.reserveOrdinals`: sorted, disjoint, non-adjacent ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ReservedOrdinals {
    ranges: Vec<Range<u64>>,
}

impl ReservedOrdinals {
    /// Parses `spec.reserveOrdinals` as Kruise does; the first entry that does not parse is the
    /// error (the caller then reserves nothing, as Kruise).
    pub fn parse(entries: &[ReserveOrdinal]) -> Result<Self, InvalidReserveOrdinal> {
        let mut ranges = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            match entry {
                // A negative ordinal reserves nothing an ordinal (never negative) can hit.
                ReserveOrdinal::Int(n) => {
                    if let Ok(n) = u64::try_from(*n) {
                        ranges.push(n..n.saturating_add(1));
                    }
                }
                ReserveOrdinal::Text(text) => {
                    let (a, b) = parse_range(text).ok_or_else(|| InvalidReserveOrdinal {
                        index,
                        entry: shown(&serde_json::Value::from(text.as_str())),
                    })?;
                    ranges.push(a..b.saturating_add(1));
                }
                ReserveOrdinal::Other(value) => {
                    return Err(InvalidReserveOrdinal {
                        index,
                        entry: shown(value),
                    });
                }
            }
        }
        Ok(Self {
            ranges: merged(ranges),
        })
    }

    /// Whether `ordinal` is reserved.
    pub fn contains(&self, ordinal: u64) -> bool {
        self.ranges.iter().any(|r| r.contains(&ordinal))
    }
}

/// Kruise's `ParseRange`: `"a-b"`, split on every `-` into exactly two parts, each read by Go's
/// `strconv.Atoi` (optional `+`, decimal digits, leading zeros allowed, fits 64 bits), `a <= b`.
fn parse_range(text: &str) -> Option<(u64, u64)> {
    let mut parts = text.split('-');
    let (a, b) = (parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    // Rust's integer parse reads what Atoi does here: no `-` is left after the split.
    let (a, b) = (a.parse::<i64>().ok()?, b.parse::<i64>().ok()?);
    let (a, b) = (u64::try_from(a).ok()?, u64::try_from(b).ok()?);
    (a <= b).then_some((a, b))
}

/// Sorts and merges overlapping or adjacent ranges, dropping empty ones.
fn merged(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.retain(|r| !r.is_empty());
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Kruise's replica ordinals for one reading of `start`: from `start` up, the first `replicas`
/// ordinals not reserved (`getStatefulSetReplicasRange`, whose range `[start, end)` holds these
/// and the reserved ordinals between them).
pub fn kruise_replicas(replicas: u32, start: u64, reserved: &ReservedOrdinals) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    let mut at = start;
    let mut left = u64::from(replicas);
    for skip in reserved.ranges.iter().filter(|r| r.end > start) {
        if left == 0 {
            break;
        }
        if skip.start > at {
            let take = left.min(skip.start - at);
            out.push(at..at + take);
            left -= take;
        }
        at = at.max(skip.end);
    }
    if left > 0 {
        out.push(at..at.saturating_add(left));
    }
    merged(out)
}

/// The ordinals a StatefulSet wants now: a record of any other ordinal is condemned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValidOrdinals {
    ranges: Vec<Range<u64>>,
}

impl ValidOrdinals {
    /// Kubernetes' StatefulSet: `[start, start + replicas)` (`ordinals.start` is GA there).
    pub fn native(replicas: u32, start: u32) -> Self {
        let start = u64::from(start);
        let all = start..start + u64::from(replicas);
        Self {
            ranges: if all.is_empty() {
                Vec::new()
            } else {
                [all].into()
            },
        }
    }

    /// An Advanced StatefulSet: what Kruise wants with `ordinals.start` counted or not (its
    /// feature gate decides, and ipkeep cannot see it), so nothing valid under either is
    /// condemned.
    pub fn kruise(replicas: u32, start: u32, reserved: &ReservedOrdinals) -> Self {
        let mut ranges = kruise_replicas(replicas, 0, reserved);
        if start > 0 {
            ranges.extend(kruise_replicas(replicas, u64::from(start), reserved));
        }
        Self {
            ranges: merged(ranges),
        }
    }

    /// Whether `ordinal` is wanted.
    pub fn contains(&self, ordinal: u32) -> bool {
        let ordinal = u64::from(ordinal);
        self.ranges.iter().any(|r| r.contains(&ordinal))
    }

    /// The wanted ordinals, ascending (only those a pod name can carry: up to `i32::MAX`).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let max = u64::from(i32::MAX.unsigned_abs());
        self.ranges
            .iter()
            .flat_map(move |r| r.start.min(max + 1)..r.end.min(max + 1))
            .filter_map(|o| u32::try_from(o).ok())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entries(json: serde_json::Value) -> Vec<ReserveOrdinal> {
        serde_json::from_value(json).unwrap()
    }

    fn reserved(json: serde_json::Value) -> ReservedOrdinals {
        ReservedOrdinals::parse(&entries(json)).unwrap()
    }

    fn set(r: &ReservedOrdinals) -> Vec<u64> {
        (0..40).filter(|o| r.contains(*o)).collect()
    }

    /// Kruise's own table (`pkg/util/api/asts_test.go`, `TestGetIntSet`): what each entry
    /// reserves, and the entries that make the whole set empty.
    #[test]
    fn reserve_ordinals_parse_as_kruise_parses_them() {
        use serde_json::json;
        for (input, want) in [
            (json!([1, 2, 3]), vec![1, 2, 3]),
            (json!(["1-3"]), vec![1, 2, 3]),
            (json!([1, "2-3"]), vec![1, 2, 3]),
            (json!([]), vec![]),
            (json!([1, 1, 2, 3]), vec![1, 2, 3]),
            (json!(["1-3", "2-4"]), vec![1, 2, 3, 4]),
            (json!([2, "1-3"]), vec![1, 2, 3]),
            (json!([2, 1]), vec![1, 2]),
            (json!(["0003-005"]), vec![3, 4, 5]),
            // Go's Atoi reads a `+` sign (Kruise's webhook would refuse it; its controller not).
            (json!(["+1-+2"]), vec![1, 2]),
            (json!(["4-4"]), vec![4]),
            (json!([-1, 0]), vec![0]),
        ] {
            assert_eq!(set(&reserved(input.clone())), want, "{input}");
        }
        for bad in [
            json!(["1-%"]),
            json!(["%-2"]),
            json!(["1-2-3"]),
            json!(["03-001"]),
            json!(["5"]),
            json!(["1-"]),
            json!(["-1"]),
            json!([" 1-2"]),
            json!(["1_0-20"]),
            json!([1, "x"]),
            json!([1.5]),
            json!([null]),
            json!(["0-99999999999999999999"]),
        ] {
            assert!(
                ReservedOrdinals::parse(&entries(bad.clone())).is_err(),
                "{bad}"
            );
        }
        let err = ReservedOrdinals::parse(&entries(json!([1, "2-x"]))).unwrap_err();
        assert_eq!((err.index, err.entry.as_str()), (1, "\"2-x\""));
        // A long entry is cut: the message names it, never repeats all of it.
        let long = "9".repeat(500);
        let err = ReservedOrdinals::parse(&entries(json!([format!("1-{long}")]))).unwrap_err();
        assert_eq!(err.entry.chars().count(), SHOWN_CHARS + 1, "{}", err.entry);
        assert!(err.entry.starts_with("\"1-999") && err.entry.ends_with('…'));
    }

    fn ordinals(ranges: &[Range<u64>]) -> Vec<u64> {
        ranges.iter().flat_map(|r| r.clone()).collect()
    }

    /// Kruise's examples: the source comment of `getStatefulSetReplicasRange` (replicas 4,
    /// reserve {1,3}, start 2: pods 2,4,5,6), its test `TestGetStatefulSetReplicasRange` (the
    /// range's length with starts 0, 2, 3, 4), the API doc of `reserveOrdinals` (replicas 3,
    /// reserve [1]: pods 0,2,3; replicas 2: pods 0,2) and the PersistentPodState controller's
    /// test "scale down replicas 10->8" (reserve {0,3,7}).
    #[test]
    fn kruise_replicas_follow_kruise_examples() {
        use serde_json::json;
        let one_three = reserved(json!([1, 3]));
        for (replicas, start, reserve, want, range_len) in [
            (4, 2, &one_three, vec![2, 4, 5, 6], 5),
            (4, 0, &one_three, vec![0, 2, 4, 5], 6),
            (4, 3, &one_three, vec![4, 5, 6, 7], 5),
            (4, 4, &one_three, vec![4, 5, 6, 7], 4),
            (3, 0, &reserved(json!([1])), vec![0, 2, 3], 4),
            (2, 0, &reserved(json!([1])), vec![0, 2], 3),
            (
                8,
                0,
                &reserved(json!([0, 3, 7])),
                vec![1, 2, 4, 5, 6, 8, 9, 10],
                11,
            ),
            (3, 0, &reserved(json!([1, "3-5"])), vec![0, 2, 6], 7),
            (0, 0, &one_three, vec![], 0),
            (
                2,
                0,
                &reserved(json!(["0-1999999999"])),
                vec![2_000_000_000, 2_000_000_001],
                0,
            ),
        ] {
            let got = kruise_replicas(replicas, start, reserve);
            assert_eq!(ordinals(&got), want, "replicas {replicas} start {start}");
            if range_len > 0 {
                // Kruise reports [start, end): its length counts the reserved ones inside.
                let end = got.last().unwrap().end;
                assert_eq!(end - start, range_len, "replicas {replicas} start {start}");
            }
        }
    }

    /// With `ordinals.start`, an ordinal either reading of Kruise's gate wants is valid; native
    /// StatefulSets honour `start` alone.
    #[test]
    fn a_kruise_start_keeps_both_readings() {
        use serde_json::json;
        let valid = |v: &ValidOrdinals| v.iter().collect::<Vec<_>>();
        let one_three = reserved(json!([1, 3]));
        assert_eq!(
            valid(&ValidOrdinals::kruise(4, 2, &one_three)),
            [0, 2, 4, 5, 6],
            "gate off: 0,2,4,5; gate on: 2,4,5,6"
        );
        assert_eq!(
            valid(&ValidOrdinals::kruise(4, 0, &one_three)),
            [0, 2, 4, 5]
        );
        assert_eq!(
            valid(&ValidOrdinals::kruise(2, 10, &ReservedOrdinals::default())),
            [0, 1, 10, 11]
        );
        assert_eq!(valid(&ValidOrdinals::native(3, 5)), [5, 6, 7]);
        assert_eq!(valid(&ValidOrdinals::native(0, 5)), Vec::<u32>::new());
        let kruise = ValidOrdinals::kruise(4, 2, &one_three);
        assert!(kruise.contains(6) && !kruise.contains(1) && !kruise.contains(3));
        assert!(!kruise.contains(7));
        let top = ValidOrdinals::native(3, i32::MAX.unsigned_abs() - 1);
        assert_eq!(
            valid(&top),
            [2_147_483_646, 2_147_483_647],
            "no ordinal a pod name cannot carry"
        );
    }
}
