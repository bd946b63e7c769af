//! Ethernet MAC addresses as descriptors carry them: a 48-bit number whose most significant
//! octet is the first on the wire (layout-verification.md 1.2, ManageQp peer_mac_addr: "first
//! octet in bits 47..40").

use core::fmt;

/// A 48-bit MAC address in its numeric form (first octet in bits 47..40), the form every
/// descriptor carries; [`MacAddr::octets`] is the wire-order view. Ordering is the octets'
/// lexicographic order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MacAddr(u64);

impl MacAddr {
    /// The all-ones broadcast address.
    pub const BROADCAST: MacAddr = MacAddr(0xFFFF_FFFF_FFFF);

    /// From the octets in wire order.
    #[inline]
    pub const fn new(o: [u8; 6]) -> Self {
        Self(u64::from_be_bytes([
            0, 0, o[0], o[1], o[2], o[3], o[4], o[5],
        ]))
    }
    /// The octets in wire order.
    #[inline]
    pub const fn octets(self) -> [u8; 6] {
        let b = self.0.to_be_bytes();
        [b[2], b[3], b[4], b[5], b[6], b[7]]
    }
    /// From the 48-bit numeric form (first octet = bits 47..40); bits 48..63 are ignored.
    #[inline]
    pub const fn from_bits(bits: u64) -> Self {
        Self(bits & 0xFFFF_FFFF_FFFF)
    }
    /// The 48-bit numeric form (first octet = bits 47..40), as descriptors store it.
    #[inline]
    pub const fn to_bits(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.octets();
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
        assert_eq!(MacAddr::new(m.octets()), m);
        assert!(MacAddr::new([1, 0, 0, 0, 0, 0]) > MacAddr::new([0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]));
    }
}
