//! A physically contiguous block of DMA memory, carved into buffers first-fit.
//!
//! The block's CPU address and device address are congruent modulo [`MAX_ALIGN`], so an
//! offset that aligns one aligns the other: a buffer is aligned as a CPU pointer and as a
//! device address at once, as [`DmaAllocator`](bluerdma_core::platform::DmaAllocator)
//! requires.

use std::ptr::NonNull;
use std::sync::Mutex;

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::platform::{DmaBuffer, PlatformError};

/// The largest alignment an arena serves (the simple-NIC receive buffer's 2 MiB).
pub const MAX_ALIGN: usize = 2 << 20;

/// Free space of an arena: sorted, non-adjacent `(offset, len)` extents.
#[derive(Debug, Default)]
pub(crate) struct Extents(Vec<(usize, usize)>);

impl Extents {
    /// All of `len` bytes free.
    pub(crate) fn new(len: usize) -> Self {
        Self(if len > 0 { vec![(0, len)] } else { Vec::new() })
    }

    /// Takes `len` bytes at the first offset where `base + offset` is a multiple of
    /// `align` (a power of two).
    pub(crate) fn take(&mut self, base: u64, len: usize, align: usize) -> Option<usize> {
        let align = align.max(1) as u64;
        for i in 0..self.0.len() {
            let (start, size) = self.0[i];
            let addr = base + start as u64;
            let at = (addr.next_multiple_of(align) - base) as usize;
            let pad = at - start;
            if pad.checked_add(len).is_none_or(|need| need > size) {
                continue;
            }
            let rest = size - pad - len;
            match (pad, rest) {
                (0, 0) => {
                    self.0.remove(i);
                }
                (0, _) => self.0[i] = (at + len, rest),
                (_, 0) => self.0[i] = (start, pad),
                _ => {
                    self.0[i] = (start, pad);
                    self.0.insert(i + 1, (at + len, rest));
                }
            }
            return Some(at);
        }
        None
    }

    /// Returns `[offset, offset + len)`, merging it with its neighbours.
    pub(crate) fn give(&mut self, offset: usize, len: usize) {
        let i = self.0.partition_point(|&(s, _)| s < offset);
        self.0.insert(i, (offset, len));
        if i + 1 < self.0.len() && offset + len == self.0[i + 1].0 {
            self.0[i].1 += self.0[i + 1].1;
            self.0.remove(i + 1);
        }
        if i > 0 && self.0[i - 1].0 + self.0[i - 1].1 == offset {
            self.0[i - 1].1 += self.0[i].1;
            self.0.remove(i);
        }
    }

    /// Free bytes.
    pub(crate) fn free_bytes(&self) -> usize {
        self.0.iter().map(|&(_, l)| l).sum()
    }
}

/// A contiguous block of device-reachable memory and its free space.
pub(crate) struct Arena {
    cpu: NonNull<u8>,
    dev: DeviceAddr,
    len: usize,
    free: Mutex<Extents>,
}

// SAFETY: the arena describes memory it does not borrow from any thread; the free list is
// behind a mutex, and buffers it hands out never overlap.
unsafe impl Send for Arena {}
// SAFETY: as for Send; `&Arena` only allocates and frees through the mutex.
unsafe impl Sync for Arena {}

impl Arena {
    /// An arena over `len` bytes at `cpu`, which the device reaches at `dev`.
    ///
    /// # Safety
    /// `cpu` must be valid for reads and writes of `len` bytes for the arena's life, the
    /// device must reach the same bytes at `dev .. dev + len`, and
    /// `cpu ≡ dev (mod MAX_ALIGN)`.
    pub(crate) unsafe fn new(cpu: NonNull<u8>, dev: DeviceAddr, len: usize) -> Self {
        debug_assert_eq!(
            cpu.as_ptr() as u64 % MAX_ALIGN as u64,
            dev.0 % MAX_ALIGN as u64
        );
        Self {
            cpu,
            dev,
            len,
            free: Mutex::new(Extents::new(len)),
        }
    }

    /// The device address of the first byte.
    pub(crate) fn device_addr(&self) -> DeviceAddr {
        self.dev
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Free bytes.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.lock().map(|f| f.free_bytes()).unwrap_or(0)
    }

    /// Whether `buf` lies in this arena.
    pub(crate) fn holds(&self, buf: &DmaBuffer) -> bool {
        let d = buf.device_addr().0;
        d >= self.dev.0 && d + buf.len() as u64 <= self.dev.0 + self.len as u64
    }

    /// A zeroed buffer of `len` bytes aligned to `align`.
    pub(crate) fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        let oom = PlatformError::OutOfMemory { requested: len };
        if len == 0 || !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(oom);
        }
        let off = self
            .free
            .lock()
            .map_err(|_| oom)?
            .take(self.dev.0, len, align)
            .ok_or(oom)?;
        // SAFETY: `off + len <= self.len` (the extent came from the free list), so the
        // pointer stays inside the block the arena owns.
        let cpu = unsafe { self.cpu.add(off) };
        // SAFETY: the bytes are inside the block and handed to no one else (the free list
        // no longer holds them); zeroing them is the allocator's promise.
        unsafe { cpu.as_ptr().write_bytes(0, len) };
        // SAFETY: the device reaches the block at `dev`, so this buffer at `dev + off`, for
        // as long as the arena (and so the buffer) lives.
        Ok(unsafe { DmaBuffer::new(cpu, DeviceAddr(self.dev.0 + off as u64), len) })
    }

    /// Returns a buffer this arena handed out.
    pub(crate) fn free(&self, buf: &DmaBuffer) {
        let off = (buf.device_addr().0 - self.dev.0) as usize;
        if let Ok(mut f) = self.free.lock() {
            f.give(off, buf.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_honours_alignment_of_the_base() {
        let mut e = Extents::new(4 << 20);
        let base = 0x1_0010_0000; // 1 MiB into a 2 MiB page
        let ring = e.take(base, 128 << 10, 4096).unwrap();
        assert_eq!(ring, 0);
        let big = e.take(base, 2 << 20, 2 << 20).unwrap();
        assert_eq!((base + big as u64) % (2 << 20), 0);
        assert_eq!(big, 1 << 20);
        // The gap before the 2 MiB buffer is still usable.
        let small = e.take(base, 4096, 4096).unwrap();
        assert_eq!(small, 128 << 10);
        assert!(e.take(base, 2 << 20, 4096).is_none());
    }

    #[test]
    fn freed_extents_merge_back() {
        let mut e = Extents::new(1 << 20);
        let a = e.take(0, 4096, 4096).unwrap();
        let b = e.take(0, 4096, 4096).unwrap();
        let c = e.take(0, 4096, 4096).unwrap();
        e.give(b, 4096);
        e.give(a, 4096);
        e.give(c, 4096);
        assert_eq!(e.0, vec![(0, 1 << 20)]);
        assert_eq!(e.free_bytes(), 1 << 20);
    }

    #[test]
    fn arena_buffers_are_zeroed_and_aligned_on_both_sides() {
        let layout = std::alloc::Layout::from_size_align(4 << 20, MAX_ALIGN).unwrap();
        // SAFETY: non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap();
        // SAFETY: the block is 4 MiB of heap memory and stands for itself as "device"
        // memory at a congruent address.
        let arena = unsafe { Arena::new(mem, DeviceAddr(0x8000_0000), 4 << 20) };
        // SAFETY: the block is live; make it dirty to see zeroing.
        unsafe { mem.as_ptr().write_bytes(0xEE, 4 << 20) };
        let mut a = arena.alloc(1000, 64).unwrap();
        assert!(a.as_mut_slice().iter().all(|&b| b == 0));
        let b = arena.alloc(2 << 20, 2 << 20).unwrap();
        assert_eq!(b.device_addr().0 % (2 << 20), 0);
        assert_eq!(b.cpu().as_ptr() as usize % (2 << 20), 0);
        assert!(arena.holds(&b));
        assert!(arena.alloc(2 << 20, 4096).is_err());
        assert_eq!(
            arena.alloc(1, 3).unwrap_err(),
            PlatformError::OutOfMemory { requested: 1 }
        );
        arena.free(&a);
        arena.free(&b);
        assert_eq!(arena.free_bytes(), 4 << 20);
        // SAFETY: allocated above with this layout; the arena is not used afterwards.
        unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
    }
}
