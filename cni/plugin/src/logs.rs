//! The plugin's log format and level, shared by the plugin process and the node agent (which
//! formats a command's lines exactly as the plugin would, and sends them back to it).
//!
//! Logs go to `ipam.logFile` (default level info) or stderr (default level warn); never to
//! stdout, which carries only the CNI protocol. `IPKEEP_LOG` overrides the level.

use crate::netconf::Settings;

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
}
