//! Linux platform of the blue-rdma driver: the thread-safe verbs API over the core engine
//! ([`verbs`]), its heap storage ([`storage`]), and the real card's side of the platform
//! (issue E):
//! - [`pci`]: finding the card in sysfs; [`bar`]: BAR0 (`resource0`) as register access;
//! - [`dma`]: DMA memory from u-dma-buf or 2 MiB hugepages;
//! - [`umem`]: pinning and pagemap translation of registered memory;
//! - [`card`]: all of it opened at once as the core's platform; [`doctor`]: host checks
//!   with fixes (the `bluerdma-doctor` binary); [`paths`]: where sysfs, procfs and /dev are.
//!
//! Send/Recv (issue D): [`oob`] is the out-of-band TCP channel that carries receive WRs
//! between drivers; [`devices`] is the list of devices (names, IPs, MACs) on this host.
//!
//! One [`Context`] type runs on every backend ([`backend`]): the PCI card
//! ([`card::open_card`]), the RTL simulator's sockets (feature `rtl`) and the emulated card
//! of `bluerdma-sim` in this process (feature `emulator`, the default device). The device
//! list names each device's backend ([`devices`]). Without default features the crate
//! builds without `bluerdma-sim`: the card is the only backend.
#![deny(missing_docs)]

pub use bluerdma_core as core;

pub mod backend;
pub mod bar;
pub mod card;
pub mod debug;
pub mod devices;
pub mod dma;
pub mod doctor;
pub mod oob;
pub mod oob_hub;
pub mod paths;
pub mod pci;
#[cfg(feature = "emulator")]
pub mod perf;
#[cfg(feature = "emulator")]
pub mod scenarios;
#[cfg(feature = "emulator")]
pub mod shared;
pub mod stderr_log;
pub mod storage;
pub mod umem;
pub mod verbs;

pub use backend::{BackendKind, OpenError};
pub use verbs::{Context, Cq, DeviceSpec, Endpoint, Error, Mr, Pd, Qp};
