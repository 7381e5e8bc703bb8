//! Where one invocation's time goes.

use std::time::{Duration, Instant};

/// Phase durations of one invocation, printed to stderr when `IPKEEP_TIMING` is set, so the
/// benchmark can say where the time goes.
#[derive(Debug, Default, Clone)]
pub struct Timings {
    started: Option<Instant>,
    phases: Vec<(&'static str, Duration)>,
}

impl Timings {
    /// Starts timing now.
    pub fn begin() -> Self {
        Timings {
            started: Some(Instant::now()),
            phases: Vec::new(),
        }
    }

    /// Records a phase that took `took`.
    pub fn push(&mut self, phase: &'static str, took: Duration) {
        self.phases.push((phase, took));
    }

    /// Records a phase that began at `since` and ends now; returns now.
    pub fn record(&mut self, phase: &'static str, since: Instant) -> Instant {
        let now = Instant::now();
        self.phases.push((phase, now - since));
        now
    }

    /// `ipkeep-timing parse_us=… lock_us=… open_us=… alloc_commit_us=… total_us=…`.
    pub fn line(&self) -> String {
        let mut out = String::from("ipkeep-timing");
        for (phase, d) in &self.phases {
            out.push_str(&format!(" {phase}_us={}", d.as_micros()));
        }
        if let Some(start) = self.started {
            out.push_str(&format!(" total_us={}", start.elapsed().as_micros()));
        }
        out
    }
}
