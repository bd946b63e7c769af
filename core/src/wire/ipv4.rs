//! IPv4 header, 20 bytes, no options (frame bytes 14..33, nic-behaviour.md 1.4).
//!
//! The card's frames use identification 1, DF clear, TTL 64, protocol UDP and a computed
//! header checksum (hardware-contract.md correction 13); [`Ipv4Header::roce`] builds that.
//! `parse` checks the version, the header length (options are refused: the card finds the
//! BTH at a fixed offset), the total length and the checksum; the card itself checks none of
//! them (nic-behaviour.md 2.1), but a driver that reads frames should.
//! `emit` always computes the checksum.

use core::net::Ipv4Addr;

use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{check_width, read_layout, write_layout, Header, HeaderKind, LengthField, WireError};

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// The IP protocol number of UDP.
pub const IP_PROTO_UDP: u8 = 17;
/// The identification the card puts in every frame.
pub const ROCE_IP_IDENT: u16 = 1;
/// The TTL the card puts in every frame.
pub const ROCE_IP_TTL: u8 = 64;

/// The two ECN bits of the traffic-class byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Ecn {
    /// 00: not ECN-capable (the card's default).
    #[default]
    NotEct,
    /// 01: ECN-capable transport (1); what the card sends with `enable_ecn`.
    Ect1,
    /// 10: ECN-capable transport (0).
    Ect0,
    /// 11: congestion experienced.
    Ce,
}

impl Ecn {
    /// From the low two bits of `bits` (higher bits are ignored).
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 0b11 {
            0b00 => Ecn::NotEct,
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The two bits.
    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0b00,
            Ecn::Ect1 => 0b01,
            Ecn::Ect0 => 0b10,
            Ecn::Ce => 0b11,
        }
    }
}

/// An IPv4 header without options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Header {
    /// Differentiated services code point (6 bits).
    pub dscp: u8,
    /// ECN bits.
    pub ecn: Ecn,
    /// Total length: this header plus everything it carries.
    pub total_len: u16,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag.
    pub dont_fragment: bool,
    /// More-fragments flag.
    pub more_fragments: bool,
    /// Fragment offset in 8-byte units (13 bits).
    pub fragment_offset: u16,
    /// Time to live.
    pub ttl: u8,
    /// Protocol of the payload ([`IP_PROTO_UDP`] for RoCE).
    pub protocol: u8,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
}

impl Ipv4Header {
    /// The header the card puts on a RoCE frame: DSCP 0, identification 1, DF clear,
    /// TTL 64, protocol UDP.
    pub const fn roce(src: Ipv4Addr, dst: Ipv4Addr, ecn: Ecn, total_len: u16) -> Self {
        Ipv4Header {
            dscp: 0,
            ecn,
            total_len,
            ident: ROCE_IP_IDENT,
            dont_fragment: false,
            more_fragments: false,
            fragment_offset: 0,
            ttl: ROCE_IP_TTL,
            protocol: IP_PROTO_UDP,
            src,
            dst,
        }
    }

    /// Whether the packet is a fragment (offset or more-fragments set).
    pub const fn is_fragment(&self) -> bool {
        self.more_fragments || self.fragment_offset != 0
    }

    fn layout(&self) -> Result<Layout, WireError> {
        let dscp = check_width(self.dscp, 6, "ipv4.dscp")?;
        if self.fragment_offset > 0x1FFF {
            return Err(WireError::FieldOutOfRange {
                field: "ipv4.fragment_offset",
                value: self.fragment_offset as u64,
                max: 0x1FFF,
            });
        }
        let flags = (self.dont_fragment as u16) << 14 | (self.more_fragments as u16) << 13;
        let mut l = Layout {
            ver_ihl: 0x45,
            tos: dscp << 2 | self.ecn.bits(),
            total_len: U16::new(self.total_len),
            ident: U16::new(self.ident),
            flags_frag: U16::new(flags | self.fragment_offset),
            ttl: self.ttl,
            protocol: self.protocol,
            checksum: U16::ZERO,
            src: self.src.octets(),
            dst: self.dst.octets(),
        };
        l.checksum = U16::new(checksum(&l));
        Ok(l)
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Layout {
    ver_ihl: u8,
    tos: u8,
    total_len: U16,
    ident: U16,
    flags_frag: U16,
    ttl: u8,
    protocol: u8,
    checksum: U16,
    src: [u8; 4],
    dst: [u8; 4],
}

/// The header checksum of `l`: one's complement of the one's-complement sum of its ten
/// 16-bit words, the checksum word counted as zero.
fn checksum(l: &Layout) -> u16 {
    let mut bytes = [0u8; IPV4_HEADER_LEN];
    // Cannot fail: `bytes` has exactly the layout's size.
    let _ = l.write_to_prefix(&mut bytes);
    ipv4_checksum(&bytes)
}

/// The IPv4 header checksum of a 20-byte header, its checksum field (bytes 10..11)
/// counted as zero. Carries are folded until none is left (the RTL folds once; the
/// emulated NIC computes the standard value, nic-behaviour.md 1.4).
pub fn ipv4_checksum(header: &[u8; IPV4_HEADER_LEN]) -> u16 {
    let mut sum: u32 = 0;
    for (i, pair) in header.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u16::from_be_bytes([pair[0], pair[1]]) as u32;
        }
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

impl Header for Ipv4Header {
    const LEN: usize = IPV4_HEADER_LEN;
    const KIND: HeaderKind = HeaderKind::Ipv4;

    /// Returns the header and its payload: the bytes up to the total length (trailing
    /// link padding is cut off).
    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (l, _) = read_layout::<Layout>(bytes, Self::KIND)?;
        let version = l.ver_ihl >> 4;
        if version != 4 {
            return Err(WireError::BadIpVersion { version });
        }
        let ihl = l.ver_ihl & 0x0F;
        if ihl != 5 {
            return Err(WireError::UnsupportedIpHeaderLength { ihl });
        }
        let computed = checksum(&l);
        if computed != l.checksum.get() {
            return Err(WireError::BadIpChecksum {
                found: l.checksum.get(),
                computed,
            });
        }
        let total = l.total_len.get() as usize;
        let payload = bytes
            .get(IPV4_HEADER_LEN..total)
            .ok_or(WireError::InconsistentLength {
                field: LengthField::Ipv4TotalLength,
                found: total,
                expected: bytes.len(),
            })?;
        let flags_frag = l.flags_frag.get();
        let header = Ipv4Header {
            dscp: l.tos >> 2,
            ecn: Ecn::from_bits(l.tos),
            total_len: l.total_len.get(),
            ident: l.ident.get(),
            dont_fragment: flags_frag & 0x4000 != 0,
            more_fragments: flags_frag & 0x2000 != 0,
            fragment_offset: flags_frag & 0x1FFF,
            ttl: l.ttl,
            protocol: l.protocol,
            src: Ipv4Addr::from(l.src),
            dst: Ipv4Addr::from(l.dst),
        };
        Ok((header, payload))
    }

    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        write_layout(&self.layout()?, out, Self::KIND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header whose checksum is worked out by hand below.
    fn sample() -> Ipv4Header {
        Ipv4Header::roce(
            Ipv4Addr::new(17, 34, 51, 10),
            Ipv4Addr::new(17, 34, 51, 11),
            Ecn::NotEct,
            76,
        )
    }

    #[test]
    fn checksum_by_hand() {
        // Words: 4500 004c 0001 0000 4011 [0000] 1122 330a 1122 330b
        // Sum = 0x4500+0x004c+0x0001+0x4011+0x1122+0x330a+0x1122+0x330b = 0x1_0DB7,
        // folded 0x0DB7 + 1 = 0x0DB8; checksum = !0x0DB8 = 0xF247.
        let mut out = [0u8; 20];
        assert_eq!(sample().emit(&mut out), Ok(20));
        assert_eq!(
            out,
            [
                0x45, 0x00, 0x00, 0x4c, 0x00, 0x01, 0x00, 0x00, 0x40, 0x11, 0xF2, 0x47, 17, 34, 51,
                10, 17, 34, 51, 11
            ]
        );
    }

    #[test]
    fn parse_checks_version_ihl_checksum_and_length() {
        let mut buf = [0u8; 80];
        sample().emit(&mut buf).unwrap();
        let (h, payload) = Ipv4Header::parse(&buf).unwrap();
        assert_eq!(h, sample());
        assert_eq!(
            payload.len(),
            56,
            "trailing bytes beyond total length are cut"
        );

        let mut bad = buf;
        bad[0] = 0x65;
        assert_eq!(
            Ipv4Header::parse(&bad),
            Err(WireError::BadIpVersion { version: 6 })
        );
        let mut bad = buf;
        bad[0] = 0x46;
        assert_eq!(
            Ipv4Header::parse(&bad),
            Err(WireError::UnsupportedIpHeaderLength { ihl: 6 })
        );
        let mut bad = buf;
        bad[22 - 14] = 0x3F; // TTL 63, checksum now stale
        assert_eq!(
            Ipv4Header::parse(&bad),
            Err(WireError::BadIpChecksum {
                found: 0xF247,
                computed: 0xF347
            })
        );
        assert_eq!(
            Ipv4Header::parse(&buf[..60]),
            Err(WireError::InconsistentLength {
                field: LengthField::Ipv4TotalLength,
                found: 76,
                expected: 60
            })
        );
    }

    #[test]
    fn emit_rejects_wide_fields() {
        let mut h = sample();
        h.dscp = 64;
        let mut out = [0u8; 20];
        assert_eq!(
            h.emit(&mut out),
            Err(WireError::FieldOutOfRange {
                field: "ipv4.dscp",
                value: 64,
                max: 63
            })
        );
    }
}
