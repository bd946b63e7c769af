//! Model test of the rings: random sequences of driver and card steps, checked against a
//! `VecDeque` model, with a fake card that keeps the registers and reads and writes the same
//! heap memory as the driver (hardware-contract.md "Rings", layout-verification.md section 3).
//!
//! Host to card: every accepted batch reaches the card in order, exactly once; a batch is
//! refused exactly when the card's real free space is too small; one doorbell per batch; the
//! tail CSR is read only when the cached tail says the batch does not fit; an impossible tail
//! is an error that changes nothing.
//! Card to host: events of 1, 2 (has_next pair) and 3-4 (overlong chain) descriptors, written
//! one descriptor at a time and so split anywhere, come out whole and in order; a slot the
//! card is allowed to write again is always zero; the head CSR is never read.

use std::cell::Cell;
use std::collections::VecDeque;

use bluerdma_core::desc::RawDesc;
use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Reg, RingId, DECODED_CHANNELS};
use bluerdma_core::ring::{
    ConsumerRing, ImpossibleTail, Popped, ProducerRing, PushError, RingMemory, RingPtr, RingRegs,
    RING_LEN,
};
use proptest::prelude::*;

#[path = "support/heap_ring.rs"]
mod heap_ring;
use heap_ring::HeapRing;

/// The card's registers for one host-to-card and one card-to-host ring, with access counts.
struct FakeRegs {
    tx: RingRegs,
    rx: RingRegs,
    tx_head: Cell<u32>,
    tx_tail: Cell<u32>,
    rx_head: Cell<u32>,
    rx_tail: Cell<u32>,
    /// Returned by the next read of the TX tail instead of the real value.
    bogus_tx_tail: Cell<Option<u32>>,
    tx_tail_reads: Cell<usize>,
    tx_head_writes: Cell<usize>,
    rx_tail_writes: Cell<usize>,
    other_accesses: Cell<usize>,
}

impl FakeRegs {
    fn new() -> Self {
        FakeRegs {
            tx: RingRegs::of(RingId::Send(0), DECODED_CHANNELS).unwrap(),
            rx: RingRegs::of(RingId::MetaReport(0), DECODED_CHANNELS).unwrap(),
            tx_head: Cell::new(0),
            tx_tail: Cell::new(0),
            rx_head: Cell::new(0),
            rx_tail: Cell::new(0),
            bogus_tx_tail: Cell::new(None),
            tx_tail_reads: Cell::new(0),
            tx_head_writes: Cell::new(0),
            rx_tail_writes: Cell::new(0),
            other_accesses: Cell::new(0),
        }
    }
}

impl RegisterAccess for FakeRegs {
    fn read32(&self, reg: Reg) -> u32 {
        if reg == self.tx.tail {
            self.tx_tail_reads.set(self.tx_tail_reads.get() + 1);
            return self.bogus_tx_tail.take().unwrap_or(self.tx_tail.get());
        }
        // The driver has no business reading anything else, the RX head least of all.
        self.other_accesses.set(self.other_accesses.get() + 1);
        0
    }

    fn write32(&self, reg: Reg, value: u32) {
        if reg == self.tx.head {
            self.tx_head_writes.set(self.tx_head_writes.get() + 1);
            self.tx_head.set(value);
        } else if reg == self.rx.tail {
            self.rx_tail_writes.set(self.rx_tail_writes.get() + 1);
            self.rx_tail.set(value);
        } else {
            self.other_accesses.set(self.other_accesses.get() + 1);
        }
    }
}

/// A descriptor that names its position in a stream, so loss, duplication and reordering
/// show up as a mismatch.
fn tagged(seq: u32, flags: u8) -> RawDesc {
    let mut d = [0u8; 32];
    d[..4].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in d.iter_mut().enumerate().skip(4) {
        *b = (seq as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    d[31] = flags;
    RawDesc(d)
}

#[derive(Clone, Debug)]
enum Op {
    /// The driver pushes a batch of this many descriptors.
    Push(u16),
    /// The card fetches up to this many descriptors from the TX ring.
    CardFetch(u16),
    /// The next TX tail read returns this (made impossible if it happens to be plausible).
    BogusTail(u32),
    /// The card queues this many events, their lengths drawn from the pattern: singles and
    /// has_next pairs, and now and then an overlong chain of 3 or 4.
    CardQueue(u16, u64),
    /// The card writes up to this many queued descriptors, as far as the tail CSR allows.
    CardWrite(u16),
    /// The driver pops up to this many entries without writing the tail CSR.
    Pop(u16),
    /// The driver polls up to this many entries, then writes the tail CSR.
    Poll(u16),
}

fn count() -> impl Strategy<Value = u16> {
    prop_oneof![4 => 0u16..80, 1 => 0u16..=4200]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => count().prop_map(Op::Push),
        3 => count().prop_map(Op::CardFetch),
        1 => prop_oneof![0u32..0x2000, any::<u32>()].prop_map(Op::BogusTail),
        3 => (count(), any::<u64>()).prop_map(|(n, pattern)| Op::CardQueue(n, pattern)),
        3 => count().prop_map(Op::CardWrite),
        2 => count().prop_map(Op::Pop),
        2 => count().prop_map(Op::Poll),
    ]
}

/// Driver, fake card and model of one test case.
struct World {
    regs: FakeRegs,
    producer: ProducerRing,
    card_tx: RingMemory,
    /// Pushed, not yet fetched by the card.
    tx_model: VecDeque<RawDesc>,
    tx_seq: u32,
    consumer: ConsumerRing,
    card_rx: RingMemory,
    /// Every descriptor the card has queued, in ring order.
    rx_stream: Vec<RawDesc>,
    /// (first stream index, length) of events not fully consumed.
    rx_events: VecDeque<(usize, usize)>,
    rx_written: usize,
    rx_consumed: usize,
    // Keep the memory alive as long as the views.
    _mem: [HeapRing; 2],
}

impl World {
    fn new() -> Self {
        let (tx_mem, rx_mem) = (HeapRing::new(), HeapRing::new());
        let regs = FakeRegs::new();
        let mut producer = ProducerRing::new(tx_mem.view(), regs.tx);
        let mut consumer = ConsumerRing::new(rx_mem.view(), regs.rx);
        producer.program(&regs).unwrap();
        consumer.program(&regs).unwrap();
        regs.other_accesses.set(0);
        regs.tx_head_writes.set(0);
        regs.rx_tail_writes.set(0);
        World {
            card_tx: tx_mem.view(),
            card_rx: rx_mem.view(),
            regs,
            producer,
            consumer,
            tx_model: VecDeque::new(),
            tx_seq: 0,
            rx_stream: Vec::new(),
            rx_events: VecDeque::new(),
            rx_written: 0,
            rx_consumed: 0,
            _mem: [tx_mem, rx_mem],
        }
    }

    fn push(&mut self, n: u16) {
        // Make a pending bogus tail impossible for the state it will be read in.
        if let Some(v) = self.regs.bogus_tx_tail.get() {
            let fetched = self
                .producer
                .head()
                .distance_from(self.producer.cached_tail());
            if let Some(t) = RingPtr::<RING_LEN>::from_csr(v) {
                if t.distance_from(self.producer.cached_tail()) <= fetched {
                    self.regs.bogus_tx_tail.set(Some(v | 0x8000_0000));
                }
            }
        }
        let card_tail = RingPtr::<RING_LEN>::new(self.regs.tx_tail.get() as u16);
        let real_free = RingPtr::free(self.producer.head(), card_tail);
        let needs_read = n > 0 && n <= RING_LEN && self.producer.free_slots() < n;
        let bogus = self.regs.bogus_tx_tail.get().filter(|_| needs_read);
        let (head_before, tail_before) = (self.producer.head(), self.producer.cached_tail());
        let (reads, doorbells) = (
            self.regs.tx_tail_reads.get(),
            self.regs.tx_head_writes.get(),
        );

        let descs: Vec<RawDesc> = (0..u32::from(n))
            .map(|i| tagged(self.tx_seq + i, 0x80))
            .collect();
        let result = self.producer.push_batch(&self.regs, &descs);

        assert_eq!(
            self.regs.tx_tail_reads.get() - reads,
            usize::from(needs_read)
        );
        let expected = if n == 0 {
            Ok(())
        } else if n > RING_LEN {
            Err(PushError::BatchTooLarge {
                requested: n.into(),
            })
        } else if let Some(read) = bogus {
            Err(PushError::ImpossibleTail(ImpossibleTail {
                read,
                head: head_before.raw(),
                cached_tail: tail_before.raw(),
            }))
        } else if real_free < n {
            Err(PushError::Full {
                requested: n,
                free: real_free,
            })
        } else {
            Ok(())
        };
        assert_eq!(result, expected);
        let rang = result.is_ok() && n > 0;
        assert_eq!(
            self.regs.tx_head_writes.get() - doorbells,
            usize::from(rang)
        );
        if rang {
            self.tx_model.extend(descs);
            self.tx_seq += u32::from(n);
            assert_eq!(self.regs.tx_head.get(), self.producer.head().csr());
        } else {
            assert_eq!(self.producer.head(), head_before);
            if bogus.is_some() {
                assert_eq!(self.producer.cached_tail(), tail_before);
            }
        }
    }

    fn card_fetch(&mut self, k: u16) {
        let head = RingPtr::<RING_LEN>::new(self.regs.tx_head.get() as u16);
        let mut tail = RingPtr::<RING_LEN>::new(self.regs.tx_tail.get() as u16);
        for _ in 0..k {
            if tail == head {
                break;
            }
            let got = self.card_tx.read(tail);
            assert_eq!(
                Some(got),
                self.tx_model.pop_front(),
                "card fetched at {tail:?}"
            );
            tail = tail.advance(1);
            self.regs.tx_tail.set(tail.csr());
        }
    }

    fn card_queue(&mut self, events: u16, pattern: u64) {
        for i in 0..events {
            let len: u8 = match (pattern >> (2 * (i % 32))) & 3 {
                0 | 1 => 1,
                2 => 2,
                _ if i % 8 == 3 => 3 + (i % 2) as u8,
                _ => 2,
            };
            let start = self.rx_stream.len();
            for i in 0..len {
                let flags = if i + 1 < len { 0xC0 } else { 0x80 };
                self.rx_stream
                    .push(tagged((start + usize::from(i)) as u32, flags));
            }
            self.rx_events.push_back((start, usize::from(len)));
        }
    }

    fn card_write(&mut self, k: u16) {
        let tail = RingPtr::<RING_LEN>::new(self.regs.rx_tail.get() as u16);
        let mut head = RingPtr::<RING_LEN>::new(self.regs.rx_head.get() as u16);
        for _ in 0..k {
            if self.rx_written == self.rx_stream.len() || RingPtr::free(head, tail) == 0 {
                break;
            }
            // The driver zeroed the slot before it released it with the tail CSR.
            assert_eq!(
                self.card_rx.read(head),
                RawDesc::ZERO,
                "slot {head:?} not cleared"
            );
            self.card_rx
                .write_valid_last(head, &self.rx_stream[self.rx_written]);
            self.rx_written += 1;
            head = head.advance(1);
            self.regs.rx_head.set(head.csr());
        }
    }

    /// What the next pop must return, by events rather than by descriptors.
    fn expected_pop(&mut self) -> Option<Popped> {
        let &(start, len) = self.rx_events.front()?;
        let avail = self.rx_written - self.rx_consumed;
        let s = &self.rx_stream;
        let c = self.rx_consumed;
        let (popped, took) = match len {
            1 if avail >= 1 => (Popped::One(s[c]), 1),
            2 if avail >= 2 => (Popped::Pair(s[c], s[c + 1]), 2),
            _ if len >= 3 && c == start && avail >= 2 => (Popped::Overlong(s[c], s[c + 1]), 2),
            _ if len >= 3 && c > start && avail >= 1 => (Popped::OverlongRest(s[c]), 1),
            _ => return None,
        };
        self.rx_consumed += took;
        if self.rx_consumed == start + len {
            self.rx_events.pop_front();
        }
        Some(popped)
    }

    fn pop(&mut self, k: u16) {
        let tail_csr = self.regs.rx_tail.get();
        for _ in 0..k {
            let expected = self.expected_pop();
            assert_eq!(self.consumer.pop(), expected);
            if expected.is_none() {
                break;
            }
        }
        assert_eq!(self.regs.rx_tail.get(), tail_csr, "pop wrote the tail CSR");
    }

    fn poll(&mut self, k: u16) {
        let writes = self.regs.rx_tail_writes.get();
        let moved = self.consumer.tail() != self.consumer.published_tail();
        let mut got = Vec::new();
        let n = self.consumer.poll(&self.regs, k.into(), |p| got.push(p));
        assert_eq!(n, got.len());
        for p in &got {
            assert_eq!(Some(*p), self.expected_pop());
        }
        if n < usize::from(k) {
            assert_eq!(self.expected_pop(), None, "poll stopped early");
        }
        assert_eq!(self.regs.rx_tail.get(), self.consumer.tail().csr());
        let wrote = self.regs.rx_tail_writes.get() - writes;
        assert_eq!(wrote, usize::from(moved || n > 0));
    }

    fn check_invariants(&self) {
        let p = &self.producer;
        let card_tail = RingPtr::<RING_LEN>::new(self.regs.tx_tail.get() as u16);
        assert!(RingPtr::is_consistent(p.head(), p.cached_tail()));
        assert_eq!(
            usize::from(RingPtr::used(p.head(), card_tail)),
            self.tx_model.len()
        );
        assert!(p.free_slots() <= RingPtr::free(p.head(), card_tail));
        assert_eq!(
            self.regs.other_accesses.get(),
            0,
            "access to another register"
        );
        assert_eq!(usize::from(p.head().raw()), self.tx_seq as usize % 8192);
        let c = &self.consumer;
        assert_eq!(usize::from(c.tail().raw()), self.rx_consumed % 8192);
        assert_eq!(c.published_tail().csr(), self.regs.rx_tail.get());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn rings_match_the_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut w = World::new();
        for op in &ops {
            match op {
                Op::Push(n) => w.push(*n),
                Op::CardFetch(k) => w.card_fetch(*k),
                Op::BogusTail(v) => w.regs.bogus_tx_tail.set(Some(*v)),
                Op::CardQueue(n, pattern) => w.card_queue(*n, *pattern),
                Op::CardWrite(k) => w.card_write(*k),
                Op::Pop(k) => w.pop(*k),
                Op::Poll(k) => w.poll(*k),
            }
            w.check_invariants();
        }
        // Drain both rings: nothing is lost or left behind.
        w.card_fetch(u16::MAX);
        prop_assert!(w.tx_model.is_empty());
        loop {
            let progress = |w: &World| (w.rx_written, w.rx_consumed, w.regs.rx_tail.get());
            let before = progress(&w);
            w.card_write(u16::MAX);
            w.poll(u16::MAX);
            if progress(&w) == before {
                break;
            }
        }
        prop_assert_eq!(w.rx_consumed, w.rx_stream.len());
    }
}
