//! What every long-running ipkeep binary (controller, scheduler extension, node agent) shares,
//! so they log, name themselves and stop the same way: [`LogArgs`], [`identity`] and
//! [`shutdown_signal`].

use tracing_subscriber::EnvFilter;

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

/// Sends `tracing` events to stderr in `format`, filtered by `filter` (`$RUST_LOG` syntax).
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
        LogFormat::Plain => logs.init(),
        LogFormat::Json => logs.json().init(),
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
