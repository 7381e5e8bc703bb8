//! Real network namespaces (needs root): Debian's `bridge` plugin delegating to `ipkeep`; two
//! pods ping each other; one is destroyed and re-created with a new sandbox ID and comes back
//! with the same IP, reachable again. Skips loudly when not root (fails under CI).

use ipkeep_tests::{demo, ipkeep_bin, reference_plugin, require_root};

#[test]
fn netns_root_rebuilt_pod_keeps_its_ip_and_is_reachable() {
    if !require_root("netns_root_rebuilt_pod_keeps_its_ip_and_is_reachable")
        || reference_plugin("bridge").is_none()
    {
        return;
    }
    let bin = ipkeep_bin();
    let data = tempfile::tempdir().expect("tempdir");
    let mut narration = Vec::new();
    let report = demo::run(bin.parent().expect("bin dir"), data.path(), &mut narration)
        .unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(&narration)));
    eprintln!("{}", String::from_utf8_lossy(&narration));
    assert_eq!(report.before, report.after, "same IP after rebuild");
    assert_ne!(
        report.bystander, report.before,
        "the held address went to nobody else"
    );
    assert_eq!(report.before, "10.123.0.2");
}
