//! The no_std, allocation-free core of the open-rdma (blue-rdma) NIC driver.
//!
//! Everything that does not depend on where the driver runs lives here: the hardware
//! contract (register map, ring pointers, descriptors, wire headers), the QP state
//! machine, transport bookkeeping (PSN/MSN, bitmaps, fragmentation) and the codec of the
//! out-of-band channel. The world is reached only through the small traits of
//! [`platform`]; time is passed in, never read from a clock.
//!
//! Normative sources: `shared/spec/hardware-contract.md` (its numbered corrections win),
//! `shared/spec/layout-verification.md` (bit-exact layouts and golden vectors) and
//! `shared/spec/oob-channel.md`.
#![no_std]
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(test)]
extern crate std;

#[macro_use]
pub mod log;

pub mod addr;
pub mod desc;
pub mod engine;
pub mod keys;
pub mod mac;
pub mod mtu;
pub mod oob;
pub mod platform;
pub mod qp;
pub mod regs;
pub mod ring;
pub mod time;
pub mod transport;
pub mod wire;
