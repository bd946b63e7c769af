//! The platform boundary of the verbs API (ARCHITECTURE.md "One Context, three backends").
//!
//! The engine is generic over its platform (`Device<P, S>`, for firmware and tests); the
//! verbs layer runs every device on one type-erased platform, [`DynPlatform`], whose
//! register access, DMA memory and user-memory resolver are boxed trait objects
//! ([`DynRegs`], [`DynDma`], [`DynMem`]) beside the boxed out-of-band channel
//! ([`crate::oob_hub::DynOob`]). The C library keeps contexts of every backend in one
//! table, and one indirect call is nothing next to an MMIO write or a socket round trip.
//!
//! Three providers return a [`Backend`]: the parts plus a handle that keeps what is behind
//! them alive (the mapped card, the simulator's connections, the in-process card):
//!
//! | backend | module | registers | DMA and user memory | device address |
//! |---|---|---|---|---|
//! | PCI card | [`pci`] | BAR0 mmap | u-dma-buf or hugepages; mlock + pagemap | physical |
//! | RTL simulator | `rtl` (feature `rtl`) | CSR socket | answered over the DMA socket | VA + 2^46 |
//! | emulated card | `emulated` (feature `emulator`) | in-process register file | the process's memory | VA + 2^46 |
//!
//! Each backend has its own timer and window defaults ([`Tuning`]): the card answers
//! commands in microseconds, the simulator's DMA socket moves about 2 MB/s.
//!
//! A process that owns a backend for others (a daemon whose clients run their engines in
//! their own processes) hands the clients' memory to the card with
//! [`BackendHandle::remote_memory`]: the emulated card and the RTL simulator's DMA client
//! reach it with `process_vm_readv`/`process_vm_writev` at device addresses of an IOVA
//! window (`bluerdma_sim::mem::RemoteMappings`); the PCI card has none (it reaches physical
//! memory, which a client pins and translates itself).

#[cfg(feature = "emulator")]
pub mod emulated;
mod error;
pub mod pci;
#[cfg(feature = "rtl")]
pub mod rtl;

pub use error::OpenError;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::oob::AtomicOp;
use bluerdma_core::platform::{
    DmaAllocator, DmaBuffer, MemoryResolver, Platform, PlatformError, RegisterAccess,
};
use bluerdma_core::regs::{Counter, Reg};

use crate::oob_hub::DynOob;

/// Register access of any backend. Shared, so a backend's handle can read the card's
/// counters while the engine owns the device.
#[derive(Clone)]
pub struct DynRegs(pub Arc<dyn RegisterAccess + Send + Sync>);

impl RegisterAccess for DynRegs {
    fn read32(&self, reg: Reg) -> u32 {
        self.0.read32(reg)
    }
    fn write32(&self, reg: Reg, value: u32) {
        self.0.write32(reg, value)
    }
}

/// DMA memory of any backend.
pub struct DynDma(pub Box<dyn DmaAllocator + Send>);

// SAFETY: forwards to the boxed allocator, which upholds the obligations.
unsafe impl DmaAllocator for DynDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        self.0.alloc(len, align)
    }
    unsafe fn free(&self, buf: DmaBuffer) {
        // SAFETY: the caller's promise is passed on to the allocator that made `buf`.
        unsafe { self.0.free(buf) }
    }
}

/// User-memory resolution of any backend.
pub struct DynMem(pub Box<dyn MemoryResolver + Send>);

impl MemoryResolver for DynMem {
    fn pin(&mut self, va: VirtAddr, len: usize, write: bool) -> Result<(), PlatformError> {
        self.0.pin(va, len, write)
    }
    fn unpin(&mut self, va: VirtAddr, len: usize) {
        self.0.unpin(va, len)
    }
    fn translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), PlatformError> {
        self.0.translate(va, page, out)
    }
    fn atomic(&mut self, va: VirtAddr, op: AtomicOp) -> Result<u64, PlatformError> {
        self.0.atomic(va, op)
    }
    fn write(&mut self, va: VirtAddr, bytes: &[u8]) -> Result<(), PlatformError> {
        self.0.write(va, bytes)
    }
}

/// The platform of every device the verbs API opens.
pub struct DynPlatform;

impl Platform for DynPlatform {
    type Regs = DynRegs;
    type Dma = DynDma;
    type Mem = DynMem;
    type Oob = DynOob;
}

/// Which backend a device runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The emulated card, in this process.
    Emulated,
    /// A card behind the RTL simulator's sockets (the cocotb simulation, or
    /// `bluerdma-sim serve`).
    Rtl,
    /// The PCI card (or the fake one of `bluerdma-sim pci-serve`).
    Pci,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Emulated => "emulated",
            BackendKind::Rtl => "rtl",
            BackendKind::Pci => "pci",
        })
    }
}

/// How the engine paces itself on a backend: `DeviceConfig::command_timeout`,
/// `DeviceConfig::ack_timeout_min` and `DeviceConfig::send_window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// How long a command may take.
    pub command_timeout: Duration,
    /// The least local ACK timeout of every QP.
    pub ack_timeout_min: Duration,
    /// Packets in flight per QP before new work waits for ACKs (the engine caps it at
    /// its own limit).
    pub send_window: u32,
}

impl Tuning {
    /// The card: commands answer in microseconds, the application's ACK timeout applies
    /// unchanged, the window is the engine's.
    pub const CARD: Tuning = Tuning {
        command_timeout: Duration::from_secs(2),
        ack_timeout_min: Duration::ZERO,
        send_window: 1024,
    };
    /// The in-process emulated card: as the card, but its threads are this process's, so on
    /// a loaded machine a command may wait for a CPU far longer than the card ever takes (a
    /// 2 s limit failed ManageQp once under `cargo xtask ci --stress`).
    pub const EMULATED: Tuning = Tuning {
        command_timeout: Duration::from_secs(10),
        ..Tuning::CARD
    };
    /// The model behind the RTL protocol (`bluerdma-sim serve`): its DMA socket carries
    /// one JSON line per 32-byte beat, and each beat the card reads is a round trip, so a
    /// 4 KiB packet takes milliseconds to fetch and the writes of a full window queue up
    /// for a second before the receiver's ACK can be fetched behind them. A small window
    /// keeps that queue short; the floor keeps the ACK timeout above it (the application's
    /// 67 ms of `timeout` 14 would resend the window again and again).
    pub const RTL_MODEL: Tuning = Tuning {
        command_timeout: Duration::from_secs(10),
        ack_timeout_min: Duration::from_secs(2),
        send_window: 16,
    };
    /// The cocotb simulation of the RTL: thousands of times slower than the card.
    pub const COCOTB: Tuning = Tuning {
        command_timeout: Duration::from_secs(120),
        ack_timeout_min: Duration::from_secs(20),
        send_window: 16,
    };
}

/// Which simulator serves the sockets: it sets the timer defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Simulator {
    /// The emulated card of `bluerdma-sim serve`.
    #[default]
    Model,
    /// The cocotb simulation of the RTL.
    Cocotb,
}

impl Simulator {
    /// The engine's tuning for this simulator.
    pub fn tuning(self) -> Tuning {
        match self {
            Simulator::Model => Tuning::RTL_MODEL,
            Simulator::Cocotb => Tuning::COCOTB,
        }
    }

    /// How long to retry connecting: Verilator elaborates the design for minutes before
    /// the cocotb testbench opens its sockets (the spec's 300 s); `bluerdma-sim serve`
    /// listens at once.
    pub fn connect_timeout(self) -> Duration {
        match self {
            Simulator::Model => Duration::from_secs(10),
            Simulator::Cocotb => Duration::from_secs(300),
        }
    }
}

/// How to reach the RTL simulator (the `rtl` backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtlConfig {
    /// The CSR port on 127.0.0.1 (7700 + instance; 7701 for the one-card bench).
    pub csr_port: u16,
    /// The DMA port on 127.0.0.1 (7002 + instance; 7003 for the one-card bench).
    pub dma_port: u16,
    /// Which simulator it is.
    pub simulator: Simulator,
    /// How long to retry connecting (`None`: the simulator's default).
    pub connect_timeout: Option<Duration>,
}

impl Default for RtlConfig {
    fn default() -> Self {
        RtlConfig {
            csr_port: 7701,
            dma_port: 7003,
            simulator: Simulator::Model,
            connect_timeout: None,
        }
    }
}

/// How the buffers of [`crate::Pd::alloc_mr`] are allocated, so that the backend can
/// register them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// The heap: any memory registers (the emulated card and the RTL simulator).
    Heap,
    /// 2 MiB hugetlb pages: the card translates 2 MiB pages, each of which must be one
    /// physically contiguous block.
    HugePages,
}

/// Memory of other processes, made reachable by the card (see the module documentation).
pub trait RemoteMemory: Send + Sync {
    /// Makes `len` bytes at `va` in process `pid` reachable by the card; returns their
    /// device address (same offset within `page`).
    ///
    /// The range must be mapped readable in that process now; the card's writes to it fail
    /// (as DMA faults) where it is not writable. Errors: `NotMapped` (its first byte that is
    /// not mapped), `NotPermitted` (the ptrace rules refuse this process access to that
    /// one), `Os(ESRCH)` (no such process), `Os(EINVAL)` (a pid that is not positive or a
    /// range that wraps), `OutOfMemory` (no device addresses left).
    fn map(
        &self,
        pid: i32,
        va: u64,
        len: usize,
        page: PageSize,
    ) -> Result<DeviceAddr, PlatformError>;
    /// Undoes a `map` (by the returned address); unknown addresses are ignored. Once it
    /// returns, the card no longer reaches the range.
    fn unmap(&self, dev: DeviceAddr);
}

#[cfg(any(feature = "emulator", feature = "rtl"))]
impl RemoteMemory for bluerdma_sim::mem::RemoteMappings {
    fn map(
        &self,
        pid: i32,
        va: u64,
        len: usize,
        page: PageSize,
    ) -> Result<DeviceAddr, PlatformError> {
        bluerdma_sim::mem::RemoteMappings::map(self, pid, va, len, page)
    }
    fn unmap(&self, dev: DeviceAddr) {
        bluerdma_sim::mem::RemoteMappings::unmap(self, dev);
    }
}

/// What keeps a backend alive while its device is open, and what it can tell about itself.
/// Dropped after the engine.
pub trait BackendHandle: Send {
    /// The card side's counters, as one line of text (for state dumps).
    fn card_stats(&self) -> String;

    /// Where the engine's simple-NIC TX frames are (device address, length), told once
    /// after open, for [`BackendHandle::tx_frame_bytes_read`].
    fn watch_tx_frames(&self, _buffers: &[(DeviceAddr, usize)]) {}

    /// The bytes the card has read from those buffers, where the backend sees every read
    /// (the RTL DMA client serves them); `None` where it cannot tell (the card reads
    /// u-dma-buf memory that outlives the process; the emulated card is stopped, and so
    /// finishes what it fetched, before the buffers go).
    fn tx_frame_bytes_read(&self) -> Option<u64> {
        None
    }

    /// Where the card can reach memory of other processes ([`RemoteMemory`]); `None` where
    /// it cannot (the PCI card). Every call gives the same mappings.
    fn remote_memory(&self) -> Option<Arc<dyn RemoteMemory>> {
        None
    }

    /// How many QP contexts and MR entries the card holds valid, where the backend can read
    /// its tables (the emulated card); `None` elsewhere.
    fn valid_entries(&self) -> Option<(usize, usize)> {
        None
    }

    /// Asks the card to call `f` after it writes to a card-to-host ring (the emulated
    /// card's interrupt); whether it will. A host told so may sleep instead of polling.
    fn set_report_notify(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        let _ = f;
        false
    }
}

/// The card's non-zero register counters (0x400..), read through `regs`.
pub fn register_counters(regs: &dyn RegisterAccess) -> String {
    let mut s = String::new();
    for counter in Counter::ALL {
        let v = regs.read32(counter.reg());
        if v != 0 {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(&format!("{counter:?}={v}"));
        }
    }
    s
}

/// A card that runs in the driver's own threads (the inline emulated card): the verbs layer
/// steps it where a real card would work by itself. Its command doorbells step it through
/// the register access already; these are the other places.
pub trait InlineCard: Send + Sync {
    /// Runs the receive side once (an application polling its CQ); whether it did work.
    fn receive(&self) -> bool;
    /// Runs both sides once (the progress thread's round); whether they did work.
    fn step(&self) -> bool;
    /// Runs the transmit side if a doorbell of the send rings waits for it (the card
    /// leaves work requests to the driver's next step; see `InlineNic::ring_send`).
    fn flush_tx(&self) -> bool;
    /// Whether a doorbell of the send rings waits for [`InlineCard::flush_tx`].
    fn tx_pending(&self) -> bool;
    /// Waits up to `timeout` for a frame (announced by its sender only if `announced`; an
    /// application that spins on a CQ receives for itself) or [`InlineCard::wake`], then
    /// runs the receive side (the progress thread with nothing to do).
    fn wait(&self, timeout: Duration, announced: bool) -> bool;
    /// An application's CQ poll found nothing (`spinning`) or found completions.
    fn app_spins(&self, spinning: bool);
    /// Simple-NIC frames the card has written to the host so far.
    fn raw_frames(&self) -> u64;
    /// Ends a thread's [`InlineCard::wait`].
    fn wake(&self);
}

/// A device's platform parts, from one of the providers.
pub struct Backend {
    /// Which backend.
    pub kind: BackendKind,
    /// Register access.
    pub regs: DynRegs,
    /// DMA memory.
    pub dma: DynDma,
    /// User memory.
    pub mem: DynMem,
    /// How the engine paces itself.
    pub tuning: Tuning,
    /// How owned MR buffers are allocated.
    pub buffers: BufferKind,
    /// What keeps the backend alive.
    pub handle: Box<dyn BackendHandle>,
    /// The card, if it runs in the driver's threads.
    pub inline: Option<Arc<dyn InlineCard>>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("kind", &self.kind)
            .field("tuning", &self.tuning)
            .field("buffers", &self.buffers)
            .finish_non_exhaustive()
    }
}
