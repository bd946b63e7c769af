//! One emulated card: shared state, a transmit thread (command ring, send ring, simple-NIC
//! TX) and a receive thread (link, receive checks, DMA writes, meta reports, PSN windows,
//! simple-NIC RX).
//!
//! The transmit thread sleeps on the doorbell (a head write of a host-to-card ring); the
//! receive thread blocks on the link with a timeout set by its pending work (a full ring, a
//! quiet timer). Neither spins when there is nothing to do.
//!
//! [`SteppedNic`] is the same card without threads: its owner calls the transmit and
//! receive steps itself and moves its [`VirtualClock`] (the two-card harness,
//! [`crate::pair`]). [`super::InlineNic`] is that card on real time, stepped by its
//! driver's threads (the default for the devices of the verbs API).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bluerdma_core::addr::{DeviceAddr, PageSize};
use bluerdma_core::desc::cmd::SetNetworkParam;
use bluerdma_core::desc::RawDesc;
use bluerdma_core::keys::QP_TABLE_LEN;
use bluerdma_core::regs::RingId;

use super::autoack::AckWindow;
use super::clock::{CardClock, VirtualClock};
use super::regs::RegisterFile;
use super::rings;
use super::rx::RxEngine;
use super::stats::NicStats;
use super::stops::{RtlStop, RtlStopPolicy};
use super::tables::Tables;
use super::tx::TxEngine;
use crate::link::LinkPort;
use crate::mem::DmaPort;

/// How an emulated card behaves where the contract leaves a choice.
#[derive(Clone, Debug)]
pub struct NicConfig {
    /// A name for logs and thread names (e.g. "blue0").
    pub name: String,
    /// Translation page size; the driver must be configured alike (correction 8).
    pub page_size: PageSize,
    /// Add the protection-domain check the card lacks (correction 10).
    pub strict: bool,
    /// How long a QP's receive window must be quiet before the timer report (the RTL's
    /// 5000 cycles are 10 us at its 2 ns clock).
    pub quiet_timeout: Duration,
    /// What the card does where the RTL freezes or its simulation ends (the default
    /// freezes; `BLUERDMA_RTL_STOPS` chooses: [`RtlStopPolicy::from_env`]).
    pub rtl_stops: RtlStopPolicy,
}

impl Default for NicConfig {
    fn default() -> Self {
        Self {
            name: "blue".into(),
            page_size: PageSize::Size2M,
            strict: false,
            quiet_timeout: Duration::from_micros(10),
            rtl_stops: RtlStopPolicy::from_env(),
        }
    }
}

/// State both threads share (tables, windows, network parameters).
pub struct CardState {
    /// MR table, page table and QP contexts.
    pub tables: Tables,
    /// PSN windows per QP index.
    pub windows: Vec<AckWindow>,
    /// Indices whose window has unreported merges (the quiet timer's work list).
    pub quiet_pending: Vec<u32>,
    /// Network parameters; `None` until SetNetworkParam (the card drops all traffic then).
    pub net: Option<SetNetworkParam>,
    /// Simple-NIC RX buffer.
    pub raw_rx_base: Option<DeviceAddr>,
    /// Next simple-NIC RX slot.
    pub raw_rx_slot: u32,
    /// The PD of each QP index as the driver declared it (strict mode only; the card has
    /// no such field, see the README's deviations).
    pub qp_pd: Vec<u32>,
}

impl CardState {
    fn new(page: PageSize) -> Self {
        Self {
            tables: Tables::new(page),
            windows: vec![AckWindow::default(); QP_TABLE_LEN as usize],
            quiet_pending: Vec::new(),
            net: None,
            raw_rx_base: None,
            raw_rx_slot: 0,
            qp_pd: vec![0; QP_TABLE_LEN as usize],
        }
    }

    /// Resets the PSN window of QP index `index` (ManageQp).
    pub fn reset_window(&mut self, index: u32) {
        if let Some(w) = self.windows.get_mut(index as usize) {
            w.reset();
        }
        self.quiet_pending.retain(|i| *i != index);
    }

    /// The card's own IPv4 address, once configured.
    pub fn local_ip(&self) -> Option<Ipv4Addr> {
        self.net.map(|n| n.ip)
    }
}

/// Everything both threads of a card share.
pub struct Shared {
    /// The register file the driver writes.
    pub regs: Arc<RegisterFile>,
    /// Tables and windows.
    pub state: Mutex<CardState>,
    /// Counters.
    pub stats: NicStats,
    /// Configuration.
    pub config: NicConfig,
    /// The card's time source (ns timestamps are relative to its origin).
    pub clock: CardClock,
    stop: AtomicBool,
    /// An RTL stop froze the card ([`RtlStopPolicy::freezes`]).
    frozen: AtomicBool,
    /// The first RTL stop.
    first_stop: Mutex<Option<RtlStop>>,
    /// Its owner took the first stop ([`Shared::take_rtl_stop`]) to report it.
    stop_reported: AtomicBool,
    /// Undecoded register accesses already taken as RTL stops.
    undecoded_seen: AtomicU64,
    /// The card runs in its driver's threads ([`super::InlineNic`]): it never waits for
    /// the driver, which is the thread that called it.
    pub inline: bool,
}

impl Shared {
    fn new(
        config: NicConfig,
        regs: Arc<RegisterFile>,
        clock: CardClock,
        inline: bool,
    ) -> Arc<Self> {
        Arc::new(Shared {
            regs,
            state: Mutex::new(CardState::new(config.page_size)),
            stats: NicStats::default(),
            clock,
            stop: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            first_stop: Mutex::new(None),
            stop_reported: AtomicBool::new(false),
            undecoded_seen: AtomicU64::new(0),
            inline,
            config,
        })
    }

    /// The card reached `event`, where the RTL stops: counted, logged, kept if it is the
    /// first, and, unless the policy says carry on, the card freezes. Returns whether the
    /// card is frozen (the caller abandons what it was doing).
    pub fn rtl_stop_at(&self, event: RtlStop) -> bool {
        NicStats::bump(&self.stats.rtl_stops);
        let freezes = self.config.rtl_stops.freezes();
        if freezes && self.frozen.swap(true, Ordering::AcqRel) {
            // Already frozen: the first event is the one that counts.
            return true;
        }
        if freezes {
            log::error!(
                "{}: RTL stop, the card is frozen (as the RTL would be): {event}",
                self.config.name
            );
        } else {
            log::error!(
                "{}: RTL stop ignored (the RTL would stop here): {event}",
                self.config.name
            );
        }
        let mut first = self.first_stop.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(event);
        freezes
    }

    /// Whether an RTL stop froze the card. Also takes the driver's undecoded register
    /// accesses since the last look as RTL stops (the register file only rejects them).
    pub fn frozen(&self) -> bool {
        // Two atomic loads on the hot path; the register file's lock only after a rejection.
        let n = self.regs.undecoded_count();
        let seen = self.undecoded_seen.load(Ordering::Acquire);
        if n > seen
            && self
                .undecoded_seen
                .compare_exchange(seen, n, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let (_, last) = self.regs.undecoded();
            let (offset, is_write) = last.map_or((0, false), |a| (a.offset, a.is_write));
            self.rtl_stop_at(RtlStop::UndecodedRegister { offset, is_write });
        }
        self.frozen.load(Ordering::Acquire)
    }

    /// The first RTL stop the card reached, if any (frozen or not, by the policy).
    pub fn rtl_stop(&self) -> Option<RtlStop> {
        self.frozen();
        self.first_stop
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// [`Shared::rtl_stop`] for an owner that reports it itself (a failed scenario): under
    /// [`RtlStopPolicy::Fail`] dropping the card no longer panics for it.
    pub fn take_rtl_stop(&self) -> Option<RtlStop> {
        let stop = self.rtl_stop();
        if stop.is_some() {
            self.stop_reported.store(true, Ordering::Release);
        }
        stop
    }

    /// An RTL stop nobody reported ([`Shared::take_rtl_stop`]).
    fn unreported_rtl_stop(&self) -> Option<RtlStop> {
        self.rtl_stop()
            .filter(|_| !self.stop_reported.load(Ordering::Acquire))
    }

    /// Locks the card state (a poisoned lock is taken over: the state is plain data).
    pub fn state(&self) -> MutexGuard<'_, CardState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nanoseconds since the card started (or since its virtual clock's origin).
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Whether the card is shutting down.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Writes descriptors to a card-to-host ring, waiting while it is full (the card never
    /// drops a report). Gives up only when the card stops, or at once on a virtual clock or
    /// an inline card: there the driver runs on the caller's thread, so nobody can free the
    /// ring while the card waits (the descriptors are dropped and counted in `dma_faults`,
    /// and logged; an inline card fetches no more commands than the response ring holds).
    pub fn produce_blocking(&self, dma: &mut dyn DmaPort, id: RingId, descs: &[RawDesc]) {
        let mut waited = false;
        loop {
            match rings::produce(&self.regs, dma, id, descs) {
                Ok(true) => return,
                Ok(false) => {
                    if !waited {
                        NicStats::bump(&self.stats.backpressure_waits);
                        waited = true;
                    }
                    if self.clock.is_virtual() || self.inline {
                        NicStats::bump(&self.stats.dma_faults);
                        log::error!(
                            "{}: {id:?} ring full on a stepped card; {} descriptors dropped",
                            self.config.name,
                            descs.len()
                        );
                        return;
                    }
                    if self.stopping() {
                        return;
                    }
                    self.regs.sleep(Duration::from_micros(50));
                }
                Err(e) => {
                    NicStats::bump(&self.stats.dma_faults);
                    log::error!("{}: {id:?} ring write failed: {e}", self.config.name);
                    return;
                }
            }
        }
    }
}

/// A running emulated card. Dropping it stops both threads.
pub struct Nic {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Nic {
    /// Starts a card on `regs`, reaching host memory through the two DMA ports (one per
    /// thread) and the world through `link`.
    pub fn spawn(
        config: NicConfig,
        regs: Arc<RegisterFile>,
        tx_dma: Box<dyn DmaPort>,
        rx_dma: Box<dyn DmaPort>,
        link: Box<dyn LinkPort>,
    ) -> std::io::Result<Nic> {
        let SteppedNic {
            shared,
            mut tx,
            mut rx,
        } = SteppedNic::build(config, regs, tx_dma, rx_dma, link, CardClock::real(), false)?;
        let name = shared.config.name.clone();
        let threads = vec![
            thread::Builder::new()
                .name(format!("{name}-tx"))
                .spawn(move || tx.run())?,
            thread::Builder::new()
                .name(format!("{name}-rx"))
                .spawn(move || rx.run())?,
        ];
        Ok(Nic { shared, threads })
    }

    /// The card's counters.
    pub fn stats(&self) -> &NicStats {
        &self.shared.stats
    }

    /// The card's register file.
    pub fn regs(&self) -> &Arc<RegisterFile> {
        &self.shared.regs
    }

    /// The shared state (for state dumps and tests).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops both threads and waits for them.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.regs.wake_model();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        self.stop();
        self.shared.fail_on_unreported_stop();
    }
}

impl Shared {
    /// Under [`RtlStopPolicy::Fail`], panics with the RTL stop nobody reported (a card
    /// being dropped).
    pub(super) fn fail_on_unreported_stop(&self) {
        if self.config.rtl_stops == RtlStopPolicy::Fail && !thread::panicking() {
            if let Some(event) = self.unreported_rtl_stop() {
                panic!(
                    "{}: the card froze at an RTL stop ({}=fail): {event}",
                    self.config.name,
                    super::stops::RTL_STOPS_ENV
                );
            }
        }
    }
}

/// An emulated card without threads: its owner runs the transmit and receive steps and
/// moves its virtual clock. Frames go out and come in through `link` as in the threaded
/// card; `recv_frames` is always called with a zero timeout.
pub struct SteppedNic {
    pub(super) shared: Arc<Shared>,
    pub(super) tx: TxEngine,
    pub(super) rx: RxEngine,
}

impl SteppedNic {
    /// A card on `regs`, reaching host memory through the two DMA ports and the world
    /// through `link`, whose time is `clock`.
    pub fn new(
        config: NicConfig,
        regs: Arc<RegisterFile>,
        tx_dma: Box<dyn DmaPort>,
        rx_dma: Box<dyn DmaPort>,
        link: Box<dyn LinkPort>,
        clock: VirtualClock,
    ) -> std::io::Result<Self> {
        Self::build(
            config,
            regs,
            tx_dma,
            rx_dma,
            link,
            CardClock::Virtual(clock),
            false,
        )
    }

    /// Both sides of a card on `clock` (the threaded card runs them on its threads, the
    /// inline card in its driver's).
    pub(super) fn build(
        config: NicConfig,
        regs: Arc<RegisterFile>,
        tx_dma: Box<dyn DmaPort>,
        rx_dma: Box<dyn DmaPort>,
        link: Box<dyn LinkPort>,
        clock: CardClock,
        inline: bool,
    ) -> std::io::Result<Self> {
        let shared = Shared::new(config, regs, clock, inline);
        let sender = link.sender()?;
        Ok(Self {
            tx: TxEngine::new(Arc::clone(&shared), tx_dma, sender),
            rx: RxEngine::new(Arc::clone(&shared), rx_dma, link),
            shared,
        })
    }

    /// Executes the commands on the command ring (responses included); returns whether
    /// there were any.
    pub fn step_commands(&mut self) -> bool {
        self.tx.step_commands()
    }

    /// Fetches and executes the send ring (a driver waiting for the card's tail), the
    /// frames going to the link; returns whether there were descriptors.
    pub fn step_send(&mut self) -> bool {
        self.tx.step_send()
    }

    /// One pass of the transmit side: commands, send ring, simple-NIC TX; the frames go to
    /// the link. Returns whether there was work.
    pub fn step_tx(&mut self) -> bool {
        self.tx.step()
    }

    /// One pass of the receive side at the clock's current time: the frames the link holds,
    /// the quiet timers, the reports waiting for ring space, the NAKs. Returns whether it
    /// did anything.
    pub fn step_rx(&mut self) -> bool {
        self.rx.step_now()
    }

    /// When the earliest quiet timer of a receive window fires (ns on the card's clock), if
    /// one is armed (a frozen card runs no timer).
    pub fn next_timer_ns(&self) -> Option<u64> {
        if self.shared.frozen() {
            return None;
        }
        let quiet = self.shared.config.quiet_timeout.as_nanos() as u64;
        let state = self.shared.state();
        state
            .quiet_pending
            .iter()
            .filter_map(|&i| state.windows.get(i as usize))
            .filter(|w| !w.has_reported)
            // poll_quiet fires once strictly more than `quiet` has passed.
            .map(|w| w.last_entry_time.saturating_add(quiet).saturating_add(1))
            .min()
    }

    /// The shared state: counters, register file, tables and windows.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}
