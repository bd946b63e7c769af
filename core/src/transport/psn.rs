//! Packet sequence numbers: 24-bit counters that wrap at 2^24 (IB spec 9.7.1; the card
//! increments them modulo 2^24 per packet, nic-behaviour.md 1.2).
//!
//! PSNs have no total order. Two PSNs are compared by the signed distance between them,
//! which is meaningful only while every outstanding PSN of a QP lies within half the space
//! (2^23) of every other; the driver keeps its windows far smaller than that.

use core::fmt;
use core::ops::{Add, AddAssign, Sub, SubAssign};

/// Number of bits in a PSN.
pub const PSN_BITS: u32 = 24;
/// Number of distinct PSNs (2^24).
pub const PSN_MODULUS: u32 = 1 << PSN_BITS;
/// Mask of the PSN bits in a wider integer.
pub const PSN_MASK: u32 = PSN_MODULUS - 1;
/// Half the PSN space (2^23): the largest distance [`Psn::distance`] returns, and the
/// distance at which two PSNs are neither before nor after each other.
pub const PSN_HALF: u32 = PSN_MODULUS / 2;

/// A 24-bit packet sequence number; arithmetic wraps modulo 2^24.
///
/// `Psn` deliberately implements neither `Ord` nor `PartialOrd`: use [`Psn::is_before`],
/// [`Psn::is_after`] and [`Psn::distance`], which respect the wrap.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Psn(u32);

impl Psn {
    /// PSN 0.
    pub const ZERO: Psn = Psn(0);
    /// The largest PSN, 2^24 - 1; the next one is [`Psn::ZERO`].
    pub const MAX: Psn = Psn(PSN_MASK);

    /// A PSN from a value that must fit in 24 bits; `None` otherwise (for input whose high
    /// bits signal a mistake rather than a wire field).
    pub const fn new(raw: u32) -> Option<Self> {
        if raw > PSN_MASK {
            None
        } else {
            Some(Self(raw))
        }
    }

    /// A PSN from a descriptor, packet or verbs field: the low 24 bits, the rest ignored (as
    /// the kernel does for `sq_psn`/`rq_psn`, and as the card's 24-bit fields do).
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw & PSN_MASK)
    }

    /// The 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// This PSN plus `n`, modulo 2^24.
    pub const fn wrapping_add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & PSN_MASK)
    }

    /// This PSN minus `n`, modulo 2^24.
    pub const fn wrapping_sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n) & PSN_MASK)
    }

    /// How many increments lead from `self` forward to `to`, in `0..2^24`.
    pub const fn forward_distance(self, to: Psn) -> u32 {
        to.0.wrapping_sub(self.0) & PSN_MASK
    }

    /// The signed distance from `self` to `to`: `to - self` read in `(-2^23, 2^23]`.
    ///
    /// Positive when `to` comes after `self`. `distance(a, b) == -distance(b, a)` except at
    /// exactly 2^23, where both directions are equally far and the result is `+2^23`.
    pub const fn distance(self, to: Psn) -> i32 {
        let d = self.forward_distance(to);
        if d <= PSN_HALF {
            d as i32
        } else {
            d as i32 - PSN_MODULUS as i32
        }
    }

    /// `true` if `self` comes strictly before `other`, i.e. `other` is 1..2^23-1 steps ahead.
    ///
    /// At a distance of exactly 2^23 neither PSN is before the other, so that the relation is
    /// antisymmetric everywhere.
    pub const fn is_before(self, other: Psn) -> bool {
        let d = self.forward_distance(other);
        d != 0 && d < PSN_HALF
    }

    /// `true` if `self` comes strictly after `other` (`other.is_before(self)`).
    pub const fn is_after(self, other: Psn) -> bool {
        other.is_before(self)
    }

    /// `true` if `self` lies in the `len` PSNs starting at `start`: `[start, start + len)`
    /// modulo 2^24. A `len` of 2^24 or more covers every PSN.
    pub const fn is_in_window(self, start: Psn, len: u32) -> bool {
        start.forward_distance(self) < len
    }
}

/// A run of consecutive PSNs, `[start, start + len)` modulo 2^24 (at most 2^24 of them).
///
/// Ranges are given by their start and length rather than two ends, because `lo == hi`
/// would not say whether the range is empty or the whole space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PsnRange {
    start: Psn,
    len: u32,
}

impl PsnRange {
    /// `len` PSNs from `start`; a `len` above 2^24 is cut to 2^24 (the whole space).
    pub const fn new(start: Psn, len: u32) -> Self {
        let len = if len > PSN_MODULUS { PSN_MODULUS } else { len };
        Self { start, len }
    }

    /// The PSNs from `lo` up to, not including, `hi` (walking forward from `lo`; empty when
    /// `lo == hi`).
    pub const fn from_bounds(lo: Psn, hi: Psn) -> Self {
        Self {
            start: lo,
            len: lo.forward_distance(hi),
        }
    }

    /// The first PSN of the range (also for an empty range: where it would start).
    pub const fn start(self) -> Psn {
        self.start
    }

    /// Number of PSNs in the range.
    pub const fn len(self) -> u32 {
        self.len
    }

    /// `true` if the range holds no PSN.
    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The PSN just after the range (exclusive end).
    pub const fn end(self) -> Psn {
        self.start.wrapping_add(self.len)
    }

    /// `true` if `psn` is in the range.
    pub const fn contains(self, psn: Psn) -> bool {
        psn.is_in_window(self.start, self.len)
    }

    /// `true` if the two ranges share at least one PSN. Two arcs of the PSN circle overlap
    /// exactly when one of them contains the other's first PSN.
    pub const fn overlaps(self, other: PsnRange) -> bool {
        !self.is_empty()
            && !other.is_empty()
            && (self.contains(other.start) || other.contains(self.start))
    }

    /// The PSNs of the range in order.
    pub fn iter(self) -> impl Iterator<Item = Psn> {
        (0..self.len).map(move |i| self.start.wrapping_add(i))
    }
}

impl fmt::Debug for PsnRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PsnRange[{}, {})", self.start, self.end())
    }
}

impl fmt::Display for PsnRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", self.start, self.end())
    }
}

impl Add<u32> for Psn {
    type Output = Psn;
    /// Wrapping addition modulo 2^24.
    fn add(self, n: u32) -> Psn {
        self.wrapping_add(n)
    }
}

impl AddAssign<u32> for Psn {
    fn add_assign(&mut self, n: u32) {
        *self = self.wrapping_add(n);
    }
}

impl Sub<u32> for Psn {
    type Output = Psn;
    /// Wrapping subtraction modulo 2^24.
    fn sub(self, n: u32) -> Psn {
        self.wrapping_sub(n)
    }
}

impl SubAssign<u32> for Psn {
    fn sub_assign(&mut self, n: u32) {
        *self = self.wrapping_sub(n);
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn arithmetic_wraps_at_2_pow_24() {
        assert_eq!(Psn::MAX + 1, Psn::ZERO);
        assert_eq!(Psn::ZERO - 1, Psn::MAX);
        assert_eq!(Psn::from_raw(0xFF_FFF0) + 0x20, Psn::from_raw(0x10));
        assert_eq!(Psn::from_raw(0x10) - 0x20, Psn::from_raw(0xFF_FFF0));
        let mut p = Psn::MAX;
        p += 2;
        assert_eq!(p.get(), 1);
        p -= 3;
        assert_eq!(p, Psn::MAX - 1);
        // Adding the whole space is the identity.
        assert_eq!(Psn::from_raw(5) + PSN_MODULUS, Psn::from_raw(5));
    }

    #[test]
    fn construction_masks_or_rejects_high_bits() {
        assert_eq!(Psn::from_raw(0x0123_4567).get(), 0x23_4567);
        assert_eq!(Psn::new(0x0100_0000), None);
        assert_eq!(Psn::new(PSN_MASK), Some(Psn::MAX));
    }

    #[test]
    fn distance_is_signed_and_crosses_the_wrap() {
        let a = Psn::from_raw(0xFF_FFFE);
        let b = Psn::from_raw(3);
        assert_eq!(a.distance(b), 5);
        assert_eq!(b.distance(a), -5);
        assert_eq!(a.forward_distance(b), 5);
        assert_eq!(b.forward_distance(a), PSN_MODULUS - 5);
        assert_eq!(a.distance(a), 0);
    }

    #[test]
    fn distance_range_is_half_open_at_minus_half() {
        let a = Psn::ZERO;
        let half = Psn::from_raw(PSN_HALF);
        assert_eq!(a.distance(half), PSN_HALF as i32);
        assert_eq!(half.distance(a), PSN_HALF as i32);
        assert_eq!(a.distance(half - 1), PSN_HALF as i32 - 1);
        assert_eq!(a.distance(half + 1), -(PSN_HALF as i32) + 1);
    }

    #[test]
    fn ordering_respects_the_wrap_and_the_half_point() {
        let a = Psn::from_raw(0xFF_FFFF);
        let b = Psn::from_raw(0);
        assert!(a.is_before(b));
        assert!(b.is_after(a));
        assert!(!b.is_before(a));
        assert!(!a.is_before(a) && !a.is_after(a));
        let half = Psn::from_raw(PSN_HALF);
        assert!(!Psn::ZERO.is_before(half) && !half.is_before(Psn::ZERO));
        assert!(Psn::ZERO.is_before(half - 1));
        assert!(Psn::ZERO.is_after(half + 1));
    }

    #[test]
    fn window_membership_wraps() {
        let start = Psn::from_raw(0xFF_FFF0);
        assert!(start.is_in_window(start, 1));
        assert!(!start.is_in_window(start, 0));
        assert!(Psn::from_raw(0xF).is_in_window(start, 0x20));
        assert!(!Psn::from_raw(0x10).is_in_window(start, 0x20));
        assert!(!Psn::from_raw(0xFF_FFEF).is_in_window(start, 0x20));
        assert!(Psn::from_raw(0xFF_FFEF).is_in_window(start, PSN_MODULUS));
    }

    #[test]
    fn ranges_wrap_and_distinguish_empty_from_full() {
        let r = PsnRange::from_bounds(Psn::from_raw(0xFF_FFFE), Psn::from_raw(2));
        assert_eq!(r.len(), 4);
        assert!(r.contains(Psn::MAX) && r.contains(Psn::ZERO) && r.contains(Psn::from_raw(1)));
        assert!(!r.contains(Psn::from_raw(2)));
        assert_eq!(r.end(), Psn::from_raw(2));
        let v: std::vec::Vec<u32> = r.iter().map(Psn::get).collect();
        assert_eq!(v, [0xFF_FFFE, 0xFF_FFFF, 0, 1]);
        assert!(PsnRange::from_bounds(Psn::ZERO, Psn::ZERO).is_empty());
        let later = PsnRange::new(Psn::from_raw(1), 10);
        assert!(r.overlaps(later) && later.overlaps(r));
        assert!(!r.overlaps(PsnRange::new(Psn::from_raw(2), 10)));
        assert!(
            !r.overlaps(PsnRange::new(Psn::from_raw(1), 0)),
            "empty overlaps nothing"
        );
        let full = PsnRange::new(Psn::from_raw(9), u32::MAX);
        assert_eq!(full.len(), PSN_MODULUS);
        assert!(full.contains(Psn::from_raw(8)));
        assert_eq!(format!("{r}"), "[0xfffffe, 0x000002)");
    }

    #[test]
    fn formats_as_hex() {
        assert_eq!(format!("{}", Psn::from_raw(0x1234)), "0x001234");
        assert_eq!(format!("{:?}", Psn::MAX), "Psn(0xffffff)");
    }
}
