//! The ADD result in every CNI version's shape, byte-compatible with host-local's output
//! (4-space indent, no trailing newline). Up to 0.4.0 the fields come in libcni's struct order
//! and `dns` is always present; 1.0.0 and 1.1.0 results are printed as current host-local
//! (CNI plugins 1.6 and later, libcni 1.2) prints them: through a map, so keys sorted at every
//! level, and without `dns` when it is empty.

use std::net::IpAddr;

use ipkeep_ipam::range::parse_cidr;
use ipnetwork::IpNetwork;
use serde::{Deserialize, Deserializer, Serialize};

use crate::json::to_pretty_json;
use crate::version::CniVersion;

/// A route from `ipam.routes`, copied into the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination (CIDR; host bits allowed, as in the reference plugins).
    #[serde(deserialize_with = "cidr")]
    pub dst: IpNetwork,
    /// Next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// CNI 1.1 route attributes (`mtu`, `advmss`, `priority`, `table`, `scope`), passed
    /// through for 1.1.0 results only; other keys are dropped.
    #[serde(
        flatten,
        default,
        skip_serializing,
        deserialize_with = "route_attributes"
    )]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

const ROUTE_ATTRIBUTES: &[&str] = &["mtu", "advmss", "priority", "table", "scope"];

fn route_attributes<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<serde_json::Map<String, serde_json::Value>, D::Error> {
    let mut all = serde_json::Map::deserialize(d)?;
    all.retain(|k, _| ROUTE_ATTRIBUTES.contains(&k.as_str()));
    Ok(all)
}

fn cidr<'de, D: Deserializer<'de>>(d: D) -> Result<IpNetwork, D::Error> {
    let text = String::deserialize(d)?;
    parse_cidr(&text).map_err(serde::de::Error::custom)
}

/// DNS settings parsed from `resolvConf`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dns {
    /// `nameserver` lines.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Last `domain` line.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// `search` lines.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// `options` lines.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Parses resolv.conf text the way host-local does.
    pub fn parse_resolv_conf(text: &str) -> Dns {
        let mut dns = Dns::default();
        for line in text.lines().map(str::trim) {
            if line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [key, first, rest @ ..] = fields.as_slice() else {
                continue;
            };
            match *key {
                "nameserver" => dns.nameservers.push(first.to_string()),
                "domain" => dns.domain = first.to_string(),
                "search" => dns.search.extend(fields[1..].iter().map(|s| s.to_string())),
                "options" => dns
                    .options
                    .extend(std::iter::once(first).chain(rest).map(|s| s.to_string())),
                _ => {}
            }
        }
        dns
    }
}

/// One address of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with its subnet's prefix length.
    pub address: IpNetwork,
    /// The range's gateway.
    pub gateway: IpAddr,
}

/// An IPAM result, independent of version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamResult {
    /// One address per range set.
    pub ips: Vec<IpConfig>,
    /// Routes.
    pub routes: Vec<Route>,
    /// DNS.
    pub dns: Dns,
}

#[derive(Serialize)]
struct RouteOut<'a> {
    dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gw: Option<IpAddr>,
    #[serde(flatten)]
    extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

#[derive(Serialize)]
struct IpOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
    address: String,
    gateway: IpAddr,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CurrentOut<'a> {
    cni_version: String,
    ips: Vec<IpOut>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<RouteOut<'a>>,
    dns: &'a Dns,
}

#[derive(Serialize)]
struct LegacyIpOut<'a> {
    ip: String,
    gateway: IpAddr,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<RouteOut<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LegacyOut<'a> {
    cni_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip4: Option<LegacyIpOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip6: Option<LegacyIpOut<'a>>,
    dns: &'a Dns,
}

/// A JSON value printed with the keys of every object in order, as Go prints a map.
struct Sorted<'a>(&'a serde_json::Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap as _, SerializeSeq as _};
        match self.0 {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let mut out = s.serialize_map(Some(keys.len()))?;
                for k in keys {
                    out.serialize_entry(k, &Sorted(&map[k]))?;
                }
                out.end()
            }
            serde_json::Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Sorted(item))?;
                }
                out.end()
            }
            other => other.serialize(s),
        }
    }
}

impl IpamResult {
    fn routes_out(&self, version: CniVersion, v4: Option<bool>) -> Vec<RouteOut<'_>> {
        self.routes
            .iter()
            .filter(|r| v4.is_none_or(|v4| r.dst.is_ipv4() == v4))
            .map(|r| RouteOut {
                dst: r.dst.to_string(),
                gw: r.gw,
                extra: (version >= CniVersion::LATEST && !r.extra.is_empty()).then_some(&r.extra),
            })
            .collect()
    }

    /// The result as the given version prints it.
    pub fn to_json(&self, version: CniVersion) -> String {
        if !version.has_legacy_result() && !version.has_ip_version_field() {
            let ips = self
                .ips
                .iter()
                .map(|ip| IpOut {
                    version: None,
                    address: ip.address.to_string(),
                    gateway: ip.gateway,
                })
                .collect();
            let out = CurrentOut {
                cni_version: version.to_string(),
                ips,
                routes: self.routes_out(version, None),
                dns: &self.dns,
            };
            let Ok(mut value) = serde_json::to_value(&out) else {
                return String::from("{}");
            };
            if self.dns == Dns::default()
                && let Some(map) = value.as_object_mut()
            {
                map.remove("dns");
            }
            return to_pretty_json(&Sorted(&value));
        }
        if version.has_legacy_result() {
            let family = |v4: bool| {
                self.ips
                    .iter()
                    .find(|ip| ip.address.is_ipv4() == v4)
                    .map(|ip| LegacyIpOut {
                        ip: ip.address.to_string(),
                        gateway: ip.gateway,
                        routes: self.routes_out(version, Some(v4)),
                    })
            };
            return to_pretty_json(&LegacyOut {
                cni_version: version.to_string(),
                ip4: family(true),
                ip6: family(false),
                dns: &self.dns,
            });
        }
        let ips = self
            .ips
            .iter()
            .map(|ip| IpOut {
                version: version
                    .has_ip_version_field()
                    .then_some(if ip.address.is_ipv4() { "4" } else { "6" }),
                address: ip.address.to_string(),
                gateway: ip.gateway,
            })
            .collect();
        to_pretty_json(&CurrentOut {
            cni_version: version.to_string(),
            ips,
            routes: self.routes_out(version, None),
            dns: &self.dns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> IpamResult {
        let routes: Vec<Route> = serde_json::from_str(
            r#"[{"dst":"0.0.0.0/0"},{"dst":"::/0","gw":"fd00:20::1"},{"dst":"10.9.0.5/16","mtu":1400,"junk":1}]"#,
        )
        .expect("routes");
        IpamResult {
            ips: vec![
                IpConfig {
                    address: "10.20.0.100/24".parse().expect("cidr"),
                    gateway: "10.20.0.254".parse().expect("ip"),
                },
                IpConfig {
                    address: "fd00:20::2/64".parse().expect("cidr"),
                    gateway: "fd00:20::1".parse().expect("ip"),
                },
            ],
            routes,
            dns: Dns::default(),
        }
    }

    fn v(s: &str) -> CniVersion {
        CniVersion::parse(s).expect("version")
    }

    #[test]
    fn current_shape() {
        let json = result().to_json(v("1.0.0"));
        assert!(json.starts_with("{\n    \"cniVersion\": \"1.0.0\",\n    \"ips\": [\n        {\n            \"address\": \"10.20.0.100/24\",\n            \"gateway\": \"10.20.0.254\"\n        },"), "{json}");
        assert!(
            !json.contains("dns"),
            "an empty dns is left out of 1.x: {json}"
        );
        assert!(
            json.contains("\"dst\": \"10.9.0.5/16\"") && !json.contains("mtu"),
            "host bits kept; 1.1 attributes dropped: {json}"
        );
        let v11 = result().to_json(v("1.1.0"));
        assert!(
            v11.contains("\"mtu\": 1400") && !v11.contains("junk"),
            "{v11}"
        );
        let v040 = result().to_json(v("0.4.0"));
        assert!(v040.ends_with("\"dns\": {}\n}"), "{v040}");
        let v031 = result().to_json(v("0.3.1"));
        assert!(
            v031.contains("{\n            \"version\": \"4\",\n            \"address\""),
            "{v031}"
        );
    }

    /// As plugins 1.10's host-local prints a 1.x result: every object's keys in order.
    #[test]
    fn current_results_sort_keys_at_every_level() {
        let mut r = result();
        r.dns = Dns::parse_resolv_conf(
            "nameserver 10.96.0.10\ndomain c.l\nsearch a b\noptions ndots:5\n",
        );
        r.routes.truncate(1);
        r.routes[0].gw = Some("10.20.0.1".parse().expect("ip"));
        r.routes[0].extra.insert("mtu".into(), 1400.into());
        r.ips.truncate(1);
        let keys = |json: &str| -> Vec<String> {
            json.lines()
                .filter_map(|l| l.trim().strip_prefix('"'))
                .filter_map(|l| l.split_once("\":").map(|(k, _)| k.to_string()))
                .collect()
        };
        assert_eq!(
            keys(&r.to_json(v("1.1.0"))),
            [
                "cniVersion",
                "dns",
                "domain",
                "nameservers",
                "options",
                "search",
                "ips",
                "address",
                "gateway",
                "routes",
                "dst",
                "gw",
                "mtu"
            ]
        );
        assert_eq!(
            keys(&r.to_json(v("0.4.0"))),
            [
                "cniVersion",
                "ips",
                "version",
                "address",
                "gateway",
                "routes",
                "dst",
                "gw",
                "dns",
                "nameservers",
                "domain",
                "search",
                "options"
            ]
        );
    }

    #[test]
    fn legacy_shape_splits_routes_by_family() {
        let json: serde_json::Value =
            serde_json::from_str(&result().to_json(v("0.2.0"))).expect("json");
        assert_eq!(json["ip4"]["ip"], "10.20.0.100/24");
        assert_eq!(json["ip4"]["routes"].as_array().map(Vec::len), Some(2));
        assert_eq!(json["ip6"]["routes"][0]["gw"], "fd00:20::1");
        assert_eq!(json["dns"], serde_json::json!({}));
        assert!(json.get("ips").is_none());
    }

    #[test]
    fn resolv_conf() {
        let dns = Dns::parse_resolv_conf(
            "# comment\n; other\nnameserver 10.96.0.10\nnameserver 8.8.8.8\ndomain a.local\ndomain cluster.local\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:5\nbogus\n",
        );
        assert_eq!(dns.nameservers, ["10.96.0.10", "8.8.8.8"]);
        assert_eq!(dns.domain, "cluster.local");
        assert_eq!(
            dns.search,
            ["default.svc.cluster.local", "svc.cluster.local"]
        );
        assert_eq!(dns.options, ["ndots:5"]);
        let json = to_pretty_json(&dns);
        assert!(
            json.find("nameservers") < json.find("domain")
                && json.find("search") < json.find("options")
        );
    }

    #[test]
    fn route_needs_a_cidr() {
        assert!(serde_json::from_str::<Route>(r#"{"dst":"10.0.0.1"}"#).is_err());
        assert!(serde_json::from_str::<Route>(r#"{"dst":"10.0.0.0/8","gw":"x"}"#).is_err());
    }
}
