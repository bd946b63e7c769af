//! Regions of the address map that live in another process: a daemon that owns the card
//! (the emulated one, or the driver side of the RTL simulator's DMA socket) serves clients
//! whose engines run in their own processes, and the card must reach their rings, staging
//! buffers and registered MRs.
//!
//! Reads and writes of such a region are `process_vm_readv` / `process_vm_writev` calls
//! on the client's pid. They never touch this process's memory beyond the caller's buffer,
//! so a region whose memory the client unmapped, or a client that is gone, is a
//! [`DmaFault`](super::DmaFault) (the kernel reports EFAULT or ESRCH), never a crash, and a
//! short transfer is a fault too (what was moved before it stays moved, as with a DMA that
//! faults half-way). The card counts it as any other fault; a warning names the reason.
//!
//! A pid is only a number: once its process has exited and been reaped, the number may be
//! given to an unrelated process. Each region therefore holds a pidfd of the process it was
//! mapped for (one per pid, shared by its regions), and an access first makes sure that
//! process still runs; after it has exited, every access to its regions faults, even if the
//! owner of the map never removes them. Asking the pidfd is a system call, as long as the
//! copy itself; it is asked at most once per millisecond (`RECHECK`) per process, which is safe:
//! the kernel hands pids out in a cycle, so a pid comes back only after every other one
//! (`pid_max`, 32768 at least) has been given out, never within a millisecond. (Where
//! `pidfd_open` is unavailable, before Linux 5.3 or under a seccomp filter that refuses it,
//! regions are unguarded and a warning says so.)
//!
//! Permissions are the kernel's ptrace rules (PTRACE_MODE_ATTACH): root, or the same user
//! where `kernel.yama.ptrace_scope` allows it (0, or a client that named the daemon with
//! `prctl(PR_SET_PTRACER)`); otherwise accesses fail with EPERM, which
//! [`RemoteMappings::map`] reports up front as `NotPermitted`.
//!
//! Atomics: the address map serves only reads and writes. The card's atomic operations are
//! executed by the driver's `MemoryResolver::atomic` on its own process's memory (see
//! [`super::HostMemory`]), not through the map, and a read-modify-write done with two
//! `process_vm_*` calls would not be atomic against the client's own CPU accesses. So there
//! is no atomic access to a remote region: an atomic on a client's MR must be executed by
//! the client's engine, in the client's process.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::platform::PlatformError;

use super::iova::IovaWindow;
use super::AddressMap;

/// A region of another process's memory: `len` bytes at `va` in process `pid`, reached by
/// the card at device address `dev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Device address of the first byte.
    pub dev: u64,
    /// The process (its pid, the thread-group id).
    pub pid: i32,
    /// Virtual address of the first byte in that process.
    pub va: u64,
    /// Length in bytes.
    pub len: usize,
}

/// How long an access trusts the last answer that a region's process still runs.
const RECHECK: Duration = Duration::from_millis(1);

/// Nanoseconds since the first call: the clock of [`PidFd::checked_at`].
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A pidfd: names one process for as long as it is held, whatever happens to its pid.
struct PidFd {
    fd: OwnedFd,
    /// When the process was last seen running ([`now_ns`]; 0: not yet).
    checked_at: AtomicU64,
    /// Seen gone: for good.
    exited: AtomicBool,
}

impl PidFd {
    /// A pidfd for `pid`; `Err(errno)` (ESRCH: no such process; ENOSYS: no pidfds).
    fn open(pid: i32) -> Result<Self, i32> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it
        // touches no memory of ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(errno());
        }
        let fd = i32::try_from(fd).map_err(|_| libc::EBADF)?;
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(PidFd {
            fd,
            checked_at: AtomicU64::new(0),
            exited: AtomicBool::new(false),
        })
    }

    /// Whether the process may be taken to run: seen running within [`RECHECK`], or now.
    fn running(&self) -> bool {
        if self.exited.load(Ordering::Relaxed) {
            return false;
        }
        let now = now_ns();
        let last = self.checked_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < RECHECK.as_nanos() as u64 {
            return true;
        }
        if self.alive() {
            self.checked_at.store(now.max(1), Ordering::Relaxed);
            true
        } else {
            self.exited.store(true, Ordering::Relaxed);
            false
        }
    }

    /// Whether the process still exists (it may be a zombie, whose memory the kernel
    /// refuses to reach anyway); once reaped, its pid may name another process.
    fn alive(&self) -> bool {
        // SAFETY: signal 0 only checks that the process exists and may be signalled; the
        // null siginfo is allowed, and the call touches no memory of ours.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        };
        r == 0
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A mapped remote region and the pidfd of its process (`None`: no pidfds on this system).
struct Remote {
    region: RemoteRegion,
    process: Option<Arc<PidFd>>,
}

/// Logged once per process when pidfds are unavailable.
static UNGUARDED_WARNED: AtomicBool = AtomicBool::new(false);

/// The remote regions of an [`AddressMap`], keyed by device address like the local ones.
#[derive(Default)]
pub(super) struct RemoteRegions {
    by_start: BTreeMap<u64, Vec<Remote>>,
    /// The longest region ever mapped: bounds the backward search of a lookup.
    max_len: u64,
    /// The pidfd of each process that has regions (shared by them).
    processes: HashMap<i32, Weak<PidFd>>,
}

impl RemoteRegions {
    pub(super) fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    pub(super) fn count(&self) -> usize {
        self.by_start.values().map(Vec::len).sum()
    }

    /// Maps `region`. Errors: `Os(EINVAL)` for a pid that is not positive or a range that
    /// wraps, `Os(ESRCH)` for a process that does not exist.
    pub(super) fn insert(&mut self, region: RemoteRegion) -> Result<(), PlatformError> {
        let len = region.len as u64;
        if region.pid <= 0
            || region.dev.checked_add(len).is_none()
            || region.va.checked_add(len).is_none()
        {
            return Err(PlatformError::Os(libc::EINVAL));
        }
        let process = self.process(region.pid)?;
        self.max_len = self.max_len.max(len);
        self.by_start
            .entry(region.dev)
            .or_default()
            .push(Remote { region, process });
        Ok(())
    }

    /// The pidfd of `pid`, shared with its other regions while that process still runs.
    fn process(&mut self, pid: i32) -> Result<Option<Arc<PidFd>>, PlatformError> {
        if let Some(fd) = self.processes.get(&pid).and_then(Weak::upgrade) {
            if fd.alive() {
                return Ok(Some(fd));
            }
            // The process we knew is gone; `pid` is another process now (or none).
        }
        match PidFd::open(pid) {
            Ok(fd) => {
                let fd = Arc::new(fd);
                self.processes.insert(pid, Arc::downgrade(&fd));
                Ok(Some(fd))
            }
            Err(libc::ENOSYS) => {
                if !UNGUARDED_WARNED.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "pidfd_open is not available: remote DMA regions are not tied to \
                         their process, and a region left mapped after its process exits \
                         reaches whichever process gets its pid next"
                    );
                }
                Ok(None)
            }
            Err(e) => Err(PlatformError::Os(e)),
        }
    }

    /// Unmaps the most recently mapped remote region that starts at `dev`.
    pub(super) fn remove(&mut self, dev: u64) -> Option<RemoteRegion> {
        let list = self.by_start.get_mut(&dev)?;
        let r = list.pop();
        if list.is_empty() {
            self.by_start.remove(&dev);
        }
        let r = r?;
        let pid = r.region.pid;
        drop(r.process);
        if self
            .processes
            .get(&pid)
            .is_some_and(|w| w.strong_count() == 0)
        {
            self.processes.remove(&pid);
        }
        Some(r.region)
    }

    fn find(&self, addr: u64, len: usize) -> Option<&Remote> {
        let end = addr.checked_add(len as u64)?;
        let lowest = addr.saturating_sub(self.max_len);
        // Any region that covers the access will do. Searched upwards, unlike the local
        // regions: the same search would be the same machine code as theirs, which LLVM
        // merges, and a function with one more caller is no longer inlined into the local
        // lookup (13 more instructions per local access).
        self.by_start
            .range(lowest..=addr)
            .flat_map(|(_, list)| list.iter())
            .find(|r| end <= r.region.dev + r.region.len as u64)
    }

    /// The remote region that contains all of `[addr, addr + len)`, if any.
    pub(super) fn lookup(&self, addr: u64, len: usize) -> Option<RemoteRegion> {
        self.find(addr, len).map(|r| r.region)
    }

    /// Copies `buf.len()` bytes from device address `addr` out of the process that holds
    /// it; whether all of them were copied. (Cold: off the path of local accesses, which
    /// the map tries first.)
    #[cold]
    #[inline(never)]
    pub(super) fn read(&self, addr: DeviceAddr, buf: &mut [u8]) -> bool {
        let Some((r, va)) = self.target(addr, buf.len(), false) else {
            return false;
        };
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: va as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, which is ours and writable for its length. The
        // remote iovec is an address in the other process, which the kernel checks there
        // (a bad one is EFAULT); nothing of ours is read or written besides `buf`.
        let n = unsafe { libc::process_vm_readv(r.pid, &local, 1, &remote, 1, 0) };
        finished(n, buf.len(), r, addr, false)
    }

    /// Copies `data` to device address `addr` in the process that holds it; whether all of
    /// it was copied.
    #[cold]
    #[inline(never)]
    pub(super) fn write(&self, addr: DeviceAddr, data: &[u8]) -> bool {
        let Some((r, va)) = self.target(addr, data.len(), true) else {
            return false;
        };
        let local = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: va as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: `local` describes `data`, which the kernel only reads (the iovec type has
        // a mutable pointer, process_vm_writev does not write through it). The remote
        // address is checked by the kernel in the other process.
        let n = unsafe { libc::process_vm_writev(r.pid, &local, 1, &remote, 1, 0) };
        finished(n, data.len(), r, addr, true)
    }

    /// The region and remote address of an access of `len` bytes at `addr`, if one region
    /// covers it, its process still runs, and there is something to copy.
    fn target(&self, addr: DeviceAddr, len: usize, is_write: bool) -> Option<(RemoteRegion, u64)> {
        let r = self.find(addr.0, len)?;
        if r.process.as_ref().is_some_and(|p| !p.running()) {
            log::warn!(
                "remote DMA {} of {len} bytes at {:#x}: process {} has exited",
                if is_write { "write" } else { "read" },
                addr.0,
                r.region.pid
            );
            return None;
        }
        Some((r.region, r.region.va + (addr.0 - r.region.dev)))
    }
}

/// Whether a `process_vm_*` call that returned `n` moved all `len` bytes (a zero-length
/// access inside a region is complete).
fn finished(n: isize, len: usize, r: RemoteRegion, addr: DeviceAddr, is_write: bool) -> bool {
    if n >= 0 && n as usize == len {
        return true;
    }
    let what = if is_write { "write" } else { "read" };
    if n < 0 {
        log::warn!(
            "remote DMA {what} of {len} bytes at {:#x} (process {}, {:#x}): {}",
            addr.0,
            r.pid,
            r.va + (addr.0 - r.dev),
            std::io::Error::last_os_error()
        );
    } else {
        log::warn!(
            "remote DMA {what} of {len} bytes at {:#x} (process {}, {:#x}): only {n} moved",
            addr.0,
            r.pid,
            r.va + (addr.0 - r.dev),
        );
    }
    false
}

/// The card's mappings of other processes' memory: device addresses from an IOVA window
/// ([`IovaWindow`], never a local device address), entered into an [`AddressMap`] as
/// remote regions. What a daemon that owns a card hands its clients' memory to the card
/// with. Dropping it unmaps whatever it still maps.
pub struct RemoteMappings {
    map: AddressMap,
    window: Mutex<IovaWindow>,
}

impl std::fmt::Debug for RemoteMappings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.window.lock().map(|w| w.mapped().count()).unwrap_or(0);
        write!(f, "RemoteMappings({n} mapped)")
    }
}

impl RemoteMappings {
    /// Mappings into `map` (the card's), with device addresses from the whole IOVA window.
    pub fn new(map: AddressMap) -> Self {
        Self::with_window(map, IovaWindow::new())
    }

    /// Mappings into `map` with device addresses from `window`.
    pub fn with_window(map: AddressMap, window: IovaWindow) -> Self {
        Self {
            map,
            window: Mutex::new(window),
        }
    }

    /// The map the regions are entered into.
    pub fn address_map(&self) -> &AddressMap {
        &self.map
    }

    /// Makes `len` bytes at `va` in process `pid` reachable by the card; returns their
    /// device address, which has the same offset within `page` as `va` (so the card's page
    /// table can translate the range page by page).
    ///
    /// The range must be mapped readable in that process now (`NotMapped` names its first
    /// byte that is not), and this process must be allowed to reach it (`NotPermitted`:
    /// the ptrace rules refuse it). `Os(ESRCH)`: no such process; `Os(EINVAL)`: a pid that
    /// is not positive or a range that wraps; `OutOfMemory`: the window is full.
    pub fn map(
        &self,
        pid: i32,
        va: u64,
        len: usize,
        page: PageSize,
    ) -> Result<DeviceAddr, PlatformError> {
        if pid <= 0 || va.checked_add(len as u64).is_none() {
            return Err(PlatformError::Os(libc::EINVAL));
        }
        check_reachable(pid, va, len)?;
        let mut window = self
            .window
            .lock()
            .map_err(|_| PlatformError::Os(libc::EIO))?;
        let dev = window
            .alloc(va, len, page)
            .ok_or(PlatformError::OutOfMemory { requested: len })?;
        if let Err(e) = self.map.insert_remote(dev, pid, va, len) {
            window.free(dev);
            return Err(e);
        }
        Ok(dev)
    }

    /// Undoes a [`RemoteMappings::map`] by the address it returned: the card can no longer
    /// reach the range once this returns (an access in progress finishes first). Returns
    /// whether `dev` was mapped; unknown addresses are ignored.
    pub fn unmap(&self, dev: DeviceAddr) -> bool {
        let Ok(mut window) = self.window.lock() else {
            return false;
        };
        // Out of the map first, and the window's lock held meanwhile: the address is not
        // given out again while the card can still reach the old range through it.
        if !window.is_mapped(dev) {
            return false;
        }
        self.map.remove_remote(dev);
        window.free(dev)
    }
}

impl Drop for RemoteMappings {
    fn drop(&mut self) {
        if let Ok(window) = self.window.get_mut() {
            for dev in window.mapped() {
                self.map.remove_remote(dev);
            }
        }
    }
}

/// Checks that `[va, va + len)` of process `pid` is mapped readable and that this process
/// may reach it.
fn check_reachable(pid: i32, va: u64, len: usize) -> Result<(), PlatformError> {
    if len > 0 {
        // One byte through the same call the card's reads use: permission and existence.
        let mut byte = 0u8;
        let local = libc::iovec {
            iov_base: (&mut byte as *mut u8).cast(),
            iov_len: 1,
        };
        let remote = libc::iovec {
            iov_base: va as *mut libc::c_void,
            iov_len: 1,
        };
        // SAFETY: `local` is our one-byte buffer; the remote address is checked by the
        // kernel in the other process.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n != 1 {
            return Err(match errno() {
                libc::EPERM => PlatformError::NotPermitted,
                libc::EFAULT => PlatformError::NotMapped { va: VirtAddr(va) },
                e => PlatformError::Os(e),
            });
        }
    }
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => PlatformError::Os(libc::ESRCH),
            std::io::ErrorKind::PermissionDenied => PlatformError::NotPermitted,
            _ => PlatformError::Os(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
    super::mappings::check_in(super::mappings::parse(&text), va, len as u64, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> i32 {
        std::process::id() as i32
    }

    #[test]
    fn a_region_of_this_process_mapped_as_remote_moves_bytes_and_faults_outside() {
        let map = AddressMap::new();
        let mut backing = vec![0u8; 4096];
        let va = backing.as_mut_ptr() as u64;
        let dev = DeviceAddr(0xD000_0000_0010);
        map.insert_remote(dev, me(), va, 4096).unwrap();
        map.write(DeviceAddr(dev.0 + 8), &[1, 2, 3]).unwrap();
        let mut out = [0u8; 5];
        map.read(DeviceAddr(dev.0 + 7), &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 0]);
        let past = map.read(DeviceAddr(dev.0 + 4094), &mut out).unwrap_err();
        assert_eq!(
            (past.addr.0, past.len, past.is_write),
            (dev.0 + 4094, 5, false)
        );
        assert!(map.write(DeviceAddr(u64::MAX - 1), &out).is_err());
        assert_eq!(
            map.remove_remote(dev),
            Some(RemoteRegion {
                dev: dev.0,
                pid: me(),
                va,
                len: 4096
            })
        );
        assert!(map.read(dev, &mut out).is_err());
        assert_eq!(map.remove_remote(dev), None);
        assert_eq!(&backing[8..11], &[1, 2, 3]);
    }

    #[test]
    fn a_process_seen_gone_stays_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let fd = PidFd::open(child.id() as i32).unwrap();
        assert!(fd.running());
        child.kill().unwrap();
        child.wait().unwrap();
        // The last answer stands for RECHECK; then the pidfd is asked again.
        std::thread::sleep(RECHECK * 2);
        assert!(!fd.running());
        assert!(fd.exited.load(Ordering::Relaxed));
        assert!(!fd.running());
    }

    #[test]
    fn bad_pids_and_wrapping_ranges_are_refused() {
        let map = AddressMap::new();
        let dev = DeviceAddr(0xD000_0000_0000);
        let einval = Err(PlatformError::Os(libc::EINVAL));
        assert_eq!(map.insert_remote(dev, 0, 0x1000, 1), einval);
        assert_eq!(map.insert_remote(dev, -1, 0x1000, 1), einval);
        assert_eq!(map.insert_remote(dev, me(), u64::MAX, 2), einval);
        assert_eq!(map.insert_remote(DeviceAddr(u64::MAX), me(), 0, 2), einval);
        // Above the kernel's largest pid_max (2^22): never a process.
        assert_eq!(
            map.insert_remote(dev, 0x3FFF_FFFF, 0x1000, 1),
            Err(PlatformError::Os(libc::ESRCH))
        );
        assert!(map.lookup_remote(dev, 1).is_none());
    }

    #[test]
    fn the_regions_of_one_process_share_its_pidfd_until_the_last_goes() {
        let mut regions = RemoteRegions::default();
        let region = |dev| RemoteRegion {
            dev,
            pid: me(),
            va: 0x1000,
            len: 16,
        };
        regions.insert(region(0x100)).unwrap();
        regions.insert(region(0x200)).unwrap();
        regions.insert(region(0x200)).unwrap();
        assert_eq!(regions.processes.len(), 1);
        let fd = regions.processes[&me()].upgrade().unwrap();
        assert_eq!(Arc::strong_count(&fd), 4, "three regions and this test");
        assert!(fd.alive());
        drop(fd);
        assert_eq!(regions.remove(0x200).map(|r| r.dev), Some(0x200));
        assert_eq!(regions.lookup(0x208, 8).map(|r| r.dev), Some(0x200));
        regions.remove(0x200);
        regions.remove(0x100);
        assert!(regions.is_empty());
        assert!(regions.processes.is_empty(), "the pidfd is closed");
    }

    #[test]
    fn local_regions_answer_first_and_remote_ones_where_no_local_one_covers() {
        let map = AddressMap::new();
        let mut local = vec![0xAAu8; 64];
        let remote = [0xBBu8; 128];
        let dev = DeviceAddr(0x4000_0000_0000);
        // SAFETY: `local` outlives the map's use in this test and is removed first.
        unsafe { map.insert(dev, local.as_mut_ptr(), local.len()) };
        map.insert_remote(dev, me(), remote.as_ptr() as u64, remote.len())
            .unwrap();
        let mut out = [0u8; 1];
        map.read(DeviceAddr(dev.0 + 63), &mut out).unwrap();
        assert_eq!(out, [0xAA]);
        map.read(DeviceAddr(dev.0 + 64), &mut out).unwrap();
        assert_eq!(out, [0xBB], "past the local region, inside the remote one");
        map.remove(dev);
        map.read(dev, &mut out).unwrap();
        assert_eq!(out, [0xBB]);
        assert!(format!("{map:?}").ends_with("(0 regions, 1 remote)"));
    }

    #[test]
    fn mappings_refuse_what_is_not_mapped_and_give_addresses_in_the_window() {
        let mappings = RemoteMappings::new(AddressMap::new());
        let buf = vec![7u8; 10_000];
        let va = buf.as_ptr() as u64;
        let dev = mappings
            .map(me(), va, buf.len(), PageSize::Size64K)
            .unwrap();
        assert!(dev.0 >= super::super::IOVA_BASE);
        assert_eq!(dev.0 % (64 << 10), va % (64 << 10));
        let mut out = [0u8; 3];
        mappings
            .address_map()
            .read(DeviceAddr(dev.0 + 9_997), &mut out)
            .unwrap();
        assert_eq!(out, [7; 3]);
        assert_eq!(
            mappings.map(me(), 0x1000, 1, PageSize::Size4K),
            Err(PlatformError::NotMapped {
                va: VirtAddr(0x1000)
            })
        );
        assert_eq!(
            mappings.map(me(), u64::MAX, 2, PageSize::Size4K),
            Err(PlatformError::Os(libc::EINVAL))
        );
        assert!(format!("{mappings:?}").contains("1 mapped"));
        assert!(mappings.unmap(dev));
        assert!(!mappings.unmap(dev));
        assert!(mappings.address_map().read(dev, &mut out).is_err());
    }
}
