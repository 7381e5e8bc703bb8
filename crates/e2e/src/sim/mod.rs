//! Small stand-ins for the parts of a cluster ipkeep does not provide. Each one polls the API
//! server (a few times a second) and acts like its real counterpart would on what it sees; none
//! keeps state the API server does not have, except the kubelet's sandboxes, as a real kubelet.

pub mod kubelet;
pub mod podgc;
pub mod scheduler;
pub mod statefulset;

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

/// Where the simulators say what they did (`<logs>/simulators.log`).
#[derive(Debug, Clone)]
pub struct SimLog {
    file: Arc<Mutex<File>>,
    start: Instant,
}

impl SimLog {
    /// Appends to `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
            start: Instant::now(),
        })
    }

    /// One line, stamped with the seconds since the start.
    pub fn line(&self, who: &str, what: &str) {
        let t = self.start.elapsed().as_secs_f64();
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(f, "{t:8.3}s {who:<18} {what}");
    }
}

/// Runs `tick` every `every` until the task is aborted; errors are logged and retried.
pub fn every<F, Fut>(name: String, every: Duration, log: SimLog, mut tick: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    tokio::spawn(async move {
        let mut last_error = String::new();
        loop {
            match tick().await {
                Ok(()) => last_error.clear(),
                Err(e) => {
                    let text = format!("{e:#}");
                    if text != last_error {
                        log.line(&name, &format!("error (retrying): {text}"));
                        last_error = text;
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}
