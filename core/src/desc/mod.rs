//! Descriptors: the 32-byte entries of every ring (hardware-contract.md "Rings",
//! layout-verification.md section 1). A descriptor is four little-endian u64 words; bit N
//! of the 256-bit value is bit N%8 of byte N/8. Bits 240..255 are the common header.
//!
//! One file per descriptor family: [`cmd`] (command request/response, section 1.2),
//! [`send`] (send Seg0/Seg1, section 1.3), [`meta`] (meta reports, section 1.4),
//! [`simple_nic`] (section 1.5) and [`pgt`] (the page-table staging buffer of UpdatePgt).
//! The field types shared by several families live in [`access`], [`mac`] and
//! [`qp_type`]; every decoder reports problems as a [`DescError`].
//!
//! The codecs are shared by the driver and the emulated NIC, so only the golden vectors in
//! `core/tests/golden_desc.rs` (written by hand from the tables) can catch a mistake both
//! sides would share.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub mod access;
pub mod cmd;
pub mod error;
pub mod meta;
pub mod pgt;
pub mod send;
pub mod simple_nic;

pub use crate::mac::MacAddr;
pub use crate::qp::QpType;
pub use access::AccessFlags;
pub use error::{DescError, DescKind};

/// Size of every descriptor in bytes.
pub const DESC_SIZE: usize = 32;

/// The op_code byte of the common header (bits 240..247).
pub const OP_CODE: BitField = BitField::new(240, 8);
/// The is_extended_op_code bit (248).
pub const IS_EXTENDED_OP_CODE: u32 = 248;
/// The has_next bit (254).
pub const HAS_NEXT: u32 = 254;
/// The valid bit (255).
pub const VALID: u32 = 255;

/// A bit range `[lo, lo + width)` of the 256-bit descriptor, `1 <= width <= 64`.
///
/// Built with [`BitField::new`] in a `const`, a range that does not fit is a compile error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BitField {
    lo: u16,
    width: u8,
}

impl BitField {
    /// The range `[lo, lo + width)`. Panics (at compile time when used in a `const`) unless
    /// `1 <= width <= 64` and `lo + width <= 256`.
    pub const fn new(lo: u32, width: u32) -> Self {
        assert!(
            width >= 1 && width <= 64 && lo + width <= 256,
            "bit field out of range"
        );
        Self {
            lo: lo as u16,
            width: width as u8,
        }
    }
    /// The lowest bit.
    pub const fn lo(self) -> u32 {
        self.lo as u32
    }
    /// The number of bits.
    pub const fn width(self) -> u32 {
        self.width as u32
    }
    /// The largest value the field holds (`width` ones).
    pub const fn max(self) -> u64 {
        low_mask(self.width as u32)
    }
}

/// `width` low bits set (all 64 for `width >= 64`).
#[inline(always)]
const fn low_mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// One raw descriptor exactly as it sits in ring memory.
#[derive(Clone, Copy, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C, align(8))]
pub struct RawDesc(pub [u8; DESC_SIZE]);

impl RawDesc {
    /// All zero bytes (a consumed, empty slot).
    pub const ZERO: RawDesc = RawDesc([0; DESC_SIZE]);

    /// The common header's op_code (byte 30).
    pub const fn op_code(&self) -> u8 {
        self.0[30]
    }
    /// The valid bit (bit 255): set by the producer of a card-to-host descriptor.
    pub const fn valid(&self) -> bool {
        self.0[31] & 0x80 != 0
    }
    /// The has_next bit (bit 254): another descriptor of the same request or event follows.
    pub const fn has_next(&self) -> bool {
        self.0[31] & 0x40 != 0
    }
    /// The is_extended_op_code bit (bit 248).
    pub const fn is_extended_op_code(&self) -> bool {
        self.0[31] & 0x01 != 0
    }

    /// Builds a descriptor from its four little-endian words (`words[0]` = bytes 0..8).
    #[inline(always)]
    pub const fn from_words(words: [u64; 4]) -> Self {
        let mut b = [0u8; DESC_SIZE];
        let mut i = 0;
        while i < 4 {
            let w = words[i].to_le_bytes();
            let mut j = 0;
            while j < 8 {
                b[i * 8 + j] = w[j];
                j += 1;
            }
            i += 1;
        }
        RawDesc(b)
    }
    /// The four little-endian words (`[0]` = bytes 0..8).
    #[inline(always)]
    pub const fn words(&self) -> [u64; 4] {
        [self.word(0), self.word(1), self.word(2), self.word(3)]
    }
    /// Word `i & 3` (bytes `8i .. 8i + 8` as a little-endian u64).
    #[inline(always)]
    pub const fn word(&self, i: usize) -> u64 {
        let o = (i & 3) * 8;
        let b = &self.0;
        u64::from_le_bytes([
            b[o],
            b[o + 1],
            b[o + 2],
            b[o + 3],
            b[o + 4],
            b[o + 5],
            b[o + 6],
            b[o + 7],
        ])
    }
    /// Replaces word `i & 3`.
    #[inline(always)]
    pub fn set_word(&mut self, i: usize, value: u64) {
        let o = (i & 3) * 8;
        let w = value.to_le_bytes();
        let dst = &mut self.0[o..o + 8];
        dst.copy_from_slice(&w);
    }

    /// The bits `[lo, lo + width)` as an integer (bit `lo` is bit 0 of the result).
    ///
    /// Total: `width` above 64 reads 64 bits, bits past 255 read as zero. With constant
    /// arguments this folds to one or two loads, a shift and a mask.
    #[inline(always)]
    pub const fn get_bits(&self, lo: u32, width: u32) -> u64 {
        if lo >= 256 {
            return 0;
        }
        let i = (lo / 64) as usize;
        let sh = lo % 64;
        let low = self.word(i) >> sh;
        let high = if sh != 0 && i < 3 {
            self.word(i + 1) << (64 - sh)
        } else {
            0
        };
        (low | high) & low_mask(width)
    }

    /// Writes the low `width` bits of `value` to `[lo, lo + width)`; higher bits of `value`
    /// are dropped and every other bit of the descriptor is kept.
    ///
    /// Total: `width` above 64 writes 64 bits, bits past 255 are dropped.
    #[inline(always)]
    pub fn set_bits(&mut self, lo: u32, width: u32, value: u64) {
        if lo >= 256 {
            return;
        }
        let mask = low_mask(width);
        let v = value & mask;
        let i = (lo / 64) as usize;
        let sh = lo % 64;
        let w = self.word(i);
        self.set_word(i, (w & !(mask << sh)) | (v << sh));
        if sh != 0 && i < 3 {
            let high_mask = mask >> (64 - sh);
            if high_mask != 0 {
                let w = self.word(i + 1);
                self.set_word(i + 1, (w & !high_mask) | (v >> (64 - sh)));
            }
        }
    }

    /// The value of `field`.
    #[inline(always)]
    pub const fn get(&self, field: BitField) -> u64 {
        self.get_bits(field.lo(), field.width())
    }
    /// Writes `value` (truncated to the field's width) to `field`.
    #[inline(always)]
    pub fn set(&mut self, field: BitField, value: u64) {
        self.set_bits(field.lo(), field.width(), value)
    }
    /// Bit `bit` (0..=255; higher bits read as false).
    #[inline(always)]
    pub const fn bit(&self, bit: u32) -> bool {
        self.get_bits(bit, 1) != 0
    }
    /// Sets or clears bit `bit` (0..=255; higher bits are ignored).
    #[inline(always)]
    pub fn set_bit(&mut self, bit: u32, on: bool) {
        self.set_bits(bit, 1, on as u64)
    }

    /// The 128 bits of words `i` and `i + 1` (`i` = 0 or 2), low word first: the bitmaps of
    /// the ACK reports.
    #[inline(always)]
    pub const fn get_u128(&self, i: usize) -> u128 {
        (self.word(i) as u128) | ((self.word(i + 1) as u128) << 64)
    }
    /// Writes `value` to words `i` and `i + 1`, low word first.
    #[inline(always)]
    pub fn set_u128(&mut self, i: usize, value: u128) {
        self.set_word(i, value as u64);
        self.set_word(i + 1, (value >> 64) as u64);
    }

    /// Sets the op_code byte (byte 30).
    #[inline(always)]
    pub fn set_op_code(&mut self, op: u8) {
        self.0[30] = op;
    }
    /// Sets or clears the valid bit (255).
    #[inline(always)]
    pub fn set_valid(&mut self, on: bool) {
        self.set_bit(VALID, on)
    }
    /// Sets or clears the has_next bit (254).
    #[inline(always)]
    pub fn set_has_next(&mut self, on: bool) {
        self.set_bit(HAS_NEXT, on)
    }
    /// Sets or clears the is_extended_op_code bit (248).
    #[inline(always)]
    pub fn set_is_extended_op_code(&mut self, on: bool) {
        self.set_bit(IS_EXTENDED_OP_CODE, on)
    }

    /// A descriptor whose only non-zero bits are the common header: `op_code`, `has_next`
    /// and valid = 1 (what every producer in this project writes).
    #[inline(always)]
    pub const fn with_header(op_code: u8, has_next: bool) -> Self {
        let mut b = [0u8; DESC_SIZE];
        b[30] = op_code;
        b[31] = 0x80 | if has_next { 0x40 } else { 0 };
        RawDesc(b)
    }
}

impl Default for RawDesc {
    fn default() -> Self {
        Self::ZERO
    }
}

impl core::fmt::Debug for RawDesc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("RawDesc(")?;
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 && i % 8 == 0 {
                f.write_str("_")?;
            }
            write!(f, "{b:02x}")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: bit-by-bit, straight from the "bit N is bit N%8 of byte N/8" rule.
    fn slow_get(d: &RawDesc, lo: u32, width: u32) -> u64 {
        let mut v = 0;
        for k in 0..width.min(64) {
            let n = lo + k;
            if n < 256 && d.0[(n / 8) as usize] >> (n % 8) & 1 == 1 {
                v |= 1 << k;
            }
        }
        v
    }

    #[test]
    fn words_are_little_endian_byte_groups() {
        let mut d = RawDesc::ZERO;
        d.0[0] = 0x11;
        d.0[7] = 0x88;
        d.0[31] = 0x80;
        assert_eq!(d.word(0), 0x8800_0000_0000_0011);
        assert_eq!(d.word(3), 0x8000_0000_0000_0000);
        assert_eq!(RawDesc::from_words(d.words()), d);
    }

    #[test]
    fn get_bits_matches_bitwise_reading_including_word_crossings() {
        let mut d = RawDesc::ZERO;
        for (i, b) in d.0.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37) ^ 0xA5;
        }
        for lo in 0..256 {
            for width in [1, 3, 7, 8, 17, 24, 32, 48, 63, 64] {
                assert_eq!(
                    d.get_bits(lo, width),
                    slow_get(&d, lo, width),
                    "lo={lo} w={width}"
                );
            }
        }
    }

    #[test]
    fn set_bits_touches_only_its_range() {
        for lo in 0..256u32 {
            for width in [1u32, 5, 17, 24, 48, 64] {
                let mut d = RawDesc([0xFF; DESC_SIZE]);
                d.set_bits(lo, width, 0);
                for n in 0..256u32 {
                    let inside = n >= lo && n < lo + width;
                    assert_eq!(d.bit(n), !inside, "lo={lo} w={width} bit {n}");
                }
                let mut z = RawDesc::ZERO;
                z.set_bits(lo, width, u64::MAX);
                assert_eq!(z.get_bits(lo, width), slow_get(&z, lo, width));
                assert_eq!(
                    z.0.iter().map(|b| b.count_ones()).sum::<u32>(),
                    width.min(256 - lo)
                );
            }
        }
    }

    #[test]
    fn out_of_range_positions_do_not_panic() {
        let mut d = RawDesc([0xFF; DESC_SIZE]);
        assert_eq!(d.get_bits(256, 8), 0);
        assert_eq!(d.get_bits(250, 64), 0x3F);
        d.set_bits(300, 8, 0);
        d.set_bits(0, 0, 0);
        assert_eq!(d, RawDesc([0xFF; DESC_SIZE]));
    }

    #[test]
    fn header_helpers_agree_with_the_byte_view() {
        let mut d = RawDesc::with_header(0x11, true);
        assert_eq!((d.op_code(), d.valid(), d.has_next()), (0x11, true, true));
        d.set_has_next(false);
        d.set_is_extended_op_code(true);
        assert_eq!(d.0[31], 0x81);
        assert_eq!(d.get(OP_CODE), 0x11);
    }
}
