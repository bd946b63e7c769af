//! The card's register file: ring registers and read-only counters, shared between the
//! driver (in-process: direct calls; RTL protocol: the CSR server) and the model thread.
//!
//! Decoding follows the RTL (hardware-contract.md corrections 2 and 3): one channel, 16-bit
//! address truncation, counters read-only. Anything else is rejected loudly: an error for
//! the caller, a counter, and a log line; the card takes it as an RTL stop
//! ([`super::stops::RtlStop::UndecodedRegister`]) at its next step.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use bluerdma_core::regs::{
    Counter, Direction, Reg, RegKind, RingId, RingReg, UndecodedAccess, DECODED_CHANNELS,
};

/// Index of a ring's registers in the file.
pub fn ring_slot(id: RingId) -> usize {
    match id {
        RingId::CmdRequest => 0,
        RingId::CmdResponse => 1,
        RingId::Send(_) => 2,
        RingId::MetaReport(_) => 3,
        RingId::SimpleNicTx => 4,
        RingId::SimpleNicRx => 5,
    }
}

fn counter_slot(c: Counter) -> usize {
    Counter::ALL.iter().position(|x| *x == c).unwrap_or(0)
}

/// The register file of one card.
pub struct RegisterFile {
    rings: [[AtomicU32; 4]; 6],
    counters: [AtomicU32; Counter::ALL.len()],
    undecoded: AtomicU64,
    last_undecoded: Mutex<Option<UndecodedAccess>>,
    sleepers: AtomicUsize,
    /// How many times the rings were reset or their driver went away.
    resets: AtomicU64,
    /// Per ring, the impossible pointer pair last reported (`head << 16 | tail`, plus 1;
    /// 0 for none): reported once, not at every poll.
    impossible: [AtomicU32; 6],
    /// Doorbell generation: bumped by every wake.
    wake_lock: Mutex<u64>,
    wake: Condvar,
    /// Called after the card wrote descriptors to a card-to-host ring: the host's
    /// interrupt, for a host that sleeps instead of polling (the daemon of a shared device).
    host_notify: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Default for RegisterFile {
    fn default() -> Self {
        Self {
            rings: Default::default(),
            counters: Default::default(),
            undecoded: AtomicU64::new(0),
            last_undecoded: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            resets: AtomicU64::new(0),
            impossible: Default::default(),
            wake_lock: Mutex::new(0),
            wake: Condvar::new(),
            host_notify: std::sync::OnceLock::new(),
        }
    }
}

impl RegisterFile {
    /// A zeroed register file.
    pub fn new() -> Self {
        Self::default()
    }

    fn reject(&self, offset: u32, is_write: bool) -> UndecodedAccess {
        let e = UndecodedAccess { offset, is_write };
        self.undecoded.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last_undecoded.lock() {
            *last = Some(e);
        }
        log::warn!(
            "emulated NIC: undecoded register {} at {offset:#x} (the RTL simulation would end here)",
            if is_write { "write" } else { "read" }
        );
        e
    }

    /// A host read of the register at byte `offset`.
    pub fn read(&self, offset: u32) -> Result<u32, UndecodedAccess> {
        match Reg::decode(offset, DECODED_CHANNELS).map(Reg::kind) {
            Some(RegKind::Ring(id, r)) => {
                Ok(self.rings[ring_slot(id)][r as usize / 4].load(Ordering::Acquire))
            }
            Some(RegKind::Counter(c)) => Ok(self.counters[counter_slot(c)].load(Ordering::Relaxed)),
            None => Err(self.reject(offset, false)),
        }
    }

    /// A host write of the register at byte `offset`. Head and tail keep their low 13 bits,
    /// as the RTL's CSR does. A write that frees or fills a ring wakes the model.
    pub fn write(&self, offset: u32, value: u32) -> Result<(), UndecodedAccess> {
        match Reg::decode(offset, DECODED_CHANNELS).map(Reg::kind) {
            Some(RegKind::Ring(id, r)) => {
                let v = match r {
                    RingReg::Head | RingReg::Tail => value & 0x1FFF,
                    RingReg::BaseLo | RingReg::BaseHi => value,
                };
                self.rings[ring_slot(id)][r as usize / 4].store(v, Ordering::Release);
                let doorbell = matches!(
                    (id.direction(), r),
                    (Direction::HostToCard, RingReg::Head) | (Direction::CardToHost, RingReg::Tail)
                );
                if doorbell {
                    // Pairs with the fence in `sleep_unless` (store-load ordering).
                    fence(Ordering::SeqCst);
                    self.wake_model();
                }
                Ok(())
            }
            // Counters are read-only: a write is undecoded in the RTL.
            Some(RegKind::Counter(_)) | None => Err(self.reject(offset, true)),
        }
    }

    /// The model's view of a ring register.
    pub fn ring(&self, id: RingId, r: RingReg) -> u32 {
        self.rings[ring_slot(id)][r as usize / 4].load(Ordering::Acquire)
    }

    /// The model updates a ring register it owns (tail of host-to-card, head of card-to-host).
    pub fn set_ring(&self, id: RingId, r: RingReg, value: u32) {
        self.rings[ring_slot(id)][r as usize / 4].store(value & 0x1FFF, Ordering::Release);
    }

    /// Every ring back to base 0, head and tail 0: what a card looks like before a driver
    /// programs it (the served card after its driver went away). Nothing is fetched until
    /// a driver writes a head again.
    pub fn reset_rings(&self) {
        for ring in &self.rings {
            for reg in ring {
                reg.store(0, Ordering::Release);
            }
        }
        self.driver_gone();
    }

    /// The driver went away: work fetched for it is dropped ([`RegisterFile::resets`]
    /// counts this too), the registers stay as they are.
    pub fn driver_gone(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
    }

    /// How many times the rings were reset or their driver went away: work fetched under an
    /// older count belongs to a driver that has gone, and is dropped.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Acquire)
    }

    /// A host-to-card ring's head is more than a ring ahead of its tail: the card cannot
    /// know what to fetch and fetches nothing (the RTL would fetch until its fetch pointer
    /// met the head, through slots the driver never wrote). Logged once per pair: the ring
    /// is dead until the driver writes a head that makes sense.
    pub fn impossible_pointers(&self, id: RingId, head: u32, tail: u32) {
        let pair = (head << 16 | tail) + 1;
        if self.impossible[ring_slot(id)].swap(pair, Ordering::Relaxed) != pair {
            log::error!(
                "{id:?} ring: head {head:#x} is more than a ring ahead of tail {tail:#x}; nothing is fetched until the driver writes a head within 4096 of the tail"
            );
        }
    }

    /// A ring's base address as programmed by the driver.
    pub fn ring_base(&self, id: RingId) -> u64 {
        (self.ring(id, RingReg::BaseHi) as u64) << 32 | self.ring(id, RingReg::BaseLo) as u64
    }

    /// Adds one to a counter.
    pub fn bump(&self, c: Counter) {
        self.counters[counter_slot(c)].fetch_add(1, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn counter(&self, c: Counter) -> u32 {
        self.counters[counter_slot(c)].load(Ordering::Relaxed)
    }

    /// How many undecoded accesses were rejected (one atomic load: the card asks at every
    /// step).
    pub fn undecoded_count(&self) -> u64 {
        self.undecoded.load(Ordering::Relaxed)
    }

    /// How many undecoded accesses were rejected, and the last one.
    pub fn undecoded(&self) -> (u64, Option<UndecodedAccess>) {
        let last = self.last_undecoded.lock().ok().and_then(|g| *g);
        (self.undecoded.load(Ordering::Relaxed), last)
    }

    /// Wakes the model's threads that sleep on the doorbell.
    /// Sets what [`RegisterFile::notify_host`] calls (once; a second call is ignored and
    /// returns false).
    pub fn set_host_notify(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.host_notify.set(f).is_ok()
    }

    /// The card wrote to a card-to-host ring: tells a host that asked for it.
    pub fn notify_host(&self) {
        if let Some(f) = self.host_notify.get() {
            f();
        }
    }

    /// Wakes the model's threads if they sleep.
    pub fn wake_model(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            if let Ok(mut generation) = self.wake_lock.lock() {
                *generation = generation.wrapping_add(1);
                self.wake.notify_all();
            }
        }
    }

    /// Sleeps until the next doorbell or `timeout`, unless `has_work` (evaluated after this
    /// thread is registered as a sleeper) says there is work. Together with the fence in
    /// [`RegisterFile::write`] this loses no doorbell: either the writer sees a sleeper and
    /// notifies, or `has_work` sees the write.
    pub fn sleep_unless(&self, timeout: Duration, has_work: impl Fn() -> bool) {
        let Ok(generation) = self.wake_lock.lock() else {
            return;
        };
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !has_work() {
            let start = *generation;
            let _ = self
                .wake
                .wait_timeout_while(generation, timeout, |g| *g == start);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sleeps until the next doorbell or `timeout`.
    pub fn sleep(&self, timeout: Duration) {
        self.sleep_unless(timeout, || false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undecoded_accesses_are_rejected_and_counted() {
        let f = RegisterFile::new();
        assert!(
            f.write(0x180, 1).is_err(),
            "debug loopback register does not exist"
        );
        assert!(f.read(0x048).is_err(), "channel 1 is not decoded");
        assert!(f.write(0x400, 5).is_err(), "counters are read-only");
        let (n, last) = f.undecoded();
        assert_eq!(n, 3);
        assert_eq!(
            last,
            Some(UndecodedAccess {
                offset: 0x400,
                is_write: true
            })
        );
    }

    #[test]
    fn head_and_tail_keep_thirteen_bits_and_alias_at_64k() {
        let f = RegisterFile::new();
        f.write(0x108, 0xFFFF_FFFF).unwrap();
        assert_eq!(f.read(0x108).unwrap(), 0x1FFF);
        f.write(0x1_0000, 0x1234_5678).unwrap();
        assert_eq!(
            f.read(0x000).unwrap(),
            0x1234_5678,
            "0x10000 aliases send base low"
        );
        f.write(0x004, 0x1).unwrap();
        assert_eq!(f.ring_base(RingId::Send(0)), 0x1_1234_5678);
    }
}
