//! IP retention through the real binary: identities from `CNI_ARGS`, durations from pod
//! annotations in `runtimeConfig` (in full only for pods a PersistentPodState manages),
//! OpenKruise's annotation and `ipam.retention`, GC, and the admin subcommands.

use std::path::Path;
use std::process::Command;

use ipkeep_tests::{Invocation, PluginOutput, admin_command, ipkeep_bin, list_json};

fn conf(data: &Path, annotations: &str, retention: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"ret","runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{{annotations}}}}},"ipam":{{"type":"ipkeep","dataDir":"{}","retention":"{retention}","ranges":[[{{"subnet":"10.40.0.0/29"}}],[{{"subnet":"fd00:40::/125"}}]]}}}}"#,
        data.display()
    )
}

/// A pod annotation naming the PersistentPodState that manages it, as the webhook stamps it.
const MANAGED: &str = r#""ipkeep.dev/persistent-pod-state":"web","#;

fn pod_args(name: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=uid-{name}"
    )
}

fn run(cmd: &str, cid: &str, pod: &str, conf: &str) -> PluginOutput {
    let args = pod_args(pod);
    Invocation::new(cmd, cid)
        .args(&args)
        .run(&ipkeep_bin(), conf)
}

fn add(cid: &str, pod: &str, conf: &str) -> Vec<String> {
    let out = run("ADD", cid, pod, conf);
    assert!(out.ok(), "ADD {cid} {pod}: {out:?}");
    out.ips()
}

fn del(cid: &str, pod: &str, conf: &str) {
    let out = run("DEL", cid, pod, conf);
    assert!(out.ok() && out.stdout.is_empty(), "DEL {cid}: {out:?}");
}

fn states(data: &Path) -> Vec<(String, String, String)> {
    let list = list_json(data, "ret");
    list["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| {
            (
                l["ip"].as_str().unwrap_or_default().to_string(),
                l["owner"]["containerId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                l["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn rebuilt_pod_gets_its_addresses_back_and_nobody_else_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = conf(
        dir.path(),
        &format!(r#"{MANAGED}"ipkeep.dev/ip-retention":"30m""#),
        "0",
    );
    let first = add("sandbox-a", "web-0", &c);
    assert_eq!(first, ["10.40.0.2", "fd00:40::2"]);
    del("sandbox-a", "web-0", &c);
    assert!(states(dir.path()).iter().all(|(_, _, s)| s == "held"));
    // other pods fill the range set around the held addresses
    let others: Vec<Vec<String>> = (1..5)
        .map(|i| add(&format!("o{i}"), &format!("web-{i}"), &c))
        .collect();
    assert!(
        others
            .iter()
            .all(|ips| !ips.contains(&first[0]) && !ips.contains(&first[1]))
    );
    // the rebuilt pod: new sandbox ID, new UID, same name → same addresses on both families
    assert_eq!(add("sandbox-b", "web-0", &c), first);
    // the old sandbox's late DEL changes nothing
    del("sandbox-a", "web-0", &c);
    let owned: Vec<_> = states(dir.path())
        .into_iter()
        .filter(|(ip, _, _)| first.contains(ip))
        .collect();
    assert!(
        owned
            .iter()
            .all(|(_, cid, st)| cid == "sandbox-b" && st == "active"),
        "{owned:?}"
    );
}

#[test]
fn log_file_records_what_happened_to_whom() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("ipkeep.log");
    let c = conf(
        dir.path(),
        &format!(r#"{MANAGED}"ipkeep.dev/ip-retention":"30m""#),
        "0",
    )
    .replacen(
        r#""retention":"0""#,
        &format!(r#""retention":"0","logFile":"{}""#, log.display()),
        1,
    );
    add("sandbox-a", "web-0", &c);
    del("sandbox-a", "web-0", &c);
    add("sandbox-b", "web-0", &c);
    let text = std::fs::read_to_string(&log).expect("log file written");
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{text}"))
            .to_string()
    };
    let held = line("holding the address for the pod");
    assert!(
        held.contains("DEL") && held.contains("db/web-0") && held.contains("sandbox-a"),
        "{held}"
    );
    let back = line("gave the pod its retained address back");
    assert!(
        back.contains("sandbox-b") && back.contains("from=sandbox-a/eth0"),
        "{back}"
    );
}

#[test]
fn retention_sources_and_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    // OpenKruise's minutes annotation
    let kruise = conf(
        dir.path(),
        &format!(r#"{MANAGED}"io.kubernetes.cri/reserved-ip-duration":"5""#),
        "0",
    );
    add("k1", "kruise-0", &kruise);
    del("k1", "kruise-0", &kruise);
    // the network default
    let default = conf(dir.path(), "", "24h");
    add("d1", "default-0", &default);
    del("d1", "default-0", &default);
    // "0" turns it off even when the network default is on
    let off = conf(dir.path(), r#""ipkeep.dev/ip-retention":"0""#, "24h");
    add("z1", "off-0", &off);
    del("z1", "off-0", &off);
    let list = list_json(dir.path(), "ret");
    let leases = list["leases"].as_array().expect("leases");
    let by_pod = |name: &str| leases.iter().filter(|l| l["pod"]["name"] == name).count();
    assert_eq!(
        (by_pod("kruise-0"), by_pod("default-0"), by_pod("off-0")),
        (2, 2, 0)
    );
    let kruise_lease = leases
        .iter()
        .find(|l| l["pod"]["name"] == "kruise-0")
        .expect("kruise");
    assert_eq!(
        kruise_lease["retention"],
        serde_json::json!({"seconds": 300})
    );
    // A bad annotation never blocks the pod: the network's retention applies, with a warning
    // that names the pod and the annotation (found under containerd: it failed every ADD).
    let bad = conf(
        dir.path(),
        &format!(r#"{MANAGED}"ipkeep.dev/ip-retention":"soon""#),
        "24h",
    );
    let out = run("ADD", "b1", "bad-0", &bad);
    assert!(out.ok(), "{out:?}");
    assert!(
        out.stderr.contains("ipkeep.dev/ip-retention")
            && out.stderr.contains("db/bad-0")
            && out.stderr.contains("1d"),
        "{out:?}"
    );
}

/// Found by review: any pod creator could hold a node's addresses forever with an annotation
/// (five `forever` pods filled a /29). Annotations count in full only for pods a
/// PersistentPodState manages; others get at most `ipam.maxUnmanagedRetention` (default 0); and
/// whatever is held, a full range gives a new pod a held address rather than starve it.
#[test]
fn unmanaged_pods_cannot_exhaust_a_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let forever = conf(dir.path(), r#""ipkeep.dev/ip-retention":"forever""#, "0");
    for i in 0..5 {
        add(&format!("u{i}"), &format!("squat-{i}"), &forever);
        del(&format!("u{i}"), &format!("squat-{i}"), &forever);
    }
    assert!(
        states(dir.path()).is_empty(),
        "unmanaged pods' annotations are ignored by default: {:?}",
        states(dir.path())
    );
    // An operator who lets unmanaged pods keep addresses for a while still never starves a pod.
    let allowed = forever.replacen(
        r#""retention":"0""#,
        r#""retention":"0","maxUnmanagedRetention":"forever""#,
        1,
    );
    for i in 0..5 {
        add(&format!("v{i}"), &format!("squat-{i}"), &allowed);
        del(&format!("v{i}"), &format!("squat-{i}"), &allowed);
    }
    let held = states(dir.path());
    assert!(
        held.len() == 10 && held.iter().all(|(_, _, s)| s == "held"),
        "{held:?}"
    );
    let out = run("ADD", "n1", "newcomer-0", &allowed);
    assert!(out.ok(), "a full range gives way to a new pod: {out:?}");
    assert!(
        out.stderr.contains("the range is full") && out.stderr.contains("db/squat-"),
        "a warning says whose holding gave way: {out:?}"
    );
}

#[test]
fn gc_never_frees_held_addresses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = conf(
        dir.path(),
        &format!(r#"{MANAGED}"ipkeep.dev/ip-retention":"forever""#),
        "0",
    );
    add("live", "web-0", &c);
    add("gone", "web-1", &c);
    del("gone", "web-1", &c);
    add("leaked", "web-2", &c);
    let gc_conf = c.replacen(
        r#""name":"ret","#,
        r#""name":"ret","cni.dev/valid-attachments":[{"containerID":"live","ifname":"eth0"}],"#,
        1,
    );
    let out = Invocation::new("GC", "-").run(&ipkeep_bin(), &gc_conf);
    assert!(out.ok() && out.stdout.is_empty(), "{out:?}");
    let st = states(dir.path());
    let count =
        |cid: &str, state: &str| st.iter().filter(|(_, c, s)| c == cid && s == state).count();
    assert_eq!(count("live", "active"), 2);
    assert_eq!(count("gone", "held"), 2, "held reservation survives GC");
    assert_eq!(
        count("leaked", "held"),
        2,
        "a missed DEL of a retained pod becomes a holding"
    );
    let no_list = Invocation::new("GC", "-").run(&ipkeep_bin(), &c);
    assert_eq!(
        no_list.error_code(),
        Some(7),
        "GC without a valid list refuses: {no_list:?}"
    );
}

#[test]
fn admin_list_and_release() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = conf(
        dir.path(),
        &format!(r#"{MANAGED}"ipkeep.dev/ip-retention":"forever""#),
        "0",
    );
    add("a", "web-0", &c);
    del("a", "web-0", &c);
    add("b", "web-1", &c);
    let table = admin_command(dir.path())
        .args(["list", "--network", "ret", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("list");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{table:?}");
    assert!(
        text.contains("held") && text.contains("forever") && text.contains("db/web-0"),
        "{text}"
    );
    assert!(
        text.contains("range set 0 (10.40.0.1-10.40.0.6): 5 addresses, 1 in use, 1 held, 3 free"),
        "{text}"
    );
    let release = |pod: &str, extra: &[&str]| {
        let out = admin_command(dir.path())
            .args(["release", "--network", "ret", "--pod", pod, "--data-dir"])
            .arg(dir.path())
            .args(extra)
            .output()
            .expect("release");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, _) = release("db/web-0", &[]);
    assert!(
        ok && out.contains("released 10.40.0.2") && out.contains("released fd00:40::2"),
        "{out}"
    );
    let (ok, out, _) = release("db/web-1", &[]);
    assert!(
        ok && out.contains("kept"),
        "active addresses are kept: {out}"
    );
    let (ok, _, err) = release("web-1", &[]);
    assert!(!ok && err.contains("NAMESPACE/NAME"), "{err}");
    let missing = admin_command(dir.path())
        .args(["list", "--network", "nope", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("list");
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no ipkeep state for network \"nope\"")
    );
    assert_eq!(states(dir.path()).len(), 2);
}

#[test]
fn no_arguments_prints_what_it_is() {
    let out = Command::new(ipkeep_bin())
        .env_clear()
        .output()
        .expect("run");
    assert!(out.status.success());
    assert!(out.stdout.is_empty(), "stdout is for the protocol only");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CNI ipkeep plugin version") && err.contains("1.1.0"),
        "{err}"
    );
    let help = Command::new(ipkeep_bin())
        .arg("--help")
        .output()
        .expect("help");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("list") && text.contains("release"), "{text}");
}

/// Found by review: after a force delete (`--grace-period=0`) the new sandbox took the address
/// of the old sandbox of the same pod while that one still ran: two network namespaces, one
/// address, one bridge. The address moves only once the old sandbox's namespace is gone; until
/// then the runtime is told to try again (code 11), which it does.
#[test]
fn a_force_deleted_pods_old_sandbox_keeps_its_address_until_it_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = conf(
        dir.path(),
        &format!(r#"{MANAGED}"ipkeep.dev/ip-retention":"1h""#),
        "0",
    );
    let old_netns = dir.path().join("cni-old");
    std::fs::write(&old_netns, "").expect("a stand-in for the old sandbox's namespace");
    let args = pod_args("web-0");
    let old_path = old_netns.display().to_string();
    let mut old = Invocation::new("ADD", "sandbox-old").args(&args);
    old.netns = &old_path;
    let first = old.run(&ipkeep_bin(), &c);
    assert!(first.ok(), "{first:?}");
    let new = Invocation::new("ADD", "sandbox-new").args(&args);
    let refused = new.run(&ipkeep_bin(), &c);
    assert_eq!(refused.error_code(), Some(11), "{refused:?}");
    let msg = refused.json()["msg"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("sandbox-old") && msg.contains("still exists"),
        "{msg}"
    );
    assert!(
        states(dir.path())
            .iter()
            .all(|(_, cid, st)| cid == "sandbox-old" && st == "active"),
        "the old sandbox keeps its addresses"
    );
    std::fs::remove_file(&old_netns).expect("the old sandbox is torn down");
    let retried = new.run(&ipkeep_bin(), &c);
    assert!(retried.ok(), "{retried:?}");
    assert_eq!(retried.ips(), first.ips(), "the pod keeps its addresses");
}
