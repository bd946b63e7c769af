//! Keys and queue-pair numbers: `(index << 8) | key8` (hardware-contract.md "Keys, page
//! tables, pages"). The card indexes its tables by `>> 8` and checks the low byte.

use core::fmt;

/// Number of MR table entries in the card (13-bit index).
pub const MR_TABLE_LEN: u32 = 8192;
/// Number of QP contexts in the card (10-bit index); index 0 is reserved.
pub const QP_TABLE_LEN: u32 = 1024;
/// Number of page-table entries in the card (17-bit offset).
pub const PGT_LEN: u32 = 131_072;

/// A queue pair number: 24 bits, `index << 8 | key`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct Qpn(u32);

impl Qpn {
    /// Builds a QPN from its table index and key byte. `None` if the index does not fit the
    /// card's table or is the reserved index 0.
    pub const fn new(index: u32, key: u8) -> Option<Self> {
        if index == 0 || index >= QP_TABLE_LEN {
            return None;
        }
        Some(Self((index << 8) | key as u32))
    }
    /// Wraps a raw 24-bit value as read from a descriptor or a packet (masked to 24 bits).
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw & 0x00FF_FFFF)
    }
    /// The raw 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }
    /// The table index (`qpn >> 8`).
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }
    /// The key byte (`qpn & 0xFF`).
    pub const fn key(self) -> u8 {
        self.0 as u8
    }
}

/// A memory-region key (lkey = rkey): 32 bits, `index << 8 | key`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct MrKey(u32);

impl MrKey {
    /// Builds a key from the MR table index and the key byte; `None` if the index does not
    /// fit the card's table.
    pub const fn new(index: u32, key: u8) -> Option<Self> {
        if index >= MR_TABLE_LEN {
            return None;
        }
        Some(Self((index << 8) | key as u32))
    }
    /// Wraps a raw value as read from a descriptor or a packet.
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }
    /// The raw value.
    pub const fn get(self) -> u32 {
        self.0
    }
    /// The MR table index (`key[20:8]`, as the card decodes it).
    pub const fn index(self) -> u32 {
        (self.0 >> 8) & (MR_TABLE_LEN - 1)
    }
    /// The key byte (`key & 0xFF`).
    pub const fn key(self) -> u8 {
        self.0 as u8
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl fmt::Debug for MrKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MrKey({:#010x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpn_splits_index_and_key() {
        let q = Qpn::new(0x123, 0xAB).unwrap();
        assert_eq!(q.get(), 0x0123AB);
        assert_eq!(q.index(), 0x123);
        assert_eq!(q.key(), 0xAB);
        assert!(Qpn::new(0, 1).is_none(), "index 0 is reserved");
        assert!(Qpn::new(QP_TABLE_LEN, 1).is_none());
        assert_eq!(Qpn::from_raw(0xFF12_3456).get(), 0x12_3456);
    }

    #[test]
    fn mr_key_index_is_thirteen_bits() {
        let k = MrKey::from_raw(0x001F_FFA5);
        assert_eq!(k.index(), 0x1FFF);
        assert_eq!(k.key(), 0xA5);
        assert_eq!(MrKey::new(0x1FFF, 0xA5), Some(k));
        assert!(MrKey::new(MR_TABLE_LEN, 0).is_none());
    }
}
