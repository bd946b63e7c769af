//! The blue-rdma core as firmware on the FPGA's RISC-V soft processor (issue F).
//!
//! No operating system, no heap, no std: the platform services the core asks for
//! (`core/src/platform.rs`) are a few hundred lines of glue over physical memory.
//!
//! - [`regs::MmioRegs`]: the card's register block at a base address given at init,
//!   accessed through `volatile-register` cells, with the RISC-V I/O fences a doorbell needs.
//! - [`dma::DmaPool`]: DMA memory from a `static` arena given at init; device address =
//!   CPU address (the soft-core and the card share one physical address space), guarded by a
//!   `spin` lock.
//! - [`memory::IdentityMemory`]: memory regions need no pinning and translate to themselves.
//! - [`storage::StaticStorage`]: the engine's tables in arrays sized by const generics.
//! - [`clock::CycleClock`]: nanoseconds from a cycle counter, for the engine's `now`.
//! - [`logger`]: a memory ring that holds the defmt log (and, with `defmt-ring`, the global
//!   logger that writes it); [`panic`]: with `panic-handler`, report and halt.
//! - [`firmware`]: the firmware's logic, generic over the platform, so that the host tests run
//!   the same function against the emulated NIC that the soft-core runs against the card.
#![no_std]
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub use bluerdma_core as core;

/// Logs an error of this crate through defmt (feature `defmt`); otherwise only type-checks
/// the arguments. Plain `{}` placeholders only, so both paths accept the same strings.
macro_rules! fw_error {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::error!($($arg)*);
        #[cfg(not(feature = "defmt"))]
        { let _ = || { let _ = ::core::format_args!($($arg)*); }; }
    }};
}

/// Logs progress of this crate through defmt (feature `defmt`); see [`fw_error`].
macro_rules! fw_info {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::info!($($arg)*);
        #[cfg(not(feature = "defmt"))]
        { let _ = || { let _ = ::core::format_args!($($arg)*); }; }
    }};
}

pub mod clock;
pub mod dma;
pub mod firmware;
pub mod logger;
pub mod memory;
pub mod panic;
pub mod platform;
pub mod regs;
pub mod storage;

pub use platform::Baremetal;
