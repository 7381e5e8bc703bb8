//! Which retention a pod gets: its annotations, within the limits the network's operator set.
//!
//! Precedence (first match wins): the pod annotation `ipkeep.dev/ip-retention`, OpenKruise's
//! `io.kubernetes.cri/reserved-ip-duration` (whole minutes), then the network's `ipam.retention`.
//! Annotations arrive through `runtimeConfig["io.kubernetes.cri.pod-annotations"]`.
//!
//! Pod annotations are written by whoever creates the pod, so they are trusted only as far as
//! the operator allows:
//! * a pod that carries the `ipkeep.dev/persistent-pod-state` link (stamped by the scheduler
//!   extension on every pod a PersistentPodState manages) gets what its annotations say;
//! * any other pod gets at most `ipam.maxUnmanagedRetention` (default `0`: such annotations are
//!   ignored, as host-local would);
//! * an annotation that cannot be read never blocks the pod: the network's default applies and
//!   the reason is reported for the log.
//!
//! The values' grammar is `ipkeep_values::retention`, shared with the controller and webhook.

use std::collections::BTreeMap;

use ipkeep_values::keys::{IP_RETENTION, KRUISE_RESERVED_IP, PERSISTENT_POD_STATE};
pub use ipkeep_values::retention::{MAX_SECONDS, Retention, RetentionError};

/// Where a pod's retention came from (for logs and `ipkeep list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionSource {
    /// The `ipkeep.dev/ip-retention` annotation.
    Annotation,
    /// The `io.kubernetes.cri/reserved-ip-duration` annotation.
    KruiseAnnotation,
    /// The network's `ipam.retention` (or its default, off).
    NetworkDefault,
}

/// The network's retention rules, from its `ipam` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionPolicy {
    /// `ipam.retention`: for every named pod whose annotations say nothing (default off).
    pub default: Retention,
    /// `ipam.maxUnmanagedRetention`: the most an annotation gets on a pod without the
    /// PersistentPodState link (default off).
    pub max_unmanaged: Retention,
}

/// A pod's retention and how it was arrived at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What the pod gets.
    pub retention: Retention,
    /// Where it came from.
    pub source: RetentionSource,
    /// Why the pod got less than, or something else than, its annotations asked for (for a
    /// warning naming the pod); `None` when it got exactly what they say.
    pub adjusted: Option<String>,
}

impl RetentionPolicy {
    /// Resolves a pod's retention from its annotations (if the runtime passed them). Never fails:
    /// an unreadable annotation falls back to the network default with `adjusted` saying why.
    pub fn resolve(&self, annotations: Option<&BTreeMap<String, String>>) -> Resolved {
        let default = Resolved {
            retention: self.default,
            source: RetentionSource::NetworkDefault,
            adjusted: None,
        };
        let Some(annotations) = annotations else {
            return default;
        };
        let asked = if let Some(v) = annotations.get(IP_RETENTION) {
            let origin = format!("annotation {IP_RETENTION}");
            (Retention::parse(&origin, v), RetentionSource::Annotation)
        } else if let Some(v) = annotations.get(KRUISE_RESERVED_IP) {
            let origin = format!("annotation {KRUISE_RESERVED_IP}");
            (
                Retention::parse_kruise_minutes(&origin, v),
                RetentionSource::KruiseAnnotation,
            )
        } else {
            return default;
        };
        let (asked, source) = match asked {
            (Ok(r), source) => (r, source),
            (Err(e), _) => {
                return Resolved {
                    adjusted: Some(format!(
                        "{e}; using the network's retention {} instead",
                        self.default
                    )),
                    ..default
                };
            }
        };
        let managed = annotations
            .get(PERSISTENT_POD_STATE)
            .is_some_and(|v| !v.trim().is_empty());
        let capped = asked.at_most(self.max_unmanaged);
        if managed || capped == asked {
            return Resolved {
                retention: asked,
                source,
                adjusted: None,
            };
        }
        Resolved {
            retention: capped,
            source,
            adjusted: Some(format!(
                "the pod asks for retention {asked} but no PersistentPodState manages it (no {PERSISTENT_POD_STATE} annotation); \
                 limited to ipam.maxUnmanagedRetention {}",
                self.max_unmanaged
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const LINK: (&str, &str) = (PERSISTENT_POD_STATE, "kv");

    #[test]
    fn precedence_is_annotation_then_kruise_then_network() {
        let p = RetentionPolicy {
            default: Retention::Seconds(60),
            max_unmanaged: Retention::Off,
        };
        let r = |a: &[(&str, &str)]| {
            let got = p.resolve(Some(&ann(a)));
            (got.retention, got.source)
        };
        assert_eq!(p.resolve(None).retention, Retention::Seconds(60));
        assert_eq!(
            r(&[]),
            (Retention::Seconds(60), RetentionSource::NetworkDefault)
        );
        assert_eq!(
            r(&[LINK, (KRUISE_RESERVED_IP, "10")]),
            (Retention::Seconds(600), RetentionSource::KruiseAnnotation)
        );
        assert_eq!(
            r(&[LINK, (KRUISE_RESERVED_IP, "10"), (IP_RETENTION, "0")]),
            (Retention::Off, RetentionSource::Annotation)
        );
    }

    #[test]
    fn an_unreadable_annotation_falls_back_to_the_network_default() {
        let p = RetentionPolicy {
            default: Retention::Seconds(60),
            max_unmanaged: Retention::Forever,
        };
        for bad in ["soon", "10000y", "00"] {
            let got = p.resolve(Some(&ann(&[LINK, (IP_RETENTION, bad)])));
            assert_eq!(got.retention, Retention::Seconds(60), "{bad}");
            assert_eq!(got.source, RetentionSource::NetworkDefault);
            let why = got.adjusted.expect("says why");
            assert!(why.contains(IP_RETENTION) && why.contains("1m"), "{why}");
        }
    }

    #[test]
    fn unmanaged_pods_get_at_most_the_operator_limit() {
        let off = RetentionPolicy::default();
        let got = off.resolve(Some(&ann(&[(IP_RETENTION, "forever")])));
        assert_eq!(got.retention, Retention::Off);
        assert!(got.adjusted.expect("why").contains("maxUnmanagedRetention"));
        let got = off.resolve(Some(&ann(&[(KRUISE_RESERVED_IP, "99999")])));
        assert_eq!(got.retention, Retention::Off);
        let hour = RetentionPolicy {
            default: Retention::Off,
            max_unmanaged: Retention::Seconds(3600),
        };
        let got = hour.resolve(Some(&ann(&[(IP_RETENTION, "30m")])));
        assert_eq!(
            (got.retention, got.adjusted),
            (Retention::Seconds(1800), None)
        );
        let got = hour.resolve(Some(&ann(&[(IP_RETENTION, "36500d")])));
        assert_eq!(got.retention, Retention::Seconds(3600));
        let got = hour.resolve(Some(&ann(&[LINK, (IP_RETENTION, "forever")])));
        assert_eq!((got.retention, got.adjusted), (Retention::Forever, None));
        let got = hour.resolve(Some(&ann(&[
            (PERSISTENT_POD_STATE, " "),
            (IP_RETENTION, "forever"),
        ])));
        assert_eq!(
            got.retention,
            Retention::Seconds(3600),
            "a blank link is no link"
        );
    }
}
