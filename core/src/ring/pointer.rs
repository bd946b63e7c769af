//! Ring pointers: `{guard:1, idx:12}` free-running counters (hardware-contract.md "Rings",
//! layout-verification.md section 3, `Ringbuf.bsv`).
//!
//! A pointer counts modulo twice the ring length, so head and tail tell an empty ring (equal)
//! from a full one (same index, guard bits differ) and all slots are usable. The CSR holds the
//! pointer itself: 13 bits for the hardware's 4096 slots, zero-extended on read.
//!
//! The ring length is a const generic only so that the loom model can run the real ring code
//! on a 4-slot ring; every ring of the card is [`RING_LEN`], the default.

use core::fmt;

use crate::desc::DESC_SIZE;

/// Descriptors per ring on the card (`RING_BUF_LEN_BITS = 12`).
pub const RING_LEN: u16 = 4096;

/// Bytes of one ring's memory: 4096 descriptors of 32 bytes (128 KiB).
pub const RING_BYTES: usize = RING_LEN as usize * DESC_SIZE;

/// A ring pointer: slot index plus a guard bit that flips on every wrap.
///
/// For the card's rings (`N = 4096`) this is the 13-bit value `{guard:1, idx:12}` that the
/// head and tail CSRs hold. All arithmetic is modulo `2 * N`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RingPtr<const N: u16 = RING_LEN>(u16);

impl<const N: u16> RingPtr<N> {
    /// Evaluated by every constructor, so a ring length that is not a power of two in
    /// `1..=4096` fails to compile.
    const LEN_IS_VALID: () = assert!(
        N.is_power_of_two() && N <= RING_LEN,
        "ring length must be a power of two, at most 4096"
    );

    /// Mask of the pointer bits: guard and index (`0x1FFF` for the card's rings).
    pub const MASK: u16 = {
        let () = Self::LEN_IS_VALID;
        2 * N - 1
    };

    /// Both pointers of a fresh ring.
    pub const ZERO: Self = {
        let () = Self::LEN_IS_VALID;
        RingPtr(0)
    };

    /// The pointer with the low bits of `raw`, as a CSR write truncates it.
    pub const fn new(raw: u16) -> Self {
        RingPtr(raw & Self::MASK)
    }

    /// The pointer a CSR read returned, or `None` if bits above the pointer are set: the card
    /// zero-extends, so such a value did not come from a ring register.
    pub const fn from_csr(value: u32) -> Option<Self> {
        if value & !(Self::MASK as u32) != 0 {
            return None;
        }
        Some(RingPtr(value as u16))
    }

    /// The value to write to the head or tail CSR.
    pub const fn csr(self) -> u32 {
        self.0 as u32
    }

    /// The raw `{guard, idx}` value.
    pub const fn raw(self) -> u16 {
        self.0
    }

    /// The slot index, always below `N`.
    pub const fn idx(self) -> u16 {
        self.0 & (N - 1)
    }

    /// The guard bit (bit 12 for the card's rings).
    pub const fn guard(self) -> bool {
        self.0 & N != 0
    }

    /// The pointer `n` slots further on, wrapping.
    pub const fn advance(self, n: u16) -> Self {
        // 2N divides 2^16, so wrapping in u16 and then masking is arithmetic modulo 2N.
        RingPtr(self.0.wrapping_add(n) & Self::MASK)
    }

    /// How many slots `self` is ahead of `from`, modulo `2 * N` (in `0 .. 2N`).
    pub const fn distance_from(self, from: Self) -> u16 {
        self.0.wrapping_sub(from.0) & Self::MASK
    }

    /// Entries between `tail` and `head`. For a consistent pair this is `0..=N`; larger
    /// values mean the pair is impossible (see [`RingPtr::is_consistent`]).
    pub const fn used(head: Self, tail: Self) -> u16 {
        head.distance_from(tail)
    }

    /// Free slots a producer at `head` may fill before reaching `tail`; zero for an
    /// impossible pair.
    pub const fn free(head: Self, tail: Self) -> u16 {
        N.saturating_sub(Self::used(head, tail))
    }

    /// Whether the ring holds nothing: the pointers are equal.
    pub const fn is_empty(head: Self, tail: Self) -> bool {
        head.0 == tail.0
    }

    /// Whether the ring is full: same index, guard bits differ.
    pub const fn is_full(head: Self, tail: Self) -> bool {
        head.0 ^ tail.0 == N
    }

    /// Whether `head` can be at most `N` entries ahead of `tail`.
    pub const fn is_consistent(head: Self, tail: Self) -> bool {
        Self::used(head, tail) <= N
    }
}

impl<const N: u16> fmt::Debug for RingPtr<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RingPtr({}:{})", u8::from(self.guard()), self.idx())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    type P = RingPtr;

    #[test]
    fn csr_value_is_guard_at_bit_12_and_index_below() {
        let p = P::new(0x1005);
        assert!(p.guard());
        assert_eq!(p.idx(), 5);
        assert_eq!(p.csr(), 0x1005);
        // A CSR write keeps the low 13 bits.
        assert_eq!(P::new(0xFFFF).raw(), 0x1FFF);
        assert_eq!(P::MASK, 0x1FFF);
    }

    #[test]
    fn from_csr_rejects_bits_the_card_never_returns() {
        assert_eq!(P::from_csr(0x1FFF), Some(P::new(0x1FFF)));
        assert_eq!(P::from_csr(0x2000), None);
        // What an undecoded read returns on hardware.
        assert_eq!(P::from_csr(0xAAAA_AAAA), None);
    }

    #[test]
    fn empty_and_full_follow_the_guard_bit() {
        let tail = P::new(7);
        assert!(P::is_empty(tail, tail));
        assert_eq!(P::free(tail, tail), 4096);
        let head = tail.advance(4096);
        assert_eq!(head.idx(), tail.idx());
        assert_ne!(head.guard(), tail.guard());
        assert!(P::is_full(head, tail));
        assert!(!P::is_empty(head, tail));
        assert_eq!(P::used(head, tail), 4096);
        assert_eq!(P::free(head, tail), 0);
        let one_short = tail.advance(4095);
        assert!(!P::is_full(one_short, tail));
        assert_eq!(P::free(one_short, tail), 1);
    }

    #[test]
    fn arithmetic_wraps_at_8192() {
        let p = P::new(0x1FFE);
        assert_eq!(p.advance(3).raw(), 1);
        assert_eq!(p.advance(3).distance_from(p), 3);
        assert_eq!(p.distance_from(p.advance(3)), 0x2000 - 3);
        // Crossing the ring end flips the guard.
        let q = P::new(0x0FFF).advance(1);
        assert_eq!((q.guard(), q.idx()), (true, 0));
        assert_eq!(P::new(0).advance(u16::MAX).raw(), 0x1FFF);
    }

    #[test]
    fn pairs_more_than_a_ring_apart_are_inconsistent() {
        let tail = P::new(0x1F00);
        assert!(P::is_consistent(tail.advance(4096), tail));
        assert!(!P::is_consistent(tail.advance(4097), tail));
        assert_eq!(P::free(tail.advance(5000), tail), 0);
    }

    #[test]
    fn small_rings_use_the_same_rules() {
        type S = RingPtr<4>;
        assert_eq!(S::MASK, 7);
        let t = S::new(3);
        assert!(S::is_full(t.advance(4), t));
        assert_eq!(t.advance(4).raw(), 7);
        assert_eq!(t.advance(5).raw(), 0);
        assert_eq!(S::from_csr(8), None);
        assert_eq!(format!("{:?}", S::new(5)), "RingPtr(1:1)");
    }
}
