//! The `differential` suite again, with every `ipkeep` call (and admin command) going through one
//! running `ipkeep-agent`: both paths must give the same answers (see `ipkeep_tests::via_agent`).

#[path = "differential.rs"]
mod suite;

/// Guards the suite above: its commands really reach the agent (a plugin that silently fell
/// back would pass it too).
#[test]
fn commands_reach_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"probe","ipam":{{"type":"ipkeep","dataDir":"{}","ranges":[[{{"subnet":"10.77.0.0/29"}}]]}}}}"#,
        dir.path().display()
    );
    let out =
        ipkeep_tests::Invocation::new("ADD", "probe-1").run(&ipkeep_tests::ipkeep_bin(), &conf);
    assert!(out.ok(), "{out:?}");
    let metrics = ipkeep_tests::agent::shared().metrics();
    assert!(
        metrics.contains(r#"ipkeep_agent_requests_total{command="ADD",outcome="ok"}"#),
        "{metrics}"
    );
    assert!(
        !dir.path().join("probe").join("fallbacks").exists(),
        "the plugin fell back instead of using the agent"
    );
}
