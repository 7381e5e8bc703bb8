//! The `apisim` binary (our in-memory API server) on a port of its own, driven with a given
//! kubectl; stopped when dropped. Used only to compare it with kube-apiserver.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::kubectl::Kubectl;
use crate::workspace_bin;

/// A running apisim.
#[derive(Debug)]
pub struct Apisim {
    child: Child,
    kubectl: Kubectl,
    _dir: tempfile::TempDir,
}

impl Apisim {
    /// Starts apisim (built first if stale) and waits for its kubeconfig; `kubectl` is the
    /// binary to drive it with.
    pub fn start(kubectl: &Path) -> Apisim {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("apisim.kubeconfig");
        let child = Command::new(workspace_bin(
            "apisim",
            "IPKEEP_APISIM_BIN",
            &["ipkeep-apisim"],
        ))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start apisim");
        let mut apisim = Apisim {
            child,
            kubectl: Kubectl::new(kubectl, &kubeconfig),
            _dir: dir,
        };
        let t = Instant::now();
        while !std::fs::read_to_string(&kubeconfig).is_ok_and(|k| k.contains("current-context")) {
            if let Ok(Some(status)) = apisim.child.try_wait() {
                panic!("apisim exited with {status}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "apisim wrote no kubeconfig in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        apisim
    }

    /// kubectl for this server.
    pub fn kubectl(&self) -> &Kubectl {
        &self.kubectl
    }
}

impl Drop for Apisim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
