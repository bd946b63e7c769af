//! The emulated blue-rdma NIC (issue B fills this in): a behavioural model of the card that
//! honours the same hardware contract as the real one, and the adapters that attach the
//! driver to it in-process or over the RTL simulator's socket protocol.
#![deny(missing_docs)]

pub use bluerdma_core as core;
