//! The driver engine (issue C): verbs on top of the rings, single-threaded and poll-driven,
//! with fixed capacities in caller-provided storage and no allocation.
//!
//! What the card does and what the driver must do is split as hardware-contract.md "Who
//! does what" says: the engine assigns PSNs and MSNs, cuts work requests into 64 KiB
//! chunks, answers READ requests with READ responses (after checking them: 12a), sends the
//! positive ACKs itself through the simple-NIC ring, retransmits on NAK or timeout, and
//! produces completions in posting order.

mod card_reset;
mod device;
mod error;
mod types;

pub use device::{
    Device, DeviceConfig, EarlyRecv, EngineStats, QpHandle, Slices, Storage, CHUNK_BYTES,
};
pub use error::VerbsError;
pub use types::*;
