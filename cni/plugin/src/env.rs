//! The `CNI_*` environment: which variables each command needs, how they are validated (the
//! reference `skel` rules), and `CNI_ARGS`.

use std::collections::HashMap;
use std::net::IpAddr;

use ipkeep_ipam::range::parse_ip;

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

/// Kubernetes name rules for the pod keys (DNS-1123 subdomain for names, label for namespaces),
/// so nothing odd ever reaches the store or a log line.
fn validate_k8s_name(key: &str, value: &str, max: usize, allow_dots: bool) -> Result<(), CniError> {
    let ok = !value.is_empty()
        && value.len() <= max
        && value.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (allow_dots && b == b'.')
        })
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value.as_bytes()[value.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_ARGS {key}={value:?} is not a valid Kubernetes name"),
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
                validate_k8s_name(key, value, 63, false)?;
                args.pod_namespace = Some(value.to_string());
            }
            "K8S_POD_NAME" => {
                validate_k8s_name(key, value, 253, true)?;
                args.pod_name = Some(value.to_string());
            }
            "K8S_POD_UID" => args.pod_uid = Some(value.to_string()),
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
