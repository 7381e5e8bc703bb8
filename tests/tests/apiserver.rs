//! The API-server harness (`ipkeep_tests::apiserver`) leaves nothing behind: once a test binary
//! that started etcd, kube-apiserver and kube-controller-manager has exited, none of them (nor
//! the shell that owns them) runs any more, and their directory is gone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "a_test_binary_that_starts_the_servers";

/// Run by [`no_server_outlives_its_test_binary`] in a process of its own: starts every server
/// the harness has and prints their directory.
#[test]
#[ignore = "run by no_server_outlives_its_test_binary, in a process of its own"]
fn a_test_binary_that_starts_the_servers() {
    let Some(server) = ipkeep_tests::apiserver::shared(CHILD) else {
        return;
    };
    server.start_gc();
    println!("apiserver-dir={}", server.dir().display());
}

#[test]
fn no_server_outlives_its_test_binary() {
    if !ipkeep_tests::cluster::require_go("no_server_outlives_its_test_binary") {
        return;
    }
    // Its stderr in a file: a pipe would be held open by the servers' shell for as long as it
    // runs, and reading it would wait for that.
    let stderr = tempfile::NamedTempFile::new().expect("a temporary file");
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([CHILD, "--exact", "--ignored", "--nocapture"])
        .stdin(Stdio::null())
        .stderr(stderr.reopen().expect("the temporary file"))
        .output()
        .expect("run this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = || std::fs::read_to_string(stderr.path()).unwrap_or_default();
    assert!(out.status.success(), "{stdout}\n{}", log());
    let Some(dir) = stdout
        .lines()
        .find_map(|l| l.strip_prefix("apiserver-dir="))
    else {
        panic!("the child started no servers:\n{stdout}\n{}", log());
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = processes_naming(dir);
        if left.is_empty() && !Path::new(dir).exists() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "30 s after the test binary exited, these processes still run: {left:#?}; its \
             directory {dir} exists: {}",
            Path::new(dir).exists()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `(pid, command line)` of every process whose command line contains `text`.
fn processes_naming(text: &str) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(text).then_some((pid, cmdline))
        })
        .collect()
}
