//! Whole commands through [`run`] with byte buffers and in-memory stores: the seam the plugin
//! process and the agent share.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use ipkeep_ipam::{NetworkDir, Reading, StoreRead};

use super::*;
use crate::netconf;
use crate::stores::MemoryStores;

const CONF: &str = r#"{"cniVersion":"1.0.0","name":"net","runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"ipkeep.dev/persistent-pod-state":"web","ipkeep.dev/ip-retention":"1h"}},"ipam":{"dataDir":"/var/lib/cni/test","ranges":[[{"subnet":"10.5.0.0/29"}]]}}"#;

fn vars(command: &str, cid: &str, pod: &str) -> HashMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", cid),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/run/netns/none"),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([(
        "CNI_ARGS".to_string(),
        format!("K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod}"),
    )])
    .collect()
}

/// The plugin on its own: no view of the API server.
pub(super) static ALONE: management::NoApiView = management::NoApiView(management::Unavailable {
    why: String::new(),
    expected: false,
});

pub(super) fn at(wall: u64, since_boot: u64) -> Call<'static> {
    Call {
        reading: Reading {
            wall,
            boot: Some(("boot-1".into(), since_boot)),
            ..Reading::wall(0)
        },
        deadline: None,
        api: &ALONE,
        capture_log: None,
    }
}

/// Runs one command; returns the exit code and stdout.
fn invoke(
    stores: &MemoryStores,
    command: &str,
    cid: &str,
    pod: &str,
    call: &Call<'_>,
) -> (i32, String) {
    invoke_with(stores, CONF, command, cid, pod, call)
}

fn invoke_with<S: Stores>(
    stores: &S,
    conf: &str,
    command: &str,
    cid: &str,
    pod: &str,
    call: &Call<'_>,
) -> (i32, String) {
    let config = netconf::decode(conf.as_bytes());
    let done = run(stores, &vars(command, cid, pod), &config, call);
    (done.exit_code, String::from_utf8(done.stdout).unwrap())
}

pub(super) fn ip_of(result: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(result).unwrap();
    v["ips"][0]["address"].as_str().unwrap().to_string()
}

pub(super) fn dir() -> NetworkDir {
    NetworkDir::new(std::path::Path::new("/var/lib/cni/test"), "net").unwrap()
}

#[test]
fn a_rebuilt_pod_gets_its_address_back_through_the_seam() {
    let stores = MemoryStores::default();
    let (code, first) = invoke(&stores, "ADD", "a", "web-0", &at(1_000, 10));
    assert_eq!(code, 0, "{first}");
    assert_eq!(
        invoke(&stores, "DEL", "a", "web-0", &at(1_010, 20)),
        (0, String::new())
    );
    let held = stores.get(&dir()).unwrap().held().unwrap();
    assert_eq!(held.len(), 1);
    let (_, other) = invoke(&stores, "ADD", "b", "web-1", &at(1_020, 30));
    assert_ne!(ip_of(&other), ip_of(&first));
    let (_, again) = invoke(&stores, "ADD", "c", "web-0", &at(1_030, 40));
    assert_eq!(ip_of(&again), ip_of(&first));
}

/// Found by review: a forward jump of the wall clock freed every held address for good. The
/// store's clock advances by the boot clock while the node stays up.
#[test]
fn a_forward_clock_jump_frees_no_holding() {
    let stores = MemoryStores::default();
    let (_, first) = invoke(&stores, "ADD", "a", "web-0", &at(1_000, 10));
    invoke(&stores, "DEL", "a", "web-0", &at(1_010, 20));
    // A year later by the wall clock, 20 seconds later by the boot clock.
    let year = 365 * 86_400;
    let mut result = (0, String::new());
    let warned = logged("warn", || {
        result = invoke(&stores, "ADD", "b", "web-1", &at(1_030 + year, 40));
    });
    let (code, other) = result;
    assert_eq!(code, 0, "{other}");
    assert!(warned.contains("wall clock is ahead"), "{warned}");
    assert_eq!(
        stores.get(&dir()).unwrap().held().unwrap().len(),
        1,
        "the holding is still there"
    );
    let (_, again) = invoke(&stores, "ADD", "c", "web-0", &at(1_040 + year, 50));
    assert_eq!(ip_of(&again), ip_of(&first), "web-0 got its address back");
    // An hour of real time later it has expired, whatever the wall clock says.
    invoke(&stores, "DEL", "c", "web-0", &at(1_050 + year, 60));
    invoke(&stores, "ADD", "d", "web-2", &at(1_050 + year, 60 + 3_601));
    assert!(stores.get(&dir()).unwrap().held().unwrap().is_empty());
}

/// Found by review: after a reboot with the hardware clock ten days ahead (before NTP
/// corrected it) the first command freed every holding of less than ten days, and a rebuilt pod
/// got a new address. The kernel had not said the clock was synchronised.
#[test]
fn a_reboot_with_the_clock_ahead_frees_no_holding() {
    let stores = MemoryStores::default();
    let conf = CONF.replace(r#""1h""#, r#""7d""#);
    let t0 = 1_000_000;
    let mut first = Vec::new();
    for (i, pod) in ["web-0", "web-1", "web-2"].iter().enumerate() {
        let (code, out) = invoke_with(&stores, &conf, "ADD", &format!("a{i}"), pod, &at(t0, 10));
        assert_eq!(code, 0, "{out}");
        first.push(ip_of(&out));
        invoke_with(
            &stores,
            &conf,
            "DEL",
            &format!("a{i}"),
            pod,
            &at(t0 + 1, 11),
        );
    }
    // Rebooted (another boot id, 30 s up); the wall clock reads ten days later and nothing
    // says it is right.
    let rebooted = |wall: u64, up: u64| Call {
        reading: Reading {
            wall,
            boot: Some(("boot-2".into(), up)),
            ..Reading::wall(0)
        },
        deadline: None,
        api: &ALONE,
        capture_log: None,
    };
    let ten_days = 10 * 86_400;
    let mut result = (0, String::new());
    let warned = logged("warn", || {
        result = invoke_with(
            &stores,
            &conf,
            "ADD",
            "x",
            "other-0",
            &rebooted(t0 + ten_days, 30),
        );
    });
    assert_eq!(result.0, 0, "{}", result.1);
    assert_eq!(
        stores.get(&dir()).unwrap().held().unwrap().len(),
        3,
        "every holding is still there"
    );
    assert!(
        warned.contains("not synchronised") && warned.contains("hint="),
        "{warned}"
    );
    let (_, again) = invoke_with(
        &stores,
        &conf,
        "ADD",
        "b1",
        "web-1",
        &rebooted(t0 + ten_days + 5, 35),
    );
    assert_eq!(ip_of(&again), first[1], "web-1 got its address back");
}

/// A global subscriber that records nothing but never lets tracing cache "nobody listens" for
/// a call site. Without it, a test on another thread that reaches a call site first, while no
/// capture is running, can make tracing skip that call site for a capture that starts later
/// (seen in CI as a missing "CNI command failed" line).
struct AlwaysAsk;

impl tracing::Subscriber for AlwaysAsk {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Captures what `f` logs at `level`, formatted as the plugin formats it. One capture at a
/// time, and every call site asked afresh ([`AlwaysAsk`]).
pub(super) fn logged(level: &str, f: impl FnOnce()) -> String {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        // Fails only if a global subscriber exists already, which then decides instead.
        let _ = tracing::subscriber::set_global_default(AlwaysAsk);
    });
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let sink = buf.clone();
    let subscriber = crate::logs::builder(&netconf::Settings::default(), Some(level))
        .with_writer(move || sink.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    let bytes = buf.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

/// Found under containerd: a failed ADD's log line named neither the pod nor the container.
#[test]
fn every_line_names_the_pod_and_the_container_failures_included() {
    let stores = MemoryStores::default();
    let conf = CONF.replace(
        r#""ranges""#,
        r#""resolvConf":"/nonexistent/resolv.conf","ranges""#,
    );
    let text = logged("warn", || {
        let (code, _) = invoke_with(&stores, &conf, "ADD", "sandbox-9", "web-3", &at(1, 1));
        assert_eq!(code, 1);
    });
    let line = text
        .lines()
        .find(|l| l.contains("CNI command failed"))
        .unwrap();
    assert!(
        line.contains("pod=db/web-3")
            && line.contains("container=sandbox-9")
            && line.contains("ADD"),
        "{line}"
    );
}

/// Found under containerd: `logLevel: debug` added nothing to the INFO lines.
#[test]
fn debug_says_what_was_decoded_and_decided() {
    let stores = MemoryStores::default();
    let info = logged("info", || {
        invoke(&stores, "ADD", "a", "web-0", &at(1, 1));
    });
    let debug = logged("debug", || {
        invoke(&stores, "ADD", "b", "web-1", &at(2, 2));
    });
    assert!(!info.contains("DEBUG"), "{info}");
    for needle in ["decoded the invocation", "allocating"] {
        assert!(debug.contains(needle), "{needle}: {debug}");
    }
}

#[test]
fn status_reports_a_store_that_cannot_serve() {
    struct Broken;
    impl Stores for Broken {
        type Store = ipkeep_ipam::MemoryStore;
        fn exists(&self, _: &NetworkDir) -> bool {
            true
        }
        fn with<R, E: From<ipkeep_ipam::StoreError>>(
            &self,
            _: &NetworkDir,
            _: Duration,
            _: &mut Timings,
            f: impl FnOnce(&mut ipkeep_ipam::MemoryStore) -> Result<R, E>,
        ) -> Result<R, E> {
            f(&mut ipkeep_ipam::MemoryStore::new())
        }
        fn read<R, E: From<ipkeep_ipam::StoreError>>(
            &self,
            _: &NetworkDir,
            _: Duration,
            f: impl FnOnce(&dyn StoreRead) -> Result<R, E>,
        ) -> Result<R, E> {
            f(&ipkeep_ipam::MemoryStore::new())
        }
        fn status(&self, _: &NetworkDir) -> Result<(), String> {
            Err("the disk is full".into())
        }
    }
    let conf = CONF.replace("1.0.0", "1.1.0");
    let (code, out) = invoke_with(&Broken, &conf, "STATUS", "", "x", &at(1, 1));
    let err: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, err["code"].as_u64()), (1, Some(50)), "{out}");
    assert!(err["msg"].as_str().unwrap().contains("disk is full"));
}

/// In-memory stores that judge network namespaces by `netns` (absent: cannot tell) and
/// refuse every store when `refuse` says why, as the node agent may.
#[derive(Default)]
struct Judging {
    stores: MemoryStores,
    netns: std::collections::BTreeMap<String, bool>,
    refuse: Option<&'static str>,
}

impl Stores for Judging {
    type Store = ipkeep_ipam::MemoryStore;
    fn exists(&self, dir: &NetworkDir) -> bool {
        self.stores.exists(dir)
    }
    fn with<R, E: From<ipkeep_ipam::StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        timings: &mut Timings,
        f: impl FnOnce(&mut ipkeep_ipam::MemoryStore) -> Result<R, E>,
    ) -> Result<R, E> {
        self.stores.with(dir, timeout, timings, f)
    }
    fn read<R, E: From<ipkeep_ipam::StoreError>>(
        &self,
        dir: &NetworkDir,
        timeout: Duration,
        f: impl FnOnce(&dyn StoreRead) -> Result<R, E>,
    ) -> Result<R, E> {
        self.stores.read(dir, timeout, f)
    }
    fn status(&self, _: &NetworkDir) -> Result<(), String> {
        Ok(())
    }
    fn serves(&self, _: &NetworkDir) -> Result<(), NotServed> {
        self.refuse.map_or(Ok(()), |why| Err(NotServed(why.into())))
    }
    fn netns_exists(&self, path: &str) -> Option<bool> {
        self.netns.get(path).copied()
    }
}

fn add_in(stores: &Judging, cid: &str, netns: &str) -> Completion {
    let config = netconf::decode(CONF.as_bytes());
    let mut vars = vars("ADD", cid, "web-0");
    vars.insert("CNI_NETNS".into(), netns.into());
    run(stores, &vars, &config, &at(1_000, 10))
}

/// A pod force-deleted while its sandbox still runs comes back: whether its address may move
/// depends on the old sandbox's network namespace. Stores that cannot tell say so in the
/// completion, and nothing is committed; stores that can decide it.
#[test]
fn a_namespace_the_stores_cannot_judge_is_handed_back_unjudged() {
    let mut stores = Judging::default();
    let first = add_in(&stores, "old", "/run/netns/old");
    assert_eq!(first.exit_code, 0);
    let before = stores.stores.get(&dir()).unwrap().all().unwrap();
    let asked = add_in(&stores, "new", "/run/netns/new");
    assert_eq!(asked.needs_netns, ["/run/netns/old"]);
    assert_eq!(asked.exit_code, 1);
    let error: serde_json::Value = serde_json::from_slice(&asked.stdout).unwrap();
    assert_eq!(error["code"], 11, "try again later: {error}");
    assert_eq!(
        stores.stores.get(&dir()).unwrap().all().unwrap(),
        before,
        "nothing committed"
    );
    stores.netns.insert("/run/netns/old".into(), true);
    let alive = add_in(&stores, "new", "/run/netns/new");
    assert!(alive.needs_netns.is_empty());
    let error: serde_json::Value = serde_json::from_slice(&alive.stdout).unwrap();
    assert!(
        error["msg"].as_str().unwrap().contains("still configured"),
        "{error}"
    );
    stores.netns.insert("/run/netns/old".into(), false);
    let moved = add_in(&stores, "new", "/run/netns/new");
    assert_eq!(moved.exit_code, 0);
    assert_eq!(
        ip_of(std::str::from_utf8(&moved.stdout).unwrap()),
        ip_of(std::str::from_utf8(&first.stdout).unwrap())
    );
}

/// Stores that will not lend the network's store say why in the completion: the command did
/// not run, and nothing was written.
#[test]
fn a_refusal_is_handed_back_and_nothing_runs() {
    let stores = Judging {
        refuse: Some("not this agent's network"),
        ..Judging::default()
    };
    let done = add_in(&stores, "a", "/run/netns/a");
    assert_eq!(
        done.refused,
        Some(NotServed("not this agent's network".into()))
    );
    assert!(stores.stores.get(&dir()).is_none());
}

/// A call that asks for its log lines gets them in the completion, at the configuration's
/// level and formatted as the plugin process writes them, with the command's span.
#[test]
fn a_call_that_captures_its_log_gets_its_lines_back() {
    let capture = logs::Capture::default();
    let stores = MemoryStores::default();
    let conf = CONF.replace(r#""ranges""#, r#""logLevel":"debug","ranges""#);
    let config = netconf::decode(conf.as_bytes());
    let call = Call {
        capture_log: Some(&capture),
        ..at(1_000, 10)
    };
    let done = run(&stores, &vars("ADD", "a", "web-0"), &config, &call);
    assert_eq!(done.exit_code, 0);
    let log = String::from_utf8(done.log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("allocating"))
        .unwrap_or_default();
    assert!(
        line.contains("DEBUG") && line.contains("pod=db/web-0") && line.contains("container=a"),
        "{log}"
    );
}

/// Found by review: a multi-line or 200 KB `ipkeep.dev/persistent-pod-state` was stored with
/// the pod's addresses as given (and made the pod count as managed). It cannot name a
/// PersistentPodState, so it is ignored with a warning, like any unreadable annotation; the
/// pod still starts.
#[test]
fn a_link_that_is_no_object_name_is_ignored_and_never_blocks_the_pod() {
    let huge = "w".repeat(200_000);
    for link in ["web\\nevil", huge.as_str(), "Web", "web/../x"] {
        let stores = MemoryStores::default();
        let conf = CONF.replace(
            r#""ipkeep.dev/persistent-pod-state":"web""#,
            &format!(r#""ipkeep.dev/persistent-pod-state":"{link}""#),
        );
        let mut result = (0, String::new());
        let warned = logged("warn", || {
            result = invoke_with(&stores, &conf, "ADD", "a", "web-0", &at(1_000, 10));
        });
        assert_eq!(result.0, 0, "{}", result.1);
        assert!(
            warned.contains("invalid annotation ipkeep.dev/persistent-pod-state"),
            "{warned}"
        );
        assert!(warned.len() < 2_000, "the warning stays short");
        let leases = stores.get(&dir()).unwrap().all().unwrap();
        let pod = leases[0].pod.as_ref().unwrap();
        assert_eq!(pod.persistent_pod_state, None, "nothing stored");
        // No PersistentPodState manages it, so its 1h annotation is not honoured.
        invoke_with(&stores, &conf, "DEL", "a", "web-0", &at(1_010, 20));
        assert!(stores.get(&dir()).unwrap().held().unwrap().is_empty());
    }
}
