//! Rate limits for what the network makes the OOB channel log, so that a peer flooding
//! the port cannot flood the log.

use std::fmt;
use std::time::{Duration, Instant};

/// At most [`LogBudget::PER_SECOND`] messages a second; the next message let through
/// says how many were skipped.
pub(super) struct LogBudget {
    window: Instant,
    used: u32,
    skipped: u64,
}

impl LogBudget {
    pub(super) const PER_SECOND: u32 = 20;

    pub(super) fn new(now: Instant) -> Self {
        LogBudget {
            window: now,
            used: 0,
            skipped: 0,
        }
    }

    /// `Some` (to append to the message) if a message may be logged at `now`.
    pub(super) fn take(&mut self, now: Instant) -> Option<Skipped> {
        if now.saturating_duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.used = 0;
        }
        if self.used < Self::PER_SECOND {
            self.used += 1;
            Some(Skipped(std::mem::take(&mut self.skipped)))
        } else {
            self.skipped += 1;
            None
        }
    }
}

/// How many messages a budget skipped since the last one it let through.
pub(super) struct Skipped(u64);

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} similar messages suppressed)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_a_second_then_the_next_window_names_the_skipped() {
        let t0 = Instant::now();
        let mut budget = LogBudget::new(t0);
        let allowed = (0..100).filter(|_| budget.take(t0).is_some()).count();
        assert_eq!(allowed, LogBudget::PER_SECOND as usize);
        let next = budget
            .take(t0 + Duration::from_secs(1))
            .expect("a new window");
        assert_eq!(next.to_string(), " (80 similar messages suppressed)");
        let after = budget.take(t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(after.to_string(), "");
    }
}
