//! The blue-rdma core as firmware on the FPGA's soft processor (issue F fills this in):
//! register block at a fixed base, static DMA pools, spin locks, defmt logging.
#![no_std]
#![deny(missing_docs)]

pub use bluerdma_core as core;
