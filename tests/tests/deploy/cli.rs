//! What the ipkeep binaries accept on their command line, read from their `--help`, and how a
//! container's arguments and environment map onto it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use ipkeep_api::k8s_openapi::api::core::v1::Container;
use ipkeep_api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::manifests::BINARIES;

/// A binary of this build, next to the test executable (built once per test run, so it is never
/// stale). `IPKEEP_*_BIN` variables override, as for `ipkeep_bin()`.
pub fn binary(name: &str) -> PathBuf {
    static PATHS: [OnceLock<PathBuf>; BINARIES.len()] = [const { OnceLock::new() }; BINARIES.len()];
    let slot = BINARIES.iter().position(|b| *b == name);
    let slot = slot.unwrap_or_else(|| panic!("{name} is not an ipkeep binary"));
    PATHS[slot].get_or_init(|| build(name)).clone()
}

/// Builds (or finds) one binary.
fn build(name: &str) -> PathBuf {
    let (package, var) = match name {
        "ipkeep" => ("ipkeep-cni", "IPKEEP_BIN"),
        "ipkeep-agent" => ("ipkeep-agent", "IPKEEP_AGENT_BIN"),
        "ipkeep-controller" => ("ipkeep-controller", "IPKEEP_CONTROLLER_BIN"),
        _ => ("ipkeep-scheduler-ext", "IPKEEP_SCHEDULER_EXT_BIN"),
    };
    ipkeep_tests::workspace_bin(name, var, &[package])
}

/// One option of a binary, as its `--help` shows it.
#[derive(Debug, Default, Clone)]
pub struct CliOption {
    /// `--flag <VALUE>` rather than a switch.
    pub takes_value: bool,
    /// `[env: NAME=]`.
    pub env: Option<String>,
    /// `[default: VALUE]`.
    pub default: Option<String>,
}

/// What `<binary> --help` says about its command line.
#[derive(Debug, Default)]
pub struct Cli {
    /// The whole help text.
    pub help: String,
    /// By `--flag`.
    pub options: BTreeMap<String, CliOption>,
    /// Flags the usage line requires; each group needs one of its flags.
    pub required: Vec<Vec<String>>,
}

impl Cli {
    /// The command line of one of [`BINARIES`], read once per test run.
    pub fn of(binary: &str) -> &'static Cli {
        static CLIS: [OnceLock<Cli>; BINARIES.len()] = [const { OnceLock::new() }; BINARIES.len()];
        let slot = BINARIES.iter().position(|b| *b == binary);
        let slot = slot.unwrap_or_else(|| panic!("{binary} is not an ipkeep binary"));
        CLIS[slot].get_or_init(|| Cli::parse(binary))
    }

    fn parse(binary: &str) -> Cli {
        let out = Command::new(self::binary(binary))
            .arg("--help")
            .output()
            .expect("run --help");
        assert!(out.status.success(), "{binary} --help failed");
        let help = String::from_utf8(out.stdout).expect("UTF-8 help");
        let mut cli = Cli::default();
        let mut current: Option<String> = None;
        for line in help.lines() {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix("Usage: ") {
                // `[OPTIONS] --node-name <NODE_NAME>` or `[OPTIONS] <--tls-cert <TLS_CERT>|--insecure-http>`
                let rest = rest.split_once("[OPTIONS]").map_or("", |(_, r)| r).trim();
                let alternatives = rest.strip_prefix('<').and_then(|r| r.strip_suffix('>'));
                cli.required = match alternatives {
                    Some(group) => vec![group.split('|').map(first_flag).collect()],
                    None => rest
                        .split_whitespace()
                        .filter(|w| w.starts_with("--"))
                        .map(|w| vec![w.to_string()])
                        .collect(),
                };
            } else if t.starts_with("--") || (t.starts_with('-') && t.get(2..4) == Some(", ")) {
                let flag = first_flag(t);
                let option = CliOption {
                    takes_value: t.contains('<'),
                    ..CliOption::default()
                };
                cli.options.insert(flag.clone(), option);
                current = Some(flag);
            } else if let Some(flag) = &current {
                let option = cli.options.get_mut(flag).expect("current option");
                if let Some(env) = t.strip_prefix("[env: ") {
                    option.env = env.split('=').next().map(str::to_string);
                } else if let Some(default) = t.strip_prefix("[default: ") {
                    option.default = default.strip_suffix(']').map(str::to_string);
                }
            }
        }
        cli.help = help;
        cli
    }

    /// The flag an environment variable sets.
    pub fn flag_for_env(&self, env: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(_, o)| o.env.as_deref() == Some(env))
            .map(|(flag, _)| flag.as_str())
    }
}

/// `--flag` from `--flag <VALUE>`, `--flag=value` or `-h, --help`.
pub fn first_flag(text: &str) -> String {
    let text = text.trim();
    let text = text.split_once(", ").map_or(text, |(_, r)| r);
    text.split([' ', '='])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The binary a container runs, if it runs one of ours directly.
pub fn ipkeep_binary(c: &Container) -> Option<&str> {
    let program = c.command.as_ref()?.first()?.as_str();
    BINARIES.contains(&program).then_some(program)
}

/// The value a container gives `flag` (argument, literal environment variable), else the
/// binary's default.
pub fn flag_value(c: &Container, cli: &Cli, flag: &str) -> Option<String> {
    let from_args = c
        .args
        .iter()
        .flatten()
        .find_map(|a| match a.strip_prefix(flag)? {
            "" => Some("true".to_string()),
            value => value.strip_prefix('=').map(str::to_string),
        });
    let env = cli.options.get(flag).and_then(|o| o.env.clone());
    let from_env = c
        .env
        .iter()
        .flatten()
        .find(|e| Some(&e.name) == env.as_ref())
        .and_then(|e| e.value.clone());
    from_args
        .or(from_env)
        .or_else(|| cli.options.get(flag).and_then(|o| o.default.clone()))
}

/// The port of a `host:port` listen address.
pub fn port_of(address: &str) -> i32 {
    address
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {address}"))
}

/// A container port by number or name.
pub fn resolve_port(c: &Container, port: &IntOrString) -> Option<i32> {
    let ports = c.ports.iter().flatten();
    match port {
        IntOrString::Int(n) => ports.map(|p| p.container_port).find(|p| p == n),
        IntOrString::String(name) => ports
            .filter(|p| p.name.as_ref() == Some(name))
            .map(|p| p.container_port)
            .next(),
    }
}

/// Issue 41: one name per job. Every long-running binary serves its probes and metrics on
/// `--probe-listen`; scheduler-ext's webhooks are `--webhook-listen`, the agent's extra metrics
/// listener `--metrics-listen`; `--listen`, which named the probe port of the controller and
/// the webhook port of scheduler-ext, is gone from `--help` and still taken, hidden, for one
/// release (a bad value is refused under the new name, so the alias reaches it).
#[test]
fn one_flag_name_per_job_with_the_old_names_kept_hidden() {
    for binary in ["ipkeep-controller", "ipkeep-scheduler-ext", "ipkeep-agent"] {
        let cli = Cli::of(binary);
        assert!(
            cli.options.contains_key("--probe-listen"),
            "{binary}: no --probe-listen"
        );
        assert!(
            !cli.options.contains_key("--listen"),
            "{binary} --help still shows --listen"
        );
    }
    assert!(
        Cli::of("ipkeep-scheduler-ext")
            .options
            .contains_key("--webhook-listen")
    );
    assert!(
        Cli::of("ipkeep-agent")
            .options
            .contains_key("--metrics-listen")
    );
    for (binary, new) in [
        ("ipkeep-controller", "--probe-listen"),
        ("ipkeep-scheduler-ext", "--webhook-listen"),
    ] {
        let out = Command::new(self::binary(binary))
            .arg("--listen=not-an-address")
            .args(
                ["--insecure-http"]
                    .iter()
                    .filter(|_| binary == "ipkeep-scheduler-ext"),
            )
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(&format!("'{new} <")),
            "{binary} --listen=not-an-address: {err}"
        );
    }
}
