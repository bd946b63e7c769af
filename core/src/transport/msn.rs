//! Message sequence numbers: 16-bit counters, one per work request, that wrap at 2^16.
//!
//! The card carries the MSN in the BTH P_Key position (hardware-contract.md "Wire format",
//! nic-behaviour.md 1.3) and copies it into every meta report; the driver assigns it
//! ("Who does what"). As with PSNs, ordering is by signed distance and holds only while the
//! outstanding MSNs of a QP span less than half the space (2^15).

use core::fmt;
use core::ops::{Add, AddAssign, Sub, SubAssign};

/// Number of distinct MSNs (2^16).
pub const MSN_MODULUS: u32 = 1 << 16;
/// Half the MSN space (2^15): the largest distance [`Msn::distance`] returns.
pub const MSN_HALF: u32 = MSN_MODULUS / 2;

/// A 16-bit message sequence number; arithmetic wraps modulo 2^16.
///
/// No `Ord`: compare with [`Msn::is_before`], [`Msn::is_after`] and [`Msn::distance`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Msn(u16);

impl Msn {
    /// MSN 0.
    pub const ZERO: Msn = Msn(0);
    /// The largest MSN; the next one is [`Msn::ZERO`].
    pub const MAX: Msn = Msn(u16::MAX);

    /// An MSN from its 16-bit value.
    pub const fn new(raw: u16) -> Self {
        Self(raw)
    }

    /// The 16-bit value.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// This MSN plus `n`, modulo 2^16.
    pub const fn wrapping_add(self, n: u16) -> Self {
        Self(self.0.wrapping_add(n))
    }

    /// This MSN minus `n`, modulo 2^16.
    pub const fn wrapping_sub(self, n: u16) -> Self {
        Self(self.0.wrapping_sub(n))
    }

    /// How many increments lead from `self` forward to `to`, in `0..2^16`.
    pub const fn forward_distance(self, to: Msn) -> u32 {
        to.0.wrapping_sub(self.0) as u32
    }

    /// The signed distance from `self` to `to`, read in `(-2^15, 2^15]`; positive when `to`
    /// comes after `self`.
    pub const fn distance(self, to: Msn) -> i32 {
        let d = self.forward_distance(to);
        if d <= MSN_HALF {
            d as i32
        } else {
            d as i32 - MSN_MODULUS as i32
        }
    }

    /// `true` if `other` is 1..2^15-1 steps ahead of `self`. At exactly 2^15 neither MSN is
    /// before the other.
    pub const fn is_before(self, other: Msn) -> bool {
        let d = self.forward_distance(other);
        d != 0 && d < MSN_HALF
    }

    /// `true` if `self` comes strictly after `other`.
    pub const fn is_after(self, other: Msn) -> bool {
        other.is_before(self)
    }

    /// `true` if `self` lies in `[start, start + len)` modulo 2^16.
    pub const fn is_in_window(self, start: Msn, len: u32) -> bool {
        start.forward_distance(self) < len
    }
}

impl Add<u16> for Msn {
    type Output = Msn;
    /// Wrapping addition modulo 2^16.
    fn add(self, n: u16) -> Msn {
        self.wrapping_add(n)
    }
}

impl AddAssign<u16> for Msn {
    fn add_assign(&mut self, n: u16) {
        *self = self.wrapping_add(n);
    }
}

impl Sub<u16> for Msn {
    type Output = Msn;
    /// Wrapping subtraction modulo 2^16.
    fn sub(self, n: u16) -> Msn {
        self.wrapping_sub(n)
    }
}

impl SubAssign<u16> for Msn {
    fn sub_assign(&mut self, n: u16) {
        *self = self.wrapping_sub(n);
    }
}

impl fmt::Debug for Msn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Msn({})", self.0)
    }
}

impl fmt::Display for Msn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn arithmetic_wraps_at_2_pow_16() {
        assert_eq!(Msn::MAX + 1, Msn::ZERO);
        assert_eq!(Msn::ZERO - 1, Msn::MAX);
        let mut m = Msn::new(0xFFFE);
        m += 3;
        assert_eq!(m.get(), 1);
        m -= 2;
        assert_eq!(m, Msn::MAX);
    }

    #[test]
    fn distance_and_ordering_cross_the_wrap() {
        let a = Msn::new(0xFFFF);
        let b = Msn::new(2);
        assert_eq!(a.distance(b), 3);
        assert_eq!(b.distance(a), -3);
        assert!(a.is_before(b) && b.is_after(a));
        assert!(!a.is_after(b) && !a.is_before(a));
        let half = Msn::new(MSN_HALF as u16);
        assert_eq!(Msn::ZERO.distance(half), MSN_HALF as i32);
        assert_eq!(half.distance(Msn::ZERO), MSN_HALF as i32);
        assert!(!Msn::ZERO.is_before(half) && !half.is_before(Msn::ZERO));
    }

    #[test]
    fn window_membership_wraps() {
        let start = Msn::new(0xFFF0);
        assert!(Msn::new(0x0F).is_in_window(start, 0x20));
        assert!(!Msn::new(0x10).is_in_window(start, 0x20));
        assert!(!Msn::new(0xFFEF).is_in_window(start, 0x20));
    }

    #[test]
    fn formats_as_decimal() {
        assert_eq!(
            format!("{} {:?}", Msn::new(7), Msn::new(65535)),
            "7 Msn(65535)"
        );
    }
}
