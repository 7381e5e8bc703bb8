//! kubectl (the one built with the Kubernetes components, never one installed on the machine)
//! bound to one kubeconfig.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// kubectl for one API server.
#[derive(Debug, Clone)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// `bin` run with `KUBECONFIG=kubeconfig`.
    pub fn new(bin: &Path, kubeconfig: &Path) -> Kubectl {
        Kubectl {
            bin: bin.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// The kubectl binary.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The kubeconfig it uses.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubectl command for this server.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    /// Runs kubectl with `args` (and `stdin`), returning its output whatever the exit status.
    pub fn try_run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.command();
        c.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn kubectl");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("write kubectl's stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("kubectl output")
    }

    /// Runs kubectl; panics with its stderr unless it succeeds; returns stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.try_run(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml`; panics unless it succeeds.
    pub fn apply(&self, yaml: &str) -> String {
        let out = self.try_run(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply failed: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get -o json` of `what` (e.g. `["pod", "db-0", "-n", "db"]`), or `None` if it
    /// does not exist.
    pub fn get(&self, what: &[&str]) -> Option<serde_json::Value> {
        let mut args = vec!["get", "-o", "json"];
        args.extend_from_slice(what);
        let out = self.try_run(&args, None);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("NotFound"), "kubectl {args:?} failed: {err}");
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("kubectl printed JSON"))
    }
}
