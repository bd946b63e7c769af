//! Device addresses for memory of other processes (an "IOVA" window).
//!
//! This process's memory is reached at its virtual address plus
//! [`DEVICE_OFFSET`](super::DEVICE_OFFSET) (2^46), and user addresses stay below 2^47, so
//! local device addresses lie in `[2^46, 2^47 + 2^46)`. The card's addresses have 48 bits.
//! The window is the rest above them: `[2^47 + 2^46, 2^48)` ([`IOVA_BASE`], [`IOVA_END`]),
//! 64 TiB that no local address can reach.
//!
//! A mapping keeps the offset of its virtual address within a page
//! (`dev % page == va % page`), so the card's page table, which translates whole pages,
//! finds each byte where the process has it. Each mapping is followed by an unmapped guard
//! page of its size, so an access that runs past one mapping faults instead of landing in
//! the next (another process's memory). Freed ranges are merged and reused, first fit.

use std::collections::{BTreeMap, HashMap};

use bluerdma_core::addr::{DeviceAddr, PageSize};

use super::host::{DEVICE_OFFSET, USER_LIMIT};

/// The first device address of the window: the end of the local ones.
pub const IOVA_BASE: u64 = USER_LIMIT + DEVICE_OFFSET;
/// The end of the window: the card's 48-bit address space.
pub const IOVA_END: u64 = 1 << 48;

/// An allocator of device addresses in a window.
#[derive(Debug)]
pub struct IovaWindow {
    start: u64,
    end: u64,
    /// Free ranges, `start -> end`, disjoint and never adjacent (merged on free).
    free: BTreeMap<u64, u64>,
    /// Each mapping's device address and the block `[start, end)` it holds (guard
    /// included).
    used: HashMap<u64, (u64, u64)>,
}

impl Default for IovaWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl IovaWindow {
    /// The whole window, `[IOVA_BASE, IOVA_END)`.
    pub fn new() -> Self {
        Self::with_range(IOVA_BASE, IOVA_END)
    }

    /// A window of `[start, end)` (a smaller one, for tests); empty if `end <= start`.
    pub fn with_range(start: u64, end: u64) -> Self {
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end);
        }
        Self {
            start,
            end,
            free,
            used: HashMap::new(),
        }
    }

    /// Whether `addr` lies in the window.
    pub fn contains(&self, addr: DeviceAddr) -> bool {
        (self.start..self.end).contains(&addr.0)
    }

    /// A device address for `len` bytes at virtual address `va`, with `va`'s offset within
    /// `page`; `None` when no free range of the window holds them (and their guard page).
    pub fn alloc(&mut self, va: u64, len: usize, page: PageSize) -> Option<DeviceAddr> {
        let size = page.bytes();
        let offset = va & (size - 1);
        // The pages the range touches (at least one), and the guard page after them.
        let pages = offset.checked_add(len as u64)?.div_ceil(size).max(1);
        let block = pages.checked_add(1)?.checked_mul(size)?;
        let (start, block_start, free_end) = self.free.iter().find_map(|(&s, &e)| {
            let aligned = s.checked_next_multiple_of(size)?;
            (aligned.checked_add(block)? <= e).then_some((s, aligned, e))
        })?;
        let block_end = block_start + block;
        self.free.remove(&start);
        if start < block_start {
            self.free.insert(start, block_start);
        }
        if block_end < free_end {
            self.free.insert(block_end, free_end);
        }
        let dev = block_start + offset;
        self.used.insert(dev, (block_start, block_end));
        Some(DeviceAddr(dev))
    }

    /// Whether `dev` is an address [`IovaWindow::alloc`] returned and that is not freed.
    pub fn is_mapped(&self, dev: DeviceAddr) -> bool {
        self.used.contains_key(&dev.0)
    }

    /// Frees the range of a mapping by the address `alloc` returned; whether it was one.
    pub fn free(&mut self, dev: DeviceAddr) -> bool {
        let Some((mut start, mut end)) = self.used.remove(&dev.0) else {
            return false;
        };
        if let Some((&s, &e)) = self.free.range(..start).next_back() {
            if e == start {
                self.free.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.free.remove(&end) {
            end = e;
        }
        self.free.insert(start, end);
        true
    }

    /// The addresses of the mappings not yet freed.
    pub fn mapped(&self) -> impl Iterator<Item = DeviceAddr> + '_ {
        self.used.keys().map(|&d| DeviceAddr(d))
    }

    /// Free bytes of the window (guard pages of live mappings excluded).
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [PageSize; 3] = [PageSize::Size4K, PageSize::Size64K, PageSize::Size2M];

    #[test]
    fn the_window_lies_above_every_local_device_address_and_below_48_bits() {
        let highest_local = super::super::device_addr_of(USER_LIMIT - 1).0;
        assert!(highest_local < IOVA_BASE);
        assert_eq!(IOVA_BASE, 0xC000_0000_0000);
        let mut w = IovaWindow::new();
        for page in SIZES {
            let dev = w.alloc(0x7fff_1234_5678, 1 << 20, page).unwrap();
            assert!(w.contains(dev) && dev.0 + (1 << 20) < IOVA_END);
        }
        assert!(!w.contains(DeviceAddr(highest_local)));
    }

    #[test]
    fn mappings_keep_the_offset_within_their_page() {
        let mut w = IovaWindow::new();
        for page in SIZES {
            for va in [0x1000, 0x7f12_3456_7898, 0x5555_0020_0000, 0x7fff_ffff_f001] {
                for len in [0, 1, 4096, 3 << 21] {
                    let dev = w.alloc(va, len, page).unwrap();
                    assert_eq!(dev.0 % page.bytes(), va % page.bytes(), "{page:?} {va:#x}");
                }
            }
        }
    }

    #[test]
    fn mappings_do_not_overlap_and_a_guard_page_separates_them() {
        let mut w = IovaWindow::new();
        let mut blocks: Vec<(u64, u64, PageSize)> = Vec::new();
        for (k, page) in SIZES.iter().cycle().take(30).enumerate() {
            let va = 0x7f00_0000_0000 + k as u64 * 0x1234_5677;
            let len = 1 + k * 100_000;
            let dev = w.alloc(va, len, *page).unwrap().0;
            blocks.push((dev, dev + len as u64, *page));
        }
        blocks.sort_by_key(|b| b.0);
        for pair in blocks.windows(2) {
            let ((_, end, page), (next, _, next_page)) = (pair[0], pair[1]);
            // The next mapping's first page starts after this one's last page and a guard
            // page of this one's size.
            let guard_end = end.next_multiple_of(page.bytes()) + page.bytes();
            assert!(guard_end <= next_page.base_of(next), "{pair:x?}");
        }
    }

    #[test]
    fn freed_ranges_are_merged_and_reused() {
        let mut w = IovaWindow::with_range(0x10_0000, 0x10_0000 + (64 << 10));
        let full = w.free_bytes();
        // Each 4 KiB mapping holds two pages (its own and the guard): 8 fit.
        let devs: Vec<_> = (0..8)
            .map(|k| w.alloc(0x1000 * k, 4096, PageSize::Size4K).unwrap())
            .collect();
        assert_eq!(w.alloc(0, 1, PageSize::Size4K), None, "the window is full");
        assert!(w.free(devs[3]));
        assert!(!w.free(devs[3]), "already freed");
        assert!(!w.free(DeviceAddr(0x10_0001)), "never mapped");
        assert_eq!(
            w.alloc(0x42, 100, PageSize::Size4K).unwrap().0,
            devs[3].0 + 0x42
        );
        // Freeing everything merges the window back into one range that holds one large
        // mapping again.
        for dev in w.mapped().collect::<Vec<_>>() {
            assert!(w.free(dev));
        }
        assert_eq!(w.free_bytes(), full);
        assert_eq!(w.free.len(), 1);
        assert!(w.alloc(0, (64 << 10) - 4096, PageSize::Size4K).is_some());
    }

    #[test]
    fn alignment_skips_to_the_next_page_of_the_size_asked_for() {
        let mut w = IovaWindow::with_range(0x1000, 0x1000 + (8 << 20));
        let small = w.alloc(0, 1, PageSize::Size4K).unwrap();
        assert_eq!(small.0, 0x1000);
        let big = w.alloc(0x7f00_0010_0000, 4096, PageSize::Size2M).unwrap();
        assert_eq!(big.0, (2 << 20) + 0x10_0000);
        // The gap before the 2 MiB block is still used by small mappings.
        let again = w.alloc(0, 1, PageSize::Size4K).unwrap();
        assert_eq!(again.0, 0x3000);
        // Lengths that cannot fit, or that overflow, are refused.
        assert_eq!(w.alloc(0, 8 << 20, PageSize::Size4K), None);
        assert_eq!(w.alloc(u64::MAX, usize::MAX, PageSize::Size2M), None);
    }
}
