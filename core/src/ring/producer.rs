//! The host-to-card ring: command request, send, simple-NIC TX (hardware-contract.md
//! "Rings", nic-behaviour.md section 6.2).
//!
//! The driver writes descriptors at its head, then one `fence(Release)` and one head CSR
//! write (the doorbell) for the whole batch. The card fetches descriptors between its tail and
//! the head and advances tail per descriptor fetched, so tail means "slot may be reused", not
//! "done". The card ignores the valid bit on these rings; the codecs set it anyway.
//!
//! The tail CSR is an MMIO read, slow and on the card's clock, so the ring keeps a cached tail
//! and reads the register only when the cached view says a batch does not fit. A tail that
//! cannot be (bits above the pointer, behind the cached tail, ahead of head) is reported and
//! leaves the ring as it was.

use core::fmt;
use core::sync::atomic::Ordering;

use super::fence;
use super::memory::{RingMemory, RingSlots};
use super::pointer::{RingPtr, RING_LEN};
use super::{card_pointer, NotAPointer, RingRegs};
use crate::desc::RawDesc;
use crate::platform::RegisterAccess;

/// The tail CSR of a host-to-card ring returned a value that cannot be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImpossibleTail {
    /// The value read from the tail CSR.
    pub read: u32,
    /// The driver's head pointer at the time (raw `{guard, idx}`).
    pub head: u16,
    /// The tail the driver had seen before (raw `{guard, idx}`).
    pub cached_tail: u16,
}

impl fmt::Display for ImpossibleTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tail CSR read {:#x}, outside the fetched range {:#x}..={:#x}",
            self.read, self.cached_tail, self.head
        )
    }
}

/// Why [`ProducerRing::push_batch`] wrote nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// The batch does not fit in the free slots, even after reading the card's tail. Retry
    /// after the card has fetched more.
    Full {
        /// Descriptors in the batch.
        requested: u16,
        /// Free slots after reading the tail.
        free: u16,
    },
    /// The batch is larger than the whole ring and can never fit.
    BatchTooLarge {
        /// Descriptors in the batch.
        requested: usize,
    },
    /// The tail CSR returned an impossible value.
    ImpossibleTail(ImpossibleTail),
}

impl fmt::Display for PushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Full { requested, free } => {
                write!(f, "ring full: {requested} descriptors, {free} free slots")
            }
            PushError::BatchTooLarge { requested } => {
                write!(f, "batch of {requested} descriptors exceeds the ring")
            }
            PushError::ImpossibleTail(t) => t.fmt(f),
        }
    }
}

/// A ring the driver produces into and the card consumes from.
///
/// `S` is the slot memory and `N` the ring length; the defaults are the card's rings.
#[derive(Debug)]
pub struct ProducerRing<S = RingMemory, const N: u16 = RING_LEN> {
    slots: S,
    regs: RingRegs,
    /// Where the next descriptor goes; the value of the last doorbell.
    head: RingPtr<N>,
    /// The last tail read from the card: slots from here to `head` may still be fetched.
    cached_tail: RingPtr<N>,
}

impl<S: RingSlots<N>, const N: u16> ProducerRing<S, N> {
    /// A ring over `slots` with head and tail at 0, the values [`ProducerRing::program`]
    /// writes.
    pub const fn new(slots: S, regs: RingRegs) -> Self {
        ProducerRing {
            slots,
            regs,
            head: RingPtr::ZERO,
            cached_tail: RingPtr::ZERO,
        }
    }

    /// The ring's registers.
    pub const fn regs(&self) -> RingRegs {
        self.regs
    }

    /// The driver's head: the value of the last doorbell.
    pub const fn head(&self) -> RingPtr<N> {
        self.head
    }

    /// The tail last read from the card.
    pub const fn cached_tail(&self) -> RingPtr<N> {
        self.cached_tail
    }

    /// Free slots according to the cached tail (no register read; the real number may be
    /// larger).
    pub const fn free_slots(&self) -> u16 {
        RingPtr::free(self.head, self.cached_tail)
    }

    /// Descriptors published but not yet seen fetched: head minus the cached tail.
    pub const fn pending(&self) -> u16 {
        RingPtr::used(self.head, self.cached_tail)
    }

    /// Reads the tail CSR and returns the free slots. An impossible value is returned as an
    /// error and the cached tail stays as it was.
    pub fn refresh_tail(&mut self, regs: &impl RegisterAccess) -> Result<u16, ImpossibleTail> {
        let read = regs.read32(self.regs.tail);
        let fetched = self.head.distance_from(self.cached_tail);
        // The card's tail only moves forward, and never past the head it was given.
        let tail = RingPtr::<N>::from_csr(read)
            .filter(|t| t.distance_from(self.cached_tail) <= fetched)
            .ok_or_else(|| {
                core_error!(
                    "ring: impossible tail {:#x} (cached tail {:#x}, head {:#x})",
                    read,
                    self.cached_tail.raw(),
                    self.head.raw()
                );
                ImpossibleTail {
                    read,
                    head: self.head.raw(),
                    cached_tail: self.cached_tail.raw(),
                }
            })?;
        // The card has fetched the slots before `tail`: our next writes to them come after.
        fence(Ordering::Acquire);
        self.cached_tail = tail;
        Ok(self.free_slots())
    }

    /// Writes all of `descs` and rings the doorbell once, or writes nothing.
    ///
    /// The tail CSR is read only if the batch does not fit by the cached tail. An empty batch
    /// does nothing, not even a doorbell.
    pub fn push_batch(
        &mut self,
        regs: &impl RegisterAccess,
        descs: &[RawDesc],
    ) -> Result<(), PushError> {
        let requested = match u16::try_from(descs.len()) {
            Ok(0) => return Ok(()),
            Ok(n) if n <= N => n,
            _ => {
                return Err(PushError::BatchTooLarge {
                    requested: descs.len(),
                })
            }
        };
        if self.free_slots() < requested {
            let free = self.refresh_tail(regs).map_err(PushError::ImpossibleTail)?;
            if free < requested {
                return Err(PushError::Full { requested, free });
            }
        }
        let mut at = self.head;
        for desc in descs {
            self.slots.write(at, desc);
            at = at.advance(1);
        }
        // The descriptors must reach memory before the card sees the head that covers them.
        fence(Ordering::Release);
        self.head = at;
        regs.write32(self.regs.head, at.csr());
        Ok(())
    }

    /// The slot memory, e.g. to free it after the card has been stopped.
    pub fn into_slots(self) -> S {
        self.slots
    }
}

impl ProducerRing<RingMemory, RING_LEN> {
    /// Points the card at this ring and starts the ring where the card's tail is.
    ///
    /// A card is not reset when its driver goes away, and a tail write does not move its
    /// fetch pointer (nic-behaviour.md 6.2): a ring reprogrammed at 0 over a card whose tail
    /// a previous driver left at 64 would have it fetch 8128 slots of the new, empty ring.
    /// So the ring continues from the card's tail (0 on a card no driver has used). The
    /// writes are the head (set to that tail: a previous driver's unfetched descriptors are
    /// not fetched), then the base, low and high; the tail, the card's, is not written, so
    /// that whatever the card reads between two writes, its pointers say the ring is empty.
    /// Only while the card is not using the ring, before any push. A tail that is not a
    /// ring pointer (not the card's BAR) is an error, and nothing is written.
    pub fn program(&mut self, regs: &impl RegisterAccess) -> Result<(), NotAPointer> {
        debug_assert!(
            RingPtr::is_empty(self.head, self.cached_tail),
            "program before any push"
        );
        let at = card_pointer(regs, self.regs.tail)?;
        self.head = at;
        self.cached_tail = at;
        let base = self.slots.device_addr().0;
        regs.write32(self.regs.head, at.csr());
        regs.write32(self.regs.base_lo, base as u32);
        regs.write32(self.regs.base_hi, (base >> 32) as u32);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::regs::{RingId, DECODED_CHANNELS};
    use crate::ring::memory::RING_ALIGN;
    use crate::ring::pointer::RING_BYTES;
    use crate::ring::testing::{desc, HeapDma, MockRegs};

    fn ring(heap: &HeapDma) -> ProducerRing {
        let mem = RingMemory::new(heap.buffer(0, RING_BYTES)).unwrap();
        ProducerRing::new(
            mem,
            RingRegs::of(RingId::Send(0), DECODED_CHANNELS).unwrap(),
        )
    }

    fn batch(first: u8, n: usize) -> Vec<RawDesc> {
        (0..n)
            .map(|i| desc(first.wrapping_add(i as u8), 0x80))
            .collect()
    }

    #[test]
    fn program_starts_an_unused_card_at_0_writing_head_then_base_never_the_tail() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        ring.program(&regs).unwrap();
        let base = heap.buffer(0, 1).device_addr().0;
        assert_eq!(
            *regs.writes.borrow(),
            [
                (ring.regs().head, 0),
                (ring.regs().base_lo, base as u32),
                (ring.regs().base_hi, (base >> 32) as u32),
            ]
        );
    }

    #[test]
    fn program_continues_from_the_tail_a_previous_driver_left_and_drops_its_unfetched() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        // A previous driver rang up to 0x50; the card had fetched up to 0x40 when it went.
        regs.set(ring.regs().head, 0x50);
        regs.set(ring.regs().tail, 0x40);
        ring.program(&regs).unwrap();
        // The head goes back to the tail: the card fetches nothing of the old ring.
        assert_eq!(regs.writes_of(ring.regs().head), [0x40]);
        assert_eq!(regs.writes_of(ring.regs().tail), Vec::<u32>::new());
        assert_eq!((ring.head(), ring.free_slots()), (RingPtr::new(0x40), 4096));
        // The first push goes to slot 0x40 and rings 0x41.
        ring.push_batch(&regs, &batch(1, 1)).unwrap();
        assert_eq!(regs.writes_of(ring.regs().head), [0x40, 0x41]);
        assert_eq!(&heap.bytes()[0x40 * 32..0x41 * 32], &desc(1, 0x80).0);
    }

    #[test]
    fn program_refuses_a_tail_that_is_not_a_ring_pointer_and_writes_nothing() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        regs.set(ring.regs().tail, 0xAAAA_AAAA);
        let e = ring.program(&regs).unwrap_err();
        assert_eq!((e.reg, e.read), (ring.regs().tail, 0xAAAA_AAAA));
        assert!(regs.writes.borrow().is_empty());
    }

    #[test]
    fn one_doorbell_per_batch_and_no_tail_read_while_space_is_known() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        ring.push_batch(&regs, &batch(1, 16)).unwrap();
        ring.push_batch(&regs, &batch(17, 1)).unwrap();
        ring.push_batch(&regs, &[]).unwrap();
        assert_eq!(regs.writes_of(ring.regs().head), [16, 17]);
        assert!(regs.reads.borrow().is_empty());
        assert_eq!(&heap.bytes()[..32], &desc(1, 0x80).0);
        assert_eq!(&heap.bytes()[16 * 32..17 * 32], &desc(17, 0x80).0);
        assert_eq!(ring.pending(), 17);
        assert_eq!(ring.free_slots(), 4096 - 17);
    }

    #[test]
    fn tail_is_read_only_when_the_ring_looks_full() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        for i in 0..64 {
            ring.push_batch(&regs, &batch(i, 64)).unwrap();
        }
        assert_eq!(regs.reads_of(ring.regs().tail), 0);
        assert_eq!(ring.free_slots(), 0);
        // The card has fetched nothing: full, after exactly one tail read.
        let tail = ring.regs().tail;
        assert_eq!(
            ring.push_batch(&regs, &batch(0, 1)),
            Err(PushError::Full {
                requested: 1,
                free: 0
            })
        );
        assert_eq!(regs.reads_of(tail), 1);
        // The card fetched 10: a batch of 10 fits after one more read, then it is full again.
        regs.set(tail, 10);
        ring.push_batch(&regs, &batch(0, 10)).unwrap();
        assert_eq!(regs.reads_of(tail), 2);
        assert_eq!(ring.head().raw(), 0x1000 + 10);
        assert_eq!(regs.writes_of(ring.regs().head).len(), 65);
    }

    #[test]
    fn a_failed_push_writes_nothing() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        ring.push_batch(&regs, &batch(1, 4090)).unwrap();
        let before = heap.bytes()[4090 * 32..].to_vec();
        assert!(matches!(
            ring.push_batch(&regs, &batch(9, 7)),
            Err(PushError::Full {
                requested: 7,
                free: 6
            })
        ));
        assert_eq!(heap.bytes()[4090 * 32..], before[..]);
        assert_eq!(regs.writes_of(ring.regs().head), [4090]);
        assert_eq!(
            ring.push_batch(&regs, &batch(0, 4097)),
            Err(PushError::BatchTooLarge { requested: 4097 })
        );
    }

    #[test]
    fn batches_wrap_around_the_ring_end() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        ring.push_batch(&regs, &batch(0, 4094)).unwrap();
        regs.set(ring.regs().tail, 4094);
        ring.push_batch(&regs, &batch(50, 4)).unwrap();
        assert_eq!(&heap.bytes()[4095 * 32..4096 * 32], &desc(51, 0x80).0);
        assert_eq!(&heap.bytes()[32..64], &desc(53, 0x80).0);
        assert_eq!(ring.head().raw(), 0x1002);
        assert_eq!(ring.pending(), 4);
    }

    #[test]
    fn impossible_tails_are_errors_that_change_nothing() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut ring = ring(&heap);
        let regs = MockRegs::default();
        ring.push_batch(&regs, &batch(0, 4000)).unwrap();
        regs.set(ring.regs().tail, 100);
        assert_eq!(ring.refresh_tail(&regs), Ok(196));
        let tail = ring.regs().tail;
        // Ahead of head, behind the cached tail, and not a 13-bit value.
        for bogus in [4001, 99, 0x1000 + 50, 0xAAAA_AAAA, 0x2000 + 100] {
            regs.set(tail, bogus);
            assert_eq!(
                ring.push_batch(&regs, &batch(0, 200)),
                Err(PushError::ImpossibleTail(ImpossibleTail {
                    read: bogus,
                    head: 4000,
                    cached_tail: 100
                })),
                "{bogus:#x}"
            );
            assert_eq!((ring.cached_tail().raw(), ring.head().raw()), (100, 4000));
        }
        // Exactly at head is possible: everything fetched.
        regs.set(tail, 4000);
        ring.push_batch(&regs, &batch(0, 200)).unwrap();
        assert_eq!(ring.pending(), 200);
    }
}
