//! StatefulSet pod ordinals: pod `<statefulset>-<ordinal>`, where the ordinal is the canonical
//! decimal form of a non-negative 32-bit integer (as the StatefulSet controller writes it: no
//! sign, no leading zero), so `db-01` and `db-+1` are never pods of `db`.

/// The ordinal written in a pod name, when `pod` is `<statefulset>-<ordinal>`.
pub fn from_name(pod: &str, statefulset: &str) -> Option<u32> {
    let digits = pod.strip_prefix(statefulset)?.strip_prefix('-')?;
    parse(digits)
}

/// The ordinal of a pod of `statefulset`: its `apps.kubernetes.io/pod-index` label when present
/// and canonical (the name must still be `<statefulset>-<that ordinal>`), else its name.
pub fn of_pod(pod: &str, statefulset: &str, pod_index_label: Option<&str>) -> Option<u32> {
    let from_name = from_name(pod, statefulset)?;
    match pod_index_label.map(parse) {
        Some(Some(label)) if label != from_name => None,
        _ => Some(from_name),
    }
}

/// Parses a canonical ordinal: `0`, or digits without a leading zero, at most `i32::MAX`.
pub fn parse(text: &str) -> Option<u32> {
    let canonical = text == "0" || (!text.is_empty() && !text.starts_with('0'));
    if !canonical || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u32>()
        .ok()
        .filter(|n| i32::try_from(*n).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        for (pod, want) in [
            ("db-0", Some(0)),
            ("db-12", Some(12)),
            ("db-2147483647", Some(2_147_483_647)),
            ("db-2147483648", None),
            ("db-01", None),
            ("db-+1", None),
            ("db--1", None),
            ("db-", None),
            ("db-1a", None),
            ("dbx-1", None),
            ("db", None),
            ("other-1", None),
        ] {
            assert_eq!(from_name(pod, "db"), want, "{pod}");
        }
        assert_eq!(from_name("my-db-3", "my-db"), Some(3));
        assert_eq!(of_pod("db-3", "db", Some("3")), Some(3));
        assert_eq!(of_pod("db-3", "db", None), Some(3));
        assert_eq!(
            of_pod("db-3", "db", Some("4")),
            None,
            "label and name disagree"
        );
        assert_eq!(of_pod("db-3", "db", Some("x")), Some(3), "unreadable label");
        assert_eq!(of_pod("dbx-3", "db", Some("3")), None);
    }
}
