//! The card's receive window right after ManageQp (nic-behaviour.md 3.1; review P5): stride
//! 0xFFFFF with every bit set. Until the window moves past PSN 0, its bitmap reports claim
//! that PSNs `0xFF_FF80..=0xFF_FFFF` arrived whether they did or not, and it never reports
//! them lost. A QP whose first PSNs fall there (IB lets `sq_psn` be any 24-bit value) must
//! learn of them from packet reports only: the engine records them as a lost range at RTR
//! and drops their bits from the card's bitmaps while the window is fresh.

use crate::transport::{card_bitmap_base, Psn, PsnRange};

/// The PSNs the reset window marks as arrived without having seen them.
pub const RESET_PHANTOMS: PsnRange =
    PsnRange::from_bounds(card_bitmap_base(Psn::from_raw(0xFF_FFF0)), Psn::from_raw(0));

/// A card bitmap (bit 0 stands for `base`) without the reset window's bits, while the
/// window is `fresh`.
pub fn trusted_bits(fresh: bool, base: Psn, bitmap: u128) -> u128 {
    if !fresh {
        return bitmap;
    }
    (0..128u32)
        .filter(|b| RESET_PHANTOMS.contains(base.wrapping_add(*b)))
        .fold(bitmap, |m, b| m & !(1u128 << b))
}

/// Whether the window is still fresh after a report whose window bottom is `bottom`: once
/// the bottom has left the reset strides, no reset bit is left in the window.
pub fn still_fresh(fresh: bool, bottom: Psn) -> bool {
    fresh && RESET_PHANTOMS.contains(bottom)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psn(x: u32) -> Psn {
        Psn::from_raw(x)
    }

    #[test]
    fn the_reset_window_is_the_128_psns_below_0() {
        assert_eq!(RESET_PHANTOMS.start(), psn(0xFF_FF80));
        assert_eq!(RESET_PHANTOMS.len(), 128);
    }

    #[test]
    fn reset_bits_are_dropped_only_while_fresh() {
        // The reset window itself: every bit is a phantom.
        assert_eq!(trusted_bits(true, psn(0xFF_FF80), !0), 0);
        // Slid to stride 0 (bit 0 = 0xFF_FF90): bits 112.. are PSNs 0..=15, real.
        assert_eq!(trusted_bits(true, psn(0xFF_FF90), !0), !0u128 << 112);
        assert_eq!(trusted_bits(false, psn(0xFF_FF90), !0), !0);
        // A window anywhere else is untouched.
        assert_eq!(trusted_bits(true, psn(500), 0x1234), 0x1234);
    }

    #[test]
    fn the_window_stops_being_fresh_once_past_psn_0() {
        assert!(still_fresh(true, psn(0xFF_FF90)));
        assert!(!still_fresh(true, psn(0)));
        assert!(!still_fresh(true, psn(0x12_3450)), "a jump from reset");
        assert!(!still_fresh(false, psn(0xFF_FF90)));
    }
}
