//! The bus master of a served PCI card: DMA by physical address, as a real card does.
//!
//! - The u-dma-buf window (the fake tree's made-up physical range) is the buffer file,
//!   mapped shared with the driver.
//! - Any other address is a real physical address of the driver's memory (registered MRs,
//!   hugepage DMA buffers). The driver process is the one that maps the card's
//!   `resource0`; its frames are found through `/proc/PID/pagemap` (root: frame numbers
//!   are hidden otherwise) and its bytes moved with `process_vm_readv`/`process_vm_writev`.
//!   A frame seen once is cached with its virtual page and checked against the page map
//!   again on every use, so a page the driver freed and the kernel reused elsewhere is
//!   never written through a stale entry; a miss rescans the driver's mappings (a frame
//!   that a rescan did not find is not looked for again within [`RESCAN_GAP`]).
//!
//! An access that fits neither is a [`DmaFault`]: the model counts it and goes on.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bluerdma_core::addr::DeviceAddr;

use crate::mem::{DmaFault, DmaPort};

const PAGE: u64 = 4096;
/// Page-map entry bits: present, and the frame number.
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;
/// How long a frame that a rescan did not find is a fault without another rescan.
pub const RESCAN_GAP: Duration = Duration::from_millis(20);

/// The u-dma-buf buffer, mapped shared.
pub struct Window {
    base: NonNull<u8>,
    len: usize,
    /// Its made-up physical address.
    pub phys: u64,
}

// SAFETY: the mapping is owned; its bytes are shared with another process by design and
// only copied in and out.
unsafe impl Send for Window {}
// SAFETY: as above.
unsafe impl Sync for Window {}

impl Window {
    /// Maps `len` bytes of `file` shared; the card reaches them at `phys`.
    pub fn map(file: &File, len: usize, phys: u64) -> io::Result<Self> {
        let base = super::map_shared(file, len)?;
        Ok(Window { base, len, phys })
    }

    /// The offset of `[addr, addr + len)` in the window, if it lies inside.
    fn offset(&self, addr: u64, len: usize) -> Option<usize> {
        let off = addr.checked_sub(self.phys)?;
        let end = off.checked_add(len as u64)?;
        (end <= self.len as u64).then_some(off as usize)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The driver process and what is known of its frames.
struct Driver {
    pid: i32,
    pagemap: File,
    /// Frame number -> virtual page number.
    frames: HashMap<u64, u64>,
}

/// One DMA port of the card (the model's transmit and receive threads each have one).
pub struct PhysDma {
    window: Arc<Window>,
    /// The `resource0` path as the driver's `/proc/PID/maps` names it.
    resource0: PathBuf,
    driver: Option<Driver>,
    /// Frames a rescan did not find, and when.
    missed: HashMap<u64, Instant>,
}

impl PhysDma {
    /// A port serving `window` and the memory of whichever process maps `resource0`.
    pub fn new(window: Arc<Window>, resource0: PathBuf) -> Self {
        PhysDma {
            window,
            resource0,
            driver: None,
            missed: HashMap::new(),
        }
    }

    /// The process that maps the card's BAR, if any.
    fn find_driver(&self) -> Option<i32> {
        let want = self.resource0.to_str()?;
        let me = std::process::id() as i32;
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            if pid == me {
                return None;
            }
            let maps = std::fs::read_to_string(e.path().join("maps")).ok()?;
            maps.lines().any(|l| l.ends_with(want)).then_some(pid)
        })
    }

    /// Reads the driver's maps and page map again: every present frame of its mappings.
    fn rescan(&mut self) -> bool {
        let alive = self
            .driver
            .as_ref()
            .is_some_and(|d| std::path::Path::new(&format!("/proc/{}/maps", d.pid)).exists());
        if !alive {
            self.driver = self.find_driver().and_then(|pid| {
                let pagemap = File::open(format!("/proc/{pid}/pagemap")).ok()?;
                log::info!("fake PCI card: the driver is process {pid}");
                Some(Driver {
                    pid,
                    pagemap,
                    frames: HashMap::new(),
                })
            });
        }
        let Some(d) = self.driver.as_mut() else {
            return false;
        };
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{}/maps", d.pid)) else {
            return false;
        };
        d.frames.clear();
        let mut buf = Vec::new();
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms)) = (f.next(), f.next()) else {
                continue;
            };
            let path = line.split_whitespace().nth(5).unwrap_or("");
            // Only memory the driver can hand the card: readable, not special, not the
            // card's own files (the window is served from its mapping).
            if !perms.starts_with('r') || path.starts_with("[v") || path.contains("resource0") {
                continue;
            }
            let Some((start, end)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            else {
                continue;
            };
            let pages = ((end - start) / PAGE) as usize;
            buf.resize(pages * 8, 0);
            if d.pagemap.read_exact_at(&mut buf, start / PAGE * 8).is_err() {
                continue;
            }
            for (i, e) in buf.chunks_exact(8).enumerate() {
                let e = u64::from_le_bytes(e.try_into().unwrap_or([0; 8]));
                if e & PRESENT != 0 && e & PFN_MASK != 0 {
                    d.frames.insert(e & PFN_MASK, start / PAGE + i as u64);
                }
            }
        }
        true
    }

    /// The driver's virtual address of physical address `addr`, checked against its page
    /// map now.
    fn virt(&mut self, addr: u64) -> Option<u64> {
        let pfn = addr / PAGE;
        for attempt in 0..2 {
            if let Some(d) = self.driver.as_ref() {
                if let Some(&vpn) = d.frames.get(&pfn) {
                    let mut e = [0u8; 8];
                    let now = d
                        .pagemap
                        .read_exact_at(&mut e, vpn * 8)
                        .map(|()| u64::from_le_bytes(e));
                    if matches!(now, Ok(e) if e & PRESENT != 0 && e & PFN_MASK == pfn) {
                        return Some(vpn * PAGE + addr % PAGE);
                    }
                }
            }
            let recently = self
                .missed
                .get(&pfn)
                .is_some_and(|t| t.elapsed() < RESCAN_GAP);
            if attempt == 0 && (recently || !self.rescan()) {
                return None;
            }
        }
        if self.missed.len() > 4096 {
            self.missed.clear();
        }
        self.missed.insert(pfn, Instant::now());
        None
    }

    /// Moves `len` bytes between `local` and the driver's physical `addr`, page by page.
    fn copy(&mut self, addr: u64, local: *mut u8, len: usize, write: bool) -> Result<(), ()> {
        let mut done = 0usize;
        while done < len {
            let a = addr + done as u64;
            let n = ((PAGE - a % PAGE) as usize).min(len - done);
            let va = self.virt(a).ok_or(())?;
            let pid = self.driver.as_ref().ok_or(())?.pid;
            let local_iov = libc::iovec {
                // SAFETY: `done + n <= len`, inside the caller's buffer.
                iov_base: unsafe { local.add(done) }.cast(),
                iov_len: n,
            };
            let remote_iov = libc::iovec {
                iov_base: va as *mut libc::c_void,
                iov_len: n,
            };
            // SAFETY: one local iovec inside the caller's buffer; the remote one names the
            // driver's memory, which the kernel checks.
            let moved = unsafe {
                if write {
                    libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0)
                } else {
                    libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0)
                }
            };
            if moved != n as isize {
                return Err(());
            }
            done += n;
        }
        Ok(())
    }
}

impl DmaPort for PhysDma {
    fn read(&mut self, addr: DeviceAddr, buf: &mut [u8]) -> Result<(), DmaFault> {
        if let Some(off) = self.window.offset(addr.0, buf.len()) {
            // SAFETY: inside the live window; the driver may write it concurrently, as
            // with real DMA.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.window.base.as_ptr().add(off),
                    buf.as_mut_ptr(),
                    buf.len(),
                )
            };
            return Ok(());
        }
        self.copy(addr.0, buf.as_mut_ptr(), buf.len(), false)
            .map_err(|()| DmaFault {
                addr,
                len: buf.len(),
                is_write: false,
            })
    }

    fn write(&mut self, addr: DeviceAddr, data: &[u8]) -> Result<(), DmaFault> {
        if let Some(off) = self.window.offset(addr.0, data.len()) {
            // SAFETY: as in `read`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.window.base.as_ptr().add(off),
                    data.len(),
                )
            };
            return Ok(());
        }
        // process_vm_writev only reads the local buffer.
        self.copy(addr.0, data.as_ptr() as *mut u8, data.len(), true)
            .map_err(|()| DmaFault {
                addr,
                len: data.len(),
                is_write: true,
            })
    }
}
