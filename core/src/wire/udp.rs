//! UDP header, 8 bytes (frame bytes 34..41, nic-behaviour.md 1.4). RoCE v2 goes to port
//! 4791; the card sends checksum 0 and never checks one, so `emit` writes 0 and `parse`
//! ignores the field.

use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{read_layout, write_layout, Header, HeaderKind, LengthField, WireError};

/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// The RoCE v2 destination port.
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// A UDP header (the checksum is not kept: see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdpHeader {
    /// Source port (the card: sender QPN & 0xFFFF for data packets).
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Length of this header plus its payload.
    pub length: u16,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Layout {
    src_port: U16,
    dst_port: U16,
    length: U16,
    checksum: U16,
}

impl Header for UdpHeader {
    const LEN: usize = UDP_HEADER_LEN;
    const KIND: HeaderKind = HeaderKind::Udp;

    /// Returns the header and the payload its length field covers.
    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, _) = read_layout::<Layout>(bytes, Self::KIND)?;
        let length = l.length.get() as usize;
        let payload = bytes
            .get(UDP_HEADER_LEN..length)
            .ok_or(WireError::InconsistentLength {
                field: LengthField::UdpLength,
                found: length,
                expected: bytes.len(),
            })?;
        let header = UdpHeader {
            src_port: l.src_port.get(),
            dst_port: l.dst_port.get(),
            length: l.length.get(),
        };
        Ok((header, payload))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let l = Layout {
            src_port: U16::new(self.src_port),
            dst_port: U16::new(self.dst_port),
            length: U16::new(self.length),
            checksum: U16::ZERO,
        };
        write_layout(&l, out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_length_check() {
        let h = UdpHeader {
            src_port: 0x23AB,
            dst_port: ROCE_V2_UDP_PORT,
            length: 10,
        };
        let mut out = [0xEEu8; 11];
        assert_eq!(h.emit(&mut out), Ok(8));
        assert_eq!(out[..8], [0x23, 0xAB, 0x12, 0xB7, 0x00, 0x0A, 0x00, 0x00]);
        let (back, payload) = UdpHeader::parse(&out).unwrap();
        assert_eq!(back, h);
        assert_eq!(payload, &[0xEE, 0xEE]);
        assert_eq!(
            UdpHeader::parse(&out[..9]),
            Err(WireError::InconsistentLength {
                field: LengthField::UdpLength,
                found: 10,
                expected: 9
            })
        );
        out[5] = 7; // length below the header's own size
        assert!(matches!(
            UdpHeader::parse(&out),
            Err(WireError::InconsistentLength {
                field: LengthField::UdpLength,
                found: 7,
                ..
            })
        ));
    }
}
