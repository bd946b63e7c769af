//! The RTL simulator's socket protocol (`shared/spec/rtl-sim-protocol.md`, corrected by
//! `shared/spec/nic-behaviour.md` section 8), both sides of it.
//!
//! The driver side ([`CsrClient`], [`DmaClient`]) lets a driver built here run against the
//! real cocotb/Verilator simulator unchanged; the card side ([`CsrServer`], [`DmaServer`])
//! lets the emulated NIC serve the same protocol, so the path is tested without the RTL.
//! The Ethernet links ([`TwoCardLink`], [`SoftSwitchLink`], [`SoftSwitch`]) join simulated
//! and emulated cards. All traffic stays on 127.0.0.1; every port is configurable and the
//! defaults follow the spec. [`decode`] is the public entry point to the decoders of every
//! line the channels read (for the fuzz targets in `tests/fuzz`).

pub mod connect;
pub mod csr;
pub mod decode;
pub mod dma;
pub mod eth;
mod line;
mod listener;
pub mod soft_switch;

pub use connect::RetryPolicy;
pub use csr::{CsrClient, CsrClientConfig, CsrError, CsrServer, CsrServerStats, CsrTarget};
pub use dma::{BusWidth, DmaChannel, DmaClient, DmaClientConfig, DmaServer, DmaServerConfig};
pub use eth::{EthLinkStatus, SoftSwitchLink, TwoCardLink};
pub use soft_switch::{SoftSwitch, SoftSwitchConfig};
