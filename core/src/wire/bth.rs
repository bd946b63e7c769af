//! Base transport header, 12 bytes (frame bytes 42..53; nic-behaviour.md 1.5,
//! layout-verification.md 1.6):
//!
//! | Byte | Bits | Field |
//! |---|---|---|
//! | 0 | 7..0 | opcode {transport (7..5), operation (4..0)} |
//! | 1 | 7 / 6 / 5..4 / 3..0 | SE / M (= is_retry on this card) / PadCnt / TVer |
//! | 2..3 | | P_Key position: the MSN on this card |
//! | 4 | 7 / 6 / 5..0 | FECN / BECN / reserved |
//! | 5..7 | | destination QPN |
//! | 8 | 7 / 6..0 | AckReq / reserved |
//! | 9..11 | | PSN |
//!
//! Reserved bits are written as zero and ignored when read.

use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::opcode::RdmaOpcode;
use super::{
    check_width, read_layout, u24_from_be, u24_to_be, write_layout, Header, HeaderKind, WireError,
};
use crate::keys::Qpn;

/// Length of the BTH.
pub const BTH_LEN: usize = 12;

/// A base transport header as this card uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bth {
    /// The 8-bit opcode.
    pub opcode: RdmaOpcode,
    /// Solicited event (the WR's SOLICITED flag, on every packet of the WR).
    pub solicited: bool,
    /// The MigReq bit, which this card uses as "retransmission".
    pub is_retry: bool,
    /// Pad count (2 bits); the card always sends 0.
    pub pad_count: u8,
    /// Transport header version (4 bits); 0.
    pub tver: u8,
    /// The message sequence number, carried where IBTA has the P_Key.
    pub msn: u16,
    /// Forward ECN notification.
    pub fecn: bool,
    /// Backward ECN notification.
    pub becn: bool,
    /// Destination QP.
    pub dqpn: Qpn,
    /// Acknowledge request (the WR's SIGNALED flag, on every packet of the WR).
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// A BTH with the given opcode, destination and PSN; every flag clear, MSN 0.
    pub const fn new(opcode: RdmaOpcode, dqpn: Qpn, psn: u32) -> Self {
        Bth {
            opcode,
            solicited: false,
            is_retry: false,
            pad_count: 0,
            tver: 0,
            msn: 0,
            fecn: false,
            becn: false,
            dqpn,
            ack_req: false,
            psn,
        }
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Layout {
    opcode: u8,
    flags: u8,
    msn: U16,
    ecn: u8,
    dqpn: [u8; 3],
    ack_req: u8,
    psn: [u8; 3],
}

impl Header for Bth {
    const LEN: usize = BTH_LEN;
    const KIND: HeaderKind = HeaderKind::Bth;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, rest) = read_layout::<Layout>(bytes, Self::KIND)?;
        let bth = Bth {
            opcode: RdmaOpcode::from_raw(l.opcode),
            solicited: l.flags & 0x80 != 0,
            is_retry: l.flags & 0x40 != 0,
            pad_count: (l.flags >> 4) & 0x3,
            tver: l.flags & 0x0F,
            msn: l.msn.get(),
            fecn: l.ecn & 0x80 != 0,
            becn: l.ecn & 0x40 != 0,
            dqpn: Qpn::from_raw(u24_from_be(l.dqpn)),
            ack_req: l.ack_req & 0x80 != 0,
            psn: u24_from_be(l.psn),
        };
        Ok((bth, rest))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let pad_count = check_width(self.pad_count, 2, "bth.pad_count")?;
        let tver = check_width(self.tver, 4, "bth.tver")?;
        let l = Layout {
            opcode: self.opcode.raw(),
            flags: (self.solicited as u8) << 7 | (self.is_retry as u8) << 6 | pad_count << 4 | tver,
            msn: U16::new(self.msn),
            ecn: (self.fecn as u8) << 7 | (self.becn as u8) << 6,
            dqpn: u24_to_be(self.dqpn.get(), "bth.dqpn")?,
            ack_req: (self.ack_req as u8) << 7,
            psn: u24_to_be(self.psn, "bth.psn")?,
        };
        write_layout(&l, out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_in_its_place() {
        let bth = Bth {
            opcode: RdmaOpcode::WriteFirst,
            solicited: true,
            is_retry: true,
            pad_count: 2,
            tver: 0xA,
            msn: 0x1234,
            fecn: true,
            becn: false,
            dqpn: Qpn::from_raw(0x0345CD),
            ack_req: true,
            psn: 0xABCDEF,
        };
        let mut out = [0u8; 12];
        assert_eq!(bth.emit(&mut out), Ok(12));
        assert_eq!(
            out,
            [0x06, 0xEA, 0x12, 0x34, 0x80, 0x03, 0x45, 0xCD, 0x80, 0xAB, 0xCD, 0xEF]
        );
        assert_eq!(Bth::parse(&out), Ok((bth, &[][..])));
    }

    #[test]
    fn reserved_bits_are_ignored_and_wide_values_refused() {
        let bytes = [0x11, 0, 0, 0, 0x3F, 0, 0, 1, 0x7F, 0, 0, 2];
        let (bth, _) = Bth::parse(&bytes).unwrap();
        assert_eq!(bth, Bth::new(RdmaOpcode::Acknowledge, Qpn::from_raw(1), 2));
        let mut out = [0u8; 12];
        let wide = Bth::new(RdmaOpcode::Acknowledge, Qpn::from_raw(1), 0x0100_0000);
        assert!(matches!(
            wide.emit(&mut out),
            Err(WireError::FieldOutOfRange {
                field: "bth.psn",
                ..
            })
        ));
        let mut pad = Bth::new(RdmaOpcode::Acknowledge, Qpn::from_raw(1), 0);
        pad.pad_count = 4;
        assert!(matches!(
            pad.emit(&mut out),
            Err(WireError::FieldOutOfRange {
                field: "bth.pad_count",
                ..
            })
        ));
    }
}
