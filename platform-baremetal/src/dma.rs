//! DMA memory from a static arena, with identity device addresses.
//!
//! On the soft-core the card and the CPU share one physical address space, so a buffer's
//! device address is its CPU address. The engine allocates everything once at open (six
//! 128 KiB rings, the 2 MiB simple-NIC receive buffer aligned to 2 MiB, a 4 KiB PGT staging
//! page, 512 KiB of ACK frame slots) and frees at close, so a first-fit free list over one
//! arena is enough: alignment holes stay free for later, smaller buffers, and freed buffers
//! merge with their neighbours. The list has a fixed capacity; a split that would overflow
//! it fails the allocation instead of losing track of memory.

use core::ptr::NonNull;

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, PlatformError};
use spin::Mutex;

/// Free extents the pool tracks (each allocation can add at most one).
pub const MAX_FREE_EXTENTS: usize = 32;

/// Allocation granule: sizes and alignments are rounded up to it, so two buffers never
/// share a cache line (the card writes whole lines).
pub const GRANULE: usize = 64;

/// Largest alignment the engine asks for: the simple-NIC receive buffer's 2 MiB.
pub const ENGINE_MAX_ALIGN: usize = 2 << 20;

/// An arena aligned to [`ENGINE_MAX_ALIGN`], so the 2 MiB-aligned receive buffer wastes
/// nothing: `static mut ARENA: DmaArena<{ 4 << 20 }> = DmaArena::new();`.
#[repr(C, align(2097152))]
pub struct DmaArena<const N: usize>(pub [u8; N]);

impl<const N: usize> DmaArena<N> {
    /// A zeroed arena (lands in `.bss`).
    pub const fn new() -> Self {
        Self([0; N])
    }
}

impl<const N: usize> Default for DmaArena<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// A span of free memory, `[start, end)` in CPU (= device) addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    start: usize,
    end: usize,
}

/// How much of the pool is in use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaUsage {
    /// Bytes the pool manages.
    pub capacity: usize,
    /// Bytes allocated now (after rounding to [`GRANULE`]).
    pub in_use: usize,
    /// The most bytes ever allocated at once.
    pub peak: usize,
    /// Frees refused because the buffer was not one of this pool's live allocations.
    pub bad_frees: u32,
}

struct State {
    /// Sorted by address, never touching (neighbours are merged).
    free: heapless::Vec<Extent, MAX_FREE_EXTENTS>,
    usage: DmaUsage,
}

/// A first-fit DMA allocator over one arena, shared through a `spin` lock.
pub struct DmaPool {
    base: usize,
    end: usize,
    state: Mutex<State>,
}

/// `x` rounded up to `align` (a power of two), or `None` on overflow.
fn align_up(x: usize, align: usize) -> Option<usize> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// The bytes an allocation of `len` occupies.
fn footprint(len: usize) -> Option<usize> {
    align_up(len.max(1), GRANULE)
}

impl DmaPool {
    /// A pool over `arena`, which it owns from now on.
    pub fn new(arena: &'static mut [u8]) -> Self {
        let base = arena.as_mut_ptr() as usize;
        // Cannot overflow: a live slice never wraps the address space.
        let end = base + arena.len();
        // Only whole granules are handed out.
        let start = align_up(base, GRANULE).unwrap_or(end).min(end);
        let end = start + (end - start) / GRANULE * GRANULE;
        let mut free = heapless::Vec::new();
        if end > start {
            // Cannot fail: the list is empty.
            let _ = free.push(Extent { start, end });
        }
        Self {
            base: start,
            end,
            state: Mutex::new(State {
                free,
                usage: DmaUsage {
                    capacity: end - start,
                    ..DmaUsage::default()
                },
            }),
        }
    }

    /// The managed range, `[start, end)`; device addresses are the same numbers.
    pub fn range(&self) -> (usize, usize) {
        (self.base, self.end)
    }

    /// Current, peak and refused use.
    pub fn usage(&self) -> DmaUsage {
        self.state.lock().usage
    }

    /// Takes `size` bytes aligned to `align` out of the free list; returns the start.
    fn take(state: &mut State, size: usize, align: usize) -> Option<usize> {
        for i in 0..state.free.len() {
            let e = state.free[i];
            let Some(start) = align_up(e.start, align) else {
                continue;
            };
            let Some(end) = start.checked_add(size) else {
                continue;
            };
            if end > e.end {
                continue;
            }
            let before = Extent {
                start: e.start,
                end: start,
            };
            let after = Extent {
                start: end,
                end: e.end,
            };
            match (before.start < before.end, after.start < after.end) {
                (false, false) => {
                    state.free.remove(i);
                }
                (true, false) => state.free[i] = before,
                (false, true) => state.free[i] = after,
                (true, true) => {
                    // Two pieces: needs one more slot, or the memory would be lost.
                    if state.free.is_full() {
                        continue;
                    }
                    state.free[i] = before;
                    // Cannot fail: not full, checked above.
                    let _ = state.free.insert(i + 1, after);
                }
            }
            return Some(start);
        }
        None
    }

    /// Returns `[start, start + size)` to the free list, merging neighbours; `false` if
    /// the span is not wholly allocated memory of this pool (a double or foreign free).
    fn give_back(&self, state: &mut State, start: usize, size: usize) -> bool {
        let Some(end) = start.checked_add(size) else {
            return false;
        };
        if start < self.base || end > self.end || start % GRANULE != 0 {
            return false;
        }
        let at = state.free.partition_point(|e| e.start < start);
        let prev = at.checked_sub(1).and_then(|p| state.free.get(p)).copied();
        let next = state.free.get(at).copied();
        if prev.is_some_and(|p| p.end > start) || next.is_some_and(|n| n.start < end) {
            return false;
        }
        let joins_prev = prev.is_some_and(|p| p.end == start);
        let joins_next = next.is_some_and(|n| n.start == end);
        match (joins_prev, joins_next) {
            (true, true) => {
                let merged_end = state.free[at].end;
                state.free[at - 1].end = merged_end;
                state.free.remove(at);
            }
            (true, false) => state.free[at - 1].end = end,
            (false, true) => state.free[at].start = start,
            (false, false) => {
                if state.free.insert(at, Extent { start, end }).is_err() {
                    // No slot to remember it: the bytes stay unusable until a neighbour
                    // is freed. Counted, never unsound.
                    return false;
                }
            }
        }
        true
    }
}

// SAFETY: `alloc` hands out spans of the arena, which the pool owns for `'static` (it took
// the only `&'static mut`); spans are aligned to `align` (CPU and device address are the
// same number), zeroed before they are returned, and removed from the free list under the
// lock, so two live buffers never overlap. A span returns to the free list only in `free`,
// whose caller promises nothing uses it afterwards.
unsafe impl DmaAllocator for DmaPool {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        let oom = PlatformError::OutOfMemory { requested: len };
        if !align.is_power_of_two() {
            return Err(oom);
        }
        let size = footprint(len).ok_or(oom)?;
        let mut state = self.state.lock();
        let start = Self::take(&mut state, size, align.max(GRANULE)).ok_or(oom)?;
        state.usage.in_use += size;
        state.usage.peak = state.usage.peak.max(state.usage.in_use);
        drop(state);
        let cpu = start as *mut u8;
        // SAFETY: `[start, start + size)` lies inside the arena and was just removed from
        // the free list, so no one else can reach it.
        unsafe { core::ptr::write_bytes(cpu, 0, size) };
        // The arena is a live slice, so its addresses are never null.
        let cpu = NonNull::new(cpu).ok_or(oom)?;
        // SAFETY: the span is valid for `len <= size` bytes until `free`, and the device
        // reaches the same bytes at the same address (identity mapping).
        Ok(unsafe { DmaBuffer::new(cpu, DeviceAddr(start as u64), len) })
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        let start = buf.cpu().as_ptr() as usize;
        let Some(size) = footprint(buf.len()) else {
            return;
        };
        let mut state = self.state.lock();
        if self.give_back(&mut state, start, size) {
            state.usage.in_use = state.usage.in_use.saturating_sub(size);
        } else {
            state.usage.bad_frees += 1;
            drop(state);
            fw_error!("DMA pool: refused to free {} bytes at {}", size, start);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::boxed::Box;
    use std::vec;

    fn pool(len: usize) -> DmaPool {
        DmaPool::new(Box::leak(vec![0xEEu8; len].into_boxed_slice()))
    }

    #[test]
    fn buffers_are_zeroed_aligned_identity_mapped_and_disjoint() {
        let p = pool(64 * 1024);
        let mut a = p.alloc(100, 4096).unwrap();
        let b = p.alloc(5000, 64).unwrap();
        assert_eq!(a.cpu().as_ptr() as usize % 4096, 0);
        assert_eq!(a.device_addr().0, a.cpu().as_ptr() as u64);
        assert!(a.as_mut_slice().iter().all(|&x| x == 0), "zeroed");
        let (a0, b0) = (a.cpu().as_ptr() as usize, b.cpu().as_ptr() as usize);
        assert!(
            a0 + 128 <= b0 || b0 + 5056 <= a0,
            "overlap: {a0:#x} {b0:#x}"
        );
        assert_eq!(p.usage().in_use, 128 + 5056);
    }

    #[test]
    fn alignment_holes_are_reused_and_frees_merge_back_to_one_extent() {
        let p = pool(3 * 4096 + GRANULE);
        let (base, end) = p.range();
        let cap = end - base;
        // Misalign on purpose, then ask for a page: the hole before it stays free.
        let small = p.alloc(1, 1).unwrap();
        let page = p.alloc(4096, 4096).unwrap();
        let hole_filler = p.alloc(GRANULE, GRANULE).unwrap();
        assert!(
            (hole_filler.cpu().as_ptr() as usize) < page.cpu().as_ptr() as usize,
            "the alignment hole serves a later small buffer"
        );
        // SAFETY: none of the buffers is used after its free.
        unsafe {
            p.free(page);
            p.free(small);
            p.free(hole_filler);
        }
        let u = p.usage();
        assert_eq!((u.in_use, u.bad_frees), (0, 0));
        // Everything merged: the whole capacity is one allocation again.
        let all = p.alloc(cap, GRANULE).unwrap();
        assert_eq!(all.len(), cap);
    }

    #[test]
    fn exhaustion_and_bad_requests_are_errors_not_panics() {
        let p = pool(8192);
        assert_eq!(
            p.alloc(1 << 20, 64).unwrap_err(),
            PlatformError::OutOfMemory { requested: 1 << 20 }
        );
        assert!(p.alloc(64, 3).is_err(), "alignment must be a power of two");
        assert!(p.alloc(usize::MAX, 64).is_err());
        assert!(p.alloc(64, 1 << 30).is_err());
        assert_eq!(p.usage().in_use, 0);
    }

    #[test]
    fn double_and_foreign_frees_are_refused_and_counted() {
        let p = pool(8192);
        let a = p.alloc(256, 64).unwrap();
        let (cpu, dev, len) = (a.cpu(), a.device_addr(), a.len());
        // SAFETY: `a` is not used after its free.
        unsafe { p.free(a) };
        // SAFETY: describes the same (now free) bytes; the pool must refuse them.
        let again = unsafe { DmaBuffer::new(cpu, dev, len) };
        // SAFETY: the pool checks and refuses; nothing uses the bytes.
        unsafe { p.free(again) };
        let mut outside = [0u8; 64];
        let np = NonNull::new(outside.as_mut_ptr()).unwrap();
        // SAFETY: a description of stack bytes, only handed to `free`, which refuses it.
        let foreign = unsafe { DmaBuffer::new(np, DeviceAddr(np.as_ptr() as u64), 64) };
        // SAFETY: as above.
        unsafe { p.free(foreign) };
        assert_eq!(p.usage().bad_frees, 2);
        assert_eq!(p.usage().in_use, 0);
    }

    #[test]
    fn the_engines_open_fits_a_4_mib_arena() {
        // The engine's allocations at open, in its order (device.rs `open`).
        let p = pool((4 << 20) + ENGINE_MAX_ALIGN);
        for _ in 0..6 {
            p.alloc(128 * 1024, 4096).unwrap();
        }
        let rx = p.alloc(2 << 20, 2 << 20).unwrap();
        assert_eq!(rx.device_addr().0 % (2 << 20), 0);
        p.alloc(4096, 4096).unwrap();
        p.alloc(128 * 4096, 4096).unwrap();
        // 768 KiB + 2 MiB + 4 KiB + 512 KiB.
        assert_eq!(p.usage().in_use, (6 * 128 + 2048 + 4 + 512) * 1024);
    }
}
