//! The network configuration on stdin: decoding in the reference plugins' order (JSON, then
//! `cniVersion`, then the typed document) and validation of the `ipam` section.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipkeep_ipam::range::{RangeError, RangeSet, RangeSpec, parse_ip};
use ipkeep_ipam::{Attachment, Retention, RetentionPolicy};
use ipkeep_values::keys::PERSISTENT_POD_STATE;
use ipkeep_values::names;
use serde::Deserialize;

use crate::error::{CniError, code};
use crate::result::Route;
use crate::version::{self, CniVersion};

/// Largest configuration accepted on stdin.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;
/// Where state lives when `ipam.dataDir` is not set.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/ipkeep";
/// How long a command waits for the network lock by default.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `ipam.lockTimeout` accepted: past this the runtime has given up anyway.
pub const MAX_LOCK_TIMEOUT: Duration = Duration::from_secs(600);
/// Where the plugin looks for the node agent unless `ipam.agentSocket` says otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/ipkeep/agent.sock";
/// The runtimeConfig key under which containerd and CRI-O pass pod annotations.
pub const POD_ANNOTATIONS_KEY: &str = "io.kubernetes.cri.pod-annotations";

/// The parts of a network configuration ipkeep reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    /// Network name (the state directory's name).
    #[serde(default)]
    pub name: Option<String>,
    /// The IPAM section.
    #[serde(default)]
    pub ipam: Option<IpamConf>,
    /// Capabilities passed by the runtime.
    #[serde(default)]
    pub runtime_config: RuntimeConfig,
    /// The `args` convention.
    #[serde(default)]
    pub args: Option<ArgsConf>,
    /// The previous result (CHECK).
    #[serde(default)]
    pub prev_result: Option<serde_json::Value>,
    /// GC: attachments still in use (CNI 1.1).
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<AttachmentConf>>,
    /// GC: the older spelling of the same list.
    #[serde(default, rename = "cni.dev/attachments")]
    pub attachments: Option<Vec<AttachmentConf>>,
}

/// The `ipam` object: host-local's keys plus ipkeep's own.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamConf {
    /// Range sets.
    #[serde(default)]
    pub ranges: Vec<Vec<RangeSpec>>,
    /// Legacy single range: subnet.
    #[serde(default)]
    pub subnet: Option<String>,
    /// Legacy single range: rangeStart.
    #[serde(default)]
    pub range_start: Option<String>,
    /// Legacy single range: rangeEnd.
    #[serde(default)]
    pub range_end: Option<String>,
    /// Legacy single range: gateway.
    #[serde(default)]
    pub gateway: Option<String>,
    /// Routes copied into the result.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// State directory (default [`DEFAULT_DATA_DIR`]).
    #[serde(default)]
    pub data_dir: Option<String>,
    /// resolv.conf-style file parsed into the result's `dns`.
    #[serde(default)]
    pub resolv_conf: Option<String>,
    /// Default retention for named pods (`30m`, `24h`, `forever`, `0`).
    #[serde(default)]
    pub retention: Option<String>,
    /// Longest wait for the network lock (`10s` default, at most [`MAX_LOCK_TIMEOUT`]).
    #[serde(default)]
    pub lock_timeout: Option<String>,
    /// The longest retention honoured for a pod's annotations when no PersistentPodState
    /// manages the pod (default `0`: such annotations are ignored).
    #[serde(default)]
    pub max_unmanaged_retention: Option<String>,
    /// How long an address freed by a pod that is gone is kept from a different pod while
    /// other addresses are free (default [`DEFAULT_REUSE_COOLDOWN`], `0`: off).
    #[serde(default)]
    pub reuse_cooldown: Option<String>,
    /// The node agent's socket (read by `relay`; default `/run/ipkeep/agent.sock`, empty: never
    /// use the agent).
    #[serde(default)]
    pub agent_socket: Option<String>,
    /// Append logs to this file instead of stderr.
    #[serde(default)]
    pub log_file: Option<String>,
    /// `error`, `warn`, `info`, `debug` or `trace`; unset: `info` when logging to
    /// `ipam.logFile`, `warn` on stderr (`logs.rs`).
    #[serde(default)]
    pub log_level: Option<String>,
}

/// `runtimeConfig`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConfig {
    /// Capability `ips`.
    #[serde(default)]
    pub ips: Vec<String>,
    /// Capability `ipRanges` (prepended to the configured sets).
    #[serde(default)]
    pub ip_ranges: Vec<Vec<RangeSpec>>,
    /// Capability `io.kubernetes.cri.pod-annotations`.
    #[serde(default, rename = "io.kubernetes.cri.pod-annotations")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
}

/// `args`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ArgsConf {
    /// `args.cni`.
    #[serde(default)]
    pub cni: Option<ArgsCni>,
}

/// `args.cni`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ArgsCni {
    /// `args.cni.ips`.
    #[serde(default)]
    pub ips: Vec<String>,
}

/// One entry of the GC lists.
#[derive(Debug, Clone, Deserialize)]
pub struct AttachmentConf {
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

impl From<&AttachmentConf> for Attachment {
    fn from(a: &AttachmentConf) -> Self {
        Attachment {
            container_id: a.container_id.clone(),
            ifname: a.ifname.clone(),
        }
    }
}

/// A network configuration, decoded and validated once: its version, name, the `ipam` settings
/// every command reads, the retention policy and the allocation plan; the rest stays in `conf`
/// for the commands that need it.
///
/// The policy and the plan hold their error instead of failing the decode: ADD, CHECK and STATUS
/// fail with the plan's error, while DEL needs only the name and the data directory, so a range
/// configuration that has since become invalid cannot strand addresses.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The configuration's `cniVersion`.
    pub version: CniVersion,
    /// The typed configuration (its `ipam` moved to [`Self::ipam`]).
    pub conf: NetConf,
    /// The validated network name.
    pub name: String,
    /// The `ipam` section.
    pub ipam: IpamConf,
    /// The validated settings of the `ipam` section.
    pub settings: Settings,
    /// Pod annotations that could not be read and were dropped from `conf`, each with why:
    /// ADD logs them as warnings (an annotation never fails a command).
    pub ignored_annotations: Vec<String>,
    /// `ipam.retention` and `ipam.maxUnmanagedRetention`, or why they do not read.
    pub retention: Result<RetentionPolicy, CniError>,
    /// What ADD allocates by, or the first error of the `ipam` section (ranges, then retention,
    /// then cooldown).
    pub plan: Result<IpamPlan, CniError>,
}

/// The `ipam` settings every command reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `ipam.dataDir` (absolute).
    pub data_dir: PathBuf,
    /// `ipam.lockTimeout`.
    pub lock_timeout: Duration,
    /// `ipam.agentSocket`; `None` when it is empty (never use the agent).
    pub agent_socket: Option<PathBuf>,
    /// `ipam.logFile`.
    pub log_file: Option<PathBuf>,
    /// `ipam.logLevel` (unreadable levels fall back to the default).
    pub log_level: Option<tracing::Level>,
}

impl Default for Settings {
    /// What applies when the configuration cannot be read (for logging its error).
    fn default() -> Self {
        Settings {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            agent_socket: Some(PathBuf::from(DEFAULT_AGENT_SOCKET)),
            log_file: None,
            log_level: None,
        }
    }
}

impl Settings {
    fn read(ipam: &IpamConf) -> Result<Settings, CniError> {
        let dir = ipam.data_dir.as_deref().unwrap_or(DEFAULT_DATA_DIR);
        let data_dir = PathBuf::from(dir);
        if !data_dir.is_absolute() {
            return Err(invalid(format!(
                "ipam.dataDir {dir:?} must be an absolute path"
            )));
        }
        let lock_timeout = match &ipam.lock_timeout {
            None => DEFAULT_LOCK_TIMEOUT,
            Some(t) => parse_lock_timeout(t).map_err(|why| {
                invalid(format!(
                    "invalid ipam.lockTimeout {:?}: {why}",
                    t.chars().take(64).collect::<String>()
                ))
            })?,
        };
        let agent_socket = match ipam.agent_socket.as_deref() {
            None => Some(PathBuf::from(DEFAULT_AGENT_SOCKET)),
            Some("") => None,
            Some(p) if PathBuf::from(p).is_absolute() => Some(PathBuf::from(p)),
            Some(p) => {
                return Err(invalid(format!(
                    "ipam.agentSocket {p:?} must be an absolute path, or empty to never use the agent"
                )));
            }
        };
        Ok(Settings {
            data_dir,
            lock_timeout,
            agent_socket,
            log_file: ipam.log_file.as_deref().map(PathBuf::from),
            log_level: ipam.log_level.as_deref().and_then(|l| l.parse().ok()),
        })
    }
}

/// Reads a lock timeout, the one grammar of `ipam.lockTimeout` and of the admin commands' and
/// the agent's `--lock-timeout`: a duration such as `10s` (surrounding blanks ignored), at most
/// [`MAX_LOCK_TIMEOUT`], so that no deadline computed from it can overflow.
pub fn parse_lock_timeout(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .ok()
        .filter(|d| *d <= MAX_LOCK_TIMEOUT)
        .ok_or_else(|| {
            format!(
                "expected a duration such as 10s, at most {}",
                humantime::format_duration(MAX_LOCK_TIMEOUT)
            )
        })
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg)
}

/// Decodes stdin: JSON syntax (code 6), `cniVersion` (1, or 7 when missing), the typed
/// document (7, with the path of the offending key), the network name (7).
/// The retention policy and the ipam plan are validated here too, their errors held in the
/// result ([`NetworkConfig::plan`]).
pub fn decode(stdin: &[u8]) -> Result<NetworkConfig, CniError> {
    if stdin.len() > MAX_CONFIG_BYTES {
        return Err(CniError::new(
            code::DECODE_FAILURE,
            format!("network configuration on stdin is larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODE_FAILURE,
            format!("error unmarshall network config: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(CniError::new(
            code::DECODE_FAILURE,
            "error unmarshall network config: expected a JSON object",
        ));
    }
    let version = version::from_config(&value)?;
    let mut conf: NetConf = serde_path_to_error::deserialize(value).map_err(|e| {
        invalid(format!(
            "invalid network configuration at {}: {}",
            e.path(),
            e.inner()
        ))
    })?;
    let name = conf.name.clone().unwrap_or_default();
    ipkeep_ipam::validate_network_name(&name).map_err(|e| {
        let err = invalid(e.to_string());
        if name.is_empty() {
            err
        } else {
            err.with_details(name.clone())
        }
    })?;
    let ipam = conf
        .ipam
        .take()
        .ok_or_else(|| invalid("IPAM config missing 'ipam' key"))?;
    let settings = Settings::read(&ipam)?;
    let ignored_annotations = conf
        .runtime_config
        .pod_annotations
        .as_mut()
        .map(drop_unreadable_link)
        .into_iter()
        .flatten()
        .collect();
    let retention = retention_policy(&ipam);
    let plan = plan(version, &conf, &ipam, &retention);
    Ok(NetworkConfig {
        version,
        conf,
        name,
        ipam,
        settings,
        ignored_annotations,
        retention,
        plan,
    })
}

/// Drops a `ipkeep.dev/persistent-pod-state` that cannot name a PersistentPodState (the webhook
/// only ever writes object names): the pod then counts as managed by none, and the value is
/// neither trusted nor stored with its addresses. Returns why, for the log.
fn drop_unreadable_link(annotations: &mut BTreeMap<String, String>) -> Option<String> {
    let link = annotations.get(PERSISTENT_POD_STATE)?.trim();
    if link.is_empty() || names::is_subdomain(link) {
        return None;
    }
    let why = format!(
        "invalid annotation {PERSISTENT_POD_STATE} value {}: not a PersistentPodState name (a DNS-1123 subdomain of at most {} characters); ignored, so no PersistentPodState manages this pod",
        crate::env::shown(link),
        names::MAX_SUBDOMAIN
    );
    annotations.remove(PERSISTENT_POD_STATE);
    Some(why)
}

/// What an ADD-like command needs from the `ipam` section, validated.
#[derive(Debug, Clone)]
pub struct IpamPlan {
    /// Range sets in allocation order: `runtimeConfig.ipRanges`, legacy `subnet`, `ranges`.
    pub range_sets: Vec<RangeSet>,
    /// Routes for the result.
    pub routes: Vec<Route>,
    /// resolv.conf path.
    pub resolv_conf: Option<PathBuf>,
    /// Which retention pods get.
    pub retention: RetentionPolicy,
    /// `ipam.reuseCooldown`, in seconds.
    pub reuse_cooldown: u64,
}

/// `ipam.reuseCooldown` when the configuration does not set it: five minutes. Longer than the
/// 30 s a cluster DNS answer is cached (CoreDNS's default TTL) plus the seconds Endpoints take to
/// reach every node, and than two rounds of a client's reconnect backoff (gRPC's longest default
/// is 120 s), so a client that kept a gone pod's address gives up on it before a stranger gets
/// it. It costs nothing while other addresses are free: cooling addresses are used last.
pub const DEFAULT_REUSE_COOLDOWN: u64 = 300;

/// The network's retention rules (`ipam.retention`, `ipam.maxUnmanagedRetention`).
fn retention_policy(ipam: &IpamConf) -> Result<RetentionPolicy, CniError> {
    let read = |key: &str, value: &Option<String>| match value {
        None => Ok(Retention::Off),
        Some(text) => Retention::parse(key, text).map_err(|e| invalid(e.to_string())),
    };
    Ok(RetentionPolicy {
        default: read("ipam.retention", &ipam.retention)?,
        max_unmanaged: read("ipam.maxUnmanagedRetention", &ipam.max_unmanaged_retention)?,
    })
}

/// Validates the whole `ipam` section.
fn plan(
    version: CniVersion,
    conf: &NetConf,
    ipam: &IpamConf,
    retention: &Result<RetentionPolicy, CniError>,
) -> Result<IpamPlan, CniError> {
    let mut specs: Vec<&[RangeSpec]> = Vec::new();
    specs.extend(conf.runtime_config.ip_ranges.iter().map(Vec::as_slice));
    let legacy;
    if ipam.subnet.is_some() {
        legacy = [RangeSpec {
            subnet: ipam.subnet.clone(),
            range_start: ipam.range_start.clone(),
            range_end: ipam.range_end.clone(),
            gateway: ipam.gateway.clone(),
        }];
        specs.push(&legacy);
    }
    specs.extend(ipam.ranges.iter().map(Vec::as_slice));
    if specs.is_empty() {
        return Err(invalid("no IP ranges specified"));
    }
    let range_sets = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            RangeSet::from_specs(s).map_err(|e| match e {
                RangeError::InvalidIp(_) | RangeError::InvalidCidr(_) => invalid(e.to_string()),
                other => invalid(format!("invalid range set {i}: {other}")),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !version.allows_multiple_per_family() {
        let v4 = range_sets.iter().filter(|s| s.is_ipv4()).count();
        if v4 > 1 || range_sets.len() - v4 > 1 {
            return Err(invalid(format!(
                "CNI version {version} does not support more than 1 address per family"
            )));
        }
    }
    for (i, a) in range_sets.iter().enumerate() {
        if let Some(j) = range_sets[i + 1..].iter().position(|b| a.overlaps(b)) {
            return Err(invalid(format!(
                "range set {i} overlaps with {}",
                i + 1 + j
            )));
        }
    }
    Ok(IpamPlan {
        range_sets,
        routes: ipam.routes.clone(),
        resolv_conf: ipam.resolv_conf.as_ref().map(PathBuf::from),
        retention: retention.clone()?,
        reuse_cooldown: match &ipam.reuse_cooldown {
            None => DEFAULT_REUSE_COOLDOWN,
            Some(text) => match Retention::parse("ipam.reuseCooldown", text)
                .map_err(|e| invalid(e.to_string()))?
            {
                Retention::Off => 0,
                Retention::Seconds(s) => s,
                Retention::Forever => u64::MAX,
            },
        },
    })
}

impl NetworkConfig {
    /// The validated plan, or the error the decode found in the `ipam` section.
    pub fn ipam_plan(&self) -> Result<&IpamPlan, CniError> {
        self.plan.as_ref().map_err(Clone::clone)
    }

    /// Requested addresses in host-local's order (`CNI_ARGS IP`, `args.cni.ips`,
    /// `runtimeConfig.ips`), prefixes stripped, duplicates dropped.
    pub fn requested_ips(&self, from_env: Option<IpAddr>) -> Result<Vec<IpAddr>, CniError> {
        let mut out: Vec<IpAddr> = from_env.into_iter().collect();
        let from_args = self
            .conf
            .args
            .iter()
            .flat_map(|a| a.cni.iter())
            .flat_map(|c| c.ips.iter());
        for text in from_args.chain(self.conf.runtime_config.ips.iter()) {
            let addr = text.split_once('/').map_or(text.as_str(), |(a, _)| a);
            let ip = parse_ip(addr)
                .map_err(|_| invalid(format!("invalid requested IP address {text:?}")))?;
            if !out.contains(&ip) {
                out.push(ip);
            }
        }
        Ok(out)
    }

    /// The GC list: `cni.dev/valid-attachments`, else `cni.dev/attachments`.
    pub fn valid_attachments(&self) -> Result<Vec<Attachment>, CniError> {
        let list = self
            .conf
            .valid_attachments
            .as_ref()
            .or(self.conf.attachments.as_ref())
            .ok_or_else(|| {
                invalid("GC needs \"cni.dev/valid-attachments\" in the configuration; refusing to guess which attachments are still in use")
            })?;
        Ok(list.iter().map(Attachment::from).collect())
    }

    /// IP addresses listed in `prevResult` (CHECK), in any result version's shape.
    pub fn previous_ips(&self) -> Vec<IpAddr> {
        let Some(prev) = &self.conf.prev_result else {
            return Vec::new();
        };
        let mut texts: Vec<&str> = Vec::new();
        if let Some(ips) = prev.get("ips").and_then(|v| v.as_array()) {
            texts.extend(ips.iter().filter_map(|i| i.get("address")?.as_str()));
        }
        for key in ["ip4", "ip6"] {
            texts.extend(prev.get(key).and_then(|o| o.get("ip")?.as_str()));
        }
        texts
            .into_iter()
            .filter_map(|t| parse_ip(t.split_once('/').map_or(t, |(a, _)| a)).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_str(s: &str) -> Result<NetworkConfig, CniError> {
        decode(s.as_bytes())
    }

    fn plan_err(ipam: &str) -> CniError {
        let conf = format!(r#"{{"cniVersion":"1.0.0","name":"n","ipam":{ipam}}}"#);
        decode_str(&conf).and_then(|d| d.plan).expect_err(ipam)
    }

    #[test]
    fn decode_errors_have_the_right_codes() {
        assert_eq!(
            decode_str(r#"{"cniVersion":"1.0.0","name":"bad","#)
                .expect_err("syntax")
                .code,
            code::DECODE_FAILURE
        );
        assert_eq!(
            decode_str("[]").expect_err("array").code,
            code::DECODE_FAILURE
        );
        assert_eq!(
            decode_str(r#"{"name":"n"}"#).expect_err("no version").code,
            code::INVALID_CONFIG
        );
        assert_eq!(
            decode_str(r#"{"cniVersion":"9.9.9","name":"n"}"#)
                .expect_err("version")
                .code,
            code::INCOMPATIBLE_VERSION
        );
        let e = decode_str(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":"x"}}"#)
            .expect_err("type");
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("ipam.ranges"), "{}", e.msg);
        let e = decode_str(r#"{"cniVersion":"1.0.0","name":"a/b"}"#).expect_err("name");
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_deref()),
            (7, "invalid characters found in network name", Some("a/b"))
        );
        assert_eq!(
            decode_str(r#"{"cniVersion":"1.0.0"}"#)
                .expect_err("name")
                .msg,
            "missing network name"
        );
        let huge = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","pad":"{}"}}"#,
            "x".repeat(MAX_CONFIG_BYTES)
        );
        assert_eq!(
            decode_str(&huge).expect_err("huge").code,
            code::DECODE_FAILURE
        );
        let deep = "[".repeat(10_000);
        assert_eq!(
            decode_str(&deep).expect_err("deep").code,
            code::DECODE_FAILURE
        );
    }

    #[test]
    fn ipam_validation_messages() {
        let cases = [
            (r#"{}"#, "no IP ranges specified"),
            (r#"{"ranges":[[]]}"#, "invalid range set 0: empty range set"),
            (
                r#"{"ranges":[[{"subnet":"10.0.0.0"}]]}"#,
                "invalid CIDR address: 10.0.0.0",
            ),
            (
                r#"{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.128/25"}]]}"#,
                "range set 0 overlaps with 1",
            ),
            (
                r#"{"ranges":[[{"subnet":"10.0.0.0/24","gateway":"nope"}]]}"#,
                "invalid IP address: nope",
            ),
            (
                r#"{"ranges":[[{"subnet":"10.0.0.0/24"}]],"dataDir":"rel"}"#,
                "ipam.dataDir \"rel\" must be an absolute path",
            ),
            (
                r#"{"ranges":[[{"subnet":"10.0.0.0/24"}]],"retention":"soon"}"#,
                "invalid ipam.retention value \"soon\"",
            ),
        ];
        for (ipam, want) in cases {
            let e = plan_err(ipam);
            assert_eq!(e.code, code::INVALID_CONFIG);
            assert!(e.msg.starts_with(want), "{} vs {want}", e.msg);
        }
        let conf = r#"{"cniVersion":"0.2.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24"}]]}}"#;
        assert_eq!(
            decode_str(conf).and_then(|d| d.plan).expect_err("020").msg,
            "CNI version 0.2.0 does not support more than 1 address per family"
        );
        assert_eq!(
            decode_str(r#"{"cniVersion":"1.0.0","name":"n"}"#)
                .expect_err("no ipam")
                .msg,
            "IPAM config missing 'ipam' key"
        );
    }

    #[test]
    fn settings_are_read_once_and_bounded() {
        let settings = |ipam: &str| {
            decode_str(&format!(
                r#"{{"cniVersion":"1.0.0","name":"n","ipam":{ipam}}}"#
            ))
            .map(|d| d.settings)
        };
        assert_eq!(settings("{}").expect("defaults"), Settings::default());
        let s = settings(
            r#"{"dataDir":"/d","lockTimeout":"2s","agentSocket":"","logFile":"/l","logLevel":"debug"}"#,
        )
        .expect("read");
        assert_eq!(
            (
                s.data_dir.to_str(),
                s.lock_timeout,
                s.agent_socket,
                s.log_level
            ),
            (
                Some("/d"),
                Duration::from_secs(2),
                None,
                Some(tracing::Level::DEBUG)
            )
        );
        // A lockTimeout past MAX_LOCK_TIMEOUT is refused, so no deadline computed from it overflows.
        for bad in [
            r#"{"lockTimeout":"1000000000000h"}"#,
            r#"{"lockTimeout":"11m"}"#,
            r#"{"lockTimeout":"soon"}"#,
            r#"{"agentSocket":"relative.sock"}"#,
            r#"{"dataDir":"rel"}"#,
        ] {
            let e = settings(bad).expect_err(bad);
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}: {e}");
        }
    }

    #[test]
    fn range_set_order_and_requested_ips() {
        let conf = r#"{"cniVersion":"1.0.0","name":"n",
            "runtimeConfig":{"ipRanges":[[{"subnet":"10.31.0.0/24"}]],"ips":["10.30.0.70/24","fd00::7"]},
            "args":{"cni":{"ips":["10.30.0.60","fd00::7"]}},
            "ipam":{"subnet":"10.29.0.0/24","ranges":[[{"subnet":"10.30.0.0/24"}]]}}"#;
        let d = decode_str(conf).expect("decoded");
        let plan = d.ipam_plan().expect("plan");
        let firsts: Vec<String> = plan.range_sets.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            firsts,
            [
                "10.31.0.1-10.31.0.254",
                "10.29.0.1-10.29.0.254",
                "10.30.0.1-10.30.0.254"
            ]
        );
        let req = d
            .requested_ips(Some("10.30.0.50".parse().expect("ip")))
            .expect("ips");
        let req: Vec<String> = req.iter().map(|i| i.to_string()).collect();
        assert_eq!(req, ["10.30.0.50", "10.30.0.60", "fd00::7", "10.30.0.70"]);
    }
}
