//! The thread-safe verbs API around the core engine.
//!
//! One [`Context`] per opened device holds the engine behind a mutex and runs one progress
//! thread that polls the card: it spins while there is work and backs off to short sleeps
//! when there is none, so an idle device costs next to no CPU. Verbs called from any
//! thread (post, poll) also drive progress themselves, so an application that polls its
//! CQ sees completions without waiting for the progress thread. An emulated card that runs
//! in the driver's threads (the default) is stepped by the same calls (`verbs::inline`), and the
//! progress thread then sleeps in the card's link rather than on a timer.
//!
//! Objects ([`Pd`], [`Mr`], [`Cq`], [`Qp`]) are `Send + Sync` handles; dropping one releases
//! it in the card (an MR is invalidated before its key is reused, a QP is destroyed in the
//! card before its index is). Posting a raw address is `unsafe` with a written contract:
//! the buffer belongs to the work request until its completion is polled.

use std::fmt;
use std::mem::ManuallyDrop;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bluerdma_core::addr::{PageSize, VirtAddr};
use bluerdma_core::desc::{AccessFlags, MacAddr};
use bluerdma_core::engine::{
    AsyncEvent, Device, DeviceConfig, EngineStats, QpCaps, TableWindows, VerbsError, WorkCompletion,
};
use bluerdma_core::keys::MrKey;
use bluerdma_core::platform::OobTransport;
use bluerdma_core::qp::QpType;
use bluerdma_core::time::{Instant, Nanos};

use crate::backend::{
    Backend, BackendHandle, BackendKind, BufferKind, DynPlatform, InlineCard, OpenError, Tuning,
};
use crate::oob_hub::DynOob;
use crate::storage::{Capacity, HeapStorage};
use wake::{LinkBell, Wake};

mod buffer;
mod inline;
mod mw;
mod progress;
mod qp;
mod wake;

pub use mw::Mw;
pub use qp::{card_takes_first_psn, Endpoint, Qp};

use buffer::OwnedBuf;

/// A verbs error with the operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error {
    /// The verb.
    pub op: &'static str,
    /// Why it failed.
    pub kind: VerbsError,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.kind)
    }
}

impl std::error::Error for Error {}

fn err(op: &'static str) -> impl Fn(VerbsError) -> Error {
    move |kind| Error { op, kind }
}

/// What describes one device.
#[derive(Clone, Debug)]
pub struct DeviceSpec {
    /// Name (e.g. `blue0`).
    pub name: String,
    /// The card's IPv4 address.
    pub ip: Ipv4Addr,
    /// The card's MAC.
    pub mac: MacAddr,
    /// Object capacities.
    pub capacity: Capacity,
    /// Translation page size (must match the card).
    pub page_size: PageSize,
    /// Emulated card only: add the protection-domain check the real card lacks
    /// (hardware-contract.md correction 10).
    pub strict_pd: bool,
    /// The PSN every connection of this device starts from on the wire, whatever PSNs the
    /// application exchanged (see [`Qp::modify`]); both ends of a connection must use the
    /// same. 0 by default; tests set 0xFFFFF0 to cross the 24-bit wrap. A value in
    /// 0x7FFFF0..=0xFFFF7F is refused when the device opens (the card cannot take it).
    pub wire_psn_start: u32,
    /// The OOB channel's key file (`key=` in the device list); `None`: the default key
    /// ([`crate::oob::OobKey::Default`]).
    pub oob_key: Option<std::path::PathBuf>,
    /// Where the engine's key bytes start (`DeviceConfig::key_seed`): the daemon of a
    /// shared device gives each process its own.
    pub key_seed: u32,
}

impl DeviceSpec {
    /// A device at `ip` with a MAC derived from it (`02:00:<ip>`).
    pub fn new(name: &str, ip: Ipv4Addr) -> Self {
        let o = ip.octets();
        Self {
            name: name.into(),
            ip,
            mac: MacAddr([0x02, 0x00, o[0], o[1], o[2], o[3]]),
            capacity: Capacity::default(),
            page_size: PageSize::Size2M,
            strict_pd: false,
            wire_psn_start: 0,
            oob_key: None,
            key_seed: DeviceConfig::new(MacAddr([0; 6]), Ipv4Addr::UNSPECIFIED).key_seed,
        }
    }
}

type Engine = Device<DynPlatform, HeapStorage>;

struct Inner {
    /// The engine; closed ([`Device::close`], which frees the card's DMA buffers) when the
    /// last handle goes.
    dev: ManuallyDrop<Mutex<Engine>>,
    epoch: std::time::Instant,
    stop: AtomicBool,
    /// Wakes the progress thread when new work is posted (or, through [`Context::waker`],
    /// when the out-of-band channel has records for it), wherever it sleeps.
    wake: Arc<Wake>,
    spec: DeviceSpec,
    /// The share of the card's tables this engine allocates in (the whole card unless the
    /// device is shared between processes).
    windows: TableWindows,
    /// Which backend the device runs on, and how its owned buffers are made.
    kind: BackendKind,
    buffers: BufferKind,
    /// How the engine paces itself on this backend (bounds the wait of [`Inner::drain_tx`]).
    tuning: Tuning,
    /// Keeps the backend alive; dropped first when the last handle goes (the card stops
    /// touching the engine's DMA buffers before [`Device::close`] frees them).
    handle: ManuallyDrop<Mutex<Box<dyn BackendHandle>>>,
    /// The card, when it runs in the driver's threads: polls step it, and the progress
    /// thread waits in its link ([`progress`]).
    inline: Option<Arc<dyn InlineCard>>,
    /// When the application's current run of CQ polls that found nothing began (ns since
    /// `epoch`; 0 after one that found completions), and when the last of them was: an
    /// application that spins on a CQ for long receives for itself, and frames are not
    /// announced to the progress thread meanwhile ([`progress`]).
    spin_start: AtomicU64,
    spin_last: AtomicU64,
    /// The inline card's count of simple-NIC frames when an application poll last looked.
    raw_seen: AtomicU64,
    /// When the last post_send was (ns since `epoch`; [`Inner::post_burst`]).
    last_post: AtomicU64,
    /// CQs armed for a completion event ([`Cq::arm`]); the progress thread watches them.
    armed: Mutex<Vec<Weak<CqInner>>>,
    /// The consumer of received simple-NIC frames ([`Context::set_raw_handler`]).
    raw: Mutex<Option<RawHandler>>,
    /// Whether `raw` is set (read by the progress thread without taking `raw`).
    raw_wanted: AtomicBool,
    /// The consumer of asynchronous events ([`Context::set_event_handler`]).
    events: Mutex<Option<EventHandler>>,
}

/// A consumer of asynchronous events (a CQ overrun, a QP that failed on its own): called on
/// the progress thread, without the device lock.
pub type EventHandler = Box<dyn FnMut(AsyncEvent) + Send>;

impl Drop for Inner {
    fn drop(&mut self) {
        self.drain_tx();
        // The card stops first (the emulated card's threads, the RTL DMA client): it must
        // not touch the DMA buffers the engine frees.
        // SAFETY: `handle` is dropped once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.handle) };
        // An inline card goes with it (the engine's doorbells ring nothing after this).
        self.inline = None;
        // SAFETY: `dev` is taken once, here, and never used again.
        let dev = unsafe { ManuallyDrop::take(&mut self.dev) };
        let dev = dev.into_inner().unwrap_or_else(|e| e.into_inner());
        drop(dev.close());
    }
}
/// A consumer of received simple-NIC frames: called on the progress thread with each
/// frame's bytes, without the device lock (it may post, poll or send raw frames).
pub type RawHandler = Box<dyn FnMut(&[u8]) + Send>;

impl Inner {
    /// Before the DMA buffers go: lets the card fetch the descriptors it was given and, where
    /// the backend can tell, read the simple-NIC frames they name (a UD SEND completes when
    /// posted; a process that exits right after it must not take the datagram with it).
    /// Gives up when the card has made no progress for a quarter of the command timeout (a
    /// stopped or frozen card), logging what it left.
    fn drain_tx(&self) {
        let stall = self.tuning.command_timeout / 4;
        let mut last = None;
        let mut since = std::time::Instant::now();
        // No progress thread runs now: the clock of waiting verbs runs an inline card's
        // transmit side.
        let mut clock = self.clock();
        loop {
            let now = clock();
            let backlog = {
                let mut dev = self.lock();
                dev.poll(now);
                dev.tx_backlog()
            };
            let read = self.handle().tx_frame_bytes_read();
            let unread = read.map_or(0, |r| backlog.simple_nic_bytes.saturating_sub(r));
            if backlog.unfetched == 0 && unread == 0 {
                return;
            }
            let now = (backlog.unfetched, read);
            if last != Some(now) {
                last = Some(now);
                since = std::time::Instant::now();
            } else if since.elapsed() >= stall {
                log::warn!(
                    "{}: closing with {} descriptors the card has not fetched and {unread} \
                     simple-NIC bytes it has not read ({} ms without progress)",
                    self.spec.name,
                    backlog.unfetched,
                    stall.as_millis()
                );
                return;
            }
            thread::sleep(Duration::from_micros(200));
        }
    }

    fn handle(&self) -> MutexGuard<'_, Box<dyn BackendHandle>> {
        self.handle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Instant {
        Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    /// The clock a verb that waits for the card reads; it also runs an inline card's
    /// transmit side when a send-ring doorbell waits (destroy_qp and dereg_mr wait for the
    /// card to fetch the send ring).
    fn clock(&self) -> impl FnMut() -> Instant + '_ {
        move || {
            if let Some(card) = &self.inline {
                card.flush_tx();
            }
            self.now()
        }
    }

    fn kick(&self) {
        self.wake.kick();
    }
}

/// An opened device: the engine, its emulated card and the progress thread.
pub struct Context {
    inner: Arc<Inner>,
    progress: Option<JoinHandle<()>>,
}

impl Context {
    /// Opens the driver on a backend's platform (see [`crate::backend`]), announcing
    /// receive WRs over `oob` (the TCP channel, an in-process hub, or none: SEND is then
    /// refused).
    pub fn open_backend(
        spec: DeviceSpec,
        backend: Backend,
        oob: Option<Box<dyn OobTransport + Send>>,
    ) -> Result<Context, OpenError> {
        Self::open_backend_in(spec, backend, oob, TableWindows::WHOLE)
    }

    /// [`Context::open_backend`] for an engine that owns only `windows` of the card's
    /// tables (a process sharing the device, [`crate::shared`]).
    pub fn open_backend_in(
        spec: DeviceSpec,
        backend: Backend,
        oob: Option<Box<dyn OobTransport + Send>>,
        windows: TableWindows,
    ) -> Result<Context, OpenError> {
        if !card_takes_first_psn(spec.wire_psn_start) {
            return Err(OpenError::new(
                &spec.name,
                libc::EINVAL,
                "wire_psn_start in 0x7FFFF0..=0xFFFF7F (the card cannot take it)",
            ));
        }
        let Backend {
            kind,
            regs,
            dma,
            mem,
            tuning,
            buffers,
            handle,
            inline,
        } = backend;
        let mut cfg = DeviceConfig::new(spec.mac, spec.ip);
        cfg.page_size = spec.page_size;
        cfg.command_timeout = Nanos(tuning.command_timeout.as_nanos() as u64);
        cfg.ack_timeout_min = Nanos(tuning.ack_timeout_min.as_nanos() as u64);
        cfg.send_window = tuning.send_window.max(1);
        cfg.windows = windows.clone();
        cfg.key_seed = spec.key_seed;
        let epoch = std::time::Instant::now();
        let mut clock = || Instant(epoch.elapsed().as_nanos() as u64);
        let mut dev = Device::open(
            regs,
            dma,
            mem,
            HeapStorage::new(spec.capacity),
            cfg,
            &mut clock,
        )
        .map_err(|e| OpenError::from_engine(&spec.name, e))?;
        if let Some(oob) = oob {
            dev.attach_oob(DynOob(oob));
        }
        let frames: Vec<_> = dev.simple_nic_tx_buffers().into_iter().flatten().collect();
        handle.watch_tx_frames(&frames);
        let inner = Arc::new(Inner {
            dev: ManuallyDrop::new(Mutex::new(dev)),
            epoch,
            stop: AtomicBool::new(false),
            wake: Arc::new(Wake::new(
                inline
                    .clone()
                    .map(|card| -> LinkBell { Arc::new(move || card.wake()) }),
            )),
            spec,
            windows,
            kind,
            buffers,
            tuning,
            handle: ManuallyDrop::new(Mutex::new(handle)),
            inline,
            spin_start: AtomicU64::new(0),
            spin_last: AtomicU64::new(0),
            last_post: AtomicU64::new(0),
            raw_seen: AtomicU64::new(0),
            armed: Mutex::new(Vec::new()),
            raw: Mutex::new(None),
            raw_wanted: AtomicBool::new(false),
            events: Mutex::new(None),
        });
        let thread_inner = Arc::clone(&inner);
        let progress = thread::Builder::new()
            .name(format!("{}-progress", inner.spec.name))
            .spawn(move || progress::progress_loop(&thread_inner))
            .map_err(|e| {
                OpenError::new(
                    &inner.spec.name,
                    libc::EAGAIN,
                    format!("cannot start the progress thread: {e}"),
                )
            })?;
        Ok(Context {
            inner,
            progress: Some(progress),
        })
    }

    /// A function that wakes the progress thread out of its idle sleep, for a transport
    /// whose records arrive on another thread (an atomic request waits for the responder's
    /// next poll otherwise), wherever the thread sleeps (an inline card's link included).
    /// It holds only the wake-up and the inline card's bell, not the device.
    pub fn waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        let wake = Arc::clone(&self.inner.wake);
        Arc::new(move || wake.kick())
    }

    /// Starts an emulated card on `link` and opens the driver on it, with no out-of-band
    /// channel (SEND is refused; see [`Context::open_emulated_with_oob`]).
    #[cfg(feature = "emulator")]
    pub fn open_emulated(
        spec: DeviceSpec,
        link: Box<dyn bluerdma_sim::link::LinkPort>,
    ) -> Result<Context, OpenError> {
        Self::open_emulated_with_oob(spec, link, None)
    }

    /// Starts an emulated card on `link` and opens the driver on it, announcing receive WRs
    /// over `oob` (the TCP channel of issue D, or an in-process hub). A channel whose records
    /// arrive on a thread of its own (the TCP channel) should be given [`Context::waker`]
    /// once this returns (`TcpOob::notifier().set(ctx.waker())`, as `devices::open` does):
    /// without it a record (an atomic request, a receive WR) waits for the progress
    /// thread's next wake-up.
    #[cfg(feature = "emulator")]
    pub fn open_emulated_with_oob(
        spec: DeviceSpec,
        link: Box<dyn bluerdma_sim::link::LinkPort>,
        oob: Option<Box<dyn OobTransport + Send>>,
    ) -> Result<Context, OpenError> {
        let backend = crate::backend::emulated::open(&spec, link)?;
        Self::open_backend(spec, backend, oob)
    }

    /// The backend the device runs on.
    pub fn backend(&self) -> BackendKind {
        self.inner.kind
    }

    /// The share of the card's tables this engine allocates in: the whole card, or this
    /// process's window on a shared device.
    pub fn windows(&self) -> &TableWindows {
        &self.inner.windows
    }

    /// The device's spec.
    pub fn spec(&self) -> &DeviceSpec {
        &self.inner.spec
    }

    /// Engine counters.
    pub fn stats(&self) -> EngineStats {
        self.inner.lock().stats()
    }

    /// The card side's counters, as text (for state dumps): the emulated card's counters,
    /// the RTL DMA client's, or the PCI card's register counters.
    pub fn card_stats(&self) -> String {
        self.inner
            .handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .card_stats()
    }

    /// A state dump: the engine's rings, QPs, MRs and counters, then the card side's
    /// counters.
    pub fn dump(&self) -> String {
        let now = self.inner.now();
        let mut s = String::new();
        let _ = self.inner.lock().dump(&mut s, now);
        s.push_str("card: ");
        s.push_str(&self.card_stats());
        s.push('\n');
        s
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd, Error> {
        let pd = self.inner.lock().alloc_pd().map_err(err("alloc_pd"))?;
        Ok(Pd(Arc::new(PdInner {
            ctx: Arc::clone(&self.inner),
            pd,
        })))
    }

    /// Creates a completion queue of [`DEFAULT_CQE`] completions.
    pub fn create_cq(&self) -> Result<Cq, Error> {
        self.create_cq_sized(DEFAULT_CQE)
    }

    /// Creates a completion queue that holds `cqe` completions; one more is an overrun
    /// (the CQ raises [`AsyncEvent::CqError`] and its QPs go to ERR).
    pub fn create_cq_sized(&self, cqe: u32) -> Result<Cq, Error> {
        let cq = self.inner.lock().create_cq(cqe).map_err(err("create_cq"))?;
        Ok(Cq(Arc::new(CqInner {
            ctx: Arc::clone(&self.inner),
            cq,
            armed: AtomicBool::new(false),
            notify: Mutex::new(None),
        })))
    }

    /// Sets (or removes) the consumer of asynchronous events. Without one they are logged
    /// and dropped.
    pub fn set_event_handler(&self, handler: Option<EventHandler>) {
        *self.inner.events.lock().unwrap_or_else(|e| e.into_inner()) = handler;
    }

    /// Sets (or, with `None`, removes) the consumer of received simple-NIC frames: frames
    /// whose UDP destination port is not 4791 (nic-behaviour.md 2.1). The progress thread
    /// takes them from the engine each round and calls `handler` with each, without the
    /// device lock. Without a handler they are dropped and counted (`raw_dropped`).
    pub fn set_raw_handler(&self, handler: Option<RawHandler>) {
        let on = handler.is_some();
        *self.inner.raw.lock().unwrap_or_else(|e| e.into_inner()) = handler;
        self.inner.raw_wanted.store(on, Ordering::Release);
        self.inner.lock().set_keep_raw_frames(on);
        self.inner.kick();
    }

    /// Sends one whole Ethernet frame (at most 2048 bytes) through the simple NIC; the
    /// bytes are copied, so `frame` may be reused at once. Busy: every TX slot is still
    /// waiting for the card (try again).
    pub fn send_raw(&self, frame: &[u8]) -> Result<(), Error> {
        self.inner.lock().send_raw(frame).map_err(err("send_raw"))
    }

    /// Drives the engine once (the progress thread does this too).
    pub fn poll(&self) -> bool {
        let now = self.inner.now();
        let card = self.inner.inline.as_ref().is_some_and(|c| c.step());
        let mut clock = self.inner.clock();
        let mut dev = self.inner.lock();
        let work = dev.poll(now);
        dev.run_remote_invalidations(&mut clock) || work || card
    }
}
impl Drop for Context {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.kick();
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
    }
}
struct PdInner {
    ctx: Arc<Inner>,
    pd: u32,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.lock().dealloc_pd(self.pd) {
            log::error!("dealloc_pd({}): {e}", self.pd);
        }
    }
}

/// A protection domain. Clones share it; it is freed when the last clone (and every MR and
/// QP made from it) is gone.
#[derive(Clone)]
pub struct Pd(Arc<PdInner>);

impl Pd {
    /// The PD handle.
    pub fn handle(&self) -> u32 {
        self.0.pd
    }

    /// Registers memory the caller owns.
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay valid (mapped, not freed) until the returned [`Mr`] is
    /// dropped: the card may read or write it at any time while it is registered.
    pub unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr, Error> {
        let ctx = &self.0.ctx;
        // The card writes the page table in steps; the device lock is held for each step,
        // not for the whole registration (a 1 GiB MR takes many commands), so other threads
        // post and poll meanwhile. The progress thread moves the job on too.
        let pending = ctx
            .lock()
            .reg_mr_start(
                self.0.pd,
                VirtAddr(addr as u64),
                len as u64,
                access,
                ctx.now(),
            )
            .map_err(err("reg_mr"))?;
        let key = loop {
            if let Some(r) = ctx.lock().reg_mr_poll(pending, ctx.now()) {
                break r.map_err(err("reg_mr"))?;
            }
            std::thread::yield_now();
        };
        Ok(Mr {
            pd: self.clone(),
            key,
            addr: addr as u64,
            len,
            owned: None,
        })
    }

    /// Allocates `len` zeroed bytes (page aligned) and registers them: the safe way to get a
    /// registered buffer.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr, Error> {
        let buf = OwnedBuf::new(len, self.0.ctx.buffers).map_err(err("alloc_mr"))?;
        // SAFETY: the buffer is owned by the returned Mr and freed after deregistration.
        let mut mr = unsafe { self.reg_mr(buf.ptr(), len, access)? };
        mr.owned = Some(buf);
        Ok(mr)
    }

    /// Creates an RC queue pair in RESET with [`DEFAULT_QP_CAPS`].
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq) -> Result<Qp, Error> {
        self.create_qp_with(send_cq, recv_cq, DEFAULT_QP_CAPS)
    }

    /// Creates an RC queue pair in RESET whose queues hold `caps`.
    pub fn create_qp_with(&self, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp, Error> {
        let ctx = &self.0.ctx;
        let qpn = {
            let mut clock = ctx.clock();
            ctx.lock()
                .create_qp(
                    self.0.pd,
                    send_cq.0.cq,
                    recv_cq.0.cq,
                    QpType::Rc,
                    caps,
                    &mut clock,
                )
                .map_err(err("create_qp"))?
        };
        Ok(Qp {
            pd: self.clone(),
            _cqs: (send_cq.clone(), recv_cq.clone()),
            qpn,
            psn_offset: Mutex::new((0, 0)),
        })
    }
}

/// The queue sizes of a QP made by [`Pd::create_qp`]: 256 send requests and 256 receive
/// WRs (256 such QPs fit a device's tables).
pub const DEFAULT_QP_CAPS: QpCaps = QpCaps {
    max_send_wr: 256,
    max_recv_wr: 256,
    read_responses: bluerdma_core::engine::READ_RESPONSE_ROOM,
};

/// A registered memory region.
pub struct Mr {
    pd: Pd,
    key: MrKey,
    addr: u64,
    len: usize,
    owned: Option<OwnedBuf>,
}

impl Mr {
    /// The key (lkey = rkey).
    pub fn key(&self) -> MrKey {
        self.key
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bytes of an owned region (see [`Pd::alloc_mr`]); `None` for caller memory.
    ///
    /// The card may write them while a work request targets them; read them after the
    /// completion that says it is done.
    pub fn bytes(&self) -> Option<&[u8]> {
        // SAFETY: an owned buffer is valid for `len` bytes while `self` lives.
        self.owned
            .as_ref()
            .map(|b| unsafe { std::slice::from_raw_parts(b.ptr(), self.len) })
    }
    /// Mutable bytes of an owned region.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let len = self.len;
        // SAFETY: as in `bytes`, and `&mut self` excludes other borrows through this Mr.
        self.owned
            .as_mut()
            .map(|b| unsafe { std::slice::from_raw_parts_mut(b.ptr(), len) })
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let ctx = &self.pd.0.ctx;
        let mut clock = ctx.clock();
        if let Err(e) = ctx.lock().dereg_mr(self.key, &mut clock) {
            log::error!("dereg_mr({:#x}): {e}", self.key.get());
        }
    }
}

/// A callback run when an armed CQ has a completion.
pub type CqNotify = Box<dyn Fn() + Send + Sync>;

/// Completions a CQ made by [`Context::create_cq`] holds.
pub const DEFAULT_CQE: u32 = 4096;

struct CqInner {
    ctx: Arc<Inner>,
    cq: u32,
    armed: AtomicBool,
    notify: Mutex<Option<CqNotify>>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.lock().destroy_cq(self.cq) {
            log::error!("destroy_cq({}): {e}", self.cq);
        }
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq(Arc<CqInner>);

impl Cq {
    /// Moves completions into `out`; returns how many. Drives progress first.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Error> {
        let ctx = &self.0.ctx;
        let now = ctx.now();
        ctx.app_poll();
        let mut clock = ctx.clock();
        let mut dev = ctx.lock();
        dev.poll(now);
        dev.run_remote_invalidations(&mut clock);
        let n = dev.poll_cq(self.0.cq, out).map_err(err("poll_cq"))?;
        // The guard runs what the engine posted in this poll (ACKs, resent requests).
        drop(dev);
        ctx.app_polled(now, n);
        if n == 0 {
            // An application spinning on an empty CQ (ibv_rc_pingpong, perftest) would
            // otherwise keep the emulated card's threads and the peer off the CPU on a
            // small machine: give them the rest of this time slice.
            thread::yield_now();
        }
        Ok(n)
    }

    /// Adds a completion made outside the engine (a software transport such as UD): polls
    /// return it after the ones already queued, and an armed CQ fires. A full CQ overruns
    /// as with the engine's own completions.
    pub fn push(&self, wc: WorkCompletion) {
        if let Err(e) = self.0.ctx.lock().push_completion(self.0.cq, wc) {
            log::error!("push_completion({}): {e}", self.0.cq);
        }
        if self.0.armed.swap(false, Ordering::AcqRel) {
            if let Some(f) = self
                .0
                .notify
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                f();
            }
        }
    }

    /// Changes how many completions the CQ holds; refused below the completions it holds
    /// now.
    pub fn resize(&self, cqe: u32) -> Result<(), Error> {
        self.0
            .ctx
            .lock()
            .resize_cq(self.0.cq, cqe)
            .map_err(err("resize_cq"))
    }

    /// The CQ's handle in the engine (what [`AsyncEvent::CqError`] names).
    pub fn handle(&self) -> u32 {
        self.0.cq
    }

    /// Sets the callback [`Cq::arm`] fires (a completion channel's writer). It runs on the
    /// progress thread, without the device lock; it must not block.
    pub fn set_notify(&self, f: CqNotify) {
        *self.0.notify.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    /// Requests one event: the notify callback runs once, as soon as this CQ holds a
    /// completion (at once if it already holds one), and the CQ is disarmed.
    pub fn arm(&self) {
        let ctx = &self.0.ctx;
        if !self.0.armed.swap(true, Ordering::AcqRel) {
            ctx.armed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::downgrade(&self.0));
        }
        ctx.kick();
    }

    /// Polls until `n` completions arrived or `timeout` passed.
    pub fn wait(&self, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>, Error> {
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        let mut buf = [WorkCompletion::EMPTY; 32];
        while got.len() < n && std::time::Instant::now() < deadline {
            let k = self.poll(&mut buf[..(n - got.len()).min(32)])?;
            got.extend_from_slice(&buf[..k]);
            if k == 0 {
                thread::yield_now();
            }
        }
        Ok(got)
    }
}
