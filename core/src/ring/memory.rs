//! Ring memory: the 128 KiB of DMA memory behind one ring, accessed one 32-byte slot at a
//! time (hardware-contract.md "Rings", layout-verification.md section 3).
//!
//! The card reads and writes these bytes by DMA while the CPU runs, so no Rust reference to
//! them is ever created: every access is a volatile load or store through the raw pointer.
//! The valid bit is read alone, as one byte load of byte 31, before the descriptor is copied;
//! a card-style publication writes the last 8-byte word, which holds byte 31, after the rest.
//! Ordering against the card is the rings' job: a `fence(Acquire)` after a valid bit or tail
//! is observed, a `fence(Release)` before a head or tail CSR write. On CPUs whose DMA is not
//! coherent within the domain those fences cover, the platform must add its own barriers.
//!
//! [`RingSlots`] is the slot interface the rings run on. [`RingMemory`] is its only
//! implementation in the driver; tests and the loom model provide others.

use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use super::fence;
use super::pointer::{RingPtr, RING_BYTES, RING_LEN};
use crate::addr::DeviceAddr;
use crate::desc::{RawDesc, DESC_SIZE};
use crate::platform::DmaBuffer;

/// Alignment required of ring memory, both as CPU pointer and as device address. The card
/// splits its DMA at 128-byte and 512-byte blocks of the address; page alignment keeps those
/// blocks on slot boundaries and a ring never shares a page with anything else.
pub const RING_ALIGN: usize = 4096;

/// Offset of the byte holding the valid bit (bit 255) within a descriptor.
const VALID_BYTE: usize = DESC_SIZE - 1;
/// The valid bit within [`VALID_BYTE`].
const VALID_MASK: u8 = 0x80;
/// 8-byte words per descriptor.
const WORDS: usize = DESC_SIZE / 8;

/// The slots of a ring of `N` descriptors, addressed by ring pointer.
///
/// Implementations read and write whole 32-byte descriptors of the slot at `at.idx()`.
pub trait RingSlots<const N: u16> {
    /// Whether the valid bit (bit 255) of the slot is set, from a single read of the byte
    /// that holds it.
    fn is_valid(&self, at: RingPtr<N>) -> bool;
    /// A copy of the slot's descriptor.
    fn read(&self, at: RingPtr<N>) -> RawDesc;
    /// Stores `desc` in the slot (a host-to-card ring: the card ignores the valid bit).
    fn write(&mut self, at: RingPtr<N>, desc: &RawDesc);
    /// Zeroes the slot, clearing its valid bit.
    fn clear(&mut self, at: RingPtr<N>);
}

/// Why a DMA buffer cannot hold a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingMemoryError {
    /// The buffer is not exactly [`RING_BYTES`] long.
    Length {
        /// The buffer's length in bytes.
        len: usize,
    },
    /// The CPU pointer is not aligned to [`RING_ALIGN`].
    CpuMisaligned {
        /// The CPU address.
        addr: usize,
    },
    /// The device address is not aligned to [`RING_ALIGN`].
    DeviceMisaligned {
        /// The device address.
        addr: DeviceAddr,
    },
}

impl fmt::Display for RingMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingMemoryError::Length { len } => {
                write!(f, "ring buffer is {len} bytes, needs exactly {RING_BYTES}")
            }
            RingMemoryError::CpuMisaligned { addr } => {
                write!(
                    f,
                    "ring buffer at CPU address {addr:#x} is not {RING_ALIGN}-byte aligned"
                )
            }
            RingMemoryError::DeviceMisaligned { addr } => write!(
                f,
                "ring buffer at device address {:#x} is not {RING_ALIGN}-byte aligned",
                addr.0
            ),
        }
    }
}

/// A DMA buffer that [`RingMemory::new`] refused, handed back so its allocator can free it.
#[derive(Debug)]
pub struct RejectedBuffer {
    /// What is wrong with it.
    pub error: RingMemoryError,
    /// The buffer, untouched.
    pub buffer: DmaBuffer,
}

/// The memory of one card ring: exactly [`RING_LEN`] slots of 32 bytes, page aligned.
#[derive(Debug)]
pub struct RingMemory {
    buf: DmaBuffer,
}

impl RingMemory {
    /// Takes a buffer of exactly [`RING_BYTES`] bytes aligned to [`RING_ALIGN`] in both
    /// address spaces. The contents are left as they are: memory from a `DmaAllocator` is
    /// zeroed, and a consumer ring clears its slots when it is created.
    pub fn new(buf: DmaBuffer) -> Result<Self, RejectedBuffer> {
        let addr = buf.cpu().as_ptr() as usize;
        let error = if buf.len() != RING_BYTES {
            RingMemoryError::Length { len: buf.len() }
        } else if addr % RING_ALIGN != 0 {
            RingMemoryError::CpuMisaligned { addr }
        } else if buf.device_addr().0 % RING_ALIGN as u64 != 0 {
            RingMemoryError::DeviceMisaligned {
                addr: buf.device_addr(),
            }
        } else {
            return Ok(RingMemory { buf });
        };
        Err(RejectedBuffer { error, buffer: buf })
    }

    /// The device address of slot 0, for the ring's base registers.
    pub fn device_addr(&self) -> DeviceAddr {
        self.buf.device_addr()
    }

    /// Gives the buffer back, to be freed by its allocator once the card no longer uses it.
    pub fn into_buffer(self) -> DmaBuffer {
        self.buf
    }

    /// Pointer to the first byte of the slot `at`.
    fn slot(&self, at: RingPtr) -> NonNull<u8> {
        // SAFETY: `at.idx() < RING_LEN`, so the offset is at most RING_BYTES - 32 and stays
        // inside the buffer, whose length `new` checked to be RING_BYTES.
        unsafe { self.buf.cpu().add(usize::from(at.idx()) * DESC_SIZE) }
    }

    /// Whether the valid bit of slot `at` is set: one volatile load of byte 31, which the
    /// card writes last (or together with the rest of the descriptor).
    pub fn is_valid(&self, at: RingPtr) -> bool {
        // SAFETY: byte 31 of a slot is inside the buffer (see `slot`) and valid for reads
        // for the buffer's lifetime (DmaBuffer::new contract). Volatile, because the card
        // may write it at any time.
        let byte = unsafe { self.slot(at).add(VALID_BYTE).as_ptr().read_volatile() };
        byte & VALID_MASK != 0
    }

    /// A copy of the descriptor in slot `at`, read with four volatile 8-byte loads. Call it
    /// after [`RingMemory::is_valid`] and a `fence(Acquire)`; the caller decides from its
    /// copy only, the slot may change later.
    pub fn read(&self, at: RingPtr) -> RawDesc {
        let words = self.slot(at).cast::<u64>();
        let mut out = [0u64; WORDS];
        for (i, w) in out.iter_mut().enumerate() {
            // SAFETY: word i < 4 of an in-bounds slot is inside the buffer; the buffer is
            // RING_ALIGN-aligned and slots are 32 bytes apart, so the word is 8-byte
            // aligned. Volatile: the card writes this memory by DMA. (A volatile load of the
            // whole [u8; 32] compiles to 32 byte loads.)
            *w = unsafe { words.add(i).as_ptr().read_volatile() };
        }
        zerocopy::transmute!(out)
    }

    /// Stores `desc` in slot `at` with one volatile 32-byte store. For host-to-card rings,
    /// where the card reads slots up to the head CSR and ignores the valid bit.
    pub fn write(&mut self, at: RingPtr, desc: &RawDesc) {
        self.store(at, desc);
    }

    /// Stores `desc` the way the card publishes a card-to-host descriptor: the first three
    /// words, then `fence(Release)`, then the word with the valid bit. For an emulated card
    /// writing the driver's ring from another thread.
    pub fn write_valid_last(&mut self, at: RingPtr, desc: &RawDesc) {
        let [w0, w1, w2, w3]: [u64; WORDS] = zerocopy::transmute!(*desc);
        self.store_word(at, 0, w0);
        self.store_word(at, 1, w1);
        self.store_word(at, 2, w2);
        // A reader that sees the valid bit and then fences with Acquire sees the body.
        fence(Ordering::Release);
        self.store_word(at, 3, w3);
    }

    /// Zeroes slot `at`.
    pub fn clear(&mut self, at: RingPtr) {
        self.store(at, &RawDesc::ZERO);
    }

    /// One volatile store of a whole descriptor into slot `at`.
    fn store(&mut self, at: RingPtr, desc: &RawDesc) {
        // SAFETY: the slot is inside the buffer and aligned for RawDesc (see `read`); the
        // buffer is valid for writes (DmaBuffer::new contract), and `&mut self` excludes
        // other CPU writers through this value. Volatile: the card reads it by DMA.
        unsafe {
            self.slot(at)
                .cast::<RawDesc>()
                .as_ptr()
                .write_volatile(*desc)
        }
    }

    /// One volatile store of 8-byte word `word % 4` of slot `at`.
    fn store_word(&mut self, at: RingPtr, word: usize, value: u64) {
        let dst = self.slot(at).cast::<u64>();
        // SAFETY: word % 4 of an in-bounds slot is inside the buffer and 8-byte aligned (see
        // `read`); the buffer is valid for writes (DmaBuffer::new contract), and `&mut self`
        // excludes other CPU writers through this value. Volatile: the card reads it by DMA.
        unsafe { dst.add(word % WORDS).as_ptr().write_volatile(value) };
    }
}

impl RingSlots<RING_LEN> for RingMemory {
    fn is_valid(&self, at: RingPtr) -> bool {
        RingMemory::is_valid(self, at)
    }
    fn read(&self, at: RingPtr) -> RawDesc {
        RingMemory::read(self, at)
    }
    fn write(&mut self, at: RingPtr, desc: &RawDesc) {
        RingMemory::write(self, at, desc)
    }
    fn clear(&mut self, at: RingPtr) {
        RingMemory::clear(self, at)
    }
}

/// Descriptors staged for a ring before one doorbell, at most `N`. The slots start
/// uninitialized: the engine makes a staging area for every post and every poll, and
/// zeroing 64 descriptors (2 KiB) cost more than the rest of a one-WRITE post (callgrind,
/// docs/BENCHMARKS.md). Only the slots pushed are ever read.
pub struct DescStaging<const N: usize> {
    slots: [core::mem::MaybeUninit<RawDesc>; N],
    n: usize,
}

impl<const N: usize> DescStaging<N> {
    /// An empty staging area.
    #[inline]
    pub const fn new() -> Self {
        DescStaging {
            // An inline const per element: `MaybeUninit::uninit()` of the whole array (and
            // heapless::Vec::new) compiles to a memset of it when the value is returned
            // by address.
            slots: [const { core::mem::MaybeUninit::uninit() }; N],
            n: 0,
        }
    }

    /// Descriptors staged.
    #[inline]
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether none is staged.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Stages `d`; false (and nothing staged) when all `N` slots are taken.
    #[inline]
    pub fn push(&mut self, d: RawDesc) -> bool {
        match self.slots.get_mut(self.n) {
            Some(slot) => {
                slot.write(d);
                self.n += 1;
                true
            }
            None => false,
        }
    }

    /// The staged descriptors, in order; the area is empty afterwards.
    #[inline]
    pub fn take(&mut self) -> &[RawDesc] {
        let n = core::mem::take(&mut self.n);
        let filled = &self.slots[..n];
        // SAFETY: `push` writes a slot before it counts it and counts at most N (it checks
        // the bounds), so the first `n` slots are initialized; MaybeUninit<RawDesc> has
        // RawDesc's layout. The slice borrows `self`, so no push overwrites a slot while it
        // is read.
        unsafe { core::slice::from_raw_parts(filled.as_ptr().cast::<RawDesc>(), n) }
    }
}

impl<const N: usize> Default for DescStaging<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::testing::{desc, HeapDma};

    #[test]
    fn rejects_wrong_length_and_alignment_and_returns_the_buffer() {
        let heap = HeapDma::new(2 * RING_BYTES, RING_ALIGN);
        let short = RingMemory::new(heap.buffer(0, RING_BYTES - 32)).unwrap_err();
        assert_eq!(
            short.error,
            RingMemoryError::Length {
                len: RING_BYTES - 32
            }
        );
        assert_eq!(short.buffer.len(), RING_BYTES - 32);
        let shifted = RingMemory::new(heap.buffer(64, RING_BYTES)).unwrap_err();
        assert!(matches!(
            shifted.error,
            RingMemoryError::CpuMisaligned { addr } if addr % RING_ALIGN == 64
        ));
        // SAFETY: describes the start of the live allocation, with a bad device address.
        let odd_dev =
            unsafe { DmaBuffer::new(heap.buffer(0, 1).cpu(), DeviceAddr(0x1000_0200), RING_BYTES) };
        assert_eq!(
            RingMemory::new(odd_dev).unwrap_err().error,
            RingMemoryError::DeviceMisaligned {
                addr: DeviceAddr(0x1000_0200)
            }
        );
        assert!(RingMemory::new(heap.buffer(0, RING_BYTES)).is_ok());
    }

    #[test]
    fn slots_are_32_bytes_apart_in_memory_order() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut mem = RingMemory::new(heap.buffer(0, RING_BYTES)).unwrap();
        let mut d = [0u8; 32];
        for (i, b) in d.iter_mut().enumerate() {
            *b = i as u8;
        }
        d[31] = 0x80;
        // Pointer 0x1FFF is slot 4095, the last 32 bytes.
        let last = RingPtr::new(0x1FFF);
        mem.write(last, &RawDesc(d));
        assert_eq!(&heap.bytes()[RING_BYTES - 32..], &d);
        assert!(mem.is_valid(last));
        assert_eq!(mem.read(last), RawDesc(d));
        assert!(!mem.is_valid(RingPtr::new(0)));
        mem.clear(last);
        assert!(heap.bytes().iter().all(|&b| b == 0));
        mem.write_valid_last(RingPtr::new(1), &desc(7, 0x80));
        assert_eq!(&heap.bytes()[32..64], &desc(7, 0x80).0);
        assert!(mem.is_valid(RingPtr::new(0x1001)));
    }

    #[test]
    fn valid_is_bit_255_only() {
        let heap = HeapDma::new(RING_BYTES, RING_ALIGN);
        let mut mem = RingMemory::new(heap.buffer(0, RING_BYTES)).unwrap();
        let p = RingPtr::new(3);
        mem.write(p, &desc(0xFF, 0x7F));
        assert!(!mem.is_valid(p));
        mem.write(p, &desc(0, 0x80));
        assert!(mem.is_valid(p));
    }

    #[test]
    fn staging_hands_over_what_was_pushed_in_order_and_starts_empty_again() {
        let mut s = DescStaging::<8>::new();
        assert!(s.take().is_empty(), "a new staging area holds nothing");
        for k in 0..5 {
            assert!(s.push(desc(k, 0)));
        }
        let got: [RawDesc; 5] = s.take().try_into().unwrap();
        assert_eq!(got, [0, 1, 2, 3, 4].map(|k| desc(k, 0)));
        assert!(s.is_empty());
        assert!(s.take().is_empty(), "taken once");
        assert!(s.push(desc(9, 0)));
        assert_eq!(s.take(), &[desc(9, 0)], "reused after a take");
    }

    #[test]
    fn full_staging_refuses_more_and_keeps_what_it_has() {
        let mut s = DescStaging::<4>::new();
        for k in 0..4 {
            assert!(s.push(desc(k, 0)));
        }
        assert!(!s.push(desc(200, 0)), "no fifth slot");
        assert_eq!(s.len(), 4);
        assert_eq!(s.take(), &[0, 1, 2, 3].map(|k| desc(k, 0)));
    }
}
