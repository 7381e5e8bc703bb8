//! Differential suite: `host-local` and `ipkeep` run side by side, each with its own data
//! directory, on the same configurations and ADD/DEL/CHECK sequences. Where host-local is right,
//! ipkeep's stdout must be byte-identical; where host-local fails, ipkeep must fail too. The
//! intentional differences (host-local bugs ipkeep fixes, see docs/cni-plugin.md) are tested one
//! by one at the end.
//!
//! host-local is Debian's (CNI plugins 1.1.1), or the one in `IPKEEP_REFERENCE_CNI_DIR`
//! (scripts/test.sh runs the suite again with the CNI plugins 1.10.0 of
//! scripts/runtime-build.sh). ipkeep follows the current release where the two differ: against
//! Debian's, 1.x results are compared as JSON values once the empty `dns` that only it prints
//! is taken out (docs/cni-plugin.md, "host-local 1.1.1 and 1.10.0").

use std::path::{Path, PathBuf};

use ipkeep_tests::{Invocation, PluginOutput, ipkeep_bin, reference_plugin};

struct Pair {
    host_local: PathBuf,
    ipkeep: PathBuf,
    dir: tempfile::TempDir,
    /// host-local knows CNI 1.1 (plugins 1.6 and later): GC, and libcni's current printing.
    current: bool,
}

impl Pair {
    fn new() -> Option<Pair> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("resolv.conf"),
            "nameserver 10.96.0.10\nnameserver 8.8.8.8\ndomain cluster.local\nsearch default.svc.cluster.local svc.cluster.local\noptions ndots:5\n",
        )
        .expect("resolv.conf");
        let host_local = reference_plugin("host-local")?;
        let version = Invocation::new("VERSION", "-").run(&host_local, "{}");
        let current = version.json()["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&"1.1.0".into()));
        Some(Pair {
            host_local,
            ipkeep: ipkeep_bin(),
            dir,
            current,
        })
    }

    /// host-local's and ipkeep's stdout are the same: byte for byte against a current
    /// host-local; against an old one, 1.x results as JSON values without an empty `dns`.
    fn same_stdout(&self, hl: &PluginOutput, ik: &PluginOutput) -> bool {
        if self.current || hl.stdout == ik.stdout {
            return hl.stdout == ik.stdout;
        }
        let parse = |out: &PluginOutput| serde_json::from_str::<serde_json::Value>(&out.stdout);
        let (Ok(mut old), Ok(new)) = (parse(hl), parse(ik)) else {
            return false;
        };
        if old["cniVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("1."))
            && old["dns"] == serde_json::json!({})
            && let Some(map) = old.as_object_mut()
        {
            map.remove("dns");
        }
        old == new
    }

    /// The configuration for one side: `$DATA` is that side's data dir, `$RESOLV` a shared file.
    fn conf(&self, template: &str, side: &str) -> String {
        template
            .replace("$DATA", &self.dir.path().join(side).display().to_string())
            .replace(
                "$RESOLV",
                &self.dir.path().join("resolv.conf").display().to_string(),
            )
    }

    fn both(&self, template: &str, inv: &Invocation<'_>) -> (PluginOutput, PluginOutput) {
        let hl = inv.run(&self.host_local, &self.conf(template, "host-local"));
        let ik = inv.run(&self.ipkeep, &self.conf(template, "ipkeep"));
        (hl, ik)
    }

    fn ipkeep(&self, template: &str, inv: &Invocation<'_>) -> PluginOutput {
        inv.run(&self.ipkeep, &self.conf(template, "ipkeep"))
    }

    fn host_local(&self, template: &str, inv: &Invocation<'_>) -> PluginOutput {
        inv.run(&self.host_local, &self.conf(template, "host-local"))
    }

    fn data(&self, side: &str) -> PathBuf {
        self.dir.path().join(side)
    }
}

/// Runs steps written as `"[!]CMD container [ifname] [CNI_ARGS]"`; `!` means both must fail,
/// otherwise both must succeed with identical stdout.
fn run_case(name: &str, template: &str, steps: &[&str]) {
    let Some(pair) = Pair::new() else { return };
    for step in steps {
        let (expect_fail, step_text) = match step.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, *step),
        };
        let parts: Vec<&str> = step_text.split_whitespace().collect();
        let mut inv = Invocation::new(parts[0], parts[1]);
        if let Some(ifname) = parts.get(2).filter(|s| **s != "-") {
            inv = inv.ifname(ifname);
        }
        if let Some(args) = parts.get(3) {
            inv = inv.args(args);
        }
        let (hl, ik) = pair.both(template, &inv);
        let ctx = format!("case {name}, step {step:?}\nhost-local: {hl:?}\nipkeep:     {ik:?}");
        if expect_fail {
            assert!(!hl.ok() && !ik.ok(), "both must fail: {ctx}");
            assert!(
                ik.error_code().is_some(),
                "ipkeep must print CNI error JSON: {ctx}"
            );
        } else {
            assert!(hl.ok(), "host-local must succeed: {ctx}");
            assert!(pair.same_stdout(&hl, &ik), "stdout differs: {ctx}");
            assert!(ik.ok(), "{ctx}");
        }
    }
}

const NET1: &str = r#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.10.0.0/29"}]],"routes":[{"dst":"0.0.0.0/0"}]}}"#;
const DUAL: &str = r#"{"cniVersion":"1.0.0","name":"dual","ipam":{"type":"ipkeep","dataDir":"$DATA","resolvConf":"$RESOLV","ranges":[[{"subnet":"10.20.0.0/24","rangeStart":"10.20.0.100","rangeEnd":"10.20.0.101","gateway":"10.20.0.254"},{"subnet":"10.21.0.0/24","rangeStart":"10.21.0.10","rangeEnd":"10.21.0.10"}],[{"subnet":"fd00:20::/64"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0","gw":"fd00:20::1"}]}}"#;
const REQ: &str = r#"{"cniVersion":"1.0.0","name":"req","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}],[{"subnet":"fd00:30::/120"}]]}}"#;

#[test]
fn single_range_allocation_exhaustion_release_round_robin() {
    run_case(
        "net1",
        NET1,
        &[
            "ADD c1",
            "ADD c2",
            "ADD c3",
            "ADD c4",
            "ADD c5",
            "!ADD c6",
            "DEL c3",
            "ADD c7",
            "DEL c3",
            "DEL never-added",
            "!ADD c1 net1",
            "CHECK c2",
            "!CHECK c2 eth9",
            "!CHECK c3",
            "DEL c7",
            "DEL c5",
            "ADD c8",
            "ADD c9",
        ],
    );
}

#[test]
fn dual_stack_multi_range_gateway_routes_resolv_conf() {
    run_case(
        "dual",
        DUAL,
        &[
            "ADD p1", "ADD p2", "ADD p3", "!ADD p4", "DEL p2", "ADD p5", "CHECK p1",
        ],
    );
}

#[test]
fn range_start_end_and_gateway_in_the_middle() {
    let conf = r#"{"cniVersion":"1.0.0","name":"gwmid","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.72.0.0/24","rangeStart":"10.72.0.10","rangeEnd":"10.72.0.12","gateway":"10.72.0.11"}]]}}"#;
    run_case(
        "gwmid",
        conf,
        &["ADD h1", "ADD h2", "!ADD h3", "DEL h1", "ADD h4"],
    );
}

#[test]
fn explicit_network_and_broadcast_addresses_are_handed_out() {
    let conf = r#"{"cniVersion":"1.0.0","name":"edge","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.70.0.0/30","rangeStart":"10.70.0.0","rangeEnd":"10.70.0.3"}]]}}"#;
    run_case("edge", conf, &["ADD e1", "ADD e2", "ADD e3", "!ADD e4"]);
}

#[test]
fn ipv6_hands_out_the_last_address() {
    let conf = r#"{"cniVersion":"0.4.0","name":"edge6","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"fd00:70::/126"}]]}}"#;
    run_case(
        "edge6",
        conf,
        &[
            "ADD f1", "ADD f2", "!ADD f3", "CHECK f1", "DEL f1", "ADD f4",
        ],
    );
}

#[test]
fn legacy_subnet_form_and_old_result_versions() {
    for version in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0"] {
        let conf = format!(
            r#"{{"cniVersion":"{version}","name":"legacy","ipam":{{"type":"ipkeep","dataDir":"$DATA","subnet":"10.60.0.0/24","gateway":"10.60.0.1","routes":[{{"dst":"0.0.0.0/0","gw":"10.60.0.1"}},{{"dst":"10.99.0.0/16"}}]}}}}"#
        );
        run_case(
            &format!("legacy-{version}"),
            &conf,
            &["ADD v1", "ADD v2", "DEL v1"],
        );
    }
    let dual020 = r#"{"cniVersion":"0.2.0","name":"legacy020ds","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.61.0.0/24"}],[{"subnet":"fd00:61::/64"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]}}"#;
    run_case("legacy020ds", dual020, &["ADD v1"]);
}

#[test]
fn legacy_subnet_is_prepended_to_ranges() {
    let conf = r#"{"cniVersion":"0.3.1","name":"mixed","ipam":{"type":"ipkeep","dataDir":"$DATA","subnet":"10.62.0.0/24","rangeStart":"10.62.0.50","ranges":[[{"subnet":"10.63.0.0/24"}],[{"subnet":"fd00:63::/64"}]]}}"#;
    run_case("mixed", conf, &["ADD m1", "ADD m2"]);
}

#[test]
fn requested_ip_from_cni_args() {
    run_case(
        "req-cni-args",
        REQ,
        &[
            "ADD r1 - IP=10.30.0.50",
            "ADD r2e - IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=x;IP=10.30.0.53/24",
            "ADD r6",
            "ADD r7 - IP=fd00:30::99",
            "DEL r1",
            "ADD r8",
            // Failures last: host-local moves its round-robin cursor even when an ADD fails,
            // ipkeep does not (a documented difference), so later dynamic picks would diverge.
            "!ADD r1b - IP=10.30.0.53",
            "!ADD r2 - IP=10.30.1.50",
            "!ADD r2b - IP=10.30.0.1",
            "!ADD r2c - ip=10.30.0.51",
            "!ADD r2f - IP=notanip",
        ],
    );
}

#[test]
fn requested_ips_from_args_and_runtime_config() {
    let args = r#"{"cniVersion":"1.0.0","name":"req","args":{"cni":{"ips":["10.30.0.60","fd00:30::60"]}},"ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}],[{"subnet":"fd00:30::/120"}]]}}"#;
    run_case("req-args", args, &["ADD r3", "!ADD r3b"]);
    let rc = r#"{"cniVersion":"1.0.0","name":"req","runtimeConfig":{"ips":["10.30.0.70/24","fd00:30::70/120"]},"ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}],[{"subnet":"fd00:30::/120"}]]}}"#;
    run_case("req-rc", rc, &["ADD r4", "DEL r4", "ADD r4b"]);
    let one = r#"{"cniVersion":"1.0.0","name":"req","runtimeConfig":{"ips":["10.30.0.80"]},"ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}],[{"subnet":"fd00:30::/120"}]]}}"#;
    run_case("req-one", one, &["ADD r5"]);
    let two = r#"{"cniVersion":"1.0.0","name":"req","runtimeConfig":{"ips":["10.30.0.80","10.30.0.81"]},"ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}],[{"subnet":"fd00:30::/120"}]]}}"#;
    run_case("req-two", two, &["!ADD r5"]);
}

#[test]
fn runtime_ip_ranges_are_prepended() {
    let conf = r#"{"cniVersion":"1.0.0","name":"req","runtimeConfig":{"ipRanges":[[{"subnet":"10.31.0.0/24"}]]},"ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}]]}}"#;
    run_case(
        "req-iprange",
        conf,
        &["ADD r7", "ADD r8", "DEL r7", "ADD r9"],
    );
}

#[test]
fn one_container_two_interfaces() {
    let conf = r#"{"cniVersion":"1.0.0","name":"multi","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.80.0.0/24"}]]}}"#;
    run_case(
        "multi-if",
        conf,
        &[
            "ADD m1 eth0",
            "ADD m1 net1",
            "DEL m1 eth9",
            "DEL m1 net1",
            "CHECK m1 eth0",
            "!CHECK m1 net1",
            "ADD m2",
        ],
    );
}

#[test]
fn wrap_around_skips_gateway_and_tries_last_reserved_last() {
    let conf = r#"{"cniVersion":"1.0.0","name":"wrap","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.91.0.0/29"}]]}}"#;
    run_case(
        "wrap",
        conf,
        &[
            "ADD a", "ADD b", "ADD c", "ADD d", "ADD e", "DEL b", "DEL e", "ADD f", "ADD g",
            "!ADD h", "DEL g", "ADD i",
        ],
    );
}

#[test]
fn invalid_configurations_fail_on_both() {
    let bad = [
        r#"{"cniVersion":"1.0.0","name":"bad","type":"bridge"}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA"}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"rangeStart":"10.0.0.5"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.5/24"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/31"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"fd00::/127"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.1.5"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24","rangeEnd":"10.0.1.5"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.50","rangeEnd":"10.0.0.10"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24","gateway":"nope"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.0.0/25"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.128/25"}]]}}"#,
        r#"{"cniVersion":"0.2.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","resolvConf":"/nonexistent/resolv.conf","ranges":[[{"subnet":"10.0.0.0/24"}]]}}"#,
        r#"{"cniVersion":"1.0.0","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad/name","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","#,
        r#"{"cniVersion":"9.9.9","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"}]]}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":"x"}}"#,
        r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"}]],"routes":[{"dst":"nope"}]}}"#,
    ];
    for (i, conf) in bad.iter().enumerate() {
        run_case(&format!("invalid-{i}"), conf, &["!ADD x1"]);
    }
}

#[test]
fn invalid_environment_fails_on_both_with_code_4() {
    let Some(pair) = Pair::new() else { return };
    let cases: Vec<Invocation<'_>> = vec![
        Invocation::new("ADD", "a/b"),
        Invocation::new("ADD", "../../etc"),
        Invocation::new("ADD", "x1").ifname("0123456789abcdef"),
        Invocation::new("ADD", "x1").ifname("../eth0"),
        Invocation::new("FOO", "x1"),
        Invocation::new("GC", "x1"),
    ];
    for inv in cases {
        let (hl, ik) = pair.both(NET1, &inv);
        if inv.command == "GC" {
            // GC needs a 1.1.0 configuration: code 1 from ipkeep and current host-local; Debian's
            // 1.1.1 host-local does not know the command (code 4).
            assert_eq!(ik.error_code(), Some(1), "{ik:?}");
            if pair.current {
                assert_eq!(hl.error_code(), Some(1), "{hl:?}");
                assert_eq!(hl.json()["msg"], ik.json()["msg"]);
            } else {
                assert_eq!(hl.error_code(), Some(4), "{hl:?}");
            }
        } else {
            assert_eq!(hl.error_code(), Some(4), "{inv:?} {hl:?}");
            assert_eq!(ik.error_code(), Some(4), "{inv:?} {ik:?}");
            assert_eq!(hl.json()["msg"], ik.json()["msg"], "{inv:?}");
        }
    }
    let mut missing = Invocation::new("ADD", "x1").command(&pair.ipkeep);
    missing.env_remove("CNI_IFNAME").env_remove("CNI_PATH");
    let out = ipkeep_tests::PluginOutput::from(missing.output().expect("run"));
    assert_eq!(
        out.json()["msg"],
        "required env variables [CNI_IFNAME,CNI_PATH] missing"
    );
}

// ---- Intentional differences (docs/cni-plugin.md, "Differences from host-local") ----

fn assert_fails_hl_ok_ik(pair: &Pair, conf: &str, inv: &Invocation<'_>) -> PluginOutput {
    let (hl, ik) = pair.both(conf, inv);
    assert!(!hl.ok(), "host-local fails here: {hl:?}");
    assert!(ik.ok(), "ipkeep succeeds here: {ik:?}");
    ik
}

#[test]
fn difference_repeated_add_is_idempotent() {
    let Some(pair) = Pair::new() else { return };
    let first = pair.both(NET1, &Invocation::new("ADD", "c1"));
    let again = assert_fails_hl_ok_ik(&pair, NET1, &Invocation::new("ADD", "c1"));
    assert_eq!(again.stdout, first.1.stdout, "same result again");
    let listed = ipkeep_tests::list_json(&pair.data("ipkeep"), "net1");
    assert_eq!(
        listed["leases"].as_array().map(Vec::len),
        Some(1),
        "no second address"
    );
}

#[test]
fn difference_failed_add_keeps_existing_reservations() {
    let Some(pair) = Pair::new() else { return };
    let wipe = r#"{"cniVersion":"1.0.0","name":"wipe","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.90.0.0/24"}],[{"subnet":"fd00:90::/120"}]]}}"#;
    pair.both(wipe, &Invocation::new("ADD", "w1"));
    let (hl, ik) = pair.both(wipe, &Invocation::new("ADD", "w1").args("IP=10.90.0.77"));
    assert!(!hl.ok() && !ik.ok());
    // host-local's rollback deleted w1's addresses (transcript G7); ipkeep's are intact.
    assert!(!pair.host_local(wipe, &Invocation::new("CHECK", "w1")).ok());
    assert!(pair.ipkeep(wipe, &Invocation::new("CHECK", "w1")).ok());
    // and its round-robin cursor did not move on the failure
    let next = pair.ipkeep(wipe, &Invocation::new("ADD", "w2"));
    assert_eq!(next.ips(), ["10.90.0.3", "fd00:90::3"]);
}

#[test]
fn difference_requested_ip_does_not_give_a_second_address() {
    let Some(pair) = Pair::new() else { return };
    let dupreq = r#"{"cniVersion":"1.0.0","name":"dupreq","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.33.0.0/24"}]]}}"#;
    pair.both(dupreq, &Invocation::new("ADD", "q1").args("IP=10.33.0.5"));
    let (hl, ik) = pair.both(dupreq, &Invocation::new("ADD", "q1").args("IP=10.33.0.6"));
    assert_eq!(
        hl.ips(),
        ["10.33.0.6"],
        "host-local hands q1 a second address (transcript G8)"
    );
    assert!(!ik.ok(), "{ik:?}");
    assert!(
        ik.json()["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("already has 10.33.0.5"),
        "{ik:?}"
    );
}

#[test]
fn difference_stricter_range_validation_and_clearer_messages() {
    let Some(pair) = Pair::new() else { return };
    let gw_outside = r#"{"cniVersion":"1.0.0","name":"gw","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24","gateway":"10.0.1.1"}]]}}"#;
    let (hl, ik) = pair.both(gw_outside, &Invocation::new("ADD", "x1"));
    if pair.current {
        assert_eq!(
            (hl.error_code(), hl.json()["msg"].as_str()),
            (
                Some(999),
                Some("invalid range set 0: gateway 10.0.1.1 not in network 10.0.0.0/24")
            ),
            "host-local 1.10 refuses a gateway outside the subnet"
        );
    } else {
        assert!(
            hl.ok(),
            "host-local 1.1 accepts a gateway outside the subnet: {hl:?}"
        );
    }
    assert_eq!(ik.error_code(), Some(7));
    assert_eq!(
        ik.json()["msg"],
        "invalid range set 0: gateway 10.0.1.1 is not inside subnet 10.0.0.0/24"
    );
    let swapped = r#"{"cniVersion":"1.0.0","name":"bad","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.50","rangeEnd":"10.0.0.10"}]]}}"#;
    let (hl, ik) = pair.both(swapped, &Invocation::new("ADD", "x1"));
    assert_eq!(
        hl.json()["msg"],
        "invalid range set 0: RangeStart 10.0.0.50 not in network 10.0.0.0/24"
    );
    assert_eq!(
        ik.json()["msg"],
        "invalid range set 0: rangeStart 10.0.0.50 is after rangeEnd 10.0.0.10; swap them"
    );
    // configuration errors carry the spec's code 7 instead of host-local's catch-all 999
    let (hl, ik) = pair.both(
        r#"{"cniVersion":"1.0.0","name":"bad","type":"bridge"}"#,
        &Invocation::new("ADD", "x1"),
    );
    assert_eq!((hl.error_code(), ik.error_code()), (Some(999), Some(7)));
    assert_eq!(hl.json()["msg"], ik.json()["msg"]);
    let missing_version = r#"{"name":"nv","ipam":{"type":"x","dataDir":"$DATA","ranges":[[{"subnet":"10.0.0.0/24"}]]}}"#;
    let (hl, ik) = pair.both(missing_version, &Invocation::new("ADD", "x1"));
    assert!(hl.ok(), "host-local treats a missing cniVersion as 0.1.0");
    assert_eq!(ik.error_code(), Some(7));
    let relative = r#"{"cniVersion":"1.0.0","name":"rel","ipam":{"type":"x","dataDir":"relative/dir","ranges":[[{"subnet":"10.0.0.0/24"}]]}}"#;
    assert_eq!(
        pair.ipkeep(relative, &Invocation::new("ADD", "x1"))
            .error_code(),
        Some(7)
    );
}

#[test]
fn difference_check_verifies_prev_result() {
    let Some(pair) = Pair::new() else { return };
    pair.both(NET1, &Invocation::new("ADD", "c2"));
    let prev = NET1.replace(
        r#""type":"bridge","#,
        r#""type":"bridge","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.10.0.5/29"}]},"#,
    );
    let (hl, ik) = pair.both(&prev, &Invocation::new("CHECK", "c2"));
    assert!(hl.ok(), "host-local ignores prevResult: {hl:?}");
    assert!(!ik.ok(), "ipkeep checks it: {ik:?}");
    let good = prev.replace("10.10.0.5/29", "10.10.0.2/29");
    assert!(pair.ipkeep(&good, &Invocation::new("CHECK", "c2")).ok());
}

#[test]
fn difference_del_works_with_a_broken_range_config() {
    let Some(pair) = Pair::new() else { return };
    pair.both(NET1, &Invocation::new("ADD", "c1"));
    let broken = NET1.replace("10.10.0.0/29", "10.10.0.0/31");
    assert_fails_hl_ok_ik(&pair, &broken, &Invocation::new("DEL", "c1"));
    assert!(
        !pair.ipkeep(NET1, &Invocation::new("CHECK", "c1")).ok(),
        "released"
    );
}

#[test]
fn difference_kubernetes_args_are_known_keys() {
    let Some(pair) = Pair::new() else { return };
    let inv = Invocation::new("ADD", "k1").args("K8S_POD_NAMESPACE=db;K8S_POD_NAME=web-0");
    assert_fails_hl_ok_ik(&pair, NET1, &inv);
}

/// What the runtime passes about the pod is stored, logged and put in Events: host-local never
/// looks at it, ipkeep refuses values no runtime copies from the API server (code 4).
#[test]
fn difference_pod_uid_and_netns_are_checked() {
    let Some(pair) = Pair::new() else { return };
    let long_uid = format!("IgnoreUnknown=1;K8S_POD_UID={}", "f".repeat(10_000));
    let bad_uid = Invocation::new("ADD", "u1").args(&long_uid);
    let mut relative = Invocation::new("ADD", "n1");
    relative.netns = "netns/relative";
    for inv in [&bad_uid, &relative] {
        let (hl, ik) = pair.both(NET1, inv);
        assert!(hl.ok(), "host-local accepts it: {hl:?}");
        assert_eq!(ik.error_code(), Some(4), "{ik:?}");
    }
}

#[test]
fn difference_cni_1_1_gc_and_status() {
    let Some(pair) = Pair::new() else { return };
    let v11 = NET1.replace("1.0.0", "1.1.0");
    let (hl, ik) = pair.both(&v11, &Invocation::new("ADD", "c1"));
    if pair.current {
        assert_eq!(hl.stdout, ik.stdout, "{hl:?} {ik:?}");
    } else {
        assert_eq!(
            hl.error_code(),
            Some(1),
            "Debian's host-local predates CNI 1.1"
        );
    }
    assert_eq!(ik.json()["cniVersion"], "1.1.0");
    assert!(pair.ipkeep(&v11, &Invocation::new("STATUS", "-")).ok());
    let version = pair.ipkeep(NET1, &Invocation::new("VERSION", "-"));
    assert!(
        version.json()["supportedVersions"]
            .as_array()
            .is_some_and(|v| v.contains(&"1.1.0".into()))
    );
}

#[test]
fn difference_no_dir_created_for_del_of_unknown_network() {
    let Some(pair) = Pair::new() else { return };
    let (hl, ik) = pair.both(NET1, &Invocation::new("DEL", "nobody"));
    assert!(hl.ok() && ik.ok());
    assert!(
        pair.data("host-local").join("net1").exists(),
        "host-local creates the dir on DEL"
    );
    assert!(!Path::new(&pair.data("ipkeep")).join("net1").exists());
}

#[test]
fn difference_round_robin_cursor_follows_the_range_set_not_its_index() {
    let Some(pair) = Pair::new() else { return };
    let plain = r#"{"cniVersion":"1.0.0","name":"cursor","ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}]]}}"#;
    let prepended = r#"{"cniVersion":"1.0.0","name":"cursor","runtimeConfig":{"ipRanges":[[{"subnet":"10.31.0.0/24"}]]},"ipam":{"type":"ipkeep","dataDir":"$DATA","ranges":[[{"subnet":"10.30.0.0/24"}]]}}"#;
    pair.both(plain, &Invocation::new("ADD", "a1"));
    pair.both(plain, &Invocation::new("ADD", "a2"));
    pair.both(plain, &Invocation::new("DEL", "a1"));
    let (hl, ik) = pair.both(prepended, &Invocation::new("ADD", "b1"));
    // host-local looks for the cursor of set index 1, finds none, restarts at .2 and hands out
    // the address a1 released a moment ago; ipkeep continues after .3.
    assert_eq!(hl.ips(), ["10.31.0.2", "10.30.0.2"]);
    assert_eq!(ik.ips(), ["10.31.0.2", "10.30.0.4"]);
}

#[test]
fn difference_private_state_in_its_own_default_directory() {
    use std::os::unix::fs::PermissionsExt;
    let Some(pair) = Pair::new() else { return };
    pair.ipkeep(NET1, &Invocation::new("ADD", "c1"));
    let mut stack = vec![pair.data("ipkeep").join("net1")];
    let mut seen = 0;
    while let Some(path) = stack.pop() {
        let meta = std::fs::metadata(&path).expect("metadata");
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            assert_eq!(mode, 0o700, "{}", path.display());
            stack.extend(
                std::fs::read_dir(&path)
                    .expect("read_dir")
                    .map(|e| e.expect("entry").path()),
            );
        } else {
            assert_eq!(mode, 0o600, "{}", path.display());
            seen += 1;
        }
    }
    assert!(seen >= 2, "lock file and database files");
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED default dataDir part: needs root to write /var/lib/cni/ipkeep");
        return;
    }
    let name = format!("ipkeep-test-default-{}", std::process::id());
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"{name}","ipam":{{"type":"ipkeep","ranges":[[{{"subnet":"10.77.0.0/24"}}]]}}}}"#
    );
    let out = Invocation::new("ADD", "d1").run(&pair.ipkeep, &conf);
    let dir = Path::new("/var/lib/cni/ipkeep").join(&name);
    let existed = dir.join("leases.redb").is_file();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.ok(), "{out:?}");
    assert!(
        existed,
        "default state directory is /var/lib/cni/ipkeep/<network>"
    );
}
