//! The helm the tests run (Helm 4, `scripts/helm-build.sh`, or `$IPKEEP_HELM`), and `helm` on a
//! cluster with a configuration of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::cluster::{repo_root, require_go};

/// The helm binary, or `None` (said once) when there is none and no Go to build it with.
pub fn binary(test: &str) -> Option<&'static PathBuf> {
    static HELM: OnceLock<Option<PathBuf>> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(h) = std::env::var_os("IPKEEP_HELM").filter(|h| !h.is_empty()) {
            return Some(PathBuf::from(h));
        }
        if !require_go(test) {
            return None;
        }
        let out = Command::new(repo_root().join("scripts/helm-build.sh"))
            .arg("--print-dir")
            .output()
            .expect("run scripts/helm-build.sh");
        assert!(
            out.status.success(),
            "scripts/helm-build.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("helm-build.sh prints the directory")
            .trim()
            .to_string();
        Some(PathBuf::from(dir).join("bin/helm"))
    })
    .as_ref()
}

/// `helm` against the cluster of `kubeconfig`, its configuration, cache and data under `home`.
#[derive(Debug)]
pub struct Helm {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Helm {
    /// helm for the cluster of `kubeconfig`, keeping its files in `home`.
    pub fn new(bin: &Path, kubeconfig: &Path, home: &Path) -> Helm {
        Helm {
            bin: bin.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
            home: home.to_path_buf(),
        }
    }

    /// `helm ARGS...`, whatever it returns.
    pub fn try_run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .output()
            .expect("run helm")
    }

    /// `helm ARGS...`: its output; panics with it when helm fails.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.try_run(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "helm {args:?} failed:\n{text}");
        text
    }
}
