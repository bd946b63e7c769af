//! The card-to-host ring: command response, meta report, simple-NIC RX (hardware-contract.md
//! "Rings" and correction 11, layout-verification.md section 3, nic-behaviour.md section 6.3).
//!
//! The card writes whole descriptors with the valid bit (bit 255) set, into slots the tail CSR
//! has released, and advances its head CSR when a write is issued, which can be before the data
//! is in memory. So the driver never reads head: it polls the valid bit of the slot at its
//! tail, `fence(Acquire)`, copies the descriptor, zeroes the slot (so that the slot reads as
//! empty when the ring wraps) and advances. Freed slots reach the card when the tail CSR is
//! written, after a `fence(Release)` that keeps the zeroing ahead of the card's next write.
//!
//! A descriptor with has_next is consumed only together with its successor, once both are
//! valid; the two may arrive in separate DMA writes and straddle the ring end. A chain longer
//! than two breaks the contract: it is consumed and reported, never interpreted, so the ring
//! keeps moving.

use core::sync::atomic::Ordering;

use super::fence;
use super::memory::{RingMemory, RingSlots};
use super::pointer::{RingPtr, RING_LEN};
use super::{card_pointer, NotAPointer, RingRegs};
use crate::desc::RawDesc;
use crate::platform::RegisterAccess;

/// What one [`ConsumerRing::pop`] consumed: the driver's copies, never the slots themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Popped {
    /// A descriptor without has_next.
    One(RawDesc),
    /// A descriptor with has_next and its successor.
    Pair(RawDesc, RawDesc),
    /// The first two descriptors of a chain longer than two (the second has has_next too): a
    /// contract violation by the card, to be reported and not interpreted.
    Overlong(RawDesc, RawDesc),
    /// A further descriptor of an overlong chain; the one without has_next ends the chain.
    OverlongRest(RawDesc),
}

impl Popped {
    /// Whether this is part of an overlong chain, i.e. an error to report.
    pub const fn is_error(&self) -> bool {
        matches!(self, Popped::Overlong(..) | Popped::OverlongRest(_))
    }

    /// How many ring slots it took.
    pub const fn slots(&self) -> u16 {
        match self {
            Popped::One(_) | Popped::OverlongRest(_) => 1,
            Popped::Pair(..) | Popped::Overlong(..) => 2,
        }
    }
}

/// A ring the card produces into and the driver consumes from.
///
/// `S` is the slot memory and `N` the ring length; the defaults are the card's rings.
#[derive(Debug)]
pub struct ConsumerRing<S = RingMemory, const N: u16 = RING_LEN> {
    slots: S,
    regs: RingRegs,
    /// The next slot to consume.
    tail: RingPtr<N>,
    /// The tail last written to the CSR: the card may write up to `published + N`.
    published: RingPtr<N>,
    /// Inside a chain longer than two: consume one descriptor at a time until has_next clears.
    in_overlong: bool,
}

impl<S: RingSlots<N>, const N: u16> ConsumerRing<S, N> {
    /// A ring over `slots` with its tail at 0. Every slot is zeroed first: a valid bit left
    /// in the memory would be read as a descriptor.
    pub fn new(mut slots: S, regs: RingRegs) -> Self {
        let mut at = RingPtr::<N>::ZERO;
        for _ in 0..N {
            slots.clear(at);
            at = at.advance(1);
        }
        ConsumerRing {
            slots,
            regs,
            tail: RingPtr::ZERO,
            published: RingPtr::ZERO,
            in_overlong: false,
        }
    }

    /// The ring's registers.
    pub const fn regs(&self) -> RingRegs {
        self.regs
    }

    /// The next slot to consume.
    pub const fn tail(&self) -> RingPtr<N> {
        self.tail
    }

    /// The tail last written to the CSR.
    pub const fn published_tail(&self) -> RingPtr<N> {
        self.published
    }

    /// Consumes the next descriptor, or has_next pair, if the card has written it whole.
    /// `None` leaves the ring untouched: the slot at the tail is not valid yet, or it starts
    /// a pair whose second slot is not.
    pub fn pop(&mut self) -> Option<Popped> {
        let first_at = self.tail;
        if !self.slots.is_valid(first_at) {
            return None;
        }
        // The valid bit was written last: the rest of the descriptor is visible after it.
        fence(Ordering::Acquire);
        let first = self.slots.read(first_at);
        if self.in_overlong {
            self.consume(1);
            self.in_overlong = first.has_next();
            return Some(Popped::OverlongRest(first));
        }
        if !first.has_next() {
            self.consume(1);
            return Some(Popped::One(first));
        }
        let second_at = first_at.advance(1);
        if !self.slots.is_valid(second_at) {
            return None;
        }
        fence(Ordering::Acquire);
        let second = self.slots.read(second_at);
        self.consume(2);
        if second.has_next() {
            core_error!(
                "ring: chain longer than two descriptors at slot {}",
                first_at.idx()
            );
            self.in_overlong = true;
            return Some(Popped::Overlong(first, second));
        }
        Some(Popped::Pair(first, second))
    }

    /// Writes the tail CSR if the tail moved since the last write, so the card may reuse the
    /// consumed slots. Returns whether it wrote.
    pub fn sync_tail(&mut self, regs: &impl RegisterAccess) -> bool {
        if self.tail == self.published {
            return false;
        }
        // The zeroed slots must be in memory before the card may write them again.
        fence(Ordering::Release);
        regs.write32(self.regs.tail, self.tail.csr());
        self.published = self.tail;
        true
    }

    /// Pops up to `max` entries into `f`, then writes the tail CSR once if anything was
    /// consumed. Returns the number of entries.
    pub fn poll(
        &mut self,
        regs: &impl RegisterAccess,
        max: usize,
        mut f: impl FnMut(Popped),
    ) -> usize {
        let mut n = 0;
        while n < max {
            let Some(p) = self.pop() else { break };
            f(p);
            n += 1;
        }
        self.sync_tail(regs);
        n
    }

    /// The slot memory, e.g. to free it after the card has been stopped.
    pub fn into_slots(self) -> S {
        self.slots
    }

    /// Zeroes `count` slots from the tail and advances past them.
    fn consume(&mut self, count: u16) {
        for _ in 0..count {
            self.slots.clear(self.tail);
            self.tail = self.tail.advance(1);
        }
    }
}

impl ConsumerRing<RingMemory, RING_LEN> {
    /// Points the card at this ring and starts the ring where the card's head is.
    ///
    /// A card is not reset when its driver goes away: it writes its next descriptor at its
    /// head, wherever a previous driver left it. So the ring continues from there (0 on a
    /// card no driver has used): the base, low and high, then the tail (the credit) at that
    /// head, an empty ring. The head, the card's, is not written: a card that writes a
    /// descriptor between the reads and writes here would have it moved back. Only while
    /// the card is not using the ring, before any pop. A head that is not a ring pointer
    /// (not the card's BAR) is an error, and nothing is written.
    pub fn program(&mut self, regs: &impl RegisterAccess) -> Result<(), NotAPointer> {
        debug_assert!(
            self.tail == self.published && !self.in_overlong,
            "program before any pop"
        );
        let at = card_pointer(regs, self.regs.head)?;
        self.tail = at;
        self.published = at;
        let base = self.slots.device_addr().0;
        regs.write32(self.regs.base_lo, base as u32);
        regs.write32(self.regs.base_hi, (base >> 32) as u32);
        regs.write32(self.regs.tail, at.csr());
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

    const VALID: u8 = 0x80;
    const NEXT: u8 = 0xC0;

    /// The driver's ring and a second view of the same memory for the card's writes.
    fn rings(heap: &HeapDma) -> (ConsumerRing, RingMemory) {
        let mem = RingMemory::new(heap.buffer(0, RING_BYTES)).unwrap();
        let regs = RingRegs::of(RingId::MetaReport(0), DECODED_CHANNELS).unwrap();
        let card = RingMemory::new(heap.buffer(0, RING_BYTES)).unwrap();
        (ConsumerRing::new(mem, regs), card)
    }

    fn slot(heap: &HeapDma, idx: usize) -> &[u8] {
        &heap.bytes()[idx * 32..(idx + 1) * 32]
    }

    #[test]
    fn new_clears_stale_valid_bits() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut stale = RingMemory::new(heap.buffer(0, RING_BYTES)).unwrap();
        stale.write(RingPtr::new(0), &desc(1, VALID));
        let (mut ring, _card) = rings(&heap);
        assert_eq!(ring.pop(), None);
        assert!(heap.bytes().iter().all(|&b| b == 0));
    }

    #[test]
    fn empty_ring_pops_nothing_and_writes_no_tail() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, _card) = rings(&heap);
        let regs = MockRegs::default();
        assert_eq!(ring.poll(&regs, 16, |_| panic!("nothing to pop")), 0);
        assert!(regs.writes.borrow().is_empty());
        assert!(regs.reads.borrow().is_empty());
    }

    #[test]
    fn pops_in_order_zeroes_slots_and_writes_tail_once_per_poll() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, mut card) = rings(&heap);
        let regs = MockRegs::default();
        for i in 0..3u16 {
            card.write_valid_last(RingPtr::new(i), &desc(i as u8 + 1, VALID));
        }
        let mut got = Vec::new();
        assert_eq!(ring.poll(&regs, 16, |p| got.push(p)), 3);
        assert_eq!(got, [1, 2, 3].map(|t| Popped::One(desc(t, VALID))).to_vec());
        assert!(heap.bytes()[..3 * 32].iter().all(|&b| b == 0));
        assert_eq!(regs.writes_of(ring.regs().tail), [3]);
        // The head CSR is never read.
        assert!(regs.reads.borrow().is_empty());
        // Nothing new: no second tail write.
        assert_eq!(ring.poll(&regs, 16, |_| {}), 0);
        assert_eq!(regs.writes_of(ring.regs().tail), [3]);
    }

    #[test]
    fn poll_stops_at_max() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, mut card) = rings(&heap);
        let regs = MockRegs::default();
        for i in 0..5u16 {
            card.write_valid_last(RingPtr::new(i), &desc(9, VALID));
        }
        assert_eq!(ring.poll(&regs, 2, |_| {}), 2);
        assert_eq!(regs.writes_of(ring.regs().tail), [2]);
        assert!(slot(&heap, 2)[31] & VALID != 0);
    }

    #[test]
    fn pair_waits_for_its_second_descriptor_even_across_the_ring_end() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, mut card) = rings(&heap);
        let regs = MockRegs::default();
        // Move the tail to slot 4095 with singles.
        for i in 0..4095u16 {
            card.write_valid_last(RingPtr::new(i), &desc(0, VALID));
        }
        assert_eq!(ring.poll(&regs, usize::MAX, |_| {}), 4095);
        // First half of a pair in the last slot; the second is not written yet.
        card.write_valid_last(RingPtr::new(4095), &desc(0xA, NEXT));
        assert_eq!(ring.pop(), None);
        assert_eq!(ring.tail().raw(), 4095);
        assert_eq!(slot(&heap, 4095), &desc(0xA, NEXT).0);
        // The second lands in slot 0 (guard flipped).
        card.write_valid_last(RingPtr::new(0x1000), &desc(0xB, VALID));
        assert_eq!(
            ring.pop(),
            Some(Popped::Pair(desc(0xA, NEXT), desc(0xB, VALID)))
        );
        assert_eq!(ring.tail().raw(), 0x1001);
        assert!(slot(&heap, 4095)
            .iter()
            .chain(slot(&heap, 0))
            .all(|&b| b == 0));
        ring.sync_tail(&regs);
        assert_eq!(regs.writes_of(ring.regs().tail).last(), Some(&0x1001));
    }

    #[test]
    fn wrapped_slots_are_read_as_empty_until_rewritten() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, mut card) = rings(&heap);
        let regs = MockRegs::default();
        let mut at = RingPtr::ZERO;
        for round in 0..3u8 {
            for _ in 0..4096 {
                card.write_valid_last(at, &desc(round, VALID));
                at = at.advance(1);
            }
            let mut count = 0;
            ring.poll(&regs, usize::MAX, |p| {
                assert_eq!(p, Popped::One(desc(round, VALID)));
                count += 1;
            });
            assert_eq!(count, 4096);
            assert_eq!(ring.pop(), None);
        }
        assert_eq!(ring.tail().raw(), (3 * 4096 % 8192) as u16);
    }

    #[test]
    fn overlong_chain_is_consumed_and_reported() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, mut card) = rings(&heap);
        let regs = MockRegs::default();
        let chain = [
            desc(1, NEXT),
            desc(2, NEXT),
            desc(3, NEXT),
            desc(4, VALID),
            desc(5, VALID),
        ];
        for (i, d) in chain.iter().enumerate() {
            card.write_valid_last(RingPtr::new(i as u16), d);
        }
        let mut got = Vec::new();
        assert_eq!(ring.poll(&regs, 16, |p| got.push(p)), 4);
        assert_eq!(
            got,
            [
                Popped::Overlong(chain[0], chain[1]),
                Popped::OverlongRest(chain[2]),
                Popped::OverlongRest(chain[3]),
                Popped::One(chain[4]),
            ]
        );
        assert_eq!(
            got.iter().map(Popped::is_error).collect::<Vec<_>>(),
            [true, true, true, false]
        );
        assert_eq!(got.iter().map(Popped::slots).sum::<u16>(), 5);
        assert_eq!(regs.writes_of(ring.regs().tail), [5]);
    }

    #[test]
    fn overlong_chain_waits_for_its_next_member() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, mut card) = rings(&heap);
        card.write_valid_last(RingPtr::new(0), &desc(1, NEXT));
        card.write_valid_last(RingPtr::new(1), &desc(2, NEXT));
        assert!(matches!(ring.pop(), Some(Popped::Overlong(..))));
        assert_eq!(ring.pop(), None);
        card.write_valid_last(RingPtr::new(2), &desc(3, VALID));
        assert_eq!(ring.pop(), Some(Popped::OverlongRest(desc(3, VALID))));
        card.write_valid_last(RingPtr::new(3), &desc(4, NEXT));
        card.write_valid_last(RingPtr::new(4), &desc(5, VALID));
        assert_eq!(
            ring.pop(),
            Some(Popped::Pair(desc(4, NEXT), desc(5, VALID)))
        );
    }

    #[test]
    fn program_starts_an_unused_card_at_0_writing_base_then_tail_never_the_head() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, _card) = rings(&heap);
        let regs = MockRegs::default();
        ring.program(&regs).unwrap();
        let base = heap.buffer(0, 1).device_addr().0;
        let r = ring.regs();
        assert_eq!(
            *regs.writes.borrow(),
            [
                (r.base_lo, base as u32),
                (r.base_hi, (base >> 32) as u32),
                (r.tail, 0)
            ]
        );
        assert_eq!(ring.tail(), RingPtr::ZERO);
    }

    #[test]
    fn program_continues_where_a_previous_driver_left_the_card_head() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, mut card) = rings(&heap);
        let regs = MockRegs::default();
        // A previous driver took 0x1040 descriptors; the card writes its next at slot 0x40.
        regs.set(ring.regs().head, 0x1040);
        ring.program(&regs).unwrap();
        assert_eq!(regs.writes_of(ring.regs().tail), [0x1040]);
        assert_eq!(regs.writes_of(ring.regs().head), Vec::<u32>::new());
        assert_eq!(ring.tail(), RingPtr::new(0x1040));
        // The card's next report lands at its head, and that is where the driver looks.
        card.write_valid_last(RingPtr::new(0x40), &desc(9, VALID));
        assert_eq!(ring.pop(), Some(Popped::One(desc(9, VALID))));
        ring.sync_tail(&regs);
        assert_eq!(regs.writes_of(ring.regs().tail), [0x1040, 0x1041]);
    }

    #[test]
    fn program_refuses_a_head_that_is_not_a_ring_pointer_and_writes_nothing() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let (mut ring, _card) = rings(&heap);
        let regs = MockRegs::default();
        regs.set(ring.regs().head, 0xAAAA_AAAA);
        let e = ring.program(&regs).unwrap_err();
        assert_eq!(e.read, 0xAAAA_AAAA);
        assert_eq!(e.reg, ring.regs().head);
        assert!(std::format!("{e}").contains("0x18 reads 0xaaaaaaaa"), "{e}");
        assert!(regs.writes.borrow().is_empty());
    }
}
