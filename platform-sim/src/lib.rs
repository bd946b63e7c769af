//! The emulated blue-rdma NIC: a behavioural model of the card that honours the same
//! hardware contract as the real one (`shared/spec/nic-behaviour.md`,
//! `shared/spec/hardware-contract.md`), the link that carries its Ethernet frames, and the
//! two ways to attach a driver to it: in-process (device addresses are the process's own)
//! and the RTL simulator's socket protocol (`shared/spec/rtl-sim-protocol.md`). [`pair`] steps
//! two driver engines and two cards in one thread on a virtual clock, for deterministic tests
//! of the transport.
#![deny(missing_docs)]

pub use bluerdma_core as core;

pub mod baseline;
pub mod inproc;
pub mod link;
pub mod mem;
pub mod model;
pub mod pair;
pub mod rawdrv;
pub mod rtl;
pub mod scenarios;
pub mod serve;
