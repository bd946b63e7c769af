//! User memory (umem) for the real card: the host [`MemoryResolver`]
//! (reference-latest.md section 3.2; hardware-contract.md "Keys, page tables, pages").
//!
//! [`HostUmem`] pins a registered range so its frames cannot move ([`PinGuard`]) and
//! translates it to device (physical) addresses from `/proc/self/pagemap`:
//! - one page-table entry per translation page (2 MiB, the card's; 64 KiB and 4 KiB for
//!   future builds), each the device address of the page's base, also when the MR starts
//!   inside a page;
//! - a translation page larger than a base page must be one physically contiguous,
//!   aligned block ([`UmemError::NotContiguous`] otherwise);
//! - hugetlb memory is contiguous per 2 MiB by construction, so its frames are read once
//!   per 2 MiB; other memory is read entry by entry, in batches of up to
//!   [`READ_BATCH`] entries per `pread`, reading ahead within the pinned range because the
//!   core translates an MR in runs of 16 pages;
//! - a frame number that reads as 0 is [`UmemError::PfnHidden`], which names CAP_SYS_ADMIN.
//!
//! The core sees only a [`PlatformError`]; the full error is logged and kept
//! ([`HostUmem::last_error`]).
//!
//! The emulated card's resolver is platform-sim's, re-exported as `EmulatedUmem` (feature
//! `emulator`).

mod error;
mod pagemap;
mod pin;
mod vma;

pub use error::UmemError;
pub use pagemap::{base_page_size, Pagemap, PagemapEntry};
pub use pin::{compaction_moves_locked_pages, CompactionPolicy, PinGuard, Stability};
pub use vma::{backing, check_access, check_access_in, parse_maps, Backing, Vma};

/// The emulated card's user-memory resolver (platform-sim): pinning enters the range into
/// the emulated card's address map, translation is arithmetic.
#[cfg(feature = "emulator")]
pub use bluerdma_sim::mem::HostMemory as EmulatedUmem;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::oob::AtomicOp;
use bluerdma_core::platform::{
    atomic_in_place, pinned_at, write_in_place, MemoryResolver, PlatformError,
};

use crate::paths::SystemPaths;

/// Most page-map entries read by one `pread` (64 KiB of entries, 32 MiB of 4 KiB pages).
pub const READ_BATCH: usize = 8192;

/// Hugetlb pages are physically contiguous over at least this many bytes (x86-64: 2 MiB
/// and 1 GiB hugepages). `None` where that is not known, and hugetlb memory is then read
/// entry by entry like any other.
const HUGETLB_CONTIGUOUS: Option<u64> = if cfg!(target_arch = "x86_64") {
    Some(2 << 20)
} else {
    None
};

/// A pinned registration.
struct Pinned {
    va: VirtAddr,
    len: u64,
    /// Pinned for a registration the card may write (and atomics may change).
    write: bool,
    backing: Backing,
    locked: Option<(u64, u64)>,
}

impl Pinned {
    /// Whether the registration shares a byte with `[start, end)`. The first and last
    /// translation pages of an MR stick out of it when the MR is not page aligned.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.va.0 < end && start < self.va.0.saturating_add(self.len)
    }
}

/// Page-map entries read ahead: base pages `first .. first + entries.len()`.
#[derive(Default)]
struct ReadAhead {
    first: u64,
    entries: Vec<PagemapEntry>,
    /// Whether the entries belong to a pinned range (and so are still right).
    reusable: bool,
}

/// Pins user memory and translates it through `/proc/self/pagemap`.
pub struct HostUmem {
    paths: SystemPaths,
    pagemap: Pagemap,
    policy: CompactionPolicy,
    pins: Vec<Pinned>,
    ahead: ReadAhead,
    /// The frame of the last hugetlb block translated (block address, frame), reused by
    /// the next call while the pins are unchanged.
    last_block: Option<(u64, DeviceAddr)>,
    last_error: Option<UmemError>,
}

impl HostUmem {
    /// A resolver over `/proc/self/pagemap` that refuses movable pins.
    pub fn new() -> Result<Self, UmemError> {
        Self::with(SystemPaths::default(), CompactionPolicy::Refuse)
    }

    /// A resolver with the page map under `paths.proc` and the given policy.
    pub fn with(paths: SystemPaths, policy: CompactionPolicy) -> Result<Self, UmemError> {
        let pagemap = Pagemap::open(&paths.pagemap())?;
        Ok(Self {
            paths,
            pagemap,
            policy,
            pins: Vec::new(),
            ahead: ReadAhead::default(),
            last_block: None,
            last_error: None,
        })
    }

    /// The last error, with its full explanation (the core sees only a [`PlatformError`]).
    pub fn last_error(&self) -> Option<&UmemError> {
        self.last_error.as_ref()
    }

    /// The page map this resolver reads.
    pub fn pagemap(&self) -> &Pagemap {
        &self.pagemap
    }

    /// Pins `[va, va + len)`, with the full error on failure.
    pub fn try_pin(&mut self, va: VirtAddr, len: u64) -> Result<Stability, UmemError> {
        self.ahead = ReadAhead::default();
        self.last_block = None;
        let guard = PinGuard::new(&self.paths, va, len, self.policy)?;
        let stability = guard.stability();
        let backing = guard.backing();
        let locked = guard.into_locked();
        self.pins.push(Pinned {
            va,
            len,
            write: false,
            backing,
            locked,
        });
        Ok(stability)
    }

    /// Undoes [`HostUmem::try_pin`] of the same range: munlocks what no other pin covers.
    pub fn release(&mut self, va: VirtAddr, len: u64) {
        self.ahead = ReadAhead::default();
        self.last_block = None;
        let Some(i) = self.pins.iter().position(|p| p.va == va && p.len == len) else {
            log::warn!("unpin of {:#x}+{len:#x}, which is not pinned", va.0);
            return;
        };
        let gone = self.pins.swap_remove(i);
        let Some((start, end)) = gone.locked else {
            return;
        };
        // mlock does not count: unlock only the parts no remaining pin locked.
        let mut others: Vec<(u64, u64)> = self.pins.iter().filter_map(|p| p.locked).collect();
        others.sort_unstable();
        let mut at = start;
        for (s, e) in others {
            if e <= at || s >= end {
                continue;
            }
            if s > at {
                pin::unlock(at, s);
            }
            at = at.max(e);
        }
        if at < end {
            pin::unlock(at, end);
        }
    }

    /// Translates like [`MemoryResolver::translate`], with the full error on failure.
    pub fn try_translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), UmemError> {
        if out.is_empty() {
            return Ok(());
        }
        let first = page.base_of(va.0);
        let span = (out.len() as u64)
            .checked_mul(page.bytes())
            .and_then(|s| first.checked_add(s).map(|_| s))
            .ok_or(UmemError::BadRange {
                va,
                len: out.len() as u64 * page.bytes(),
            })?;
        let pinned = self
            .pins
            .iter()
            .position(|p| p.overlaps(first, first + span));
        let hugetlb = pinned.is_some_and(|i| self.pins[i].backing == Backing::Hugetlb);
        match HUGETLB_CONTIGUOUS {
            Some(block) if hugetlb => self.translate_hugetlb(first, page, block, out),
            _ => self.translate_entries(first, page, pinned, out),
        }
    }

    /// Hugetlb memory: one entry per contiguous block; every translation page in a block
    /// is the block's frame plus its offset.
    fn translate_hugetlb(
        &mut self,
        first: u64,
        page: PageSize,
        block: u64,
        out: &mut [DeviceAddr],
    ) -> Result<(), UmemError> {
        let bp = self.pagemap.base_page();
        let mut frame = self.last_block;
        for (i, slot) in out.iter_mut().enumerate() {
            let page_va = first + i as u64 * page.bytes();
            let block_va = page_va - page_va % block.max(page.bytes());
            let base = match frame {
                Some((b, f)) if b == block_va => f,
                _ => {
                    let f = self
                        .pagemap
                        .entry(VirtAddr(block_va))?
                        .frame(VirtAddr(block_va), bp)?;
                    if f.0 % block.max(page.bytes()) != 0 {
                        return Err(UmemError::NotContiguous {
                            va: VirtAddr(page_va),
                            page,
                        });
                    }
                    frame = Some((block_va, f));
                    f
                }
            };
            *slot = DeviceAddr(base.0 + (page_va - block_va));
        }
        self.last_block = frame;
        Ok(())
    }

    /// Any memory: every base page's entry, checked for contiguity within each
    /// translation page.
    fn translate_entries(
        &mut self,
        first: u64,
        page: PageSize,
        pinned: Option<usize>,
        out: &mut [DeviceAddr],
    ) -> Result<(), UmemError> {
        let bp = self.pagemap.base_page();
        if page.bytes() < bp {
            // Translation pages smaller than a base page (4 KiB on a 64 KiB kernel).
            for (slot, base) in out.iter_mut().zip(page.bases_from(first)) {
                let page_va = base.ok_or(UmemError::NotContiguous {
                    va: VirtAddr(first),
                    page,
                })?;
                *slot = self.pagemap.device_addr(page_va)?;
            }
            return Ok(());
        }
        let per = (page.bytes() / bp) as usize;
        let pages_per_read = (READ_BATCH / per).max(1);
        let limit = pinned.map(|i| {
            let p = &self.pins[i];
            (p.va.0 + p.len).div_ceil(bp)
        });
        for (c, chunk) in out.chunks_mut(pages_per_read).enumerate() {
            let chunk_va = first + (c * pages_per_read) as u64 * page.bytes();
            let first_vpn = chunk_va / bp;
            let count = chunk.len() * per;
            let entries = self.entries(first_vpn, count, limit)?;
            for (k, slot) in chunk.iter_mut().enumerate() {
                let page_va = chunk_va + k as u64 * page.bytes();
                let run = &entries[k * per..(k + 1) * per];
                let base = run[0].frame(VirtAddr(page_va), bp)?;
                if base.0 % page.bytes() != 0 {
                    return Err(UmemError::NotContiguous {
                        va: VirtAddr(page_va),
                        page,
                    });
                }
                let base_pfn = run[0].pfn();
                for (j, e) in run.iter().enumerate().skip(1) {
                    if e.pfn() != base_pfn + j as u64 {
                        // Distinguish a hole from a discontinuity: a hole is the better hint.
                        e.frame(VirtAddr(page_va + j as u64 * bp), bp)?;
                        return Err(UmemError::NotContiguous {
                            va: VirtAddr(page_va),
                            page,
                        });
                    }
                }
                *slot = base;
            }
        }
        Ok(())
    }

    /// Entries of base pages `first_vpn .. first_vpn + count`. Within a pinned range
    /// (`limit` is its end, in base pages) up to [`READ_BATCH`] entries are read ahead
    /// and reused by the next call, since pinned frames do not change.
    fn entries(
        &mut self,
        first_vpn: u64,
        count: usize,
        limit: Option<u64>,
    ) -> Result<&[PagemapEntry], UmemError> {
        let a = &self.ahead;
        let hit = a.reusable
            && first_vpn >= a.first
            && first_vpn + count as u64 <= a.first + a.entries.len() as u64;
        if !hit {
            let want = limit.map_or(count, |end| {
                (end.saturating_sub(first_vpn) as usize).clamp(count, READ_BATCH.max(count))
            });
            let bp = self.pagemap.base_page();
            let a = &mut self.ahead;
            a.entries.clear();
            a.entries.resize(want, PagemapEntry(0));
            a.first = first_vpn;
            a.reusable = false;
            self.pagemap
                .read(VirtAddr(first_vpn * bp), &mut a.entries)?;
            a.reusable = limit.is_some();
        }
        let off = (first_vpn - self.ahead.first) as usize;
        Ok(&self.ahead.entries[off..off + count])
    }

    fn note(&mut self, e: UmemError) -> PlatformError {
        log::error!("{e}");
        let p = PlatformError::from(&e);
        self.last_error = Some(e);
        p
    }
}

impl HostUmem {
    /// The ranges pinned with `write`, as `(va, len)`.
    fn writable(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.pins
            .iter()
            .filter(|p| p.write)
            .map(|p| (p.va.0, p.len))
    }
}

impl MemoryResolver for HostUmem {
    fn pin(&mut self, va: VirtAddr, len: usize, write: bool) -> Result<(), PlatformError> {
        // mlock takes read-only memory, and the kernel would refuse to pin it for a writable
        // MR (EFAULT): so must we, before the card is told to write it.
        if let Err(e) = vma::check_access(&self.paths, va, len as u64, write) {
            return Err(self.note(e));
        }
        match self.try_pin(va, len as u64) {
            Ok(_) => {
                if let Some(p) = self.pins.last_mut() {
                    p.write = write;
                }
                Ok(())
            }
            Err(e) => Err(self.note(e)),
        }
    }

    fn unpin(&mut self, va: VirtAddr, len: usize) {
        self.release(va, len as u64);
    }

    fn atomic(&mut self, va: VirtAddr, op: AtomicOp) -> Result<u64, PlatformError> {
        pinned_at(self.writable(), va, 8)?;
        if va.0 % 8 != 0 {
            return Err(PlatformError::NotMapped { va });
        }
        // SAFETY: aligned, and inside a range pinned with `write`: this process's memory at
        // its address, which `pin` found mapped and writable and locked, and which the
        // application keeps mapped while it is registered (the verbs contract).
        Ok(unsafe { atomic_in_place(va, op) })
    }

    fn write(&mut self, va: VirtAddr, bytes: &[u8]) -> Result<(), PlatformError> {
        pinned_at(self.writable(), va, bytes.len() as u64)?;
        // SAFETY: inside a range pinned with `write`, as for `atomic`.
        unsafe { write_in_place(va, bytes) };
        Ok(())
    }

    fn translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), PlatformError> {
        match self.try_translate(va, page, out) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.note(e)),
        }
    }
}

impl Drop for HostUmem {
    fn drop(&mut self) {
        for p in std::mem::take(&mut self.pins) {
            if let Some((s, e)) = p.locked {
                pin::unlock(s, e);
            }
        }
    }
}
