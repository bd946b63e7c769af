//! The thread-safe verbs API around the core engine.
//!
//! One [`Context`] per opened device holds the engine behind a mutex and runs one progress
//! thread that polls the card: it spins while there is work and backs off to short sleeps
//! when there is none, so an idle device costs next to no CPU. Verbs called from any
//! thread (post, poll) also drive progress themselves, so an application that polls its
//! CQ sees completions without waiting for the progress thread.
//!
//! Objects ([`Pd`], [`Mr`], [`Cq`], [`Qp`]) are `Send + Sync` handles; dropping one releases
//! it in the card (an MR is invalidated before its key is reused, a QP is destroyed in the
//! card before its index is). Posting a raw address is `unsafe` with a written contract:
//! the buffer belongs to the work request until its completion is polled.

use std::fmt;
use std::mem::ManuallyDrop;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bluerdma_core::addr::{PageSize, VirtAddr};
use bluerdma_core::desc::{AccessFlags, MacAddr};
use bluerdma_core::engine::{
    AsyncEvent, Device, DeviceConfig, EngineStats, QpAttrs, QpCaps, RecvWr, SendWr, VerbsError,
    WorkCompletion,
};
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::platform::{OobTransport, Platform};
use bluerdma_core::qp::{Gid, QpAttrMask, QpState, QpType, RawQpAttr};
use bluerdma_core::time::Instant;
use bluerdma_sim::inproc::{InProcessCard, SimRegs};
use bluerdma_sim::link::LinkPort;
use bluerdma_sim::mem::{HostDma, HostMemory};
use bluerdma_sim::model::NicConfig;

use crate::oob_hub::DynOob;
use crate::storage::{Capacity, HeapStorage};

/// The platform of an emulated card in this process.
pub struct EmulatedPlatform;

impl Platform for EmulatedPlatform {
    type Regs = SimRegs;
    type Dma = HostDma;
    type Mem = HostMemory;
    type Oob = DynOob;
}

/// The environment variable naming a directory to capture each opened card's frames in.
pub const PCAP_ENV: &str = "BLUERDMA_PCAP";

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
}

impl DeviceSpec {
    /// A device at `ip` with a MAC derived from it (02:00:<ip>).
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
        }
    }
}

type Engine = Device<EmulatedPlatform, HeapStorage>;

struct Inner {
    /// The engine; closed ([`Device::close`], which frees the card's DMA buffers) when the
    /// last handle goes.
    dev: ManuallyDrop<Mutex<Engine>>,
    epoch: std::time::Instant,
    stop: AtomicBool,
    /// Wakes the progress thread when new work is posted.
    kick: (Mutex<bool>, Condvar),
    spec: DeviceSpec,
    card: Mutex<Option<InProcessCard>>,
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
        // The card stops first: it must not touch the DMA buffers the engine frees.
        drop(
            self.card
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        // SAFETY: `dev` is taken once, here, and never used again.
        let dev = unsafe { ManuallyDrop::take(&mut self.dev) };
        let dev = dev.into_inner().unwrap_or_else(|e| e.into_inner());
        drop(dev.close());
    }
}

/// A consumer of received simple-NIC frames: called on the progress thread with each
/// frame's bytes, without the device lock (it may post, poll or send raw frames).
pub type RawHandler = Box<dyn FnMut(&[u8]) + Send>;

/// Frames taken from the engine under its lock, handed to the raw handler after it.
#[derive(Default)]
struct RawBatch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl RawBatch {
    /// Copies the frames the engine holds (when a handler wants them); returns how many.
    fn take(&mut self, inner: &Inner, dev: &mut Engine) -> usize {
        self.bytes.clear();
        self.ends.clear();
        if !inner.raw_wanted.load(Ordering::Acquire) {
            return 0;
        }
        dev.take_raw_frames(&mut |f| {
            self.bytes.extend_from_slice(f);
            self.ends.push(self.bytes.len());
        })
    }

    /// Runs the handler on every frame taken, once: the batch is empty afterwards (a round
    /// that could not take the engine lock must not hand the last batch over again; it did,
    /// and a UD receiver got a datagram twice).
    fn deliver(&mut self, inner: &Inner) {
        if self.ends.is_empty() {
            return;
        }
        {
            let mut h = inner.raw.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(h) = h.as_mut() {
                let mut start = 0;
                for &end in &self.ends {
                    h(&self.bytes[start..end]);
                    start = end;
                }
            }
        }
        self.bytes.clear();
        self.ends.clear();
    }
}

impl Inner {
    fn now(&self) -> Instant {
        Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    fn lock(&self) -> MutexGuard<'_, Engine> {
        self.dev.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clock(&self) -> impl FnMut() -> Instant + '_ {
        move || self.now()
    }

    fn kick(&self) {
        let (lock, cv) = &self.kick;
        if let Ok(mut k) = lock.lock() {
            *k = true;
            cv.notify_one();
        }
    }
}

/// An opened device: the engine, its emulated card and the progress thread.
pub struct Context {
    inner: Arc<Inner>,
    progress: Option<JoinHandle<()>>,
}

impl Context {
    /// Starts an emulated card on `link` and opens the driver on it, with no out-of-band
    /// channel (SEND is refused; see [`Context::open_emulated_with_oob`]).
    pub fn open_emulated(spec: DeviceSpec, link: Box<dyn LinkPort>) -> Result<Context, Error> {
        Self::open_emulated_with_oob(spec, link, None)
    }

    /// The default device: an emulated card on the UDP link at `spec.ip` (port 4791) and the
    /// out-of-band channel over TCP at `spec.ip`, port `oob_port` (60000 by the spec), so
    /// SEND/RECV work between processes and hosts. With `BLUERDMA_PCAP=<dir>` set, the
    /// card's frames, both directions, are captured to `<dir>/<name>.pcap` (read it with
    /// `tshark -d udp.port==4791,infiniband`).
    pub fn open(spec: DeviceSpec, oob_port: u16) -> Result<Context, Error> {
        // The OS error travels on (EADDRINUSE for a taken address, EADDRNOTAVAIL for one
        // that is not local), so a caller can tell the failures apart.
        let fail = |e: &std::io::Error| Error {
            op: "open",
            kind: VerbsError::Platform(bluerdma_core::platform::PlatformError::Os(
                e.raw_os_error().unwrap_or(libc::EIO),
            )),
        };
        // A device configured on a non-loopback address (a node's own address in a network
        // namespace, or a host's) reaches its peers over that network.
        let link_cfg = bluerdma_sim::link::UdpLinkConfig {
            network: !spec.ip.is_loopback(),
            ..bluerdma_sim::link::UdpLinkConfig::new(spec.ip)
        };
        let link = bluerdma_sim::link::UdpLink::bind(link_cfg).map_err(|e| {
            log::error!("open {}: UDP link on {}:4791: {e}", spec.name, spec.ip);
            fail(&e)
        })?;
        let link: Box<dyn LinkPort> = match std::env::var_os(PCAP_ENV) {
            Some(path) => {
                let path = std::path::PathBuf::from(path).join(format!("{}.pcap", spec.name));
                // Unbuffered: a process that exits without closing the device (perftest on
                // an error) still leaves every frame in the file.
                let file = std::fs::File::create(&path);
                let sink = file
                    .and_then(bluerdma_sim::link::PcapSink::new)
                    .map_err(|e| {
                        log::error!("open {}: {PCAP_ENV}: {}: {e}", spec.name, path.display());
                        fail(&e)
                    })?;
                log::info!("{}: capturing to {}", spec.name, path.display());
                Box::new(bluerdma_sim::link::CapturingLink::new(
                    link,
                    sink,
                    bluerdma_sim::link::CaptureDirection::Both,
                ))
            }
            None => Box::new(link),
        };
        let mut cfg = crate::oob::TcpOobConfig::new(spec.ip);
        cfg.port = oob_port;
        if let Some(path) = &spec.oob_key {
            cfg.key = crate::oob::OobKey::File(path.clone());
        }
        let oob = crate::oob::TcpOob::bind(cfg).map_err(|e| {
            log::error!("open {}: {e}", spec.name);
            match &e {
                crate::oob::TcpOobError::Listen { source, .. }
                | crate::oob::TcpOobError::Setup(source) => fail(source),
                // The key file cannot be read or is unsafe (the log says which).
                crate::oob::TcpOobError::Key(_) => {
                    fail(&std::io::Error::from_raw_os_error(libc::EACCES))
                }
            }
        })?;
        Self::open_emulated_with_oob(spec, link, Some(Box::new(oob)))
    }

    /// Starts an emulated card on `link` and opens the driver on it, announcing receive WRs
    /// over `oob` (the TCP channel of issue D, or an in-process hub).
    pub fn open_emulated_with_oob(
        spec: DeviceSpec,
        link: Box<dyn LinkPort>,
        oob: Option<Box<dyn OobTransport + Send>>,
    ) -> Result<Context, Error> {
        if !card_takes_first_psn(spec.wire_psn_start) {
            return Err(Error {
                op: "open",
                kind: VerbsError::InvalidArgument {
                    what: "wire_psn_start in 0x7FFFF0..=0xFFFF7F (the card cannot take it)",
                },
            });
        }
        let card = InProcessCard::start(
            NicConfig {
                name: spec.name.clone(),
                page_size: spec.page_size,
                strict: spec.strict_pd,
                ..NicConfig::default()
            },
            link,
        )
        .map_err(|e| {
            log::error!("open {}: the emulated card could not start: {e}", spec.name);
            Error {
                op: "open",
                kind: VerbsError::Platform(bluerdma_core::platform::PlatformError::Os(
                    e.raw_os_error().unwrap_or(libc::EIO),
                )),
            }
        })?;
        let mut cfg = DeviceConfig::new(spec.mac, spec.ip);
        cfg.page_size = spec.page_size;
        let epoch = std::time::Instant::now();
        let mut clock = || Instant(epoch.elapsed().as_nanos() as u64);
        let dev = Device::open(
            card.regs.clone(),
            HostDma::new(card.map.clone()),
            HostMemory::new(card.map.clone()),
            HeapStorage::new(spec.capacity),
            cfg,
            &mut clock,
        )
        .map_err(err("open"))?;
        let mut dev = dev;
        if let Some(oob) = oob {
            dev.attach_oob(DynOob(oob));
        }
        let inner = Arc::new(Inner {
            dev: ManuallyDrop::new(Mutex::new(dev)),
            epoch,
            stop: AtomicBool::new(false),
            kick: (Mutex::new(false), Condvar::new()),
            spec,
            card: Mutex::new(Some(card)),
            armed: Mutex::new(Vec::new()),
            raw: Mutex::new(None),
            raw_wanted: AtomicBool::new(false),
            events: Mutex::new(None),
        });
        let thread_inner = Arc::clone(&inner);
        let progress = thread::Builder::new()
            .name(format!("{}-progress", inner.spec.name))
            .spawn(move || progress_loop(&thread_inner))
            .map_err(|_| Error {
                op: "open",
                kind: VerbsError::OutOfResources { what: "threads" },
            })?;
        Ok(Context {
            inner,
            progress: Some(progress),
        })
    }

    /// The device's spec.
    pub fn spec(&self) -> &DeviceSpec {
        &self.inner.spec
    }

    /// Engine counters.
    pub fn stats(&self) -> EngineStats {
        self.inner.lock().stats()
    }

    /// The emulated card's counters, as text (for state dumps).
    pub fn card_stats(&self) -> String {
        let card = self.inner.card.lock().unwrap_or_else(|e| e.into_inner());
        card.as_ref()
            .map(|c| {
                let mut s = c.nic.stats().snapshot().to_string();
                for counter in bluerdma_core::regs::Counter::ALL {
                    let v = c.nic.regs().counter(counter);
                    if v != 0 {
                        s.push_str(&format!(" {counter:?}={v}"));
                    }
                }
                s
            })
            .unwrap_or_default()
    }

    /// A state dump: the engine's rings, QPs, MRs and counters, then the emulated card's
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
        self.inner.lock().poll(now)
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

fn progress_loop(inner: &Inner) {
    let mut idle_rounds = 0u32;
    let mut raw = RawBatch::default();
    while !inner.stop.load(Ordering::Acquire) {
        let now = inner.now();
        // try_lock: an application thread inside a verb drives progress itself; the progress
        // thread never makes it wait (on two cores a contended lock costs more than a poll).
        let mut fire = Vec::new();
        let mut events = Vec::new();
        let mut round = |dev: &mut Engine| {
            let w = dev.poll(now);
            let frames = raw.take(inner, dev);
            collect_events(inner, dev, &mut fire);
            while let Some(e) = dev.take_event() {
                events.push(e);
            }
            (w || frames > 0, dev.next_deadline())
        };
        let polled = match inner.dev.try_lock() {
            Ok(mut dev) => Some(round(&mut dev)),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(round(&mut p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        // The raw handler and event callbacks run without the engine lock.
        raw.deliver(inner);
        for cq in fire {
            if let Some(f) = cq.notify.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                f();
            }
        }
        if !events.is_empty() {
            let mut h = inner.events.lock().unwrap_or_else(|e| e.into_inner());
            for e in events {
                match h.as_mut() {
                    Some(h) => h(e),
                    None => log::warn!("{}: asynchronous event {e:?}", inner.spec.name),
                }
            }
        }
        let Some((work, deadline)) = polled else {
            thread::yield_now();
            continue;
        };
        if work {
            idle_rounds = 0;
            continue;
        }
        idle_rounds = idle_rounds.saturating_add(1);
        if idle_rounds < 64 {
            // A reply or an ACK usually follows within microseconds: stay close, but let
            // the card's threads run.
            thread::yield_now();
            continue;
        }
        // Back off: 20 us doubling to 1 ms, never past a retransmission deadline.
        let backoff =
            Duration::from_micros(20u64 << (idle_rounds - 64).min(6)).min(Duration::from_millis(1));
        let until_deadline = deadline
            .map(|d| Duration::from_nanos(d.0.saturating_sub(inner.now().0)))
            .unwrap_or(backoff);
        let (lock, cv) = &inner.kick;
        let Ok(guard) = lock.lock() else { return };
        let (mut kicked, _) = cv
            .wait_timeout_while(guard, backoff.min(until_deadline), |k| !*k)
            .unwrap_or_else(|e| e.into_inner());
        if *kicked {
            *kicked = false;
            idle_rounds = 0;
        }
    }
}

/// Every armed CQ that holds a completion is disarmed and returned in `fire`
/// (level-triggered: a completion already queued when the CQ was armed fires too, so an
/// event is never lost between a poll and an arm).
fn collect_events(inner: &Inner, dev: &mut Engine, fire: &mut Vec<Arc<CqInner>>) {
    let mut armed = inner.armed.lock().unwrap_or_else(|e| e.into_inner());
    if armed.is_empty() {
        return;
    }
    armed.retain(|w| {
        let Some(cq) = w.upgrade() else { return false };
        if !cq.armed.load(Ordering::Acquire) {
            return false;
        }
        if dev.cq_len(cq.cq) == 0 {
            return true;
        }
        // Cq::push may have fired and disarmed it meanwhile.
        if cq.armed.swap(false, Ordering::AcqRel) {
            fire.push(Arc::clone(&cq));
        }
        false
    });
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
        let mut buf = AlignedBuf::new(len.max(1));
        // SAFETY: the buffer is owned by the returned Mr and freed after deregistration.
        let mut mr = unsafe { self.reg_mr(buf.as_mut_ptr(), len, access)? };
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

/// A page-aligned heap buffer.
struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain bytes owned by this value.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out the pointer; the verbs contract governs its use.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("length fits a layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Self { ptr, layout }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A registered memory region.
pub struct Mr {
    pd: Pd,
    key: MrKey,
    addr: u64,
    len: usize,
    owned: Option<AlignedBuf>,
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
            .map(|b| unsafe { std::slice::from_raw_parts(b.ptr, self.len) })
    }
    /// Mutable bytes of an owned region.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let len = self.len;
        // SAFETY: as in `bytes`, and `&mut self` excludes other borrows through this Mr.
        self.owned
            .as_mut()
            .map(|b| unsafe { std::slice::from_raw_parts_mut(b.ptr, len) })
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
        let mut dev = ctx.lock();
        dev.poll(now);
        let n = dev.poll_cq(self.0.cq, out).map_err(err("poll_cq"))?;
        drop(dev);
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

/// Where a QP connects to: what the peer tells us out of band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The peer's QPN.
    pub qpn: Qpn,
    /// The peer's IPv4 address.
    pub ip: Ipv4Addr,
    /// The first PSN the peer sends.
    pub psn: u32,
}

use bluerdma_core::transport::PSN_MASK;

/// Whether the card can take `psn` as a connection's first PSN after a QP reset: not in
/// 0x7FFFF0..=0xFFFF7F (nic-behaviour-review.md P5/P6: the RTL freezes, the emulated NIC
/// ignores the packet).
pub fn card_takes_first_psn(psn: u32) -> bool {
    !(0x7F_FFF0..=0xFF_FF7F).contains(&(psn & PSN_MASK))
}

/// A queue pair.
pub struct Qp {
    pd: Pd,
    _cqs: (Cq, Cq),
    qpn: Qpn,
    /// Application PSN minus wire PSN (mod 2^24), send and receive (see [`Qp::modify`]).
    psn_offset: Mutex<(u32, u32)>,
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// This QP as an endpoint for a peer (our IP, our QPN, our first PSN).
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        Endpoint {
            qpn: self.qpn,
            ip: self.pd.0.ctx.spec.ip,
            psn,
        }
    }

    /// modify_qp with raw ibv attributes and mask.
    ///
    /// Every connection starts on the wire from the device's `wire_psn_start` (0 by
    /// default), whatever `sq_psn` and `rq_psn` say. Applications such as ibv_rc_pingpong
    /// pick random PSNs, and the card cannot take a first PSN in 0x7FFFF0..=0xFFFF7F after
    /// a QP reset. It must also be a constant: a responder that stays in RTR (perftest's
    /// ib_read_bw server) answers READs from its send PSNs without ever being given an
    /// `sq_psn`, and the requester must know where those start. Both ends run this driver.
    /// [`Qp::psns`] reports the application's numbering.
    pub fn modify(&self, attr: &RawQpAttr, mask: QpAttrMask) -> Result<(), Error> {
        let ctx = &self.pd.0.ctx;
        let mut clock = ctx.clock();
        let start = ctx.spec.wire_psn_start & PSN_MASK;
        let mut wire = *attr;
        if mask.contains(QpAttrMask::SQ_PSN) {
            wire.sq_psn = start;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            wire.rq_psn = start;
        }
        ctx.lock()
            .modify_qp(self.qpn, &wire, mask, &mut clock)
            .map_err(err("modify_qp"))?;
        // Application PSN = wire PSN + this offset (mod 2^24).
        let offset = |app: u32| (app & PSN_MASK).wrapping_sub(start) & PSN_MASK;
        let mut psn = self.psn_offset.lock().unwrap_or_else(|e| e.into_inner());
        if mask.contains(QpAttrMask::SQ_PSN) {
            psn.0 = offset(attr.sq_psn);
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            psn.1 = offset(attr.rq_psn);
        }
        Ok(())
    }

    /// The next PSN this QP sends and the next it expects, in the application's numbering
    /// (the `sq_psn` and `rq_psn` it set, advanced by the traffic; see [`Qp::modify`]).
    pub fn psns(&self, attrs: &QpAttrs) -> (u32, u32) {
        let (sq, rq) = *self.psn_offset.lock().unwrap_or_else(|e| e.into_inner());
        (
            sq.wrapping_add(attrs.sq_psn.get()) & PSN_MASK,
            rq.wrapping_add(attrs.rq_psn.get()) & PSN_MASK,
        )
    }

    /// RESET -> INIT -> RTR -> RTS towards `remote`, sending from `my_psn`, with IB
    /// `timeout` and `retry_cnt`.
    pub fn connect(
        &self,
        remote: Endpoint,
        my_psn: u32,
        timeout: u8,
        retry_cnt: u8,
    ) -> Result<(), Error> {
        self.connect_rnr(remote, my_psn, timeout, retry_cnt, 7, 12)
    }

    /// As [`Qp::connect`], with the RNR attributes: `rnr_retry` (7 = forever) and
    /// `min_rnr_timer` (IB table 45 code; 12 = 0.64 ms).
    pub fn connect_rnr(
        &self,
        remote: Endpoint,
        my_psn: u32,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        min_rnr_timer: u8,
    ) -> Result<(), Error> {
        let access = (1 | 2 | 4) as u32; // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ
        self.modify(
            &RawQpAttr {
                qp_state: QpState::Init.to_ibv(),
                qp_access_flags: access,
                ..RawQpAttr::default()
            },
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        self.modify(
            &RawQpAttr {
                qp_state: QpState::Rtr.to_ibv(),
                path_mtu: 5,
                dest_qp_num: remote.qpn.get(),
                rq_psn: remote.psn,
                dgid: Gid::from_ipv4(remote.ip),
                min_rnr_timer,
                ..RawQpAttr::default()
            },
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        self.modify(
            &RawQpAttr {
                qp_state: QpState::Rts.to_ibv(),
                sq_psn: my_psn,
                timeout,
                retry_cnt,
                rnr_retry,
                ..RawQpAttr::default()
            },
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// How many send WRs posted on this QP have left its send queue (completed, failed or
    /// flushed, signaled or not): the caller's buffers of the first that many are free.
    pub fn sq_retired(&self) -> Result<u64, Error> {
        self.pd
            .0
            .ctx
            .lock()
            .sq_retired(self.qpn)
            .map_err(err("sq_retired"))
    }

    /// The QP's state and attributes.
    pub fn query(&self) -> Result<QpAttrs, Error> {
        self.pd
            .0
            .ctx
            .lock()
            .query_qp(self.qpn)
            .map_err(err("query_qp"))
    }

    /// Posts a chain of send work requests; on failure returns the index of the first
    /// request not posted (`bad_wr`) and why.
    ///
    /// # Safety
    /// Every local buffer `[laddr, laddr + len)` must stay valid, and must not be written
    /// (for WRITE) or read (for READ) by the caller, until the request's completion is
    /// polled (or, for an unsignaled request, a later signaled one's): it belongs to the
    /// work request until then.
    pub unsafe fn post_send(&self, wrs: &[SendWr]) -> Result<(), (usize, Error)> {
        let ctx = &self.pd.0.ctx;
        let now = ctx.now();
        let r = ctx.lock().post_send(self.qpn, wrs, now).map_err(|(k, e)| {
            (
                k,
                Error {
                    op: "post_send",
                    kind: e,
                },
            )
        });
        ctx.kick();
        r
    }

    /// Posts receive work requests (SEND arrives with issue D; WRITE_WITH_IMM consumes them).
    ///
    /// # Safety
    /// As for [`Qp::post_send`]: each buffer belongs to the request until its completion.
    pub unsafe fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), (usize, Error)> {
        self.pd
            .0
            .ctx
            .lock()
            .post_recv(self.qpn, wrs)
            .map_err(|(k, e)| {
                (
                    k,
                    Error {
                        op: "post_recv",
                        kind: e,
                    },
                )
            })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let ctx = &self.pd.0.ctx;
        let mut clock = ctx.clock();
        if let Err(e) = ctx.lock().destroy_qp(self.qpn, &mut clock) {
            log::error!("destroy_qp({:#x}): {e}", self.qpn.get());
        }
    }
}

#[cfg(test)]
mod psn_tests {
    use super::card_takes_first_psn;

    #[test]
    fn first_psns_the_card_cannot_take() {
        for (psn, ok) in [
            (0, true),
            (0x7F_FFEF, true),
            (0x7F_FFF0, false),
            (0xAB_CDEF, false),
            (0xFF_FF7F, false),
            (0xFF_FF80, true),
            (0xFF_FFF0, true),
        ] {
            assert_eq!(card_takes_first_psn(psn), ok, "first PSN {psn:#x}");
        }
    }
}
