//! Anonymous 2 MiB hugepages as DMA memory.
//!
//! Each hugepage is mapped with `MAP_HUGETLB | MAP_HUGE_2MB | MAP_POPULATE`, mlocked, and
//! its physical address read from the page map; all 512 entries are checked to be one
//! contiguous, 2 MiB-aligned run of frames before the page is used (the reference driver
//! left this check as a TODO: reference-driver.md section 4). Hugetlb pages are not moved
//! by compaction. Pages are added on demand up to a limit and carved into buffers; a
//! buffer is at most one hugepage.

use std::sync::Mutex;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, PlatformError};

use super::arena::Arena;
use super::{DmaError, Mapping};
use crate::paths::SystemPaths;
use crate::umem::{Pagemap, PagemapEntry};

/// The hugepage size used for DMA memory.
pub const HUGEPAGE: usize = 2 << 20;

/// log2 of the hugepage size, in the position `MAP_HUGE_*` flags take.
const MAP_HUGE_2MB: i32 = 21 << libc::MAP_HUGE_SHIFT;

/// `len` bytes (a multiple of 2 MiB) of zeroed, populated 2 MiB hugetlb pages, privately
/// mapped; [`DmaError::NoHugepages`] when the pool has too few free pages.
pub(crate) fn map_hugetlb(len: usize) -> Result<Mapping, DmaError> {
    // SAFETY: a fresh private anonymous mapping at an address the kernel picks.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_HUGETLB
                | MAP_HUGE_2MB
                | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    match Mapping::from_mmap(ptr, len, "2 MiB hugepages") {
        Err(DmaError::Map { source, .. }) if source.raw_os_error() == Some(libc::ENOMEM) => {
            Err(DmaError::NoHugepages)
        }
        other => other,
    }
}

struct HugePage {
    // Field order: the arena goes before the mapping it describes.
    arena: Arena,
    _map: Mapping,
}

/// DMA buffers from 2 MiB hugepages.
pub struct HugePageDma {
    pagemap: Pagemap,
    pages: Mutex<Vec<HugePage>>,
    max_pages: usize,
}

impl HugePageDma {
    /// An allocator that takes up to `max_pages` hugepages from the pool, the first one
    /// now (so a missing pool or privilege shows at once).
    pub fn new(paths: &SystemPaths, max_pages: usize) -> Result<Self, DmaError> {
        let dma = Self {
            pagemap: Pagemap::open(&paths.pagemap())?,
            pages: Mutex::new(Vec::new()),
            max_pages: max_pages.max(1),
        };
        let first = dma.map_page()?;
        dma.pages
            .lock()
            .map_err(|_| DmaError::NoHugepages)?
            .push(first);
        Ok(dma)
    }

    /// Hugepages in use by this allocator.
    pub fn pages(&self) -> usize {
        self.pages.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// The device addresses of the hugepages, in the order they were taken.
    pub fn page_addrs(&self) -> Vec<bluerdma_core::addr::DeviceAddr> {
        self.pages
            .lock()
            .map(|p| p.iter().map(|h| h.arena.device_addr()).collect())
            .unwrap_or_default()
    }

    fn map_page(&self) -> Result<HugePage, DmaError> {
        let map = map_hugetlb(HUGEPAGE)?;
        let va = map.ptr().as_ptr() as u64;
        // SAFETY: mlock changes no contents; the range is the mapping just made.
        if unsafe { libc::mlock(map.ptr().as_ptr().cast(), HUGEPAGE) } != 0 {
            log::warn!(
                "mlock of a DMA hugepage: {}",
                std::io::Error::last_os_error()
            );
        }
        let bp = self.pagemap.base_page();
        let mut entries = vec![PagemapEntry(0); HUGEPAGE / bp as usize];
        self.pagemap.read(VirtAddr(va), &mut entries)?;
        let base = entries[0].frame(VirtAddr(va), bp)?;
        let contiguous = base.0 % HUGEPAGE as u64 == 0
            && entries
                .iter()
                .enumerate()
                .all(|(i, e)| e.pfn() == entries[0].pfn() + i as u64);
        if !contiguous {
            return Err(DmaError::NotContiguous { va });
        }
        // SAFETY: the mapping is one hugepage, physically contiguous at `base` (checked
        // above) and so reachable by the card there; both are 2 MiB aligned, hence
        // congruent; the arena lives no longer than the mapping (same struct, dropped
        // first).
        let arena = unsafe { Arena::new(map.ptr(), base, HUGEPAGE) };
        Ok(HugePage { arena, _map: map })
    }
}

// SAFETY: buffers come from arenas over hugepages: zeroed, aligned on both sides, inside a
// mapped, locked, physically contiguous page the card reaches at its frame address until
// freed, and never overlapping.
unsafe impl DmaAllocator for HugePageDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        let oom = PlatformError::OutOfMemory { requested: len };
        if len > HUGEPAGE {
            log::error!("a hugepage DMA buffer is at most 2 MiB; {len} bytes requested");
            return Err(oom);
        }
        let mut pages = self.pages.lock().map_err(|_| oom)?;
        for p in pages.iter() {
            if let Ok(b) = p.arena.alloc(len, align) {
                return Ok(b);
            }
        }
        if pages.len() >= self.max_pages {
            log::error!("hugepage DMA: all {} pages in use", self.max_pages);
            return Err(oom);
        }
        let page = self.map_page().map_err(|e| {
            log::error!("{e}");
            oom
        })?;
        let buf = page.arena.alloc(len, align);
        pages.push(page);
        buf
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        let Ok(pages) = self.pages.lock() else { return };
        match pages.iter().find(|p| p.arena.holds(&buf)) {
            Some(p) => p.arena.free(&buf),
            None => log::error!(
                "free of a buffer at {:?} that the hugepage allocator did not make",
                buf.device_addr()
            ),
        }
    }
}
