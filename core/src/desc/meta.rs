//! Meta-report descriptors: what the card tells the driver about received packets, READ
//! requests, ACKs and NAKs (layout-verification.md 1.4; hardware-contract.md correction 9;
//! background reference-driver.md 2.7).
//!
//! The first descriptor's op_code is the full 8-bit BTH opcode `{trans[2:0], op[4:0]}`. The
//! card reports RC packets only (0x00..=0x10) and ACKNOWLEDGE (0x11); everything else,
//! including the named 0x12..=0x17 it never emits, is a [`DescError::UnknownOpCode`]. Pairs:
//! a READ request is PacketBasicInfo + ReadReqExtendInfo, a NAK (or any ACK with
//! is_window_slided) is Ack + AckExtra; the first has has_next = 1 and the second the same
//! op code with has_next = 0. The valid bit is the ring's business and is not checked here.
//!
//! PSN and MSN are plain `u32` (24 bits) and `u16` until the transport's `Psn`/`Msn` exist.

use super::{BitField, DescError, DescKind, RawDesc};
use crate::addr::VirtAddr;
use crate::keys::{MrKey, Qpn};

/// The 8-bit BTH opcode `{transport[2:0], opcode[4:0]}`; the named values are RC (transport
/// 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RdmaOpcode {
    /// 0x00.
    SendFirst,
    /// 0x01.
    SendMiddle,
    /// 0x02.
    SendLast,
    /// 0x03.
    SendLastImm,
    /// 0x04.
    SendOnly,
    /// 0x05.
    SendOnlyImm,
    /// 0x06.
    WriteFirst,
    /// 0x07.
    WriteMiddle,
    /// 0x08.
    WriteLast,
    /// 0x09.
    WriteLastImm,
    /// 0x0A.
    WriteOnly,
    /// 0x0B.
    WriteOnlyImm,
    /// 0x0C.
    ReadRequest,
    /// 0x0D.
    ReadRespFirst,
    /// 0x0E.
    ReadRespMiddle,
    /// 0x0F.
    ReadRespLast,
    /// 0x10.
    ReadRespOnly,
    /// 0x11.
    Acknowledge,
    /// 0x12.
    AtomicAck,
    /// 0x13.
    CompareSwap,
    /// 0x14.
    FetchAdd,
    /// 0x15.
    Resync,
    /// 0x16.
    SendLastInv,
    /// 0x17.
    SendOnlyInv,
    /// Any other byte (other transports, reserved opcodes), kept as read.
    Unknown(u8),
}

impl RdmaOpcode {
    /// From the 8-bit BTH opcode.
    #[inline]
    pub const fn from_raw(raw: u8) -> Self {
        use RdmaOpcode::*;
        match raw {
            0x00 => SendFirst,
            0x01 => SendMiddle,
            0x02 => SendLast,
            0x03 => SendLastImm,
            0x04 => SendOnly,
            0x05 => SendOnlyImm,
            0x06 => WriteFirst,
            0x07 => WriteMiddle,
            0x08 => WriteLast,
            0x09 => WriteLastImm,
            0x0A => WriteOnly,
            0x0B => WriteOnlyImm,
            0x0C => ReadRequest,
            0x0D => ReadRespFirst,
            0x0E => ReadRespMiddle,
            0x0F => ReadRespLast,
            0x10 => ReadRespOnly,
            0x11 => Acknowledge,
            0x12 => AtomicAck,
            0x13 => CompareSwap,
            0x14 => FetchAdd,
            0x15 => Resync,
            0x16 => SendLastInv,
            0x17 => SendOnlyInv,
            other => Unknown(other),
        }
    }
    /// The 8-bit BTH opcode.
    #[inline]
    pub const fn raw(self) -> u8 {
        use RdmaOpcode::*;
        match self {
            SendFirst => 0x00,
            SendMiddle => 0x01,
            SendLast => 0x02,
            SendLastImm => 0x03,
            SendOnly => 0x04,
            SendOnlyImm => 0x05,
            WriteFirst => 0x06,
            WriteMiddle => 0x07,
            WriteLast => 0x08,
            WriteLastImm => 0x09,
            WriteOnly => 0x0A,
            WriteOnlyImm => 0x0B,
            ReadRequest => 0x0C,
            ReadRespFirst => 0x0D,
            ReadRespMiddle => 0x0E,
            ReadRespLast => 0x0F,
            ReadRespOnly => 0x10,
            Acknowledge => 0x11,
            AtomicAck => 0x12,
            CompareSwap => 0x13,
            FetchAdd => 0x14,
            Resync => 0x15,
            SendLastInv => 0x16,
            SendOnlyInv => 0x17,
            Unknown(raw) => raw,
        }
    }
    /// The transport bits (`raw >> 5`; 0 = RC).
    #[inline]
    pub const fn transport(self) -> u8 {
        self.raw() >> 5
    }
    /// SEND packets (including the *_INV ones).
    #[inline]
    pub const fn is_send(self) -> bool {
        use RdmaOpcode::*;
        matches!(
            self,
            SendFirst
                | SendMiddle
                | SendLast
                | SendLastImm
                | SendOnly
                | SendOnlyImm
                | SendLastInv
                | SendOnlyInv
        )
    }
    /// RDMA WRITE packets.
    #[inline]
    pub const fn is_write(self) -> bool {
        use RdmaOpcode::*;
        matches!(
            self,
            WriteFirst | WriteMiddle | WriteLast | WriteLastImm | WriteOnly | WriteOnlyImm
        )
    }
    /// RDMA READ response packets.
    #[inline]
    pub const fn is_read_response(self) -> bool {
        use RdmaOpcode::*;
        matches!(
            self,
            ReadRespFirst | ReadRespMiddle | ReadRespLast | ReadRespOnly
        )
    }
    /// ACKNOWLEDGE or ATOMIC ACKNOWLEDGE.
    #[inline]
    pub const fn is_ack(self) -> bool {
        matches!(self, RdmaOpcode::Acknowledge | RdmaOpcode::AtomicAck)
    }
    /// First packet of a multi-packet message.
    #[inline]
    pub const fn is_first(self) -> bool {
        use RdmaOpcode::*;
        matches!(self, SendFirst | WriteFirst | ReadRespFirst)
    }
    /// Middle packet of a multi-packet message.
    #[inline]
    pub const fn is_middle(self) -> bool {
        use RdmaOpcode::*;
        matches!(self, SendMiddle | WriteMiddle | ReadRespMiddle)
    }
    /// Last packet of a multi-packet message.
    #[inline]
    pub const fn is_last(self) -> bool {
        use RdmaOpcode::*;
        matches!(
            self,
            SendLast | SendLastImm | SendLastInv | WriteLast | WriteLastImm | ReadRespLast
        )
    }
    /// The only packet of a message.
    #[inline]
    pub const fn is_only(self) -> bool {
        use RdmaOpcode::*;
        matches!(
            self,
            SendOnly | SendOnlyImm | SendOnlyInv | WriteOnly | WriteOnlyImm | ReadRespOnly
        )
    }
    /// The packet ends its message (last or only): where a message completes.
    #[inline]
    pub const fn ends_message(self) -> bool {
        self.is_last() || self.is_only()
    }
    /// The packet carries immediate data.
    #[inline]
    pub const fn has_imm(self) -> bool {
        use RdmaOpcode::*;
        matches!(
            self,
            SendLastImm | SendOnlyImm | WriteLastImm | WriteOnlyImm
        )
    }
    /// The packet carries an rkey to invalidate (IETH).
    #[inline]
    pub const fn has_invalidate(self) -> bool {
        matches!(self, RdmaOpcode::SendLastInv | RdmaOpcode::SendOnlyInv)
    }
    /// The opcode is one that carries payload (SEND, WRITE, READ response); the packet
    /// itself may still be zero-length.
    #[inline]
    pub const fn has_payload(self) -> bool {
        self.is_send() || self.is_write() || self.is_read_response()
    }
}

/// PacketBasicInfo bit fields.
mod packet {
    use super::BitField;
    pub const IMM_DATA: BitField = BitField::new(0, 32);
    pub const RKEY: BitField = BitField::new(32, 32);
    pub const RADDR: BitField = BitField::new(64, 64);
    pub const TOTAL_LEN: BitField = BitField::new(128, 32);
    pub const DQPN: BitField = BitField::new(168, 24);
    pub const IS_RETRY: u32 = 196;
    pub const ACK_REQ: u32 = 197;
    pub const SOLICITED: u32 = 198;
    pub const ECN_MARKED: u32 = 199;
    pub const PSN: BitField = BitField::new(200, 24);
    pub const MSN: BitField = BitField::new(224, 16);
}

/// ReadReqExtendInfo bit fields.
mod read_ext {
    use super::BitField;
    pub const LKEY: BitField = BitField::new(96, 32);
    pub const LADDR: BitField = BitField::new(128, 64);
    pub const TOTAL_LEN: BitField = BitField::new(192, 32);
}

/// Ack bit fields (the bitmap is words 0 and 1).
mod ack {
    use super::BitField;
    pub const MSN: BitField = BitField::new(128, 16);
    pub const QPN: BitField = BitField::new(144, 24);
    pub const PSN_NOW: BitField = BitField::new(168, 24);
    pub const PSN_BEFORE_SLIDE: BitField = BitField::new(200, 24);
    pub const IS_PACKET_LOST: u32 = 232;
    pub const IS_WINDOW_SLIDED: u32 = 233;
    pub const IS_SEND_BY_DRIVER: u32 = 234;
    pub const IS_SEND_BY_LOCAL_HW: u32 = 235;
}

/// The headers of a received packet (PacketBasicInfo).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    /// BTH opcode.
    pub opcode: RdmaOpcode,
    /// PSN (24 bits).
    pub psn: u32,
    /// MSN from the BTH P_Key position.
    pub msn: u16,
    /// BTH destination QP: the local QP the packet targets.
    pub dqpn: Qpn,
    /// RETH virtual address (for a READ request: the responder's source address).
    pub raddr: VirtAddr,
    /// RETH rkey.
    pub rkey: MrKey,
    /// RETH dlen (whole message length).
    pub total_len: u32,
    /// ImmDt (don't-care without immediate data).
    pub imm_data: u32,
    /// BTH M bit: a retransmission.
    pub is_retry: bool,
    /// BTH AckReq.
    pub ack_req: bool,
    /// BTH SE.
    pub solicited: bool,
    /// **Undefined in the RTL (assigned `?`): must be ignored** (correction 9). Decoded only
    /// so that a report can be re-encoded bit for bit.
    pub ecn_marked: bool,
}

/// The second descriptor of a READ request: where the requester wants the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadReqExt {
    /// The requester's local key for the sink buffer.
    pub lkey: MrKey,
    /// The requester's sink address.
    pub laddr: VirtAddr,
    /// READ length (same as the first descriptor's total_len).
    pub total_len: u32,
}

/// An ACK or NAK report (received from the peer, or generated by the card's own loss
/// detector or timer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckReport {
    /// Receive bitmap after the event; bit i is bit i of the 128-bit value.
    pub now_bitmap: u128,
    /// ACK MSN (0 in timer reports).
    pub msn: u16,
    /// The local QP (card reports) or the BTH dqpn of the received ACK.
    pub qpn: Qpn,
    /// Card reports: window left bound << 4 (low 4 bits 0); received: BTH PSN. 24 bits.
    pub psn_now: u32,
    /// AETH preBitmapPsn (card reports: old window bound << 4). 24 bits.
    pub psn_before_slide: u32,
    /// A packet was lost.
    pub is_packet_lost: bool,
    /// The window moved; an [`AckExtra`] with the previous bitmap follows.
    pub is_window_slided: bool,
    /// The ACK was built by the peer's driver.
    pub is_send_by_driver: bool,
    /// The report comes from this card (no packet was received).
    pub is_send_by_local_hw: bool,
}

/// The second descriptor of a NAK: the bitmap before the window moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckExtra {
    /// Bitmap of the previous window.
    pub pre_bitmap: u128,
}

/// One event on the meta-report ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaReport {
    /// A SEND/WRITE/READ-response packet (one descriptor).
    Packet(PacketInfo),
    /// A READ request (two descriptors).
    ReadRequest(PacketInfo, ReadReqExt),
    /// An ACK without window slide (one descriptor).
    Ack(AckReport),
    /// An ACK with the previous bitmap (two descriptors): a NAK.
    Nak(AckReport, AckExtra),
}

const ACK_OP: u8 = 0x11;
const READ_REQUEST_OP: u8 = 0x0C;

impl PacketInfo {
    #[inline(always)]
    fn encode(&self, has_next: bool) -> RawDesc {
        let mut d = RawDesc::with_header(self.opcode.raw(), has_next);
        d.set(packet::IMM_DATA, self.imm_data.into());
        d.set(packet::RKEY, self.rkey.get().into());
        d.set(packet::RADDR, self.raddr.get());
        d.set(packet::TOTAL_LEN, self.total_len.into());
        d.set(packet::DQPN, self.dqpn.get().into());
        d.set_bit(packet::IS_RETRY, self.is_retry);
        d.set_bit(packet::ACK_REQ, self.ack_req);
        d.set_bit(packet::SOLICITED, self.solicited);
        d.set_bit(packet::ECN_MARKED, self.ecn_marked);
        d.set(packet::PSN, self.psn.into());
        d.set(packet::MSN, self.msn.into());
        d
    }

    #[inline(always)]
    fn decode(d: &RawDesc) -> Self {
        PacketInfo {
            opcode: RdmaOpcode::from_raw(d.op_code()),
            psn: d.get(packet::PSN) as u32,
            msn: d.get(packet::MSN) as u16,
            dqpn: Qpn::from_raw(d.get(packet::DQPN) as u32),
            raddr: VirtAddr(d.get(packet::RADDR)),
            rkey: MrKey::from_raw(d.get(packet::RKEY) as u32),
            total_len: d.get(packet::TOTAL_LEN) as u32,
            imm_data: d.get(packet::IMM_DATA) as u32,
            is_retry: d.bit(packet::IS_RETRY),
            ack_req: d.bit(packet::ACK_REQ),
            solicited: d.bit(packet::SOLICITED),
            ecn_marked: d.bit(packet::ECN_MARKED),
        }
    }
}

impl ReadReqExt {
    #[inline(always)]
    fn encode(&self, op: u8) -> RawDesc {
        let mut d = RawDesc::with_header(op, false);
        d.set(read_ext::LKEY, self.lkey.get().into());
        d.set(read_ext::LADDR, self.laddr.get());
        d.set(read_ext::TOTAL_LEN, self.total_len.into());
        d
    }

    #[inline(always)]
    fn decode(d: &RawDesc) -> Self {
        ReadReqExt {
            lkey: MrKey::from_raw(d.get(read_ext::LKEY) as u32),
            laddr: VirtAddr(d.get(read_ext::LADDR)),
            total_len: d.get(read_ext::TOTAL_LEN) as u32,
        }
    }
}

impl AckReport {
    #[inline(always)]
    fn encode(&self, has_next: bool) -> RawDesc {
        let mut d = RawDesc::with_header(ACK_OP, has_next);
        d.set_u128(0, self.now_bitmap);
        d.set(ack::MSN, self.msn.into());
        d.set(ack::QPN, self.qpn.get().into());
        d.set(ack::PSN_NOW, self.psn_now.into());
        d.set(ack::PSN_BEFORE_SLIDE, self.psn_before_slide.into());
        d.set_bit(ack::IS_PACKET_LOST, self.is_packet_lost);
        d.set_bit(ack::IS_WINDOW_SLIDED, self.is_window_slided);
        d.set_bit(ack::IS_SEND_BY_DRIVER, self.is_send_by_driver);
        d.set_bit(ack::IS_SEND_BY_LOCAL_HW, self.is_send_by_local_hw);
        d
    }

    #[inline(always)]
    fn decode(d: &RawDesc) -> Self {
        AckReport {
            now_bitmap: d.get_u128(0),
            msn: d.get(ack::MSN) as u16,
            qpn: Qpn::from_raw(d.get(ack::QPN) as u32),
            psn_now: d.get(ack::PSN_NOW) as u32,
            psn_before_slide: d.get(ack::PSN_BEFORE_SLIDE) as u32,
            is_packet_lost: d.bit(ack::IS_PACKET_LOST),
            is_window_slided: d.bit(ack::IS_WINDOW_SLIDED),
            is_send_by_driver: d.bit(ack::IS_SEND_BY_DRIVER),
            is_send_by_local_hw: d.bit(ack::IS_SEND_BY_LOCAL_HW),
        }
    }
}

impl AckExtra {
    #[inline(always)]
    fn encode(&self) -> RawDesc {
        let mut d = RawDesc::with_header(ACK_OP, false);
        d.set_u128(0, self.pre_bitmap);
        d
    }
}

/// Checks that `second` belongs to a first descriptor with op code `first_op`.
#[inline(always)]
fn check_second(second: &RawDesc, kind: DescKind, first_op: u8) -> Result<(), DescError> {
    if second.op_code() != first_op {
        return Err(DescError::PairMismatch {
            second: kind,
            first_op,
            second_op: second.op_code(),
        });
    }
    if second.has_next() {
        return Err(DescError::UnexpectedHasNext {
            desc: kind,
            has_next: true,
        });
    }
    Ok(())
}

impl MetaReport {
    /// The descriptors the card writes for this report: valid = 1 on both, has_next = 1 on
    /// the first of a pair. The op code is `PacketInfo::opcode` for packets (so a
    /// `ReadRequest` should carry [`RdmaOpcode::ReadRequest`]) and 0x11 for ACKs.
    #[inline(always)]
    pub fn encode(&self) -> (RawDesc, Option<RawDesc>) {
        match self {
            MetaReport::Packet(p) => (p.encode(false), None),
            MetaReport::ReadRequest(p, ext) => (p.encode(true), Some(ext.encode(p.opcode.raw()))),
            MetaReport::Ack(a) => (a.encode(false), None),
            MetaReport::Nak(a, extra) => (a.encode(true), Some(extra.encode())),
        }
    }

    /// Decodes one report: `second` is the descriptor after `first` when `first` has
    /// has_next = 1, else `None`.
    ///
    /// Errors: an op code the card does not report ([`DescError::UnknownOpCode`]), a second
    /// descriptor missing or unexpected, one with another op code or with has_next = 1, a
    /// PacketBasicInfo other than a READ request with has_next = 1, a READ request alone.
    #[inline(always)]
    pub fn decode(first: &RawDesc, second: Option<&RawDesc>) -> Result<MetaReport, DescError> {
        let op = first.op_code();
        let kind = match op {
            ACK_OP => DescKind::Ack,
            0x00..=0x10 => DescKind::PacketInfo,
            _ => {
                return Err(DescError::UnknownOpCode {
                    desc: DescKind::MetaReport,
                    raw: op,
                })
            }
        };
        let second = match (first.has_next(), second) {
            (true, None) => return Err(DescError::MissingSecond { first: kind }),
            (false, Some(_)) => return Err(DescError::UnexpectedSecond { first: kind }),
            (_, second) => second,
        };
        match (op, second) {
            (ACK_OP, None) => Ok(MetaReport::Ack(AckReport::decode(first))),
            (ACK_OP, Some(s)) => {
                check_second(s, DescKind::AckExtra, op)?;
                let extra = AckExtra {
                    pre_bitmap: s.get_u128(0),
                };
                Ok(MetaReport::Nak(AckReport::decode(first), extra))
            }
            (READ_REQUEST_OP, Some(s)) => {
                check_second(s, DescKind::ReadReqExt, op)?;
                Ok(MetaReport::ReadRequest(
                    PacketInfo::decode(first),
                    ReadReqExt::decode(s),
                ))
            }
            (READ_REQUEST_OP, None) => Err(DescError::MissingSecond { first: kind }),
            (_, Some(_)) => Err(DescError::UnexpectedHasNext {
                desc: kind,
                has_next: true,
            }),
            (_, None) => Ok(MetaReport::Packet(PacketInfo::decode(first))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_classes_follow_the_bth_table() {
        for raw in 0..=255u8 {
            assert_eq!(RdmaOpcode::from_raw(raw).raw(), raw);
        }
        use RdmaOpcode::*;
        assert!(SendLastImm.is_last() && SendLastImm.has_imm() && SendLastImm.is_send());
        assert!(WriteOnlyImm.is_only() && WriteOnlyImm.ends_message());
        assert!(ReadRespMiddle.is_middle() && ReadRespMiddle.has_payload());
        assert!(!ReadRequest.has_payload() && !Acknowledge.has_payload());
        assert!(SendOnlyInv.has_invalidate() && !SendOnlyInv.has_imm());
        assert!(AtomicAck.is_ack());
        assert_eq!(RdmaOpcode::from_raw(0x64).transport(), 3);
        assert!(!RdmaOpcode::from_raw(0x64).has_payload());
    }

    #[test]
    fn unreported_opcodes_are_errors_not_panics() {
        for raw in [0x12u8, 0x16, 0x17, 0x64, 0xFF] {
            assert_eq!(
                MetaReport::decode(&RawDesc::with_header(raw, false), None),
                Err(DescError::UnknownOpCode {
                    desc: DescKind::MetaReport,
                    raw
                })
            );
        }
    }

    #[test]
    fn pair_rules() {
        let lone_ack = RawDesc::with_header(0x11, false);
        let first_ack = RawDesc::with_header(0x11, true);
        let read = RawDesc::with_header(0x0C, true);
        let write = RawDesc::with_header(0x0A, true);
        assert!(matches!(
            MetaReport::decode(&lone_ack, None),
            Ok(MetaReport::Ack(_))
        ));
        assert!(matches!(
            MetaReport::decode(&first_ack, Some(&lone_ack)),
            Ok(MetaReport::Nak(..))
        ));
        assert_eq!(
            MetaReport::decode(&first_ack, None),
            Err(DescError::MissingSecond {
                first: DescKind::Ack
            })
        );
        assert_eq!(
            MetaReport::decode(&lone_ack, Some(&lone_ack)),
            Err(DescError::UnexpectedSecond {
                first: DescKind::Ack
            })
        );
        assert_eq!(
            MetaReport::decode(&first_ack, Some(&first_ack)),
            Err(DescError::UnexpectedHasNext {
                desc: DescKind::AckExtra,
                has_next: true
            })
        );
        assert_eq!(
            MetaReport::decode(&read, Some(&lone_ack)),
            Err(DescError::PairMismatch {
                second: DescKind::ReadReqExt,
                first_op: 0x0C,
                second_op: 0x11
            })
        );
        assert_eq!(
            MetaReport::decode(&RawDesc::with_header(0x0C, false), None),
            Err(DescError::MissingSecond {
                first: DescKind::PacketInfo
            })
        );
        assert_eq!(
            MetaReport::decode(&write, Some(&RawDesc::with_header(0x0A, false))),
            Err(DescError::UnexpectedHasNext {
                desc: DescKind::PacketInfo,
                has_next: true
            })
        );
    }
}
