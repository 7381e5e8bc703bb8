//! Bad input through the real binary: every case gets CNI error JSON with the right code and a
//! message, exit status 1 (never a panic or a signal), nothing on stdout but that JSON, and the
//! store exactly as it was.

use std::path::Path;

use ipkeep_tests::{Invocation, PluginOutput, ipkeep_bin, list_json};

fn good(data: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"bad","ipam":{{"type":"ipkeep","dataDir":"{}","retention":"1h","ranges":[[{{"subnet":"10.66.0.0/24"}}]]}}}}"#,
        data.display()
    )
}

fn assert_clean_failure(out: &PluginOutput, code: u64, what: &str) {
    assert_eq!(
        out.code,
        Some(1),
        "{what}: exit status 1, not a crash: {out:?}"
    );
    let json = out.json();
    assert_eq!(json["code"].as_u64(), Some(code), "{what}: {out:?}");
    assert!(
        json["msg"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: a message: {out:?}"
    );
    assert!(!out.stderr.contains("panicked"), "{what}: {out:?}");
}

#[test]
fn bad_configurations_and_environments_leave_the_store_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = good(dir.path());
    let pod = "IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=web-0";
    assert!(
        Invocation::new("ADD", "c1")
            .args(pod)
            .run(&ipkeep_bin(), &conf)
            .ok()
    );
    assert!(Invocation::new("ADD", "c2").run(&ipkeep_bin(), &conf).ok());
    assert!(
        Invocation::new("DEL", "c1")
            .args(pod)
            .run(&ipkeep_bin(), &conf)
            .ok()
    );
    let before = list_json(dir.path(), "bad");

    let huge = format!(
        r#"{{"cniVersion":"1.0.0","name":"bad","pad":"{}"}}"#,
        "x".repeat(2 << 20)
    );
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let with = |from: &str, to: &str| conf.replacen(from, to, 1);
    let configs: Vec<(String, u64, &str)> = vec![
        (
            r#"{"cniVersion":"1.0.0","name":"bad","#.into(),
            6,
            "truncated JSON",
        ),
        ("\u{0}\u{1}garbage\u{ff}".into(), 6, "binary garbage"),
        (String::new(), 6, "empty stdin"),
        (huge, 6, "2 MiB of JSON"),
        (deep, 6, "100k nested arrays"),
        ("[1,2,3]".into(), 6, "not an object"),
        (
            with(
                r#""ranges":[[{"subnet":"10.66.0.0/24"}]]"#,
                r#""ranges":"10.66.0.0/24""#,
            ),
            7,
            "ranges of the wrong type",
        ),
        (
            with(r#""retention":"1h""#, r#""retention":60"#),
            7,
            "retention of the wrong type",
        ),
        (with("1.0.0", "2.0.0"), 1, "unknown cniVersion"),
        (
            with(r#""cniVersion":"1.0.0","#, ""),
            7,
            "missing cniVersion",
        ),
        (
            with(r#""name":"bad""#, r#""name":"../etc""#),
            7,
            "network name with a path",
        ),
        (with("10.66.0.0/24", "10.66.0.0/33"), 7, "bad prefix"),
        (
            with(
                r#"{"subnet":"10.66.0.0/24"}"#,
                r#"{"subnet":"10.66.0.0/24"},{"subnet":"10.66.0.128/25"}"#,
            ),
            7,
            "overlap",
        ),
        (
            with(
                r#"{"subnet":"10.66.0.0/24"}"#,
                r#"{"subnet":"10.66.0.0/24","rangeStart":"10.66.0.9","rangeEnd":"10.66.0.3"}"#,
            ),
            7,
            "start after end",
        ),
        (
            with(
                r#"{"subnet":"10.66.0.0/24"}"#,
                r#"{"subnet":"10.66.0.0/24","gateway":"10.67.0.1"}"#,
            ),
            7,
            "gateway outside",
        ),
        (
            with(r#""retention":"1h""#, r#""retention":"1 fortnight""#),
            7,
            "bad retention",
        ),
        (
            with(r#""retention":"1h""#, r#""lockTimeout":"soon""#),
            7,
            "bad lock timeout",
        ),
        // Found by review: a huge lock timeout overflowed the deadline and panicked.
        (
            with(r#""retention":"1h""#, r#""lockTimeout":"1000000000000h""#),
            7,
            "huge lock timeout",
        ),
    ];
    for (stdin, code, what) in &configs {
        let out = Invocation::new("ADD", "c9").run(&ipkeep_bin(), stdin);
        assert_clean_failure(&out, *code, what);
    }
    let envs: Vec<(Invocation<'_>, &str)> = vec![
        (
            Invocation::new("ADD", "../../etc/passwd"),
            "container ID with a path",
        ),
        (
            Invocation::new("ADD", "c9").ifname("../../x"),
            "ifname with a path",
        ),
        (
            Invocation::new("ADD", "c9").ifname("averyveryverylongname"),
            "ifname too long",
        ),
        (
            Invocation::new("ADD", "c9").args("K8S_POD_NAMESPACE=db;K8S_POD_NAME=../../etc"),
            "pod name with a path",
        ),
        (
            Invocation::new("ADD", "c9").args("K8S_POD_NAMESPACE=../db;K8S_POD_NAME=web-0"),
            "namespace with a path",
        ),
        (Invocation::new("ADD", "c9").args("IP=999.1.1.1"), "bad IP="),
        (
            Invocation::new("ADD", "c9").args("FOO"),
            "bad CNI_ARGS pair",
        ),
        (Invocation::new("BOGUS", "c9"), "unknown command"),
    ];
    for (inv, what) in &envs {
        assert_clean_failure(&inv.run(&ipkeep_bin(), &conf), 4, what);
    }
    let mut no_env = Invocation::new("ADD", "c9").command(&ipkeep_bin());
    no_env.env_remove("CNI_NETNS");
    let out = PluginOutput::from(no_env.output().expect("run"));
    assert_clean_failure(&out, 4, "missing CNI_NETNS");

    assert_eq!(
        list_json(dir.path(), "bad"),
        before,
        "store untouched by every bad input"
    );
    let traversal = dir.path().parent().expect("tmp").join("etc");
    assert!(
        !traversal.exists(),
        "nothing was created outside the data directory"
    );
}

fn annotated(conf: &str, annotations: &str) -> String {
    conf.replacen(
        r#""name":"bad","#,
        &format!(
            r#""name":"bad","runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{"ipkeep.dev/persistent-pod-state":"web",{annotations}}}}},"#
        ),
        1,
    )
}

/// Found under containerd: a typo in a retention annotation made every ADD fail (code 7), so
/// the pod could never start; and a retention of 10,000 years passed the old grammar, then
/// panicked DEL (which aborted the whole agent) and `ipkeep list`. A pod's annotations are
/// written by whoever creates the pod: they may be wrong, never fatal.
#[test]
fn hostile_retention_annotations_never_block_a_pod_or_crash_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = good(dir.path());
    let cases = [
        ("web-0", r#""ipkeep.dev/ip-retention":"-1h""#, "1h"),
        ("web-1", r#""ipkeep.dev/ip-retention":"87600000h""#, "1h"),
        (
            "web-2",
            r#""io.kubernetes.cri/reserved-ip-duration":"99999999999999""#,
            "1h",
        ),
        ("web-3", r#""ipkeep.dev/ip-retention":"36500d""#, "36500d"),
    ];
    for (i, (pod, annotations, _)) in cases.iter().enumerate() {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod}");
        let cid = format!("c{i}");
        let conf = annotated(&conf, annotations);
        let add = Invocation::new("ADD", &cid)
            .args(&args)
            .run(&ipkeep_bin(), &conf);
        assert_eq!(add.code, Some(0), "{pod}: the pod starts: {add:?}");
        let del = Invocation::new("DEL", &cid)
            .args(&args)
            .run(&ipkeep_bin(), &conf);
        assert_eq!(del.code, Some(0), "{pod}: DEL works: {del:?}");
        assert!(!add.stderr.contains("panicked") && !del.stderr.contains("panicked"));
        if i < 3 {
            assert!(
                add.stderr.contains("WARN") && add.stderr.contains(&format!("db/{pod}")),
                "{pod}: a warning that names the pod: {add:?}"
            );
        }
    }
    let list = list_json(dir.path(), "bad");
    let held: Vec<(String, serde_json::Value)> = list["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| {
            (
                l["pod"]["name"].as_str().unwrap_or("").to_string(),
                l["retention"].clone(),
            )
        })
        .collect();
    for (pod, _, want) in cases {
        let got = &held.iter().find(|(p, _)| p == pod).expect("held").1;
        let secs = if want == "1h" { 3600 } else { 36500 * 86400 };
        assert_eq!(got["seconds"].as_u64(), Some(secs), "{pod}: {got}");
    }
    let table = std::process::Command::new(ipkeep_bin())
        .args([
            "--agent-socket",
            "",
            "list",
            "--network",
            "bad",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .expect("ipkeep list");
    assert!(table.status.success(), "{table:?}");
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("2126-"),
        "{table:?}"
    );
}
