//! Test harness: the workload helpers of `ipkeep_tests::workload` (a namespace of its own on the
//! test binary's real kube-apiserver, Ready nodes, pods made as the StatefulSet controller, the
//! scheduler and the kubelet would), plus the ipkeep controller running in-process.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ipkeep_controller::http::Health;
use ipkeep_controller::leader::LeaderSettings;
use ipkeep_controller::{Settings, run};
pub use ipkeep_tests::workload::*;
use kube::Client;
use tokio::sync::oneshot;

/// A running controller.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ipkeep_controller::RunError>>,
    pub health: Arc<Health>,
}

pub fn start_controller(
    client: &Client,
    leader: Option<LeaderSettings>,
    identity: &str,
) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (stop, stopped) = oneshot::channel::<()>();
    let health = Arc::new(Health::default());
    let settings = Settings {
        concurrency: 4,
        debounce: Duration::from_millis(20),
        leader,
        identity: identity.into(),
    };
    let task = tokio::spawn(run(client.clone(), settings, health.clone(), async move {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        task,
        health,
    }
}

impl Running {
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        Ok(tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("controller did not stop within 20 s")
            .unwrap()?)
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

pub fn leader(namespace: &str, identity: &str) -> LeaderSettings {
    LeaderSettings {
        namespace: namespace.into(),
        lease_name: "ipkeep-controller".into(),
        identity: identity.into(),
        lease_seconds: 2,
        renew_before_seconds: 1,
    }
}
