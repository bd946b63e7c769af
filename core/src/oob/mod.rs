//! The out-of-band channel's codec (oob-channel.md): the hello, the proof, the 32-byte
//! records (receive WR, receive WR too short, atomic request and reply, access check and
//! verdict) and a streaming
//! decoder for the TCP byte stream. The transport itself belongs to the platform
//! ([`crate::platform::OobTransport`]).

mod atomic;
mod check;
mod codec;
mod decoder;

pub use atomic::{
    AtomicMessage, AtomicOp, AtomicReply, AtomicRequest, AtomicStatus, ATOMIC_REQUEST_LEN,
};
pub use check::{AccessCheck, AccessVerdict, CheckMessage, CheckOp, CheckVerdict};
pub use codec::{
    Capabilities, EncodedRecord, Hello, OobError, OobMessageKind, Proof, Record, RecordKind,
    RecvTooShort, RecvWr, HELLO_LEN, HELLO_MAGIC, MAX_QPN, NONCE_LEN, OOB_PROTOCOL_VERSION,
    PROOF_LEN, RECV_WR_LEN,
};
pub use decoder::{OobDecoder, OobMessage};
