//! The plugin's log format and level, shared by the plugin process and the node agent (which
//! formats a command's lines exactly as the plugin would, and sends them back to it).
//!
//! Logs go to `ipam.logFile` (default level info) or stderr (default level warn); never to
//! stdout, which carries only the CNI protocol. `IPKEEP_LOG` overrides the level.

use std::sync::{Arc, Mutex, PoisonError};

use crate::netconf::Settings;

/// The `hint` field of lines the plugin and the node agent both log: what the short message
/// means for the operator, kept out of the message so that it stays a stable phrase.
pub mod hint {
    /// The wall clock is far past the store's after a reboot, and not synchronised.
    pub const DOUBTED_WALL: &str = "until the kernel says the clock is synchronised (NTP), or the node has been up an hour, holdings end only by the time the store can prove";
    /// The wall clock jumped forward.
    pub const WALL_AHEAD: &str =
        "holdings end by the time elapsed on this boot, not by the wall clock";
}

/// The level: `IPKEEP_LOG` from the plugin's environment, else `ipam.logLevel`, else info with
/// a log file and warn without.
pub fn level(settings: &Settings, ipkeep_log: Option<&str>) -> tracing::Level {
    ipkeep_log
        .and_then(|l| l.parse().ok())
        .or(settings.log_level)
        .unwrap_or(if settings.log_file.is_some() {
            tracing::Level::INFO
        } else {
            tracing::Level::WARN
        })
}

/// The plugin's log format, at [`level`].
pub fn builder(
    settings: &Settings,
    ipkeep_log: Option<&str>,
) -> tracing_subscriber::fmt::SubscriberBuilder {
    tracing_subscriber::fmt()
        .with_max_level(level(settings, ipkeep_log))
        .with_target(false)
        .with_ansi(false)
}

/// Loggers that format a command's lines as the plugin process would and hand them back
/// ([`crate::Completion::log`]): the node agent runs commands for plugins and sends each its
/// lines. A logger serves one command at a time, and is kept for the life of the process: a
/// new subscriber makes tracing recompute every call site's interest.
#[derive(Debug, Default)]
pub struct Capture {
    idle: Mutex<Vec<Logger>>,
}

/// One logger of a [`Capture`], writing into its own buffer.
#[derive(Debug)]
struct Logger {
    level: tracing::Level,
    dispatch: tracing::Dispatch,
    lines: Lines,
    /// The thread it last served: a subscriber keeps span storage per thread it has served,
    /// so a thread is given the same logger again when it is idle.
    thread: std::thread::ThreadId,
}

/// A logger's buffer.
#[derive(Debug, Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// Runs `f` with what it logs on this thread formatted at `level` as the plugin process
    /// would; returns its result and the lines.
    pub fn run<R>(&self, level: tracing::Level, f: impl FnOnce() -> R) -> (R, Vec<u8>) {
        let logger = self.take(level);
        let result = tracing::dispatcher::with_default(&logger.dispatch, f);
        let lines = std::mem::take(
            &mut *logger
                .lines
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(logger);
        (result, lines)
    }

    /// An idle logger at `level` (the one this thread had last, if idle), or a new one when
    /// all are busy.
    fn take(&self, level: tracing::Level) -> Logger {
        let thread = std::thread::current().id();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let same = |l: &Logger| l.level == level && l.thread == thread;
        if let Some(i) = idle
            .iter()
            .position(same)
            .or_else(|| idle.iter().position(|l| l.level == level))
        {
            let mut logger = idle.swap_remove(i);
            logger.thread = thread;
            return logger;
        }
        drop(idle);
        let settings = Settings {
            log_level: Some(level),
            ..Settings::default()
        };
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = builder(&settings, None)
            .with_writer(move || sink.clone())
            .finish();
        Logger {
            level,
            dispatch: tracing::Dispatch::new(subscriber),
            lines,
            thread,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        let mut s = Settings::default();
        assert_eq!(level(&s, None), tracing::Level::WARN);
        s.log_file = Some("/var/log/ipkeep.log".into());
        assert_eq!(level(&s, None), tracing::Level::INFO);
        s.log_level = Some(tracing::Level::DEBUG);
        assert_eq!(level(&s, None), tracing::Level::DEBUG);
        assert_eq!(level(&s, Some("error")), tracing::Level::ERROR);
        assert_eq!(level(&s, Some("nonsense")), tracing::Level::DEBUG);
    }

    /// Two commands at a time each get their own lines, at their own level, and a logger is
    /// used again once its command is done.
    #[test]
    fn each_command_gets_its_own_lines() {
        let capture = Capture::default();
        let ((), outer) = capture.run(tracing::Level::INFO, || {
            tracing::info!("outer before");
            let ((), inner) = capture.run(tracing::Level::WARN, || {
                tracing::info!("inner info");
                tracing::warn!("inner warn");
            });
            let inner = String::from_utf8(inner).unwrap_or_default();
            assert!(inner.contains("inner warn"), "{inner}");
            assert!(!inner.contains("info"), "{inner}");
            tracing::debug!("outer debug");
            tracing::info!("outer after");
        });
        let outer = String::from_utf8(outer).unwrap_or_default();
        assert!(
            outer.contains("outer before") && outer.contains("outer after"),
            "{outer}"
        );
        assert!(
            !outer.contains("inner") && !outer.contains("debug"),
            "{outer}"
        );
        let ((), again) = capture.run(tracing::Level::INFO, || tracing::info!("again"));
        assert!(String::from_utf8_lossy(&again).contains("again"));
        assert_eq!(capture.idle.lock().map(|i| i.len()).unwrap_or(0), 2);
    }
}
