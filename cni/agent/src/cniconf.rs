//! The node's CNI configuration, written by the agent from a template and its Node's pod CIDRs
//! (`--cni-conf-template`, `--cni-conf-out`): a host-local-style network needs each node's own
//! subnet in its configuration, and the Node's `spec.podCIDRs` is where Kubernetes says what it
//! is. In the template, an IPAM range whose `subnet` is `usePodCidr` (the spelling Calico's
//! host-local support uses) becomes the Node's IPv4 pod CIDR, and `usePodCidrIPv6` its IPv6
//! one; everything else is copied as it is. [`render`] is pure; [`write_if_changed`] writes
//! atomically, so the container runtime reads the old file or the new one, never half of one.
//!
//! The Node's pod CIDRs are checked before they are written: a CIDR that is not its own network
//! address, or wider than any node's share of a cluster's range, would make the node hand out
//! other nodes' addresses, so nothing is written and the agent says why.

use std::io::Write as _;
use std::path::Path;

use ipkeep_ipam::range::parse_cidr;
use ipnetwork::IpNetwork;
use serde_json::Value;

use crate::cluster::Readiness;

/// The `subnet` placeholder for the Node's IPv4 pod CIDR.
pub const POD_CIDR: &str = "usePodCidr";
/// The `subnet` placeholder for the Node's IPv6 pod CIDR.
pub const POD_CIDR_V6: &str = "usePodCidrIPv6";

/// The shortest IPv4 pod CIDR prefix accepted from a Node. A node's range is a slice of the
/// cluster's (kube-controller-manager gives /24s by default); a /8 is already a whole private
/// network, and anything wider would hand out addresses that belong elsewhere.
pub const MIN_POD_CIDR_PREFIX_V4: u8 = 8;
/// The shortest IPv6 pod CIDR prefix accepted from a Node (nodes get /64s by default; a /48 is
/// a whole site's allocation).
pub const MIN_POD_CIDR_PREFIX_V6: u8 = 48;

/// Why a template cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    /// Not JSON, or not a network configuration list.
    #[error("the CNI configuration template is not a configuration list: {0}")]
    Template(String),
    /// The template asks for a pod CIDR of a family the Node has none of.
    #[error(
        "the template uses {placeholder} but the Node has no {family} pod CIDR (spec.podCIDRs: [{cidrs}])"
    )]
    NoCidr {
        /// The placeholder found.
        placeholder: &'static str,
        /// "IPv4" or "IPv6".
        family: &'static str,
        /// What the Node has.
        cidrs: String,
    },
    /// A pod CIDR of the Node that must not become a node's range.
    #[error("the Node's pod CIDR {cidr:?} is refused: {why}")]
    PodCidr {
        /// The CIDR as the Node has it.
        cidr: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Checks one of the Node's pod CIDRs: a CIDR, its own network address, no wider than
/// [`MIN_POD_CIDR_PREFIX_V4`] / [`MIN_POD_CIDR_PREFIX_V6`], and with room for pods.
pub fn check_pod_cidr(text: &str) -> Result<IpNetwork, RenderError> {
    let refuse = |why: String| RenderError::PodCidr {
        cidr: text.chars().take(80).collect(),
        why,
    };
    let net = parse_cidr(text).map_err(|_| refuse("not an address/prefix CIDR".into()))?;
    let (min, max) = if net.is_ipv4() {
        (MIN_POD_CIDR_PREFIX_V4, 30)
    } else {
        (MIN_POD_CIDR_PREFIX_V6, 126)
    };
    if net.ip() != net.network() {
        return Err(refuse(format!(
            "the address has host bits set (its network address is {}/{})",
            net.network(),
            net.prefix()
        )));
    }
    if net.prefix() < min {
        return Err(refuse(format!(
            "a /{} is wider than any node's share of a cluster range (at least /{min} is expected); check the cluster CIDR and --node-cidr-mask-size of kube-controller-manager, or how your provisioning sets spec.podCIDRs",
            net.prefix()
        )));
    }
    if net.prefix() > max {
        return Err(refuse(format!(
            "a /{} leaves no address for pods (at most /{max})",
            net.prefix()
        )));
    }
    Ok(net)
}

/// The configuration list for a Node with these pod CIDRs: every `usePodCidr` /
/// `usePodCidrIPv6` subnet in any plugin's `ipam.ranges` replaced by the Node's CIDR of that
/// family. Pretty-printed, with a trailing newline. Every pod CIDR of the Node must pass
/// [`check_pod_cidr`], used or not: a Node with a wrong one needs a look before pods start.
pub fn render(template: &str, pod_cidrs: &[String]) -> Result<String, RenderError> {
    let mut conf: Value =
        serde_json::from_str(template).map_err(|e| RenderError::Template(e.to_string()))?;
    let checked = pod_cidrs
        .iter()
        .map(|c| check_pod_cidr(c))
        .collect::<Result<Vec<_>, _>>()?;
    let plugins = conf
        .get_mut("plugins")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| RenderError::Template("it has no \"plugins\" list".into()))?;
    let family = |v6: bool| checked.iter().find(|c| c.is_ipv6() == v6);
    for plugin in plugins {
        let Some(sets) = plugin
            .get_mut("ipam")
            .and_then(|ipam| ipam.get_mut("ranges"))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for range in sets.iter_mut().filter_map(Value::as_array_mut).flatten() {
            let Some(subnet) = range.get_mut("subnet") else {
                continue;
            };
            let (placeholder, v6) = match subnet.as_str() {
                Some(POD_CIDR) => (POD_CIDR, false),
                Some(POD_CIDR_V6) => (POD_CIDR_V6, true),
                _ => continue,
            };
            let cidr = family(v6).ok_or_else(|| RenderError::NoCidr {
                placeholder,
                family: if v6 { "IPv6" } else { "IPv4" },
                cidrs: pod_cidrs.join(", "),
            })?;
            *subnet = Value::String(cidr.to_string());
        }
    }
    let mut text =
        serde_json::to_string_pretty(&conf).map_err(|e| RenderError::Template(e.to_string()))?;
    text.push('\n');
    Ok(text)
}

/// Writes `text` to `path` unless the file already holds it: into a new temporary file beside
/// it (a random name, created exclusively, so nothing planted in the directory is followed or
/// reused), fsynced, then renamed over it. Returns whether it wrote.
pub fn write_if_changed(path: &Path, text: &str) -> std::io::Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(false);
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let write = || -> std::io::Result<()> {
        // A dot-name ending in .tmp: the runtime reads only *.conf, *.conflist and *.json.
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(dir)?;
        tmp.write_all(text.as_bytes())?;
        // Readable by all through this file's own descriptor (fchmod): the agent's umask (077)
        // would leave it root-only, and the runtime may not run as root; it holds no secret.
        tmp.as_file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        std::fs::File::open(dir)?.sync_all()
    };
    // Without the temporary file's random name, so a failure that repeats (a full disk) reads
    // the same every time and is logged once.
    write().map_err(|e| match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.kind().to_string()),
    })?;
    Ok(true)
}

/// Where the template is and where the configuration goes (`--cni-conf-template`,
/// `--cni-conf-out`).
#[derive(Debug, Clone)]
pub struct CniConf {
    /// The template (a mounted ConfigMap, so it is read again on every check).
    pub template: std::path::PathBuf,
    /// The node's configuration file, in the runtime's CNI configuration directory.
    pub out: std::path::PathBuf,
}

/// Keeps `conf.out` rendered from the template and this node's pod CIDRs, checking every
/// `every` until `stop`: written once the Node has pod CIDRs, and again whenever the template
/// or the CIDRs change. When the Node this agent wrote it for is deleted, the file is removed:
/// the Node's pod CIDR goes back to the pool and may be given to another node, and a node that
/// registers again usually gets a new one, so until it does no pod may start with the old range
/// (the runtime reports its network not ready meanwhile, and the node stays NotReady). Each
/// change of outcome is logged once (written, removed, waiting, failing).
pub async fn keep_written(
    cluster: crate::cluster::Cluster,
    conf: CniConf,
    every: std::time::Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    let mut tick = tokio::time::interval(every);
    let mut said = String::new();
    let mut written_for_node = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stop => return,
        }
        let cidrs = cluster.pod_cidrs();
        let outcome = match (&cidrs, cluster.readiness()) {
            (Some(cidrs), _) => check(&conf, cidrs)
                .await
                .map(|wrote| wrote.then_some(Wrote::Written)),
            (None, Readiness::NodeUnknown) if written_for_node => {
                remove(&conf).await.map(|()| Some(Wrote::Removed))
            }
            (None, _) => Err("waiting for this node's Node to have spec.podCIDRs".to_string()),
        };
        written_for_node = cidrs.is_some() || written_for_node && outcome.is_err();
        match outcome {
            Ok(Some(Wrote::Written)) => {
                tracing::info!(path = %conf.out.display(), pod_cidrs = ?cidrs, "wrote the node's CNI configuration");
                said.clear();
            }
            Ok(Some(Wrote::Removed)) => {
                tracing::warn!(path = %conf.out.display(), hint = "so no pod starts with its old pod CIDR (which may now be another node's); it is written again when the Node registers with its pod CIDR", "this node's Node object was deleted: removed the CNI configuration");
                said.clear();
            }
            Ok(None) => said.clear(),
            Err(why) if why != said => {
                tracing::warn!(path = %conf.out.display(), "CNI configuration not written: {why}");
                said = why;
            }
            Err(_) => {}
        }
    }
}

/// What a check did to the file.
enum Wrote {
    Written,
    Removed,
}

async fn remove(conf: &CniConf) -> Result<(), String> {
    let out = conf.out.clone();
    tokio::task::spawn_blocking(move || match std::fs::remove_file(&out) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("cannot remove {}: {e}", out.display()))
        }
        _ => Ok(()),
    })
    .await
    .map_err(|e| e.to_string())?
}

async fn check(conf: &CniConf, cidrs: &[String]) -> Result<bool, String> {
    let (conf, cidrs) = (conf.clone(), cidrs.to_vec());
    tokio::task::spawn_blocking(move || {
        let template = std::fs::read_to_string(&conf.template)
            .map_err(|e| format!("cannot read the template {}: {e}", conf.template.display()))?;
        let text = render(&template, &cidrs).map_err(|e| e.to_string())?;
        write_if_changed(&conf.out, &text).map_err(|e| format!("cannot write it: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TEMPLATE: &str = r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[
        {"type":"bridge","bridge":"cni0","ipam":{"type":"ipkeep",
          "ranges":[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]],
          "routes":[{"dst":"0.0.0.0/0"}]}},
        {"type":"portmap","capabilities":{"portMappings":true}}]}"#;

    fn ranges(text: &str) -> Value {
        let v: Value = serde_json::from_str(text).unwrap();
        v["plugins"][0]["ipam"]["ranges"].clone()
    }

    #[test]
    fn placeholders_become_the_nodes_cidrs_by_family() {
        let out = render(
            TEMPLATE,
            &["fd00:10:244:1::/64".into(), "10.244.1.0/24".into()],
        )
        .unwrap();
        assert_eq!(
            ranges(&out),
            serde_json::json!([[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:10:244:1::/64"}]])
        );
        assert!(out.ends_with("}\n"));
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["plugins"][1]["type"], "portmap",
            "other plugins are copied"
        );
    }

    #[test]
    fn a_missing_family_is_an_error_that_names_it() {
        let err = render(TEMPLATE, &["10.244.1.0/24".into()]).unwrap_err();
        assert_eq!(
            err,
            RenderError::NoCidr {
                placeholder: POD_CIDR_V6,
                family: "IPv6",
                cidrs: "10.244.1.0/24".into()
            }
        );
        assert!(err.to_string().contains("usePodCidrIPv6"));
        assert!(render(TEMPLATE, &[]).is_err());
    }

    #[test]
    fn fixed_subnets_and_other_shapes_are_left_alone() {
        let fixed = r#"{"plugins":[{"type":"bridge","ipam":{"type":"ipkeep","ranges":[[{"subnet":"10.9.0.0/24","gateway":"10.9.0.1"}]]}},{"type":"x","ipam":{"type":"host-local","ranges":"not a list"}},{"type":"y"}]}"#;
        let out = render(fixed, &[]).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&out).unwrap(),
            serde_json::from_str::<Value>(fixed).unwrap()
        );
    }

    #[test]
    fn templates_that_are_not_lists_are_refused() {
        assert!(matches!(render("{", &[]), Err(RenderError::Template(_))));
        assert!(matches!(
            render(r#"{"type":"bridge"}"#, &[]),
            Err(RenderError::Template(_))
        ));
    }

    /// A rewrite never follows a symlink planted at its temporary file's name: it would
    /// overwrite (and make 0644) whatever the link points at, a lease store say.
    #[test]
    fn a_symlink_planted_beside_the_configuration_is_never_followed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("leases.redb");
        std::fs::write(&victim, "the lease store").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let path = dir.path().join("10-ipkeep.conflist");
        // The names a writer could guess: the old fixed one, and the file itself.
        std::os::unix::fs::symlink(&victim, dir.path().join(".10-ipkeep.conflist.tmp")).unwrap();
        assert!(write_if_changed(&path, "{}\n").unwrap());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the lease store");
        let mode = std::fs::metadata(&victim).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the victim's mode is unchanged");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        // A symlink planted at the configuration itself is replaced, not written through.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert!(write_if_changed(&path, "[]\n").unwrap());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the lease store");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "[]\n");
    }

    /// Found running the review's conflist2.sh: with the temporary file's random name in it, the
    /// error of a full disk read differently every 2 s, and was logged every 2 s.
    #[test]
    fn a_failure_that_repeats_reads_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone/10-ipkeep.conflist");
        let first = write_if_changed(&path, "a\n").unwrap_err().to_string();
        let second = write_if_changed(&path, "a\n").unwrap_err().to_string();
        assert_eq!(first, second);
        assert!(!first.contains(".tmp"), "{first}");
    }

    /// Only a pod CIDR that can be a node's range is written into the configuration.
    #[test]
    fn pod_cidrs_that_must_not_be_a_nodes_range_are_refused() {
        for bad in [
            "10.1.2.3/8",
            "0.0.0.0/0",
            "10.244.1.0/24\",\"type\":\"evil",
            "10.244.1.0/33",
            "10.0.0.0/24/../../x",
            "10.0.0.0/7",
            "10.0.0.0/31",
            "fd00::/32",
            "fd00:10:244:1::1/64",
            "",
        ] {
            let err = render(TEMPLATE, &[bad.into(), "fd00:10:244:1::/64".into()])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("refused"), "{bad:?}: {err}");
        }
        let err = render(TEMPLATE, &["0.0.0.0/0".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("wider than any node's share"), "{err}");
        let err = render(TEMPLATE, &["10.1.2.3/8".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("network address is 10.0.0.0/8"), "{err}");
        // The widest accepted, and the canonical spelling of what was given.
        let out = render(
            TEMPLATE,
            &["10.0.0.0/8".into(), "fd00:10:0:0:0:0:0:0/48".into()],
        )
        .unwrap();
        assert_eq!(
            ranges(&out),
            serde_json::json!([[{"subnet":"10.0.0.0/8"}],[{"subnet":"fd00:10::/48"}]])
        );
    }

    #[test]
    fn writes_only_changes_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-ipkeep.conflist");
        assert!(write_if_changed(&path, "a\n").unwrap());
        assert!(!write_if_changed(&path, "a\n").unwrap());
        assert!(write_if_changed(&path, "b\n").unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("10-ipkeep.conflist")]);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
    }
}
