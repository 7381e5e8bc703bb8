//! Kubernetes identifiers as the node receives them from the container runtime: object names
//! (DNS-1123 subdomains), namespaces (DNS-1123 labels) and pod UIDs. The runtime copies them
//! from the API server, which validated them; anything else is refused where it is decoded, so
//! nothing odd (a newline, ten kilobytes) reaches a store, a log line or an Event.

/// The longest DNS-1123 subdomain (most object names).
pub const MAX_SUBDOMAIN: usize = 253;
/// The longest DNS-1123 label (namespaces).
pub const MAX_LABEL: usize = 63;
/// The longest pod UID accepted: a UUID is 36 characters, a static pod's (a hash of its
/// manifest) 32; 64 leaves room for other hashes.
pub const MAX_UID: usize = 64;

/// A DNS-1123 subdomain: dot-separated parts, each lower-case alphanumerics and `-` starting
/// and ending with an alphanumeric, at most [`MAX_SUBDOMAIN`] characters in all.
pub fn is_subdomain(name: &str) -> bool {
    name.len() <= MAX_SUBDOMAIN && name.split('.').all(|part| is_dns1123(part, MAX_SUBDOMAIN))
}

/// A DNS-1123 label: like a subdomain without dots, at most [`MAX_LABEL`] characters.
pub fn is_label(name: &str) -> bool {
    is_dns1123(name, MAX_LABEL)
}

/// A pod UID as runtimes pass it (`K8S_POD_UID`): a UUID or a hex hash, so ASCII letters,
/// digits and `-`, at most [`MAX_UID`] characters.
pub fn is_pod_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= MAX_UID
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// One part: lower-case alphanumerics and `-`, an alphanumeric at both ends, at most `max`.
fn is_dns1123(name: &str, max: usize) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= max
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && (bytes.iter())
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_and_labels() {
        for ok in ["db", "kv-0", "pg-0.db", "a", "a.b-c.0", &"a".repeat(253)] {
            assert!(is_subdomain(ok), "{ok:?}");
        }
        for bad in [
            "",
            "Db",
            "-a",
            "a-",
            "a_b",
            "a\nb",
            "a b",
            &"a".repeat(254),
            "é",
            // Every dot-separated part is a label of its own, as Kubernetes' validation says.
            "a..b",
            "a.-b",
            "a-.b",
            ".a",
        ] {
            assert!(!is_subdomain(bad), "{bad:?}");
        }
        assert!(is_label("kube-system"));
        assert!(!is_label("a.b"));
        assert!(!is_label(&"a".repeat(64)));
    }

    #[test]
    fn pod_uids() {
        for ok in [
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            "d41d8cd98f00b204e9800998ecf8427e",
            "uid-web-0",
            &"f".repeat(64),
        ] {
            assert!(is_pod_uid(ok), "{ok:?}");
        }
        for bad in ["", "u\n1", "a b", "a/b", "a;b", &"f".repeat(65), "ü"] {
            assert!(!is_pod_uid(bad), "{bad:?}");
        }
    }
}
