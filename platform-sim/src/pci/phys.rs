//! The bus master of a served PCI card: DMA by physical address, as a real card does.
//!
//! - The u-dma-buf window (the fake tree's made-up physical range) is the buffer file,
//!   mapped shared with the driver.
//! - Any other address is a real physical address of some process's memory (registered
//!   MRs, hugepage DMA buffers). Its frame is found through `/proc/PID/pagemap` (root:
//!   frame numbers are hidden otherwise) and its bytes moved with
//!   `process_vm_readv`/`process_vm_writev`.
//!
//! Whose memory: a driver alone on the card maps the card's `resource0` (or its u-dma-buf
//! file); a device shared through its daemon (`bluerdma-devd`) has the daemon map those,
//! and its clients, whose MRs and DMA buffers the card reaches too, map neither. So the
//! port knows a set of processes: every one that maps a card file, and every one found to
//! hold a frame the card was asked for. The search for an address, cheapest first:
//!
//! 1. the frame's cached owner and virtual page, checked against that process's page map
//!    now (so a page freed and reused elsewhere is never written through a stale entry):
//!    one `pread`, the whole cost when one driver owns the card, as before;
//! 2. a rescan of the known processes' mappings (a frame of an MR registered since);
//! 3. the other processes that could hand the card memory: those with locked memory or
//!    hugetlb pages (`VmLck`, `HugetlbPages` in `/proc/PID/status`; every driver mlocks
//!    what it registers and its hugepage DMA buffers); the first whose page map holds the
//!    frame joins the known set.
//!
//! A process that goes (its page map reads nothing any more) leaves the set and its frames
//! the cache. A frame that a search did not find is not looked for again within
//! [`RESCAN_GAP`].
//!
//! An access that fits neither the window nor a process is a [`DmaFault`]: the model
//! counts it and goes on.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Arc, RwLock};
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

/// A process whose memory the card reaches.
struct Proc {
    pid: i32,
    /// Opened once: it reads nothing once the process has gone, even if its pid is reused.
    pagemap: File,
    /// It maps one of the card's files (a driver alone on the card, or a device's daemon):
    /// all its readable memory is looked at. Of another process only what it locked or
    /// holds in hugetlb pages is (what a driver pins for a card).
    card_files: bool,
}

impl Proc {
    fn open(pid: i32, card_files: bool) -> Option<Proc> {
        let pagemap = File::open(format!("/proc/{pid}/pagemap")).ok()?;
        Some(Proc {
            pid,
            pagemap,
            card_files,
        })
    }

    /// Whether the process is still there (the page map of a process that has exited reads
    /// nothing).
    fn alive(&self) -> bool {
        let mut e = [0u8; 8];
        self.pagemap.read_exact_at(&mut e, 0).is_ok()
    }

    /// The page-map entry of virtual page `vpn`.
    fn entry(&self, vpn: u64) -> Option<u64> {
        let mut e = [0u8; 8];
        self.pagemap
            .read_exact_at(&mut e, vpn * 8)
            .ok()
            .map(|()| u64::from_le_bytes(e))
    }

    /// The ranges of its memory the card may be handed: `(start, end)`.
    fn ranges(&self) -> Option<Vec<(u64, u64)>> {
        if self.card_files {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
            return Some(readable_ranges(&maps));
        }
        let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", self.pid)).ok()?;
        Some(pinned_ranges(&smaps))
    }

    /// Every present frame of [`Proc::ranges`] with its virtual page (`f(frame, vpn)`);
    /// false if its mappings cannot be read.
    fn frames(&self, mut f: impl FnMut(u64, u64)) -> bool {
        let Some(ranges) = self.ranges() else {
            return false;
        };
        let mut buf = Vec::new();
        for (start, end) in ranges {
            let pages = (end.saturating_sub(start) / PAGE) as usize;
            buf.resize(pages * 8, 0);
            if self
                .pagemap
                .read_exact_at(&mut buf, start / PAGE * 8)
                .is_err()
            {
                continue;
            }
            for (i, e) in buf.chunks_exact(8).enumerate() {
                let e = u64::from_le_bytes(e.try_into().unwrap_or([0; 8]));
                if e & PRESENT != 0 && e & PFN_MASK != 0 {
                    f(e & PFN_MASK, start / PAGE + i as u64);
                }
            }
        }
        true
    }
}

/// What the card's ports know of the processes whose memory it reaches (shared by its
/// transmit and receive ports, so each process is searched for once).
#[derive(Default)]
pub struct Owners {
    procs: Vec<Arc<Proc>>,
    /// Frame number -> (pid, virtual page number), of the known processes.
    frames: HashMap<u64, (i32, u64)>,
    /// Frames a search did not find, and when.
    missed: HashMap<u64, Instant>,
}

impl Owners {
    /// The owner and its virtual address of physical address `addr`, from the cache,
    /// checked against the owner's page map now.
    fn cached(&self, addr: u64) -> Option<(i32, u64)> {
        let pfn = addr / PAGE;
        let &(pid, vpn) = self.frames.get(&pfn)?;
        let p = self.procs.iter().find(|p| p.pid == pid)?;
        let e = p.entry(vpn)?;
        (e & PRESENT != 0 && e & PFN_MASK == pfn).then_some((pid, vpn * PAGE + addr % PAGE))
    }
}

/// One DMA port of the card (the model's transmit and receive threads each have one).
pub struct PhysDma {
    window: Arc<Window>,
    /// The card's files (`resource0`, the u-dma-buf buffer) as `/proc/PID/maps` names them.
    card_files: Arc<[String]>,
    owners: Arc<RwLock<Owners>>,
}

impl PhysDma {
    /// A port serving `window` and the memory of the processes that map any of
    /// `card_files` (the card's `resource0` and u-dma-buf file) or hold the frames asked
    /// for, with what `owners` (shared by the card's ports) knows of them.
    pub fn new(window: Arc<Window>, card_files: &[PathBuf], owners: Arc<RwLock<Owners>>) -> Self {
        PhysDma {
            window,
            card_files: card_files
                .iter()
                .filter_map(|p| p.to_str().map(str::to_string))
                .collect(),
            owners,
        }
    }

    fn read_owners(&self) -> std::sync::RwLockReadGuard<'_, Owners> {
        self.owners.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_owners(&self) -> std::sync::RwLockWriteGuard<'_, Owners> {
        self.owners.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The pids of /proc other than this process's and those of `known`.
    fn other_pids(known: &[Arc<Proc>]) -> Vec<i32> {
        let me = std::process::id() as i32;
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| pid != me && !known.iter().any(|p| p.pid == pid))
            .collect()
    }

    /// Whether process `pid` maps one of the card's files.
    fn maps_card_file(&self, pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
            maps.lines()
                .any(|l| self.card_files.iter().any(|f| l.ends_with(f.as_str())))
        })
    }

    /// Searches for frame `pfn` (outside the lock, which the other port's hits take
    /// meanwhile): the known processes' mappings again, less those that went, with a
    /// process that maps the card's files if none is known; then the other processes that
    /// lock memory or hold hugetlb pages, the first holding the frame joining the known.
    fn search(&self, pfn: u64) {
        let before: Vec<Arc<Proc>> = self.read_owners().procs.clone();
        let mut procs: Vec<Arc<Proc>> = before.iter().filter(|p| p.alive()).cloned().collect();
        for p in before
            .iter()
            .filter(|p| !procs.iter().any(|q| q.pid == p.pid))
        {
            log::info!("fake PCI card: process {} has gone", p.pid);
        }
        if !procs.iter().any(|p| p.card_files) {
            for pid in Self::other_pids(&procs) {
                if self.maps_card_file(pid) {
                    if let Some(p) = Proc::open(pid, true) {
                        log::info!("fake PCI card: process {pid} maps the card");
                        procs.push(Arc::new(p));
                    }
                }
            }
        }
        let mut frames = HashMap::new();
        for p in &procs {
            p.frames(|f, vpn| {
                frames.insert(f, (p.pid, vpn));
            });
        }
        if !frames.contains_key(&pfn) {
            for pid in Self::other_pids(&procs) {
                if !may_pin(pid) {
                    continue;
                }
                let Some(p) = Proc::open(pid, false) else {
                    continue;
                };
                let mut found = Vec::new();
                p.frames(|f, vpn| found.push((f, vpn)));
                if found.iter().any(|&(f, _)| f == pfn) {
                    log::info!("fake PCI card: process {pid} holds frame {pfn:#x}");
                    frames.extend(found.into_iter().map(|(f, vpn)| (f, (pid, vpn))));
                    procs.push(Arc::new(p));
                    break;
                }
            }
        }
        let mut o = self.write_owners();
        // What the other port found meanwhile stays, as do the frames of processes this
        // search did not read; the frames of those it read are its own now.
        let read: Vec<i32> = procs.iter().map(|p| p.pid).collect();
        let gone: Vec<i32> = before
            .iter()
            .map(|p| p.pid)
            .filter(|pid| !read.contains(pid))
            .collect();
        o.frames
            .retain(|_, (pid, _)| !read.contains(pid) && !gone.contains(pid));
        o.frames.extend(frames);
        o.procs
            .retain(|p| !read.contains(&p.pid) && !gone.contains(&p.pid));
        o.procs.extend(procs);
    }

    /// The process and virtual address of physical address `addr`.
    fn virt(&mut self, addr: u64) -> Option<(i32, u64)> {
        if let Some(hit) = self.read_owners().cached(addr) {
            return Some(hit);
        }
        let pfn = addr / PAGE;
        let recently = self
            .read_owners()
            .missed
            .get(&pfn)
            .is_some_and(|t| t.elapsed() < RESCAN_GAP);
        if recently {
            return None;
        }
        self.search(pfn);
        let mut o = self.write_owners();
        if let Some(hit) = o.cached(addr) {
            return Some(hit);
        }
        if o.missed.len() > 4096 {
            o.missed.clear();
        }
        o.missed.insert(pfn, Instant::now());
        None
    }

    /// Moves `len` bytes between `local` and physical `addr`, page by page.
    fn copy(&mut self, addr: u64, local: *mut u8, len: usize, write: bool) -> Result<(), ()> {
        let mut done = 0usize;
        while done < len {
            let a = addr + done as u64;
            let n = ((PAGE - a % PAGE) as usize).min(len - done);
            let (pid, va) = self.virt(a).ok_or(())?;
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
            // owner's memory, which the kernel checks.
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

/// The range of a `maps` or `smaps` mapping line, if it is one whose memory the card may
/// be handed: readable, not special, not the card's BAR (the window is served from its
/// mapping).
fn mapping_range(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let perms = f.next()?;
    let path = line.split_whitespace().nth(5).unwrap_or("");
    if !perms.starts_with('r') || path.starts_with("[v") || path.contains("resource0") {
        return None;
    }
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
}

/// The ranges of `/proc/PID/maps` text whose memory the card may be handed.
fn readable_ranges(maps: &str) -> Vec<(u64, u64)> {
    maps.lines().filter_map(mapping_range).collect()
}

/// Of `/proc/PID/smaps` text, the ranges [`readable_ranges`] takes that are locked (`lo`)
/// or hugetlb (`ht`): what a driver pins for a card.
fn pinned_ranges(smaps: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut current = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let pinned = flags.split_whitespace().any(|f| f == "lo" || f == "ht");
            if let Some(r) = current.take().filter(|_| pinned) {
                out.push(r);
            }
        } else if !line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.ends_with(':'))
        {
            // A mapping's line (the others are `Key: value`).
            current = mapping_range(line);
        }
    }
    out
}

/// Whether process `pid` has locked memory or hugetlb pages (what a driver hands a card).
fn may_pin(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status.lines().any(|l| {
        let kib = |key: &str| {
            l.strip_prefix(key)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        kib("VmLck:")
            .or_else(|| kib("HugetlbPages:"))
            .is_some_and(|k| k > 0)
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_mappings_are_the_locked_and_hugetlb_ones() {
        let smaps = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Locked:                0 kB
VmFlags: rd wr mr mw me ac
7f0000200000-7f0000400000 rw-p 00000000 00:0f 1234                       /anon_hugepage (deleted)
Size:               2048 kB
VmFlags: rd wr mr mw me de ht
7f0000400000-7f0000410000 rw-p 00000000 00:00 0
Locked:               64 kB
VmFlags: rd wr mr mw me lo ac
7f0000410000-7f0000420000 ---p 00000000 00:00 0
VmFlags: mr mw me lo
7ffd00000000-7ffd00002000 r--p 00000000 00:00 0                          [vvar]
VmFlags: rd mr pf io de dd lo
7f0000500000-7f0000510000 rw-s 00000000 08:01 77                         /tmp/t/sys/bus/pci/devices/0000:3b:00.0/resource0
VmFlags: rd wr sh mr mw me ms lo
";
        assert_eq!(
            pinned_ranges(smaps),
            [
                (0x7f00_0020_0000, 0x7f00_0040_0000),
                (0x7f00_0040_0000, 0x7f00_0041_0000)
            ]
        );
        let maps: String = smaps
            .lines()
            .filter(|l| !l.split_whitespace().next().unwrap().ends_with(':'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(readable_ranges(&maps).len(), 3);
    }
}
