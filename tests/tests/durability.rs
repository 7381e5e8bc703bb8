//! An acknowledged commit is durable: the database file is fsynced (or fdatasynced) after its
//! last write and before the answer leaves the process, directly and through the agent.
//! Checked by tracing the real processes' system calls with strace. (Found by review: the sled
//! store only ever called `sync_file_range`, which does not survive a power loss.)

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::{Invocation, ipkeep_bin, with_agent_socket};

fn conf(data: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"durable","ipam":{{"type":"ipkeep","dataDir":"{}","agentSocket":"","ranges":[[{{"subnet":"10.89.0.0/24"}}]]}}}}"#,
        data.display()
    )
}

fn strace_available(test: &str) -> bool {
    let ok = Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let msg = format!("SKIPPED {test}: strace is not installed (scripts/install-deps.sh)");
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        eprintln!("{msg}");
    }
    ok
}

/// Checks a trace (`strace -f -y -s 256`): the last write to the database file is followed by
/// an fsync or fdatasync of it, which precedes the first write of the answer (a line matching
/// `answer`).
fn assert_synced_before_answer(trace: &str, answer: impl Fn(&str) -> bool) {
    let lines: Vec<&str> = trace.lines().collect();
    // Every file of the network's store lives in `<dataDir>/durable/`.
    let db = |l: &str| l.contains("/durable/");
    let answered = lines
        .iter()
        .position(|l| answer(l))
        .unwrap_or_else(|| panic!("no answer in the trace:\n{trace}"));
    let last_write = lines[..answered]
        .iter()
        .rposition(|l| db(l) && (l.contains("write(") || l.contains("pwrite64(")))
        .unwrap_or_else(|| panic!("no write to the database before the answer:\n{trace}"));
    let synced = lines[last_write..answered]
        .iter()
        .any(|l| db(l) && (l.contains("fsync(") || l.contains("fdatasync(")) && l.contains("= 0"));
    assert!(
        synced,
        "the database's last write is not fsynced before the answer:\n{}",
        lines[last_write..=answered].join("\n")
    );
}

#[test]
fn an_acknowledged_add_is_fsynced_before_the_answer() {
    if !strace_available("an_acknowledged_add_is_fsynced_before_the_answer") {
        return;
    }
    let data = tempfile::tempdir().expect("tempdir");
    let conf = conf(data.path());
    // The store exists already: the traced ADD is a plain commit.
    assert!(Invocation::new("ADD", "c0").run(&ipkeep_bin(), &conf).ok());
    let trace = data.path().join("trace");
    let mut cmd = Invocation::new("ADD", "c1").command(Path::new("strace"));
    cmd.args(["-f", "-y", "-s", "256", "-e"])
        .arg("trace=write,pwrite64,writev,sendto,sendmsg,fsync,fdatasync,sync_file_range,msync")
        .arg("-o")
        .arg(&trace)
        .arg(ipkeep_bin());
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("strace");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), conf.as_bytes())
        .expect("stdin");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&trace).expect("trace");
    assert_synced_before_answer(&text, |l| l.contains("write(1") && l.contains("cniVersion"));
}

#[test]
fn an_add_through_the_agent_is_fsynced_before_the_answer() {
    if !strace_available("an_add_through_the_agent_is_fsynced_before_the_answer") {
        return;
    }
    let data = tempfile::tempdir().expect("tempdir");
    let agent = Agent::start(data.path(), AgentOptions::default());
    let conf = with_agent_socket(&conf(data.path()), agent.socket());
    assert!(Invocation::new("ADD", "c0").run(&ipkeep_bin(), &conf).ok());
    let trace = data.path().join("trace");
    let mut strace = Command::new("strace")
        .args(["-f", "-y", "-s", "256", "-e"])
        .arg("trace=write,pwrite64,writev,sendto,sendmsg,fsync,fdatasync,sync_file_range,msync")
        .arg("-o")
        .arg(&trace)
        .arg("-p")
        .arg(agent.pid().to_string())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace");
    // Attached once it has traced something (the agent writes nothing while idle, so wait).
    std::thread::sleep(Duration::from_millis(700));
    let out = Invocation::new("ADD", "c1").run(&ipkeep_bin(), &conf);
    assert!(out.ok(), "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&trace).unwrap_or_default();
        if text.contains("cniVersion") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = strace.kill();
    let _ = strace.wait();
    assert_synced_before_answer(&text, |l| {
        (l.contains("UNIX") || l.contains("socket:")) && l.contains("cniVersion")
    });
}
