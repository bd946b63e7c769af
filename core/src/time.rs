//! Time as the core sees it: a monotonic instant passed in by the caller of `poll(now)`.
//! The core never reads a clock, so every timer is deterministic under test.

use core::ops::{Add, Sub};

/// A monotonic point in time, in nanoseconds since an arbitrary origin chosen by the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

/// A span of time in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// `us` microseconds.
    pub const fn from_micros(us: u64) -> Self {
        Self(us.saturating_mul(1_000))
    }
    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms.saturating_mul(1_000_000))
    }
    /// The IB local ACK timeout for a QP's `timeout` attribute: 4.096 us * 2^timeout;
    /// 0 means "infinite" and yields `None`. Values above 31 are clamped to 31 (IB caps the
    /// attribute at 5 bits; the reference's 50 meant 146 years).
    pub const fn ib_local_ack_timeout(timeout: u8) -> Option<Self> {
        if timeout == 0 {
            return None;
        }
        let t = if timeout > 31 { 31 } else { timeout };
        Some(Self(4_096u64 << t))
    }
    /// The IB RNR NAK timer for `min_rnr_timer` (IB spec table 45), in nanoseconds.
    pub const fn ib_rnr_timer(code: u8) -> Self {
        // Values in microseconds * 100 to keep the table exact (0.01 ms .. 655.36 ms).
        const TABLE_10US: [u64; 32] = [
            65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
            1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
        ];
        Self(TABLE_10US[(code & 31) as usize] * 10_000)
    }
}

impl Add<Nanos> for Instant {
    type Output = Instant;
    fn add(self, d: Nanos) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }
}

impl Sub<Instant> for Instant {
    type Output = Nanos;
    fn sub(self, earlier: Instant) -> Nanos {
        Nanos(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ack_timeout_follows_ib_formula() {
        assert_eq!(Nanos::ib_local_ack_timeout(0), None);
        assert_eq!(Nanos::ib_local_ack_timeout(1), Some(Nanos(8_192)));
        // 14 -> 4.096 us * 16384 = 67.1 ms
        assert_eq!(Nanos::ib_local_ack_timeout(14), Some(Nanos(67_108_864)));
        assert_eq!(
            Nanos::ib_local_ack_timeout(50),
            Nanos::ib_local_ack_timeout(31)
        );
    }

    #[test]
    fn rnr_timer_table_edges() {
        assert_eq!(Nanos::ib_rnr_timer(0), Nanos(655_360_000));
        assert_eq!(Nanos::ib_rnr_timer(1), Nanos::from_micros(10));
        assert_eq!(Nanos::ib_rnr_timer(31), Nanos::from_micros(491_520));
    }
}
