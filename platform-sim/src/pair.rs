//! A deterministic two-card harness: two driver engines ([`Engine`]) and two emulated cards
//! ([`SteppedNic`]) stepped in one thread on one virtual clock, with the frames between the
//! cards passed by hand, so that a test pins the transport down exactly (ARCHITECTURE.md
//! "The engine by role": a pair of endpoints stepped with a virtual clock, as quinn-proto's
//! tests drive theirs).
//!
//! One [`Pair::step`] polls both engines, runs both cards' transmit sides, carries the
//! frames they sent across the [wire](Frame) (through the test's fault rules: drop,
//! duplicate, hold), runs both cards' receive sides, and carries what those sent (the
//! card's NAKs). When none of that did anything, the clock jumps to the next deadline: an
//! engine's retransmission or RNR timer, a card's quiet timer, or an out-of-band record
//! due. A 67 ms timeout therefore costs no wall time, and two runs of a test see the same
//! frames at the same virtual times. [`Pair::run_until`] steps until a condition holds or a
//! span of virtual time has passed.
//!
//! Verbs that wait for the card (open, reg_mr, create_qp, modify_qp, destroy_qp, dereg_mr)
//! get a clock that executes the card's command ring each time the engine reads it, and its
//! send ring when the engine keeps reading with no command to execute (dereg_mr and
//! destroy_qp wait for the card to fetch it); that one helper is the only place that knows
//! how the engine waits.
//! SEND/RECV use an in-memory out-of-band channel ([`PairOob`]) that the test can delay or
//! cut. Nothing here starts a thread or opens a socket.
//!
//! The cards freeze where the RTL stops ([`crate::model::stops`]), and such a stop fails
//! the test: [`Pair::run_until`] returns [`PairError::RtlStop`] naming the event, and a
//! pair dropped after one panics with it. A test that makes the RTL stop on purpose sets
//! [`PairConfig::allow_rtl_stops`] and asserts [`Pair::rtl_stop`].

mod oob;
mod storage;
mod verbs;
mod wire;

use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bluerdma_core::addr::PageSize;
use bluerdma_core::desc::MacAddr;
use bluerdma_core::engine::{Device, DeviceConfig, EngineStats, VerbsError, WorkCompletion};
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, Platform};
use bluerdma_core::regs::Counter;
use bluerdma_core::time::Instant;

use oob::OobWire;
pub use oob::PairOob;
pub use storage::PairStorage;
pub use verbs::{Conn, Mr, QpOptions};
use wire::Wire;
pub use wire::{Fate, Fault, Frame, FrameInfo, FrameKind, LogEntry};

use crate::inproc::SimRegs;
use crate::mem::{AddressMap, HostDma, HostMemory};
use crate::model::regs::RegisterFile;
use crate::model::{NicConfig, NicStatsSnapshot, RtlStop, RtlStopPolicy, SteppedNic, VirtualClock};

/// One of the two cards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first card (127.0.0.1).
    A,
    /// The second card (127.0.0.2).
    B,
}

impl Side {
    /// Both sides, A first (the order in which each step runs them).
    pub const BOTH: [Side; 2] = [Side::A, Side::B];

    /// 0 for A, 1 for B.
    pub const fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }

    /// The other side.
    pub const fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// The cards' IPv4 addresses (frames never leave the process).
pub const PAIR_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)];
/// The cards' MAC addresses.
pub const PAIR_MACS: [MacAddr; 2] = [
    MacAddr([0x02, 0, 0, 0, 0, 0x01]),
    MacAddr([0x02, 0, 0, 0, 0, 0x02]),
];

/// The platform of a paired engine: the stepped card's registers, heap DMA memory, and the
/// pair's out-of-band channel.
pub struct PairPlatform;

impl Platform for PairPlatform {
    type Regs = SimRegs;
    type Dma = HostDma;
    type Mem = HostMemory;
    type Oob = PairOob;
}

/// The engine of one side.
pub type Engine = Device<PairPlatform, PairStorage>;

/// How a pair is built.
#[derive(Clone, Debug)]
pub struct PairConfig {
    /// QPs per engine.
    pub qps: usize,
    /// Send WQEs per QP.
    pub sq_depth: usize,
    /// CQs per engine.
    pub cqs: usize,
    /// Completions per CQ.
    pub cq_depth: usize,
    /// MR slots per engine (slot 0 is never used).
    pub mrs: usize,
    /// Receive WRs a peer may announce before their QP connects.
    pub early_recvs: usize,
    /// The engines' send window in packets (capped by the engine at 112).
    pub send_window: u32,
    /// The cards' quiet timer (nic-behaviour.md 3.5).
    pub quiet_timeout: Duration,
    /// The cards' strict protection-domain check (correction 10).
    pub strict_pd: bool,
    /// A card that reaches an RTL stop freezes either way; with this set the harness does
    /// not fail for it (a test that causes the stop on purpose asserts [`Pair::rtl_stop`]).
    pub allow_rtl_stops: bool,
    /// Steps that do work without the clock moving before [`Pair::run_until`] gives up
    /// with [`PairError::Livelock`].
    pub max_busy_steps: u64,
}

impl Default for PairConfig {
    fn default() -> Self {
        Self {
            qps: 8,
            sq_depth: 256,
            cqs: 8,
            cq_depth: 1024,
            mrs: 32,
            early_recvs: 64,
            send_window: 1024,
            quiet_timeout: NicConfig::default().quiet_timeout,
            strict_pd: false,
            allow_rtl_stops: false,
            max_busy_steps: 100_000,
        }
    }
}

/// Why the harness stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairError {
    /// A verb failed.
    Verbs(VerbsError),
    /// A card could not be built.
    Card(String),
    /// The condition did not hold within the span of virtual time.
    Timeout {
        /// Virtual time at the end (ns).
        now_ns: u64,
    },
    /// Nothing can happen any more (no work, no timer) and the condition does not hold.
    Stalled {
        /// Virtual time (ns).
        now_ns: u64,
    },
    /// Steps kept doing work without the clock moving.
    Livelock {
        /// Virtual time (ns).
        now_ns: u64,
        /// Consecutive busy steps.
        steps: u64,
    },
    /// A card reached a place where the RTL stops, and froze.
    RtlStop {
        /// The card.
        side: Side,
        /// The event.
        stop: RtlStop,
        /// Virtual time (ns) when the harness saw it.
        now_ns: u64,
    },
}

impl fmt::Display for PairError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PairError::Verbs(e) => write!(f, "verb failed: {e}"),
            PairError::Card(e) => write!(f, "card: {e}"),
            PairError::Timeout { now_ns } => write!(f, "condition not met by {now_ns} ns"),
            PairError::Stalled { now_ns } => {
                write!(
                    f,
                    "nothing left to run at {now_ns} ns and the condition does not hold"
                )
            }
            PairError::Livelock { now_ns, steps } => {
                write!(
                    f,
                    "{steps} busy steps at {now_ns} ns without the clock moving"
                )
            }
            PairError::RtlStop { side, stop, now_ns } => {
                write!(
                    f,
                    "card {side:?} froze at an RTL stop by {now_ns} ns: {stop}"
                )
            }
        }
    }
}

impl std::error::Error for PairError {}

impl From<VerbsError> for PairError {
    fn from(e: VerbsError) -> Self {
        PairError::Verbs(e)
    }
}

/// One side: engine, card, and the test's buffers.
struct Node {
    dev: Engine,
    card: SteppedNic,
    dma: HostDma,
    bufs: Vec<DmaBuffer>,
    /// The card fetches nothing from its send ring ([`Pair::hold_card_tx`]).
    tx_held: bool,
}

/// What one step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stepped {
    Worked,
    Advanced,
    Idle,
    AtLimit,
}

/// Two engines, two cards, one clock. See the module documentation.
pub struct Pair {
    clock: VirtualClock,
    nodes: Vec<Node>,
    wire: Wire,
    oob: Arc<Mutex<OobWire>>,
    cfg: PairConfig,
}

/// Runs a verb that waits for the card. The clock handed to it executes the card's command
/// ring whenever the engine reads it, so a response is there by the time the engine looks;
/// after [`IDLE_READS_BEFORE_SEND`] reads in a row that find no command, it fetches the
/// send ring too (a card slower than the driver: a verb that posts a command at once does
/// not get its send ring fetched first), and after [`IDLE_READS_PER_MS`] reads that find
/// nothing to execute, each read moves the virtual clock 1 ms, so a command the card never
/// answers (a frozen card) ends in the engine's timeout rather than a spin.
const IDLE_READS_PER_MS: u32 = 64;
/// See [`IDLE_READS_PER_MS`].
const IDLE_READS_BEFORE_SEND: u32 = 8;

fn with_command_clock<R>(
    card: &mut SteppedNic,
    clock: &VirtualClock,
    verb: impl FnOnce(&mut dyn FnMut() -> Instant) -> R,
) -> R {
    let mut idle_reads = 0u32;
    let mut read = || {
        if card.step_commands() || idle_reads >= IDLE_READS_BEFORE_SEND && card.step_send() {
            idle_reads = 0;
        } else {
            idle_reads += 1;
            // A verb reads the clock a few times per command (before it submits, while it
            // waits); only a card that stays idle through many reads lets time pass, so a
            // command the card never answers still times out, in virtual time.
            if idle_reads > IDLE_READS_PER_MS {
                clock.advance_by(1_000_000);
            }
        }
        Instant(clock.now_ns())
    };
    verb(&mut read)
}

impl Pair {
    /// Two cards and their engines with the default configuration.
    pub fn new() -> Result<Self, PairError> {
        Self::with_config(PairConfig::default())
    }

    /// Two cards and their engines as `cfg` says.
    pub fn with_config(cfg: PairConfig) -> Result<Self, PairError> {
        let clock = VirtualClock::new();
        let wire = Wire::new(PAIR_IPS);
        let oob = OobWire::new(PAIR_IPS);
        let mut nodes = Vec::with_capacity(2);
        for side in Side::BOTH {
            let i = side.index();
            let map = AddressMap::new();
            let regs = Arc::new(RegisterFile::new());
            let nic = NicConfig {
                name: format!("pair-{side:?}"),
                page_size: PageSize::Size2M,
                strict: cfg.strict_pd,
                quiet_timeout: cfg.quiet_timeout,
                // The harness fails the test itself (`run_until`, `Drop`).
                rtl_stops: RtlStopPolicy::Freeze,
            };
            let mut card = SteppedNic::new(
                nic,
                Arc::clone(&regs),
                Box::new(map.clone()),
                Box::new(map.clone()),
                Box::new(wire.port(side)),
                clock.clone(),
            )
            .map_err(|e| PairError::Card(e.to_string()))?;
            let mut dcfg = DeviceConfig::new(PAIR_MACS[i], PAIR_IPS[i]);
            dcfg.send_window = cfg.send_window;
            let storage = PairStorage::new(
                cfg.qps,
                cfg.sq_depth,
                cfg.cqs,
                cfg.cq_depth,
                cfg.mrs,
                cfg.early_recvs,
            );
            let mut dev = with_command_clock(&mut card, &clock, |c| {
                Device::open(
                    SimRegs::new(regs),
                    HostDma::new(map.clone()),
                    HostMemory::new(map.clone()),
                    storage,
                    dcfg,
                    c,
                )
            })?;
            dev.attach_oob(PairOob::new(side, Arc::clone(&oob), clock.clone()));
            nodes.push(Node {
                dev,
                card,
                dma: HostDma::new(map),
                bufs: Vec::new(),
                tx_held: false,
            });
        }
        Ok(Pair {
            clock,
            nodes,
            wire,
            oob,
            cfg,
        })
    }

    fn node(&mut self, side: Side) -> &mut Node {
        &mut self.nodes[side.index()]
    }

    /// Runs `verb` on `side`'s engine with the command clock ([`with_command_clock`]).
    fn command<R>(
        &mut self,
        side: Side,
        verb: impl FnOnce(&mut Engine, &mut dyn FnMut() -> Instant) -> R,
    ) -> R {
        let clock = self.clock.clone();
        let node = &mut self.nodes[side.index()];
        let (dev, card) = (&mut node.dev, &mut node.card);
        with_command_clock(card, &clock, |c| verb(dev, c))
    }

    // ----------------------------------------------------------------------------------
    // Time and stepping.

    /// The virtual time (ns since the pair was built).
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// The virtual time as the engine sees it.
    pub fn instant(&self) -> Instant {
        Instant(self.now())
    }

    /// Moves the virtual clock forward by `d` without running anything (timers that fall
    /// due fire at the next step).
    pub fn advance(&mut self, d: Duration) {
        self.clock.advance_by(d.as_nanos() as u64);
    }

    /// One round (see the module documentation); when it finds nothing to do, the clock
    /// jumps to the next deadline. Returns false when nothing ran and no timer is armed.
    pub fn step(&mut self) -> bool {
        self.step_within(u64::MAX) != Stepped::Idle
    }

    fn step_within(&mut self, limit_ns: u64) -> Stepped {
        let now = self.now();
        let mut work = false;
        for n in &mut self.nodes {
            work |= n.dev.poll(Instant(now));
        }
        for n in self.nodes.iter_mut().filter(|n| !n.tx_held) {
            work |= n.card.step_tx();
        }
        work |= self.wire.carry(now) > 0;
        for side in Side::BOTH {
            work |= self.wire.deliver(side) > 0;
            work |= self.nodes[side.index()].card.step_rx();
        }
        work |= self.wire.carry(now) > 0;
        if work {
            return Stepped::Worked;
        }
        let Some(next) = self.next_event_ns() else {
            return Stepped::Idle;
        };
        // A deadline at or before now already had its chance in this round.
        let next = next.max(now + 1);
        if next > limit_ns {
            self.clock.advance_to(limit_ns);
            return Stepped::AtLimit;
        }
        self.clock.advance_to(next);
        Stepped::Advanced
    }

    /// The earliest armed timer: the engines' retransmission and RNR timers, the cards'
    /// quiet timers, the next out-of-band record due.
    pub fn next_event_ns(&mut self) -> Option<u64> {
        let mut next = self.oob().next_due_ns();
        for n in &mut self.nodes {
            for t in [n.dev.next_deadline().map(|i| i.0), n.card.next_timer_ns()] {
                next = match (next, t) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        next
    }

    /// Steps until `done` holds (checked before every step); returns the virtual time it
    /// held at. Fails when `max` of virtual time passes first, when nothing is left to run,
    /// or on a livelock ([`PairConfig::max_busy_steps`]).
    pub fn run_until(
        &mut self,
        mut done: impl FnMut(&mut Pair) -> bool,
        max: Duration,
    ) -> Result<u64, PairError> {
        let limit = self.now().saturating_add(max.as_nanos() as u64);
        let mut busy = 0u64;
        loop {
            self.check_rtl_stops()?;
            if done(self) {
                return Ok(self.now());
            }
            match self.step_within(limit) {
                Stepped::Worked => {
                    busy += 1;
                    if busy > self.cfg.max_busy_steps {
                        return Err(PairError::Livelock {
                            now_ns: self.now(),
                            steps: busy,
                        });
                    }
                }
                Stepped::Advanced => busy = 0,
                Stepped::Idle => return Err(PairError::Stalled { now_ns: self.now() }),
                Stepped::AtLimit => {
                    return if done(self) {
                        Ok(self.now())
                    } else {
                        Err(PairError::Timeout { now_ns: self.now() })
                    };
                }
            }
        }
    }

    /// Runs everything that happens in the next `d` of virtual time; the clock ends at
    /// exactly `d` later (also when everything went quiet before).
    pub fn run_for(&mut self, d: Duration) -> Result<(), PairError> {
        let end = self.now().saturating_add(d.as_nanos() as u64);
        match self.run_until(|_| false, d) {
            Err(PairError::Timeout { .. }) => Ok(()),
            Err(PairError::Stalled { .. }) => {
                self.clock.advance_to(end);
                Ok(())
            }
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }

    /// Polls `cq` of `side` until `n` completions arrived (or `max` of virtual time
    /// passed); returns them in order. On failure the completions taken so far are gone
    /// with the error: a test that expects fewer polls with [`Pair::poll_cq`] instead.
    pub fn wait_completions(
        &mut self,
        side: Side,
        cq: u32,
        n: usize,
        max: Duration,
    ) -> Result<Vec<WorkCompletion>, PairError> {
        let mut got = Vec::new();
        self.run_until(
            |p| {
                got.extend(p.poll_cq(side, cq));
                got.len() >= n
            },
            max,
        )?;
        Ok(got)
    }

    // ----------------------------------------------------------------------------------
    // Verbs.

    /// `side`'s engine, for verbs the pair does not wrap and for queries.
    pub fn engine(&mut self, side: Side) -> &mut Engine {
        &mut self.node(side).dev
    }

    /// `side`'s card.
    pub fn card(&self, side: Side) -> &SteppedNic {
        &self.nodes[side.index()].card
    }

    /// Engine counters of `side`.
    pub fn stats(&self, side: Side) -> EngineStats {
        self.nodes[side.index()].dev.stats()
    }

    /// The first RTL stop `side`'s card reached (and froze at), if any.
    pub fn rtl_stop(&self, side: Side) -> Option<RtlStop> {
        self.card(side).shared().rtl_stop()
    }

    /// An RTL stop as an error, unless the test allows them.
    fn check_rtl_stops(&self) -> Result<(), PairError> {
        if self.cfg.allow_rtl_stops {
            return Ok(());
        }
        for side in Side::BOTH {
            if let Some(stop) = self.rtl_stop(side) {
                return Err(PairError::RtlStop {
                    side,
                    stop,
                    now_ns: self.now(),
                });
            }
        }
        Ok(())
    }

    /// Card counters of `side`.
    pub fn nic_stats(&self, side: Side) -> NicStatsSnapshot {
        self.card(side).shared().stats.snapshot()
    }

    /// A register counter of `side`'s card (the receive checks, nic-behaviour.md 6.1).
    pub fn counter(&self, side: Side, c: Counter) -> u32 {
        self.card(side).shared().regs.counter(c)
    }

    // ----------------------------------------------------------------------------------
    // The wire.

    /// Every frame that left a card so far, in the order the harness took them, with what
    /// the rules did to it.
    pub fn log(&self) -> &[LogEntry] {
        &self.wire.log
    }

    /// The frames `from` sent, in order.
    pub fn sent_by(&self, from: Side) -> impl Iterator<Item = &FrameInfo> {
        self.wire
            .log
            .iter()
            .filter(move |e| e.info.from == from)
            .map(|e| &e.info)
    }

    /// Applies `fault` to the frames `pred` matches, the first `times` of them (`None`:
    /// all). Rules are tried in the order they were added; the first that matches decides.
    pub fn inject(
        &mut self,
        fault: Fault,
        times: Option<u32>,
        pred: impl FnMut(&FrameInfo) -> bool + 'static,
    ) {
        self.wire.add_rule(fault, times, Box::new(pred));
    }

    /// Drops the frame whose [`FrameInfo::nth`] is `n` among those `from` sends (counted
    /// from the pair's start, every kind of frame included).
    pub fn drop_nth(&mut self, from: Side, n: u64) {
        self.inject(Fault::Drop, Some(1), move |f| f.from == from && f.nth == n);
    }

    /// Removes every fault rule (held frames stay held).
    pub fn clear_faults(&mut self) {
        self.wire.clear_rules();
    }

    /// Frames on their way to `to`, first to arrive first.
    pub fn in_flight(&self, to: Side) -> &VecDeque<Frame> {
        &self.wire.in_flight[to.index()]
    }

    /// Frames on their way to `to`, to rearrange or remove.
    pub fn in_flight_mut(&mut self, to: Side) -> &mut VecDeque<Frame> {
        &mut self.wire.in_flight[to.index()]
    }

    /// Stops (`true`) or resumes `side`'s card fetching from its send ring: descriptors the
    /// engine posts wait there, as behind a busy card.
    pub fn hold_card_tx(&mut self, side: Side, held: bool) {
        self.node(side).tx_held = held;
    }

    /// Stops (`true`) or resumes handing frames to `to`'s card; they wait in flight.
    pub fn pause(&mut self, to: Side, paused: bool) {
        self.wire.paused[to.index()] = paused;
    }

    /// Frames a [`Fault::Hold`] rule kept, oldest first.
    pub fn held(&self) -> &[Frame] {
        &self.wire.held
    }

    /// Puts every held frame, oldest first, behind the frames in flight to its card;
    /// returns how many.
    pub fn release_held(&mut self) -> usize {
        let held = std::mem::take(&mut self.wire.held);
        let n = held.len();
        for f in held {
            if let Some(to) = self.wire.side_at(&f.bytes) {
                self.wire.in_flight[to.index()].push_back(f);
            }
        }
        n
    }

    // ----------------------------------------------------------------------------------
    // The out-of-band channel.

    fn oob(&self) -> MutexGuard<'_, OobWire> {
        self.oob.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Delays the out-of-band records sent to `to` from now on by `d`.
    pub fn set_oob_delay(&mut self, to: Side, d: Duration) {
        self.oob().delay_ns[to.index()] = d.as_nanos() as u64;
    }

    /// Lets at most `records` out-of-band records be in flight to `to` (`None`: any number);
    /// a send beyond that fails with `WouldBlock`.
    pub fn set_oob_capacity(&mut self, to: Side, records: Option<usize>) {
        self.oob().capacity[to.index()] = records;
    }

    /// Whether `side` announces atomics in its hello (default yes). A request to a side
    /// that does not is answered by the sender's own channel with status unsupported.
    pub fn set_oob_atomics(&mut self, side: Side, takes: bool) {
        self.oob().atomics[side.index()] = takes;
    }

    /// Whether `side` answers access checks (its hello's ACCESS_CHECKS; default no). Checks
    /// to a side that does not are withheld, as the TCP channel withholds them.
    pub fn set_oob_access_checks(&mut self, side: Side, takes: bool) {
        self.oob().access_checks[side.index()] = takes;
    }

    /// Loses the next `n` atomic messages (requests or replies) sent to `to`.
    pub fn drop_oob_atomics(&mut self, to: Side, n: u32) {
        self.oob().drop_atomics[to.index()] = n;
    }

    /// Cuts the out-of-band channel: records in flight are lost, both engines learn their
    /// peer is gone at their next poll, and sends fail until [`Pair::restore_oob`].
    pub fn cut_oob(&mut self) {
        let now = self.now();
        self.oob().cut(now);
    }

    /// Lets out-of-band records through again.
    pub fn restore_oob(&mut self) {
        self.oob().restore();
    }

    /// Out-of-band records (and events) on their way to `to`.
    pub fn oob_in_flight(&self, to: Side) -> usize {
        self.oob().in_flight(to)
    }

    /// Out-of-band records `side` sent.
    pub fn oob_sent(&self, side: Side) -> u64 {
        self.oob().sent[side.index()]
    }

    // ----------------------------------------------------------------------------------
    // Diagnostics.

    /// Both engines' state dumps, both cards' counters and the last 32 lines of the wire
    /// log: the message for a failed assertion.
    pub fn dump(&mut self) -> String {
        let now = self.instant();
        let mut s = format!("virtual time {} ns\n", now.0);
        for side in Side::BOTH {
            let _ = writeln!(s, "--- side {side:?}");
            let _ = self.engine(side).dump(&mut s, now);
            let _ = writeln!(s, "card: {}", self.nic_stats(side));
            if let Some(stop) = self.rtl_stop(side) {
                let _ = writeln!(s, "card frozen at an RTL stop: {stop}");
            }
        }
        let log = &self.wire.log;
        let _ = writeln!(s, "--- wire ({} frames, last 32)", log.len());
        for e in &log[log.len().saturating_sub(32)..] {
            let _ = writeln!(s, "{e}");
        }
        s
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // A stop the test did not allow fails it, also when it came after its last step.
        let stopped = self.check_rtl_stops().err();
        for node in self.nodes.drain(..) {
            let Node { dev, dma, bufs, .. } = node;
            let _ = dev.close();
            for b in bufs {
                // SAFETY: the engine that held these buffers' addresses is closed and the
                // card is dropped with this node, so nothing refers to them any more.
                unsafe { dma.free(b) };
            }
        }
        if let Some(e) = stopped {
            if !std::thread::panicking() {
                panic!("{e} (set PairConfig::allow_rtl_stops if the test means it)");
            }
        }
    }
}
