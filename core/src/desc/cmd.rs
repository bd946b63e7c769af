//! Command ring descriptors: requests and responses (layout-verification.md 1.2,
//! hardware-contract.md corrections 4, 5, 7 and 10; background reference-driver.md 2.5).
//!
//! Every command has the command header at bits 224..239 (user_data, is_success) under the
//! common header. The RTL decodes only the low 3 bits of the op code, so 8..=12 execute as
//! 0..=4 ([`CmdOpcode::decode_rtl`]); [`CmdRequest::decode`] follows the RTL (it is what the
//! emulated NIC executes) and the raw byte stays available from [`RawDesc::op_code`].
//! Reserved bits are written as zero and ignored on decode, as the RTL does.

use core::net::Ipv4Addr;

use super::{AccessFlags, BitField, DescError, DescKind, MacAddr, QpType, RawDesc};
use crate::addr::{DeviceAddr, VirtAddr};
use crate::keys::{MrKey, Qpn, PGT_LEN};
use crate::mtu::Pmtu;

/// user_data of the command header (bits 224..231): echoed unchanged in the response.
pub const USER_DATA: BitField = BitField::new(224, 8);
/// is_success of the command header (bit 232): set by the card in the response.
pub const IS_SUCCESS: u32 = 232;

/// Command op codes (RTL `CommandQueueOpcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmdOpcode {
    /// 0: write an MR table entry (length 0 invalidates it).
    UpdateMrTable,
    /// 1: copy page-table entries from a staging buffer.
    UpdatePgt,
    /// 2: write (or, with is_valid = 0, invalidate) a QP context.
    ManageQp,
    /// 3: the card's own MAC, IPv4 address, netmask and gateway.
    SetNetworkParam,
    /// 4: the simple-NIC RX buffer address.
    SetRawPacketReceiveMeta,
    /// 5: declared by the RTL but not implemented: the card never answers it (correction 4).
    UpdateErrorPsnRecoverPoint,
    /// Any other byte, kept as read.
    Unknown(u8),
}

impl CmdOpcode {
    /// The exact meaning of the byte: 0..=5 are named, everything else is `Unknown`.
    #[inline]
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            0 => CmdOpcode::UpdateMrTable,
            1 => CmdOpcode::UpdatePgt,
            2 => CmdOpcode::ManageQp,
            3 => CmdOpcode::SetNetworkParam,
            4 => CmdOpcode::SetRawPacketReceiveMeta,
            5 => CmdOpcode::UpdateErrorPsnRecoverPoint,
            other => CmdOpcode::Unknown(other),
        }
    }
    /// What the RTL executes for this byte: only the low 3 bits count, so 8..=13 alias 0..=5
    /// and only 6 and 7 (mod 8) come out `Unknown`.
    #[inline]
    pub const fn decode_rtl(raw: u8) -> Self {
        Self::from_raw(raw & 0x7)
    }
    /// The byte written to the descriptor.
    #[inline]
    pub const fn raw(self) -> u8 {
        match self {
            CmdOpcode::UpdateMrTable => 0,
            CmdOpcode::UpdatePgt => 1,
            CmdOpcode::ManageQp => 2,
            CmdOpcode::SetNetworkParam => 3,
            CmdOpcode::SetRawPacketReceiveMeta => 4,
            CmdOpcode::UpdateErrorPsnRecoverPoint => 5,
            CmdOpcode::Unknown(raw) => raw,
        }
    }
}

/// UpdateMrTable (op 0) bit fields.
mod mr {
    use super::BitField;
    pub const PGT_OFFSET: BitField = BitField::new(7, 17);
    pub const ACC_FLAGS: BitField = BitField::new(24, 8);
    pub const PD: BitField = BitField::new(32, 32);
    pub const MR_KEY: BitField = BitField::new(64, 32);
    pub const MR_LENGTH: BitField = BitField::new(96, 32);
    pub const MR_BASE_VA: BitField = BitField::new(128, 64);
}

/// UpdatePGT (op 1) bit fields.
mod pgt {
    use super::BitField;
    pub const ZERO_BASED_ENTRY_COUNT: BitField = BitField::new(64, 32);
    pub const START_INDEX: BitField = BitField::new(96, 32);
    pub const DMA_ADDR: BitField = BitField::new(128, 64);
}

/// QpManagement (op 2) bit fields.
mod qp {
    use super::BitField;
    pub const PEER_MAC_ADDR: BitField = BitField::new(0, 48);
    pub const LOCAL_UDP_PORT: BitField = BitField::new(48, 16);
    pub const PMTU: BitField = BitField::new(85, 3);
    pub const QP_TYPE: BitField = BitField::new(92, 4);
    pub const RQ_ACCESS_FLAGS: BitField = BitField::new(96, 8);
    pub const PEER_QPN: BitField = BitField::new(104, 24);
    /// Reserved in the RTL; this project's extension for the emulated NIC's strict mode.
    pub const PD: BitField = BitField::new(128, 32);
    pub const QPN: BitField = BitField::new(160, 24);
    pub const IS_ERROR: u32 = 190;
    pub const IS_VALID: u32 = 191;
    pub const IP_ADDR: BitField = BitField::new(192, 32);
}

/// SetNetworkParam (op 3) bit fields.
mod net {
    use super::BitField;
    pub const MAC_ADDR: BitField = BitField::new(16, 48);
    pub const IP_ADDR: BitField = BitField::new(96, 32);
    pub const NETMASK: BitField = BitField::new(128, 32);
    pub const GATEWAY: BitField = BitField::new(160, 32);
}

/// SetRawPacketReceiveMeta (op 4): the only field.
const WRITE_BASE_ADDR: BitField = BitField::new(128, 64);

/// Largest entry count one UpdatePGT may carry: the RTL reads at most 512 bytes
/// (correction 7; the driver itself sends at most [`super::pgt::DRIVER_ENTRIES_PER_UPDATE`]).
pub const MAX_PGT_ENTRIES: u32 = 64;

/// UpdateMrTable: write MR table entry `mr_key.index()` (`mr_length == 0` invalidates it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdateMrTable {
    /// VA of the MR start (need not be page aligned).
    pub mr_base_va: VirtAddr,
    /// Length in bytes; 0 deregisters the entry (correction 4).
    pub mr_length: u32,
    /// lkey = rkey; the card indexes by `key[20:8]` and checks `key[7:0]`.
    pub mr_key: MrKey,
    /// Protection domain handle, bits 32..63: reserved and **ignored by the RTL**, which does
    /// not enforce protection domains (correction 10). Written for the emulated NIC's strict
    /// mode.
    pub pd: u32,
    /// Access rights of the MR.
    pub acc_flags: AccessFlags,
    /// First PGT index of the MR (17 bits).
    pub pgt_offset: u32,
}

/// UpdatePGT: copy `entry_count` u64 page addresses from `dma_addr` to PGT entries
/// `start_index..`. The staging rules are in [`super::pgt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdatePgt {
    /// Device address of the staged entries (512-byte aligned, must not cross 4 KiB).
    pub dma_addr: DeviceAddr,
    /// First PGT index written (the RTL keeps 17 bits).
    pub start_index: u32,
    /// Number of entries, 1..=[`MAX_PGT_ENTRIES`]; encoded as `entry_count - 1`.
    pub entry_count: u32,
}

/// QpManagement: write (`is_valid`) or invalidate a QP context. Every ManageQp also resets
/// the QP's ACK tracking in the card (correction 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManageQp {
    /// 1 = write the context, 0 = invalidate it.
    pub is_valid: bool,
    /// Ignored by the RTL (correction 6).
    pub is_error: bool,
    /// The QP's protection domain, in bits 128..159 (reserved and ignored by the RTL, which
    /// does not enforce protection domains: correction 10). This project's extension, as the
    /// drivers put the PD in UpdateMrTable's reserved bits: the emulated NIC's strict mode
    /// checks that a packet's QP and MR share a PD.
    pub pd: u32,
    /// The local QP.
    pub qpn: Qpn,
    /// The remote QP.
    pub peer_qpn: Qpn,
    /// Access rights checked on receive.
    pub rq_access_flags: AccessFlags,
    /// The QP type (RC is the only one the card implements).
    pub qp_type: QpType,
    /// Path MTU.
    pub pmtu: Pmtu,
    /// UDP source port of the card's own ACK/NAK packets.
    pub local_udp_port: u16,
    /// Destination MAC of the card's own ACK/NAK packets.
    pub peer_mac: MacAddr,
    /// The peer's IPv4 address.
    pub peer_ip: Ipv4Addr,
}

/// SetNetworkParam: the card's own addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetNetworkParam {
    /// Local MAC.
    pub mac: MacAddr,
    /// Local IPv4 address.
    pub ip: Ipv4Addr,
    /// Netmask.
    pub netmask: Ipv4Addr,
    /// Gateway (0.0.0.0 if none).
    pub gateway: Ipv4Addr,
}

/// SetRawPacketReceiveMeta: the simple-NIC RX frame buffer (2 MiB, correction 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetRawPacketReceiveMeta {
    /// Device address of the RX buffer.
    pub write_base_addr: DeviceAddr,
}

/// A command request the card implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmdRequest {
    /// Op 0.
    UpdateMrTable(UpdateMrTable),
    /// Op 1.
    UpdatePgt(UpdatePgt),
    /// Op 2.
    ManageQp(ManageQp),
    /// Op 3.
    SetNetworkParam(SetNetworkParam),
    /// Op 4.
    SetRawPacketReceiveMeta(SetRawPacketReceiveMeta),
}

impl CmdRequest {
    /// The op code this request is encoded with.
    pub const fn opcode(&self) -> CmdOpcode {
        match self {
            CmdRequest::UpdateMrTable(_) => CmdOpcode::UpdateMrTable,
            CmdRequest::UpdatePgt(_) => CmdOpcode::UpdatePgt,
            CmdRequest::ManageQp(_) => CmdOpcode::ManageQp,
            CmdRequest::SetNetworkParam(_) => CmdOpcode::SetNetworkParam,
            CmdRequest::SetRawPacketReceiveMeta(_) => CmdOpcode::SetRawPacketReceiveMeta,
        }
    }

    /// The request descriptor: the fields, `user_data`, has_next = 0 and valid = 1 (which the
    /// RTL ignores on this ring). Values wider than their field are truncated to it;
    /// [`CmdRequest::validate`] reports them first.
    #[inline(always)]
    pub fn encode(&self, user_data: u8) -> RawDesc {
        let mut d = RawDesc::with_header(self.opcode().raw(), false);
        d.set(USER_DATA, user_data.into());
        match self {
            CmdRequest::UpdateMrTable(c) => c.encode_fields(&mut d),
            CmdRequest::UpdatePgt(c) => c.encode_fields(&mut d),
            CmdRequest::ManageQp(c) => c.encode_fields(&mut d),
            CmdRequest::SetNetworkParam(c) => c.encode_fields(&mut d),
            CmdRequest::SetRawPacketReceiveMeta(c) => c.encode_fields(&mut d),
        }
        d
    }

    /// Decodes a request as the RTL executes it (op code from the low 3 bits; reserved bits,
    /// valid and is_extended_op_code ignored) and returns it with its user_data.
    ///
    /// Errors: an op code the card does not execute (5..=7 mod 8: the card never answers
    /// these), an invalid pmtu, an UpdatePGT entry count above 64, has_next = 1.
    #[inline(always)]
    pub fn decode(d: &RawDesc) -> Result<(CmdRequest, u8), DescError> {
        let req = match CmdOpcode::decode_rtl(d.op_code()) {
            CmdOpcode::UpdateMrTable => CmdRequest::UpdateMrTable(UpdateMrTable::decode_fields(d)),
            CmdOpcode::UpdatePgt => CmdRequest::UpdatePgt(UpdatePgt::decode_fields(d)?),
            CmdOpcode::ManageQp => CmdRequest::ManageQp(ManageQp::decode_fields(d)?),
            CmdOpcode::SetNetworkParam => {
                CmdRequest::SetNetworkParam(SetNetworkParam::decode_fields(d))
            }
            CmdOpcode::SetRawPacketReceiveMeta => {
                CmdRequest::SetRawPacketReceiveMeta(SetRawPacketReceiveMeta::decode_fields(d))
            }
            CmdOpcode::UpdateErrorPsnRecoverPoint | CmdOpcode::Unknown(_) => {
                return Err(DescError::UnknownOpCode {
                    desc: DescKind::CmdRequest,
                    raw: d.op_code(),
                })
            }
        };
        if d.has_next() {
            return Err(DescError::UnexpectedHasNext {
                desc: req.kind(),
                has_next: true,
            });
        }
        Ok((req, d.get(USER_DATA) as u8))
    }

    /// The descriptor kind named in errors.
    const fn kind(&self) -> DescKind {
        match self {
            CmdRequest::UpdateMrTable(_) => DescKind::UpdateMrTable,
            CmdRequest::UpdatePgt(_) => DescKind::UpdatePgt,
            CmdRequest::ManageQp(_) => DescKind::ManageQp,
            CmdRequest::SetNetworkParam(_) => DescKind::SetNetworkParam,
            CmdRequest::SetRawPacketReceiveMeta(_) => DescKind::SetRawPacketReceiveMeta,
        }
    }

    /// Checks the values that do not fit their field or that the card rejects: pgt_offset
    /// beyond the page table, an UpdatePGT count outside 1..=64 or running past the table.
    /// The staging-buffer rules are [`super::pgt::check_staging`].
    pub fn validate(&self) -> Result<(), DescError> {
        match self {
            CmdRequest::UpdateMrTable(c) if c.pgt_offset >= PGT_LEN => {
                Err(DescError::InvalidField {
                    desc: DescKind::UpdateMrTable,
                    field: "pgt_offset",
                    raw: c.pgt_offset.into(),
                })
            }
            CmdRequest::UpdatePgt(c) => {
                if c.entry_count == 0 || c.entry_count > MAX_PGT_ENTRIES {
                    return Err(DescError::PgtEntryCount {
                        count: c.entry_count.into(),
                        max: MAX_PGT_ENTRIES.into(),
                    });
                }
                match c.start_index.checked_add(c.entry_count) {
                    Some(end) if end <= PGT_LEN => Ok(()),
                    _ => Err(DescError::PgtIndexRange {
                        start_index: c.start_index,
                        count: c.entry_count,
                    }),
                }
            }
            _ => Ok(()),
        }
    }
}

impl UpdateMrTable {
    #[inline(always)]
    fn encode_fields(&self, d: &mut RawDesc) {
        d.set(mr::PGT_OFFSET, self.pgt_offset.into());
        d.set(mr::ACC_FLAGS, self.acc_flags.bits().into());
        d.set(mr::PD, self.pd.into());
        d.set(mr::MR_KEY, self.mr_key.get().into());
        d.set(mr::MR_LENGTH, self.mr_length.into());
        d.set(mr::MR_BASE_VA, self.mr_base_va.get());
    }
    #[inline(always)]
    fn decode_fields(d: &RawDesc) -> Self {
        UpdateMrTable {
            mr_base_va: VirtAddr(d.get(mr::MR_BASE_VA)),
            mr_length: d.get(mr::MR_LENGTH) as u32,
            mr_key: MrKey::from_raw(d.get(mr::MR_KEY) as u32),
            pd: d.get(mr::PD) as u32,
            acc_flags: AccessFlags::from_bits_retain(d.get(mr::ACC_FLAGS) as u8),
            pgt_offset: d.get(mr::PGT_OFFSET) as u32,
        }
    }
}

impl UpdatePgt {
    #[inline(always)]
    fn encode_fields(&self, d: &mut RawDesc) {
        d.set(
            pgt::ZERO_BASED_ENTRY_COUNT,
            self.entry_count.wrapping_sub(1).into(),
        );
        d.set(pgt::START_INDEX, self.start_index.into());
        d.set(pgt::DMA_ADDR, self.dma_addr.get());
    }
    /// The RTL checks the whole 32-bit count against its 512-byte limit.
    #[inline(always)]
    fn decode_fields(d: &RawDesc) -> Result<Self, DescError> {
        let zero_based = d.get(pgt::ZERO_BASED_ENTRY_COUNT);
        if zero_based >= u64::from(MAX_PGT_ENTRIES) {
            return Err(DescError::InvalidField {
                desc: DescKind::UpdatePgt,
                field: "zero_based_entry_count",
                raw: zero_based,
            });
        }
        Ok(UpdatePgt {
            dma_addr: DeviceAddr(d.get(pgt::DMA_ADDR)),
            start_index: d.get(pgt::START_INDEX) as u32,
            entry_count: zero_based as u32 + 1,
        })
    }
}

impl ManageQp {
    #[inline(always)]
    fn encode_fields(&self, d: &mut RawDesc) {
        d.set(qp::PEER_MAC_ADDR, self.peer_mac.to_bits());
        d.set(qp::LOCAL_UDP_PORT, self.local_udp_port.into());
        d.set(qp::PMTU, self.pmtu.to_ibv().into());
        d.set(qp::QP_TYPE, self.qp_type.to_ibv().into());
        d.set(qp::RQ_ACCESS_FLAGS, self.rq_access_flags.bits().into());
        d.set(qp::PEER_QPN, self.peer_qpn.get().into());
        d.set(qp::PD, self.pd.into());
        d.set(qp::QPN, self.qpn.get().into());
        d.set_bit(qp::IS_ERROR, self.is_error);
        d.set_bit(qp::IS_VALID, self.is_valid);
        d.set(qp::IP_ADDR, u32::from(self.peer_ip).into());
    }
    #[inline(always)]
    fn decode_fields(d: &RawDesc) -> Result<Self, DescError> {
        let raw_pmtu = d.get(qp::PMTU);
        let Some(pmtu) = Pmtu::from_ibv(raw_pmtu as u8) else {
            return Err(DescError::InvalidField {
                desc: DescKind::ManageQp,
                field: "pmtu",
                raw: raw_pmtu,
            });
        };
        Ok(ManageQp {
            is_valid: d.bit(qp::IS_VALID),
            is_error: d.bit(qp::IS_ERROR),
            pd: d.get(qp::PD) as u32,
            qpn: Qpn::from_raw(d.get(qp::QPN) as u32),
            peer_qpn: Qpn::from_raw(d.get(qp::PEER_QPN) as u32),
            rq_access_flags: AccessFlags::from_bits_retain(d.get(qp::RQ_ACCESS_FLAGS) as u8),
            qp_type: QpType::from_ibv(d.get(qp::QP_TYPE) as u32),
            pmtu,
            local_udp_port: d.get(qp::LOCAL_UDP_PORT) as u16,
            peer_mac: MacAddr::from_bits(d.get(qp::PEER_MAC_ADDR)),
            peer_ip: Ipv4Addr::from(d.get(qp::IP_ADDR) as u32),
        })
    }
}

impl SetNetworkParam {
    #[inline(always)]
    fn encode_fields(&self, d: &mut RawDesc) {
        d.set(net::MAC_ADDR, self.mac.to_bits());
        d.set(net::IP_ADDR, u32::from(self.ip).into());
        d.set(net::NETMASK, u32::from(self.netmask).into());
        d.set(net::GATEWAY, u32::from(self.gateway).into());
    }
    #[inline(always)]
    fn decode_fields(d: &RawDesc) -> Self {
        SetNetworkParam {
            mac: MacAddr::from_bits(d.get(net::MAC_ADDR)),
            ip: Ipv4Addr::from(d.get(net::IP_ADDR) as u32),
            netmask: Ipv4Addr::from(d.get(net::NETMASK) as u32),
            gateway: Ipv4Addr::from(d.get(net::GATEWAY) as u32),
        }
    }
}

impl SetRawPacketReceiveMeta {
    #[inline(always)]
    fn encode_fields(&self, d: &mut RawDesc) {
        d.set(WRITE_BASE_ADDR, self.write_base_addr.get());
    }
    #[inline(always)]
    fn decode_fields(d: &RawDesc) -> Self {
        SetRawPacketReceiveMeta {
            write_base_addr: DeviceAddr(d.get(WRITE_BASE_ADDR)),
        }
    }
}

impl From<UpdateMrTable> for CmdRequest {
    fn from(c: UpdateMrTable) -> Self {
        CmdRequest::UpdateMrTable(c)
    }
}
impl From<UpdatePgt> for CmdRequest {
    fn from(c: UpdatePgt) -> Self {
        CmdRequest::UpdatePgt(c)
    }
}
impl From<ManageQp> for CmdRequest {
    fn from(c: ManageQp) -> Self {
        CmdRequest::ManageQp(c)
    }
}
impl From<SetNetworkParam> for CmdRequest {
    fn from(c: SetNetworkParam) -> Self {
        CmdRequest::SetNetworkParam(c)
    }
}
impl From<SetRawPacketReceiveMeta> for CmdRequest {
    fn from(c: SetRawPacketReceiveMeta) -> Self {
        CmdRequest::SetRawPacketReceiveMeta(c)
    }
}

/// Bytes of the request body a response carries (bytes 0..28).
pub const ECHO_LEN: usize = 28;

/// A command response (RTL `CmdQueueRespDescOnlyCommonHeader`).
///
/// The driver needs only the header: `user_data` to match the request and `is_success`
/// (constant 1 in the current RTL). The body's content is not settled: layout-verification.md
/// 1.2 (and golden vector 6) says the RTL echoes the whole request, nic-behaviour.md 5.1 says
/// only ManageQp is echoed and the others carry zeros. The driver must not depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdResponse {
    /// The request's op code byte, unchanged (so 8 stays `Unknown(8)`, see
    /// [`CmdOpcode::decode_rtl`] for what it executed as).
    pub op: CmdOpcode,
    /// The request's user_data.
    pub user_data: u8,
    /// Whether the card executed the command.
    pub is_success: bool,
    /// Bytes 0..28.
    pub echo: [u8; ECHO_LEN],
}

impl CmdResponse {
    /// The response the card writes for `request` with a full echo of the body
    /// (layout-verification.md 1.2, golden vector 6): is_success = 1.
    pub fn echo(request: &RawDesc) -> Self {
        let mut echo = [0u8; ECHO_LEN];
        echo.copy_from_slice(&request.0[..ECHO_LEN]);
        CmdResponse {
            op: CmdOpcode::from_raw(request.op_code()),
            user_data: request.get(USER_DATA) as u8,
            is_success: true,
            echo,
        }
    }
    /// The response with the header only and a zero body (nic-behaviour.md 5.1 for every
    /// command but ManageQp): is_success = 1.
    pub fn header_only(request: &RawDesc) -> Self {
        CmdResponse {
            echo: [0; ECHO_LEN],
            ..Self::echo(request)
        }
    }

    /// The response descriptor: body, user_data, is_success, op code, has_next = 0, valid = 1.
    #[inline(always)]
    pub fn encode(&self) -> RawDesc {
        let mut d = RawDesc::with_header(self.op.raw(), false);
        d.0[..ECHO_LEN].copy_from_slice(&self.echo);
        d.set(USER_DATA, self.user_data.into());
        d.set_bit(IS_SUCCESS, self.is_success);
        d
    }

    /// Decodes a response. The valid bit is the ring's business and is not checked; a
    /// response with has_next = 1 is an error (the card never writes one).
    #[inline(always)]
    pub fn decode(d: &RawDesc) -> Result<Self, DescError> {
        if d.has_next() {
            return Err(DescError::UnexpectedHasNext {
                desc: DescKind::CmdResponse,
                has_next: true,
            });
        }
        let mut echo = [0u8; ECHO_LEN];
        echo.copy_from_slice(&d.0[..ECHO_LEN]);
        Ok(CmdResponse {
            op: CmdOpcode::from_raw(d.op_code()),
            user_data: d.get(USER_DATA) as u8,
            is_success: d.bit(IS_SUCCESS),
            echo,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtl_decode_aliases_eight_to_twelve() {
        assert_eq!(CmdOpcode::decode_rtl(8), CmdOpcode::UpdateMrTable);
        assert_eq!(
            CmdOpcode::decode_rtl(12),
            CmdOpcode::SetRawPacketReceiveMeta
        );
        assert_eq!(
            CmdOpcode::decode_rtl(13),
            CmdOpcode::UpdateErrorPsnRecoverPoint
        );
        assert_eq!(CmdOpcode::decode_rtl(14), CmdOpcode::Unknown(6));
        assert_eq!(CmdOpcode::from_raw(8), CmdOpcode::Unknown(8));
        for raw in 0..=255u8 {
            assert_eq!(CmdOpcode::from_raw(raw).raw(), raw);
        }
    }

    #[test]
    fn aliased_op_code_executes_and_response_keeps_the_byte() {
        let req = CmdRequest::SetRawPacketReceiveMeta(SetRawPacketReceiveMeta {
            write_base_addr: DeviceAddr(0x8020_0000),
        });
        let mut d = req.encode(9);
        d.set_op_code(12);
        assert_eq!(CmdRequest::decode(&d), Ok((req, 9)));
        let resp = CmdResponse::echo(&d);
        assert_eq!(resp.op, CmdOpcode::Unknown(12));
        assert_eq!(resp.encode().op_code(), 12);
    }

    #[test]
    fn unimplemented_op_codes_are_errors_with_the_raw_byte() {
        let mut d = RawDesc::with_header(5, false);
        assert_eq!(
            CmdRequest::decode(&d),
            Err(DescError::UnknownOpCode {
                desc: DescKind::CmdRequest,
                raw: 5
            })
        );
        d.set_op_code(0x0F);
        assert_eq!(
            CmdRequest::decode(&d),
            Err(DescError::UnknownOpCode {
                desc: DescKind::CmdRequest,
                raw: 0x0F
            })
        );
    }

    #[test]
    fn validate_rejects_counts_and_offsets_the_card_cannot_take() {
        let pgt = |start_index, entry_count| {
            CmdRequest::UpdatePgt(UpdatePgt {
                dma_addr: DeviceAddr(0x1000),
                start_index,
                entry_count,
            })
        };
        assert_eq!(pgt(0, 1).validate(), Ok(()));
        assert_eq!(pgt(PGT_LEN - 64, 64).validate(), Ok(()));
        assert_eq!(
            pgt(0, 0).validate(),
            Err(DescError::PgtEntryCount { count: 0, max: 64 })
        );
        assert_eq!(
            pgt(0, 65).validate(),
            Err(DescError::PgtEntryCount { count: 65, max: 64 })
        );
        assert_eq!(
            pgt(PGT_LEN - 1, 2).validate(),
            Err(DescError::PgtIndexRange {
                start_index: PGT_LEN - 1,
                count: 2
            })
        );
        let mr = CmdRequest::UpdateMrTable(UpdateMrTable {
            mr_base_va: VirtAddr(0),
            mr_length: 0,
            mr_key: MrKey::from_raw(0),
            pd: 0,
            acc_flags: AccessFlags::empty(),
            pgt_offset: PGT_LEN,
        });
        assert!(matches!(
            mr.validate(),
            Err(DescError::InvalidField {
                field: "pgt_offset",
                ..
            })
        ));
    }

    #[test]
    fn update_pgt_count_above_64_is_a_decode_error() {
        let mut d = CmdRequest::UpdatePgt(UpdatePgt {
            dma_addr: DeviceAddr(0),
            start_index: 0,
            entry_count: 64,
        })
        .encode(0);
        assert!(CmdRequest::decode(&d).is_ok());
        d.set(pgt::ZERO_BASED_ENTRY_COUNT, 64);
        assert_eq!(
            CmdRequest::decode(&d),
            Err(DescError::InvalidField {
                desc: DescKind::UpdatePgt,
                field: "zero_based_entry_count",
                raw: 64
            })
        );
    }

    #[test]
    fn header_only_response_zeroes_the_body() {
        let d = RawDesc([0x5A; 32]);
        let r = CmdResponse::header_only(&d);
        assert_eq!(r.echo, [0; ECHO_LEN]);
        assert_eq!((r.user_data, r.is_success), (0x5A, true));
        let e = r.encode();
        assert_eq!(&e.0[28..], &[0x5A, 0x01, 0x5A, 0x80]);
    }
}
