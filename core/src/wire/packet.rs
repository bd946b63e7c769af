//! A whole RoCE frame as this card builds it (hardware-contract.md correction 13;
//! nic-behaviour.md 1.3-1.6 and 2.2):
//!
//! | Frame bytes | Content |
//! |---|---|
//! | 0..13 | Ethernet II, EtherType 0x0800 |
//! | 14..33 | IPv4: ID 1, DF clear, TTL 64, protocol 17, checksum computed |
//! | 34..41 | UDP: source port = sender QPN & 0xFFFF, destination 4791, checksum 0 |
//! | 42..53 | BTH |
//! | 54..95 | extension headers packed from byte 54, the rest zero (fixed 42 bytes) |
//! | 96.. | `RETH.va mod 4` filler bytes, then the payload (packets that carry one) |
//!
//! No ICRC, PadCnt 0, no padding to 60 bytes. Payload-less frames are exactly 96 bytes,
//! except the driver's ACK/NAK frame, which ends after the AETH (90 bytes); both parse
//! ([`PacketHeaders::nreth`] tells them apart). Which extension headers follow the BTH is a
//! table per opcode ([`WireProfile::ext_headers`]), so a standard-IBTA profile is a new
//! table, not a rewrite.
//!
//! A packet carries payload iff its opcode is a SEND, WRITE or READ-response opcode and
//! RETH.dlen is not 0 (the card's own rule, nic-behaviour.md 2.2). On packets that do not
//! start a message RETH.dlen must equal the payload length; on FIRST packets it is the
//! message total and must be at least the payload length.

use core::net::Ipv4Addr;
use core::ops::Range;

use super::aeth::{Aeth, AETH_LEN};
use super::bth::{Bth, BTH_LEN};
use super::eth::{EtherType, EthernetHeader, MacAddr, ETH_HEADER_LEN};
use super::ieth::{Ieth, IETH_LEN};
use super::imm::{ImmDt, IMM_LEN};
use super::ipv4::{Ecn, Ipv4Header, IPV4_HEADER_LEN, IP_PROTO_UDP};
use super::nreth::Nreth;
use super::opcode::{OpClass, RdmaOpcode};
use super::reth::{Reth, RETH_LEN};
use super::rreth::{Rreth, RRETH_LEN};
use super::udp::{UdpHeader, ROCE_V2_UDP_PORT, UDP_HEADER_LEN};
use super::{Header, HeaderKind, LengthField, WireError};
use crate::keys::Qpn;

/// Frame offset of the RDMA header area (after Ethernet, IPv4 and UDP).
pub const RDMA_HEADER_AREA_OFFSET: usize = ETH_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
/// Size of the fixed RDMA header area: BTH plus 42 bytes for extension headers.
pub const RDMA_HEADER_AREA_LEN: usize = 54;
/// Frame offset of the filler and payload.
pub const PAYLOAD_OFFSET: usize = RDMA_HEADER_AREA_OFFSET + RDMA_HEADER_AREA_LEN;
/// Length of every payload-less frame the card sends (READ request, zero-length ops,
/// hardware NAK).
pub const PAYLOADLESS_FRAME_LEN: usize = PAYLOAD_OFFSET;
/// Length of the driver's ACK/NAK frame: the header area ends right after the AETH.
pub const DRIVER_ACK_FRAME_LEN: usize = RDMA_HEADER_AREA_OFFSET + BTH_LEN + AETH_LEN;
/// The UDP source port of ACK/NAK frames built by the driver (the reference uses 4791).
pub const DRIVER_ACK_UDP_SRC_PORT: u16 = ROCE_V2_UDP_PORT;
/// Largest payload a frame can carry: the IPv4 total length is 16 bits.
pub const MAX_PAYLOAD_LEN: usize =
    u16::MAX as usize - IPV4_HEADER_LEN - UDP_HEADER_LEN - RDMA_HEADER_AREA_LEN - 3;

const EXT_AREA_LEN: usize = RDMA_HEADER_AREA_LEN - BTH_LEN;

/// The UDP source port the card uses for a data packet from QP `sqpn`.
pub const fn udp_src_port_for(sqpn: Qpn) -> u16 {
    (sqpn.get() & 0xFFFF) as u16
}

/// Which extension headers follow the BTH. Wire order: RETH, then RRETH, ImmDt or IETH;
/// or AETH (and, in the 96-byte form, NRETH).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// RETH.
    pub reth: bool,
    /// RRETH (READ request only).
    pub rreth: bool,
    /// ImmDt.
    pub imm: bool,
    /// IETH.
    pub ieth: bool,
    /// The extended AETH.
    pub aeth: bool,
}

impl ExtHeaders {
    const fn data(op: RdmaOpcode) -> Self {
        ExtHeaders {
            reth: true,
            rreth: false,
            imm: op.has_imm(),
            ieth: op.has_ieth(),
            aeth: false,
        }
    }

    /// Bytes these headers take (NRETH not counted).
    pub const fn len(self) -> usize {
        (self.reth as usize) * RETH_LEN
            + (self.rreth as usize) * RRETH_LEN
            + (self.imm as usize) * IMM_LEN
            + (self.ieth as usize) * IETH_LEN
            + (self.aeth as usize) * AETH_LEN
    }

    /// Whether no extension header is present.
    pub const fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// A wire profile: which extension headers each opcode carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WireProfile {
    /// What this card sends and accepts (nic-behaviour.md 1.3): RETH on every SEND, WRITE
    /// and READ-response packet, ImmDt/IETH after it on LAST/ONLY, RETH + RRETH on the READ
    /// request, the 36-byte AETH on ACK/NAK. No layout for atomics (the driver never
    /// issues them).
    #[default]
    Card,
}

impl WireProfile {
    /// The extension headers of `opcode`, or why it has none in this profile.
    pub const fn ext_headers(self, opcode: RdmaOpcode) -> Result<ExtHeaders, WireError> {
        match self {
            WireProfile::Card => match opcode.class() {
                None => Err(WireError::UnknownOpcode { raw: opcode.raw() }),
                Some(OpClass::Send | OpClass::Write | OpClass::ReadResponse) => {
                    Ok(ExtHeaders::data(opcode))
                }
                Some(OpClass::ReadRequest) => Ok(ExtHeaders {
                    reth: true,
                    rreth: true,
                    imm: false,
                    ieth: false,
                    aeth: false,
                }),
                Some(OpClass::Acknowledge) => Ok(ExtHeaders {
                    reth: false,
                    rreth: false,
                    imm: false,
                    ieth: false,
                    aeth: true,
                }),
                Some(OpClass::Atomic) => Err(WireError::UnsupportedOpcode { opcode }),
            },
        }
    }
}

/// The RDMA headers of one packet: the BTH and its extension headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PacketHeaders {
    /// Base transport header.
    pub bth: Bth,
    /// RDMA extended transport header.
    pub reth: Option<Reth>,
    /// The READ request's sink.
    pub rreth: Option<Rreth>,
    /// Immediate data.
    pub imm: Option<ImmDt>,
    /// Invalidate header.
    pub ieth: Option<Ieth>,
    /// Extended ACK header.
    pub aeth: Option<Aeth>,
    /// NAK retry header: `Some` for the 96-byte ACK/NAK frame (the hardware's), `None`
    /// for the 90-byte one (the driver's). Only with an AETH.
    pub nreth: Option<Nreth>,
}

impl PacketHeaders {
    /// Only a BTH; add extension headers by setting the fields.
    pub const fn new(bth: Bth) -> Self {
        PacketHeaders {
            bth,
            reth: None,
            rreth: None,
            imm: None,
            ieth: None,
            aeth: None,
            nreth: None,
        }
    }

    /// The extension headers present.
    pub const fn present(&self) -> ExtHeaders {
        ExtHeaders {
            reth: self.reth.is_some(),
            rreth: self.rreth.is_some(),
            imm: self.imm.is_some(),
            ieth: self.ieth.is_some(),
            aeth: self.aeth.is_some(),
        }
    }

    /// Checks that exactly the headers the opcode calls for are present.
    pub fn check_headers(&self) -> Result<ExtHeaders, WireError> {
        let opcode = self.bth.opcode;
        let want = WireProfile::Card.ext_headers(opcode)?;
        let have = self.present();
        let pairs = [
            (want.reth, have.reth, HeaderKind::Reth),
            (want.rreth, have.rreth, HeaderKind::Rreth),
            (want.imm, have.imm, HeaderKind::ImmDt),
            (want.ieth, have.ieth, HeaderKind::Ieth),
            (want.aeth, have.aeth, HeaderKind::Aeth),
        ];
        for (wanted, present, header) in pairs {
            match (wanted, present) {
                (true, false) => return Err(WireError::MissingHeader { opcode, header }),
                (false, true) => return Err(WireError::UnexpectedHeader { opcode, header }),
                _ => {}
            }
        }
        // The NRETH is optional after an AETH (96- or 90-byte form), absent otherwise.
        if self.nreth.is_some() && !want.aeth {
            return Err(WireError::UnexpectedHeader {
                opcode,
                header: HeaderKind::Nreth,
            });
        }
        Ok(want)
    }

    /// Whether the packet carries payload: a SEND, WRITE or READ-response opcode with
    /// RETH.dlen != 0.
    pub fn carries_payload(&self) -> bool {
        self.bth.opcode.has_payload() && self.reth.is_some_and(|r| r.dma_len != 0)
    }

    /// Filler bytes between the header area and the payload: `RETH.va mod 4` on packets
    /// that carry payload, else 0.
    pub fn filler_len(&self) -> usize {
        match self.reth {
            Some(reth) if self.carries_payload() => (reth.va.get() % 4) as usize,
            _ => 0,
        }
    }

    /// Bytes of the RDMA header area: 54, or 48 for an ACK/NAK without NRETH.
    pub fn header_area_len(&self) -> usize {
        if self.aeth.is_some() && self.nreth.is_none() {
            BTH_LEN + AETH_LEN
        } else {
            RDMA_HEADER_AREA_LEN
        }
    }

    /// The UDP payload length with `payload_len` payload bytes.
    pub fn udp_payload_len(&self, payload_len: usize) -> usize {
        self.header_area_len() + self.filler_len() + payload_len
    }

    /// Checks `payload` against the headers (see the module doc for the rules).
    fn check_payload(&self, payload_len: usize) -> Result<(), WireError> {
        let opcode = self.bth.opcode;
        match self.reth {
            Some(reth) if self.carries_payload() => {
                let dma_len = reth.dma_len as usize;
                if payload_len == 0 {
                    return Err(WireError::MissingPayload {
                        opcode,
                        dma_len: reth.dma_len,
                    });
                }
                let consistent = if opcode.is_first() {
                    dma_len >= payload_len
                } else {
                    dma_len == payload_len
                };
                if !consistent {
                    return Err(WireError::InconsistentLength {
                        field: LengthField::RethDmaLength,
                        found: dma_len,
                        expected: payload_len,
                    });
                }
                Ok(())
            }
            _ if payload_len != 0 => Err(WireError::UnexpectedPayload {
                opcode,
                len: payload_len,
            }),
            _ => Ok(()),
        }
    }

    /// Writes the UDP payload: header area, filler (zero) and `payload`. Returns its
    /// length. Fails if the headers do not match the opcode, the payload does not match
    /// the headers, a field does not fit or `out` is too short; `out` then holds no frame.
    pub fn emit_udp_payload(&self, payload: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
        let total = self.emit_udp_headers(payload.len(), out)?; // checked: out >= total
        out[total - payload.len()..total].copy_from_slice(payload);
        Ok(total)
    }

    /// [`PacketHeaders::emit_udp_payload`] but the payload: returns the same length and
    /// leaves its last `payload_len` bytes to the caller (a card reads them from memory).
    pub fn emit_udp_headers(&self, payload_len: usize, out: &mut [u8]) -> Result<usize, WireError> {
        self.check_headers()?;
        self.check_payload(payload_len)?;
        if payload_len > MAX_PAYLOAD_LEN {
            return Err(WireError::FieldOutOfRange {
                field: "payload length",
                value: payload_len as u64,
                max: MAX_PAYLOAD_LEN as u64,
            });
        }
        let area_len = self.header_area_len();
        let total = self.udp_payload_len(payload_len);
        let available = out.len();
        let (area, tail) = out
            .get_mut(..total)
            .ok_or(WireError::BufferTooSmall {
                header: if available < area_len {
                    HeaderKind::RdmaHeaderArea
                } else {
                    HeaderKind::Payload
                },
                needed: total,
                available,
            })?
            .split_at_mut(area_len);
        area.fill(0);
        let mut pos = emit_at(&self.bth, area, 0)?;
        if let Some(h) = &self.reth {
            pos += emit_at(h, area, pos)?;
        }
        if let Some(h) = &self.rreth {
            pos += emit_at(h, area, pos)?;
        }
        if let Some(h) = &self.imm {
            pos += emit_at(h, area, pos)?;
        }
        if let Some(h) = &self.ieth {
            pos += emit_at(h, area, pos)?;
        }
        if let Some(h) = &self.aeth {
            pos += emit_at(h, area, pos)?;
        }
        if let Some(h) = &self.nreth {
            emit_at(h, area, pos)?;
        }
        // `tail` is exactly filler + payload long (total = area + filler + payload).
        tail[..self.filler_len()].fill(0);
        Ok(total)
    }

    /// Reads the RDMA headers from a UDP payload; returns them and the range of the
    /// payload (after the filler) within `bytes`, empty at the end for payload-less
    /// packets.
    pub fn parse_udp_payload(bytes: &[u8]) -> Result<(Self, Range<usize>), WireError> {
        let (bth, ext) = Bth::parse(bytes)?;
        let want = WireProfile::Card.ext_headers(bth.opcode)?;
        let mut headers = PacketHeaders::new(bth);
        let end = bytes.len();
        if want.aeth {
            let (aeth, after) = Aeth::parse(ext)?;
            headers.aeth = Some(aeth);
            // 90-byte frame: nothing after the AETH; 96-byte frame: NRETH and 2 pad bytes.
            let pad = RDMA_HEADER_AREA_LEN - BTH_LEN - AETH_LEN;
            match after.len() {
                0 => {}
                n if n < pad => {
                    return Err(WireError::Truncated {
                        header: HeaderKind::RdmaHeaderArea,
                        needed: pad,
                        available: n,
                    })
                }
                n if n > pad => {
                    return Err(WireError::UnexpectedPayload {
                        opcode: bth.opcode,
                        len: n - pad,
                    })
                }
                _ => headers.nreth = Some(Nreth::parse(after)?.0),
            }
            return Ok((headers, end..end));
        }
        let area = ext.get(..EXT_AREA_LEN).ok_or(WireError::Truncated {
            header: HeaderKind::RdmaHeaderArea,
            needed: RDMA_HEADER_AREA_LEN,
            available: bytes.len(),
        })?;
        let mut cursor = area;
        if want.reth {
            headers.reth = Some(take(&mut cursor)?);
        }
        if want.rreth {
            headers.rreth = Some(take(&mut cursor)?);
        }
        if want.imm {
            headers.imm = Some(take(&mut cursor)?);
        }
        if want.ieth {
            headers.ieth = Some(take(&mut cursor)?);
        }
        if !headers.carries_payload() {
            let extra = end.saturating_sub(RDMA_HEADER_AREA_LEN);
            if extra != 0 {
                return Err(WireError::UnexpectedPayload {
                    opcode: bth.opcode,
                    len: extra,
                });
            }
            return Ok((headers, end..end));
        }
        let start = RDMA_HEADER_AREA_LEN + headers.filler_len();
        // A frame that ends inside the filler has no payload at all.
        headers.check_payload(end.saturating_sub(start))?;
        Ok((headers, start..end))
    }
}

/// Emits `h` at `pos` of `area`.
pub(super) fn emit_at<H: Header>(h: &H, area: &mut [u8], pos: usize) -> Result<usize, WireError> {
    let available = area.len().saturating_sub(pos);
    let dst = area.get_mut(pos..).ok_or(WireError::BufferTooSmall {
        header: H::KIND,
        needed: H::LEN,
        available,
    })?;
    h.emit(dst)
}

/// Parses `H` from the front of `cursor` and advances it.
fn take<H: Header>(cursor: &mut &[u8]) -> Result<H, WireError> {
    let (h, rest) = H::parse(cursor)?;
    *cursor = rest;
    Ok(h)
}

/// Everything of a frame outside the RDMA header area that a sender chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameEnvelope {
    /// Destination MAC.
    pub dst_mac: MacAddr,
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address.
    pub dst_ip: Ipv4Addr,
    /// DSCP (6 bits; the card sends 0).
    pub dscp: u8,
    /// ECN bits (the card: ECT(1) with enable_ecn, else not-ECT).
    pub ecn: Ecn,
    /// UDP source port (data: [`udp_src_port_for`] the sender QP).
    pub udp_src_port: u16,
}

impl FrameEnvelope {
    /// An envelope with DSCP 0 and ECN not-ECT.
    pub const fn new(
        src_mac: MacAddr,
        dst_mac: MacAddr,
        src_ip: Ipv4Addr,
        dst_ip: Ipv4Addr,
        udp_src_port: u16,
    ) -> Self {
        FrameEnvelope {
            dst_mac,
            src_mac,
            src_ip,
            dst_ip,
            dscp: 0,
            ecn: Ecn::NotEct,
            udp_src_port,
        }
    }

    /// Writes the Ethernet, IPv4 and UDP headers for a UDP payload of `udp_payload_len`
    /// bytes to UDP port `dst_port`; returns their length (the payload starts there).
    pub fn emit(
        &self,
        dst_port: u16,
        udp_payload_len: u16,
        out: &mut [u8],
    ) -> Result<usize, WireError> {
        let udp_len = (UDP_HEADER_LEN as u16)
            .checked_add(udp_payload_len)
            .filter(|l| l.checked_add(IPV4_HEADER_LEN as u16).is_some())
            .ok_or(WireError::FieldOutOfRange {
                field: "udp.length",
                value: udp_payload_len.into(),
                max: (u16::MAX as usize - UDP_HEADER_LEN - IPV4_HEADER_LEN) as u64,
            })?;
        let eth = EthernetHeader {
            dst: self.dst_mac,
            src: self.src_mac,
            ethertype: EtherType::Ipv4,
        };
        let mut ip = Ipv4Header::roce(
            self.src_ip,
            self.dst_ip,
            self.ecn,
            IPV4_HEADER_LEN as u16 + udp_len,
        );
        ip.dscp = self.dscp;
        let udp = UdpHeader {
            src_port: self.udp_src_port,
            dst_port,
            length: udp_len,
        };
        let mut pos = eth.emit(out)?;
        pos += emit_at(&ip, out, pos)?;
        pos += emit_at(&udp, out, pos)?;
        Ok(pos)
    }

    /// Reads the Ethernet, IPv4 and UDP headers of a frame; returns the envelope, the UDP
    /// destination port and the UDP payload. Checks that the frame is IPv4/UDP, not a
    /// fragment, and that the IPv4 total length, the UDP length and the frame length agree.
    pub fn parse(frame: &[u8]) -> Result<(Self, u16, &[u8]), WireError> {
        let (eth, after_eth) = EthernetHeader::parse(frame)?;
        if eth.ethertype != EtherType::Ipv4 {
            return Err(WireError::NotIpv4 {
                ethertype: eth.ethertype.raw(),
            });
        }
        let (ip, ip_payload) = Ipv4Header::parse(after_eth)?;
        if ip.total_len as usize != after_eth.len() {
            return Err(WireError::InconsistentLength {
                field: LengthField::Ipv4TotalLength,
                found: ip.total_len as usize,
                expected: after_eth.len(),
            });
        }
        if ip.is_fragment() {
            return Err(WireError::Fragmented {
                offset: ip.fragment_offset,
                more_fragments: ip.more_fragments,
            });
        }
        if ip.protocol != IP_PROTO_UDP {
            return Err(WireError::NotUdp {
                protocol: ip.protocol,
            });
        }
        let (udp, udp_payload) = UdpHeader::parse(ip_payload)?;
        if udp.length as usize != ip_payload.len() {
            return Err(WireError::InconsistentLength {
                field: LengthField::UdpLength,
                found: udp.length as usize,
                expected: ip_payload.len(),
            });
        }
        let envelope = FrameEnvelope {
            dst_mac: eth.dst,
            src_mac: eth.src,
            src_ip: ip.src,
            dst_ip: ip.dst,
            dscp: ip.dscp,
            ecn: ip.ecn,
            udp_src_port: udp.src_port,
        };
        Ok((envelope, udp.dst_port, udp_payload))
    }
}

/// A RoCE frame: envelope and RDMA headers (the payload stays where it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RocePacket {
    /// MACs, IPs, traffic class and UDP source port.
    pub envelope: FrameEnvelope,
    /// BTH and extension headers.
    pub headers: PacketHeaders,
}

impl RocePacket {
    /// The frame length with `payload_len` payload bytes.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        RDMA_HEADER_AREA_OFFSET + self.headers.udp_payload_len(payload_len)
    }

    /// Writes the whole frame into `out`; returns its length. Headers, payload and
    /// lengths are checked first (see the module doc).
    pub fn emit_frame(&self, payload: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
        let n = self.emit_frame_headers(payload.len(), out)?;
        out[n - payload.len()..n].copy_from_slice(payload);
        Ok(n)
    }

    /// [`RocePacket::emit_frame`] but the payload: its last `payload_len` bytes are the
    /// caller's to fill.
    pub fn emit_frame_headers(
        &self,
        payload_len: usize,
        out: &mut [u8],
    ) -> Result<usize, WireError> {
        let available = out.len();
        let too_small = WireError::BufferTooSmall {
            header: HeaderKind::Frame,
            needed: self.frame_len(payload_len),
            available,
        };
        let udp_payload = out.get_mut(RDMA_HEADER_AREA_OFFSET..).ok_or(too_small)?;
        let udp_payload_len = match self.headers.emit_udp_headers(payload_len, udp_payload) {
            Err(WireError::BufferTooSmall { .. }) => return Err(too_small),
            other => other?,
        };
        // Cannot overflow: emit_udp_headers bounds the payload by MAX_PAYLOAD_LEN.
        let pos = self
            .envelope
            .emit(ROCE_V2_UDP_PORT, udp_payload_len as u16, out)?;
        Ok(pos + udp_payload_len)
    }

    /// Reads a frame; returns the packet and the range of its payload in `frame`
    /// (empty, at the end, when it has none). Checks that the IPv4 total length, the UDP
    /// length and the frame length agree, and that the frame is RoCE v2.
    pub fn parse_frame(frame: &[u8]) -> Result<(Self, Range<usize>), WireError> {
        let (envelope, udp_dst_port, udp_payload) = FrameEnvelope::parse(frame)?;
        if udp_dst_port != ROCE_V2_UDP_PORT {
            return Err(WireError::NotRoce {
                dst_port: udp_dst_port,
            });
        }
        let (headers, range) = PacketHeaders::parse_udp_payload(udp_payload)?;
        let range = range.start + RDMA_HEADER_AREA_OFFSET..range.end + RDMA_HEADER_AREA_OFFSET;
        Ok((RocePacket { envelope, headers }, range))
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::VirtAddr;
    use crate::keys::MrKey;

    fn envelope() -> FrameEnvelope {
        FrameEnvelope::new(
            MacAddr::from_bits(0xAABB_CCDD_EE0A),
            MacAddr::from_bits(0xAABB_CCDD_EE0B),
            Ipv4Addr::new(17, 34, 51, 10),
            Ipv4Addr::new(17, 34, 51, 11),
            0x23AB,
        )
    }

    fn write(opcode: RdmaOpcode, va: u64, dma_len: u32) -> RocePacket {
        let mut headers = PacketHeaders::new(Bth::new(opcode, Qpn::from_raw(0x0345CD), 7));
        headers.reth = Some(Reth {
            va: VirtAddr(va),
            rkey: MrKey::from_raw(0x1FFFA5),
            dma_len,
        });
        RocePacket {
            envelope: envelope(),
            headers,
        }
    }

    #[test]
    fn data_packet_round_trips_with_filler() {
        let p = write(RdmaOpcode::WriteMiddle, 0x1003, 5);
        let mut buf = [0xEEu8; 200];
        let n = p.emit_frame(b"hello", &mut buf).unwrap();
        assert_eq!(n, 96 + 3 + 5);
        assert_eq!(buf[96..99], [0, 0, 0], "filler is zero");
        let (back, range) = RocePacket::parse_frame(&buf[..n]).unwrap();
        assert_eq!(back, p);
        assert_eq!(range, 99..104);
        assert_eq!(&buf[range], b"hello");
    }

    #[test]
    fn headers_must_match_the_opcode() {
        let mut buf = [0u8; 200];
        let mut p = write(RdmaOpcode::WriteOnlyWithImm, 0, 0);
        assert_eq!(
            p.emit_frame(&[], &mut buf),
            Err(WireError::MissingHeader {
                opcode: RdmaOpcode::WriteOnlyWithImm,
                header: HeaderKind::ImmDt
            })
        );
        p.headers.imm = Some(ImmDt(1));
        p.headers.nreth = Some(Nreth::default());
        assert_eq!(
            p.emit_frame(&[], &mut buf),
            Err(WireError::UnexpectedHeader {
                opcode: RdmaOpcode::WriteOnlyWithImm,
                header: HeaderKind::Nreth
            })
        );
        p.headers.nreth = None;
        assert_eq!(p.emit_frame(&[], &mut buf), Ok(96), "zero-length WRITE_IMM");
        p.headers.bth.opcode = RdmaOpcode::FetchAdd;
        assert_eq!(
            p.emit_frame(&[], &mut buf),
            Err(WireError::UnsupportedOpcode {
                opcode: RdmaOpcode::FetchAdd
            })
        );
        p.headers.bth.opcode = RdmaOpcode::Unknown(0x80);
        assert_eq!(
            p.emit_frame(&[], &mut buf),
            Err(WireError::UnknownOpcode { raw: 0x80 })
        );
    }

    #[test]
    fn payload_must_match_reth() {
        let mut buf = [0u8; 200];
        assert_eq!(
            write(RdmaOpcode::WriteLast, 0, 4).emit_frame(&[1, 2, 3], &mut buf),
            Err(WireError::InconsistentLength {
                field: LengthField::RethDmaLength,
                found: 4,
                expected: 3
            })
        );
        assert_eq!(
            write(RdmaOpcode::WriteFirst, 0, 4096).emit_frame(&[1, 2, 3], &mut buf),
            Ok(99),
            "FIRST carries the message total"
        );
        assert_eq!(
            write(RdmaOpcode::WriteOnly, 0, 4).emit_frame(&[], &mut buf),
            Err(WireError::MissingPayload {
                opcode: RdmaOpcode::WriteOnly,
                dma_len: 4
            })
        );
        assert_eq!(
            write(RdmaOpcode::WriteOnly, 0, 0).emit_frame(&[1], &mut buf),
            Err(WireError::UnexpectedPayload {
                opcode: RdmaOpcode::WriteOnly,
                len: 1
            })
        );
    }

    #[test]
    fn parse_rejects_stray_and_missing_payload() {
        let mut buf = [0u8; 200];
        let n = write(RdmaOpcode::WriteOnly, 0x2, 0)
            .emit_frame(&[], &mut buf)
            .unwrap();
        assert_eq!(n, 96);
        // Claim a payload in RETH.dlen without one: frame ends inside the filler.
        buf[RDMA_HEADER_AREA_OFFSET + BTH_LEN + 15] = 1; // RETH.dlen low byte
        let mut frame = buf;
        assert_eq!(
            RocePacket::parse_frame(&frame[..96]),
            Err(WireError::MissingPayload {
                opcode: RdmaOpcode::WriteOnly,
                dma_len: 1
            })
        );
        // dlen 0 but trailing bytes: the IP/UDP lengths must be raised to reach the parser.
        let p = write(RdmaOpcode::WriteOnly, 0x2, 0);
        let hdr_len = p.emit_frame(&[], &mut frame).unwrap();
        let grown = hdr_len + 2;
        let ip = Ipv4Header::roce(
            p.envelope.src_ip,
            p.envelope.dst_ip,
            Ecn::NotEct,
            (grown - 14) as u16,
        );
        ip.emit(&mut frame[14..]).unwrap();
        frame[38..40].copy_from_slice(&((grown - 34) as u16).to_be_bytes());
        assert_eq!(
            RocePacket::parse_frame(&frame[..grown]),
            Err(WireError::UnexpectedPayload {
                opcode: RdmaOpcode::WriteOnly,
                len: 2
            })
        );
    }

    #[test]
    fn read_request_and_hardware_nak_are_96_bytes() {
        let mut buf = [0u8; 128];
        let mut p = write(RdmaOpcode::ReadRequest, 0x1001, 4096);
        p.headers.rreth = Some(Rreth {
            va: VirtAddr(0x5000),
            lkey: MrKey::from_raw(0x200),
        });
        assert_eq!(
            p.emit_frame(&[], &mut buf),
            Ok(96),
            "no filler without payload"
        );
        assert_eq!(RocePacket::parse_frame(&buf[..96]), Ok((p, 96..96)));

        let mut nak = PacketHeaders::new(Bth::new(RdmaOpcode::Acknowledge, Qpn::from_raw(9), 0x20));
        nak.aeth = Some(Aeth {
            is_packet_lost: true,
            is_window_slided: true,
            pre_psn: 0x10,
            ..Aeth::default()
        });
        nak.nreth = Some(Nreth::default());
        let p = RocePacket {
            envelope: envelope(),
            headers: nak,
        };
        assert_eq!(p.emit_frame(&[], &mut buf), Ok(96));
        assert_eq!(RocePacket::parse_frame(&buf[..96]), Ok((p, 96..96)));
    }
}
