//! The messages of the out-of-band channel (oob-channel.md, normative;
//! reference-latest.md 2.2 for the compatible record).
//!
//! A connection carries one [`Hello`] from the dialer, then receive-WR records back to back.
//! Everything is big-endian and fixed-length, so a reader always knows how many bytes the
//! next message takes.
//!
//! **Receive-WR record** (32 bytes, byte-compatible with the reference driver's RecvWrQpn):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..8 | wr_id |
//! | 8..16 | buffer address (0 for a WR with no SGE) |
//! | 16..20 | buffer length (0 with no SGE) |
//! | 20..24 | lkey, used as rkey by the sender (0 with no SGE) |
//! | 24..28 | the responder's own QPN (24 bits: byte 24 is zero) |
//! | 28..32 | zero |
//!
//! **Hello** (16 bytes, designed here; the reference has none):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..4 | magic `"BRDM"` (0x42 0x52 0x44 0x4D) |
//! | 4..6 | protocol version, u16; this codec speaks [`OOB_PROTOCOL_VERSION`] |
//! | 6..8 | zero (reserved; a different layout takes a new version) |
//! | 8..12 | capabilities, u32 bit flags ([`Capabilities`]); unknown bits are kept |
//! | 12..16 | the sender's device IPv4 address, network order |
//!
//! Decoding checks the magic first, then the version (a peer speaking another version
//! is refused with both versions named), then the reserved bytes.

use core::fmt;
use core::net::Ipv4Addr;

use bitflags::bitflags;

/// Length of a receive-WR record.
pub const RECV_WR_LEN: usize = 32;
/// Length of the hello.
pub const HELLO_LEN: usize = 16;
/// The hello's magic bytes.
pub const HELLO_MAGIC: [u8; 4] = *b"BRDM";
/// The protocol version this codec speaks.
pub const OOB_PROTOCOL_VERSION: u16 = 1;
/// The largest QPN a record may carry (24 bits).
pub const MAX_QPN: u32 = 0x00FF_FFFF;

/// Which message an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OobMessageKind {
    /// The hello.
    Hello,
    /// A receive-WR record.
    RecvWr,
}

impl fmt::Display for OobMessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OobMessageKind::Hello => "hello",
            OobMessageKind::RecvWr => "receive-WR record",
        })
    }
}

/// Why bytes from the out-of-band channel were refused. Any of these means the peer does
/// not speak this protocol (or the stream is corrupt): log it and close the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OobError {
    /// The input ends inside a message.
    Truncated {
        /// The message being read.
        message: OobMessageKind,
        /// Bytes the message needs.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The connection does not start with the hello magic.
    BadMagic {
        /// The first four bytes received.
        found: [u8; 4],
    },
    /// The peer speaks another protocol version.
    UnsupportedVersion {
        /// The version the peer announced.
        theirs: u16,
        /// The version this codec speaks.
        ours: u16,
    },
    /// A field that must be zero is not.
    ReservedNotZero {
        /// The message.
        message: OobMessageKind,
        /// Byte offset of the field in the message.
        offset: usize,
        /// The field's value.
        value: u32,
    },
    /// A record names a QPN wider than 24 bits.
    QpnOutOfRange {
        /// The value found (or given, when encoding).
        qpn: u32,
    },
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OobError::Truncated {
                message,
                needed,
                available,
            } => write!(
                f,
                "truncated OOB {message}: needs {needed} bytes, {available} available"
            ),
            OobError::BadMagic { found } => write!(
                f,
                "OOB connection does not start with the hello magic \"BRDM\" (found {:02x} {:02x} {:02x} {:02x})",
                found[0], found[1], found[2], found[3]
            ),
            OobError::UnsupportedVersion { theirs, ours } => write!(
                f,
                "peer speaks OOB protocol version {theirs}, this driver speaks version {ours}"
            ),
            OobError::ReservedNotZero {
                message,
                offset,
                value,
            } => write!(
                f,
                "OOB {message}: reserved field at byte {offset} is {value:#x}, must be 0"
            ),
            OobError::QpnOutOfRange { qpn } => {
                write!(f, "OOB record QPN {qpn:#x} is wider than 24 bits")
            }
        }
    }
}

bitflags! {
    /// What the sender of a hello supports. Bits this driver does not know are kept, so a
    /// newer peer's hello decodes; act only on bits both sides announce.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Capabilities: u32 {
        /// The sender announces receive WRs with the 32-byte record.
        const RECV_WR_RECORDS = 1 << 0;
        // Bits 1..31 are reserved for later capabilities (for example a longer, versioned
        // record); a peer that does not know a bit ignores it.
    }
}

impl Capabilities {
    /// What this driver supports.
    pub const OURS: Capabilities = Capabilities::RECV_WR_RECORDS;
}

/// The first message on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    /// What the sender supports.
    pub capabilities: Capabilities,
    /// The sender's device IP (the listener checks it against the connection's source).
    pub device_ip: Ipv4Addr,
}

impl Hello {
    /// The hello of this driver for `device_ip`.
    pub const fn new(device_ip: Ipv4Addr) -> Self {
        Hello {
            capabilities: Capabilities::OURS,
            device_ip,
        }
    }

    /// The 16 bytes on the wire.
    pub fn to_bytes(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        let (magic, rest) = out.split_at_mut(4);
        magic.copy_from_slice(&HELLO_MAGIC);
        let (version, rest) = rest.split_at_mut(2);
        version.copy_from_slice(&OOB_PROTOCOL_VERSION.to_be_bytes());
        let (_reserved, rest) = rest.split_at_mut(2);
        let (caps, ip) = rest.split_at_mut(4);
        caps.copy_from_slice(&self.capabilities.bits().to_be_bytes());
        ip.copy_from_slice(&self.device_ip.octets());
        out
    }

    /// Decodes a hello from the front of `bytes`; returns it and the bytes after it.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        // The magic is checked before the length, so that garbage is named as such even
        // when it is short.
        let magic_len = bytes.len().min(HELLO_MAGIC.len());
        if bytes.get(..magic_len) != HELLO_MAGIC.get(..magic_len) {
            let mut found = [0u8; 4];
            found[..magic_len].copy_from_slice(&bytes[..magic_len]);
            return Err(OobError::BadMagic { found });
        }
        let (msg, rest) = split::<HELLO_LEN>(bytes, OobMessageKind::Hello)?;
        let [_, _, _, _, v0, v1, r0, r1, c0, c1, c2, c3, i0, i1, i2, i3] = msg;
        let version = u16::from_be_bytes([v0, v1]);
        if version != OOB_PROTOCOL_VERSION {
            return Err(OobError::UnsupportedVersion {
                theirs: version,
                ours: OOB_PROTOCOL_VERSION,
            });
        }
        let reserved = u16::from_be_bytes([r0, r1]);
        if reserved != 0 {
            return Err(OobError::ReservedNotZero {
                message: OobMessageKind::Hello,
                offset: 6,
                value: reserved as u32,
            });
        }
        let hello = Hello {
            capabilities: Capabilities::from_bits_retain(u32::from_be_bytes([c0, c1, c2, c3])),
            device_ip: Ipv4Addr::new(i0, i1, i2, i3),
        };
        Ok((hello, rest))
    }
}

/// A receive WR as announced over the out-of-band channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RecvWr {
    /// The receiver's work-request id.
    pub wr_id: u64,
    /// Receive buffer address (0 with no SGE).
    pub addr: u64,
    /// Receive buffer length (0 with no SGE).
    pub length: u32,
    /// The buffer's lkey, used as rkey by the sender (0 with no SGE).
    pub lkey: u32,
    /// The responder's own QPN (24 bits).
    pub qpn: u32,
}

impl RecvWr {
    /// The 32-byte record. Fails if `qpn` is wider than 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; RECV_WR_LEN], OobError> {
        if self.qpn > MAX_QPN {
            return Err(OobError::QpnOutOfRange { qpn: self.qpn });
        }
        let mut out = [0u8; RECV_WR_LEN];
        let (wr_id, rest) = out.split_at_mut(8);
        wr_id.copy_from_slice(&self.wr_id.to_be_bytes());
        let (addr, rest) = rest.split_at_mut(8);
        addr.copy_from_slice(&self.addr.to_be_bytes());
        let (length, rest) = rest.split_at_mut(4);
        length.copy_from_slice(&self.length.to_be_bytes());
        let (lkey, rest) = rest.split_at_mut(4);
        lkey.copy_from_slice(&self.lkey.to_be_bytes());
        let (qpn, _zero) = rest.split_at_mut(4);
        qpn.copy_from_slice(&self.qpn.to_be_bytes());
        Ok(out)
    }

    /// Decodes a record from the front of `bytes`; returns it and the bytes after it.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let (msg, rest) = split::<RECV_WR_LEN>(bytes, OobMessageKind::RecvWr)?;
        let be32 = |at: usize| u32::from_be_bytes([msg[at], msg[at + 1], msg[at + 2], msg[at + 3]]);
        let be64 = |at: usize| (be32(at) as u64) << 32 | be32(at + 4) as u64;
        let zero = be32(28);
        if zero != 0 {
            return Err(OobError::ReservedNotZero {
                message: OobMessageKind::RecvWr,
                offset: 28,
                value: zero,
            });
        }
        let qpn = be32(24);
        if qpn > MAX_QPN {
            return Err(OobError::QpnOutOfRange { qpn });
        }
        let wr = RecvWr {
            wr_id: be64(0),
            addr: be64(8),
            length: be32(16),
            lkey: be32(20),
            qpn,
        };
        Ok((wr, rest))
    }
}

/// The first `N` bytes of `bytes` as an array, and the rest.
fn split<const N: usize>(
    bytes: &[u8],
    message: OobMessageKind,
) -> Result<([u8; N], &[u8]), OobError> {
    match bytes.split_first_chunk::<N>() {
        Some((head, rest)) => Ok((*head, rest)),
        None => Err(OobError::Truncated {
            message,
            needed: N,
            available: bytes.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_fields_in_place() {
        let wr = RecvWr {
            wr_id: 0x0102_0304_0506_0708,
            addr: 0x0000_7F12_3460_0040,
            length: 0x0001_0000,
            lkey: 0x001F_FEA6,
            qpn: 0x0123AB,
        };
        let bytes = wr.to_bytes().unwrap();
        assert_eq!(bytes[..8], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(bytes[24..], [0, 0x01, 0x23, 0xAB, 0, 0, 0, 0]);
        assert_eq!(RecvWr::parse(&bytes), Ok((wr, &[][..])));
    }

    #[test]
    fn record_refuses_garbage() {
        let mut bytes = RecvWr::default().to_bytes().unwrap();
        bytes[31] = 1;
        assert_eq!(
            RecvWr::parse(&bytes),
            Err(OobError::ReservedNotZero {
                message: OobMessageKind::RecvWr,
                offset: 28,
                value: 1
            })
        );
        bytes[31] = 0;
        bytes[24] = 0x80;
        assert_eq!(
            RecvWr::parse(&bytes),
            Err(OobError::QpnOutOfRange { qpn: 0x8000_0000 })
        );
        assert_eq!(
            RecvWr::parse(&bytes[..31]),
            Err(OobError::Truncated {
                message: OobMessageKind::RecvWr,
                needed: 32,
                available: 31
            })
        );
        let wide = RecvWr {
            qpn: 0x0100_0000,
            ..RecvWr::default()
        };
        assert_eq!(
            wide.to_bytes(),
            Err(OobError::QpnOutOfRange { qpn: 0x0100_0000 })
        );
    }

    #[test]
    fn hello_checks_magic_then_version_and_keeps_unknown_capabilities() {
        let hello = Hello {
            capabilities: Capabilities::from_bits_retain(0x8000_0001),
            device_ip: Ipv4Addr::new(17, 34, 51, 10),
        };
        let bytes = hello.to_bytes();
        assert_eq!(Hello::parse(&bytes), Ok((hello, &[][..])));

        assert_eq!(
            Hello::parse(b"GET / HTTP/1.1\r\n"),
            Err(OobError::BadMagic { found: *b"GET " })
        );
        assert_eq!(
            Hello::parse(b"X"),
            Err(OobError::BadMagic {
                found: [b'X', 0, 0, 0]
            })
        );
        assert!(matches!(
            Hello::parse(b"BRD"),
            Err(OobError::Truncated {
                needed: 16,
                available: 3,
                ..
            })
        ));
        let mut v2 = bytes;
        v2[5] = 2;
        let err = Hello::parse(&v2).unwrap_err();
        assert_eq!(err, OobError::UnsupportedVersion { theirs: 2, ours: 1 });
        extern crate std;
        use std::string::ToString;
        assert_eq!(
            err.to_string(),
            "peer speaks OOB protocol version 2, this driver speaks version 1"
        );
    }
}
