//! Ring throughput: pushing batches of 1, 16 and 64 descriptors into a host-to-card ring, and
//! polling a card-to-host ring, on heap memory with atomic registers. Criterion reports
//! elements per second; ns per descriptor is its reciprocal.
//!
//! Run: `cargo bench -p bluerdma-core --bench ring -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bluerdma_core::desc::RawDesc;
use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Reg, RingId, DECODED_CHANNELS};
use bluerdma_core::ring::{ConsumerRing, Popped, ProducerRing, RingPtr, RingRegs};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

#[path = "../tests/support/heap_ring.rs"]
mod heap_ring;
use heap_ring::HeapRing;

/// Registers of a card that fetches instantly: the tail always reads as the last head.
struct InstantCard {
    regs: RingRegs,
    head: AtomicU32,
    tail: AtomicU32,
}

impl RegisterAccess for InstantCard {
    fn read32(&self, reg: Reg) -> u32 {
        if reg == self.regs.tail {
            self.head.load(Ordering::Relaxed)
        } else {
            0
        }
    }
    fn write32(&self, reg: Reg, value: u32) {
        if reg == self.regs.head {
            self.head.store(value, Ordering::Relaxed);
        } else if reg == self.regs.tail {
            self.tail.store(value, Ordering::Relaxed);
        }
    }
}

fn desc(i: usize, flags: u8) -> RawDesc {
    let mut d = [i as u8; 32];
    d[31] = flags;
    RawDesc(d)
}

fn push(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring/push");
    for batch in [1usize, 16, 64] {
        let mem = HeapRing::new();
        let regs = RingRegs::of(RingId::Send(0), DECODED_CHANNELS).unwrap();
        let card = InstantCard {
            regs,
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
        };
        let mut ring = ProducerRing::new(mem.view(), regs);
        let descs: Vec<RawDesc> = (0..batch).map(|i| desc(i, 0x80)).collect();
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(BenchmarkId::from_parameter(batch), |b| {
            // The tail CSR is read once per ring's worth of descriptors, when it looks full.
            b.iter(|| ring.push_batch(&card, black_box(&descs)).unwrap())
        });
    }
    group.finish();
}

fn poll(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring/poll");
    for (name, flags) in [("single", [0x80, 0x80]), ("pair", [0xC0, 0x80])] {
        const ROUND: u16 = 64;
        let mem = HeapRing::new();
        let regs = RingRegs::of(RingId::MetaReport(0), DECODED_CHANNELS).unwrap();
        let card_regs = InstantCard {
            regs,
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
        };
        let mut card = mem.view();
        let mut card_head = RingPtr::ZERO;
        let mut ring = ConsumerRing::new(mem.view(), regs);
        group.throughput(Throughput::Elements(ROUND.into()));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    // The card writes a round (untimed), the driver polls it (timed).
                    for i in 0..ROUND {
                        card.write_valid_last(
                            card_head,
                            &desc(i.into(), flags[usize::from(i % 2)]),
                        );
                        card_head = card_head.advance(1);
                    }
                    let start = Instant::now();
                    let (mut popped, mut seen) = (0, 0u8);
                    // A consumer decodes fields at once; here, fold the last tag into `seen`.
                    ring.poll(&card_regs, usize::MAX, |p| {
                        popped += p.slots();
                        if let Popped::One(d) | Popped::Pair(_, d) = p {
                            seen ^= d.0[0];
                        }
                    });
                    timed += start.elapsed();
                    black_box(seen);
                    assert_eq!(popped, ROUND);
                }
                timed
            })
        });
    }
    group.finish();
}

/// The floor for a push: copying 64 ready-made 32-byte descriptors into ring memory with
/// plain stores (no fence, no doorbell), measured in the same run as the ring figures.
fn baseline(c: &mut Criterion) {
    const BATCH: usize = 64;
    let mem = HeapRing::new();
    let src: Vec<RawDesc> = (0..BATCH).map(|i| desc(i, 0x80)).collect();
    let mut group = c.benchmark_group("ring/baseline");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("memcpy 32 B", |b| {
        b.iter(|| {
            // SAFETY: the first BATCH slots of a live, page-aligned RING_BYTES allocation that
            // nothing else uses while the bench runs; RawDesc is plain bytes, align 8.
            let ring =
                unsafe { std::slice::from_raw_parts_mut(mem.as_ptr().cast::<RawDesc>(), BATCH) };
            ring.copy_from_slice(black_box(&src));
            black_box(ring.as_ptr());
        })
    });
    group.finish();
}

criterion_group!(benches, baseline, push, poll);
criterion_main!(benches);
