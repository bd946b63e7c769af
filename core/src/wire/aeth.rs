//! The card's extended ACK header, 36 bytes (nic-behaviour.md 1.5-1.6,
//! layout-verification.md 1.6; the "38 bytes" of older notes is wrong):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..15 | pre_bitmap (u128, big-endian: byte 0 holds bits 127..120) |
//! | 16..31 | now_bitmap (u128) |
//! | 32 | bit 7 is_packet_lost, bit 6 is_window_slided, bit 5 is_send_by_driver, 4..0 zero |
//! | 33..35 | pre_psn (24 bits) |
//!
//! It replaces the 4-byte IBTA AETH. Nothing follows it in the driver's 90-byte frame; the
//! hardware NAK's fixed header area has 6 more bytes (see [`super::nreth`]).

use zerocopy::network_endian::U128;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{read_layout, u24_from_be, u24_to_be, write_layout, Header, HeaderKind, WireError};

/// Length of the extended AETH.
pub const AETH_LEN: usize = 36;

/// The card's extended ACK extension header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Aeth {
    /// The receive bitmap before the update that produced this ACK.
    pub pre_bitmap: u128,
    /// The receive bitmap after it.
    pub now_bitmap: u128,
    /// A gap was detected.
    pub is_packet_lost: bool,
    /// The window moved (the frame is a NAK; a report carries an AckExtra).
    pub is_window_slided: bool,
    /// Built by a driver, not by the card's AutoAck generator.
    pub is_send_by_driver: bool,
    /// The PSN that `pre_bitmap` refers to (24 bits).
    pub pre_psn: u32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Layout {
    pre_bitmap: U128,
    now_bitmap: U128,
    flags: u8,
    pre_psn: [u8; 3],
}

impl Header for Aeth {
    const LEN: usize = AETH_LEN;
    const KIND: HeaderKind = HeaderKind::Aeth;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, rest) = read_layout::<Layout>(bytes, Self::KIND)?;
        let aeth = Aeth {
            pre_bitmap: l.pre_bitmap.get(),
            now_bitmap: l.now_bitmap.get(),
            is_packet_lost: l.flags & 0x80 != 0,
            is_window_slided: l.flags & 0x40 != 0,
            is_send_by_driver: l.flags & 0x20 != 0,
            pre_psn: u24_from_be(l.pre_psn),
        };
        Ok((aeth, rest))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let l = Layout {
            pre_bitmap: U128::new(self.pre_bitmap),
            now_bitmap: U128::new(self.now_bitmap),
            flags: (self.is_packet_lost as u8) << 7
                | (self.is_window_slided as u8) << 6
                | (self.is_send_by_driver as u8) << 5,
            pre_psn: u24_to_be(self.pre_psn, "aeth.pre_psn")?,
        };
        write_layout(&l, out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        let aeth = Aeth {
            pre_bitmap: 0x0123_4567_89AB_CDEF_FEDC_BA98_7654_3210,
            now_bitmap: u128::MAX,
            is_packet_lost: true,
            is_window_slided: false,
            is_send_by_driver: true,
            pre_psn: 0x000100,
        };
        let mut out = [0u8; 36];
        assert_eq!(aeth.emit(&mut out), Ok(36));
        assert_eq!(out[0], 0x01, "byte 0 holds bits 127..120");
        assert_eq!(out[15], 0x10);
        assert_eq!(out[16..32], [0xFF; 16]);
        assert_eq!(out[32..], [0xA0, 0x00, 0x01, 0x00]);
        assert_eq!(Aeth::parse(&out), Ok((aeth, &[][..])));
    }
}
