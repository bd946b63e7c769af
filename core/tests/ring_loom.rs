//! Loom model of the ring protocol (hardware-contract.md "Rings", layout-verification.md
//! section 3): the real `ProducerRing` and `ConsumerRing` on a 4-slot ring, against a card
//! thread that follows the card's side of the contract.
//!
//! Slot memory is a loom `UnsafeCell` for the first three words and an atomic for the word
//! with the valid bit, so loom reports any access to a descriptor body that is not ordered
//! by the ring's fences and register accesses (a torn read, or a slot reused too early).
//! Registers are relaxed atomics: all ordering on the driver side must come from the ring's
//! own `fence` calls. The card side uses Acquire on the registers it reads and Release on
//! the ones it writes and on the valid word, as the device's ordering guarantees.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p bluerdma-core --test ring_loom --release`.
//! `LOOM_MAX_PREEMPTIONS` overrides the preemption bound (default 4).
#![cfg(loom)]

use bluerdma_core::desc::RawDesc;
use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Reg, RingId, DECODED_CHANNELS};
use bluerdma_core::ring::{
    ConsumerRing, Popped, ProducerRing, PushError, RingPtr, RingRegs, RingSlots,
};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Slots of the model ring.
const N: u16 = 4;
type Ptr = RingPtr<N>;

/// One 32-byte slot: three body words and the word holding byte 31 (valid, has_next).
struct Slot {
    body: UnsafeCell<[u64; 3]>,
    last: AtomicU64,
}

/// The ring's memory, shared by driver and card.
#[derive(Clone)]
struct Memory(Arc<[Slot; N as usize]>);

impl Memory {
    fn new() -> Self {
        Memory(Arc::new(std::array::from_fn(|_| Slot {
            body: UnsafeCell::new([0; 3]),
            last: AtomicU64::new(0),
        })))
    }

    fn slot(&self, at: Ptr) -> &Slot {
        &self.0[usize::from(at.idx())]
    }

    fn load(&self, at: Ptr, last: Ordering) -> RawDesc {
        let slot = self.slot(at);
        // SAFETY: loom checks that this read is ordered after every write to the body.
        let [w0, w1, w2] = slot.body.with(|p| unsafe { *p });
        let w3 = slot.last.load(last);
        words_to_desc([w0, w1, w2, w3])
    }

    fn store(&self, at: Ptr, desc: &RawDesc, last: Ordering) {
        let [w0, w1, w2, w3] = desc_to_words(desc);
        let slot = self.slot(at);
        // SAFETY: loom checks that this write is ordered against every other access.
        slot.body.with_mut(|p| unsafe { *p = [w0, w1, w2] });
        slot.last.store(w3, last);
    }

    /// The card reads a host-to-card descriptor after an Acquire load of head.
    fn card_fetch(&self, at: Ptr) -> RawDesc {
        self.load(at, Ordering::Relaxed)
    }

    /// The card writes a card-to-host descriptor: the body, then the valid word (Release:
    /// the device makes the body visible no later than the valid bit).
    fn card_publish(&self, at: Ptr, desc: &RawDesc) {
        self.store(at, desc, Ordering::Release);
    }
}

fn desc_to_words(d: &RawDesc) -> [u64; 4] {
    let mut w = [0u64; 4];
    for (i, chunk) in d.0.chunks_exact(8).enumerate() {
        w[i] = u64::from_le_bytes(chunk.try_into().unwrap());
    }
    w
}

fn words_to_desc(w: [u64; 4]) -> RawDesc {
    let mut d = [0u8; 32];
    for (i, word) in w.iter().enumerate() {
        d[8 * i..8 * i + 8].copy_from_slice(&word.to_le_bytes());
    }
    RawDesc(d)
}

/// The driver's view: plain accesses, all ordering from the ring code.
impl RingSlots<N> for Memory {
    fn is_valid(&self, at: Ptr) -> bool {
        self.slot(at).last.load(Ordering::Relaxed).to_le_bytes()[7] & 0x80 != 0
    }
    fn read(&self, at: Ptr) -> RawDesc {
        self.load(at, Ordering::Relaxed)
    }
    fn write(&mut self, at: Ptr, desc: &RawDesc) {
        self.store(at, desc, Ordering::Relaxed)
    }
    fn clear(&mut self, at: Ptr) {
        self.store(at, &RawDesc::ZERO, Ordering::Relaxed)
    }
}

/// Head and tail registers of one ring. The driver's accesses are relaxed.
struct Regs {
    ring: RingRegs,
    head: AtomicU32,
    tail: AtomicU32,
}

impl Regs {
    fn new(id: RingId) -> Arc<Self> {
        Arc::new(Regs {
            ring: RingRegs::of(id, DECODED_CHANNELS).unwrap(),
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
        })
    }

    fn reg(&self, reg: Reg) -> &AtomicU32 {
        if reg == self.ring.head {
            &self.head
        } else if reg == self.ring.tail {
            &self.tail
        } else {
            panic!("access to {reg:?}")
        }
    }
}

impl RegisterAccess for Regs {
    fn read32(&self, reg: Reg) -> u32 {
        self.reg(reg).load(Ordering::Relaxed)
    }
    fn write32(&self, reg: Reg, value: u32) {
        self.reg(reg).store(value, Ordering::Relaxed)
    }
}

/// A descriptor whose every byte derives from `seq`, so a torn copy cannot pass for one.
fn tagged(seq: u8, flags: u8) -> RawDesc {
    let mut d = [seq.wrapping_mul(37).wrapping_add(1); 32];
    d[0] = seq;
    d[31] = flags;
    RawDesc(d)
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(4);
    }
    builder.check(f);
}

/// Host to card: batches of 3, 2 and 2 descriptors through a 4-slot ring, so the driver
/// must wait for the card, read the tail, reuse fetched slots and wrap.
#[test]
fn host_to_card_descriptors_arrive_once_in_order_and_whole() {
    model(|| {
        let expected: Vec<RawDesc> = (0..7).map(|i| tagged(i, 0x80)).collect();
        let memory = Memory::new();
        let regs = Regs::new(RingId::Send(0));

        let card = {
            let (memory, regs) = (memory.clone(), regs.clone());
            thread::spawn(move || {
                let mut fetch = Ptr::ZERO;
                let mut got = Vec::new();
                while got.len() < 7 {
                    let head = Ptr::new(regs.head.load(Ordering::Acquire) as u16);
                    if head == fetch {
                        thread::yield_now();
                        continue;
                    }
                    got.push(memory.card_fetch(fetch));
                    fetch = fetch.advance(1);
                    // Tail moves per descriptor fetched; the slot may be reused.
                    regs.tail.store(fetch.csr(), Ordering::Release);
                }
                got
            })
        };

        let mut ring = ProducerRing::<Memory, N>::new(memory, regs.ring);
        for batch in [&expected[0..3], &expected[3..5], &expected[5..7]] {
            loop {
                match ring.push_batch(&*regs, batch) {
                    Ok(()) => break,
                    Err(PushError::Full { .. }) => thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert_eq!(card.join().unwrap(), expected);
        assert_eq!(ring.head().raw(), 7);
    });
}

/// Card to host: a single, a pair, and a pair straddling the ring end, written one
/// descriptor at a time as the tail CSR allows; the driver polls concurrently.
#[test]
fn card_to_host_events_arrive_once_in_order_and_whole() {
    model(|| {
        let stream = [
            tagged(0, 0x80),
            tagged(1, 0xC0),
            tagged(2, 0x80),
            tagged(3, 0xC0),
            tagged(4, 0x80),
        ];
        let expected = [
            Popped::One(stream[0]),
            Popped::Pair(stream[1], stream[2]),
            Popped::Pair(stream[3], stream[4]),
        ];
        let memory = Memory::new();
        let regs = Regs::new(RingId::MetaReport(0));
        let mut ring = ConsumerRing::<Memory, N>::new(memory.clone(), regs.ring);

        let card = {
            let regs = regs.clone();
            thread::spawn(move || {
                let mut head = Ptr::ZERO;
                for desc in &stream {
                    while Ptr::free(head, Ptr::new(regs.tail.load(Ordering::Acquire) as u16)) == 0 {
                        thread::yield_now();
                    }
                    memory.card_publish(head, desc);
                    head = head.advance(1);
                    regs.head.store(head.csr(), Ordering::Release);
                }
            })
        };

        let mut got = Vec::new();
        while got.len() < expected.len() {
            if ring.poll(&*regs, usize::MAX, |p| got.push(p)) == 0 {
                thread::yield_now();
            }
        }
        card.join().unwrap();
        assert_eq!(got, expected);
        assert_eq!(ring.tail().raw(), 5);
        assert_eq!(regs.tail.load(Ordering::Relaxed), 5);
    });
}
