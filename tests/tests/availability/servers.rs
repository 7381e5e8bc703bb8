//! The servers under attack: a real kube-apiserver (`ipkeep_tests::apiserver`) with the CRD, and the real
//! `ipkeep-scheduler-ext` and `ipkeep-controller` binaries against it, on loopback, with a
//! fresh CA and serving certificate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ipkeep_tests::apiserver::TestNamespace;
use ipkeep_tests::free_addr;

use super::clients::{Source, plain_get};

/// The name the serving certificate is for, as the API server checks it.
pub const SERVICE: &str = "ipkeep-scheduler-ext.ipkeep-system.svc";

/// A namespace of its own on the binary's kube-apiserver, and an admin kubeconfig for it in a
/// file; `None` when the test is skipped (no Go to build Kubernetes; a failure under CI).
pub struct Server {
    pub ns: TestNamespace,
    pub kubeconfig: PathBuf,
}

pub async fn api_server(test: &str, dir: &Path) -> Option<Server> {
    let ns = ipkeep_tests::apiserver::namespace(test, "db").await?;
    let kubeconfig = ns.kubeconfig_file(dir);
    Some(Server { ns, kubeconfig })
}

/// A binary under test, killed when dropped.
pub struct Process {
    child: Child,
    pub log: std::path::PathBuf,
}

impl Process {
    fn spawn(mut command: Command, log: std::path::PathBuf) -> Process {
        let file = std::fs::File::create(&log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start the binary");
        Process { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `path` over plain HTTP on `addr` until it answers 200.
async fn wait_ready(process: &mut Process, addr: SocketAddr, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if plain_get(Source::Observer, addr, path, Duration::from_secs(2))
            .await
            .is_some_and(|(status, _)| status == 200)
        {
            return;
        }
        if let Some(status) = process.exited() {
            panic!("the binary exited with {status}:\n{}", process.log_text());
        }
        assert!(
            Instant::now() < deadline,
            "{path} not ready in 60 s:\n{}",
            process.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `ipkeep-scheduler-ext` over TLS with a plain-HTTP probe port, as deployed.
pub struct SchedulerExt {
    pub process: Process,
    pub https: SocketAddr,
    pub probes: SocketAddr,
    pub ca: String,
}

impl SchedulerExt {
    pub async fn start(server: &Server, dir: &Path) -> SchedulerExt {
        let pki = ipkeep_tests::pki::serving(&[SERVICE]);
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &pki.cert).expect("cert");
        std::fs::write(&key, &pki.key).expect("key");
        let https = free_addr();
        let probes = free_addr();
        static BIN: OnceLock<PathBuf> = OnceLock::new();
        let bin = BIN.get_or_init(|| {
            ipkeep_tests::workspace_bin(
                "ipkeep-scheduler-ext",
                "IPKEEP_SCHEDULER_EXT_BIN",
                &["ipkeep-scheduler-ext"],
            )
        });
        let mut command = Command::new(bin);
        command
            .arg(format!("--webhook-listen={https}"))
            .arg(format!("--probe-listen={probes}"))
            .arg(format!("--tls-cert={}", cert.display()))
            .arg(format!("--tls-key={}", key.display()))
            .arg("--log=warn")
            .env("KUBECONFIG", &server.kubeconfig);
        let mut process = Process::spawn(command, dir.join("scheduler-ext.log"));
        wait_ready(&mut process, probes, "/readyz").await;
        SchedulerExt {
            process,
            https,
            probes,
            ca: pki.ca,
        }
    }

    /// Its metrics, read from an address no attack uses.
    pub async fn metrics(&self) -> String {
        metrics(self.probes).await
    }
}

/// `/metrics` of a binary's plain-HTTP port, read from an address no attack uses (empty if it
/// does not answer).
pub async fn metrics(addr: SocketAddr) -> String {
    plain_get(Source::Observer, addr, "/metrics", Duration::from_secs(3))
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// `ipkeep-controller` without leader election, its probe and metrics port on loopback, started
/// with a soft limit of `open_files` file descriptors (as containers often get).
pub struct Controller {
    pub process: Process,
    pub listen: SocketAddr,
}

impl Controller {
    pub async fn start(server: &Server, dir: &Path, open_files: u32) -> Controller {
        let listen = free_addr();
        let bin = ipkeep_tests::workspace_bin(
            "ipkeep-controller",
            "IPKEEP_CONTROLLER_BIN",
            &["ipkeep-controller"],
        );
        // The soft limit only: the process may raise it up to the hard limit itself.
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!(
                "ulimit -Sn {open_files} && exec \"$0\" --no-leader-election --probe-listen={listen} --log=warn"
            ))
            .arg(bin)
            .env("KUBECONFIG", &server.kubeconfig);
        let mut process = Process::spawn(command, dir.join("controller.log"));
        wait_ready(&mut process, listen, "/readyz").await;
        Controller { process, listen }
    }

    /// File descriptors open in the process now.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.process.pid())).map_or(0, Iterator::count)
    }
}
