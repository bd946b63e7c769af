//! Linux platform of the blue-rdma driver: the thread-safe verbs API over the core engine
//! ([`verbs`]), its heap storage ([`storage`]), and (issues D and E) the out-of-band
//! channel over TCP and the real card's BAR0, DMA memory and pinning.
//!
//! Today the device behind the API is the emulated card of `bluerdma-sim`, running in
//! this process.
#![deny(missing_docs)]

pub use bluerdma_core as core;

pub mod bar;
pub mod card;
pub mod debug;
pub mod dma;
pub mod doctor;
pub mod paths;
pub mod pci;
pub mod storage;
pub mod umem;
pub mod verbs;

pub use verbs::{Context, Cq, DeviceSpec, Endpoint, Error, Mr, Pd, Qp};
