//! Address ranges and range sets, with host-local's exact defaults, validation and round-robin
//! iteration order.
//!
//! A *range* is a subnet with an allocatable window `[rangeStart, rangeEnd]` and a gateway; a
//! *range set* is a list of ranges of one address family from which exactly one address is
//! handed out per ADD. Everything here is pure arithmetic on addresses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

/// A range exactly as it appears in the `ipam` configuration, before defaults and validation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeSpec {
    /// The subnet in CIDR form; it must be the network address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// First allocatable address (default: network + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<String>,
    /// Last allocatable address (default: broadcast - 1 for IPv4, the last address for IPv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    /// Gateway reported in results and never handed out (default: network + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// Why a range or range set is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// A range without a `subnet` key.
    #[error("range {0} has no \"subnet\"; every range needs one, e.g. \"10.22.0.0/16\"")]
    MissingSubnet(usize),
    /// The subnet is not `address/prefix`.
    #[error("invalid CIDR address: {0}")]
    InvalidCidr(String),
    /// An address field is not an IP address.
    #[error("invalid IP address: {0}")]
    InvalidIp(String),
    /// The subnet leaves fewer than two host bits.
    #[error("Network {0} too small to allocate from")]
    TooSmall(IpNetwork),
    /// The subnet is not its own network address.
    #[error(
        "Network has host bits set. For a subnet mask of length {prefix} the network address is {network}"
    )]
    HostBitsSet {
        /// Prefix length given.
        prefix: u8,
        /// What the subnet should have been.
        network: IpAddr,
    },
    /// `rangeStart` lies outside the subnet.
    #[error("RangeStart {0} not in network {1}")]
    StartOutside(IpAddr, IpNetwork),
    /// `rangeEnd` lies outside the subnet.
    #[error("RangeEnd {0} not in network {1}")]
    EndOutside(IpAddr, IpNetwork),
    /// `rangeStart` comes after `rangeEnd` (host-local reports this as "not in network").
    #[error("rangeStart {0} is after rangeEnd {1}; swap them")]
    StartAfterEnd(IpAddr, IpAddr),
    /// The gateway is not inside the subnet (host-local accepts this silently).
    #[error("gateway {0} is not inside subnet {1}")]
    GatewayOutside(IpAddr, IpNetwork),
    /// A range set with no ranges.
    #[error("empty range set")]
    EmptySet,
    /// IPv4 and IPv6 ranges in one set.
    #[error("mixed address families")]
    MixedFamilies,
    /// Two ranges of one set overlap.
    #[error("subnets {0} and {1} overlap")]
    Overlap(String, String),
}

/// One validated range with every default filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Range {
    /// The subnet; its prefix length is the prefix of every address handed out from it.
    pub subnet: IpNetwork,
    /// First allocatable address.
    pub range_start: IpAddr,
    /// Last allocatable address.
    pub range_end: IpAddr,
    /// The gateway, skipped by allocation.
    pub gateway: IpAddr,
}

/// Parses an IP address the way Go's `net.IP` does, folding IPv4-mapped IPv6 to IPv4.
pub fn parse_ip(text: &str) -> Result<IpAddr, RangeError> {
    let ip = IpAddr::from_str(text.trim()).map_err(|_| RangeError::InvalidIp(text.to_string()))?;
    Ok(canonical_ip(ip))
}

/// Folds an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) to plain IPv4, as host-local does.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses `address/prefix`; a bare address is refused (unlike `ipnetwork`, which reads it as a
/// host route).
pub fn parse_cidr(text: &str) -> Result<IpNetwork, RangeError> {
    let invalid = || RangeError::InvalidCidr(text.to_string());
    let (addr, prefix) = text.trim().split_once('/').ok_or_else(invalid)?;
    let addr = parse_ip(addr).map_err(|_| invalid())?;
    let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
    IpNetwork::new(addr, prefix).map_err(|_| invalid())
}

/// The address as a number, for arithmetic.
pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address `value` in the family of `like`.
fn u128_to_ip(value: u128, like: IpAddr) -> IpAddr {
    match like {
        // Values for IPv4 never exceed u32 by construction (they come from IPv4 arithmetic).
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(value as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

fn next_ip(ip: IpAddr) -> IpAddr {
    u128_to_ip(ip_to_u128(ip).wrapping_add(1), ip)
}

impl Range {
    /// Applies host-local's defaults and checks, plus the checks host-local forgets (start after
    /// end, gateway outside the subnet).
    pub fn from_spec(index: usize, spec: &RangeSpec) -> Result<Range, RangeError> {
        let subnet_text = spec
            .subnet
            .as_deref()
            .ok_or(RangeError::MissingSubnet(index))?;
        let subnet = parse_cidr(subnet_text)?;
        let max_prefix = if subnet.is_ipv4() { 32 } else { 128 };
        if subnet.prefix() > max_prefix - 2 {
            return Err(RangeError::TooSmall(subnet));
        }
        if subnet.ip() != subnet.network() {
            return Err(RangeError::HostBitsSet {
                prefix: subnet.prefix(),
                network: subnet.network(),
            });
        }
        let first = next_ip(subnet.network());
        let last = match subnet {
            IpNetwork::V4(v4) => u128_to_ip(ip_to_u128(IpAddr::V4(v4.broadcast())) - 1, first),
            IpNetwork::V6(v6) => u128_to_ip(
                ip_to_u128(IpAddr::V6(v6.network())) | host_mask(v6.prefix()),
                first,
            ),
        };
        let field = |value: &Option<String>| value.as_deref().map(parse_ip).transpose();
        let gateway = field(&spec.gateway)?.unwrap_or(first);
        let range_start = field(&spec.range_start)?.unwrap_or(first);
        let range_end = field(&spec.range_end)?.unwrap_or(last);
        if !subnet.contains(range_start) {
            return Err(RangeError::StartOutside(range_start, subnet));
        }
        if !subnet.contains(range_end) {
            return Err(RangeError::EndOutside(range_end, subnet));
        }
        if ip_to_u128(range_start) > ip_to_u128(range_end) {
            return Err(RangeError::StartAfterEnd(range_start, range_end));
        }
        if !subnet.contains(gateway) {
            return Err(RangeError::GatewayOutside(gateway, subnet));
        }
        Ok(Range {
            subnet,
            range_start,
            range_end,
            gateway,
        })
    }

    /// Whether `ip` lies in `[rangeStart, rangeEnd]` (same family).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.range_start.is_ipv4()
            && ip_to_u128(self.range_start) <= ip_to_u128(ip)
            && ip_to_u128(ip) <= ip_to_u128(self.range_end)
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.range_start.is_ipv4() == other.range_start.is_ipv4()
            && (self.contains(other.range_start)
                || self.contains(other.range_end)
                || other.contains(self.range_start)
                || other.contains(self.range_end))
    }

    /// How many addresses can be handed out (the window, less the gateway if inside it).
    pub fn capacity(&self) -> u128 {
        // Saturating: an explicit `::`-to-all-ones window in `::/0` has 2^128 addresses.
        let window = (ip_to_u128(self.range_end) - ip_to_u128(self.range_start)).saturating_add(1);
        window - u128::from(self.contains(self.gateway))
    }
}

fn host_mask(prefix: u8) -> u128 {
    if prefix == 0 {
        u128::MAX
    } else {
        u128::MAX >> prefix
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.range_start, self.range_end)
    }
}

/// A validated range set: one address family, no overlaps, at least one range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RangeSet {
    ranges: Vec<Range>,
}

impl RangeSet {
    /// Validates a set of range specs.
    pub fn from_specs(specs: &[RangeSpec]) -> Result<RangeSet, RangeError> {
        if specs.is_empty() {
            return Err(RangeError::EmptySet);
        }
        let ranges = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| Range::from_spec(i, spec))
            .collect::<Result<Vec<_>, _>>()?;
        if ranges
            .iter()
            .any(|r| r.range_start.is_ipv4() != ranges[0].range_start.is_ipv4())
        {
            return Err(RangeError::MixedFamilies);
        }
        for (i, a) in ranges.iter().enumerate() {
            if let Some(b) = ranges[i + 1..].iter().find(|b| a.overlaps(b)) {
                return Err(RangeError::Overlap(a.to_string(), b.to_string()));
            }
        }
        Ok(RangeSet { ranges })
    }

    /// The ranges, in configuration order.
    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// Whether the set hands out IPv4 addresses.
    pub fn is_ipv4(&self) -> bool {
        self.ranges[0].range_start.is_ipv4()
    }

    /// The range holding `ip`, if any.
    pub fn range_of(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    /// Whether any range of this set overlaps any range of `other`.
    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.ranges
            .iter()
            .any(|a| other.ranges.iter().any(|b| a.overlaps(b)))
    }

    /// Total number of addresses that can be handed out.
    pub fn capacity(&self) -> u128 {
        self.ranges
            .iter()
            .fold(0u128, |total, r| total.saturating_add(r.capacity()))
    }

    /// Candidate addresses in host-local's round-robin order: starting after `last_reserved`
    /// when it lies in the set (so it is tried last), otherwise from the first `rangeStart`;
    /// gateways skipped; one full cycle.
    pub fn candidates(&self, last_reserved: Option<IpAddr>) -> Candidates<'_> {
        let resume = last_reserved.and_then(|ip| {
            self.ranges
                .iter()
                .position(|r| r.contains(ip))
                .map(|idx| (idx, ip))
        });
        match resume {
            Some((range_idx, ip)) => Candidates {
                set: self,
                range_idx,
                cur: Some(ip),
                start: None,
                done: false,
            },
            None => Candidates {
                set: self,
                range_idx: 0,
                cur: None,
                start: Some(self.ranges[0].range_start),
                done: false,
            },
        }
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Iterator over allocation candidates; see [`RangeSet::candidates`].
#[derive(Debug)]
pub struct Candidates<'a> {
    set: &'a RangeSet,
    range_idx: usize,
    cur: Option<IpAddr>,
    start: Option<IpAddr>,
    done: bool,
}

impl Iterator for Candidates<'_> {
    type Item = IpAddr;

    fn next(&mut self) -> Option<Self::Item> {
        // A loop instead of host-local's recursion: each pass moves the cursor one address.
        while !self.done {
            let ranges = &self.set.ranges;
            let cur = match self.cur {
                None => {
                    let first = ranges[self.range_idx].range_start;
                    self.start = Some(first);
                    first
                }
                Some(cur) => {
                    let next = if cur == ranges[self.range_idx].range_end {
                        self.range_idx = (self.range_idx + 1) % ranges.len();
                        ranges[self.range_idx].range_start
                    } else {
                        next_ip(cur)
                    };
                    match self.start {
                        None => self.start = Some(next),
                        Some(start) if start == next => {
                            self.done = true;
                            return None;
                        }
                        Some(_) => {}
                    }
                    next
                }
            };
            self.cur = Some(cur);
            if cur != ranges[self.range_idx].gateway {
                return Some(cur);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(subnet: &str) -> RangeSpec {
        RangeSpec {
            subnet: Some(subnet.into()),
            ..RangeSpec::default()
        }
    }

    fn set(specs: &[RangeSpec]) -> RangeSet {
        RangeSet::from_specs(specs).expect("valid set")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn order(set: &RangeSet, last: Option<&str>) -> Vec<String> {
        set.candidates(last.map(ip))
            .map(|a| a.to_string())
            .collect()
    }

    #[test]
    fn defaults_match_host_local() {
        let r = Range::from_spec(0, &spec("10.10.0.0/29")).expect("range");
        assert_eq!(r.range_start, ip("10.10.0.1"));
        assert_eq!(r.range_end, ip("10.10.0.6"));
        assert_eq!(r.gateway, ip("10.10.0.1"));
        assert_eq!(r.capacity(), 5);
        let r6 = Range::from_spec(0, &spec("fd00:70::/126")).expect("range");
        assert_eq!(
            r6.range_end,
            ip("fd00:70::3"),
            "IPv6 default end is the last address"
        );
        assert_eq!(r6.to_string(), "fd00:70::1-fd00:70::3");
    }

    #[test]
    fn invalid_ranges_say_what_is_wrong() {
        let cases: &[(RangeSpec, &str)] = &[
            (RangeSpec::default(), "range 0 has no \"subnet\""),
            (spec("10.0.0.0"), "invalid CIDR address: 10.0.0.0"),
            (spec("10.0.0.0/33"), "invalid CIDR address: 10.0.0.0/33"),
            (
                spec("10.0.0.5/24"),
                "Network has host bits set. For a subnet mask of length 24 the network address is 10.0.0.0",
            ),
            (
                spec("10.0.0.0/31"),
                "Network 10.0.0.0/31 too small to allocate from",
            ),
            (
                spec("fd00::/127"),
                "Network fd00::/127 too small to allocate from",
            ),
            (
                RangeSpec {
                    range_start: Some("10.0.1.5".into()),
                    ..spec("10.0.0.0/24")
                },
                "RangeStart 10.0.1.5 not in network 10.0.0.0/24",
            ),
            (
                RangeSpec {
                    range_end: Some("10.0.1.5".into()),
                    ..spec("10.0.0.0/24")
                },
                "RangeEnd 10.0.1.5 not in network 10.0.0.0/24",
            ),
            (
                RangeSpec {
                    range_start: Some("10.0.0.50".into()),
                    range_end: Some("10.0.0.10".into()),
                    ..spec("10.0.0.0/24")
                },
                "rangeStart 10.0.0.50 is after rangeEnd 10.0.0.10; swap them",
            ),
            (
                RangeSpec {
                    gateway: Some("nope".into()),
                    ..spec("10.0.0.0/24")
                },
                "invalid IP address: nope",
            ),
            (
                RangeSpec {
                    gateway: Some("10.0.1.1".into()),
                    ..spec("10.0.0.0/24")
                },
                "gateway 10.0.1.1 is not inside subnet 10.0.0.0/24",
            ),
        ];
        for (s, want) in cases {
            let err = Range::from_spec(0, s).expect_err(want).to_string();
            assert!(err.starts_with(want), "{err:?} should start with {want:?}");
        }
    }

    #[test]
    fn set_checks_family_and_overlap() {
        assert_eq!(RangeSet::from_specs(&[]), Err(RangeError::EmptySet));
        assert_eq!(
            RangeSet::from_specs(&[spec("10.0.0.0/24"), spec("fd00::/64")]),
            Err(RangeError::MixedFamilies)
        );
        assert_eq!(
            RangeSet::from_specs(&[spec("10.0.0.0/24"), spec("10.0.0.0/25")])
                .expect_err("overlap")
                .to_string(),
            "subnets 10.0.0.1-10.0.0.254 and 10.0.0.1-10.0.0.126 overlap"
        );
        let a = set(&[spec("10.0.0.0/24")]);
        assert!(a.overlaps(&set(&[spec("10.0.0.128/25")])));
        assert!(!a.overlaps(&set(&[spec("fd00::/64")])));
    }

    #[test]
    fn round_robin_order_matches_host_local() {
        let s = set(&[spec("192.168.1.0/29")]);
        assert_eq!(
            order(&s, None),
            [".2", ".3", ".4", ".5", ".6"].map(|x| format!("192.168.1{x}"))
        );
        // last reserved .3 → .4 .5 .6 .2 .3 (the last one is tried last)
        assert_eq!(
            order(&s, Some("192.168.1.3")),
            [".4", ".5", ".6", ".2", ".3"].map(|x| format!("192.168.1{x}"))
        );
        // last reserved outside the set → from the start
        assert_eq!(order(&s, Some("10.0.0.1"))[0], "192.168.1.2");
        // last reserved at rangeEnd wraps to rangeStart, skipping the gateway
        assert_eq!(order(&s, Some("192.168.1.6"))[0], "192.168.1.2");
    }

    #[test]
    fn round_robin_crosses_ranges_and_skips_gateways_anywhere() {
        let s = set(&[
            RangeSpec {
                range_start: Some("10.0.0.10".into()),
                range_end: Some("10.0.0.12".into()),
                gateway: Some("10.0.0.11".into()),
                ..spec("10.0.0.0/24")
            },
            RangeSpec {
                range_start: Some("10.0.1.5".into()),
                range_end: Some("10.0.1.6".into()),
                ..spec("10.0.1.0/24")
            },
        ]);
        assert_eq!(
            order(&s, None),
            ["10.0.0.10", "10.0.0.12", "10.0.1.5", "10.0.1.6"]
        );
        assert_eq!(
            order(&s, Some("10.0.0.12")),
            ["10.0.1.5", "10.0.1.6", "10.0.0.10", "10.0.0.12"]
        );
        assert_eq!(s.capacity(), 4);
    }

    #[test]
    fn explicit_network_and_broadcast_are_allocatable() {
        let s = set(&[RangeSpec {
            range_start: Some("10.70.0.0".into()),
            range_end: Some("10.70.0.3".into()),
            ..spec("10.70.0.0/30")
        }]);
        assert_eq!(order(&s, None), ["10.70.0.0", "10.70.0.2", "10.70.0.3"]);
    }

    #[test]
    fn a_set_whose_only_address_is_the_gateway_yields_nothing() {
        let s = set(&[RangeSpec {
            range_start: Some("10.0.0.1".into()),
            range_end: Some("10.0.0.1".into()),
            ..spec("10.0.0.0/24")
        }]);
        assert!(order(&s, None).is_empty());
        assert!(order(&s, Some("10.0.0.1")).is_empty());
    }

    #[test]
    fn capacity_of_the_whole_ipv6_space_does_not_overflow() {
        let s = set(&[RangeSpec {
            range_start: Some("::".into()),
            ..spec("::/0")
        }]);
        assert!(
            s.capacity() >= u128::MAX - 1,
            "saturates instead of overflowing"
        );
    }

    #[test]
    fn ipv6_and_mapped_addresses() {
        let s = set(&[spec("fd00:70::/126")]);
        assert_eq!(order(&s, None), ["fd00:70::2", "fd00:70::3"]);
        assert_eq!(parse_ip("::ffff:10.1.2.3").expect("ip"), ip("10.1.2.3"));
    }
}
