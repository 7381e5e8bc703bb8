//! ipkeep called as container runtimes call it: through libcni 1.3 (what containerd 2.x links
//! through go-cni, and CRI-O through ocicni), by the `libcni-driver` scripts/runtime-build.sh
//! builds, with `bridge` of the CNI plugins 1.10 in front and a `cniVersion: 1.1.0`
//! configuration, in real network namespaces (needs root and Go; skipped loudly without, a
//! failure under CI).
//!
//! - STATUS goes through `bridge` into ipkeep, and says why when the store could not take an
//!   ADD (its file system full), and succeeds again once space is freed.
//! - GC with `cni.dev/valid-attachments`: libcni first DELs the attachments it has cached that
//!   are not valid, then sends GC; ipkeep frees the address of a sandbox the runtime forgot (no
//!   cache entry, so only GC can find it), keeps the valid ones, and keeps an address held for a
//!   retained pod whose sandbox is gone: the pod's next sandbox gets it back.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ipkeep_tests::cluster::{repo_root, require_go};
use ipkeep_tests::mountns::{MountNs, SandboxNetns};
use ipkeep_tests::{Netns, ipkeep_bin, list_json, require_root};

const NETWORK: &str = "libcni-net";

/// The node runtime's build (scripts/runtime-build.sh; cached, so a second or two when warm),
/// asked once for all the tests of this binary.
fn runtime_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(build_runtime).clone()
}

fn build_runtime() -> PathBuf {
    let out = Command::new(repo_root().join("scripts/runtime-build.sh"))
        .arg("--print-dir")
        .output()
        .expect("scripts/runtime-build.sh");
    assert!(
        out.status.success(),
        "scripts/runtime-build.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(text.lines().last().expect("the runtime's directory").trim())
}

/// What libcni calls for the network.
#[derive(Clone, Copy, PartialEq)]
enum Chain {
    /// `bridge` (its own bridge name) delegating to ipkeep, as on a node.
    Bridge(&'static str),
    /// ipkeep itself as the list's plugin: how a main plugin that passes GC on to its IPAM
    /// would call it (none of the reference plugins 1.10 does).
    Direct,
}

/// A configuration directory with one `cniVersion: 1.1.0` list whose IPAM is ipkeep, retaining
/// named pods' addresses for an hour.
fn write_conf(dir: &Path, data: &Path, chain: Chain, subnet: &str) -> PathBuf {
    let conf_dir = dir.join("net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let ipam = serde_json::json!({
        "type": "ipkeep",
        "dataDir": data,
        "agentSocket": "",
        "retention": "1h",
        "reuseCooldown": "0",
        "ranges": [[{"subnet": subnet}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    });
    let plugin = match chain {
        Chain::Bridge(name) => serde_json::json!({
            "type": "bridge", "bridge": name, "isGateway": true, "ipam": ipam,
        }),
        Chain::Direct => serde_json::json!({"type": "ipkeep", "ipam": ipam}),
    };
    let conf = serde_json::json!({"cniVersion": "1.1.0", "name": NETWORK, "plugins": [plugin]});
    std::fs::write(conf_dir.join("10-libcni.conflist"), conf.to_string()).unwrap();
    conf_dir
}

/// Runs `libcni-driver ARGS` as a runtime on this node would: the plugins from the runtime's
/// build and ipkeep's, libcni's cache in `dir`.
struct Driver {
    bin: PathBuf,
    conf_dir: PathBuf,
    cni_path: String,
    cache: PathBuf,
}

impl Driver {
    fn new(runtime: &Path, conf_dir: PathBuf, dir: &Path) -> Driver {
        let ipkeep = ipkeep_bin();
        Driver {
            bin: runtime.join("bin/libcni-driver"),
            conf_dir,
            cni_path: format!(
                "{}:{}",
                runtime.join("cni").display(),
                ipkeep.parent().unwrap().display()
            ),
            cache: dir.join("cache"),
        }
    }

    /// The driver's command, run by `prefix` (a namespace's `nsenter`/`ip netns exec`).
    fn command(&self, prefix: &[String], args: &[&str], cni_args: &str) -> Command {
        let mut cmd = Command::new(&prefix[0]);
        cmd.args(&prefix[1..])
            .arg(&self.bin)
            .args(args)
            .env("NETCONFPATH", &self.conf_dir)
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_CACHE_DIR", &self.cache)
            .env("CNI_ARGS", cni_args);
        cmd
    }

    fn run(&self, prefix: &[String], args: &[&str], cni_args: &str) -> Output {
        self.command(prefix, args, cni_args)
            .output()
            .expect("libcni-driver")
    }

    fn ok(&self, prefix: &[String], args: &[&str], cni_args: &str) -> String {
        let out = self.run(prefix, args, cni_args);
        assert!(
            out.status.success(),
            "libcni-driver {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn pod_args(name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={name};K8S_POD_UID=uid-{name}")
}

/// The address of the result an ADD printed.
fn address(result: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(result).expect("an ADD result");
    let cidr = v["ips"][0]["address"].as_str().expect("an address");
    cidr.split('/').next().unwrap().to_string()
}

/// `(ip, pod name, held)` of every lease in the store.
fn leases(data: &Path) -> Vec<(String, String, bool)> {
    let v = list_json(data, NETWORK);
    v["leases"]
        .as_array()
        .or_else(|| v.as_array())
        .unwrap_or_else(|| panic!("no leases in {v}"))
        .iter()
        .map(|l| {
            (
                l["ip"].as_str().unwrap_or_default().to_string(),
                l["pod"]["name"].as_str().unwrap_or_default().to_string(),
                l.get("held").is_some_and(|h| !h.is_null()) || l["state"] == "held",
            )
        })
        .collect()
}

fn ready(test: &str) -> Option<PathBuf> {
    if !require_root(test) || !require_go(test) {
        return None;
    }
    Some(runtime_dir())
}

/// What a GC scenario leaves: the address of the `forgotten` attachment and the store's leases.
struct AfterGc {
    forgotten: String,
    leases: Vec<(String, String, bool)>,
}

/// Through libcni: ADDs of db-0 (still running, the one valid attachment), db-1 (then deleted:
/// its address is held), and two unnamed attachments whose sandboxes went while the runtime was
/// down, one still in libcni's cache and one `forgotten` (its cache entry lost: only the GC
/// verb can tell ipkeep); then GC. Checks what every chain must do: db-0 keeps its address,
/// db-1's stays held and comes back to its next sandbox, the cached one is freed (libcni DELs
/// it).
fn gc_scenario(runtime: &Path, chain: Chain, subnet: &str) -> AfterGc {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let conf_dir = write_conf(dir.path(), &data, chain, subnet);
    let driver = Driver::new(runtime, conf_dir, dir.path());
    // The node: bridge makes its bridge and veths here, not in the host's namespace.
    let node = Netns::new(&format!(
        "ipkeep-libcni-{}",
        subnet.split('.').nth(1).unwrap()
    ));
    let on_node = ["ip", "netns", "exec", node.name()]
        .map(String::from)
        .to_vec();
    let sandbox = |name: &str| SandboxNetns::new(&dir.path().join(format!("netns-{name}")));
    let add = |ns: &SandboxNetns, cid: &str, args: &str| {
        address(&driver.ok(&on_node, &["add", NETWORK, ns.path(), cid], args))
    };

    let (a, b, c, d) = (sandbox("a"), sandbox("b"), sandbox("c"), sandbox("d"));
    let valid = add(&a, "ctr-a", &pod_args("db-0"));
    let held = add(&b, "ctr-b", &pod_args("db-1"));
    // Attachments without a pod name (not Kubernetes'): never retained.
    let cached = add(&c, "ctr-c", "IgnoreUnknown=1");
    let forgotten = add(&d, "ctr-d", "IgnoreUnknown=1");
    driver.ok(&on_node, &["status", NETWORK], "");

    // db-1's sandbox is torn down as usual (DEL, then the namespace goes): its address is held.
    driver.ok(
        &on_node,
        &["del", NETWORK, b.path(), "ctr-b"],
        &pod_args("db-1"),
    );
    // ctr-c's and ctr-d's sandboxes went while the runtime was down; it lost ctr-d's cache entry.
    drop((b, c, d));
    let cached_files: Vec<_> = std::fs::read_dir(driver.cache.join("results"))
        .expect("libcni's result cache")
        .map(|e| e.unwrap().path())
        .collect();
    let d_cache: Vec<_> = cached_files
        .iter()
        .filter(|p| p.to_string_lossy().ends_with("ctr-d-eth0"))
        .collect();
    assert_eq!(d_cache.len(), 1, "libcni's cache: {cached_files:?}");
    std::fs::remove_file(d_cache[0]).unwrap();
    let before = leases(&data);
    assert!(
        before.contains(&(held.clone(), "db-1".into(), true)),
        "{before:?}"
    );
    assert_eq!(before.len(), 4, "{before:?}");

    driver.ok(&on_node, &["gc", NETWORK, "ctr-a/eth0"], "");
    let leases = leases(&data);
    eprintln!(
        "{chain_name} after GC: {leases:?}",
        chain_name = match chain {
            Chain::Bridge(_) => "bridge",
            Chain::Direct => "ipkeep directly",
        }
    );
    assert!(
        leases.contains(&(valid.clone(), "db-0".into(), false)),
        "the valid attachment lost its address: {leases:?}"
    );
    assert!(
        leases.contains(&(held.clone(), "db-1".into(), true)),
        "GC freed the address held for db-1: {leases:?}"
    );
    assert!(
        !leases.iter().any(|l| l.0 == cached),
        "libcni's DEL of the stale cached attachment did not free {cached}: {leases:?}"
    );

    // db-1's next sandbox gets its address back.
    let b2 = sandbox("b2");
    assert_eq!(
        add(&b2, "ctr-b2", &pod_args("db-1")),
        held,
        "db-1 came back with another address"
    );
    for (cid, ns) in [("ctr-a", &a), ("ctr-b2", &b2)] {
        driver.ok(&on_node, &["check", NETWORK, ns.path(), cid], "");
    }
    AfterGc { forgotten, leases }
}

#[test]
fn gc_through_libcni_reaches_ipkeep_and_keeps_held_addresses() {
    let Some(runtime) = ready("gc_through_libcni_reaches_ipkeep_and_keeps_held_addresses") else {
        return;
    };
    let gc = gc_scenario(&runtime, Chain::Direct, "10.126.0.0/24");
    assert!(
        !gc.leases.iter().any(|l| l.0 == gc.forgotten),
        "GC did not free the forgotten sandbox's address {}: {:?}",
        gc.forgotten,
        gc.leases
    );
    assert_eq!(gc.leases.len(), 2, "{:?}", gc.leases);
}

/// `bridge` 1.10 answers GC itself without passing it to its IPAM (its source: `/* FIXME GC
/// */`), so on a bridge (or flannel) network a runtime's GC reaches ipkeep only as libcni's DELs
/// of the attachments it has cached; an address whose attachment the runtime forgot stays until
/// the node agent's missed-DEL sweep (docs/agent.md). If a bridge release passes GC on, this
/// test fails: then GC frees it too, and the docs change.
#[test]
fn gc_through_bridge_reaches_ipkeep_only_as_dels_of_cached_attachments() {
    let Some(runtime) =
        ready("gc_through_bridge_reaches_ipkeep_only_as_dels_of_cached_attachments")
    else {
        return;
    };
    let gc = gc_scenario(&runtime, Chain::Bridge("ipklibcni0"), "10.125.0.0/24");
    assert!(
        gc.leases
            .contains(&(gc.forgotten.clone(), String::new(), false)),
        "the forgotten sandbox's address {} was freed: does bridge pass GC on now? {:?}",
        gc.forgotten,
        gc.leases
    );
    assert_eq!(gc.leases.len(), 3, "{:?}", gc.leases);
}

#[test]
fn status_through_bridge_says_when_the_store_cannot_take_an_add() {
    let Some(runtime) = ready("status_through_bridge_says_when_the_store_cannot_take_an_add")
    else {
        return;
    };
    let Some(mount) = MountNs::new("status_through_bridge_says_when_the_store_cannot_take_an_add")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    mount.mount_tmpfs(&data, "2m");
    let conf_dir = write_conf(
        dir.path(),
        &data,
        Chain::Bridge("ipklibcni1"),
        "10.127.0.0/24",
    );
    let driver = Driver::new(&runtime, conf_dir, dir.path());
    let in_mount = mount.prefix();
    driver.ok(&in_mount, &["status", NETWORK], "");

    // Fill the store's file system, leaving less than ipkeep needs to record an address.
    let filler = data.join("filler");
    assert!(
        mount.sh(&format!(
            "dd if=/dev/zero of={} bs=64k count=31 2>/dev/null; sync",
            filler.display()
        )),
        "fill the tmpfs"
    );
    let out = driver.run(&in_mount, &["status", NETWORK], "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "STATUS succeeded on a full disk");
    assert!(
        err.contains("bytes free") && err.contains(&data.display().to_string()),
        "STATUS did not say why: {err}"
    );
    eprintln!(
        "STATUS on a full disk, as libcni reports it: {}",
        err.trim()
    );

    assert!(
        mount.sh(&format!("rm {}", filler.display())),
        "free the space"
    );
    driver.ok(&in_mount, &["status", NETWORK], "");
}
