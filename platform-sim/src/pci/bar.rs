//! The BAR of a served PCI card: `resource0` of the fake tree, mapped shared with the
//! driver, mirrored to and from the model's [`RegisterFile`] by one thread.
//!
//! Each register has one owner. The driver owns the ring bases, the heads of host-to-card
//! rings and the tails of card-to-host rings; the card owns the other pointer of each ring
//! and the counters. The mirror copies what changed in the BAR into the register file (a
//! driver write: a doorbell wakes the model), and what the card changed into the BAR. It
//! never writes back a register the driver owns, so no driver write is ever undone. A
//! card-owned register the driver writes (it resets both pointers when it programs a
//! ring) reaches the model as well: the mirror keeps the value it last saw in each
//! register and forwards any other one.
//!
//! The thread polls: after a round with nothing new it yields, then sleeps from 10 us up
//! to 200 us, so an idle card costs little and a doorbell waits at most that long.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bluerdma_core::regs::{Counter, Direction, RingId, RingReg, DECODED_CHANNELS};

use crate::model::regs::RegisterFile;

/// BAR0 mapped from a file shared with the driver.
pub struct SharedBar {
    base: NonNull<u32>,
    len: usize,
}

// SAFETY: the mapping is owned by this value; accesses are single aligned 32-bit volatile
// loads and stores, which another process may make at the same time (that is the point).
unsafe impl Send for SharedBar {}
// SAFETY: as above.
unsafe impl Sync for SharedBar {}

impl SharedBar {
    /// Maps `file` (at least `len` bytes) shared.
    pub fn map(file: &std::fs::File, len: usize) -> io::Result<Self> {
        let base = super::map_shared(file, len)?.cast::<u32>();
        Ok(SharedBar { base, len })
    }

    fn slot(&self, offset: u16) -> *mut u32 {
        debug_assert!((offset as usize) + 4 <= self.len && offset % 4 == 0);
        // SAFETY: offsets come from decoded registers, all below 0x1000 < len.
        unsafe { self.base.as_ptr().add(offset as usize / 4) }
    }

    /// Reads the register at `offset`.
    pub fn read(&self, offset: u16) -> u32 {
        // SAFETY: an aligned slot inside the live mapping; volatile: the driver writes it.
        u32::from_le(unsafe { self.slot(offset).read_volatile() })
    }

    /// Writes the register at `offset`.
    pub fn write(&self, offset: u16, value: u32) {
        // SAFETY: as in `read`.
        unsafe { self.slot(offset).write_volatile(value.to_le()) }
    }
}

impl Drop for SharedBar {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`; no pointer into it outlives `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// One mirrored register.
struct Mirrored {
    offset: u16,
    /// Ring registers: which ring and register; `None` for a counter.
    ring: Option<(RingId, RingReg)>,
    counter: Option<Counter>,
    card_owned: bool,
    last: u32,
}

fn registers() -> Vec<Mirrored> {
    let mut regs = Vec::new();
    for id in RingId::ALL_CH0 {
        for r in [
            RingReg::BaseLo,
            RingReg::BaseHi,
            RingReg::Head,
            RingReg::Tail,
        ] {
            let Some(reg) = id.reg(r, DECODED_CHANNELS) else {
                continue;
            };
            let card_owned = matches!(
                (id.direction(), r),
                (Direction::HostToCard, RingReg::Tail) | (Direction::CardToHost, RingReg::Head)
            );
            regs.push(Mirrored {
                offset: reg.offset(),
                ring: Some((id, r)),
                counter: None,
                card_owned,
                last: 0,
            });
        }
    }
    for c in Counter::ALL {
        regs.push(Mirrored {
            offset: c.reg().offset(),
            ring: None,
            counter: Some(c),
            card_owned: true,
            last: 0,
        });
    }
    regs
}

/// The mirror thread; stops when dropped.
pub struct BarMirror {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BarMirror {
    /// Starts mirroring `bar` and `file`.
    pub fn start(bar: SharedBar, file: Arc<RegisterFile>, name: &str) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name(format!("{name}-bar"))
            .spawn(move || mirror(&bar, &file, &flag))?;
        Ok(BarMirror {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for BarMirror {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One pass over every register; returns whether anything moved.
fn round(bar: &SharedBar, file: &RegisterFile, regs: &mut [Mirrored]) -> bool {
    let mut moved = false;
    for m in regs.iter_mut() {
        let in_bar = bar.read(m.offset);
        if in_bar != m.last && m.counter.is_none() {
            // The driver wrote it.
            m.last = in_bar;
            if file.write(m.offset as u32, in_bar).is_err() {
                log::error!("BAR mirror: register {:#x} rejected", m.offset);
            }
            moved = true;
            continue;
        }
        if !m.card_owned {
            continue;
        }
        let in_card = match (m.ring, m.counter) {
            (Some((id, r)), _) => file.ring(id, r),
            (None, Some(c)) => file.counter(c),
            (None, None) => continue,
        };
        if in_card != m.last {
            bar.write(m.offset, in_card);
            m.last = in_card;
            moved = true;
        }
    }
    moved
}

fn mirror(bar: &SharedBar, file: &RegisterFile, stop: &AtomicBool) {
    let mut regs = registers();
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        // Acquire: descriptors the driver wrote before its doorbell are visible once the
        // doorbell is (the driver's store order, x86-TSO or its own barrier).
        std::sync::atomic::fence(Ordering::Acquire);
        if round(bar, file, &mut regs) {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < 32 {
            thread::yield_now();
        } else {
            let us = (10u64 << ((idle - 32) / 16).min(4)).min(200);
            thread::sleep(Duration::from_micros(us));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar() -> (SharedBar, std::fs::File) {
        let path = std::env::temp_dir().join(format!("bar-mirror-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(0x1000).unwrap();
        let _ = std::fs::remove_file(&path);
        (SharedBar::map(&file, 0x1000).unwrap(), file)
    }

    #[test]
    fn driver_writes_reach_the_card_and_card_writes_reach_the_bar_never_the_reverse() {
        let (b, _f) = bar();
        let file = RegisterFile::new();
        let mut regs = registers();
        let head = RingId::CmdRequest.reg(RingReg::Head, 1).unwrap().offset();
        let tail = RingId::CmdRequest.reg(RingReg::Tail, 1).unwrap().offset();
        // The driver rings the doorbell.
        b.write(head, 3);
        assert!(round(&b, &file, &mut regs));
        assert_eq!(file.ring(RingId::CmdRequest, RingReg::Head), 3);
        // The card fetched two: its tail appears in the BAR.
        file.set_ring(RingId::CmdRequest, RingReg::Tail, 2);
        assert!(round(&b, &file, &mut regs));
        assert_eq!(b.read(tail), 2);
        // Nothing new: nothing moves, and the driver's head is not written back.
        assert!(!round(&b, &file, &mut regs));
        assert_eq!(b.read(head), 3);
        // The driver reprograms the ring: both pointers to 0, tail included.
        b.write(head, 0);
        b.write(tail, 0);
        assert!(round(&b, &file, &mut regs));
        assert_eq!(file.ring(RingId::CmdRequest, RingReg::Tail), 0);
        assert_eq!(file.ring(RingId::CmdRequest, RingReg::Head), 0);
        // Counters are the card's.
        file.bump(Counter::EthRdma);
        assert!(round(&b, &file, &mut regs));
        assert_eq!(b.read(Counter::EthRdma.reg().offset()), 1);
    }
}
