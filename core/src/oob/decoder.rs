//! A streaming decoder for the out-of-band TCP byte stream (oob-channel.md): the hello,
//! the proof, then records of any known kind, split across reads in any way.
//!
//! It owns a fixed 64-byte buffer (the longest message: an atomic request's two records)
//! and never allocates. Feed it every
//! chunk a read returns:
//!
//! ```
//! # use bluerdma_core::oob::{OobDecoder, OobMessage, OobError};
//! # fn handle(_: OobMessage) {}
//! # fn on_read(dec: &mut OobDecoder, chunk: &[u8]) -> Result<(), OobError> {
//! let mut input = chunk;
//! while let Some(msg) = dec.decode(&mut input)? {
//!     handle(msg);
//! }
//! // `input` is empty here: a partial message waits in the decoder for the next chunk.
//! # Ok(()) }
//! ```
//!
//! After an error the decoder stays failed and returns the same error: the connection
//! must be closed. A bad magic is reported as soon as the first differing byte arrives,
//! another version as soon as the version's two bytes have.

use super::atomic::{AtomicReply, AtomicRequest, ATOMIC_REQUEST_LEN};
use super::check::CheckMessage;
use super::codec::{
    Hello, OobError, OobMessageKind, Proof, Record, RecordKind, RecvTooShort, RecvWr, HELLO_LEN,
    PROOF_LEN, RECV_WR_LEN,
};

/// A decoded message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OobMessage {
    /// The peer's hello (always the first message of a connection).
    Hello(Hello),
    /// The peer's proof (always the second).
    Proof(Proof),
    /// An announced receive WR.
    RecvWr(RecvWr),
    /// A receive WR of ours was too short for the peer's SEND.
    RecvTooShort(RecvTooShort),
    /// The peer asks us to execute an atomic.
    AtomicRequest(AtomicRequest),
    /// The peer answers one of our atomics.
    AtomicReply(AtomicReply),
    /// An access check of the peer, or its verdict on one of ours.
    Check(CheckMessage),
}

/// Incremental decoder of one connection's byte stream.
#[derive(Clone, Debug)]
pub struct OobDecoder {
    buf: [u8; ATOMIC_REQUEST_LEN],
    filled: usize,
    next: OobMessageKind,
    failed: Option<OobError>,
}

impl Default for OobDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl OobDecoder {
    /// A decoder for a new connection: a hello first, a proof, then records.
    pub const fn new() -> Self {
        OobDecoder {
            buf: [0; ATOMIC_REQUEST_LEN],
            filled: 0,
            next: OobMessageKind::Hello,
            failed: None,
        }
    }

    /// A decoder for a peer that sends no hello nor proof (the reference driver): records
    /// only.
    pub const fn without_hello() -> Self {
        OobDecoder {
            buf: [0; ATOMIC_REQUEST_LEN],
            filled: 0,
            next: OobMessageKind::RecvWr,
            failed: None,
        }
    }

    /// The message the decoder is waiting for.
    pub const fn expecting(&self) -> OobMessageKind {
        self.next
    }

    /// Bytes of a partial message held back for the next call.
    pub const fn buffered(&self) -> usize {
        self.filled
    }

    /// The error the decoder failed with, if any.
    pub const fn error(&self) -> Option<OobError> {
        self.failed
    }

    /// The length of the next message as far as its first 32 bytes tell: a record's kind
    /// says whether it is an atomic request (64 bytes).
    const fn next_len(&self) -> usize {
        match self.next {
            OobMessageKind::Hello => HELLO_LEN,
            OobMessageKind::Proof => PROOF_LEN,
            _ => RECV_WR_LEN,
        }
    }

    /// The whole length of the next message, whose first bytes are `head` (at least
    /// [`OobDecoder::next_len`] of them).
    fn full_len(&self, head: &[u8]) -> usize {
        match self.next {
            OobMessageKind::Hello | OobMessageKind::Proof => self.next_len(),
            _ => RecordKind::record_len(head),
        }
    }

    /// Moves bytes from `input` into the buffer until it holds `need`; whether it does.
    fn fill_to(&mut self, need: usize, input: &mut &[u8]) -> bool {
        if self.filled < need {
            let take = (need - self.filled).min(input.len());
            let (head, rest) = input.split_at(take);
            *input = rest;
            if let Some(slot) = self.buf.get_mut(self.filled..self.filled + take) {
                slot.copy_from_slice(head);
                self.filled += take;
            }
        }
        self.filled >= need
    }

    /// Decodes the next message from `input`, advancing it past the bytes used.
    /// `Ok(None)`: need more bytes (all of `input` was taken into the buffer).
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<OobMessage>, OobError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let base = self.next_len();
        if self.filled == 0 && input.len() >= base && input.len() >= self.full_len(input) {
            // Fast path: the whole message is in `input`, decode it in place.
            let (msg, rest) = self.parse(input)?;
            *input = rest;
            return Ok(Some(msg));
        }
        if !self.fill_to(base, input) {
            // Name garbage early: the hello's magic and version are checked as their
            // bytes arrive (a version-1 peer sends 16 bytes and waits).
            if self.next == OobMessageKind::Hello {
                let buffered = self.buf;
                match Hello::parse(buffered.get(..self.filled).unwrap_or(&[])) {
                    Err(OobError::Truncated { .. }) | Ok(_) => {}
                    Err(e) => return Err(self.fail(e)),
                }
            }
            return Ok(None);
        }
        let buffered = self.buf;
        let full = self.full_len(buffered.get(..base).unwrap_or(&[]));
        if !self.fill_to(full, input) {
            return Ok(None);
        }
        let buffered = self.buf;
        let n = core::mem::take(&mut self.filled);
        let result = self.parse(buffered.get(..n).unwrap_or(&[]))?.0;
        Ok(Some(result))
    }

    /// Decodes one message of the expected kind from the front of `bytes`.
    fn parse<'a>(&mut self, bytes: &'a [u8]) -> Result<(OobMessage, &'a [u8]), OobError> {
        let (parsed, then) = match self.next {
            OobMessageKind::Hello => (
                Hello::parse(bytes).map(|(h, rest)| (OobMessage::Hello(h), rest)),
                OobMessageKind::Proof,
            ),
            OobMessageKind::Proof => (
                Proof::parse(bytes).map(|(p, rest)| (OobMessage::Proof(p), rest)),
                OobMessageKind::RecvWr,
            ),
            _ => (
                Record::parse(bytes).map(|(record, rest)| {
                    let msg = match record {
                        Record::RecvWr(wr) => OobMessage::RecvWr(wr),
                        Record::RecvTooShort(r) => OobMessage::RecvTooShort(r),
                        Record::AtomicRequest(r) => OobMessage::AtomicRequest(r),
                        Record::AtomicReply(r) => OobMessage::AtomicReply(r),
                        Record::AccessCheck(r) => OobMessage::Check(CheckMessage::Check(r)),
                        Record::AccessVerdict(r) => OobMessage::Check(CheckMessage::Verdict(r)),
                    };
                    (msg, rest)
                }),
                OobMessageKind::RecvWr,
            ),
        };
        match parsed {
            Ok(ok) => {
                self.next = then;
                Ok(ok)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn fail(&mut self, e: OobError) -> OobError {
        self.failed = Some(e);
        e
    }

    /// Call when the peer closed the connection: an error if it stopped inside a message
    /// (or the decoder had failed before).
    pub fn finish(&self) -> Result<(), OobError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.filled != 0 {
            let needed = if self.filled >= self.next_len() {
                self.full_len(self.buf.split_at(self.filled).0)
            } else {
                self.next_len()
            };
            return Err(OobError::Truncated {
                message: self.next,
                needed,
                available: self.filled,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    /// Hello, proof and records before `RECORDS_AT`.
    const RECORDS_AT: usize = HELLO_LEN + PROOF_LEN;
    const STREAM_LEN: usize = RECORDS_AT + 2 * RECV_WR_LEN;

    fn stream() -> ([u8; STREAM_LEN], Hello, Proof, [RecvWr; 2]) {
        let hello = Hello::new(Ipv4Addr::new(17, 34, 51, 10)).with_nonce([0x5a; 16]);
        let proof = Proof([0xc3; PROOF_LEN]);
        let wrs = [
            RecvWr {
                wr_id: 1,
                addr: 0x1000,
                length: 64,
                lkey: 0x100,
                qpn: 0x0123AB,
            },
            RecvWr {
                wr_id: 2,
                ..RecvWr::default()
            },
        ];
        let mut bytes = [0u8; STREAM_LEN];
        bytes[..HELLO_LEN].copy_from_slice(&hello.to_bytes());
        bytes[HELLO_LEN..RECORDS_AT].copy_from_slice(&proof.to_bytes());
        bytes[RECORDS_AT..RECORDS_AT + 32].copy_from_slice(&wrs[0].to_bytes().unwrap());
        bytes[RECORDS_AT + 32..].copy_from_slice(&wrs[1].to_bytes().unwrap());
        (bytes, hello, proof, wrs)
    }

    #[test]
    fn byte_by_byte_gives_the_same_messages() {
        let (bytes, hello, proof, wrs) = stream();
        let mut dec = OobDecoder::new();
        let mut got = std::vec::Vec::new();
        for b in bytes.iter() {
            let mut input = core::slice::from_ref(b);
            while let Some(m) = dec.decode(&mut input).unwrap() {
                got.push(m);
            }
            assert!(input.is_empty());
        }
        assert_eq!(
            got,
            [
                OobMessage::Hello(hello),
                OobMessage::Proof(proof),
                OobMessage::RecvWr(wrs[0]),
                OobMessage::RecvWr(wrs[1])
            ]
        );
        assert_eq!(dec.finish(), Ok(()));
    }

    #[test]
    fn partial_message_is_need_more_then_truncated_at_close() {
        let (bytes, _, _, _) = stream();
        let mut dec = OobDecoder::new();
        let mut input = &bytes[..RECORDS_AT + 4];
        assert!(matches!(
            dec.decode(&mut input),
            Ok(Some(OobMessage::Hello(_)))
        ));
        assert_eq!(dec.expecting(), OobMessageKind::Proof);
        assert!(matches!(
            dec.decode(&mut input),
            Ok(Some(OobMessage::Proof(_)))
        ));
        assert_eq!(dec.decode(&mut input), Ok(None));
        assert_eq!(dec.buffered(), 4);
        assert_eq!(
            dec.finish(),
            Err(OobError::Truncated {
                message: OobMessageKind::RecvWr,
                needed: 32,
                available: 4
            })
        );
    }

    #[test]
    fn garbage_fails_early_and_stays_failed() {
        let mut dec = OobDecoder::new();
        let mut input: &[u8] = b"BRX";
        let err = dec.decode(&mut input).unwrap_err();
        assert_eq!(err, OobError::BadMagic { found: *b"BRX\0" });
        let mut more: &[u8] = &[0; 64];
        assert_eq!(dec.decode(&mut more), Err(err));
        assert_eq!(dec.finish(), Err(err));
    }

    #[test]
    fn a_version_1_hello_fails_on_its_16_bytes() {
        let (bytes, _, _, _) = stream();
        let mut v1 = bytes;
        v1[5] = 1;
        let mut dec = OobDecoder::new();
        let mut input = &v1[..16];
        let err = OobError::UnsupportedVersion { theirs: 1, ours: 2 };
        assert_eq!(dec.decode(&mut input), Err(err));
        assert_eq!(dec.finish(), Err(err));
    }

    #[test]
    fn too_short_records_decode_and_unknown_kinds_fail_for_good() {
        let (bytes, _, _, wrs) = stream();
        let rec = RecvTooShort {
            wr_id: 9,
            send_len: 101,
            qpn: 0x0123AB,
        };
        let mut more = [0u8; 2 * RECV_WR_LEN];
        more[..32].copy_from_slice(&rec.to_bytes().unwrap());
        more[32..].copy_from_slice(&wrs[0].to_bytes().unwrap());
        more[63] = 7;
        let mut dec = OobDecoder::new();
        let mut input = &bytes[..RECORDS_AT + 32];
        assert!(matches!(
            dec.decode(&mut input),
            Ok(Some(OobMessage::Hello(_)))
        ));
        assert!(matches!(
            dec.decode(&mut input),
            Ok(Some(OobMessage::Proof(_)))
        ));
        assert_eq!(dec.decode(&mut input), Ok(Some(OobMessage::RecvWr(wrs[0]))));
        // Split inside the kind field.
        let mut input = &more[..30];
        assert_eq!(dec.decode(&mut input), Ok(None));
        let mut input = &more[30..];
        assert_eq!(
            dec.decode(&mut input),
            Ok(Some(OobMessage::RecvTooShort(rec)))
        );
        let err = OobError::UnknownRecordKind { kind: 7 };
        assert_eq!(dec.decode(&mut input), Err(err));
        assert_eq!(dec.finish(), Err(err));
    }

    #[test]
    fn records_only_mode_for_the_reference_driver() {
        let (bytes, _, _, wrs) = stream();
        let mut dec = OobDecoder::without_hello();
        let mut input = &bytes[RECORDS_AT..];
        assert_eq!(dec.decode(&mut input), Ok(Some(OobMessage::RecvWr(wrs[0]))));
        assert_eq!(dec.decode(&mut input), Ok(Some(OobMessage::RecvWr(wrs[1]))));
        assert_eq!(dec.decode(&mut input), Ok(None));
    }

    #[test]
    fn an_atomic_request_waits_for_its_operands_in_any_split() {
        use crate::oob::{AtomicOp, AtomicReply, AtomicRequest, AtomicStatus};
        let req = AtomicRequest {
            qpn: 0x0123AB,
            dest_qpn: 0x105,
            seq: 3,
            raddr: 0x1000,
            rkey: 0x200,
            op: AtomicOp::CompareSwap {
                compare: 1,
                swap: 2,
            },
        };
        let reply = AtomicReply::refusal(&req, AtomicStatus::AccessError);
        let mut stream = std::vec::Vec::new();
        stream.extend_from_slice(&req.to_bytes().unwrap());
        stream.extend_from_slice(&reply.to_bytes().unwrap());
        stream.extend_from_slice(&req.to_bytes().unwrap());
        for cut in 0..stream.len() {
            let mut dec = OobDecoder::without_hello();
            let mut got = std::vec::Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                let mut input = part;
                while let Some(m) = dec.decode(&mut input).unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(
                got,
                [
                    OobMessage::AtomicRequest(req),
                    OobMessage::AtomicReply(reply),
                    OobMessage::AtomicRequest(req)
                ],
                "cut at {cut}"
            );
        }
        // A request whose operands never come is truncated at 64 bytes.
        let mut dec = OobDecoder::without_hello();
        let mut input = &stream[..40];
        assert_eq!(dec.decode(&mut input), Ok(None));
        assert_eq!(
            dec.finish(),
            Err(OobError::Truncated {
                message: OobMessageKind::RecvWr,
                needed: 64,
                available: 40
            })
        );
    }
}
