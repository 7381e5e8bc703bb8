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

use std::fmt;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
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
///
/// How the binaries log, so that lines read alike and log queries stay stable:
/// - the message is a short, stable phrase saying what happened (`deleted a stranded pod`);
///   the data goes in fields, and what an operator can do about it in a `hint` field;
/// - an error is the field `error = %e` (its `Display`): the plain format writes it on one line
///   ([`OneLineFields`]), and JSON escapes it, so an error quoting text from an object cannot
///   forge a line;
/// - other text from objects (names, annotation values) goes in as `?value` (`Debug`: quoted
///   and escaped).
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
        LogFormat::Plain => logs
            .fmt_fields(OneLineFields::default())
            .finish()
            .with(bodies::NoResponseBodies)
            .init(),
        LogFormat::Json => logs.json().finish().with(bodies::NoResponseBodies).init(),
    }
    Ok(())
}

/// The plain format's fields, as tracing-subscriber writes them but with line breaks escaped
/// (`\n`, `\r`): one event, one line, whatever text a field carries.
#[derive(Debug, Default)]
pub struct OneLineFields(DefaultFields);

impl<'writer> FormatFields<'writer> for OneLineFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut formatted = String::new();
        self.0.format_fields(Writer::new(&mut formatted), fields)?;
        let mut rest = formatted.as_str();
        while let Some(at) = rest.find(['\n', '\r']) {
            writer.write_str(&rest[..at])?;
            writer.write_str(if rest[at..].starts_with('\n') {
                "\\n"
            } else {
                "\\r"
            })?;
            rest = &rest[at + 1..];
        }
        writer.write_str(rest)
    }
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

#[cfg(test)]
mod log_tests {
    use std::sync::{Arc, Mutex};

    /// Text with line breaks, in the message or in a field written with `%`, stays on the
    /// event's line: nothing it carries can pass for a line of its own.
    #[test]
    fn a_plain_event_is_one_line_whatever_its_fields_carry() {
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(super::OneLineFields::default())
            .with_writer(move || writer.clone())
            .finish();
        let forged = "x\n1999-01-01T00:00:00Z  WARN forged: true\r";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(error = %forged, hint = "fix it", "a short message {}", forged);
        });
        let logged =
            String::from_utf8(captured.0.lock().unwrap_or_else(|e| e.into_inner()).clone())
                .unwrap_or_default();
        assert_eq!(logged.lines().count(), 1, "{logged}");
        assert!(
            logged.contains(r"error=x\n1999-01-01T00:00:00Z  WARN forged: true\r hint="),
            "{logged}"
        );
    }
}
