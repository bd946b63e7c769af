//! The access-check records of the out-of-band channel (designed here). The card drops a
//! packet that fails its receive checks without a word (nic-behaviour.md 2.3: no NAK, no
//! report), so a requester whose WRITE names a bad rkey only sees silence. When its
//! retransmission timer fires, it asks the responder's driver whether the oldest request
//! can be accepted at all (**access check**, kind 5); the responder checks it against its
//! MR table and QP as the card and its driver do and answers (**access verdict**, kind 6).
//! A refusal completes the request with the error a NAK would have carried
//! (REM_ACCESS_ERR, REM_OP_ERR); an acceptance changes nothing (the loss was a loss). The
//! records go only to a peer whose hello announces
//! [`Capabilities::ACCESS_CHECKS`](super::Capabilities::ACCESS_CHECKS); without it the
//! transport withholds them and the request ends as before (RETRY_EXC_ERR).
//!
//! **Access check** (kind 5):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..4 | zero |
//! | 4..8 | the checked request's first PSN (24 bits: byte 4 is zero) |
//! | 8..16 | remote address |
//! | 16..20 | length |
//! | 20..24 | rkey |
//! | 24..28 | the requester's own QPN (24 bits) |
//! | 28..32 | kind 5 |
//!
//! The operation ([`CheckOp`]: 0 WRITE, 1 READ, 2 SEND, 3 SEND_WITH_INV) is byte 0. For a
//! SEND the address, length and key are those of the receive WR it was matched with (the
//! responder's oldest posted one).
//!
//! **Remote invalidation** (op 3, sent only to a peer whose hello announces
//! [`Capabilities::REMOTE_INVALIDATE`](super::Capabilities::REMOTE_INVALIDATE)): not a
//! question about a dropped packet but the invalidation of a SEND_WITH_INV, asked before
//! the SEND goes to the card, once every request before it is acknowledged. The PSN is
//! the one the SEND will start at, the key the rkey to invalidate, address and length
//! zero. The responder invalidates the memory window of that rkey (a type-2 window bound
//! in its QP's PD; anything else is refused) and answers with a verdict: accepted (the
//! SEND goes; its receive completion carries IBV_WC_WITH_INV) or an operation error (the
//! SEND completes with REM_OP_ERR, the receive WR with LOC_PROT_ERR).
//!
//! **Access verdict** (kind 6):
//!
//! | Bytes | Field |
//! |---|---|
//! | 0..4 | zero |
//! | 4..8 | the checked request's first PSN |
//! | 8..16 | zero |
//! | 16..20 | verdict ([`CheckVerdict`]: 0 accepted, 1 access error, 2 operation error) |
//! | 20..24 | zero |
//! | 24..28 | the responder's own QPN (24 bits) |
//! | 28..32 | kind 6 |

use super::codec::{encode, split, Fields, OobError, OobMessageKind, RecordKind};
use super::RECV_WR_LEN;

/// What the checked request does at the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CheckOp {
    /// RDMA WRITE (or the data of a WRITE_WITH_IMM): REMOTE_WRITE on QP and MR.
    #[default]
    Write = 0,
    /// RDMA READ: REMOTE_READ on QP and MR.
    Read = 1,
    /// SEND into the responder's receive WR: LOCAL_WRITE on its MR, in the QP's PD.
    Send = 2,
    /// The invalidation of a SEND_WITH_INV (see the module docs).
    SendInv = 3,
}

/// What the responder says about a checked request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CheckVerdict {
    /// It would be accepted: whatever was lost is resent as usual.
    #[default]
    Accepted = 0,
    /// Refused: rkey, bounds or access (REM_ACCESS_ERR at the requester).
    AccessError = 1,
    /// Refused: the receive WR cannot take the SEND (REM_OP_ERR at the requester; the
    /// receive WR completes with LOC_PROT_ERR).
    OperationError = 2,
}

/// An access check (kind 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AccessCheck {
    /// What the request does at the responder.
    pub op: CheckOp,
    /// The request's first PSN (24 bits).
    pub psn: u32,
    /// Its remote address (a SEND's: its receive WR's buffer).
    pub addr: u64,
    /// Its length.
    pub len: u32,
    /// Its rkey (a SEND's: its receive WR's lkey).
    pub rkey: u32,
    /// The requester's own QPN.
    pub qpn: u32,
}

/// An access verdict (kind 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AccessVerdict {
    /// The checked request's first PSN.
    pub psn: u32,
    /// What the responder says.
    pub verdict: CheckVerdict,
    /// The responder's own QPN.
    pub qpn: u32,
}

/// A check or its verdict (what [`crate::platform::OobTransport::send_check`] carries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckMessage {
    /// A requester asks.
    Check(AccessCheck),
    /// The responder answers.
    Verdict(AccessVerdict),
}

/// Refuses a nonzero byte range of a record.
fn zero(
    message: OobMessageKind,
    f: &Fields<'_>,
    offsets: &[usize],
    skip_first_byte: bool,
) -> Result<(), OobError> {
    for &offset in offsets {
        let mut value = f.be32(offset);
        if skip_first_byte && offset == 0 {
            value &= 0x00FF_FFFF;
        }
        if value != 0 {
            return Err(OobError::ReservedNotZero {
                message,
                offset,
                value,
            });
        }
    }
    Ok(())
}

/// A PSN field: 24 bits.
fn psn(message: OobMessageKind, value: u32) -> Result<u32, OobError> {
    if value > 0x00FF_FFFF {
        return Err(OobError::ReservedNotZero {
            message,
            offset: 4,
            value,
        });
    }
    Ok(value)
}

impl AccessCheck {
    /// The 32-byte record. Fails if `qpn` is wider than 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; RECV_WR_LEN], OobError> {
        let head = ((self.op as u64) << 56) | (self.psn & 0x00FF_FFFF) as u64;
        let fields = [self.addr, self.len as u64, self.rkey as u64];
        encode(head, fields, self.qpn, RecordKind::AccessCheck)
    }

    /// Decodes an access check (kind 5) from the front of `bytes`; returns it and the bytes
    /// after it.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let message = OobMessageKind::AccessCheck;
        let (msg, rest) = split::<RECV_WR_LEN>(bytes, message)?;
        let f = Fields::check(&msg, message, RecordKind::AccessCheck as u32)?;
        zero(message, &f, &[0], true)?;
        let op = match msg[0] {
            0 => CheckOp::Write,
            1 => CheckOp::Read,
            2 => CheckOp::Send,
            3 => CheckOp::SendInv,
            other => {
                return Err(OobError::ReservedNotZero {
                    message,
                    offset: 0,
                    value: other as u32,
                })
            }
        };
        let check = AccessCheck {
            op,
            psn: psn(message, f.be32(4))?,
            addr: f.be64(8),
            len: f.be32(16),
            rkey: f.be32(20),
            qpn: f.qpn,
        };
        Ok((check, rest))
    }
}

impl AccessVerdict {
    /// The 32-byte record. Fails if `qpn` is wider than 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; RECV_WR_LEN], OobError> {
        let fields = [0, self.verdict as u64, 0];
        encode(
            (self.psn & 0x00FF_FFFF) as u64,
            fields,
            self.qpn,
            RecordKind::AccessVerdict,
        )
    }

    /// Decodes an access verdict (kind 6) from the front of `bytes`; returns it and the
    /// bytes after it.
    pub fn parse(bytes: &[u8]) -> Result<(Self, &[u8]), OobError> {
        let message = OobMessageKind::AccessVerdict;
        let (msg, rest) = split::<RECV_WR_LEN>(bytes, message)?;
        let f = Fields::check(&msg, message, RecordKind::AccessVerdict as u32)?;
        zero(message, &f, &[0, 8, 12, 20], false)?;
        let verdict = match f.be32(16) {
            0 => CheckVerdict::Accepted,
            1 => CheckVerdict::AccessError,
            2 => CheckVerdict::OperationError,
            value => {
                return Err(OobError::ReservedNotZero {
                    message,
                    offset: 16,
                    value,
                })
            }
        };
        let v = AccessVerdict {
            psn: psn(message, f.be32(4))?,
            verdict,
            qpn: f.qpn,
        };
        Ok((v, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oob::Record;

    #[test]
    fn checks_and_verdicts_round_trip_with_their_fields_in_place() {
        let c = AccessCheck {
            op: CheckOp::Send,
            psn: 0xAB_CDEF,
            addr: 0x1122_3344_5566_7788,
            len: 0x99AA_BBCC,
            rkey: 0xDDEE_FF00,
            qpn: 0x12_3456,
        };
        let b = c.to_bytes().unwrap();
        assert_eq!(b[0], 2);
        assert_eq!(&b[4..8], &[0, 0xAB, 0xCD, 0xEF]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[28..32], &5u32.to_be_bytes());
        assert_eq!(AccessCheck::parse(&b), Ok((c, &[][..])));
        assert_eq!(Record::parse(&b), Ok((Record::AccessCheck(c), &[][..])));
        let v = AccessVerdict {
            psn: 7,
            verdict: CheckVerdict::OperationError,
            qpn: 0xFF_FFFF,
        };
        let b = v.to_bytes().unwrap();
        assert_eq!(&b[16..20], &2u32.to_be_bytes());
        assert_eq!(&b[28..32], &6u32.to_be_bytes());
        assert_eq!(Record::parse(&b), Ok((Record::AccessVerdict(v), &[][..])));
    }

    #[test]
    fn garbage_in_checks_and_verdicts_is_named() {
        let inv = AccessCheck {
            op: CheckOp::SendInv,
            rkey: 0x1234_5678,
            ..AccessCheck::default()
        };
        let b = inv.to_bytes().unwrap();
        assert_eq!(b[0], 3);
        assert_eq!(AccessCheck::parse(&b), Ok((inv, &[][..])));
        let mut b = AccessCheck::default().to_bytes().unwrap();
        b[0] = 4;
        assert!(matches!(
            AccessCheck::parse(&b),
            Err(OobError::ReservedNotZero { offset: 0, .. })
        ));
        let mut b = AccessCheck::default().to_bytes().unwrap();
        b[2] = 1;
        assert!(AccessCheck::parse(&b).is_err(), "bytes 1..4 must be zero");
        let mut b = AccessVerdict::default().to_bytes().unwrap();
        b[19] = 3;
        assert!(matches!(
            AccessVerdict::parse(&b),
            Err(OobError::ReservedNotZero { offset: 16, .. })
        ));
        let mut b = AccessVerdict::default().to_bytes().unwrap();
        b[9] = 1;
        assert!(
            AccessVerdict::parse(&b).is_err(),
            "bytes 8..16 must be zero"
        );
        let b = AccessVerdict::default().to_bytes().unwrap();
        assert!(matches!(
            AccessVerdict::parse(&b[..31]),
            Err(OobError::Truncated { .. })
        ));
        let q = AccessCheck {
            qpn: 0x100_0000,
            ..AccessCheck::default()
        };
        assert!(matches!(q.to_bytes(), Err(OobError::QpnOutOfRange { .. })));
    }
}
