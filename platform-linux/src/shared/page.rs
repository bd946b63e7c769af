//! The register page of a client of a shared device: the card's ring registers as the
//! client's engine sees them (its own virtual ring set), in a memfd segment that the client
//! and the device's daemon both map.
//!
//! The client's engine writes bases and doorbells here as it would into BAR0; the daemon
//! reads them, moves the descriptors between the client's rings and the card's one ring set,
//! and writes the tails (host-to-card rings) it has consumed. Counters are the card's,
//! copied here by the daemon. Two futex words carry the wake-ups: the daemon sleeps on the
//! hub's word (every client's doorbell wakes it when it sleeps), a client's progress thread
//! on its page's `reports` word (the daemon wakes it after writing to its card-to-host
//! rings while it sleeps).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Counter, Direction, Reg, RegKind, RingId, RingReg};

use super::sys::{futex_wait, futex_wake, Segment};

/// Identifies a register page (and its layout version).
pub const PAGE_MAGIC: u32 = 0xB1DE_0001;

/// The bytes of a page's segment (one page; the layout uses far fewer).
pub const PAGE_LEN: usize = 4096;

/// Index of a ring's registers in the page (the model's order).
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

/// The rings of a page, in slot order.
pub const RINGS: [RingId; 6] = [
    RingId::CmdRequest,
    RingId::CmdResponse,
    RingId::Send(0),
    RingId::MetaReport(0),
    RingId::SimpleNicTx,
    RingId::SimpleNicRx,
];

/// The layout of a register page.
#[repr(C)]
pub struct PageLayout {
    /// [`PAGE_MAGIC`], written by the daemon.
    pub magic: AtomicU32,
    /// Base low, base high, head, tail of each ring ([`ring_slot`]).
    pub rings: [[AtomicU32; 4]; 6],
    /// The card's counters ([`Counter::ALL`] order), copied by the daemon.
    pub counters: [AtomicU32; Counter::ALL.len()],
    /// Bumped by the client at every doorbell (a head of a host-to-card ring, a tail of a
    /// card-to-host ring).
    pub doorbells: AtomicU32,
    /// Bumped by the daemon after it wrote descriptors into a card-to-host ring or moved a
    /// host-to-card tail; the client's progress thread waits on it.
    pub reports: AtomicU32,
    /// Set by the client while its progress thread waits on `reports`.
    pub client_sleeps: AtomicU32,
    /// Set by the daemon when the client must reopen (the card was reset, the daemon is
    /// stopping): the client's engine then fails its work.
    pub gone: AtomicU32,
}

/// The layout of the hub page (one per daemon, mapped by every client).
#[repr(C)]
pub struct HubLayout {
    /// [`PAGE_MAGIC`].
    pub magic: AtomicU32,
    /// Bumped by any client's doorbell while the daemon sleeps; the daemon waits on it.
    pub wake: AtomicU32,
    /// Set while the daemon waits on `wake`.
    pub daemon_sleeps: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<PageLayout>() <= PAGE_LEN);
const _: () = assert!(std::mem::size_of::<HubLayout>() <= PAGE_LEN);

/// A mapped page of type `T` ([`PageLayout`] or [`HubLayout`]).
pub struct Page<T> {
    seg: Segment,
    _t: std::marker::PhantomData<T>,
}

impl<T> Page<T> {
    /// The page over a mapped segment of at least [`PAGE_LEN`] bytes.
    pub fn new(seg: Segment) -> std::io::Result<Self> {
        if seg.len() < PAGE_LEN {
            return Err(std::io::Error::other("register page too short"));
        }
        Ok(Page {
            seg,
            _t: std::marker::PhantomData,
        })
    }

    /// The layout.
    pub fn get(&self) -> &T {
        // SAFETY: the segment is page aligned, at least PAGE_LEN long (checked in `new`),
        // T fits in it (asserted above), T is made of atomics only, for which any bytes,
        // including zeros, are valid values, and the mapping lives as long as `self`.
        unsafe { &*self.seg.ptr().as_ptr().cast::<T>() }
    }

    /// The segment (its descriptor goes to the other process).
    pub fn segment(&self) -> &Segment {
        &self.seg
    }
}

/// The client's register access: its engine's BAR.
pub struct ClientRegs {
    page: Arc<Page<PageLayout>>,
    hub: Arc<Page<HubLayout>>,
}

impl ClientRegs {
    /// The registers of `page`, whose doorbells wake the daemon behind `hub`.
    pub fn new(page: Arc<Page<PageLayout>>, hub: Arc<Page<HubLayout>>) -> Self {
        ClientRegs { page, hub }
    }

    fn doorbell(&self) {
        self.page.get().doorbells.fetch_add(1, Ordering::SeqCst);
        wake_daemon(&self.hub);
    }
}

impl RegisterAccess for ClientRegs {
    fn read32(&self, reg: Reg) -> u32 {
        let p = self.page.get();
        match reg.kind() {
            RegKind::Ring(id, r) => p.rings[ring_slot(id)][r as usize / 4].load(Ordering::Acquire),
            RegKind::Counter(c) => Counter::ALL
                .iter()
                .position(|x| *x == c)
                .map_or(0, |i| p.counters[i].load(Ordering::Relaxed)),
        }
    }

    fn write32(&self, reg: Reg, value: u32) {
        let RegKind::Ring(id, r) = reg.kind() else {
            log::warn!("shared device: write of the read-only counter {reg:?} ignored");
            return;
        };
        let p = self.page.get();
        // Release: the descriptors written before a doorbell are visible to the daemon
        // that reads the head.
        p.rings[ring_slot(id)][r as usize / 4].store(value, Ordering::Release);
        let bell = matches!(
            (id.direction(), r),
            (Direction::HostToCard, RingReg::Head) | (Direction::CardToHost, RingReg::Tail)
        );
        if bell {
            self.doorbell();
        }
    }
}

/// Wakes the daemon behind `hub` if it sleeps (a doorbell, a record, a card report).
pub fn wake_daemon(hub: &Page<HubLayout>) {
    let h = hub.get();
    if h.daemon_sleeps.load(Ordering::SeqCst) != 0 {
        h.wake.fetch_add(1, Ordering::SeqCst);
        futex_wake(&h.wake);
    }
}

/// Waits (the client's progress thread) until the daemon reports or `timeout`.
pub fn wait_reports(page: &Page<PageLayout>, seen: u32, timeout: Duration) {
    let p = page.get();
    p.client_sleeps.store(1, Ordering::SeqCst);
    if p.reports.load(Ordering::SeqCst) == seen {
        futex_wait(&p.reports, seen, timeout);
    }
    p.client_sleeps.store(0, Ordering::SeqCst);
}

/// Tells the client behind `page` that its rings changed, waking it if it sleeps.
pub fn notify_client(page: &Page<PageLayout>) {
    let p = page.get();
    p.reports.fetch_add(1, Ordering::SeqCst);
    if p.client_sleeps.load(Ordering::SeqCst) != 0 {
        futex_wake(&p.reports);
    }
}
