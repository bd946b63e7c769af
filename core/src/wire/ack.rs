//! The driver-generated ACK and NAK frames (reference-driver.md 2.9,
//! layout-verification.md 1.6 and the golden vectors of its section 5).
//!
//! The card never sends a positive ACK (hardware-contract.md correction 12): the driver
//! builds one and sends it through the simple-NIC TX ring. The frame is 90 bytes: Ethernet,
//! IPv4, UDP (4791 to 4791, checksum 0), then a 48-byte UDP payload of BTH (opcode 0x11,
//! destination = the peer's QPN, the acknowledged PSN, MSN 0, no flags) and the 36-byte
//! AETH, and nothing after it:
//!
//! | Frame | pre_bitmap | now_bitmap | lost / slided / by_driver | pre_psn |
//! |---|---|---|---|---|
//! | ACK | 0 | all ones | 0 / 0 / 1 | 0 |
//! | NAK | 0 | 0 | 1 / 1 / 1 | first PSN to resend |
//!
//! The IPv4 header is the card's (ID 1, DF clear, TTL 64) with the checksum computed; the
//! reference left the checksum 0. [`ReceivedAck`] reads either this 90-byte form or the
//! card's own 96-byte NAK (nic-behaviour.md 3.4) and tells them apart.

use core::net::Ipv4Addr;

use super::aeth::Aeth;
use super::bth::Bth;
use super::eth::MacAddr;
use super::nreth::Nreth;
use super::opcode::RdmaOpcode;
use super::packet::{
    FrameEnvelope, PacketHeaders, RocePacket, DRIVER_ACK_FRAME_LEN, DRIVER_ACK_UDP_SRC_PORT,
};
use super::WireError;
use crate::keys::Qpn;

/// What a driver-built frame says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AckVerdict {
    /// Everything up to the frame's PSN arrived.
    Ack,
    /// Something was lost; resend from `pre_psn` (24 bits).
    Nak {
        /// The PSN the requester should resend from.
        pre_psn: u32,
    },
}

/// A driver-built ACK or NAK frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DriverAckFrame {
    /// Our device's MAC.
    pub src_mac: MacAddr,
    /// The peer's MAC.
    pub dst_mac: MacAddr,
    /// Our device's IP address.
    pub src_ip: Ipv4Addr,
    /// The peer's IP address.
    pub dst_ip: Ipv4Addr,
    /// The peer's QPN (the requester this frame acknowledges to).
    pub dqpn: Qpn,
    /// The PSN in the BTH (24 bits).
    pub psn: u32,
    /// ACK or NAK.
    pub verdict: AckVerdict,
}

impl DriverAckFrame {
    /// The RDMA headers of this frame (see the module doc's table).
    pub const fn headers(&self) -> PacketHeaders {
        let aeth = match self.verdict {
            AckVerdict::Ack => Aeth {
                pre_bitmap: 0,
                now_bitmap: u128::MAX,
                is_packet_lost: false,
                is_window_slided: false,
                is_send_by_driver: true,
                pre_psn: 0,
            },
            AckVerdict::Nak { pre_psn } => Aeth {
                pre_bitmap: 0,
                now_bitmap: 0,
                is_packet_lost: true,
                is_window_slided: true,
                is_send_by_driver: true,
                pre_psn,
            },
        };
        let mut headers =
            PacketHeaders::new(Bth::new(RdmaOpcode::Acknowledge, self.dqpn, self.psn));
        headers.aeth = Some(aeth);
        headers
    }

    /// The frame as a [`RocePacket`] (90-byte form: no NRETH).
    pub const fn to_packet(&self) -> RocePacket {
        RocePacket {
            envelope: FrameEnvelope::new(
                self.src_mac,
                self.dst_mac,
                self.src_ip,
                self.dst_ip,
                DRIVER_ACK_UDP_SRC_PORT,
            ),
            headers: self.headers(),
        }
    }

    /// Writes the 90-byte frame into `out`; returns 90.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let len = self.to_packet().emit_frame(&[], out)?;
        debug_assert_eq!(len, DRIVER_ACK_FRAME_LEN);
        Ok(len)
    }
}

/// Who sent an ACK/NAK frame and what it means, from its AETH flags
/// (nic-behaviour-review.md M3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AckKind {
    /// A peer driver's positive ACK (by_driver, not slided).
    DriverAck,
    /// A peer driver's NAK (by_driver, slided).
    DriverNak,
    /// A peer card's loss NAK (not by_driver, slided); its bitmaps follow the card's
    /// "PSN - 112" convention (nic-behaviour.md 3.6).
    HardwareNak,
    /// Neither by_driver nor slided: what the card's unusable WQE op 13 would send.
    Unrecognised,
}

/// An ACK or NAK frame as received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReceivedAck {
    /// MACs, IPs and UDP source port.
    pub envelope: FrameEnvelope,
    /// The BTH (PSN, destination QPN, MSN).
    pub bth: Bth,
    /// The extended AETH.
    pub aeth: Aeth,
    /// Present in the 96-byte (hardware) form only.
    pub nreth: Option<Nreth>,
}

impl ReceivedAck {
    /// Reads a 90- or 96-byte ACK/NAK frame; [`WireError::NotAck`] for other RoCE frames.
    pub fn parse(frame: &[u8]) -> Result<Self, WireError> {
        let (packet, _) = RocePacket::parse_frame(frame)?;
        let h = packet.headers;
        match h.aeth {
            Some(aeth) if h.bth.opcode == RdmaOpcode::Acknowledge => Ok(ReceivedAck {
                envelope: packet.envelope,
                bth: h.bth,
                aeth,
                nreth: h.nreth,
            }),
            _ => Err(WireError::NotAck {
                opcode: h.bth.opcode,
            }),
        }
    }

    /// Classifies the frame by its AETH flags.
    pub const fn kind(&self) -> AckKind {
        match (self.aeth.is_send_by_driver, self.aeth.is_window_slided) {
            (true, false) => AckKind::DriverAck,
            (true, true) => AckKind::DriverNak,
            (false, true) => AckKind::HardwareNak,
            (false, false) => AckKind::Unrecognised,
        }
    }

    /// The frame's verdict if a driver sent it.
    pub const fn driver_verdict(&self) -> Option<AckVerdict> {
        match self.kind() {
            AckKind::DriverAck => Some(AckVerdict::Ack),
            AckKind::DriverNak => Some(AckVerdict::Nak {
                pre_psn: self.aeth.pre_psn,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(verdict: AckVerdict) -> DriverAckFrame {
        DriverAckFrame {
            src_mac: MacAddr::from_bits(0xAABB_CCDD_EE0A),
            dst_mac: MacAddr::from_bits(0xAABB_CCDD_EE0B),
            src_ip: Ipv4Addr::new(17, 34, 51, 10),
            dst_ip: Ipv4Addr::new(17, 34, 51, 11),
            dqpn: Qpn::from_raw(0x0345CD),
            psn: 0x102,
            verdict,
        }
    }

    #[test]
    fn ack_and_nak_round_trip_and_classify() {
        let mut buf = [0u8; 128];
        for (verdict, kind) in [
            (AckVerdict::Ack, AckKind::DriverAck),
            (AckVerdict::Nak { pre_psn: 0x100 }, AckKind::DriverNak),
        ] {
            let f = frame(verdict);
            assert_eq!(f.emit(&mut buf), Ok(90));
            let got = ReceivedAck::parse(&buf[..90]).unwrap();
            assert_eq!(got.kind(), kind);
            assert_eq!(got.driver_verdict(), Some(verdict));
            assert_eq!(got.bth.dqpn, f.dqpn);
            assert_eq!(got.bth.psn, 0x102);
            assert_eq!(got.nreth, None);
            assert_eq!(got.envelope.udp_src_port, 4791);
        }
    }

    #[test]
    fn emit_refuses_a_short_buffer_and_a_wide_psn() {
        let mut buf = [0u8; 89];
        assert!(matches!(
            frame(AckVerdict::Ack).emit(&mut buf),
            Err(WireError::BufferTooSmall {
                needed: 90,
                available: 89,
                ..
            })
        ));
        let mut buf = [0u8; 90];
        let mut f = frame(AckVerdict::Nak {
            pre_psn: 0x0100_0000,
        });
        assert!(matches!(
            f.emit(&mut buf),
            Err(WireError::FieldOutOfRange {
                field: "aeth.pre_psn",
                ..
            })
        ));
        f.verdict = AckVerdict::Ack;
        f.psn = 0x0100_0000;
        assert!(matches!(
            f.emit(&mut buf),
            Err(WireError::FieldOutOfRange {
                field: "bth.psn",
                ..
            })
        ));
    }
}
