//! The messages of the out-of-band channel (oob-channel.md, normative;
//! reference-latest.md 2.2 for the compatible record).
//!
//! A connection carries one [`Hello`] and one [`Proof`] from each side, then 32-byte
//! records back to back.
//! Everything is big-endian and fixed-length, so a reader always knows how many bytes the
//! next message takes. Bytes 28..32 of a record are its kind ([`RecordKind`]): 0 is the
//! compatible receive-WR record, whose last four bytes the reference driver sends as zero;
//! an unknown kind is refused ([`OobError::UnknownRecordKind`]).
//!
//! **Receive-WR record** (kind 0, byte-compatible with the reference driver's RecvWrQpn):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..8 | wr_id |
//! | 8..16 | buffer address (0 for a WR with no SGE) |
//! | 16..20 | buffer length (0 with no SGE) |
//! | 20..24 | lkey, used as rkey by the sender (0 with no SGE) |
//! | 24..28 | the responder's own QPN (24 bits: byte 24 is zero) |
//! | 28..32 | kind 0 |
//!
//! **Receive-WR-too-short record** (kind 1, designed here; sent only to a peer whose hello
//! announces [`Capabilities::LENGTH_ERRORS`]): the requester matched a SEND with an
//! announced receive WR whose buffer is shorter than the SEND. The requester completes the
//! SEND with REM_INV_REQ_ERR and writes nothing; on this record the receiver completes that
//! receive WR with a local length error and moves its QP to the error state.
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..8 | wr_id of the receive WR (as announced) |
//! | 8..16 | zero |
//! | 16..20 | the SEND's length |
//! | 20..24 | zero |
//! | 24..28 | the requester's own QPN (24 bits: byte 24 is zero) |
//! | 28..32 | kind 1 |
//!
//! Both kinds name the sender's own QPN, so the receiver dispatches both the same way: to
//! its QP whose peer QPN is that QPN and whose peer IP is the connection's source.
//!
//! **Atomic request, operands and reply** (kinds 2, 3 and 4, designed here; sent only to a
//! peer whose hello announces [`Capabilities::ATOMICS`]): the layouts are in `atomic.rs`
//! ([`AtomicRequest`], [`AtomicReply`]). A request is two records back to back (kind 2 then
//! kind 3), so [`Record::to_bytes`] gives 32 or 64 bytes ([`EncodedRecord`]).
//!
//! **Access check and verdict** (kinds 5 and 6, designed here; sent only to a peer whose
//! hello announces [`Capabilities::ACCESS_CHECKS`]): the layouts are in `check.rs`
//! ([`AccessCheck`], [`AccessVerdict`]).
//!
//! **Hello** (32 bytes in version 2, designed here; the reference has none):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..4 | magic `"BRDM"` (0x42 0x52 0x44 0x4D) |
//! | 4..6 | protocol version, u16; this codec speaks [`OOB_PROTOCOL_VERSION`] |
//! | 6..8 | zero (reserved; a different layout takes a new version) |
//! | 8..12 | capabilities, u32 bit flags ([`Capabilities`]); unknown bits are kept |
//! | 12..16 | the sender's device IPv4 address, network order |
//! | 16..32 | a nonce the sender drew at random for this connection |
//!
//! **Proof** (32 bytes, version 2): a keyed hash the platform computes over both hellos
//! with the devices' shared secret, so that each side proves it knows the secret for this
//! connection's nonces ([`Proof`] is opaque here; platform-linux's `oob` module defines
//! the hash). The dialer sends its hello, the listener answers with its own, the dialer
//! sends its proof, and the listener sends its proof when it accepts the connection.
//!
//! Decoding checks the magic first, then the version, as soon as those bytes arrive (a
//! peer speaking another version is refused with both versions named), then the
//! reserved bytes. Version 1 was the same hello without the nonce (16 bytes) and no
//! proof: a version-1 peer is refused like any other version, because falling back to an
//! unauthenticated hello would let anyone claim to be an old peer.

use core::fmt;
use core::net::Ipv4Addr;

use bitflags::bitflags;

use super::atomic::{AtomicReply, AtomicRequest, ATOMIC_REQUEST_LEN};
use super::check::{AccessCheck, AccessVerdict};

/// Length of a record (every kind).
pub const RECV_WR_LEN: usize = 32;
/// Length of the hello.
pub const HELLO_LEN: usize = 32;
/// Length of the hello's nonce (bytes 16..32).
pub const NONCE_LEN: usize = 16;
/// Length of a proof.
pub const PROOF_LEN: usize = 32;
/// The hello's magic bytes.
pub const HELLO_MAGIC: [u8; 4] = *b"BRDM";
/// The protocol version this codec speaks: 2 adds the nonce and the proofs.
pub const OOB_PROTOCOL_VERSION: u16 = 2;
/// The largest QPN a record may carry (24 bits).
pub const MAX_QPN: u32 = 0x00FF_FFFF;

/// Which message an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OobMessageKind {
    /// The hello.
    Hello,
    /// The proof that follows the hello.
    Proof,
    /// A record (a receive-WR record unless its kind says otherwise).
    RecvWr,
    /// A receive-WR-too-short record.
    RecvTooShort,
    /// An atomic request (its two records).
    AtomicRequest,
    /// An atomic reply.
    AtomicReply,
    /// An access check.
    AccessCheck,
    /// An access verdict.
    AccessVerdict,
}

impl fmt::Display for OobMessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OobMessageKind::Hello => "hello",
            OobMessageKind::Proof => "proof",
            OobMessageKind::RecvWr => "receive-WR record",
            OobMessageKind::RecvTooShort => "receive-WR-too-short record",
            OobMessageKind::AtomicRequest => "atomic request",
            OobMessageKind::AtomicReply => "atomic reply",
            OobMessageKind::AccessCheck => "access check",
            OobMessageKind::AccessVerdict => "access verdict",
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
    /// A record's kind (bytes 28..32) is none this driver knows.
    UnknownRecordKind {
        /// The kind found.
        kind: u32,
    },
    /// The two records of an atomic request do not belong together.
    AtomicPair {
        /// What is wrong.
        what: &'static str,
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
            OobError::UnknownRecordKind { kind } => write!(
                f,
                "OOB record of unknown kind {kind:#x} (bytes 28..32); this driver knows 0 \
                 (receive WR), 1 (receive WR too short), 2 and 3 (atomic request and its \
                 operands), 4 (atomic reply), 5 (access check) and 6 (access verdict)"
            ),
            OobError::AtomicPair { what } => write!(f, "OOB atomic request: {what}"),
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
        /// The sender takes receive-WR-too-short records (kind 1): a peer may tell it that
        /// one of its receive WRs was too short for a SEND. A peer without this bit is
        /// never sent one.
        const LENGTH_ERRORS = 1 << 1;
        /// The sender executes atomic requests (kinds 2 and 3) and sends atomic replies
        /// (kind 4). A peer without this bit is never sent a request: the transport
        /// answers it with [`AtomicStatus::Unsupported`](super::AtomicStatus::Unsupported).
        const ATOMICS = 1 << 2;
        /// The sender answers access checks (kind 5) with verdicts (kind 6). A peer
        /// without this bit is never sent a check (the transport withholds it).
        const ACCESS_CHECKS = 1 << 3;
        /// The sender carries out remote invalidations (access checks of op 3, `check.rs`)
        /// for the SEND_WITH_INVs of its peers. A peer without this bit is never sent one:
        /// a SEND_WITH_INV to it is refused at post.
        const REMOTE_INVALIDATE = 1 << 4;
        // Bits 5..31 are reserved for later capabilities; a peer that does not know a bit
        // ignores it.
    }
}

impl Capabilities {
    /// What this driver supports.
    pub const OURS: Capabilities = Capabilities::RECV_WR_RECORDS
        .union(Capabilities::LENGTH_ERRORS)
        .union(Capabilities::ATOMICS)
        .union(Capabilities::ACCESS_CHECKS)
        .union(Capabilities::REMOTE_INVALIDATE);
}

/// The first message on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    /// What the sender supports.
    pub capabilities: Capabilities,
    /// The sender's device IP (the listener checks it against the connection's source).
    pub device_ip: Ipv4Addr,
    /// Drawn at random by the sender for this connection; the proofs cover it.
    pub nonce: [u8; NONCE_LEN],
}

impl Hello {
    /// The hello of this driver for `device_ip`, with a zero nonce ([`Hello::with_nonce`]).
    pub const fn new(device_ip: Ipv4Addr) -> Self {
        Hello {
            capabilities: Capabilities::OURS,
            device_ip,
            nonce: [0; NONCE_LEN],
        }
    }

    /// The same hello with `nonce`.
    pub const fn with_nonce(self, nonce: [u8; NONCE_LEN]) -> Self {
        Hello { nonce, ..self }
    }

    /// The 16 bytes on the wire.
    pub fn to_bytes(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        let (magic, rest) = out.split_at_mut(4);
        magic.copy_from_slice(&HELLO_MAGIC);
        let (version, rest) = rest.split_at_mut(2);
        version.copy_from_slice(&OOB_PROTOCOL_VERSION.to_be_bytes());
        let (_reserved, rest) = rest.split_at_mut(2);
        let (caps, rest) = rest.split_at_mut(4);
        caps.copy_from_slice(&self.capabilities.bits().to_be_bytes());
        let (ip, nonce) = rest.split_at_mut(4);
        ip.copy_from_slice(&self.device_ip.octets());
        nonce.copy_from_slice(&self.nonce);
        out
    }

    /// Decodes a hello from the front of `bytes`; returns it and the bytes after it.
    ///
    /// The magic, the version and the reserved bytes are checked on what is there before
    /// the length, so that garbage and another version (a version-1 hello is 16 bytes)
    /// are named as such even when the input is short.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let magic_len = bytes.len().min(HELLO_MAGIC.len());
        if bytes.get(..magic_len) != HELLO_MAGIC.get(..magic_len) {
            let mut found = [0u8; 4];
            found[..magic_len].copy_from_slice(&bytes[..magic_len]);
            return Err(OobError::BadMagic { found });
        }
        if let Some(&[v0, v1]) = bytes.get(4..6) {
            let version = u16::from_be_bytes([v0, v1]);
            if version != OOB_PROTOCOL_VERSION {
                return Err(OobError::UnsupportedVersion {
                    theirs: version,
                    ours: OOB_PROTOCOL_VERSION,
                });
            }
        }
        if let Some(&[r0, r1]) = bytes.get(6..8) {
            let reserved = u16::from_be_bytes([r0, r1]);
            if reserved != 0 {
                return Err(OobError::ReservedNotZero {
                    message: OobMessageKind::Hello,
                    offset: 6,
                    value: reserved as u32,
                });
            }
        }
        let (msg, rest) = split::<HELLO_LEN>(bytes, OobMessageKind::Hello)?;
        let (head, nonce) = msg.split_at(16);
        let field = |at: usize| [0, 1, 2, 3].map(|k| head.get(at + k).copied().unwrap_or(0));
        let mut hello = Hello {
            capabilities: Capabilities::from_bits_retain(u32::from_be_bytes(field(8))),
            device_ip: Ipv4Addr::from(field(12)),
            nonce: [0; NONCE_LEN],
        };
        hello.nonce.copy_from_slice(nonce);
        Ok((hello, rest))
    }
}

/// The proof of the shared secret that follows each side's hello: 32 bytes the platform
/// computes and checks (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Proof(pub [u8; PROOF_LEN]);

impl Proof {
    /// The 32 bytes on the wire.
    pub const fn to_bytes(&self) -> [u8; PROOF_LEN] {
        self.0
    }

    /// Takes a proof from the front of `bytes`; returns it and the bytes after it.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let (msg, rest) = split::<PROOF_LEN>(bytes, OobMessageKind::Proof)?;
        Ok((Proof(msg), rest))
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
        let fields = [self.addr, self.length as u64, self.lkey as u64];
        encode(self.wr_id, fields, self.qpn, RecordKind::RecvWr)
    }

    /// Decodes a receive-WR record (kind 0) from the front of `bytes`; returns it and the
    /// bytes after it. A record of another kind is refused: [`Record::parse`] takes any.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let (msg, rest) = split::<RECV_WR_LEN>(bytes, OobMessageKind::RecvWr)?;
        let f = Fields::check(&msg, OobMessageKind::RecvWr, 0)?;
        let wr = RecvWr {
            wr_id: f.be64(0),
            addr: f.be64(8),
            length: f.be32(16),
            lkey: f.be32(20),
            qpn: f.qpn,
        };
        Ok((wr, rest))
    }
}

/// A receive WR the requester found too short for a SEND (record kind 1): the receiver
/// completes it with a local length error and moves its QP to the error state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RecvTooShort {
    /// The receiver's work-request id, as announced.
    pub wr_id: u64,
    /// The length of the SEND that did not fit.
    pub send_len: u32,
    /// The requester's own QPN (24 bits).
    pub qpn: u32,
}

impl RecvTooShort {
    /// The 32-byte record. Fails if `qpn` is wider than 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; RECV_WR_LEN], OobError> {
        let fields = [0, self.send_len as u64, 0];
        encode(self.wr_id, fields, self.qpn, RecordKind::RecvTooShort)
    }

    /// Decodes a receive-WR-too-short record (kind 1) from the front of `bytes`; returns it
    /// and the bytes after it. The zero fields must be zero.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let message = OobMessageKind::RecvTooShort;
        let (msg, rest) = split::<RECV_WR_LEN>(bytes, message)?;
        let f = Fields::check(&msg, message, RecordKind::RecvTooShort as u32)?;
        for (offset, value) in [(8, f.be32(8)), (12, f.be32(12)), (20, f.be32(20))] {
            if value != 0 {
                return Err(OobError::ReservedNotZero {
                    message,
                    offset,
                    value,
                });
            }
        }
        let rec = RecvTooShort {
            wr_id: f.be64(0),
            send_len: f.be32(16),
            qpn: f.qpn,
        };
        Ok((rec, rest))
    }
}

/// The kind of a record: bytes 28..32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RecordKind {
    /// A receive-WR record (the compatible format: these bytes are zero).
    RecvWr = 0,
    /// A receive-WR-too-short record.
    RecvTooShort = 1,
    /// An atomic request (followed by its operands).
    AtomicRequest = 2,
    /// The operands of the atomic request before it.
    AtomicOperands = 3,
    /// An atomic reply.
    AtomicReply = 4,
    /// An access check (`check.rs`).
    AccessCheck = 5,
    /// An access verdict.
    AccessVerdict = 6,
}

impl RecordKind {
    /// The kind in bytes 28..32 of a record's first 32 bytes (`None`: fewer bytes).
    pub fn of(record: &[u8]) -> Option<u32> {
        let k = record.get(28..RECV_WR_LEN)?;
        Some(u32::from_be_bytes([k[0], k[1], k[2], k[3]]))
    }

    /// How many bytes the record whose first 32 bytes are `head` takes: 64 for an atomic
    /// request (it brings its operands), else 32.
    pub fn record_len(head: &[u8]) -> usize {
        if Self::of(head) == Some(RecordKind::AtomicRequest as u32) {
            ATOMIC_REQUEST_LEN
        } else {
            RECV_WR_LEN
        }
    }
}

/// A record of any known kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Record {
    /// An announced receive WR.
    RecvWr(RecvWr),
    /// A receive WR that was too short for a SEND.
    RecvTooShort(RecvTooShort),
    /// An atomic request (two records on the wire).
    AtomicRequest(AtomicRequest),
    /// An atomic reply.
    AtomicReply(AtomicReply),
    /// An access check.
    AccessCheck(AccessCheck),
    /// An access verdict.
    AccessVerdict(AccessVerdict),
}

/// The bytes of an encoded [`Record`]: 32, or 64 for an atomic request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodedRecord {
    bytes: [u8; ATOMIC_REQUEST_LEN],
    len: usize,
}

impl EncodedRecord {
    fn new(head: &[u8]) -> Self {
        let mut bytes = [0u8; ATOMIC_REQUEST_LEN];
        let len = head.len().min(ATOMIC_REQUEST_LEN);
        bytes[..len].copy_from_slice(&head[..len]);
        EncodedRecord { bytes, len }
    }
}

impl core::ops::Deref for EncodedRecord {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }
}

impl Record {
    /// The record's bytes (32, or 64 for an atomic request). Fails if a QPN is wider than
    /// 24 bits.
    pub fn to_bytes(&self) -> Result<EncodedRecord, OobError> {
        Ok(match self {
            Record::RecvWr(wr) => EncodedRecord::new(&wr.to_bytes()?),
            Record::RecvTooShort(r) => EncodedRecord::new(&r.to_bytes()?),
            Record::AtomicRequest(r) => EncodedRecord::new(&r.to_bytes()?),
            Record::AtomicReply(r) => EncodedRecord::new(&r.to_bytes()?),
            Record::AccessCheck(r) => EncodedRecord::new(&r.to_bytes()?),
            Record::AccessVerdict(r) => EncodedRecord::new(&r.to_bytes()?),
        })
    }

    /// Decodes a record of any known kind from the front of `bytes`; returns it and the
    /// bytes after it. An unknown kind is [`OobError::UnknownRecordKind`]; operands
    /// (kind 3) without their request are [`OobError::AtomicPair`].
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let (msg, _) = split::<RECV_WR_LEN>(bytes, OobMessageKind::RecvWr)?;
        const RECV_WR: u32 = RecordKind::RecvWr as u32;
        const RECV_TOO_SHORT: u32 = RecordKind::RecvTooShort as u32;
        const ATOMIC_REQUEST: u32 = RecordKind::AtomicRequest as u32;
        const ATOMIC_OPERANDS: u32 = RecordKind::AtomicOperands as u32;
        const ATOMIC_REPLY: u32 = RecordKind::AtomicReply as u32;
        const ACCESS_CHECK: u32 = RecordKind::AccessCheck as u32;
        const ACCESS_VERDICT: u32 = RecordKind::AccessVerdict as u32;
        match RecordKind::of(&msg).unwrap_or(0) {
            RECV_WR => RecvWr::parse(bytes).map(|(wr, rest)| (Record::RecvWr(wr), rest)),
            RECV_TOO_SHORT => {
                RecvTooShort::parse(bytes).map(|(r, rest)| (Record::RecvTooShort(r), rest))
            }
            ATOMIC_REQUEST => {
                AtomicRequest::parse(bytes).map(|(r, rest)| (Record::AtomicRequest(r), rest))
            }
            ATOMIC_OPERANDS => Err(OobError::AtomicPair {
                what: "operands (kind 3) without their atomic request (kind 2) before them",
            }),
            ATOMIC_REPLY => {
                AtomicReply::parse(bytes).map(|(r, rest)| (Record::AtomicReply(r), rest))
            }
            ACCESS_CHECK => {
                AccessCheck::parse(bytes).map(|(r, rest)| (Record::AccessCheck(r), rest))
            }
            ACCESS_VERDICT => {
                AccessVerdict::parse(bytes).map(|(r, rest)| (Record::AccessVerdict(r), rest))
            }
            kind => Err(OobError::UnknownRecordKind { kind }),
        }
    }
}

/// A record's bytes with its kind and QPN checked.
pub(super) struct Fields<'a> {
    msg: &'a [u8; RECV_WR_LEN],
    pub(super) qpn: u32,
}

impl<'a> Fields<'a> {
    /// Checks that bytes 28..32 are `kind` and the QPN fits 24 bits.
    pub(super) fn check(
        msg: &'a [u8; RECV_WR_LEN],
        message: OobMessageKind,
        kind: u32,
    ) -> Result<Self, OobError> {
        let mut f = Fields { msg, qpn: 0 };
        let found = f.be32(28);
        if found != kind {
            // A receive-WR record's kind is the reference driver's zero field.
            return Err(if kind == 0 {
                OobError::ReservedNotZero {
                    message,
                    offset: 28,
                    value: found,
                }
            } else {
                OobError::UnknownRecordKind { kind: found }
            });
        }
        f.qpn = f.be32(24);
        if f.qpn > MAX_QPN {
            return Err(OobError::QpnOutOfRange { qpn: f.qpn });
        }
        Ok(f)
    }

    pub(super) fn be32(&self, at: usize) -> u32 {
        let b = |k: usize| self.msg.get(at + k).copied().unwrap_or(0);
        u32::from_be_bytes([b(0), b(1), b(2), b(3)])
    }

    pub(super) fn be64(&self, at: usize) -> u64 {
        (self.be32(at) as u64) << 32 | self.be32(at + 4) as u64
    }
}

/// A record: wr_id, then three fields (8, 4 and 4 bytes at 8..24), the QPN and the kind.
pub(super) fn encode(
    wr_id: u64,
    fields: [u64; 3],
    qpn: u32,
    kind: RecordKind,
) -> Result<[u8; RECV_WR_LEN], OobError> {
    if qpn > MAX_QPN {
        return Err(OobError::QpnOutOfRange { qpn });
    }
    let [addr, length, key] = fields;
    let mut out = [0u8; RECV_WR_LEN];
    let (w, rest) = out.split_at_mut(8);
    w.copy_from_slice(&wr_id.to_be_bytes());
    let (a, rest) = rest.split_at_mut(8);
    a.copy_from_slice(&addr.to_be_bytes());
    let (l, rest) = rest.split_at_mut(4);
    l.copy_from_slice(&(length as u32).to_be_bytes());
    let (k, rest) = rest.split_at_mut(4);
    k.copy_from_slice(&(key as u32).to_be_bytes());
    let (q, kind_bytes) = rest.split_at_mut(4);
    q.copy_from_slice(&qpn.to_be_bytes());
    kind_bytes.copy_from_slice(&(kind as u32).to_be_bytes());
    Ok(out)
}

/// The first `N` bytes of `bytes` as an array, and the rest.
pub(super) fn split<const N: usize>(
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
#[path = "codec_tests.rs"]
mod tests;
