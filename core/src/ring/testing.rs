//! Test doubles for the ring unit tests: heap memory standing in for DMA memory, and
//! registers that record every access.

use core::cell::RefCell;
use core::ptr::NonNull;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::vec::Vec;

use crate::addr::DeviceAddr;
use crate::desc::{RawDesc, DESC_SIZE};
use crate::platform::{DmaBuffer, RegisterAccess};
use crate::regs::Reg;

/// A zeroed heap allocation standing in for DMA memory (device address = CPU address).
pub(crate) struct HeapDma {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl HeapDma {
    pub(crate) fn new(len: usize, align: usize) -> Self {
        let layout = Layout::from_size_align(len, align).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        HeapDma { ptr, layout }
    }

    /// A description of `len` bytes at `offset` into the allocation.
    pub(crate) fn buffer(&self, offset: usize, len: usize) -> DmaBuffer {
        assert!(offset + len <= self.layout.size());
        // SAFETY: in bounds of a live allocation (checked above) that each test keeps alive
        // longer than the buffer; the "device" is the test, at the same address.
        unsafe {
            let cpu = self.ptr.add(offset);
            DmaBuffer::new(cpu, DeviceAddr(cpu.as_ptr() as u64), len)
        }
    }

    /// The whole allocation. Only while no ring method runs (single-threaded tests).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation is live and initialised (zeroed at allocation).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for HeapDma {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A descriptor filled with `tag`, byte 31 (valid, has_next) set to `flags`.
pub(crate) fn desc(tag: u8, flags: u8) -> RawDesc {
    let mut d = [tag; DESC_SIZE];
    d[31] = flags;
    RawDesc(d)
}

/// Registers that hold what was written (or `set`), and log every access.
#[derive(Default)]
pub(crate) struct MockRegs {
    values: RefCell<Vec<(Reg, u32)>>,
    pub(crate) reads: RefCell<Vec<Reg>>,
    pub(crate) writes: RefCell<Vec<(Reg, u32)>>,
}

impl MockRegs {
    pub(crate) fn set(&self, reg: Reg, value: u32) {
        let mut v = self.values.borrow_mut();
        v.retain(|(r, _)| *r != reg);
        v.push((reg, value));
    }
    pub(crate) fn reads_of(&self, reg: Reg) -> usize {
        self.reads.borrow().iter().filter(|r| **r == reg).count()
    }
    pub(crate) fn writes_of(&self, reg: Reg) -> Vec<u32> {
        let w = self.writes.borrow();
        w.iter()
            .filter(|(r, _)| *r == reg)
            .map(|(_, v)| *v)
            .collect()
    }
}

impl RegisterAccess for MockRegs {
    fn read32(&self, reg: Reg) -> u32 {
        self.reads.borrow_mut().push(reg);
        let v = self.values.borrow();
        v.iter().find(|(r, _)| *r == reg).map_or(0, |(_, x)| *x)
    }
    fn write32(&self, reg: Reg, value: u32) {
        self.writes.borrow_mut().push((reg, value));
        self.set(reg, value);
    }
}
