//! Unreliable Datagram frames, which the driver builds and reads itself: the card has no UD,
//! so a UD SEND travels through the simple NIC (nic-behaviour.md 2.1 and 5.5).
//!
//! `Ethernet | IPv4 | UDP (dst port UD_UDP_PORT) | BTH (0x64, or 0x65 with ImmDt) | DETH |
//! [ImmDt] | payload | ICRC` (ibverbs-abi.md 5). The UDP destination port is
//! [`UD_UDP_PORT`], not RoCE v2's 4791: the card's classifier sends every other port to the
//! simple-NIC RX ring, where the driver finds it; a 4791 frame would enter the card's RDMA
//! pipeline, which knows no UD opcode. The ICRC is computed and checked as RoCE v2 defines
//! it (ibverbs-abi.md 5.6), so a frame corrupted on the way is dropped. PadCnt is 0 on
//! emit and honoured on parse.
//!
//! A datagram longer than one frame's payload ([`UD_MAX_PAYLOAD`], what fits a receiving
//! card's 2048-byte simple-NIC slot) travels as several frames with consecutive PSNs: FIRST,
//! MIDDLE..., LAST (this driver's extension: opcodes 0x60..=0x63, which IB leaves unused for
//! UD; only the LAST carries the immediate data). The receiver puts them back together, up
//! to [`UD_MAX_DATAGRAM`] bytes, the port's MTU; a datagram missing a frame is dropped, as
//! UD allows.

use core::net::Ipv4Addr;
use core::ops::Range;

use zerocopy::network_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::bth::{Bth, BTH_LEN};
use super::eth::{MacAddr, ETH_HEADER_LEN};
use super::imm::{ImmDt, IMM_LEN};
use super::ipv4::IPV4_HEADER_LEN;
use super::opcode::RdmaOpcode;
use super::packet::{emit_at, FrameEnvelope};
use super::udp::UDP_HEADER_LEN;
use super::{read_layout, u24_from_be, u24_to_be, write_layout, Header, HeaderKind, WireError};
use crate::desc::simple_nic::RX_SLOT_SIZE;
use crate::keys::Qpn;

/// The UDP destination port of the driver's UD frames (the next port after RoCE v2's).
pub const UD_UDP_PORT: u16 = 4792;
/// UD SEND_ONLY.
pub const UD_SEND_ONLY: u8 = 0x64;
/// UD SEND_ONLY_WITH_IMMEDIATE.
pub const UD_SEND_ONLY_WITH_IMM: u8 = 0x65;
/// The first frame of a datagram of several (this driver's extension).
pub const UD_SEND_FIRST: u8 = 0x60;
/// A middle frame of a datagram of several.
pub const UD_SEND_MIDDLE: u8 = 0x61;
/// The last frame of a datagram of several.
pub const UD_SEND_LAST: u8 = 0x62;
/// The last frame of a datagram of several, with immediate data.
pub const UD_SEND_LAST_WITH_IMM: u8 = 0x63;
/// The largest datagram: the port's MTU (4096 bytes), in up to three frames.
pub const UD_MAX_DATAGRAM: usize = 4096;
/// Length of the DETH.
pub const DETH_LEN: usize = 8;
/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;
/// Where the IPv4 header lies in a frame (a receive's GRH area carries it).
pub const IPV4_RANGE: Range<usize> = ETH_HEADER_LEN..ETH_HEADER_LEN + IPV4_HEADER_LEN;
/// Headers before the payload without immediate data: 62 bytes.
pub const UD_HEADER_LEN: usize =
    ETH_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN + DETH_LEN;
/// The largest frame: one simple-NIC RX slot of the receiving card (longer frames would run
/// into the next slot, nic-behaviour.md 5.5).
pub const UD_MAX_FRAME: usize = RX_SLOT_SIZE as usize;
/// The largest UD payload, with or without immediate data: 1978 bytes.
pub const UD_MAX_PAYLOAD: usize = UD_MAX_FRAME - UD_HEADER_LEN - IMM_LEN - ICRC_LEN;
/// The default P_Key (BTH bytes 2..3).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// Which part of a datagram a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UdPart {
    /// The whole datagram.
    Only,
    /// Its first frame of several.
    First,
    /// A frame between the first and the last.
    Middle,
    /// Its last frame.
    Last,
}

impl UdPart {
    /// The part of frame `k` of a datagram of `n` frames.
    pub const fn of(k: usize, n: usize) -> UdPart {
        match (k, n) {
            (_, 0 | 1) => UdPart::Only,
            (0, _) => UdPart::First,
            (k, n) if k + 1 == n => UdPart::Last,
            _ => UdPart::Middle,
        }
    }

    /// Whether the frame ends a datagram (immediate data may ride on it).
    pub const fn ends(self) -> bool {
        matches!(self, UdPart::Only | UdPart::Last)
    }
}

/// The datagram extended transport header: Q_Key and source QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deth {
    /// The Q_Key the receiving QP must have.
    pub qkey: u32,
    /// The sending QP (24 bits).
    pub src_qpn: u32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DethLayout {
    qkey: U32,
    reserved: u8,
    src_qpn: [u8; 3],
}

impl Header for Deth {
    const LEN: usize = DETH_LEN;
    const KIND: HeaderKind = HeaderKind::Deth;

    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, rest) = read_layout::<DethLayout>(bytes, Self::KIND)?;
        let deth = Deth {
            qkey: l.qkey.get(),
            src_qpn: u24_from_be(l.src_qpn),
        };
        Ok((deth, rest))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let l = DethLayout {
            qkey: U32::new(self.qkey),
            reserved: 0,
            src_qpn: u24_to_be(self.src_qpn, "deth.src_qpn")?,
        };
        write_layout(&l, out, Self::KIND)
    }
}

/// One UD datagram's headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdFrame {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Destination MAC.
    pub dst_mac: MacAddr,
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address.
    pub dst_ip: Ipv4Addr,
    /// UDP source port (flow entropy; any value).
    pub udp_src_port: u16,
    /// P_Key.
    pub pkey: u16,
    /// The BTH's solicited-event bit.
    pub solicited: bool,
    /// Destination QP (24 bits).
    pub dst_qpn: u32,
    /// PSN (24 bits).
    pub psn: u32,
    /// Q_Key and source QP.
    pub deth: Deth,
    /// Immediate data (SEND_ONLY_WITH_IMMEDIATE, or on the LAST frame).
    pub imm: Option<u32>,
    /// Which part of its datagram the frame carries.
    pub part: UdPart,
}

impl UdFrame {
    /// Bytes before the payload: 62, or 66 with immediate data.
    pub const fn header_len(&self) -> usize {
        UD_HEADER_LEN + if self.imm.is_some() { IMM_LEN } else { 0 }
    }

    /// The frame length with `payload_len` payload bytes.
    pub const fn frame_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + ICRC_LEN
    }

    /// Writes the headers and the ICRC around a payload of `payload_len` bytes that the
    /// caller already put at `out[header_len()..]`; returns the frame length. Refuses a
    /// payload over [`UD_MAX_PAYLOAD`], and immediate data on a frame that does not end its
    /// datagram.
    pub fn emit(&self, out: &mut [u8], payload_len: usize) -> Result<usize, WireError> {
        if self.imm.is_some() && !self.part.ends() {
            return Err(WireError::FieldOutOfRange {
                field: "ud.imm (only the last frame of a datagram carries it)",
                value: 1,
                max: 0,
            });
        }
        if payload_len > UD_MAX_PAYLOAD {
            return Err(WireError::FieldOutOfRange {
                field: "ud.payload_len",
                value: payload_len as u64,
                max: UD_MAX_PAYLOAD as u64,
            });
        }
        let len = self.frame_len(payload_len);
        let available = out.len();
        let frame = out.get_mut(..len).ok_or(WireError::BufferTooSmall {
            header: HeaderKind::Frame,
            needed: len,
            available,
        })?;
        let envelope = FrameEnvelope::new(
            self.src_mac,
            self.dst_mac,
            self.src_ip,
            self.dst_ip,
            self.udp_src_port,
        );
        let udp_payload_len = len - (ETH_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN);
        let mut pos = envelope.emit(UD_UDP_PORT, udp_payload_len as u16, frame)?;
        let opcode = match (self.part, self.imm.is_some()) {
            (UdPart::Only, false) => UD_SEND_ONLY,
            (UdPart::Only, true) => UD_SEND_ONLY_WITH_IMM,
            (UdPart::First, _) => UD_SEND_FIRST,
            (UdPart::Middle, _) => UD_SEND_MIDDLE,
            (UdPart::Last, false) => UD_SEND_LAST,
            (UdPart::Last, true) => UD_SEND_LAST_WITH_IMM,
        };
        let mut bth = Bth::new(
            RdmaOpcode::from_raw(opcode),
            Qpn::from_raw(self.dst_qpn),
            self.psn,
        );
        bth.msn = self.pkey;
        bth.solicited = self.solicited;
        pos += emit_at(&bth, frame, pos)?;
        pos += emit_at(&self.deth, frame, pos)?;
        if let Some(imm) = self.imm {
            pos += emit_at(&ImmDt(imm), frame, pos)?;
        }
        let crc = icrc(&frame[ETH_HEADER_LEN..len - ICRC_LEN]);
        frame[len - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(pos, self.header_len());
        Ok(len)
    }

    /// Reads a UD frame; returns its headers and the range of its payload in `frame`.
    /// Checks the envelope (as [`FrameEnvelope::parse`]), the UDP port, the opcode, the
    /// BTH's transport version and pad count, the payload length (at most
    /// [`UD_MAX_PAYLOAD`], as [`UdFrame::emit`] takes) and the ICRC.
    pub fn parse(frame: &[u8]) -> Result<(UdFrame, Range<usize>), WireError> {
        let (envelope, dst_port, udp_payload) = FrameEnvelope::parse(frame)?;
        if dst_port != UD_UDP_PORT {
            return Err(WireError::NotUd { dst_port });
        }
        // FrameEnvelope::parse made the UDP payload end where the frame ends.
        let (crc_covered, trailer) = frame
            .get(ETH_HEADER_LEN..)
            .and_then(|f| f.split_at_checked(f.len().checked_sub(ICRC_LEN)?))
            .ok_or(WireError::Truncated {
                header: HeaderKind::Frame,
                needed: UD_HEADER_LEN + ICRC_LEN,
                available: frame.len(),
            })?;
        let (bth, after_bth) = Bth::parse(udp_payload)?;
        let (part, with_imm) = match bth.opcode.raw() {
            UD_SEND_ONLY => (UdPart::Only, false),
            UD_SEND_ONLY_WITH_IMM => (UdPart::Only, true),
            UD_SEND_FIRST => (UdPart::First, false),
            UD_SEND_MIDDLE => (UdPart::Middle, false),
            UD_SEND_LAST => (UdPart::Last, false),
            UD_SEND_LAST_WITH_IMM => (UdPart::Last, true),
            raw => return Err(WireError::UnknownOpcode { raw }),
        };
        if bth.tver != 0 {
            return Err(WireError::FieldOutOfRange {
                field: "bth.tver",
                value: bth.tver.into(),
                max: 0,
            });
        }
        let (deth, after_deth) = Deth::parse(after_bth)?;
        let (imm, rest) = if with_imm {
            let (ImmDt(v), rest) = ImmDt::parse(after_deth)?;
            (Some(v), rest)
        } else {
            (None, after_deth)
        };
        let payload_and_pad = rest
            .len()
            .checked_sub(ICRC_LEN + bth.pad_count as usize)
            .ok_or(WireError::Truncated {
                header: HeaderKind::Payload,
                needed: ICRC_LEN + bth.pad_count as usize,
                available: rest.len(),
            })?;
        // What `emit` refuses is refused here too: a longer payload overruns an RX slot.
        if payload_and_pad > UD_MAX_PAYLOAD {
            return Err(WireError::FieldOutOfRange {
                field: "ud.payload_len",
                value: payload_and_pad as u64,
                max: UD_MAX_PAYLOAD as u64,
            });
        }
        let mut stored = [0u8; ICRC_LEN];
        stored.copy_from_slice(trailer);
        let found = u32::from_le_bytes(stored);
        let computed = icrc(crc_covered);
        if found != computed {
            return Err(WireError::BadIcrc { found, computed });
        }
        let start = frame.len() - rest.len();
        let ud = UdFrame {
            src_mac: envelope.src_mac,
            dst_mac: envelope.dst_mac,
            src_ip: envelope.src_ip,
            dst_ip: envelope.dst_ip,
            udp_src_port: envelope.udp_src_port,
            pkey: bth.msn,
            solicited: bth.solicited,
            dst_qpn: bth.dqpn.get(),
            psn: bth.psn,
            deth,
            imm,
            part,
        };
        Ok((ud, start..start + payload_and_pad))
    }
}

/// The RoCE v2 ICRC of `packet`: the IPv4 header through the last payload (or pad) byte,
/// the ICRC itself excluded. CRC-32 (the Ethernet/zlib one) over eight 0xFF bytes, then the
/// packet with the variant fields set to ones: IPv4 TOS, TTL and header checksum, the UDP
/// checksum and BTH byte 4 (ibverbs-abi.md 5.6). The wire carries it least-significant
/// byte first. A packet shorter than its headers is summed as it is.
pub fn icrc(packet: &[u8]) -> u32 {
    /// IPv4 TOS, TTL, checksum (2); UDP checksum (2); BTH byte 4.
    const MASKED: [usize; 7] = [1, 8, 10, 11, 26, 27, 32];
    const HEADERS: usize = IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;
    let n = packet.len().min(HEADERS);
    let mut head = [0u8; HEADERS];
    head[..n].copy_from_slice(&packet[..n]);
    for i in MASKED {
        head[i] = 0xFF;
    }
    let mut crc = Crc32::new();
    crc.update(&[0xFF; 8]);
    crc.update(&head[..n]);
    crc.update(&packet[n..]);
    crc.finish()
}

/// CRC-32 with the reflected polynomial 0xEDB88320, initial value and final XOR all ones.
struct Crc32(u32);

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

impl Crc32 {
    const fn new() -> Self {
        Crc32(!0)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = CRC_TABLE[((self.0 ^ b as u32) & 0xFF) as usize] ^ (self.0 >> 8);
        }
    }
    const fn finish(&self) -> u32 {
        !self.0
    }
}

const _: () = assert!(UD_MAX_PAYLOAD == 1978);

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(imm: Option<u32>) -> UdFrame {
        UdFrame {
            src_mac: MacAddr([0x02, 0x00, 127, 0, 3, 1]),
            dst_mac: MacAddr::BROADCAST,
            src_ip: Ipv4Addr::new(127, 0, 3, 1),
            dst_ip: Ipv4Addr::new(127, 0, 3, 2),
            udp_src_port: 0xC001,
            pkey: DEFAULT_PKEY,
            solicited: false,
            dst_qpn: 0x80_0002,
            psn: 0x12_3456,
            deth: Deth {
                qkey: 0x1111_1111,
                src_qpn: 0x80_0001,
            },
            imm,
            part: UdPart::Only,
        }
    }

    fn build(f: &UdFrame, payload: &[u8]) -> ([u8; UD_MAX_FRAME], usize) {
        let mut out = [0u8; UD_MAX_FRAME];
        let h = f.header_len();
        out[h..h + payload.len()].copy_from_slice(payload);
        let n = f.emit(&mut out, payload.len()).unwrap();
        (out, n)
    }

    /// The frame of `sample(Some(0xDEADBEEF))` with payload "hello ud". Its last four
    /// bytes were computed outside this crate, with Python's zlib as ibverbs-abi.md 5.6
    /// describes: `struct.pack('<I', zlib.crc32(b'\xff' * 8 + masked IPv4 (TOS, TTL,
    /// checksum) + UDP (checksum ffff) + BTH (byte 4 ff) + DETH, ImmDt, payload))`.
    const KNOWN: &str = "ffffffffffff02007f00030108004500004000010000401176a97f0003017f000302\
                         c00112b8002c00006500ffff00800002001234561111111100800001deadbeef\
                         68656c6c6f207564011168ad";

    fn hex(s: &str) -> ([u8; 128], usize) {
        let s = s.as_bytes();
        let mut out = [0u8; 128];
        for (i, pair) in s.chunks_exact(2).enumerate() {
            let d = |c: u8| (c as char).to_digit(16).unwrap() as u8;
            out[i] = d(pair[0]) << 4 | d(pair[1]);
        }
        (out, s.len() / 2)
    }

    #[test]
    fn known_answer_frame_and_icrc() {
        let (want, len) = hex(KNOWN);
        let (out, n) = build(&sample(Some(0xDEAD_BEEF)), b"hello ud");
        assert_eq!(&out[..n], &want[..len]);
        assert_eq!(&out[n - 4..n], &[0x01, 0x11, 0x68, 0xad]);
        let (f, payload) = UdFrame::parse(&want[..len]).unwrap();
        assert_eq!(f, sample(Some(0xDEAD_BEEF)));
        assert_eq!(&want[payload], b"hello ud");
    }

    #[test]
    fn round_trips_with_and_without_immediate_at_every_size_edge() {
        for imm in [None, Some(7)] {
            for len in [0, 1, 1000, UD_MAX_PAYLOAD] {
                let payload = [0xA5u8; UD_MAX_PAYLOAD];
                let (out, n) = build(&sample(imm), &payload[..len]);
                assert!(n <= UD_MAX_FRAME);
                let (f, range) = UdFrame::parse(&out[..n]).unwrap();
                assert_eq!(f, sample(imm));
                assert_eq!(range.len(), len);
                assert_eq!(&out[IPV4_RANGE][12..16], &[127, 0, 3, 1]);
            }
        }
        let mut out = [0u8; UD_MAX_FRAME + 8];
        assert!(matches!(
            sample(None).emit(&mut out, UD_MAX_PAYLOAD + 1),
            Err(WireError::FieldOutOfRange { .. })
        ));
        assert!(matches!(
            sample(None).emit(&mut out[..70], 10),
            Err(WireError::BufferTooSmall { .. })
        ));
    }

    #[test]
    fn corrupt_short_or_foreign_frames_are_refused_without_panic() {
        let (good, n) = build(&sample(Some(1)), b"0123456789");
        for cut in 0..n {
            assert!(
                UdFrame::parse(&good[..cut]).is_err(),
                "prefix of {cut} bytes"
            );
        }
        for at in ETH_HEADER_LEN..n {
            let mut bad = good;
            bad[at] ^= 0x40;
            // Flipping the UDP checksum or BECN (BTH byte 4), both masked in the ICRC, is
            // harmless; every other flip is refused by some check (the IPv4 checksum covers
            // TOS and TTL).
            let masked = [40, 41, 46].contains(&at);
            assert_eq!(UdFrame::parse(&bad[..n]).is_ok(), masked, "byte {at}");
        }
        let mut bad = good;
        bad[37] = 0xB7; // UDP port 4791
        assert!(matches!(
            UdFrame::parse(&bad[..n]),
            Err(WireError::NotUd { dst_port: 4791 })
        ));
        let mut bad = good;
        bad[42] = 0x04; // RC SEND_ONLY
        assert!(matches!(
            UdFrame::parse(&bad[..n]),
            Err(WireError::UnknownOpcode { raw: 4 })
        ));
    }

    #[test]
    fn a_payload_longer_than_emit_takes_is_refused() {
        // The largest frame without immediate data, then one payload byte more, with the
        // lengths and the ICRC fixed so that only the payload length is wrong.
        let payload = [0x5Au8; UD_MAX_PAYLOAD + 1];
        let mut out = [0u8; UD_MAX_FRAME + 8];
        let f = sample(None);
        let h = f.header_len();
        out[h..h + UD_MAX_PAYLOAD].copy_from_slice(&payload[..UD_MAX_PAYLOAD]);
        let n = f.emit(&mut out, UD_MAX_PAYLOAD).unwrap();
        assert!(UdFrame::parse(&out[..n]).is_ok());
        let n = n + 1;
        out[h..h + UD_MAX_PAYLOAD + 1].copy_from_slice(&payload);
        let ip_len = (n - ETH_HEADER_LEN) as u16;
        out[16..18].copy_from_slice(&ip_len.to_be_bytes());
        out[24..26].fill(0);
        let mut ip = [0u8; IPV4_HEADER_LEN];
        ip.copy_from_slice(&out[IPV4_RANGE]);
        let sum = super::super::ipv4::ipv4_checksum(&ip);
        out[24..26].copy_from_slice(&sum.to_be_bytes());
        out[38..40].copy_from_slice(&(ip_len - IPV4_HEADER_LEN as u16).to_be_bytes());
        let crc = icrc(&out[ETH_HEADER_LEN..n - ICRC_LEN]);
        out[n - ICRC_LEN..n].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            UdFrame::parse(&out[..n]),
            Err(WireError::FieldOutOfRange {
                field: "ud.payload_len",
                value: UD_MAX_PAYLOAD as u64 + 1,
                max: UD_MAX_PAYLOAD as u64
            })
        );
    }

    #[test]
    fn pad_count_is_honoured() {
        // Emit 8 bytes, then claim 3 of them are pad and fix the ICRC.
        let (mut f, n) = build(&sample(None), b"abcdefgh");
        f[43] |= 3 << 4;
        let crc = icrc(&f[ETH_HEADER_LEN..n - ICRC_LEN]);
        f[n - 4..n].copy_from_slice(&crc.to_le_bytes());
        let (_, payload) = UdFrame::parse(&f[..n]).unwrap();
        assert_eq!(&f[payload], b"abcde");
    }

    #[test]
    fn the_parts_of_a_long_datagram_round_trip_and_only_the_last_carries_imm() {
        for (k, n, part) in [
            (0, 1, UdPart::Only),
            (0, 3, UdPart::First),
            (1, 3, UdPart::Middle),
            (2, 3, UdPart::Last),
        ] {
            assert_eq!(UdPart::of(k, n), part);
            for imm in [None, Some(9)] {
                let f = UdFrame {
                    part,
                    ..sample(imm)
                };
                let mut out = [0u8; UD_MAX_FRAME];
                let r = f.emit(&mut out, 100);
                assert_eq!(r.is_ok(), imm.is_none() || part.ends(), "{part:?} {imm:?}");
                if let Ok(n) = r {
                    let (g, range) = UdFrame::parse(&out[..n]).unwrap();
                    assert_eq!((g, range.len()), (f, 100));
                }
            }
        }
        assert!(UD_MAX_DATAGRAM.div_ceil(UD_MAX_PAYLOAD) <= 3);
    }
}
