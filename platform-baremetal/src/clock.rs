//! Time for the engine on a machine without an operating system: nanoseconds from a free
//! running cycle (or timer tick) counter. The engine reads time only through the closures
//! and `now` arguments its callers pass, so this is the firmware's whole clock.

use bluerdma_core::time::Instant;

/// Nanoseconds since the counter started, from a counter running at `hz`.
pub struct CycleClock<F: FnMut() -> u64> {
    read: F,
    hz: u64,
}

impl<F: FnMut() -> u64> CycleClock<F> {
    /// A clock over `read`, a counter that ticks `hz` times a second (`hz` of 0 is taken
    /// as 1, so a misconfigured clock runs slowly instead of dividing by zero).
    pub fn new(hz: u64, read: F) -> Self {
        Self {
            read,
            hz: hz.max(1),
        }
    }

    /// The current time.
    pub fn now(&mut self) -> Instant {
        Instant(cycles_to_nanos((self.read)(), self.hz))
    }
}

/// `cycles` of a `hz` counter in nanoseconds, without 128-bit arithmetic (which a 32-bit
/// soft-core does in software) and exact for any `hz` up to 2^34 (a 17 GHz
/// counter); beyond that the sub-second part saturates rather than wraps.
pub const fn cycles_to_nanos(cycles: u64, hz: u64) -> u64 {
    let whole = (cycles / hz).saturating_mul(1_000_000_000);
    let frac = (cycles % hz).saturating_mul(1_000_000_000) / hz;
    whole.saturating_add(frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_convert_exactly_and_saturate_instead_of_wrapping() {
        assert_eq!(cycles_to_nanos(100_000_000, 100_000_000), 1_000_000_000);
        assert_eq!(cycles_to_nanos(150, 100_000_000), 1_500);
        assert_eq!(cycles_to_nanos(1, 3), 333_333_333);
        assert_eq!(cycles_to_nanos(u64::MAX, 1), u64::MAX);
        // A 50 MHz soft-core after 3 years: no overflow in the fractional part.
        let three_years = 50_000_000u64 * 3600 * 24 * 365 * 3;
        assert_eq!(
            cycles_to_nanos(three_years + 25_000_000, 50_000_000),
            3600 * 24 * 365 * 3 * 1_000_000_000 + 500_000_000
        );
    }

    #[test]
    fn the_clock_follows_its_counter() {
        let mut ticks = 0u64;
        let mut clock = CycleClock::new(1_000, || {
            ticks += 5;
            ticks
        });
        assert_eq!(clock.now(), Instant(5_000_000));
        assert_eq!(clock.now(), Instant(10_000_000));
    }
}
