//! What every long-running ipkeep binary (controller, scheduler extension, node agent) shares,
//! so they log and stop the same way: [`init_logging`] and [`shutdown_signal`].

use tracing_subscriber::EnvFilter;

/// How logs are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Plain,
    /// One JSON object per event, for log collectors.
    Json,
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
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    Ok(())
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
