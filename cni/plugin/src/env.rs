//! The `CNI_*` environment: which variables each command needs, how they are validated (the
//! reference `skel` rules), and `CNI_ARGS`.

use std::collections::HashMap;
use std::net::IpAddr;

use ipkeep_ipam::range::parse_ip;
use ipkeep_values::names;

use crate::error::{CniError, code};

/// A CNI command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Allocate.
    Add,
    /// Release (or hold).
    Del,
    /// Verify.
    Check,
    /// Report supported versions.
    Version,
    /// Release what is not in the valid-attachments list (CNI 1.1).
    Gc,
    /// Readiness (CNI 1.1).
    Status,
}

impl Command {
    fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            _ => return None,
        })
    }

    /// The spelling on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Gc => "GC",
            Command::Status => "STATUS",
        }
    }
}

/// The validated environment of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The command.
    pub command: Command,
    /// `CNI_CONTAINERID` (ADD, DEL, CHECK).
    pub container_id: String,
    /// `CNI_IFNAME` (ADD, DEL, CHECK).
    pub ifname: String,
    /// `CNI_NETNS` (ADD, CHECK; may be empty at DEL).
    pub netns: String,
    /// `CNI_ARGS`, parsed.
    pub args: CniArgs,
}

/// `CNI_ARGS` keys ipkeep understands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `IP=` (prefix stripped).
    pub ip: Option<IpAddr>,
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
}

/// Which commands need which variable, in the order `skel` reports them.
const REQUIRED: &[(&str, &[Command])] = &[
    (
        "CNI_CONTAINERID",
        &[Command::Add, Command::Check, Command::Del],
    ),
    ("CNI_NETNS", &[Command::Add, Command::Check]),
    ("CNI_IFNAME", &[Command::Add, Command::Check, Command::Del]),
    (
        "CNI_PATH",
        &[
            Command::Add,
            Command::Check,
            Command::Del,
            Command::Gc,
            Command::Status,
        ],
    ),
];

/// Reads and validates the environment.
pub fn parse(env: &HashMap<String, String>) -> Result<Invocation, CniError> {
    let get = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let command_text = get("CNI_COMMAND").ok_or_else(|| {
        CniError::new(
            code::INVALID_ENV,
            "required env variables [CNI_COMMAND] missing",
        )
    })?;
    let command = Command::parse(command_text).ok_or_else(|| {
        CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND: {command_text}"),
        )
    })?;
    let missing: Vec<&str> = REQUIRED
        .iter()
        .filter(|(var, cmds)| cmds.contains(&command) && get(var).is_none())
        .map(|(var, _)| *var)
        .collect();
    if !missing.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("required env variables [{}] missing", missing.join(",")),
        ));
    }
    let container_id = get("CNI_CONTAINERID").unwrap_or_default().to_string();
    let ifname = get("CNI_IFNAME").unwrap_or_default().to_string();
    let netns = get("CNI_NETNS").unwrap_or_default().to_string();
    if matches!(command, Command::Add | Command::Check | Command::Del) {
        validate_container_id(&container_id)?;
        validate_ifname(&ifname)?;
    }
    // Recorded with the addresses and looked up later to tell a live sandbox from a gone one;
    // DEL does neither, and must never fail on what it does not need.
    if matches!(command, Command::Add | Command::Check) {
        validate_netns(&netns)?;
    }
    let args = parse_args(get("CNI_ARGS").unwrap_or_default())?;
    Ok(Invocation {
        command,
        container_id,
        ifname,
        netns,
        args,
    })
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, as `skel` requires.
fn validate_container_id(id: &str) -> Result<(), CniError> {
    if ipkeep_ipam::validate_network_name(id).is_err() {
        return Err(
            CniError::new(code::INVALID_ENV, "invalid characters in containerID")
                .with_details(id.to_string()),
        );
    }
    Ok(())
}

/// The kernel's interface-name rules, as `skel` checks them.
fn validate_ifname(name: &str) -> Result<(), CniError> {
    let problem = if name.len() > 15 {
        Some((
            "interface name is too long",
            "interface name should be less than 16 characters",
        ))
    } else if name == "." || name == ".." {
        Some(("interface name is . or ..", ""))
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some((
            "interface name contains / or : or whitespace characters",
            "",
        ))
    } else if name.chars().any(char::is_control) {
        // The kernel refuses these too; found by review, a NUL reached the store's index keys.
        Some(("interface name contains control characters", ""))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some((msg, details)) => {
            let err = CniError::new(code::INVALID_ENV, msg);
            Err(if details.is_empty() {
                err
            } else {
                err.with_details(details)
            })
        }
    }
}

/// The longest `CNI_NETNS` accepted (the kernel's `PATH_MAX`).
const MAX_NETNS_BYTES: usize = 4096;

/// `CNI_NETNS` is the path of the sandbox's network namespace: absolute (a relative path would
/// be looked up against whatever directory a later command runs in), within `PATH_MAX`, and
/// free of control characters.
fn validate_netns(netns: &str) -> Result<(), CniError> {
    let why = if !netns.starts_with('/') {
        "must be an absolute path"
    } else if netns.len() > MAX_NETNS_BYTES {
        "is longer than PATH_MAX (4096 bytes)"
    } else if netns.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(CniError::new(
        code::INVALID_ENV,
        format!("CNI_NETNS {} {why}", shown(netns)),
    ))
}

/// A value for an error message: quoted, escaped, and cut after 64 characters.
pub(crate) fn shown(value: &str) -> String {
    let head: String = value.chars().take(64).collect();
    if head.len() < value.len() {
        format!("{head:?}… ({} bytes)", value.len())
    } else {
        format!("{head:?}")
    }
}

/// Kubernetes rules for the pod keys (DNS-1123 subdomain for names, label for namespaces, a
/// UUID or hash for the UID), so nothing odd ever reaches the store, a log line or an Event.
fn validate_pod_key(key: &str, value: &str) -> Result<(), CniError> {
    let (ok, what) = match key {
        "K8S_POD_NAMESPACE" => (names::is_label(value), "a valid Kubernetes name"),
        "K8S_POD_UID" => (
            names::is_pod_uid(value),
            "a pod UID (a UUID or hash: letters, digits and '-', at most 64 characters)",
        ),
        _ => (names::is_subdomain(value), "a valid Kubernetes name"),
    };
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_ARGS {key}={} is not {what}", shown(value)),
        ))
    }
}

/// Parses `K=V;K=V`. Unknown keys fail unless `IgnoreUnknown` is true, as in the reference
/// plugins, except that the Kubernetes pod keys are known to ipkeep.
pub fn parse_args(text: &str) -> Result<CniArgs, CniError> {
    let mut args = CniArgs::default();
    let mut unknown = Vec::new();
    let mut ignore_unknown = false;
    for pair in text.split(';').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=').filter(|(_, v)| !v.contains('=')) else {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!("ARGS: invalid pair {pair:?}"),
            ));
        };
        match key {
            "IgnoreUnknown" => {
                ignore_unknown = match value.to_ascii_lowercase().as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => {
                        return Err(CniError::new(
                            code::INVALID_ENV,
                            format!(
                                "ARGS: error parsing value of pair {pair:?}: boolean unmarshal error: invalid input {value}"
                            ),
                        ));
                    }
                }
            }
            "IP" => {
                let addr = value.split_once('/').map_or(value, |(a, _)| a);
                args.ip = Some(parse_ip(addr).map_err(|_| {
                    CniError::new(
                        code::INVALID_ENV,
                        format!(
                            "ARGS: error parsing value of pair {pair:?}: invalid IP address {value}"
                        ),
                    )
                })?);
            }
            "K8S_POD_NAMESPACE" => {
                validate_pod_key(key, value)?;
                args.pod_namespace = Some(value.to_string());
            }
            "K8S_POD_NAME" => {
                validate_pod_key(key, value)?;
                args.pod_name = Some(value.to_string());
            }
            // An empty UID says nothing; it is not an odd one.
            "K8S_POD_UID" if value.is_empty() => args.pod_uid = None,
            "K8S_POD_UID" => {
                validate_pod_key(key, value)?;
                args.pod_uid = Some(value.to_string());
            }
            "K8S_POD_INFRA_CONTAINER_ID" => {}
            _ => unknown.push(pair),
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        let list: Vec<String> = unknown.iter().map(|p| format!("{p:?}")).collect();
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("ARGS: unknown args [{}]", list.join(" ")),
        ));
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn msg(pairs: &[(&str, &str)]) -> String {
        parse(&env(pairs)).expect_err("should fail").msg
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    fn add_with(key: &str, value: &str) -> Vec<(&'static str, String)> {
        ADD.iter()
            .map(|(k, v)| {
                (
                    *k,
                    if *k == key {
                        value.to_string()
                    } else {
                        v.to_string()
                    },
                )
            })
            .collect()
    }

    fn parse_with(key: &str, value: &str) -> Result<Invocation, CniError> {
        let e: HashMap<String, String> = add_with(key, value)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        parse(&e)
    }

    #[test]
    fn required_variables_per_command() {
        assert_eq!(msg(&[]), "required env variables [CNI_COMMAND] missing");
        assert_eq!(msg(&[("CNI_COMMAND", "FOO")]), "unknown CNI_COMMAND: FOO");
        assert_eq!(
            msg(&[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "e1"),
                ("CNI_NETNS", "/x")
            ]),
            "required env variables [CNI_IFNAME,CNI_PATH] missing"
        );
        let del = parse(&env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/p"),
        ]));
        assert!(del.is_ok(), "DEL needs no CNI_NETNS");
        assert!(parse(&env(&[("CNI_COMMAND", "VERSION")])).is_ok());
        assert!(parse(&env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/p")])).is_ok());
        assert_eq!(parse(&env(ADD)).expect("ok").container_id, "c1");
    }

    #[test]
    fn path_traversal_and_bad_names_are_refused() {
        for bad in ["../../etc", "a/b", ".x", "a b", ""] {
            let r = parse_with("CNI_CONTAINERID", bad);
            assert!(r.is_err(), "{bad:?}");
        }
        for bad in [
            "../x",
            "a/b",
            "eth0:1",
            "..",
            "0123456789abcdef",
            "a b",
            "eth0\0x",
            "e\u{7f}",
        ] {
            let e = parse_with("CNI_IFNAME", bad).expect_err(bad);
            assert_eq!(e.code, code::INVALID_ENV, "{bad:?}");
        }
        for bad in [
            "K8S_POD_NAME=../etc",
            "K8S_POD_NAMESPACE=a/b",
            "K8S_POD_NAME=Web",
            "K8S_POD_NAMESPACE=a.b",
        ] {
            let e = parse_args(bad).expect_err(bad);
            assert_eq!(e.code, code::INVALID_ENV, "{bad:?}");
        }
    }

    /// A pod UID is refused unless it is short and printable, and `CNI_NETNS` unless it is
    /// absolute: both are stored with the addresses and shown to admins as given.
    #[test]
    fn pod_uids_and_network_namespaces_are_checked_where_decoded() {
        let long = "f".repeat(10_000);
        for bad in ["u\n1", long.as_str(), "a b", "a/b", "a,b"] {
            let e = parse_args(&format!("K8S_POD_UID={bad}")).expect_err(bad);
            assert_eq!(e.code, code::INVALID_ENV, "{bad:?}");
            assert!(e.msg.len() < 200, "the message stays short: {}", e.msg);
        }
        let uuid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let args = parse_args(&format!("K8S_POD_UID={uuid}")).expect("a UUID");
        assert_eq!(args.pod_uid.as_deref(), Some(uuid));
        assert_eq!(parse_args("K8S_POD_UID=").expect("empty").pod_uid, None);
        let long_path = format!("/{}", "x".repeat(5_000));
        for bad in [
            "relative/netns",
            "netns",
            long_path.as_str(),
            "/run/netns/a\nb",
        ] {
            let e = parse_with("CNI_NETNS", bad).expect_err(bad);
            assert_eq!(e.code, code::INVALID_ENV, "{bad:?}");
            assert!(e.msg.starts_with("CNI_NETNS "), "{}", e.msg);
        }
        assert!(parse_with("CNI_NETNS", "/proc/4242/ns/net").is_ok());
        // DEL does not use it, and never fails on it.
        let del = parse(&env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "relative"),
            ("CNI_PATH", "/p"),
        ]));
        assert!(del.is_ok(), "{del:?}");
    }

    #[test]
    fn cni_args() {
        let a = parse_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1;IP=10.1.2.3/24;FOO=bar").expect("args");
        assert_eq!(a.ip, Some("10.1.2.3".parse().expect("ip")));
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.pod_namespace.as_deref(), Some("db"));
        assert_eq!(a.pod_uid.as_deref(), Some("u-1"));
        assert_eq!(
            parse_args("ip=10.0.0.1").expect_err("case").msg,
            "ARGS: unknown args [\"ip=10.0.0.1\"]"
        );
        assert_eq!(
            parse_args("IP=notanip").expect_err("ip").msg,
            "ARGS: error parsing value of pair \"IP=notanip\": invalid IP address notanip"
        );
        assert_eq!(
            parse_args("novalue").expect_err("pair").msg,
            "ARGS: invalid pair \"novalue\""
        );
        assert!(
            parse_args("K8S_POD_NAME=web-0").is_ok(),
            "pod keys are known without IgnoreUnknown"
        );
    }
}
