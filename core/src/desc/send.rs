//! Send ring descriptors: one work-request chunk is Seg0 (has_next = 1) followed by Seg1
//! (has_next = 0) (layout-verification.md 1.3; hardware-contract.md correction 6;
//! background reference-driver.md 2.6).
//!
//! The RTL takes the op code from Seg0 only, low 4 bits; Seg1 carries the same byte and the
//! RTL ignores it, as it ignores FENCE/INLINE/IP_CSUM, enable_ecn and the valid bit. Reserved
//! bits are written as zero and ignored on decode.

use core::net::Ipv4Addr;

use super::{BitField, DescError, DescKind, MacAddr, QpType, RawDesc};
use crate::addr::VirtAddr;
use crate::keys::{MrKey, Qpn};
use crate::mtu::Pmtu;

/// Work request op codes as the send ring carries them (0..=11, 14, 15 equal `ibv_wr_opcode`;
/// 12 and 13 are driver-specific).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkReqOpcode {
    /// 0: RDMA WRITE.
    Write,
    /// 1: RDMA WRITE with immediate.
    WriteWithImm,
    /// 2: SEND.
    Send,
    /// 3: SEND with immediate.
    SendWithImm,
    /// 4: RDMA READ.
    Read,
    /// 5: atomic compare-and-swap (unusable: the descriptors carry no operands).
    AtomicCmpSwp,
    /// 6: atomic fetch-and-add (unusable: the descriptors carry no operands).
    AtomicFetchAdd,
    /// 7: local invalidate.
    LocalInv,
    /// 8: bind memory window.
    BindMw,
    /// 9: SEND with invalidate.
    SendWithInv,
    /// 10: TCP segmentation offload.
    Tso,
    /// 11: driver-defined.
    Driver1,
    /// 12: the responder's answer to an RDMA READ request (posted by the driver).
    ReadResp,
    /// 13: an ACKNOWLEDGE packet built by the card.
    RdmaAck,
    /// 14: flush.
    Flush,
    /// 15: atomic write.
    AtomicWrite,
    /// Any byte above 15, kept as read.
    Unknown(u8),
}

impl WorkReqOpcode {
    /// The exact meaning of the byte: 0..=15 are named, everything else is `Unknown`.
    #[inline]
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            0 => WorkReqOpcode::Write,
            1 => WorkReqOpcode::WriteWithImm,
            2 => WorkReqOpcode::Send,
            3 => WorkReqOpcode::SendWithImm,
            4 => WorkReqOpcode::Read,
            5 => WorkReqOpcode::AtomicCmpSwp,
            6 => WorkReqOpcode::AtomicFetchAdd,
            7 => WorkReqOpcode::LocalInv,
            8 => WorkReqOpcode::BindMw,
            9 => WorkReqOpcode::SendWithInv,
            10 => WorkReqOpcode::Tso,
            11 => WorkReqOpcode::Driver1,
            12 => WorkReqOpcode::ReadResp,
            13 => WorkReqOpcode::RdmaAck,
            14 => WorkReqOpcode::Flush,
            15 => WorkReqOpcode::AtomicWrite,
            other => WorkReqOpcode::Unknown(other),
        }
    }
    /// What the RTL executes for this byte: only the low 4 bits count.
    #[inline]
    pub const fn decode_rtl(raw: u8) -> Self {
        Self::from_raw(raw & 0xF)
    }
    /// The byte written to the descriptor.
    #[inline]
    pub const fn raw(self) -> u8 {
        match self {
            WorkReqOpcode::Write => 0,
            WorkReqOpcode::WriteWithImm => 1,
            WorkReqOpcode::Send => 2,
            WorkReqOpcode::SendWithImm => 3,
            WorkReqOpcode::Read => 4,
            WorkReqOpcode::AtomicCmpSwp => 5,
            WorkReqOpcode::AtomicFetchAdd => 6,
            WorkReqOpcode::LocalInv => 7,
            WorkReqOpcode::BindMw => 8,
            WorkReqOpcode::SendWithInv => 9,
            WorkReqOpcode::Tso => 10,
            WorkReqOpcode::Driver1 => 11,
            WorkReqOpcode::ReadResp => 12,
            WorkReqOpcode::RdmaAck => 13,
            WorkReqOpcode::Flush => 14,
            WorkReqOpcode::AtomicWrite => 15,
            WorkReqOpcode::Unknown(raw) => raw,
        }
    }
}

bitflags::bitflags! {
    /// The low 5 bits of `ibv_send_flags` (Seg0 bits 3..7). The RTL uses SIGNALED (BTH
    /// AckReq) and SOLICITED (BTH SE) only.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u8 {
        /// IBV_SEND_FENCE (ignored by the RTL).
        const FENCE = 1;
        /// IBV_SEND_SIGNALED: sets AckReq in every packet of the chunk.
        const SIGNALED = 2;
        /// IBV_SEND_SOLICITED: sets the BTH SE bit.
        const SOLICITED = 4;
        /// IBV_SEND_INLINE (ignored by the RTL).
        const INLINE = 8;
        /// IBV_SEND_IP_CSUM (ignored by the RTL).
        const IP_CSUM = 16;
    }
}

/// Seg0 bit fields.
mod seg0 {
    use super::BitField;
    pub const FLAGS: BitField = BitField::new(3, 5);
    pub const DQPN: BitField = BitField::new(8, 24);
    pub const QP_TYPE: BitField = BitField::new(36, 4);
    pub const PSN: BitField = BitField::new(40, 24);
    pub const RADDR: BitField = BitField::new(64, 64);
    pub const DQP_IP: BitField = BitField::new(128, 32);
    pub const RKEY: BitField = BitField::new(160, 32);
    pub const TOTAL_LEN: BitField = BitField::new(192, 32);
    pub const MSN: BitField = BitField::new(224, 16);
}

/// Seg1 bit fields.
mod seg1 {
    use super::BitField;
    pub const LADDR: BitField = BitField::new(0, 64);
    pub const LEN: BitField = BitField::new(64, 32);
    pub const LKEY: BitField = BitField::new(96, 32);
    pub const SQPN_HIGH_16BITS: BitField = BitField::new(128, 16);
    pub const MAC_ADDR: BitField = BitField::new(144, 48);
    pub const IMM: BitField = BitField::new(192, 32);
    pub const SQPN_LOW_8BITS: BitField = BitField::new(224, 8);
    pub const ENABLE_ECN: u32 = 233;
    pub const IS_RETRY: u32 = 234;
    pub const IS_LAST: u32 = 235;
    pub const IS_FIRST: u32 = 236;
    pub const PMTU: BitField = BitField::new(237, 3);
}

/// The first descriptor of a send request: where the chunk goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendSeg0 {
    /// The work request op code (the RTL reads the low 4 bits of this descriptor's op_code).
    pub op: WorkReqOpcode,
    /// Send flags.
    pub flags: SendFlags,
    /// Destination QP (BTH dqpn).
    pub dqpn: Qpn,
    /// QP type; selects the transport (RC).
    pub qp_type: QpType,
    /// PSN of the chunk's first packet (24 bits; later packets +1 each).
    pub psn: u32,
    /// Remote VA of the chunk, in the peer's address space; the card splits packets at
    /// PMTU-aligned remote addresses.
    pub raddr: VirtAddr,
    /// Destination IPv4 address.
    pub dqp_ip: Ipv4Addr,
    /// Remote key.
    pub rkey: MrKey,
    /// Length of the whole work request (RETH dlen of the first packet).
    pub total_len: u32,
    /// Message sequence number (sent in the BTH P_Key position).
    pub msn: u16,
}

/// The second descriptor of a send request: where the payload comes from, and the chunk's
/// position in the work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendSeg1 {
    /// Local VA of the chunk's payload.
    pub laddr: VirtAddr,
    /// Chunk length in bytes (0 = no payload).
    pub len: u32,
    /// Local key (the card looks the MR up by index only).
    pub lkey: MrKey,
    /// Source QP; the card uses its low 16 bits as the UDP source port.
    pub sqpn: Qpn,
    /// Destination MAC.
    pub mac: MacAddr,
    /// Immediate data (`*_WITH_IMM`) or the rkey to invalidate (SEND_WITH_INV).
    pub imm: u32,
    /// Ignored by the RTL (correction 6).
    pub enable_ecn: bool,
    /// A retransmission: copied into the BTH M bit.
    pub is_retry: bool,
    /// The chunk is the last of its work request.
    pub is_last: bool,
    /// The chunk is the first of its work request.
    pub is_first: bool,
    /// Path MTU.
    pub pmtu: Pmtu,
}

impl SendSeg0 {
    /// Seg0 with has_next = 1, valid = 1. Values wider than their field are truncated.
    #[inline(always)]
    pub fn encode(&self) -> RawDesc {
        let mut d = RawDesc::with_header(self.op.raw(), true);
        d.set(seg0::FLAGS, self.flags.bits().into());
        d.set(seg0::DQPN, self.dqpn.get().into());
        d.set(seg0::QP_TYPE, self.qp_type.to_ibv().into());
        d.set(seg0::PSN, self.psn.into());
        d.set(seg0::RADDR, self.raddr.get());
        d.set(seg0::DQP_IP, u32::from(self.dqp_ip).into());
        d.set(seg0::RKEY, self.rkey.get().into());
        d.set(seg0::TOTAL_LEN, self.total_len.into());
        d.set(seg0::MSN, self.msn.into());
        d
    }

    /// Decodes Seg0 as the RTL reads it (op code from the low 4 bits). Error: has_next = 0.
    #[inline(always)]
    pub fn decode(d: &RawDesc) -> Result<Self, DescError> {
        if !d.has_next() {
            return Err(DescError::UnexpectedHasNext {
                desc: DescKind::SendSeg0,
                has_next: false,
            });
        }
        Ok(SendSeg0 {
            op: WorkReqOpcode::decode_rtl(d.op_code()),
            flags: SendFlags::from_bits_retain(d.get(seg0::FLAGS) as u8),
            dqpn: Qpn::from_raw(d.get(seg0::DQPN) as u32),
            qp_type: QpType::from_ibv(d.get(seg0::QP_TYPE) as u32),
            psn: d.get(seg0::PSN) as u32,
            raddr: VirtAddr(d.get(seg0::RADDR)),
            dqp_ip: Ipv4Addr::from(d.get(seg0::DQP_IP) as u32),
            rkey: MrKey::from_raw(d.get(seg0::RKEY) as u32),
            total_len: d.get(seg0::TOTAL_LEN) as u32,
            msn: d.get(seg0::MSN) as u16,
        })
    }
}

impl SendSeg1 {
    /// Seg1 with has_next = 0, valid = 1 and `op` in its op_code (the RTL ignores it; it is
    /// written for symmetry with Seg0). Values wider than their field are truncated.
    #[inline(always)]
    pub fn encode(&self, op: WorkReqOpcode) -> RawDesc {
        let mut d = RawDesc::with_header(op.raw(), false);
        let sqpn = self.sqpn.get();
        d.set(seg1::LADDR, self.laddr.get());
        d.set(seg1::LEN, self.len.into());
        d.set(seg1::LKEY, self.lkey.get().into());
        d.set(seg1::SQPN_HIGH_16BITS, (sqpn >> 8).into());
        d.set(seg1::MAC_ADDR, self.mac.to_bits());
        d.set(seg1::IMM, self.imm.into());
        d.set(seg1::SQPN_LOW_8BITS, (sqpn & 0xFF).into());
        d.set_bit(seg1::ENABLE_ECN, self.enable_ecn);
        d.set_bit(seg1::IS_RETRY, self.is_retry);
        d.set_bit(seg1::IS_LAST, self.is_last);
        d.set_bit(seg1::IS_FIRST, self.is_first);
        d.set(seg1::PMTU, self.pmtu.to_ibv().into());
        d
    }

    /// Decodes Seg1 (its op_code is ignored, as by the RTL). Errors: has_next = 1, invalid
    /// pmtu.
    #[inline(always)]
    pub fn decode(d: &RawDesc) -> Result<Self, DescError> {
        if d.has_next() {
            return Err(DescError::UnexpectedHasNext {
                desc: DescKind::SendSeg1,
                has_next: true,
            });
        }
        let raw_pmtu = d.get(seg1::PMTU);
        let Some(pmtu) = Pmtu::from_ibv(raw_pmtu as u8) else {
            return Err(DescError::InvalidField {
                desc: DescKind::SendSeg1,
                field: "pmtu",
                raw: raw_pmtu,
            });
        };
        let sqpn = (d.get(seg1::SQPN_HIGH_16BITS) << 8) | d.get(seg1::SQPN_LOW_8BITS);
        Ok(SendSeg1 {
            laddr: VirtAddr(d.get(seg1::LADDR)),
            len: d.get(seg1::LEN) as u32,
            lkey: MrKey::from_raw(d.get(seg1::LKEY) as u32),
            sqpn: Qpn::from_raw(sqpn as u32),
            mac: MacAddr::from_bits(d.get(seg1::MAC_ADDR)),
            imm: d.get(seg1::IMM) as u32,
            enable_ecn: d.bit(seg1::ENABLE_ECN),
            is_retry: d.bit(seg1::IS_RETRY),
            is_last: d.bit(seg1::IS_LAST),
            is_first: d.bit(seg1::IS_FIRST),
            pmtu,
        })
    }
}

/// One chunk of a work request: the two descriptors the card reads as one WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRequest {
    /// First descriptor.
    pub seg0: SendSeg0,
    /// Second descriptor.
    pub seg1: SendSeg1,
}

impl SendRequest {
    /// The two descriptors, Seg0 then Seg1; both carry `seg0.op`.
    #[inline(always)]
    pub fn encode(&self) -> [RawDesc; 2] {
        [self.seg0.encode(), self.seg1.encode(self.seg0.op)]
    }

    /// Writes the two descriptors in place (each slot is written whole, once), for a ring
    /// whose Seg0 and Seg1 slots need not be adjacent (a pair may straddle the ring end).
    #[inline(always)]
    pub fn encode_into(&self, seg0: &mut RawDesc, seg1: &mut RawDesc) {
        *seg0 = self.seg0.encode();
        *seg1 = self.seg1.encode(self.seg0.op);
    }

    /// Decodes a pair as the RTL pairs it, rejecting what the RTL would silently mis-pair
    /// (correction 6): `seg0` must have has_next = 1 and `seg1` has_next = 0.
    #[inline(always)]
    pub fn decode(seg0: &RawDesc, seg1: &RawDesc) -> Result<Self, DescError> {
        Ok(SendRequest {
            seg0: SendSeg0::decode(seg0)?,
            seg1: SendSeg1::decode(seg1)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_code_comes_from_seg0_low_four_bits() {
        for raw in 0..=255u8 {
            assert_eq!(WorkReqOpcode::from_raw(raw).raw(), raw);
        }
        assert_eq!(WorkReqOpcode::decode_rtl(0x1C), WorkReqOpcode::ReadResp);
        assert_eq!(WorkReqOpcode::from_raw(0x1C), WorkReqOpcode::Unknown(0x1C));
        let mut d = RawDesc::with_header(0xF4, true);
        d.set_bits(237, 3, 5);
        assert_eq!(SendSeg0::decode(&d).unwrap().op, WorkReqOpcode::Read);
    }

    #[test]
    fn pair_order_is_enforced() {
        let seg0 = RawDesc::with_header(0, true);
        let mut seg1 = RawDesc::with_header(0, false);
        seg1.set_bits(237, 3, 5);
        assert!(SendRequest::decode(&seg0, &seg1).is_ok());
        assert_eq!(
            SendRequest::decode(&seg1, &seg1),
            Err(DescError::UnexpectedHasNext {
                desc: DescKind::SendSeg0,
                has_next: false
            })
        );
        assert_eq!(
            SendRequest::decode(&seg0, &seg0),
            Err(DescError::UnexpectedHasNext {
                desc: DescKind::SendSeg1,
                has_next: true
            })
        );
    }

    #[test]
    fn seg1_with_invalid_pmtu_names_the_field() {
        let seg1 = RawDesc::with_header(0, false);
        assert_eq!(
            SendSeg1::decode(&seg1),
            Err(DescError::InvalidField {
                desc: DescKind::SendSeg1,
                field: "pmtu",
                raw: 0
            })
        );
    }
}
