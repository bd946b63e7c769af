//! Ethernet II header, 14 bytes: destination MAC, source MAC, EtherType (frame bytes
//! 0..13, nic-behaviour.md 1.4). No VLAN tag: the card neither sends nor expects one.

pub use crate::mac::MacAddr;

use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{read_layout, write_layout, Header, HeaderKind, WireError};

/// Length of the Ethernet II header.
pub const ETH_HEADER_LEN: usize = 14;

/// The EtherType field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800.
    Ipv4,
    /// 0x0806.
    Arp,
    /// Anything else, kept as read.
    Unknown(u16),
}

impl EtherType {
    /// Decodes the field.
    pub const fn from_raw(raw: u16) -> Self {
        match raw {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            other => EtherType::Unknown(other),
        }
    }

    /// The field value.
    pub const fn raw(self) -> u16 {
        match self {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Unknown(raw) => raw,
        }
    }
}

/// An Ethernet II header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EthernetHeader {
    /// Destination MAC (frame bytes 0..5).
    pub dst: MacAddr,
    /// Source MAC (frame bytes 6..11).
    pub src: MacAddr,
    /// EtherType (frame bytes 12..13).
    pub ethertype: EtherType,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Layout {
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: U16,
}

impl Header for EthernetHeader {
    const LEN: usize = ETH_HEADER_LEN;
    const KIND: HeaderKind = HeaderKind::Ethernet;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, rest) = read_layout::<Layout>(bytes, Self::KIND)?;
        let header = EthernetHeader {
            dst: MacAddr(l.dst),
            src: MacAddr(l.src),
            ethertype: EtherType::from_raw(l.ethertype.get()),
        };
        Ok((header, rest))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let l = Layout {
            dst: self.dst.0,
            src: self.src.0,
            ethertype: U16::new(self.ethertype.raw()),
        };
        write_layout(&l, out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_integer_form_is_wire_order() {
        let m = MacAddr::from_bits(0xAABB_CCDD_EE0A);
        assert_eq!(m.0, [0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0x0A]);
        assert_eq!(m.to_bits(), 0xAABB_CCDD_EE0A);
        assert!(MacAddr::BROADCAST.is_broadcast() && !m.is_broadcast());
    }

    #[test]
    fn header_bytes() {
        let h = EthernetHeader {
            dst: MacAddr([1, 2, 3, 4, 5, 6]),
            src: MacAddr([7, 8, 9, 10, 11, 12]),
            ethertype: EtherType::Ipv4,
        };
        let mut out = [0u8; 15];
        assert_eq!(h.emit(&mut out), Ok(14));
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 8, 0, 0]);
        assert_eq!(EthernetHeader::parse(&out), Ok((h, &[0u8][..])));
        assert_eq!(
            EthernetHeader::parse(&out[..13]),
            Err(WireError::Truncated {
                header: HeaderKind::Ethernet,
                needed: 14,
                available: 13
            })
        );
        assert_eq!(
            h.emit(&mut out[..10]),
            Err(WireError::BufferTooSmall {
                header: HeaderKind::Ethernet,
                needed: 14,
                available: 10
            })
        );
    }
}
