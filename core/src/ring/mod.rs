//! The descriptor rings between driver and card (hardware-contract.md "Rings" and
//! corrections 1 and 11, layout-verification.md section 3, nic-behaviour.md section 6).
//!
//! Every ring is 4096 slots of 32 bytes with 13-bit head and tail CSRs ([`RingPtr`]).
//! - Host to card (command request, send, simple-NIC TX): [`ProducerRing`]. The driver writes
//!   descriptors, issues one `fence(Release)` and one head write (the doorbell) per batch, and
//!   reads the tail CSR only when the ring looks full. Tail means "fetched", not "done".
//! - Card to host (command response, meta report, simple-NIC RX): [`ConsumerRing`]. The card
//!   writes whole descriptors with the valid bit set; the driver polls the valid bit, never the
//!   head CSR (it may run ahead of memory), copies, zeroes the slot and writes the tail CSR.
//!   A has_next descriptor is consumed only together with its successor.

mod consumer;
mod memory;
mod pointer;
mod producer;
#[cfg(test)]
mod testing;

pub use consumer::{ConsumerRing, Popped};
pub use memory::{DescStaging, RejectedBuffer, RingMemory, RingMemoryError, RingSlots, RING_ALIGN};
pub use pointer::{RingPtr, RING_BYTES, RING_LEN};
pub use producer::{ImpossibleTail, ProducerRing, PushError};

use core::fmt;

use crate::platform::RegisterAccess;
use crate::regs::{Reg, RingId, RingReg};

// The loom model runs the real ring code, so its fences must be loom's.
#[cfg(not(loom))]
use core::sync::atomic::fence;
#[cfg(loom)]
use loom::sync::atomic::fence;

/// The four registers of one ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingRegs {
    /// Base address, low 32 bits.
    pub base_lo: Reg,
    /// Base address, high 32 bits.
    pub base_hi: Reg,
    /// Head pointer: written by the producer.
    pub head: Reg,
    /// Tail pointer: written by the consumer.
    pub tail: Reg,
}

impl RingRegs {
    /// The registers of ring `id` on a card that decodes `channels` channels, or `None` if
    /// the card does not decode them.
    pub const fn of(id: RingId, channels: u8) -> Option<RingRegs> {
        match (
            id.reg(RingReg::BaseLo, channels),
            id.reg(RingReg::BaseHi, channels),
            id.reg(RingReg::Head, channels),
            id.reg(RingReg::Tail, channels),
        ) {
            (Some(base_lo), Some(base_hi), Some(head), Some(tail)) => Some(RingRegs {
                base_lo,
                base_hi,
                head,
                tail,
            }),
            _ => None,
        }
    }
}

/// A ring pointer register read a value no ring register holds: bits above the 13-bit
/// pointer are set (an undecoded address reads 0xAAAAAAAA on hardware).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotAPointer {
    /// The register.
    pub reg: Reg,
    /// What it read.
    pub read: u32,
}

impl fmt::Display for NotAPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ring register {:#x} reads {:#x}, which is not a 13-bit ring pointer (is BAR0 the blue-rdma card's?)",
            self.reg.offset(),
            self.read
        )
    }
}

/// Points the card at its rings, the host-to-card ones first: each continues where the
/// card's pointer is, since a card is not reset between drivers
/// ([`ProducerRing::program`], [`ConsumerRing::program`]). Stops at the first pointer
/// register that reads as no pointer.
pub fn program_rings<const P: usize, const C: usize>(
    regs: &impl RegisterAccess,
    producers: [&mut ProducerRing; P],
    consumers: [&mut ConsumerRing; C],
) -> Result<(), NotAPointer> {
    for p in producers {
        p.program(regs)?;
    }
    for c in consumers {
        c.program(regs)?;
    }
    Ok(())
}

/// Where the card's pointer of a ring is: `reg` (the tail of a host-to-card ring, the head
/// of a card-to-host one) read as a [`RingPtr`].
fn card_pointer<const N: u16>(
    regs: &impl RegisterAccess,
    reg: Reg,
) -> Result<RingPtr<N>, NotAPointer> {
    let read = regs.read32(reg);
    RingPtr::from_csr(read).ok_or(NotAPointer { reg, read })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regs::DECODED_CHANNELS;

    #[test]
    fn ring_regs_are_the_four_registers_of_the_block() {
        let r = RingRegs::of(RingId::CmdResponse, DECODED_CHANNELS).unwrap();
        assert_eq!(
            [r.base_lo, r.base_hi, r.head, r.tail].map(Reg::offset),
            [0x110, 0x114, 0x118, 0x11C]
        );
        assert_eq!(RingRegs::of(RingId::MetaReport(1), DECODED_CHANNELS), None);
    }
}
