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
//! Each round reads the ring pointers before the other registers and forwards them after:
//! a base the driver wrote before a doorbell reaches the model before the doorbell that
//! makes the card use it (forwarding in register order let the card answer the first
//! command before it had the response ring's base: a DMA write at address 0).
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
    /// A ring pointer's value as this round's first pass read it.
    seen: u32,
}

impl Mirrored {
    /// A ring's head or tail (a doorbell when the driver writes it).
    fn is_pointer(&self) -> bool {
        matches!(self.ring, Some((_, RingReg::Head | RingReg::Tail)))
    }
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
                seen: 0,
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
            seen: 0,
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
    // The pointers first: every register the driver wrote before a doorbell read here is
    // visible to the reads below (its store order), so it is forwarded first.
    for m in regs.iter_mut().filter(|m| m.is_pointer()) {
        m.seen = bar.read(m.offset);
    }
    std::sync::atomic::fence(Ordering::Acquire);
    let mut moved = false;
    for m in regs.iter_mut().filter(|m| !m.is_pointer()) {
        let in_bar = bar.read(m.offset);
        moved |= sync(bar, file, m, in_bar);
    }
    for m in regs.iter_mut().filter(|m| m.is_pointer()) {
        let in_bar = m.seen;
        moved |= sync(bar, file, m, in_bar);
    }
    moved
}

/// Forwards a driver write of `m` (the BAR holds `in_bar`) to the model, or a change the
/// card made to a register it owns to the BAR; returns whether anything moved.
fn sync(bar: &SharedBar, file: &RegisterFile, m: &mut Mirrored, in_bar: u32) -> bool {
    if in_bar != m.last && m.counter.is_none() {
        // The driver wrote it.
        m.last = in_bar;
        if file.write(m.offset as u32, in_bar).is_err() {
            log::error!("BAR mirror: register {:#x} rejected", m.offset);
        }
        return true;
    }
    if !m.card_owned {
        return false;
    }
    let in_card = match (m.ring, m.counter) {
        (Some((id, r)), _) => file.ring(id, r),
        (None, Some(c)) => file.counter(c),
        (None, None) => return false,
    };
    if in_card == m.last {
        return false;
    }
    bar.write(m.offset, in_card);
    m.last = in_card;
    true
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

    /// A BAR file of its own for the test `name` (tests run in parallel).
    fn bar(name: &str) -> (SharedBar, std::fs::File) {
        let path = std::env::temp_dir().join(format!("bar-mirror-{}-{name}", std::process::id()));
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
        let (b, _f) = bar("owners");
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

    #[test]
    fn a_card_woken_by_a_doorbell_already_has_every_base_written_before_it() {
        // The driver opened the card before the mirror's first round: every ring is
        // programmed and the first command's doorbell rung. A card that acts on the
        // doorbell the moment it sees it must find the response ring's base.
        let (b, _f) = bar("order");
        let file = Arc::new(RegisterFile::new());
        let base = |id: RingId| id.reg(RingReg::BaseLo, 1).unwrap().offset();
        for (k, id) in RingId::ALL_CH0.into_iter().enumerate() {
            b.write(base(id), 0x10_0000 * (k as u32 + 1));
        }
        b.write(
            RingId::CmdRequest.reg(RingReg::Head, 1).unwrap().offset(),
            1,
        );
        let watching = Arc::new(AtomicBool::new(false));
        let card = {
            let (file, watching) = (Arc::clone(&file), Arc::clone(&watching));
            thread::spawn(move || {
                watching.store(true, Ordering::Release);
                while file.ring(RingId::CmdRequest, RingReg::Head) == 0 {
                    std::hint::spin_loop();
                }
                file.ring_base(RingId::CmdResponse)
            })
        };
        while !watching.load(Ordering::Acquire) {
            thread::yield_now();
        }
        let mut regs = registers();
        assert!(round(&b, &file, &mut regs));
        let resp = RingId::ALL_CH0
            .iter()
            .position(|&id| id == RingId::CmdResponse)
            .unwrap() as u64;
        assert_eq!(card.join().unwrap(), 0x10_0000 * (resp + 1));
    }
}
