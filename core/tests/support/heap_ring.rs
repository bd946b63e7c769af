//! Zeroed, page-aligned heap memory standing in for one ring's DMA buffer, shared by the
//! ring model test and the ring bench (`#[path]`-included: they are separate crates).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::platform::DmaBuffer;
use bluerdma_core::ring::{RingMemory, RING_ALIGN, RING_BYTES};

pub struct HeapRing {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl HeapRing {
    pub fn new() -> Self {
        let layout = Layout::from_size_align(RING_BYTES, RING_ALIGN).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        HeapRing { ptr, layout }
    }

    /// A view of the memory as a ring. Driver and fake card each take one; callers use
    /// them from one thread, so their volatile accesses never overlap.
    pub fn view(&self) -> RingMemory {
        // SAFETY: the allocation is RING_BYTES long and outlives every view (callers drop
        // the views before `self`); device address = CPU address.
        let buf =
            unsafe { DmaBuffer::new(self.ptr, DeviceAddr(self.ptr.as_ptr() as u64), RING_BYTES) };
        RingMemory::new(buf).unwrap()
    }

    /// The start of the memory, for a baseline that writes it without the ring.
    #[allow(dead_code)] // the bench uses it, the model test does not
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HeapRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
