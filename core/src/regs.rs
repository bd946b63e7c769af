//! The BAR0 register map as the RTL decodes it (layout-verification.md section 2,
//! hardware-contract.md corrections 2 and 3).
//!
//! A [`Reg`] can only be built for an address the card decodes, so the driver cannot issue
//! an undecoded access (which ends the RTL simulation and, on hardware, shifts every later
//! read by one). The emulated NIC uses [`Reg::decode`] to reject anything else loudly.

/// What a read of an undecoded register returns on the hardware (and on the emulated card
/// and the RTL simulator's CSR channel, which answer the same).
pub const UNDECODED_READ: u32 = 0xAAAA_AAAA;

/// Number of send/meta-report channels the current RTL decodes (correction 2).
pub const DECODED_CHANNELS: u8 = 1;
/// Largest number of channels the register map has room for (0x40 apart).
pub const MAX_CHANNELS: u8 = 4;

/// A decoded BAR0 register: a 32-bit little-endian register at a byte offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reg(u16);

/// The register within a ring block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingReg {
    /// Base address, low 32 bits.
    BaseLo = 0x0,
    /// Base address, high 32 bits.
    BaseHi = 0x4,
    /// Head pointer (13-bit `{guard, idx}`): written by the producer.
    Head = 0x8,
    /// Tail pointer (13-bit `{guard, idx}`): written by the consumer.
    Tail = 0xC,
}

/// Which ring a register block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingId {
    /// Send (work queue) ring of a channel, host to card.
    Send(u8),
    /// Meta-report ring of a channel, card to host.
    MetaReport(u8),
    /// Command request ring, host to card.
    CmdRequest,
    /// Command response ring, card to host.
    CmdResponse,
    /// Simple-NIC transmit ring, host to card.
    SimpleNicTx,
    /// Simple-NIC receive ring, card to host.
    SimpleNicRx,
}

/// Direction of a ring, which fixes who writes head and who writes tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The driver produces (writes head), the card consumes (writes tail).
    HostToCard,
    /// The card produces (writes head and the valid bit), the driver consumes (writes tail).
    CardToHost,
}

impl RingId {
    /// The six ring families of channel 0, in the order the driver programs them.
    pub const ALL_CH0: [RingId; 6] = [
        RingId::CmdRequest,
        RingId::CmdResponse,
        RingId::Send(0),
        RingId::MetaReport(0),
        RingId::SimpleNicTx,
        RingId::SimpleNicRx,
    ];

    /// Byte offset of the ring's register block, or `None` for a channel the card has no
    /// room for.
    pub const fn block(self) -> Option<u16> {
        match self {
            RingId::Send(c) if c < MAX_CHANNELS => Some(0x40 * c as u16),
            RingId::MetaReport(c) if c < MAX_CHANNELS => Some(0x10 + 0x40 * c as u16),
            RingId::CmdRequest => Some(0x100),
            RingId::CmdResponse => Some(0x110),
            RingId::SimpleNicTx => Some(0x140),
            RingId::SimpleNicRx => Some(0x150),
            _ => None,
        }
    }

    /// Who produces into this ring.
    pub const fn direction(self) -> Direction {
        match self {
            RingId::Send(_) | RingId::CmdRequest | RingId::SimpleNicTx => Direction::HostToCard,
            RingId::MetaReport(_) | RingId::CmdResponse | RingId::SimpleNicRx => {
                Direction::CardToHost
            }
        }
    }

    /// The register `reg` of this ring, if the card decodes it with `channels` channels.
    pub const fn reg(self, reg: RingReg, channels: u8) -> Option<Reg> {
        match self {
            RingId::Send(c) | RingId::MetaReport(c) if c >= channels => None,
            _ => match self.block() {
                Some(b) => Some(Reg(b + reg as u16)),
                None => None,
            },
        }
    }
}

/// Read-only error and packet counters of receive queue 0 (layout-verification.md section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Packet dropped: QP access flags forbid the operation.
    InvalidQpAccess = 0,
    /// Packet dropped: opcode not accepted.
    InvalidOpcode = 1,
    /// Packet dropped: MR key mismatch.
    InvalidMrKey = 2,
    /// Packet dropped: access outside the MR bounds.
    MemOutOfBounds = 3,
    /// Packet dropped: MR access flags forbid the operation.
    InvalidMrAccess = 4,
    /// Packet dropped: malformed header.
    InvalidHeader = 5,
    /// Packet dropped: QP context invalid or key mismatch.
    InvalidQpContext = 6,
    /// Packet dropped: length inconsistent with the header.
    PacketLengthError = 7,
    /// Packet dropped for another reason.
    UnknownError = 8,
    /// Eight packed 4-bit debug counters.
    PackedDebug = 9,
    /// Ethernet RX classifier: frames discarded.
    EthDiscarded = 0x20,
    /// Ethernet RX classifier: frames sent to the simple NIC.
    EthSimpleNic = 0x21,
    /// Ethernet RX classifier: frames sent to the RDMA pipeline.
    EthRdma = 0x22,
}

impl Counter {
    /// Every counter, in register order.
    pub const ALL: [Counter; 13] = [
        Counter::InvalidQpAccess,
        Counter::InvalidOpcode,
        Counter::InvalidMrKey,
        Counter::MemOutOfBounds,
        Counter::InvalidMrAccess,
        Counter::InvalidHeader,
        Counter::InvalidQpContext,
        Counter::PacketLengthError,
        Counter::UnknownError,
        Counter::PackedDebug,
        Counter::EthDiscarded,
        Counter::EthSimpleNic,
        Counter::EthRdma,
    ];

    /// The counter's register.
    pub const fn reg(self) -> Reg {
        Reg(0x400 + 4 * self as u16)
    }
}

impl Reg {
    /// The byte offset in BAR0.
    pub const fn offset(self) -> u16 {
        self.0
    }

    /// Decodes a BAR0 byte offset the way a card with `channels` channels does: `Some` only
    /// for a 4-byte-aligned address of an implemented register. The address is first cut to
    /// 16 bits, as the RTL does (0x10000 aliases 0x0000).
    pub const fn decode(offset: u32, channels: u8) -> Option<Reg> {
        let off = (offset & 0xFFFF) as u16;
        if off & 3 != 0 {
            return None;
        }
        if off < 0x100 {
            let ch = (off / 0x40) as u8;
            let within = off % 0x40;
            if ch >= channels || within >= 0x20 {
                return None;
            }
            return Some(Reg(off));
        }
        match off {
            0x100..=0x11C | 0x140..=0x15C => Some(Reg(off)),
            0x400..=0x424 | 0x480..=0x488 => Some(Reg(off)),
            _ => None,
        }
    }

    /// What the register is: a ring register, a counter, or neither (never for a decoded reg).
    pub const fn kind(self) -> RegKind {
        let off = self.0;
        if off >= 0x400 {
            let k = (off - 0x400) / 4;
            let c = match k {
                0 => Counter::InvalidQpAccess,
                1 => Counter::InvalidOpcode,
                2 => Counter::InvalidMrKey,
                3 => Counter::MemOutOfBounds,
                4 => Counter::InvalidMrAccess,
                5 => Counter::InvalidHeader,
                6 => Counter::InvalidQpContext,
                7 => Counter::PacketLengthError,
                8 => Counter::UnknownError,
                9 => Counter::PackedDebug,
                0x20 => Counter::EthDiscarded,
                0x21 => Counter::EthSimpleNic,
                _ => Counter::EthRdma,
            };
            return RegKind::Counter(c);
        }
        let (ring, base) = if off < 0x100 {
            let ch = (off / 0x40) as u8;
            if off % 0x40 < 0x10 {
                (RingId::Send(ch), 0x40 * ch as u16)
            } else {
                (RingId::MetaReport(ch), 0x40 * ch as u16 + 0x10)
            }
        } else {
            match off & !0xF {
                0x100 => (RingId::CmdRequest, 0x100),
                0x110 => (RingId::CmdResponse, 0x110),
                0x140 => (RingId::SimpleNicTx, 0x140),
                _ => (RingId::SimpleNicRx, 0x150),
            }
        };
        let reg = match off - base {
            0x0 => RingReg::BaseLo,
            0x4 => RingReg::BaseHi,
            0x8 => RingReg::Head,
            _ => RingReg::Tail,
        };
        RegKind::Ring(ring, reg)
    }
}

/// What a decoded register is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegKind {
    /// A ring's base, head or tail register.
    Ring(RingId, RingReg),
    /// A read-only counter.
    Counter(Counter),
}

/// The error a platform or the emulated NIC reports for an access the card does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UndecodedAccess {
    /// The byte offset that was accessed.
    pub offset: u32,
    /// Whether the access was a write.
    pub is_write: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_registers_match_the_csr_map() {
        let r = |id: RingId, reg| id.reg(reg, DECODED_CHANNELS).unwrap().offset();
        assert_eq!(r(RingId::Send(0), RingReg::BaseLo), 0x000);
        assert_eq!(r(RingId::Send(0), RingReg::Head), 0x008);
        assert_eq!(r(RingId::MetaReport(0), RingReg::Tail), 0x01C);
        assert_eq!(r(RingId::CmdRequest, RingReg::Head), 0x108);
        assert_eq!(r(RingId::CmdResponse, RingReg::Tail), 0x11C);
        assert_eq!(r(RingId::SimpleNicTx, RingReg::BaseHi), 0x144);
        assert_eq!(r(RingId::SimpleNicRx, RingReg::Tail), 0x15C);
        assert_eq!(RingId::Send(1).reg(RingReg::Head, DECODED_CHANNELS), None);
        assert_eq!(
            RingId::Send(1).reg(RingReg::Head, 4).unwrap().offset(),
            0x048
        );
    }

    #[test]
    fn decode_rejects_what_the_rtl_does_not_decode() {
        for bad in [
            0x040, 0x048, 0x020, 0x120, 0x180, 0x184, 0x188, 0x4000, 0x102, 0x428,
        ] {
            assert_eq!(Reg::decode(bad, DECODED_CHANNELS), None, "{bad:#x}");
        }
        // 16-bit truncation: 0x10000 aliases the send ring base-low.
        assert_eq!(Reg::decode(0x1_0000, 1).unwrap().offset(), 0);
        assert_eq!(
            Reg::decode(0x404, 1).unwrap().kind(),
            RegKind::Counter(Counter::InvalidOpcode)
        );
    }

    #[test]
    fn every_decoded_register_round_trips_through_kind() {
        for off in (0..0x1000u32).step_by(4) {
            if let Some(reg) = Reg::decode(off, DECODED_CHANNELS) {
                match reg.kind() {
                    RegKind::Ring(id, r) => assert_eq!(id.reg(r, 1), Some(reg)),
                    RegKind::Counter(c) => assert_eq!(c.reg(), reg),
                }
            }
        }
        for c in Counter::ALL {
            assert_eq!(Reg::decode(c.reg().offset() as u32, 1), Some(c.reg()));
        }
    }
}
