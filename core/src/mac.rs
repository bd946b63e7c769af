//! Ethernet MAC addresses, shared by descriptors and wire headers. Descriptors carry a
//! 48-bit number whose most significant octet is the first on the wire
//! (layout-verification.md 1.2, ManageQp peer_mac_addr: "first octet in bits 47..40").

use core::fmt;

/// A 48-bit MAC address, stored in wire order (`octets()[0]` is sent first).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The all-ones broadcast address.
    pub const BROADCAST: MacAddr = MacAddr([0xFF; 6]);

    /// From the octets in wire order.
    #[inline]
    pub const fn new(octets: [u8; 6]) -> Self {
        Self(octets)
    }
    /// The octets in wire order.
    #[inline]
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }
    /// From the 48-bit numeric form (first octet = bits 47..40); bits 48..63 are ignored.
    #[inline]
    pub const fn from_bits(bits: u64) -> Self {
        let b = bits.to_be_bytes();
        Self([b[2], b[3], b[4], b[5], b[6], b[7]])
    }
    /// The 48-bit numeric form (first octet = bits 47..40), as descriptors store it.
    #[inline]
    pub const fn to_bits(self) -> u64 {
        let o = self.0;
        u64::from_be_bytes([0, 0, o[0], o[1], o[2], o[3], o[4], o[5]])
    }
    /// Whether this is the broadcast address.
    #[inline]
    pub const fn is_broadcast(self) -> bool {
        self.to_bits() == 0xFFFF_FFFF_FFFF
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn numeric_form_puts_first_octet_high() {
        let m = MacAddr::from_bits(0xAABB_CCDD_EE0A);
        assert_eq!(m.octets(), [0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x0A]);
        assert_eq!(m.to_bits(), 0xAABB_CCDD_EE0A);
        assert_eq!(MacAddr::from_bits(0xFFFF_0000_0000_0001).to_bits(), 1);
        assert_eq!(format!("{m}"), "aa:bb:cc:dd:ee:0a");
    }
}
