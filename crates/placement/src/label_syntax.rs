//! The syntax of label keys and values as users write them in annotations and specs (key lists
//! split, each key and value checked against the API server's rules).

/// Splits a comma-separated key list, trimming whitespace and dropping empty items
/// (OpenKruise keeps the whitespace, so `"a, b"` silently never matches; we do not).
pub fn split_keys(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}

/// Checks a label key as Kubernetes does: an optional prefix and `/`, then a name of at most 63
/// characters of `[A-Za-z0-9-_.]` that starts and ends alphanumeric. The prefix is a DNS
/// subdomain: at most 253 characters, dot-separated labels of lower-case letters, digits and `-`
/// that start and end alphanumeric, with no limit of 63 on each (Kubernetes sets none). Returns
/// why it is invalid.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 {
            return Err("the prefix before '/' must be 1 to 253 characters".into());
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !prefix.split('.').all(label_ok) {
            return Err(
                "the prefix before '/' must be a lower-case DNS subdomain such as topology.kubernetes.io"
                    .into(),
            );
        }
    }
    if name.is_empty() || name.len() > 63 {
        return Err("the name part must be 1 to 63 characters".into());
    }
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let bytes = name.as_bytes();
    let ok = bytes
        .iter()
        .all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.')
        && bytes.first().copied().is_some_and(alnum)
        && bytes.last().copied().is_some_and(alnum);
    if !ok {
        return Err(
            "the name part may hold only letters, digits, '-', '_' and '.', and must start and end with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// Checks a label value: empty, or at most 63 characters of `[A-Za-z0-9-_.]` that start and end
/// alphanumeric. Returns why it is invalid.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let bytes = value.as_bytes();
    if value.len() > 63
        || !bytes
            .iter()
            .all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.')
        || !bytes.first().copied().is_some_and(alnum)
        || !bytes.last().copied().is_some_and(alnum)
    {
        return Err("a label value is empty, or at most 63 letters, digits, '-', '_' and '.' that start and end with a letter or digit".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_trims_and_drops_empty_items() {
        assert_eq!(
            split_keys(" kubernetes.io/hostname , topology.kubernetes.io/zone,,"),
            vec!["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
        );
        assert!(split_keys(" , ").is_empty());
    }

    #[test]
    fn label_keys() {
        for ok in ["kubernetes.io/hostname", "zone", "a.b-c/x_y.z", "rack1"] {
            assert_eq!(check_label_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/x",
            "Kubernetes.io/hostname",
            "a/-x",
            "a/x-",
            "a/b/c",
            "has space",
        ] {
            assert!(check_label_key(bad).is_err(), "{bad}");
        }
        assert!(check_label_key(&"x".repeat(64)).is_err());
        // A label of the prefix may be longer than a DNS name's 63; the prefix not past 253.
        assert_eq!(check_label_key(&format!("{}/x", "a".repeat(64))), Ok(()));
        assert!(check_label_key(&format!("{}/x", "a".repeat(254))).is_err());
    }
}
