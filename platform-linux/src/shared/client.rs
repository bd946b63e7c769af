//! A client of a shared device: its engine runs in this process on its own virtual ring set
//! (the register page), its memory is reached by the card through the daemon's mappings
//! (the emulated card, the RTL simulator's protocol) or, on the PCI card, at the bus
//! addresses this process pinned and translated itself and claimed ([`super::claim`]), and
//! its out-of-band records go through the daemon's relay.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::engine::TableWindows;
use bluerdma_core::oob::AtomicOp;
use bluerdma_core::platform::{
    atomic_in_place, pinned_at, write_in_place, DmaAllocator, DmaBuffer, MemoryResolver,
    PlatformError,
};

use super::page::{wait_reports, ClientRegs, HubLayout, Page, PageLayout, PAGE_LEN, PAGE_MAGIC};
use super::proto::{read_frame, write_frame, Reply, Request, Welcome, VERSION};
use super::sys::{recv_with_fd, Segment};
use crate::backend::pci::PciConfig;
use crate::backend::{
    Backend, BackendHandle, BackendKind, BufferKind, DynDma, DynMem, DynRegs, InlineCard,
    OpenError, Tuning,
};
use crate::dma::HugePageDma;
use crate::umem::HostUmem;

/// The control connection: one request and its reply at a time.
pub struct Control {
    sock: Mutex<UnixStream>,
    name: String,
    /// The daemon's hub: a request wakes a sleeping daemon (it reads its sockets only
    /// when awake).
    hub: Arc<Page<HubLayout>>,
}

/// The daemon's refusal of a request ([`Reply::Fail`]), inside the error of
/// [`Control::call`] ([`refused_errno`] reads its errno back).
#[derive(Debug)]
pub struct Refused {
    /// The errno.
    pub errno: i32,
    /// Why, with the device's name.
    pub msg: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Refused {}

/// The errno of a refusal, if `e` is one ([`Control::call`]).
pub fn refused_errno(e: &io::Error) -> Option<i32> {
    e.get_ref()?.downcast_ref::<Refused>().map(|r| r.errno)
}

impl Control {
    /// Sends `req` and waits for the reply (a refusal becomes the error: [`Refused`]).
    pub fn call(&self, req: &Request) -> io::Result<Reply> {
        let mut s = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        write_frame(&mut *s, &req.encode())?;
        super::page::wake_daemon(&self.hub);
        let reply = Reply::decode(&read_frame(&mut *s)?)?;
        if let Reply::Fail { errno, msg } = &reply {
            return Err(io::Error::new(
                io::Error::from_raw_os_error(*errno).kind(),
                Refused {
                    errno: *errno,
                    msg: format!("{}: the daemon refused: {msg}", self.name),
                },
            ));
        }
        Ok(reply)
    }

    fn map(
        &self,
        va: u64,
        len: u64,
        page: PageSize,
        dma: bool,
    ) -> Result<DeviceAddr, PlatformError> {
        match self.call(&Request::Map {
            va,
            len,
            page_shift: page.shift() as u8,
            dma,
        }) {
            Ok(Reply::Mapped { dev }) => Ok(DeviceAddr(dev)),
            Ok(other) => {
                log::error!("{}: map answered with {other:?}", self.name);
                Err(PlatformError::NotMapped { va: VirtAddr(va) })
            }
            Err(e) => {
                log::warn!("{}: map of {len} bytes at {va:#x}: {e}", self.name);
                Err(PlatformError::NotMapped { va: VirtAddr(va) })
            }
        }
    }

    fn unmap(&self, dev: DeviceAddr) {
        if let Err(e) = self.call(&Request::Unmap { dev: dev.0 }) {
            log::warn!("{}: unmap of {:#x}: {e}", self.name, dev.0);
        }
    }

    /// Claims `len` bytes at `va`, which the card reaches at `dev` ([`Request::Claim`]).
    fn claim(&self, va: u64, len: u64, dev: u64, dma: bool) -> Result<(), PlatformError> {
        match self.call(&Request::Claim { va, len, dev, dma }) {
            Ok(Reply::Done) => Ok(()),
            Ok(other) => {
                log::error!("{}: a claim answered with {other:?}", self.name);
                Err(PlatformError::NotMapped { va: VirtAddr(va) })
            }
            Err(e) => {
                log::warn!(
                    "{}: claim of {len} bytes at {va:#x} (bus address {dev:#x}): {e}",
                    self.name
                );
                Err(match refused_errno(&e) {
                    Some(libc::EPERM) | Some(libc::EACCES) => PlatformError::NotPermitted,
                    Some(libc::ENOMEM) => PlatformError::OutOfMemory {
                        requested: len as usize,
                    },
                    Some(errno) => PlatformError::Os(errno),
                    None => PlatformError::NotMapped { va: VirtAddr(va) },
                })
            }
        }
    }

    /// Drops the claims of user memory in `[dev, dev + len)` ([`Request::Unclaim`]).
    fn unclaim(&self, dev: u64, len: u64) {
        if let Err(e) = self.call(&Request::Unclaim { dev, len }) {
            log::warn!("{}: unclaim of {len} bytes at {dev:#x}: {e}", self.name);
        }
    }
}

/// How long a client waits for any answer of its daemon.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

/// A connected client: what the backend parts share.
pub struct Session {
    /// The control connection.
    pub control: Arc<Control>,
    /// The welcome.
    pub welcome: Welcome,
    /// The register page.
    pub page: Arc<Page<PageLayout>>,
    /// The daemon's hub page.
    pub hub: Arc<Page<HubLayout>>,
}

impl Session {
    /// Says hello on `sock` (connected to the daemon) for an engine with pages of `page`.
    pub fn start(name: &str, sock: UnixStream, page: PageSize) -> io::Result<Session> {
        // As long as any later answer may take: the daemon may be busy with another
        // client's command for up to the card's command timeout.
        Self::start_within(name, sock, page, ANSWER_WAIT)
    }

    /// [`Session::start`], waiting at most `wait` for the welcome and for every answer
    /// after it.
    fn start_within(
        name: &str,
        sock: UnixStream,
        page: PageSize,
        wait: Duration,
    ) -> io::Result<Session> {
        sock.set_read_timeout(Some(wait))?;
        let mut s = &sock;
        write_frame(
            &mut s,
            &Request::Hello {
                version: VERSION,
                page_shift: page.shift() as u8,
            }
            .encode(),
        )?;
        let frame = read_frame(&mut s).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the daemon did not answer the hello within {:.1} s",
                    wait.as_secs_f64()
                ),
            ),
            _ => e,
        })?;
        let welcome = match Reply::decode(&frame)? {
            Reply::Welcome(w) => w,
            Reply::Fail { errno, msg } => {
                return Err(io::Error::new(
                    io::Error::from_raw_os_error(errno).kind(),
                    format!("the daemon refused: {msg}"),
                ))
            }
            other => {
                return Err(io::Error::other(format!(
                    "expected a welcome, got {other:?}"
                )))
            }
        };
        let page = Arc::new(Page::<PageLayout>::new(take_segment(&sock)?)?);
        let hub = Arc::new(Page::<HubLayout>::new(take_segment(&sock)?)?);
        if page.get().magic.load(Ordering::Acquire) != PAGE_MAGIC
            || hub.get().magic.load(Ordering::Acquire) != PAGE_MAGIC
        {
            return Err(io::Error::other("the daemon's pages are not initialised"));
        }
        Ok(Session {
            control: Arc::new(Control {
                sock: Mutex::new(sock),
                name: name.to_string(),
                hub: Arc::clone(&hub),
            }),
            welcome,
            page,
            hub,
        })
    }

    /// The client's share of the card's tables.
    pub fn windows(&self) -> TableWindows {
        let w = &self.welcome;
        TableWindows {
            qp_index: w.qp_index.0..w.qp_index.1,
            mr_index: w.mr_index.0..w.mr_index.1,
            pgt: w.pgt.0..w.pgt.1,
        }
    }

    /// The backend parts for an engine with pages of `page`, on device `name`; `pci` is
    /// the device entry's card configuration where it names a PCI card (a client of a PCI
    /// card takes its DMA and user memory from it, [`crate::backend::pci::client_memory`]).
    pub fn backend(
        &self,
        name: &str,
        page: PageSize,
        pci: Option<&PciConfig>,
    ) -> Result<Backend, OpenError> {
        let w = &self.welcome;
        let kind = match w.kind {
            1 => BackendKind::Rtl,
            2 => BackendKind::Pci,
            _ => BackendKind::Emulated,
        };
        let card = Arc::new(SharedCard {
            page: Arc::clone(&self.page),
        });
        let control = Arc::clone(&self.control);
        let (dma, mem, buffers) = if w.claims() {
            let cfg = pci.ok_or_else(|| {
                OpenError::new(
                    name,
                    libc::EINVAL,
                    "the daemon serves a PCI card, and this process's device list does not \
                     say +pci for it (the same list must describe the device everywhere)",
                )
            })?;
            let (dma, umem) = crate::backend::pci::client_memory(name, cfg)?;
            (
                DynDma(Box::new(ClaimDma {
                    control: Arc::clone(&control),
                    dma,
                })),
                DynMem(Box::new(ClaimMem {
                    control: Arc::clone(&control),
                    page,
                    umem,
                    claimed: HashMap::new(),
                    pins: Vec::new(),
                })),
                BufferKind::HugePages,
            )
        } else {
            (
                DynDma(Box::new(ClientDma {
                    control: Arc::clone(&control),
                    layouts: Mutex::new(HashMap::new()),
                })),
                DynMem(Box::new(ClientMem {
                    control: Arc::clone(&control),
                    page,
                    pins: Vec::new(),
                })),
                BufferKind::Heap,
            )
        };
        Ok(Backend {
            kind,
            regs: DynRegs(Arc::new(ClientRegs::new(
                Arc::clone(&self.page),
                Arc::clone(&self.hub),
            ))),
            dma,
            mem,
            tuning: Tuning {
                command_timeout: Duration::from_nanos(w.command_timeout_ns),
                ack_timeout_min: Duration::from_nanos(w.ack_timeout_min_ns),
                send_window: w.send_window,
            },
            buffers,
            handle: Box::new(ClientHandle {
                _control: Arc::clone(&self.control),
                page: Arc::clone(&self.page),
            }),
            inline: Some(card),
        })
    }
}

fn take_segment(sock: &UnixStream) -> io::Result<Segment> {
    let mut p = [0u8; 4];
    let fd = recv_with_fd(sock, &mut p)?;
    let n = super::proto::frame_len(p)?;
    let mut b = vec![0u8; n];
    io::Read::read_exact(&mut &*sock, &mut b)?;
    match (Reply::decode(&b)?, fd) {
        (Reply::Fd, Some(fd)) => Segment::map(fd, PAGE_LEN),
        (other, _) => Err(io::Error::other(format!("expected a page, got {other:?}"))),
    }
}

/// The engine's DMA buffers: heap memory the daemon maps for the card.
struct ClientDma {
    control: Arc<Control>,
    layouts: Mutex<HashMap<usize, (Layout, DeviceAddr)>>,
}

fn page_for(align: usize) -> PageSize {
    if align > 64 << 10 {
        PageSize::Size2M
    } else if align > 4096 {
        PageSize::Size64K
    } else {
        PageSize::Size4K
    }
}

// SAFETY: `alloc` returns zeroed heap memory of the size and alignment asked for, valid
// until `free`, at the device address the daemon mapped for exactly that range (with the
// same offset within the alignment); `free` unmaps it before deallocating.
unsafe impl DmaAllocator for ClientDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        let oom = PlatformError::OutOfMemory { requested: len };
        let layout = Layout::from_size_align(len.max(1), align.max(4096)).map_err(|_| oom)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let cpu = NonNull::new(ptr).ok_or(oom)?;
        let dev = match self
            .control
            .map(ptr as u64, len as u64, page_for(layout.align()), true)
        {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: allocated above with `layout`, never handed out.
                unsafe { dealloc(ptr, layout) };
                return Err(e);
            }
        };
        self.layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr as usize, (layout, dev));
        // SAFETY: `cpu` is valid for `len` bytes and the card reaches them at `dev`.
        Ok(unsafe { DmaBuffer::new(cpu, dev, len) })
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        let ptr = buf.cpu().as_ptr();
        let entry = self
            .layouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ptr as usize));
        if let Some((layout, dev)) = entry {
            self.control.unmap(dev);
            // SAFETY: allocated by `alloc` with this layout; the caller no longer uses it
            // and the card can no longer reach it.
            unsafe { dealloc(ptr, layout) };
        }
    }
}

/// One registered range and the device address of its first byte.
struct Pin {
    va: u64,
    len: u64,
    write: bool,
    dev: DeviceAddr,
}

/// User memory: registered ranges mapped by the daemon, page by page of the engine's size.
struct ClientMem {
    control: Arc<Control>,
    page: PageSize,
    pins: Vec<Pin>,
}

impl MemoryResolver for ClientMem {
    fn pin(&mut self, va: VirtAddr, len: usize, write: bool) -> Result<(), PlatformError> {
        let end =
            va.0.checked_add(len as u64)
                .filter(|e| *e <= 1 << 47)
                .ok_or(PlatformError::NotMapped { va })?;
        bluerdma_sim::mem::mappings::check(va, len, write)?;
        let _ = end;
        // The daemon's device addresses keep each byte's offset within a page and reserve
        // whole pages per mapping, so the page bases of the range are the mapping's too.
        let dev = self
            .control
            .map(va.0, (len as u64).max(1), self.page, false)?;
        self.pins.push(Pin {
            va: va.0,
            len: len as u64,
            write,
            dev,
        });
        Ok(())
    }

    fn unpin(&mut self, va: VirtAddr, len: usize) {
        if let Some(k) = self
            .pins
            .iter()
            .rposition(|p| p.va == va.0 && p.len == len as u64)
        {
            let p = self.pins.swap_remove(k);
            self.control.unmap(p.dev);
        }
    }

    fn translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), PlatformError> {
        // The engine translates from the page base of the MR's first byte.
        let p = self.page.bytes();
        let span = |pin: &Pin| (pin.va & !(p - 1), (pin.va + pin.len.max(1)).div_ceil(p) * p);
        let pin = self
            .pins
            .iter()
            .rev()
            .find(|pin| {
                let (first, last) = span(pin);
                first <= va.0 && va.0 < last
            })
            .ok_or(PlatformError::NotMapped { va })?;
        let (first, last) = span(pin);
        for (slot, base) in out.iter_mut().zip(page.bases_from(va.0)) {
            let base = base.ok_or(PlatformError::NotMapped { va })?.0;
            if base < first || base >= last {
                return Err(PlatformError::NotMapped { va: VirtAddr(base) });
            }
            *slot = DeviceAddr(pin.dev.0.wrapping_add(base).wrapping_sub(pin.va));
        }
        Ok(())
    }

    fn atomic(&mut self, va: VirtAddr, op: AtomicOp) -> Result<u64, PlatformError> {
        pinned_at(self.writable(), va, 8)?;
        if va.0 % 8 != 0 {
            return Err(PlatformError::NotMapped { va });
        }
        // SAFETY: aligned, inside a range pinned with `write`: this process's own memory,
        // found mapped and writable at registration and kept valid while registered (the
        // verbs contract).
        Ok(unsafe { atomic_in_place(va, op) })
    }

    fn write(&mut self, va: VirtAddr, bytes: &[u8]) -> Result<(), PlatformError> {
        pinned_at(self.writable(), va, bytes.len() as u64)?;
        // SAFETY: inside a range pinned with `write`, as for `atomic`.
        unsafe { write_in_place(va, bytes) };
        Ok(())
    }
}

impl ClientMem {
    fn writable(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.pins.iter().filter(|p| p.write).map(|p| (p.va, p.len))
    }
}

/// The engine's DMA buffers on the PCI card: this process's own hugepages, each buffer
/// claimed at its bus address.
struct ClaimDma {
    control: Arc<Control>,
    dma: HugePageDma,
}

// SAFETY: buffers come from the hugepage allocator (which upholds the obligations: zeroed,
// aligned, reachable by the card at their bus address until freed); each is handed out only
// once the daemon accepted its claim, and `free` withdraws the claim before the memory goes
// back.
unsafe impl DmaAllocator for ClaimDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        let buf = self.dma.alloc(len, align)?;
        let (va, dev) = (buf.cpu().as_ptr() as u64, buf.device_addr().0);
        match self.control.claim(va, len.max(1) as u64, dev, true) {
            Ok(()) => Ok(buf),
            Err(e) => {
                // SAFETY: allocated above, never handed out; the card was never told of it.
                unsafe { self.dma.free(buf) };
                Err(e)
            }
        }
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        self.control.unmap(buf.device_addr());
        // SAFETY: the caller no longer uses `buf`, which `alloc` took from this allocator.
        unsafe { self.dma.free(buf) }
    }
}

/// One registered range and the pages of the card's size it claimed (bus addresses).
struct ClaimPin {
    va: u64,
    len: u64,
    pages: Vec<u64>,
}

/// User memory on the PCI card: pinned and translated by this process's page map, each page
/// of the card's size claimed once however many registrations share it.
struct ClaimMem {
    control: Arc<Control>,
    page: PageSize,
    umem: HostUmem,
    /// Claimed pages (bus address) and the registrations that use each.
    claimed: HashMap<u64, u32>,
    pins: Vec<ClaimPin>,
}

/// `(va, dev)` pages of `page` bytes as runs of consecutive pages at consecutive bus
/// addresses: `(va, dev, len)`.
fn runs(pages: impl IntoIterator<Item = (u64, u64)>, page: u64) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for (va, dev) in pages {
        match out.last_mut() {
            Some(r) if r.0 + r.2 == va && r.1 + r.2 == dev => r.2 += page,
            _ => out.push((va, dev, page)),
        }
    }
    out
}

impl ClaimMem {
    /// Translates the pages of a pinned range and claims those not claimed yet.
    fn claim_pages(&mut self, va: VirtAddr, len: usize) -> Result<Vec<u64>, PlatformError> {
        let p = self.page.bytes();
        let first = va.0 - va.0 % p;
        let end = (va.0 + len.max(1) as u64).div_ceil(p) * p;
        let mut devs = vec![DeviceAddr(0); ((end - first) / p) as usize];
        self.umem.translate(va, self.page, &mut devs)?;
        let fresh = runs(
            devs.iter()
                .enumerate()
                .filter(|(_, d)| !self.claimed.contains_key(&d.0))
                .map(|(k, d)| (first + k as u64 * p, d.0)),
            p,
        );
        for (i, &(rva, rdev, rlen)) in fresh.iter().enumerate() {
            if let Err(e) = self.control.claim(rva, rlen, rdev, false) {
                for &(_, d, l) in &fresh[..i] {
                    self.control.unclaim(d, l);
                }
                return Err(e);
            }
        }
        for d in &devs {
            *self.claimed.entry(d.0).or_insert(0) += 1;
        }
        Ok(devs.into_iter().map(|d| d.0).collect())
    }
}

impl MemoryResolver for ClaimMem {
    fn pin(&mut self, va: VirtAddr, len: usize, write: bool) -> Result<(), PlatformError> {
        self.umem.pin(va, len, write)?;
        match self.claim_pages(va, len) {
            Ok(pages) => {
                self.pins.push(ClaimPin {
                    va: va.0,
                    len: len as u64,
                    pages,
                });
                Ok(())
            }
            Err(e) => {
                self.umem.unpin(va, len);
                Err(e)
            }
        }
    }

    fn unpin(&mut self, va: VirtAddr, len: usize) {
        let Some(k) = self
            .pins
            .iter()
            .rposition(|p| p.va == va.0 && p.len == len as u64)
        else {
            self.umem.unpin(va, len);
            return;
        };
        let pin = self.pins.swap_remove(k);
        let mut unused = Vec::new();
        for d in pin.pages {
            if let Some(n) = self.claimed.get_mut(&d) {
                *n -= 1;
                if *n == 0 {
                    self.claimed.remove(&d);
                    unused.push(d);
                }
            }
        }
        unused.sort_unstable();
        unused.dedup();
        // The claims go before the pin: the daemon no longer takes page-table entries of
        // the pages once the memory may move.
        for (_, dev, len) in runs(unused.into_iter().map(|d| (d, d)), self.page.bytes()) {
            self.control.unclaim(dev, len);
        }
        self.umem.unpin(va, len);
    }

    fn translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), PlatformError> {
        self.umem.translate(va, page, out)
    }

    fn atomic(&mut self, va: VirtAddr, op: AtomicOp) -> Result<u64, PlatformError> {
        self.umem.atomic(va, op)
    }

    fn write(&mut self, va: VirtAddr, bytes: &[u8]) -> Result<(), PlatformError> {
        self.umem.write(va, bytes)
    }
}

/// Keeps the connection (the daemon cleans up when it closes).
struct ClientHandle {
    _control: Arc<Control>,
    page: Arc<Page<PageLayout>>,
}

impl BackendHandle for ClientHandle {
    fn card_stats(&self) -> String {
        let p = self.page.get();
        format!(
            "shared device: {} doorbells, {} reports",
            p.doorbells.load(Ordering::Relaxed),
            p.reports.load(Ordering::Relaxed)
        )
    }
}

/// The card as the client's progress thread sees it: nothing to step (the daemon runs the
/// card), a wait on the register page's report word.
struct SharedCard {
    page: Arc<Page<PageLayout>>,
}

impl InlineCard for SharedCard {
    fn receive(&self) -> bool {
        false
    }
    fn step(&self) -> bool {
        false
    }
    fn flush_tx(&self) -> bool {
        false
    }
    fn tx_pending(&self) -> bool {
        false
    }
    fn wait(&self, timeout: Duration, _announced: bool) -> bool {
        let seen = self.page.get().reports.load(Ordering::SeqCst);
        let start = Instant::now();
        wait_reports(&self.page, seen, timeout);
        start.elapsed() < timeout
    }
    fn app_spins(&self, _spinning: bool) {}
    fn raw_frames(&self) -> u64 {
        u64::from(self.page.get().reports.load(Ordering::Relaxed))
    }
    fn wake(&self) {
        super::page::notify_client(&self.page);
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn a_daemon_that_never_welcomes_is_a_timeout_that_says_so() {
        use std::io::Read;
        let (client, mut daemon) = std::os::unix::net::UnixStream::pair().unwrap();
        let hello = std::thread::spawn(move || {
            super::Session::start_within(
                "t0",
                client,
                bluerdma_core::addr::PageSize::Size4K,
                std::time::Duration::from_millis(100),
            )
        });
        // The daemon reads the hello and says nothing.
        let mut b = [0u8; 4];
        daemon.read_exact(&mut b).unwrap();
        let e = match hello.join().unwrap() {
            Ok(_) => panic!("a session without a welcome"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            e.to_string()
                .contains("the daemon did not answer the hello within 0.1 s"),
            "{e}"
        );
    }

    #[test]
    fn pages_run_together_only_where_both_addresses_do() {
        let p = 0x20_0000;
        let pages = [
            (0x7000_0000_0000, 0x1_0000_0000),
            (0x7000_0020_0000, 0x1_0020_0000),
            // Next virtual page, another frame: a new run.
            (0x7000_0040_0000, 0x2_0000_0000),
            // Next frame, a virtual gap: a new run.
            (0x7000_0080_0000, 0x2_0020_0000),
        ];
        assert_eq!(
            runs(pages, p),
            [
                (0x7000_0000_0000, 0x1_0000_0000, 2 * p),
                (0x7000_0040_0000, 0x2_0000_0000, p),
                (0x7000_0080_0000, 0x2_0020_0000, p),
            ]
        );
        assert!(runs([], p).is_empty());
    }
}
