//! Where an emulated card's time comes from: the process's monotonic clock when the card runs
//! on its own threads, or a virtual clock that a single-threaded harness moves by hand
//! ([`crate::pair`]), so that a timer of 67 ms costs no wall time and every run of a test
//! sees the same times.
//!
//! The card reads time for its receive windows (the quiet timer, nic-behaviour.md 3.5);
//! nothing else in the model depends on it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A clock that moves only when told to: nanoseconds since its start. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// A clock at 0 ns.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current time in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Moves the clock to `ns`; a time before the current one is ignored (the clock is
    /// monotonic).
    pub fn advance_to(&self, ns: u64) {
        self.0.fetch_max(ns, Ordering::AcqRel);
    }

    /// Moves the clock forward by `ns`.
    pub fn advance_by(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::AcqRel);
    }
}

/// The time source of one card.
#[derive(Clone, Debug)]
pub enum CardClock {
    /// Real time since `epoch` (the threaded card).
    Real {
        /// The card's time origin.
        epoch: Instant,
    },
    /// A virtual clock moved by a harness (the stepped card).
    Virtual(VirtualClock),
}

impl CardClock {
    /// Real time, starting now.
    pub fn real() -> Self {
        CardClock::Real {
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the clock's origin.
    pub fn now_ns(&self) -> u64 {
        match self {
            CardClock::Real { epoch } => epoch.elapsed().as_nanos() as u64,
            CardClock::Virtual(v) => v.now_ns(),
        }
    }

    /// Whether time moves only when a harness moves it: nothing else runs meanwhile, so
    /// waiting for another party (a full ring) can never end.
    pub fn is_virtual(&self) -> bool {
        matches!(self, CardClock::Virtual(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_forward_and_is_shared_by_clones() {
        let c = VirtualClock::new();
        let card = CardClock::Virtual(c.clone());
        assert_eq!(card.now_ns(), 0);
        c.advance_to(5_000);
        c.advance_to(1_000);
        assert_eq!(card.now_ns(), 5_000, "advance_to never goes back");
        c.advance_by(10);
        assert_eq!(card.now_ns(), 5_010);
        assert!(card.is_virtual());
        assert!(!CardClock::real().is_virtual());
    }
}
