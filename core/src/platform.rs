//! The platform traits: the only door between the core and the world.
//!
//! A platform supplies register access, DMA-able memory, resolution of user memory to
//! device addresses, and the out-of-band transport. Time is not a trait: it is an argument
//! of every `poll(now)`.

use core::fmt;
use core::net::Ipv4Addr;
use core::ptr::NonNull;

use crate::addr::{DeviceAddr, PageSize, VirtAddr};
use crate::oob::{AtomicMessage, AtomicOp, CheckMessage, RecvTooShort, RecvWr};
use crate::regs::Reg;

/// What a platform operation can fail with. Small and `Copy` so it travels through the
/// no_std core without allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PlatformError {
    /// No DMA memory (or no table slot) left of the requested size and alignment.
    OutOfMemory {
        /// Bytes requested.
        requested: usize,
    },
    /// The operation needs a privilege the process lacks (e.g. CAP_SYS_ADMIN for PFNs).
    NotPermitted,
    /// An address in the range is not mapped (or its frame reads as 0).
    NotMapped {
        /// The first unmapped address.
        va: VirtAddr,
    },
    /// An address in the range may not be written, and the card may write the range.
    ReadOnly {
        /// The first read-only address.
        va: VirtAddr,
    },
    /// The range cannot be pinned (mlock limit, not resident).
    PinFailed {
        /// The first address that failed.
        va: VirtAddr,
    },
    /// The peer of an out-of-band connection is unreachable or the connection broke.
    Disconnected {
        /// The peer's IP address.
        peer: Ipv4Addr,
    },
    /// The transport cannot take more right now; try again after `poll`.
    WouldBlock,
    /// The platform does not implement this operation.
    Unsupported,
    /// An operating-system error code.
    Os(i32),
}

impl fmt::Display for PlatformError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlatformError::OutOfMemory { requested } => {
                write!(f, "out of DMA memory ({requested} bytes requested)")
            }
            PlatformError::NotPermitted => f.write_str("operation not permitted"),
            PlatformError::NotMapped { va } => write!(f, "address {:#x} is not mapped", va.0),
            PlatformError::ReadOnly { va } => write!(
                f,
                "address {:#x} is read-only, and the access lets the card write it",
                va.0
            ),
            PlatformError::PinFailed { va } => write!(f, "cannot pin memory at {:#x}", va.0),
            PlatformError::Disconnected { peer } => write!(f, "connection to {peer} lost"),
            PlatformError::WouldBlock => f.write_str("transport busy, try again"),
            PlatformError::Unsupported => f.write_str("not supported by this platform"),
            PlatformError::Os(e) => write!(f, "OS error {e}"),
        }
    }
}

/// 32-bit register access at a BAR0 offset.
///
/// Only decoded registers can be named ([`Reg`]), so an implementation never has to guard
/// against undecoded addresses coming from the core.
pub trait RegisterAccess {
    /// Reads the register.
    fn read32(&self, reg: Reg) -> u32;
    /// Writes the register. Implementations must not reorder this write before memory
    /// writes that precede it in program order (the core issues a `fence(Release)` first;
    /// MMIO platforms add whatever their architecture needs beyond that).
    fn write32(&self, reg: Reg, value: u32);
}

/// A DMA buffer: the CPU pointer and the device address of the same bytes.
#[derive(Debug)]
pub struct DmaBuffer {
    cpu: NonNull<u8>,
    dev: DeviceAddr,
    len: usize,
}

impl DmaBuffer {
    /// Describes a buffer.
    ///
    /// # Safety
    /// `cpu` must be valid for reads and writes of `len` bytes, and the device must reach
    /// the same bytes at `dev .. dev + len`, until the buffer is freed by its allocator.
    pub const unsafe fn new(cpu: NonNull<u8>, dev: DeviceAddr, len: usize) -> Self {
        Self { cpu, dev, len }
    }
    /// CPU pointer to the first byte.
    pub const fn cpu(&self) -> NonNull<u8> {
        self.cpu
    }
    /// Device address of the first byte.
    pub const fn device_addr(&self) -> DeviceAddr {
        self.dev
    }
    /// Length in bytes.
    pub const fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bytes, for the CPU. The card may read or write them concurrently (that is DMA);
    /// which side owns which bytes when is the business of the ring or command protocol.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `new`'s contract makes `cpu` valid for `len` bytes while the buffer lives,
        // and `&mut self` makes this the only CPU-side borrow through this handle.
        unsafe { core::slice::from_raw_parts_mut(self.cpu.as_ptr(), self.len) }
    }
}

/// Returns a buffer the core owns to its allocator. Inside the core no pointer from
/// [`DmaBuffer::cpu`] outlives the buffer it came from (rings give theirs back through
/// `into_buffer`), which is what `free` requires.
pub(crate) fn release<A: DmaAllocator + ?Sized>(dma: &A, buf: DmaBuffer) {
    // SAFETY: `buf` was allocated by `dma` (the core frees only what it allocated there)
    // and, by the invariant above, nothing uses it afterwards.
    unsafe { dma.free(buf) }
}

// SAFETY: a DmaBuffer is a description of memory owned by the allocator, not a borrow of
// thread-local data; moving the description to another thread is sound. Access to the
// bytes is governed by whoever holds the buffer.
unsafe impl Send for DmaBuffer {}

/// Allocation of memory the card can reach by DMA.
///
/// # Implementation safety
/// `alloc` must return zeroed memory, aligned to at least `align` both as a CPU pointer and
/// as a device address, valid for reads and writes of `len` bytes until passed to `free`,
/// and reachable by the device at the returned device address for the same duration. Two
/// live buffers must not overlap.
pub unsafe trait DmaAllocator {
    /// Allocates `len` zeroed bytes aligned to `align` (a power of two).
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError>;
    /// Returns a buffer.
    ///
    /// # Safety
    /// `buf` came from this allocator's `alloc` and no pointer into it is used afterwards.
    unsafe fn free(&self, buf: DmaBuffer);
}

// SAFETY: forwards to `T`, which upholds the obligations.
unsafe impl<T: DmaAllocator + ?Sized> DmaAllocator for &T {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        (**self).alloc(len, align)
    }
    unsafe fn free(&self, buf: DmaBuffer) {
        // SAFETY: the caller's promise is passed on unchanged.
        unsafe { (**self).free(buf) }
    }
}

/// One mapping of a process's memory, as a `maps` file lists it (`/proc/self/maps` on
/// Linux): `[start, end)` and whether the process may read and write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappedRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// `r` in the permissions.
    pub read: bool,
    /// `w` in the permissions.
    pub write: bool,
}

/// The check of [`MemoryResolver::pin`] for a hosted platform: every byte of
/// `[va, va + len)` lies in a readable mapping of `maps` (ascending, as a `maps` file lists
/// them), and with `write` in a writable one. [`PlatformError::NotMapped`] names the first
/// byte that is not mapped or not readable (or `va` when the range wraps),
/// [`PlatformError::ReadOnly`] the first that is not writable.
pub fn check_mapped(
    maps: impl IntoIterator<Item = MappedRange>,
    va: VirtAddr,
    len: u64,
    write: bool,
) -> Result<(), PlatformError> {
    let end =
        va.0.checked_add(len)
            .ok_or(PlatformError::NotMapped { va })?;
    let mut at = va.0;
    for m in maps {
        if at >= end {
            break;
        }
        if m.end <= at {
            continue;
        }
        if m.start > at || !m.read {
            return Err(PlatformError::NotMapped { va: VirtAddr(at) });
        }
        if write && !m.write {
            return Err(PlatformError::ReadOnly { va: VirtAddr(at) });
        }
        at = m.end;
    }
    if at < end {
        return Err(PlatformError::NotMapped { va: VirtAddr(at) });
    }
    Ok(())
}

/// Resolution of user memory (an MR) to device addresses, with pinning.
pub trait MemoryResolver {
    /// Pins `[va, va + len)` so that its frames cannot move while registered. The whole
    /// range must be memory the card may read, and with `write` (the registration lets the
    /// card write it) memory the process may write: anything else is refused
    /// ([`PlatformError::NotMapped`], [`PlatformError::ReadOnly`]), as the kernel's pinning
    /// refuses it with EFAULT, so that no peer can make the card touch it.
    fn pin(&mut self, va: VirtAddr, len: usize, write: bool) -> Result<(), PlatformError>;
    /// Undoes [`MemoryResolver::pin`] for the same range.
    fn unpin(&mut self, va: VirtAddr, len: usize);
    /// Writes the device address of `out.len()` consecutive pages of size `page` into `out`,
    /// starting with the page that contains `va`. Each entry is a page base (low bits zero),
    /// also when `va` is not page aligned.
    fn translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), PlatformError>;
    /// Executes `op` on the 64-bit integer at `va` and returns the value it held before:
    /// the responder's half of an atomic, which the card cannot do. It must be atomic with
    /// respect to every other call on the same memory ([`atomic_in_place`] is, for memory
    /// the CPU reaches at `va`). The engine asks only for 8-byte aligned addresses inside
    /// a valid MR with LOCAL_WRITE; an implementation must still refuse, with
    /// [`PlatformError::NotMapped`], an address that is not aligned or whose 8 bytes do
    /// not lie in one range it pinned with `write` and has not unpinned ([`pinned_at`]
    /// finds it), so that no mistake reaches unmapped memory. [`PlatformError::Unsupported`]
    /// if the platform cannot reach user memory.
    fn atomic(&mut self, va: VirtAddr, op: AtomicOp) -> Result<u64, PlatformError>;
    /// Writes `bytes` at `va` (the original value of an atomic, into the requester's sink),
    /// refusing a range outside what it pinned with `write` as [`MemoryResolver::atomic`]
    /// does.
    fn write(&mut self, va: VirtAddr, bytes: &[u8]) -> Result<(), PlatformError>;
}

/// Which of `pinned` (ranges as `(va, len)`, pinned with `write`) holds all of
/// `[va, va + len)`; [`PlatformError::NotMapped`] naming `va` if none does. The check of
/// [`MemoryResolver::atomic`] and [`MemoryResolver::write`].
pub fn pinned_at(
    pinned: impl IntoIterator<Item = (u64, u64)>,
    va: VirtAddr,
    len: u64,
) -> Result<(u64, u64), PlatformError> {
    let end =
        va.0.checked_add(len)
            .ok_or(PlatformError::NotMapped { va })?;
    pinned
        .into_iter()
        .find(|&(start, n)| start <= va.0 && start.checked_add(n).is_some_and(|e| end <= e))
        .ok_or(PlatformError::NotMapped { va })
}

/// [`MemoryResolver::atomic`] for a platform whose CPU reaches user memory at its virtual
/// address (every platform here: the process's own memory, or the soft-core's identity
/// window). With 64-bit atomics on the target it is a `fetch_add` or a `compare_exchange`,
/// atomic against every other atomic access to the same 8 bytes in the address space
/// (both devices of one process, CPU threads); without them (a 32-bit soft-core) a plain
/// read-modify-write, which is still atomic against the other atomics of the engine,
/// because it executes them one at a time. Neither is atomic against the card's DMA (a
/// WRITE to the same bytes) or a plain CPU store.
///
/// # Safety
/// `va` is 8-byte aligned and the 8 bytes there are valid for reads and writes (for a
/// resolver: [`pinned_at`] found them in a range pinned with `write`).
pub unsafe fn atomic_in_place(va: VirtAddr, op: AtomicOp) -> u64 {
    let ptr = va.0 as usize as *mut u64;
    #[cfg(target_has_atomic = "64")]
    {
        use core::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: the caller's contract: aligned, valid, and (as for any memory the card
        // may write) accessed by others only through atomics or DMA while this runs.
        let cell = unsafe { AtomicU64::from_ptr(ptr) };
        match op {
            AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CompareSwap { compare, swap } => cell
                .compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst)
                .unwrap_or_else(|old| old),
        }
    }
    #[cfg(not(target_has_atomic = "64"))]
    {
        // SAFETY: the caller's contract: aligned and valid for reads and writes.
        unsafe {
            let old = core::ptr::read_volatile(ptr);
            core::ptr::write_volatile(ptr, op.apply(old));
            old
        }
    }
}

/// [`MemoryResolver::write`] for a platform whose CPU reaches user memory at its virtual
/// address (see [`atomic_in_place`]).
///
/// # Safety
/// `[va, va + bytes.len())` is valid for writes.
pub unsafe fn write_in_place(va: VirtAddr, bytes: &[u8]) {
    // SAFETY: the caller's contract; `bytes` is a borrow of other memory, so the two do
    // not overlap.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), va.0 as usize as *mut u8, bytes.len()) }
}

/// Something that arrived on the out-of-band channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OobEvent {
    /// A receive WR announced by the driver at `from`.
    RecvWr {
        /// IP address of the announcing device (the connection's source).
        from: Ipv4Addr,
        /// The announced receive WR.
        wr: RecvWr,
    },
    /// The driver at `from` found one of our announced receive WRs too short for its SEND:
    /// the receive WR completes with a local length error and its QP goes to ERR.
    RecvTooShort {
        /// IP address of the requester's device (the connection's source).
        from: Ipv4Addr,
        /// Which receive WR, the SEND's length and the requester's QPN.
        rec: RecvTooShort,
    },
    /// An atomic request from the driver at `from` (the responder executes it), or the
    /// reply to one of ours. A transport that held our request for a peer without
    /// [`crate::oob::Capabilities::ATOMICS`] makes the reply itself
    /// ([`crate::oob::AtomicReply::refusal`], status unsupported), `from` that peer.
    Atomic {
        /// IP address of the other device (the connection's source).
        from: Ipv4Addr,
        /// The request or reply.
        msg: AtomicMessage,
    },
    /// An access check from the driver at `from` (the responder answers it), or the
    /// verdict on one of ours.
    Check {
        /// IP address of the other device (the connection's source).
        from: Ipv4Addr,
        /// The check or verdict.
        msg: CheckMessage,
    },
    /// The connection to `peer` broke; QPs that depend on it must go to the error state.
    PeerLost {
        /// The peer's IP address.
        peer: Ipv4Addr,
    },
}

/// The out-of-band channel that carries receive WRs between drivers (oob-channel.md).
pub trait OobTransport {
    /// Queues `wr` for the device at `peer`. May return [`PlatformError::WouldBlock`].
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError>;
    /// Queues `rec` (one of `peer`'s receive WRs was too short for a SEND) for the device at
    /// `peer`, if that peer announced [`crate::oob::Capabilities::LENGTH_ERRORS`]; to a peer
    /// without it nothing is sent (the transport counts it). May return
    /// [`PlatformError::WouldBlock`].
    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError>;
    /// Queues an atomic request or reply for the device at `peer`. A request for a peer
    /// whose hello lacks [`crate::oob::Capabilities::ATOMICS`] is not sent: the transport
    /// answers it with an [`OobEvent::Atomic`] reply of status unsupported. May return
    /// [`PlatformError::WouldBlock`].
    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError>;
    /// Queues an access check or verdict for the device at `peer`; to a peer whose hello
    /// lacks [`crate::oob::Capabilities::ACCESS_CHECKS`] nothing is sent (the check is
    /// simply not answered). A transport without it refuses ([`PlatformError::Unsupported`],
    /// the default): the requester then waits out its retries as before.
    fn send_check(&mut self, peer: Ipv4Addr, msg: &CheckMessage) -> Result<(), PlatformError> {
        let _ = (peer, msg);
        Err(PlatformError::Unsupported)
    }
    /// The capabilities of `peer`'s hello, if a connection to it is open (`None`: not known
    /// now, the default).
    fn peer_capabilities(&self, peer: Ipv4Addr) -> Option<crate::oob::Capabilities> {
        let _ = peer;
        None
    }
    /// Takes the next event, if any. Never blocks.
    fn poll(&mut self) -> Option<OobEvent>;
    /// The local QP `local` is now connected to QP `peer_qpn` of the device at `peer` (it
    /// reached RTR). Records about a connection name the peer's QPN; a transport shared by
    /// several engines (the relay of a device shared between processes) routes them by
    /// this. The default does nothing.
    fn bind(&mut self, local: crate::keys::Qpn, peer: Ipv4Addr, peer_qpn: crate::keys::Qpn) {
        let _ = (local, peer, peer_qpn);
    }
    /// The local QP `local` is no longer connected (reset or destroyed). The default does
    /// nothing.
    fn unbind(&mut self, local: crate::keys::Qpn) {
        let _ = local;
    }
}

/// The out-of-band transport of a platform that has none (yet): announcing a receive WR
/// fails with [`PlatformError::Unsupported`] and nothing ever arrives.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoOob;

impl OobTransport for NoOob {
    fn send(&mut self, _peer: Ipv4Addr, _wr: &RecvWr) -> Result<(), PlatformError> {
        Err(PlatformError::Unsupported)
    }
    fn send_too_short(
        &mut self,
        _peer: Ipv4Addr,
        _rec: &RecvTooShort,
    ) -> Result<(), PlatformError> {
        Err(PlatformError::Unsupported)
    }
    fn send_atomic(&mut self, _peer: Ipv4Addr, _msg: &AtomicMessage) -> Result<(), PlatformError> {
        Err(PlatformError::Unsupported)
    }
    fn poll(&mut self) -> Option<OobEvent> {
        None
    }
}

/// A bundle of the four platform services, so the engine has one type parameter.
pub trait Platform {
    /// Register access.
    type Regs: RegisterAccess;
    /// DMA memory.
    type Dma: DmaAllocator;
    /// User-memory resolution and pinning.
    type Mem: MemoryResolver;
    /// The out-of-band transport.
    type Oob: OobTransport;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_pinned_only_when_one_pin_holds_all_of_it() {
        let pins = [(0x1000, 0x100), (0x1100, 0x100)];
        assert_eq!(pinned_at(pins, VirtAddr(0x10F8), 8), Ok((0x1000, 0x100)));
        assert_eq!(pinned_at(pins, VirtAddr(0x1100), 8), Ok((0x1100, 0x100)));
        // Across two pins, past the last, before the first, or wrapping: refused.
        for va in [0x10FC, 0x11FC, 0xFF8, u64::MAX - 3] {
            let va = VirtAddr(va);
            assert_eq!(pinned_at(pins, va, 8), Err(PlatformError::NotMapped { va }));
        }
    }

    #[test]
    fn atomics_in_place_do_what_their_operation_says() {
        let mut cell = 40u64;
        let va = VirtAddr(&mut cell as *mut u64 as u64);
        // SAFETY: `cell` is an aligned, live u64.
        let old = unsafe { atomic_in_place(va, AtomicOp::FetchAdd { add: 2 }) };
        assert_eq!((old, cell), (40, 42));
        let cas = AtomicOp::CompareSwap {
            compare: 41,
            swap: 0,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { atomic_in_place(va, cas) }, 42);
        assert_eq!(cell, 42, "no match, no swap");
    }
}
