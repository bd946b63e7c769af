//! Descriptors: the 32-byte entries of every ring (hardware-contract.md "Rings",
//! layout-verification.md section 1). A descriptor is four little-endian u64 words; bit N
//! of the 256-bit value is bit N%8 of byte N/8. Bits 240..255 are the common header.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Size of every descriptor in bytes.
pub const DESC_SIZE: usize = 32;

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
