//! The driver's memory services when the card is emulated (in-process or over the RTL
//! protocol): DMA buffers from the process heap and user-memory "pinning" that enters the
//! range into the card's [`AddressMap`].
//!
//! Device addresses are the process's virtual addresses plus [`DEVICE_OFFSET`], so that
//! a device address is never numerically equal to the virtual address of the same byte:
//! a driver that passes one where the other belongs reads or writes the wrong place and
//! the tests see it, as they would on real hardware.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Mutex;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::oob::AtomicOp;
use bluerdma_core::platform::{
    atomic_in_place, pinned_at, write_in_place, DmaAllocator, DmaBuffer, MemoryResolver,
    PlatformError,
};

use super::AddressMap;

/// Distance between a byte's virtual address and its emulated device address (2^46: user
/// addresses stay below 2^47, device addresses below 2^48, the card's address width).
pub const DEVICE_OFFSET: u64 = 1 << 46;

/// User-space addresses end below this (x86-64 and AArch64 with 48-bit addressing).
pub(super) const USER_LIMIT: u64 = 1 << 47;

/// The emulated device address of virtual address `va`.
pub fn device_addr_of(va: u64) -> DeviceAddr {
    DeviceAddr(va + DEVICE_OFFSET)
}

/// DMA buffers from the heap, entered into the card's address map.
pub struct HostDma {
    map: AddressMap,
    layouts: Mutex<HashMap<usize, Layout>>,
}

impl HostDma {
    /// An allocator whose buffers the card reaches through `map`.
    pub fn new(map: AddressMap) -> Self {
        Self {
            map,
            layouts: Mutex::new(HashMap::new()),
        }
    }

    /// The card's map the buffers are entered into.
    pub fn map(&self) -> &AddressMap {
        &self.map
    }
}

// SAFETY: `alloc` returns zeroed heap memory of the requested size and alignment (page
// alignment at least, so device addresses share the alignment), valid until `free`, and
// enters exactly that range into the card's map; `free` removes it before deallocating.
unsafe impl DmaAllocator for HostDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        let oom = PlatformError::OutOfMemory { requested: len };
        let layout = Layout::from_size_align(len.max(1), align.max(4096)).map_err(|_| oom)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let cpu = NonNull::new(ptr).ok_or(oom)?;
        let dev = device_addr_of(ptr as u64);
        // SAFETY: the buffer stays allocated until `free`, which unmaps it first.
        unsafe { self.map.insert(dev, ptr, len) };
        self.layouts
            .lock()
            .map_err(|_| oom)?
            .insert(ptr as usize, layout);
        // SAFETY: `cpu` is valid for `len` bytes and the card reaches them at `dev`.
        Ok(unsafe { DmaBuffer::new(cpu, dev, len) })
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        self.map.remove(buf.device_addr());
        let ptr = buf.cpu().as_ptr();
        let layout = self
            .layouts
            .lock()
            .ok()
            .and_then(|mut l| l.remove(&(ptr as usize)));
        if let Some(layout) = layout {
            // SAFETY: `ptr` was allocated by `alloc` with this layout and the caller
            // promises it is no longer used.
            unsafe { dealloc(ptr, layout) };
        }
    }
}

/// User memory for the emulated card: pinning enters the range into the card's map
/// (nothing moves in an emulation), translation adds [`DEVICE_OFFSET`] to page bases.
pub struct HostMemory {
    map: AddressMap,
    /// The ranges pinned with `write`, as `(va, len)`: where atomics may execute.
    writable: Vec<(u64, u64)>,
}

impl HostMemory {
    /// A resolver whose ranges the card reaches through `map`.
    pub fn new(map: AddressMap) -> Self {
        Self {
            map,
            writable: Vec::new(),
        }
    }

    /// The card's map the pinned ranges are entered into.
    pub fn map(&self) -> &AddressMap {
        &self.map
    }
}

impl MemoryResolver for HostMemory {
    fn pin(&mut self, va: VirtAddr, len: usize, write: bool) -> Result<(), PlatformError> {
        if va
            .0
            .checked_add(len as u64)
            .is_none_or(|end| end > USER_LIMIT)
        {
            return Err(PlatformError::NotMapped { va });
        }
        // The card touches the range through raw pointers: a page the process may not
        // read (or write, for a writable MR) would kill it when a peer's WRITE or READ
        // arrives.
        super::mappings::check(va, len, write)?;
        // SAFETY: the driver pins only memory an application registered, which must stay
        // valid while registered (the verbs contract); `unpin` unmaps it.
        unsafe { self.map.insert(device_addr_of(va.0), va.0 as *mut u8, len) };
        if write {
            self.writable.push((va.0, len as u64));
        }
        Ok(())
    }

    fn unpin(&mut self, va: VirtAddr, len: usize) {
        self.map.remove(device_addr_of(va.0));
        if let Some(k) = self.writable.iter().position(|&r| r == (va.0, len as u64)) {
            self.writable.swap_remove(k);
        }
    }

    fn atomic(&mut self, va: VirtAddr, op: AtomicOp) -> Result<u64, PlatformError> {
        pinned_at(self.writable.iter().copied(), va, 8)?;
        if va.0 % 8 != 0 {
            return Err(PlatformError::NotMapped { va });
        }
        // SAFETY: aligned, and inside a range pinned with `write`: the process's own memory
        // at its address, which `pin` found mapped and writable and the application keeps
        // valid while it is registered (the verbs contract).
        Ok(unsafe { atomic_in_place(va, op) })
    }

    fn write(&mut self, va: VirtAddr, bytes: &[u8]) -> Result<(), PlatformError> {
        pinned_at(self.writable.iter().copied(), va, bytes.len() as u64)?;
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
        for (slot, base) in out.iter_mut().zip(page.bases_from(va.0)) {
            *slot = device_addr_of(base.ok_or(PlatformError::NotMapped { va })?.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dma_buffers_are_zeroed_aligned_and_reachable() {
        let map = AddressMap::new();
        let dma = HostDma::new(map.clone());
        let buf = dma.alloc(128 * 1024, 4096).unwrap();
        assert_eq!(buf.device_addr().0 % 4096, 0);
        assert_ne!(buf.device_addr().0, buf.cpu().as_ptr() as u64);
        map.write(buf.device_addr(), &[0xAB; 4]).unwrap();
        // SAFETY: the buffer is live and at least 4 bytes long.
        let first = unsafe { std::slice::from_raw_parts(buf.cpu().as_ptr(), 8) };
        assert_eq!(first, &[0xAB, 0xAB, 0xAB, 0xAB, 0, 0, 0, 0]);
        let dev = buf.device_addr();
        // SAFETY: no pointer into the buffer is used afterwards.
        unsafe { dma.free(buf) };
        assert!(map.read(dev, &mut [0u8; 1]).is_err());
    }

    #[test]
    fn translation_gives_page_bases_for_unaligned_starts() {
        let mut mem = HostMemory::new(AddressMap::new());
        let mut out = [DeviceAddr(0); 3];
        mem.translate(VirtAddr(0x7f00_0030_0040), PageSize::Size2M, &mut out)
            .unwrap();
        assert_eq!(out[0], device_addr_of(0x7f00_0020_0000));
        assert_eq!(out[2].0 - out[0].0, 4 << 20);
    }

    #[test]
    fn atomics_and_sink_writes_go_only_where_a_writable_pin_is() {
        let mut mem = HostMemory::new(AddressMap::new());
        let mut buf = vec![0u64; 8];
        let va = VirtAddr(buf.as_mut_ptr() as u64);
        mem.pin(va, 32, true).unwrap();
        let at = |k: u64| VirtAddr(va.0 + 8 * k);
        assert_eq!(mem.atomic(at(1), AtomicOp::FetchAdd { add: 5 }), Ok(0));
        let cas = AtomicOp::CompareSwap {
            compare: 5,
            swap: 9,
        };
        assert_eq!(mem.atomic(at(1), cas), Ok(5));
        mem.write(at(2), &7u64.to_ne_bytes()).unwrap();
        let refused = |va| Err(PlatformError::NotMapped { va });
        // Past the pinned 32 bytes, unaligned, or pinned read-only: refused, not touched.
        assert_eq!(
            mem.atomic(at(4), AtomicOp::FetchAdd { add: 1 }),
            refused(at(4))
        );
        let odd = VirtAddr(va.0 + 4);
        assert_eq!(mem.atomic(odd, AtomicOp::FetchAdd { add: 1 }), refused(odd));
        let past = mem.write(at(3), &[0; 9]);
        assert_eq!(past, Err(PlatformError::NotMapped { va: at(3) }));
        mem.unpin(va, 32);
        mem.pin(va, 64, false).unwrap();
        assert_eq!(
            mem.atomic(at(1), AtomicOp::FetchAdd { add: 1 }),
            refused(at(1))
        );
        mem.unpin(va, 64);
        assert_eq!(&buf[..4], &[0, 9, 7, 0]);
    }
}
