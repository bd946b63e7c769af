//! Wire formats: the RoCE frames this card puts on its link and the ACK/NAK frames the
//! driver builds itself (hardware-contract.md correction 13 and "Wire format";
//! nic-behaviour.md 1.3-1.6 and 2.1-2.2; layout-verification.md 1.6).
//!
//! One file per header. Every header implements [`Header`]: `parse` checks the length once
//! and returns the header with the bytes that follow it, `emit` checks the output length
//! once and writes the header; after those checks no access can panic, whatever the bytes.
//! All multi-byte fields are big-endian on the wire. [`packet`] assembles whole frames
//! (the fixed 54-byte RDMA header area, filler and payload), table-driven per opcode;
//! [`ack`] builds and reads the driver's 90-byte ACK/NAK frames.

use core::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes};

pub mod ack;
pub mod aeth;
pub mod bth;
pub mod eth;
pub mod ieth;
pub mod imm;
pub mod ipv4;
pub mod nreth;
pub mod opcode;
pub mod packet;
pub mod reth;
pub mod rreth;
pub mod ud;
pub mod udp;

pub use ack::{AckKind, AckVerdict, DriverAckFrame, ReceivedAck};
pub use aeth::Aeth;
pub use bth::Bth;
pub use eth::{EtherType, EthernetHeader, MacAddr};
pub use ieth::Ieth;
pub use imm::ImmDt;
pub use ipv4::{Ecn, Ipv4Header};
pub use nreth::Nreth;
pub use opcode::RdmaOpcode;
pub use packet::{ExtHeaders, FrameEnvelope, PacketHeaders, RocePacket, WireProfile};
pub use reth::Reth;
pub use rreth::Rreth;
pub use ud::{Deth, UdFrame};
pub use udp::UdpHeader;

/// A fixed-size wire header: parsed from and emitted into byte slices.
pub trait Header: Sized {
    /// Bytes the header occupies on the wire.
    const LEN: usize;
    /// Which header this is, for error messages.
    const KIND: HeaderKind;

    /// Reads the header from the start of `bytes`; returns it and the bytes after it.
    /// Headers with a length field (IPv4, UDP) return only the bytes that field covers.
    fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), WireError>;

    /// Writes the header to the start of `out`; returns the number of bytes written
    /// ([`Header::LEN`]). Fails, writing nothing, if `out` is too short or a field does not
    /// fit its wire width.
    fn emit(&self, out: &mut [u8]) -> Result<usize, WireError>;
}

/// The header (or region of a frame) an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeaderKind {
    /// Ethernet II header (14 bytes).
    Ethernet,
    /// IPv4 header (20 bytes).
    Ipv4,
    /// UDP header (8 bytes).
    Udp,
    /// Base transport header (12 bytes).
    Bth,
    /// RDMA extended transport header (16 bytes).
    Reth,
    /// The READ request's sink header {va, lkey} (12 bytes).
    Rreth,
    /// Immediate data (4 bytes).
    ImmDt,
    /// Invalidate extended transport header (4 bytes).
    Ieth,
    /// The card's extended ACK header (36 bytes).
    Aeth,
    /// NAK retry header (4 bytes).
    Nreth,
    /// Datagram extended transport header (8 bytes).
    Deth,
    /// The fixed 54-byte RDMA header area (BTH plus the zero-filled extension area).
    RdmaHeaderArea,
    /// The `raddr mod 4` filler bytes and the payload after the header area.
    Payload,
    /// A whole frame.
    Frame,
}

impl HeaderKind {
    /// The name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            HeaderKind::Ethernet => "Ethernet",
            HeaderKind::Ipv4 => "IPv4",
            HeaderKind::Udp => "UDP",
            HeaderKind::Bth => "BTH",
            HeaderKind::Reth => "RETH",
            HeaderKind::Rreth => "RRETH",
            HeaderKind::ImmDt => "ImmDt",
            HeaderKind::Ieth => "IETH",
            HeaderKind::Aeth => "AETH",
            HeaderKind::Nreth => "NRETH",
            HeaderKind::Deth => "DETH",
            HeaderKind::RdmaHeaderArea => "RDMA header area",
            HeaderKind::Payload => "payload",
            HeaderKind::Frame => "frame",
        }
    }
}

impl fmt::Display for HeaderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A length that a frame states in more than one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LengthField {
    /// The IPv4 total length (bytes 16..17 of the frame).
    Ipv4TotalLength,
    /// The UDP length (bytes 38..39 of the frame).
    UdpLength,
    /// RETH.dlen of a packet that is not the first of its message: it must equal the
    /// payload length (nic-behaviour.md 1.3, 2.4).
    RethDmaLength,
}

impl fmt::Display for LengthField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LengthField::Ipv4TotalLength => "IPv4 total length",
            LengthField::UdpLength => "UDP length",
            LengthField::RethDmaLength => "RETH DMA length",
        })
    }
}

/// Why a frame or header could not be parsed or emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The input ends inside `header`.
    Truncated {
        /// The header being read.
        header: HeaderKind,
        /// Bytes the header needs.
        needed: usize,
        /// Bytes that were left.
        available: usize,
    },
    /// The output buffer is too short for `header` (or for the whole frame).
    BufferTooSmall {
        /// What was being written.
        header: HeaderKind,
        /// Bytes needed.
        needed: usize,
        /// Bytes the buffer had left.
        available: usize,
    },
    /// The frame's EtherType is not IPv4 (0x0800).
    NotIpv4 {
        /// The EtherType found.
        ethertype: u16,
    },
    /// The IPv4 version nibble is not 4.
    BadIpVersion {
        /// The version found.
        version: u8,
    },
    /// The IPv4 header length is not 5 words: options are not supported, since the card
    /// finds the BTH at a fixed frame offset.
    UnsupportedIpHeaderLength {
        /// The IHL found (32-bit words).
        ihl: u8,
    },
    /// The IPv4 header checksum does not match the header.
    BadIpChecksum {
        /// The checksum in the header.
        found: u16,
        /// The checksum the header's other bytes call for.
        computed: u16,
    },
    /// The IPv4 packet is a fragment; RoCE frames are never fragmented.
    Fragmented {
        /// The fragment offset (8-byte units).
        offset: u16,
        /// The more-fragments flag.
        more_fragments: bool,
    },
    /// The IPv4 protocol is not UDP (17).
    NotUdp {
        /// The protocol found.
        protocol: u8,
    },
    /// The UDP destination port is not RoCE v2's 4791.
    NotRoce {
        /// The port found.
        dst_port: u16,
    },
    /// Two statements of a length disagree.
    InconsistentLength {
        /// The length field that disagrees with the bytes actually present.
        field: LengthField,
        /// Its value.
        found: usize,
        /// The value the frame's bytes call for (for a FIRST packet's RETH.dlen: the
        /// payload length it must at least be).
        expected: usize,
    },
    /// The BTH opcode is not one this codec knows (not an RC opcode 0x00..=0x17).
    UnknownOpcode {
        /// The raw 8-bit opcode {transport, operation}.
        raw: u8,
    },
    /// The opcode is known but this wire profile has no frame layout for it (atomics).
    UnsupportedOpcode {
        /// The opcode.
        opcode: RdmaOpcode,
    },
    /// A header the opcode requires is absent (emit only).
    MissingHeader {
        /// The opcode.
        opcode: RdmaOpcode,
        /// The missing header.
        header: HeaderKind,
    },
    /// A header the opcode does not carry is present (emit only).
    UnexpectedHeader {
        /// The opcode.
        opcode: RdmaOpcode,
        /// The header that must be absent.
        header: HeaderKind,
    },
    /// The packet announces a payload (payload opcode and RETH.dlen != 0) but has none.
    MissingPayload {
        /// The opcode.
        opcode: RdmaOpcode,
        /// RETH.dlen.
        dma_len: u32,
    },
    /// Payload bytes follow a packet that carries none (no payload opcode, or RETH.dlen 0).
    UnexpectedPayload {
        /// The opcode.
        opcode: RdmaOpcode,
        /// Bytes after the header area.
        len: usize,
    },
    /// A field's value does not fit its wire width (emit only).
    FieldOutOfRange {
        /// The field, as `header.field`.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest value that fits.
        max: u64,
    },
    /// A frame that was expected to be an ACK/NAK carries another opcode.
    NotAck {
        /// The opcode found.
        opcode: RdmaOpcode,
    },
    /// The UDP destination port is not the driver's UD port ([`ud::UD_UDP_PORT`]).
    NotUd {
        /// The port found.
        dst_port: u16,
    },
    /// The ICRC trailer does not match the packet.
    BadIcrc {
        /// The ICRC in the frame.
        found: u32,
        /// The ICRC the packet's bytes call for.
        computed: u32,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated {
                header,
                needed,
                available,
            } => write!(
                f,
                "truncated {header}: needs {needed} bytes, {available} left"
            ),
            WireError::BufferTooSmall {
                header,
                needed,
                available,
            } => write!(
                f,
                "output buffer too small for {header}: needs {needed} bytes, {available} left"
            ),
            WireError::NotIpv4 { ethertype } => {
                write!(f, "EtherType {ethertype:#06x} is not IPv4")
            }
            WireError::BadIpVersion { version } => {
                write!(f, "IP version {version}, expected 4")
            }
            WireError::UnsupportedIpHeaderLength { ihl } => write!(
                f,
                "IPv4 header length {ihl} words, only 5 (no options) is supported"
            ),
            WireError::BadIpChecksum { found, computed } => write!(
                f,
                "bad IPv4 header checksum {found:#06x}, computed {computed:#06x}"
            ),
            WireError::Fragmented {
                offset,
                more_fragments,
            } => write!(
                f,
                "IPv4 fragment (offset {offset}, more fragments {more_fragments})"
            ),
            WireError::NotUdp { protocol } => write!(f, "IP protocol {protocol} is not UDP"),
            WireError::NotRoce { dst_port } => {
                write!(f, "UDP destination port {dst_port} is not RoCE v2 (4791)")
            }
            WireError::InconsistentLength {
                field,
                found,
                expected,
            } => write!(
                f,
                "inconsistent {field}: {found}, the frame calls for {expected}"
            ),
            WireError::UnknownOpcode { raw } => write!(f, "unknown BTH opcode {raw:#04x}"),
            WireError::UnsupportedOpcode { opcode } => {
                write!(f, "opcode {opcode:?} has no frame layout in this profile")
            }
            WireError::MissingHeader { opcode, header } => {
                write!(f, "opcode {opcode:?} needs a {header}")
            }
            WireError::UnexpectedHeader { opcode, header } => {
                write!(f, "opcode {opcode:?} carries no {header}")
            }
            WireError::MissingPayload { opcode, dma_len } => write!(
                f,
                "opcode {opcode:?} with DMA length {dma_len} has no payload"
            ),
            WireError::UnexpectedPayload { opcode, len } => write!(
                f,
                "{len} payload bytes after opcode {opcode:?}, which carries none here"
            ),
            WireError::FieldOutOfRange { field, value, max } => {
                write!(f, "{field} = {value:#x} does not fit (max {max:#x})")
            }
            WireError::NotAck { opcode } => {
                write!(f, "expected an ACK/NAK frame, found opcode {opcode:?}")
            }
            WireError::NotUd { dst_port } => write!(
                f,
                "UDP destination port {dst_port} is not the UD port ({})",
                ud::UD_UDP_PORT
            ),
            WireError::BadIcrc { found, computed } => {
                write!(f, "bad ICRC {found:#010x}, computed {computed:#010x}")
            }
        }
    }
}

/// Copies a wire layout struct out of the front of `bytes`.
fn read_layout<T: FromBytes>(bytes: &[u8], header: HeaderKind) -> Result<(T, &[u8]), WireError> {
    T::read_from_prefix(bytes).map_err(|_| WireError::Truncated {
        header,
        needed: core::mem::size_of::<T>(),
        available: bytes.len(),
    })
}

/// Writes a wire layout struct to the front of `out`; returns its size.
fn write_layout<T: IntoBytes + Immutable>(
    layout: &T,
    out: &mut [u8],
    header: HeaderKind,
) -> Result<usize, WireError> {
    let available = out.len();
    layout
        .write_to_prefix(out)
        .map_err(|_| WireError::BufferTooSmall {
            header,
            needed: core::mem::size_of::<T>(),
            available,
        })?;
    Ok(core::mem::size_of::<T>())
}

/// The largest value of a 24-bit field (PSN, QPN).
const U24_MAX: u32 = 0x00FF_FFFF;

/// A 24-bit big-endian field.
const fn u24_from_be(b: [u8; 3]) -> u32 {
    (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32
}

/// A 24-bit value as big-endian bytes, or an error naming `field` if it is wider.
fn u24_to_be(value: u32, field: &'static str) -> Result<[u8; 3], WireError> {
    if value > U24_MAX {
        return Err(WireError::FieldOutOfRange {
            field,
            value: value as u64,
            max: U24_MAX as u64,
        });
    }
    let [_, a, b, c] = value.to_be_bytes();
    Ok([a, b, c])
}

/// Checks that `value` fits in `bits` bits.
fn check_width(value: u8, bits: u32, field: &'static str) -> Result<u8, WireError> {
    let max = (1u16 << bits) - 1;
    if value as u16 > max {
        return Err(WireError::FieldOutOfRange {
            field,
            value: value as u64,
            max: max as u64,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u24_round_trip_and_range() {
        assert_eq!(u24_to_be(0x0345CD, "x"), Ok([0x03, 0x45, 0xCD]));
        assert_eq!(u24_from_be([0x03, 0x45, 0xCD]), 0x0345CD);
        assert_eq!(
            u24_to_be(0x0100_0000, "bth.psn"),
            Err(WireError::FieldOutOfRange {
                field: "bth.psn",
                value: 0x0100_0000,
                max: 0xFF_FFFF
            })
        );
    }

    #[test]
    fn errors_name_the_problem() {
        extern crate std;
        use std::string::ToString;
        let e = WireError::Truncated {
            header: HeaderKind::Reth,
            needed: 16,
            available: 3,
        };
        assert_eq!(e.to_string(), "truncated RETH: needs 16 bytes, 3 left");
        let e = WireError::InconsistentLength {
            field: LengthField::UdpLength,
            found: 60,
            expected: 62,
        };
        assert_eq!(
            e.to_string(),
            "inconsistent UDP length: 60, the frame calls for 62"
        );
    }
}
