//! Log lines about turned-away connections, at most one per [`REPORT_EVERY`] per listener:
//! under an attack a line per connection would flood the log (and cost more than the
//! connection), yet the operator needs to learn that it happens, how much, and from where.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Limits;

/// How often at most a listener writes a summary.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Counts since the last summary.
#[derive(Debug, Default)]
struct Tally {
    by_reason: HashMap<&'static str, u64>,
    by_source: HashMap<IpAddr, u64>,
    last_error: Option<String>,
}

/// A listener's summaries.
#[derive(Debug)]
pub struct Report {
    listener: &'static str,
    limits: Limits,
    state: Mutex<(Option<Instant>, Tally)>,
}

impl Report {
    /// Summaries for `listener`, whose limits are named in them.
    pub fn new(listener: &'static str, limits: Limits) -> Self {
        Self {
            listener,
            limits,
            state: Mutex::new((None, Tally::default())),
        }
    }

    /// Notes a connection from `source` turned away for `reason` (a metric label), with the
    /// error if there was one; writes the summary when it is due.
    pub fn turned_away(&self, reason: &'static str, source: IpAddr, error: Option<String>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (last, tally) = &mut *state;
        *tally.by_reason.entry(reason).or_default() += 1;
        *tally.by_source.entry(source).or_default() += 1;
        if error.is_some() {
            tally.last_error = error;
        }
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < REPORT_EVERY) {
            return;
        }
        let since = last.map_or(Duration::ZERO, |at| now.duration_since(at));
        *last = Some(now);
        let tally = std::mem::take(tally);
        drop(state);
        self.write(&tally, since);
    }

    fn write(&self, tally: &Tally, since: Duration) {
        let total: u64 = tally.by_reason.values().sum();
        let mut reasons: Vec<_> = tally.by_reason.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let reasons = reasons
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut sources: Vec<_> = tally.by_source.iter().collect();
        sources.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let sources = sources
            .iter()
            .take(3)
            .map(|(ip, n)| format!("{ip} ({n})"))
            .collect::<Vec<_>>()
            .join(", ");
        let shares = self.limits.shares;
        tracing::warn!(
            listener = self.listener,
            turned_away = total,
            over_seconds = since.as_secs(),
            reasons,
            top_sources = sources,
            last_tls_error = tally.last_error.as_deref().unwrap_or(""),
            "connections turned away (each source address may hold {} connections, {} of them HTTP/2, of {} in all; a TLS handshake has {:?}): a client at these addresses opens more connections than it uses, or an attack; the ipkeep_*_connections_refused_total metric counts them (docs/troubleshooting.md)",
            shares.per_source,
            shares.http2_per_source,
            shares.total,
            self.limits.handshake_timeout,
        );
    }
}
