//! What every long-running ipkeep binary (controller, scheduler extension, node agent) shares,
//! so they log, name themselves, reach the API server, cache objects, stop and export their
//! build and process the same way: [`LogArgs`], [`identity`], [`preflight`], [`lenient`],
//! [`shutdown_signal`], [`run_until_stopped`] and [`metrics`]; and the flags renamed in this
//! release ([`renamed`]).

pub mod bodies;
pub mod lenient;
pub mod metrics;
pub mod preflight;
pub mod renamed;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How logs are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Plain,
    /// One JSON object per event, for log collectors.
    Json,
}

/// The logging flags every binary takes (flatten into its clap `Args`).
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "IPKEEP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// Log filter ($RUST_LOG syntax), e.g. `info`, or `info,ipkeep_controller=debug` for one
    /// crate.
    #[arg(long, env = "IPKEEP_LOG", default_value = "info")]
    pub log: String,
}

impl LogArgs {
    /// [`init_logging`] with these flags.
    pub fn init(&self) -> Result<(), LogError> {
        init_logging(self.log_format, &self.log)
    }
}

/// This replica's name in Leases and Events: `given`, else `$POD_NAME`, else `$HOSTNAME`, else
/// `<program>-<pid>`.
pub fn identity(given: Option<String>, program: &str) -> String {
    given
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("{program}-{}", std::process::id()))
}

/// A log setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The filter does not parse.
    #[error("invalid log filter {filter:?} (expected e.g. info or info,ipkeep=debug): {source}")]
    BadFilter {
        /// As given.
        filter: String,
        /// Why.
        source: tracing_subscriber::filter::ParseError,
    },
}

/// Sends `tracing` events to stderr in `format`, filtered by `filter` (`$RUST_LOG` syntax),
/// without the response bodies kube-client would log ([`bodies`]).
pub fn init_logging(format: LogFormat, filter: &str) -> Result<(), LogError> {
    let env_filter = EnvFilter::try_new(filter).map_err(|source| LogError::BadFilter {
        filter: filter.to_string(),
        source,
    })?;
    let logs = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_ansi(colours(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
        ))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => logs.finish().with(bodies::NoResponseBodies).init(),
        LogFormat::Json => logs.json().finish().with(bodies::NoResponseBodies).init(),
    }
    Ok(())
}

/// Colours only for a person at a terminal: never in a file or a pipe (a container's log), nor
/// with `NO_COLOR` set (no-color.org).
fn colours(stderr_is_terminal: bool, no_color: bool) -> bool {
    stderr_is_terminal && !no_color
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested");
}

/// How long a daemon may take to stop after SIGTERM before it exits anyway: within the 30 s
/// Kubernetes gives a pod (`terminationGracePeriodSeconds`), with room for a `preStop` delay.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// A stop request that any number of tasks can wait for ([`Stop::requested`]).
#[derive(Debug, Clone)]
pub struct Stop(tokio::sync::watch::Receiver<bool>);

impl Stop {
    /// Resolves once the stop was requested (or the requester is gone).
    pub async fn requested(self) {
        let mut rx = self.0;
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Runs a daemon: `work` gets a [`Stop`] that resolves when `signal` does (SIGTERM, say), and
/// from then on has at most `grace` to end. Never returns: the process exits with 0 after a
/// clean end, and with 1 after an error (logged) or when the grace ran out, so that nothing
/// left running (a request waiting for a lock, a watch, a loop that does not stop) holds the
/// process past its grace.
pub async fn run_until_stopped<W, E>(
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    grace: std::time::Duration,
    work: impl FnOnce(Stop) -> W,
) -> !
where
    W: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = Stop(rx);
    tokio::spawn(async move {
        signal.await;
        let _ = tx.send(true);
    });
    let deadline = {
        let stop = stop.clone();
        async move {
            stop.requested().await;
            tokio::time::sleep(grace).await;
        }
    };
    let code = tokio::select! {
        result = work(stop) => match result {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(error = %e, "stopped with an error");
                1
            }
        },
        () = deadline => {
            tracing::error!(grace = ?grace, "still stopping {grace:?} after the stop was requested; exiting anyway");
            1
        }
    };
    std::process::exit(code)
}

#[cfg(test)]
mod stop_tests {
    /// A daemon whose work ignores the stop still exits once the grace has passed: checked in a
    /// child process, since `run_until_stopped` ends the process.
    #[test]
    fn work_that_ignores_the_stop_is_cut_at_the_grace() {
        if std::env::var_os("IPKEEP_DAEMON_STOP_CHILD").is_some() {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(super::run_until_stopped(
                async {},
                std::time::Duration::from_millis(200),
                |_stop| async {
                    std::future::pending::<()>().await;
                    Ok::<(), String>(())
                },
            ));
        }
        let started = std::time::Instant::now();
        let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "stop_tests::work_that_ignores_the_stop_is_cut_at_the_grace",
            ])
            .env("IPKEEP_DAEMON_STOP_CHILD", "1")
            .status()
            .expect("run the child");
        assert_eq!(status.code(), Some(1), "cut at the grace: exit 1");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}
