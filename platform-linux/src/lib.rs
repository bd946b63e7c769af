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
//! The verbs API runs today over the emulated card of `bluerdma-sim`, in this process;
//! [`card::open_card`] gives the parts the engine needs for the real card.
#![deny(missing_docs)]

pub use bluerdma_core as core;

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
pub mod perf;
pub mod scenarios;
pub mod storage;
pub mod umem;
pub mod verbs;

pub use verbs::{Context, Cq, DeviceSpec, Endpoint, Error, Mr, Pd, Qp};
