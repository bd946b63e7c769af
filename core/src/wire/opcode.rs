//! The BTH opcode: the full 8-bit value {transport type (bits 7..5), operation (4..0)}
//! (nic-behaviour.md 1.2 opcode table, 1.5 BTH byte 0).
//!
//! Only the RC opcodes 0x00..=0x17 are named; everything else (UC, UD, XRC, CNP 0x80,
//! reserved codes) decodes to [`RdmaOpcode::Unknown`], so a byte from the network always
//! decodes and always re-encodes to itself. The flags here are properties of the operation
//! itself; which extension headers follow the BTH depends on the wire profile and lives in
//! [`crate::wire::packet::WireProfile`].

/// An RDMA BTH opcode (8 bits, transport type included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RdmaOpcode {
    /// 0x00 RC SEND_FIRST.
    SendFirst,
    /// 0x01 RC SEND_MIDDLE.
    SendMiddle,
    /// 0x02 RC SEND_LAST.
    SendLast,
    /// 0x03 RC SEND_LAST_WITH_IMMEDIATE.
    SendLastWithImm,
    /// 0x04 RC SEND_ONLY.
    SendOnly,
    /// 0x05 RC SEND_ONLY_WITH_IMMEDIATE.
    SendOnlyWithImm,
    /// 0x06 RC RDMA_WRITE_FIRST.
    WriteFirst,
    /// 0x07 RC RDMA_WRITE_MIDDLE.
    WriteMiddle,
    /// 0x08 RC RDMA_WRITE_LAST.
    WriteLast,
    /// 0x09 RC RDMA_WRITE_LAST_WITH_IMMEDIATE.
    WriteLastWithImm,
    /// 0x0A RC RDMA_WRITE_ONLY.
    WriteOnly,
    /// 0x0B RC RDMA_WRITE_ONLY_WITH_IMMEDIATE.
    WriteOnlyWithImm,
    /// 0x0C RC RDMA_READ_REQUEST.
    ReadRequest,
    /// 0x0D RC RDMA_READ_RESPONSE_FIRST.
    ReadResponseFirst,
    /// 0x0E RC RDMA_READ_RESPONSE_MIDDLE.
    ReadResponseMiddle,
    /// 0x0F RC RDMA_READ_RESPONSE_LAST.
    ReadResponseLast,
    /// 0x10 RC RDMA_READ_RESPONSE_ONLY.
    ReadResponseOnly,
    /// 0x11 RC ACKNOWLEDGE (ACK and NAK alike on this card).
    Acknowledge,
    /// 0x12 RC ATOMIC_ACKNOWLEDGE.
    AtomicAcknowledge,
    /// 0x13 RC COMPARE_SWAP.
    CompareSwap,
    /// 0x14 RC FETCH_ADD.
    FetchAdd,
    /// 0x16 RC SEND_LAST_WITH_INVALIDATE.
    SendLastWithInvalidate,
    /// 0x17 RC SEND_ONLY_WITH_INVALIDATE.
    SendOnlyWithInvalidate,
    /// Any other value, kept as read (never one of the values named above).
    Unknown(u8),
}

/// What an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// SEND (data into a receive buffer).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response (data back to the requester).
    ReadResponse,
    /// ACK or NAK.
    Acknowledge,
    /// Atomic request or atomic ACK.
    Atomic,
}

/// Where a packet sits in its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// The first packet of a multi-packet message.
    First,
    /// A packet between first and last.
    Middle,
    /// The last packet of a multi-packet message.
    Last,
    /// The only packet of the message.
    Only,
}

/// One row of the opcode table.
#[derive(Clone, Copy)]
struct Info {
    op: RdmaOpcode,
    class: OpClass,
    position: Position,
    imm: bool,
    ieth: bool,
}

const fn row(op: RdmaOpcode, class: OpClass, position: Position) -> Option<Info> {
    Some(Info {
        op,
        class,
        position,
        imm: false,
        ieth: false,
    })
}

const fn with_imm(op: RdmaOpcode, class: OpClass, position: Position) -> Option<Info> {
    Some(Info {
        op,
        class,
        position,
        imm: true,
        ieth: false,
    })
}

const fn with_ieth(op: RdmaOpcode, position: Position) -> Option<Info> {
    Some(Info {
        op,
        class: OpClass::Send,
        position,
        imm: false,
        ieth: true,
    })
}

use OpClass as C;
use Position as P;
use RdmaOpcode as O;

/// The RC opcode table, indexed by the raw value 0x00..=0x17 (0x15 is reserved).
const TABLE: [Option<Info>; 0x18] = [
    row(O::SendFirst, C::Send, P::First),
    row(O::SendMiddle, C::Send, P::Middle),
    row(O::SendLast, C::Send, P::Last),
    with_imm(O::SendLastWithImm, C::Send, P::Last),
    row(O::SendOnly, C::Send, P::Only),
    with_imm(O::SendOnlyWithImm, C::Send, P::Only),
    row(O::WriteFirst, C::Write, P::First),
    row(O::WriteMiddle, C::Write, P::Middle),
    row(O::WriteLast, C::Write, P::Last),
    with_imm(O::WriteLastWithImm, C::Write, P::Last),
    row(O::WriteOnly, C::Write, P::Only),
    with_imm(O::WriteOnlyWithImm, C::Write, P::Only),
    row(O::ReadRequest, C::ReadRequest, P::Only),
    row(O::ReadResponseFirst, C::ReadResponse, P::First),
    row(O::ReadResponseMiddle, C::ReadResponse, P::Middle),
    row(O::ReadResponseLast, C::ReadResponse, P::Last),
    row(O::ReadResponseOnly, C::ReadResponse, P::Only),
    row(O::Acknowledge, C::Acknowledge, P::Only),
    row(O::AtomicAcknowledge, C::Atomic, P::Only),
    row(O::CompareSwap, C::Atomic, P::Only),
    row(O::FetchAdd, C::Atomic, P::Only),
    None,
    with_ieth(O::SendLastWithInvalidate, P::Last),
    with_ieth(O::SendOnlyWithInvalidate, P::Only),
];

impl RdmaOpcode {
    /// Decodes the 8-bit BTH opcode byte. Never fails: unnamed values are `Unknown`.
    pub const fn from_raw(raw: u8) -> Self {
        let idx = raw as usize;
        if idx < TABLE.len() {
            if let Some(info) = TABLE[idx] {
                return info.op;
            }
        }
        RdmaOpcode::Unknown(raw)
    }

    /// The 8-bit BTH opcode byte.
    pub const fn raw(self) -> u8 {
        match self {
            O::SendFirst => 0x00,
            O::SendMiddle => 0x01,
            O::SendLast => 0x02,
            O::SendLastWithImm => 0x03,
            O::SendOnly => 0x04,
            O::SendOnlyWithImm => 0x05,
            O::WriteFirst => 0x06,
            O::WriteMiddle => 0x07,
            O::WriteLast => 0x08,
            O::WriteLastWithImm => 0x09,
            O::WriteOnly => 0x0A,
            O::WriteOnlyWithImm => 0x0B,
            O::ReadRequest => 0x0C,
            O::ReadResponseFirst => 0x0D,
            O::ReadResponseMiddle => 0x0E,
            O::ReadResponseLast => 0x0F,
            O::ReadResponseOnly => 0x10,
            O::Acknowledge => 0x11,
            O::AtomicAcknowledge => 0x12,
            O::CompareSwap => 0x13,
            O::FetchAdd => 0x14,
            O::SendLastWithInvalidate => 0x16,
            O::SendOnlyWithInvalidate => 0x17,
            O::Unknown(raw) => raw,
        }
    }

    /// The transport-type bits (7..5): RC 0, UC 1, RD 2, UD 3, CNP 4, XRC 5.
    pub const fn transport_bits(self) -> u8 {
        self.raw() >> 5
    }

    const fn info(self) -> Option<Info> {
        match self {
            O::Unknown(_) => None,
            // A named opcode is always in the table (see `from_raw`/`raw`).
            known => TABLE[known.raw() as usize],
        }
    }

    /// What the operation is; `None` for `Unknown`.
    pub const fn class(self) -> Option<OpClass> {
        match self.info() {
            Some(i) => Some(i.class),
            None => None,
        }
    }

    /// Where the packet sits in its message; `None` for `Unknown`.
    pub const fn position(self) -> Option<Position> {
        match self.info() {
            Some(i) => Some(i.position),
            None => None,
        }
    }

    /// Whether this is a known opcode.
    pub const fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// FIRST: the first of several packets (its RETH.dlen is the message total).
    pub const fn is_first(self) -> bool {
        matches!(self.position(), Some(Position::First))
    }

    /// MIDDLE.
    pub const fn is_middle(self) -> bool {
        matches!(self.position(), Some(Position::Middle))
    }

    /// LAST (with or without immediate or invalidate).
    pub const fn is_last(self) -> bool {
        matches!(self.position(), Some(Position::Last))
    }

    /// ONLY (with or without immediate or invalidate), and single-packet operations.
    pub const fn is_only(self) -> bool {
        matches!(self.position(), Some(Position::Only))
    }

    /// Whether the packet starts a message (FIRST or ONLY).
    pub const fn starts_message(self) -> bool {
        self.is_first() || self.is_only()
    }

    /// Whether the packet ends a message (LAST or ONLY).
    pub const fn ends_message(self) -> bool {
        self.is_last() || self.is_only()
    }

    /// Carries immediate data (the *_WITH_IMMEDIATE opcodes).
    pub const fn has_imm(self) -> bool {
        match self.info() {
            Some(i) => i.imm,
            None => false,
        }
    }

    /// Carries an IETH (the *_WITH_INVALIDATE opcodes).
    pub const fn has_ieth(self) -> bool {
        match self.info() {
            Some(i) => i.ieth,
            None => false,
        }
    }

    /// May carry payload: SEND, WRITE and READ response opcodes (nic-behaviour.md 2.2;
    /// whether a given packet does also depends on RETH.dlen).
    pub const fn has_payload(self) -> bool {
        matches!(
            self.class(),
            Some(OpClass::Send | OpClass::Write | OpClass::ReadResponse)
        )
    }

    /// A SEND opcode.
    pub const fn is_send(self) -> bool {
        matches!(self.class(), Some(OpClass::Send))
    }

    /// An RDMA WRITE opcode.
    pub const fn is_write(self) -> bool {
        matches!(self.class(), Some(OpClass::Write))
    }

    /// The RDMA READ request.
    pub const fn is_read_request(self) -> bool {
        matches!(self.class(), Some(OpClass::ReadRequest))
    }

    /// An RDMA READ response opcode.
    pub const fn is_read_response(self) -> bool {
        matches!(self.class(), Some(OpClass::ReadResponse))
    }

    /// ACKNOWLEDGE (ACK or NAK).
    pub const fn is_ack(self) -> bool {
        matches!(self.class(), Some(OpClass::Acknowledge))
    }

    /// An atomic request or atomic ACK.
    pub const fn is_atomic(self) -> bool {
        matches!(self.class(), Some(OpClass::Atomic))
    }
}

impl From<u8> for RdmaOpcode {
    fn from(raw: u8) -> Self {
        Self::from_raw(raw)
    }
}

impl From<RdmaOpcode> for u8 {
    fn from(op: RdmaOpcode) -> Self {
        op.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for raw in 0..=u8::MAX {
            let op = RdmaOpcode::from_raw(raw);
            assert_eq!(op.raw(), raw);
            assert_eq!(op.is_known(), raw < 0x18 && raw != 0x15, "{raw:#x}");
        }
    }

    #[test]
    fn the_card_opcode_table_maps_to_names() {
        // nic-behaviour.md 1.2: (first, middle, last, only) per WR op.
        assert_eq!(RdmaOpcode::from_raw(0x06), RdmaOpcode::WriteFirst);
        assert_eq!(RdmaOpcode::from_raw(0x09), RdmaOpcode::WriteLastWithImm);
        assert_eq!(RdmaOpcode::from_raw(0x0B), RdmaOpcode::WriteOnlyWithImm);
        assert_eq!(
            RdmaOpcode::from_raw(0x17),
            RdmaOpcode::SendOnlyWithInvalidate
        );
        assert_eq!(RdmaOpcode::from_raw(0x10), RdmaOpcode::ReadResponseOnly);
        assert_eq!(RdmaOpcode::from_raw(0x80), RdmaOpcode::Unknown(0x80));
        assert_eq!(RdmaOpcode::from_raw(0x26), RdmaOpcode::Unknown(0x26));
    }

    #[test]
    fn flags_follow_the_operation() {
        assert!(RdmaOpcode::WriteFirst.is_first() && RdmaOpcode::WriteFirst.has_payload());
        assert!(RdmaOpcode::SendLastWithImm.has_imm() && RdmaOpcode::SendLastWithImm.is_last());
        assert!(RdmaOpcode::SendOnlyWithInvalidate.has_ieth());
        assert!(!RdmaOpcode::ReadRequest.has_payload());
        assert!(RdmaOpcode::ReadResponseMiddle.has_payload());
        assert!(RdmaOpcode::Acknowledge.is_ack() && !RdmaOpcode::Acknowledge.has_payload());
        assert!(RdmaOpcode::WriteOnly.starts_message() && RdmaOpcode::WriteOnly.ends_message());
        assert!(!RdmaOpcode::Unknown(0x15).has_payload());
        assert_eq!(RdmaOpcode::Unknown(0x80).transport_bits(), 4);
    }
}
