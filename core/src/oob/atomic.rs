//! The atomic records of the out-of-band channel (designed here; the card has no atomic
//! engine, so the responder's driver executes fetch-and-add and compare-and-swap on its
//! registered memory and answers over this channel). They go only to a peer whose hello
//! announces [`Capabilities::ATOMICS`](super::Capabilities::ATOMICS); a transport that
//! holds a request for a peer without it answers it itself with
//! [`AtomicStatus::Unsupported`] ([`AtomicReply::refusal`]).
//!
//! Every record stays 32 bytes with its kind at 28..32. A request takes two records back to
//! back, because its operands do not fit one: the **atomic request** (kind 2) and its
//! **operands** (kind 3), which must follow it at once and repeat its sequence number and
//! QPN. The reply is one record (kind 4).
//!
//! **Atomic request** (kind 2):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..8 | remote address (8-byte aligned) |
//! | 8..12 | rkey |
//! | 12..16 | sequence number: per QP, from 0 at RESET, one per atomic in posting order |
//! | 16..20 | the responder's QPN, the destination (24 bits: byte 16 is zero) |
//! | 20 | operation: 0 fetch-and-add, 1 compare-and-swap |
//! | 21..24 | zero |
//! | 24..28 | the requester's own QPN (24 bits) |
//! | 28..32 | kind 2 |
//!
//! **Atomic operands** (kind 3, right after its request):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..8 | compare (compare-and-swap) or add (fetch-and-add) |
//! | 8..16 | swap (compare-and-swap); zero for fetch-and-add |
//! | 16..20 | the request's sequence number |
//! | 20..24 | zero |
//! | 24..28 | the requester's own QPN |
//! | 28..32 | kind 3 |
//!
//! **Atomic reply** (kind 4):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..8 | the original value at the remote address (zero unless the status is 0) |
//! | 8..12 | the request's sequence number |
//! | 12..16 | status ([`AtomicStatus`]: 0 done, 1 access error, 2 invalid request, 3 operation error, 4 unsupported) |
//! | 16..20 | the requester's QPN, the destination (24 bits) |
//! | 20..24 | zero |
//! | 24..28 | the responder's own QPN (24 bits) |
//! | 28..32 | kind 4 |
//!
//! Values are big-endian on the wire like every field; the responder applies them to the
//! 64-bit integer in its own memory as its CPU reads it.

use super::codec::{encode, split, Fields, OobError, OobMessageKind, RecordKind, MAX_QPN};
use super::RECV_WR_LEN;

/// Length of an atomic request: its two records.
pub const ATOMIC_REQUEST_LEN: usize = 2 * RECV_WR_LEN;

/// What an atomic does to the 8 bytes at the remote address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Adds `add` (wrapping); the original value comes back.
    FetchAdd {
        /// The addend.
        add: u64,
    },
    /// Stores `swap` if the value equals `compare`; the original value comes back.
    CompareSwap {
        /// The value expected.
        compare: u64,
        /// The value stored when it matches.
        swap: u64,
    },
}

impl AtomicOp {
    /// The value the 8 bytes hold after the operation, given the `old` one.
    #[inline]
    pub const fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::FetchAdd { add } => old.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
        }
    }
}

/// An atomic the requester's driver asks the responder's driver to execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicRequest {
    /// The requester's own QPN (24 bits).
    pub qpn: u32,
    /// The responder's QPN (24 bits).
    pub dest_qpn: u32,
    /// The per-QP sequence number (a resent request keeps its number).
    pub seq: u32,
    /// The remote address.
    pub raddr: u64,
    /// The remote key.
    pub rkey: u32,
    /// The operation and its operands.
    pub op: AtomicOp,
}

impl Default for AtomicRequest {
    fn default() -> Self {
        AtomicRequest {
            qpn: 0,
            dest_qpn: 0,
            seq: 0,
            raddr: 0,
            rkey: 0,
            op: AtomicOp::FetchAdd { add: 0 },
        }
    }
}

const OP_FETCH_ADD: u64 = 0;
const OP_COMPARE_SWAP: u64 = 1;

impl AtomicRequest {
    /// The two records. Fails if a QPN is wider than 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; ATOMIC_REQUEST_LEN], OobError> {
        if self.dest_qpn > MAX_QPN {
            return Err(OobError::QpnOutOfRange { qpn: self.dest_qpn });
        }
        let (code, compare_add, swap) = match self.op {
            AtomicOp::FetchAdd { add } => (OP_FETCH_ADD, add, 0),
            AtomicOp::CompareSwap { compare, swap } => (OP_COMPARE_SWAP, compare, swap),
        };
        let keyed = (self.rkey as u64) << 32 | self.seq as u64;
        let head = [keyed, self.dest_qpn as u64, code << 24];
        let head = encode(self.raddr, head, self.qpn, RecordKind::AtomicRequest)?;
        let operands = [swap, self.seq as u64, 0];
        let operands = encode(compare_add, operands, self.qpn, RecordKind::AtomicOperands)?;
        let mut out = [0u8; ATOMIC_REQUEST_LEN];
        let (a, b) = out.split_at_mut(RECV_WR_LEN);
        a.copy_from_slice(&head);
        b.copy_from_slice(&operands);
        Ok(out)
    }

    /// Decodes a request (its two records) from the front of `bytes`; returns it and the
    /// bytes after it.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let message = OobMessageKind::AtomicRequest;
        let (msg, rest) = split::<ATOMIC_REQUEST_LEN>(bytes, message)?;
        let (head, operands) = msg.split_at(RECV_WR_LEN);
        let head: [u8; RECV_WR_LEN] = head.try_into().unwrap_or([0; RECV_WR_LEN]);
        let operands: [u8; RECV_WR_LEN] = operands.try_into().unwrap_or([0; RECV_WR_LEN]);
        let h = Fields::check(&head, message, RecordKind::AtomicRequest as u32)?;
        let dest_qpn = h.be32(16);
        if dest_qpn > MAX_QPN {
            return Err(OobError::QpnOutOfRange { qpn: dest_qpn });
        }
        let flags = h.be32(20);
        if flags & 0x00FF_FFFF != 0 {
            return Err(OobError::ReservedNotZero {
                message,
                offset: 21,
                value: flags & 0x00FF_FFFF,
            });
        }
        let seq = h.be32(12);
        let o = match Fields::check(&operands, message, RecordKind::AtomicOperands as u32) {
            Ok(o) => o,
            Err(OobError::UnknownRecordKind { .. }) => {
                return Err(OobError::AtomicPair {
                    what: "the record after an atomic request is not its operands (kind 3)",
                })
            }
            Err(e) => return Err(e),
        };
        if o.be32(16) != seq || o.qpn != h.qpn {
            return Err(OobError::AtomicPair {
                what: "the operands name another sequence number or QPN than their request",
            });
        }
        reserved_zero(&o, message, RECV_WR_LEN + 20)?;
        let (compare_add, swap) = (o.be64(0), o.be64(8));
        let op = match flags >> 24 {
            0 if swap == 0 => AtomicOp::FetchAdd { add: compare_add },
            0 => {
                return Err(OobError::ReservedNotZero {
                    message,
                    offset: RECV_WR_LEN + 8,
                    value: (swap >> 32) as u32 | swap as u32,
                })
            }
            1 => AtomicOp::CompareSwap {
                compare: compare_add,
                swap,
            },
            other => {
                return Err(OobError::ReservedNotZero {
                    message,
                    offset: 20,
                    value: other,
                })
            }
        };
        let req = AtomicRequest {
            qpn: h.qpn,
            dest_qpn,
            seq,
            raddr: h.be64(0),
            rkey: h.be32(8),
            op,
        };
        Ok((req, rest))
    }
}

/// Bytes 20..24 of a record must be zero (`offset` names them in the error).
fn reserved_zero(f: &Fields<'_>, message: OobMessageKind, offset: usize) -> Result<(), OobError> {
    match f.be32(20) {
        0 => Ok(()),
        value => Err(OobError::ReservedNotZero {
            message,
            offset,
            value,
        }),
    }
}

/// How the responder's driver answered an atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicStatus {
    /// Executed: the reply carries the original value.
    Done,
    /// The rkey, the bounds or the access rights (REMOTE_ATOMIC on the QP and the MR)
    /// refused it (IBV_WC_REM_ACCESS_ERR at the requester).
    AccessError,
    /// The request itself is wrong, e.g. an address not 8-byte aligned
    /// (IBV_WC_REM_INV_REQ_ERR).
    InvalidRequest,
    /// The responder could not execute it on its memory (IBV_WC_REM_OP_ERR).
    OperationError,
    /// The responder does not take atomics (its hello lacks ATOMICS; the requester's
    /// transport answers for it): IBV_WC_REM_INV_REQ_ERR.
    Unsupported,
    /// A status this driver does not know (IBV_WC_REM_OP_ERR).
    Unknown(u32),
}

impl AtomicStatus {
    /// The status of the wire value `raw`.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => AtomicStatus::Done,
            1 => AtomicStatus::AccessError,
            2 => AtomicStatus::InvalidRequest,
            3 => AtomicStatus::OperationError,
            4 => AtomicStatus::Unsupported,
            other => AtomicStatus::Unknown(other),
        }
    }

    /// The wire value.
    pub const fn raw(self) -> u32 {
        match self {
            AtomicStatus::Done => 0,
            AtomicStatus::AccessError => 1,
            AtomicStatus::InvalidRequest => 2,
            AtomicStatus::OperationError => 3,
            AtomicStatus::Unsupported => 4,
            AtomicStatus::Unknown(raw) => raw,
        }
    }
}

/// The responder's answer to an atomic request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicReply {
    /// The responder's own QPN (24 bits).
    pub qpn: u32,
    /// The requester's QPN (24 bits).
    pub dest_qpn: u32,
    /// The request's sequence number.
    pub seq: u32,
    /// What happened.
    pub status: AtomicStatus,
    /// The original value ([`AtomicStatus::Done`] only; zero otherwise).
    pub value: u64,
}

impl Default for AtomicReply {
    fn default() -> Self {
        AtomicReply {
            qpn: 0,
            dest_qpn: 0,
            seq: 0,
            status: AtomicStatus::Done,
            value: 0,
        }
    }
}

impl AtomicReply {
    /// The answer to `req` with `status` and no value, as its responder would send it
    /// (what a transport says for a peer that does not take atomics).
    pub const fn refusal(req: &AtomicRequest, status: AtomicStatus) -> Self {
        AtomicReply {
            qpn: req.dest_qpn,
            dest_qpn: req.qpn,
            seq: req.seq,
            status,
            value: 0,
        }
    }

    /// The 32-byte record. Fails if a QPN is wider than 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; RECV_WR_LEN], OobError> {
        if self.dest_qpn > MAX_QPN {
            return Err(OobError::QpnOutOfRange { qpn: self.dest_qpn });
        }
        let value = match self.status {
            AtomicStatus::Done => self.value,
            _ => 0,
        };
        let fields = [
            (self.seq as u64) << 32 | self.status.raw() as u64,
            self.dest_qpn as u64,
            0,
        ];
        encode(value, fields, self.qpn, RecordKind::AtomicReply)
    }

    /// Decodes a reply (kind 4) from the front of `bytes`; returns it and the bytes after
    /// it. The zero fields must be zero, and so must the value of a failed atomic.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let message = OobMessageKind::AtomicReply;
        let (msg, rest) = split::<RECV_WR_LEN>(bytes, message)?;
        let f = Fields::check(&msg, message, RecordKind::AtomicReply as u32)?;
        let dest_qpn = f.be32(16);
        if dest_qpn > MAX_QPN {
            return Err(OobError::QpnOutOfRange { qpn: dest_qpn });
        }
        reserved_zero(&f, message, 20)?;
        let status = AtomicStatus::from_raw(f.be32(12));
        let value = f.be64(0);
        if status != AtomicStatus::Done && value != 0 {
            return Err(OobError::ReservedNotZero {
                message,
                offset: 0,
                value: (value >> 32) as u32 | value as u32,
            });
        }
        let reply = AtomicReply {
            qpn: f.qpn,
            dest_qpn,
            seq: f.be32(8),
            status,
            value,
        };
        Ok((reply, rest))
    }
}

/// An atomic request or its reply: what [`crate::platform::OobTransport::send_atomic`]
/// carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicMessage {
    /// A request, to the responder's driver.
    Request(AtomicRequest),
    /// A reply, to the requester's driver.
    Reply(AtomicReply),
}

#[cfg(test)]
mod tests {
    use super::super::Record;
    use super::*;

    fn cas() -> AtomicRequest {
        AtomicRequest {
            qpn: 0x0123AB,
            dest_qpn: 0x00_0105,
            seq: 0x0000_0102,
            raddr: 0x0000_7F12_3460_0048,
            rkey: 0x001F_FEA6,
            op: AtomicOp::CompareSwap {
                compare: 0x0102_0304_0506_0708,
                swap: 0x1112_1314_1516_1718,
            },
        }
    }

    #[test]
    fn operations_apply_as_ib_defines_them() {
        let faa = AtomicOp::FetchAdd { add: 3 };
        assert_eq!(faa.apply(u64::MAX), 2, "wraps");
        let cas = AtomicOp::CompareSwap {
            compare: 5,
            swap: 9,
        };
        assert_eq!((cas.apply(5), cas.apply(6)), (9, 6));
    }

    #[test]
    fn a_request_is_two_records_with_its_fields_in_place() {
        let req = cas();
        let b = req.to_bytes().unwrap();
        assert_eq!(b[..8], [0, 0, 0x7F, 0x12, 0x34, 0x60, 0, 0x48]);
        assert_eq!(b[8..16], [0, 0x1F, 0xFE, 0xA6, 0, 0, 1, 2]);
        assert_eq!(b[16..24], [0, 0, 1, 5, 1, 0, 0, 0]);
        assert_eq!(b[24..32], [0, 0x01, 0x23, 0xAB, 0, 0, 0, 2]);
        assert_eq!(b[32..40], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b[40..48], [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
        assert_eq!(b[48..56], [0, 0, 1, 2, 0, 0, 0, 0]);
        assert_eq!(b[56..], [0, 0x01, 0x23, 0xAB, 0, 0, 0, 3]);
        assert_eq!(AtomicRequest::parse(&b), Ok((req, &[][..])));
        assert_eq!(Record::parse(&b), Ok((Record::AtomicRequest(req), &[][..])));
        let faa = AtomicRequest {
            op: AtomicOp::FetchAdd { add: 7 },
            ..req
        };
        let b = faa.to_bytes().unwrap();
        assert_eq!((b[20], &b[40..48]), (0, &[0u8; 8][..]));
        assert_eq!(AtomicRequest::parse(&b), Ok((faa, &[][..])));
    }

    #[test]
    fn a_request_refuses_broken_pairs_and_garbage() {
        let good = cas().to_bytes().unwrap();
        assert!(matches!(
            AtomicRequest::parse(&good[..40]),
            Err(OobError::Truncated {
                message: OobMessageKind::AtomicRequest,
                needed: 64,
                available: 40
            })
        ));
        let mut other_seq = good;
        other_seq[51] ^= 1;
        assert!(matches!(
            AtomicRequest::parse(&other_seq),
            Err(OobError::AtomicPair { .. })
        ));
        let mut not_operands = good;
        not_operands[63] = 0;
        assert!(matches!(
            Record::parse(&not_operands),
            Err(OobError::AtomicPair { .. })
        ));
        // The operands alone are no record of their own.
        assert!(matches!(
            Record::parse(&good[32..]),
            Err(OobError::AtomicPair { .. })
        ));
        for (at, offset) in [(21, 21), (20, 20), (52, 52)] {
            let mut b = good;
            b[at] = 7;
            assert!(
                matches!(
                    AtomicRequest::parse(&b),
                    Err(OobError::ReservedNotZero { offset: o, .. }) if o == offset
                ),
                "byte {at}"
            );
        }
        let mut faa_with_swap = AtomicRequest {
            op: AtomicOp::FetchAdd { add: 1 },
            ..cas()
        }
        .to_bytes()
        .unwrap();
        faa_with_swap[47] = 1;
        assert!(matches!(
            AtomicRequest::parse(&faa_with_swap),
            Err(OobError::ReservedNotZero { offset: 40, .. })
        ));
        let mut wide = good;
        wide[16] = 1;
        assert_eq!(
            AtomicRequest::parse(&wide),
            Err(OobError::QpnOutOfRange { qpn: 0x0100_0105 })
        );
        let too_wide = AtomicRequest {
            dest_qpn: 0x0100_0000,
            ..cas()
        };
        assert!(too_wide.to_bytes().is_err());
    }

    #[test]
    fn a_reply_has_its_fields_in_place_and_refuses_garbage() {
        let reply = AtomicReply {
            qpn: 0x00_0105,
            dest_qpn: 0x0123AB,
            seq: 0x0102,
            status: AtomicStatus::Done,
            value: 0x0102_0304_0506_0708,
        };
        let b = reply.to_bytes().unwrap();
        assert_eq!(b[..8], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b[8..16], [0, 0, 1, 2, 0, 0, 0, 0]);
        assert_eq!(b[16..24], [0, 0x01, 0x23, 0xAB, 0, 0, 0, 0]);
        assert_eq!(b[24..], [0, 0, 1, 5, 0, 0, 0, 4]);
        assert_eq!(Record::parse(&b), Ok((Record::AtomicReply(reply), &[][..])));
        let refused = AtomicReply::refusal(&cas(), AtomicStatus::Unsupported);
        assert_eq!(
            (refused.qpn, refused.dest_qpn, refused.seq, refused.value),
            (0x105, 0x0123AB, 0x102, 0)
        );
        let b = refused.to_bytes().unwrap();
        assert_eq!(b[12..16], [0, 0, 0, 4]);
        assert_eq!(AtomicReply::parse(&b), Ok((refused, &[][..])));
        let mut valued = b;
        valued[7] = 1;
        assert!(matches!(
            AtomicReply::parse(&valued),
            Err(OobError::ReservedNotZero { offset: 0, .. })
        ));
        let mut unknown = b;
        unknown[15] = 9;
        assert_eq!(
            AtomicReply::parse(&unknown).map(|r| r.0.status),
            Ok(AtomicStatus::Unknown(9))
        );
        let mut reserved = b;
        reserved[22] = 1;
        assert!(matches!(
            AtomicReply::parse(&reserved),
            Err(OobError::ReservedNotZero { offset: 20, .. })
        ));
    }
}
