//! Transport bookkeeping: what the driver, not the card, keeps track of per QP
//! (hardware-contract.md "Who does what").
//!
//! - [`psn`] and [`msn`]: the 24-bit and 16-bit sequence numbers and their modular order.
//! - [`bitmap`]: receive and acknowledgement bitmaps anchored at a base PSN, and the card's
//!   "-112" convention for the bitmaps it reports.
//! - [`fragmenter`]: a work request cut into send chunks (at most 64 KiB, ending on
//!   PMTU-aligned remote addresses, never across 4 GiB) and, for retransmission, into
//!   single packets.

pub mod bitmap;
pub mod fragmenter;
pub mod msn;
pub mod psn;

pub use bitmap::{card_bitmap_base, PsnBitmap};
pub use fragmenter::{num_packets, Chunk, FragmentError, Fragmenter, PacketFragmenter, WrSpan};
pub use msn::Msn;
pub use psn::{Psn, PsnRange, PSN_MASK};
