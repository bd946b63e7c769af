//! The DMA channel: the simulated card's bus-master reads and writes of host memory, one JSON
//! line per data-bus beat.
//!
//! Protocol (`shared/spec/rtl-sim-protocol.md` "DMA", corrected by `nic-behaviour.md` sections
//! 8.3 and 8.6.1-2): the simulator listens on 127.0.0.1:(7002 + instance) (the loopback bench
//! on 7003) and the driver connects. The simulator sends, in issue order across all four DMA
//! channels:
//! - `{"type": "mem_write", "channel_id", "address" (first valid byte), "data" (byte values),
//!   "length" (= len(data))}`, no reply;
//! - `{"type": "mem_read", "channel_id", "address" (first byte of this beat), "length",
//!   "start_byte_index" (address & 3 on the first beat, else 0), "is_first", "is_last",
//!   "request_id" ("req_<channel>_<n>", n counting reads per channel from 0)}`, answered by
//!   `{"type": "mem_read_response", "channel_id", "request_id", "data", "start_byte_index",
//!   "is_first", "is_last"}`. A reply whose request_id is not the oldest outstanding one of
//!   its channel aborts the simulation.
//!
//! An access is split into beats by [`beats`]. [`DmaClient`] is the driver side (answers
//! requests from an [`AddressMap`](crate::mem::AddressMap)); [`DmaServer`] is the card side
//! the emulated NIC uses in serve mode.

mod client;
mod server;

pub use client::{DmaClient, DmaClientConfig, DmaClientStats};
pub use server::{DmaChannelPort, DmaLinkError, DmaServer, DmaServerConfig, DmaServerStats};

use serde::{Deserialize, Serialize};

/// The DMA port of instance N is `DMA_BASE_PORT + N`.
pub const DMA_BASE_PORT: u16 = 7002;

/// The DMA port of simulator instance `inst` (the loopback bench, instance 1, uses 7003).
pub const fn dma_port(inst: u8) -> u16 {
    DMA_BASE_PORT + inst as u16
}

/// The largest beat a peer may ask for; anything longer is a malformed message, not a
/// reason to allocate.
const MAX_BEAT_BYTES: usize = 4096;

/// One of the card's four DMA masters (`nic-behaviour.md` 8.3: 0 = send/meta ring 0 and
/// command rings, 1 = PGT updates, 2 = simple-NIC descriptors, 3 = simple-NIC frames; each
/// also carries one payload pipeline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DmaChannel(u8);

impl DmaChannel {
    /// Channel 0.
    pub const ZERO: DmaChannel = DmaChannel(0);
    /// How many channels the card has.
    pub const COUNT: u8 = 4;

    /// Channel `id`, if it exists.
    pub const fn new(id: u8) -> Option<Self> {
        if id < Self::COUNT {
            Some(DmaChannel(id))
        } else {
            None
        }
    }

    /// The channel number as sent in `channel_id`.
    pub const fn id(self) -> u8 {
        self.0
    }
}

/// The width of the simulated card's data bus, which sets the beat size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BusWidth {
    /// 256 bits, 32-byte beats (the simulated build, `BLUERDMA_DATA_BUS_WIDTH=256`).
    #[default]
    Bits256,
    /// 512 bits, 64-byte beats.
    Bits512,
}

impl BusWidth {
    /// Bytes per beat.
    pub const fn beat_bytes(self) -> usize {
        match self {
            BusWidth::Bits256 => 32,
            BusWidth::Bits512 => 64,
        }
    }
}

/// One beat of a DMA access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaBeat {
    /// Device address of the beat's first valid byte.
    pub address: u64,
    /// Where the beat's bytes start within the access.
    pub offset: usize,
    /// Valid bytes in the beat.
    pub length: usize,
    /// `address & 3` on the first beat, 0 on the others: the PCIe stream is 4-byte aligned,
    /// so the first beat carries this many filler bytes before the data.
    pub start_byte_index: u8,
    /// The first beat of the access.
    pub is_first: bool,
    /// The last beat of the access.
    pub is_last: bool,
}

/// Splits an access of `len` bytes at `addr` into beats the way the simulator's PCIe model
/// does (`nic-behaviour.md` 8.3): the first beat holds `min(len, beat - (addr & 3))` bytes,
/// every later one `min(rest, beat)`. An empty access has no beats.
pub fn beats(addr: u64, len: usize, bus: BusWidth) -> impl Iterator<Item = DmaBeat> {
    let beat_bytes = bus.beat_bytes();
    let mut offset = 0usize;
    std::iter::from_fn(move || {
        if offset >= len {
            return None;
        }
        let is_first = offset == 0;
        let start_byte_index = if is_first { (addr & 3) as u8 } else { 0 };
        let length = (len - offset).min(beat_bytes - usize::from(start_byte_index));
        let beat = DmaBeat {
            address: addr.wrapping_add(offset as u64),
            offset,
            length,
            start_byte_index,
            is_first,
            is_last: offset + length == len,
        };
        offset += length;
        Some(beat)
    })
}

/// The `request_id` of read number `n` on `channel`.
fn request_id(channel: DmaChannel, n: u64) -> String {
    format!("req_{}_{n}", channel.id())
}

/// A request from the simulator, as the driver receives it: `mem_write` carries `data` and
/// `length`, `mem_read` carries `length`, `request_id` and the beat flags. One flat struct
/// parses in a single pass (serde's internally tagged enums buffer the whole object first).
#[derive(Debug, Deserialize)]
pub(crate) struct SimRequest {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) channel_id: u32,
    pub(crate) address: u64,
    pub(crate) length: usize,
    #[serde(default)]
    pub(crate) data: Option<Vec<u8>>,
    #[serde(default)]
    pub(crate) start_byte_index: u32,
    #[serde(default = "yes")]
    pub(crate) is_first: bool,
    #[serde(default = "yes")]
    pub(crate) is_last: bool,
    #[serde(default)]
    pub(crate) request_id: Option<String>,
}

fn yes() -> bool {
    true
}

/// A `mem_write` beat as the card sends it (fields in the simulator's order).
#[derive(Serialize)]
pub(crate) struct MemWriteMsg<'a> {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) channel_id: u8,
    pub(crate) address: u64,
    pub(crate) data: &'a [u8],
    pub(crate) length: usize,
}

/// A `mem_read` beat as the card sends it (fields in the simulator's order).
#[derive(Serialize)]
pub(crate) struct MemReadMsg<'a> {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) channel_id: u8,
    pub(crate) address: u64,
    pub(crate) length: usize,
    pub(crate) start_byte_index: u8,
    pub(crate) is_first: bool,
    pub(crate) is_last: bool,
    pub(crate) request_id: &'a str,
}

/// The driver's answer to a `mem_read` beat.
#[derive(Serialize)]
pub(crate) struct MemReadResponse<'a> {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) channel_id: u32,
    pub(crate) request_id: &'a str,
    pub(crate) data: &'a [u8],
    pub(crate) start_byte_index: u32,
    pub(crate) is_first: bool,
    pub(crate) is_last: bool,
}

/// The fields of a read reply the card checks; the others are optional on the wire.
#[derive(Deserialize)]
pub(crate) struct ReadReply {
    pub(crate) channel_id: u32,
    pub(crate) request_id: String,
    pub(crate) data: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(addr: u64, len: usize) -> Vec<(u64, usize, usize, u8, bool, bool)> {
        beats(addr, len, BusWidth::Bits256)
            .map(|b| {
                (
                    b.address,
                    b.offset,
                    b.length,
                    b.start_byte_index,
                    b.is_first,
                    b.is_last,
                )
            })
            .collect()
    }

    #[test]
    fn first_beat_is_shortened_by_the_misalignment() {
        assert_eq!(split(0x1003, 1), vec![(0x1003, 0, 1, 3, true, true)]);
        assert_eq!(split(0x1001, 31), vec![(0x1001, 0, 31, 1, true, true)]);
        assert_eq!(
            split(0x1002, 31),
            vec![
                (0x1002, 0, 30, 2, true, false),
                (0x1020, 30, 1, 0, false, true)
            ]
        );
        assert_eq!(
            split(0x1000, 100),
            vec![
                (0x1000, 0, 32, 0, true, false),
                (0x1020, 32, 32, 0, false, false),
                (0x1040, 64, 32, 0, false, false),
                (0x1060, 96, 4, 0, false, true),
            ]
        );
        assert!(split(0x1000, 0).is_empty());
    }

    #[test]
    fn wide_bus_uses_64_byte_beats() {
        let b: Vec<_> = beats(0x2001, 130, BusWidth::Bits512).collect();
        let lengths: Vec<_> = b.iter().map(|b| b.length).collect();
        assert_eq!(lengths, vec![63, 64, 3]);
        assert_eq!(b[1].address, 0x2040);
    }

    #[test]
    fn request_messages_carry_the_simulators_fields_in_order() {
        let msg = MemReadMsg {
            kind: "mem_read",
            channel_id: 2,
            address: 0x1003,
            length: 29,
            start_byte_index: 3,
            is_first: true,
            is_last: false,
            request_id: &request_id(DmaChannel(2), 7),
        };
        assert_eq!(
            serde_json::to_string(&msg).unwrap(),
            r#"{"type":"mem_read","channel_id":2,"address":4099,"length":29,"start_byte_index":3,"is_first":true,"is_last":false,"request_id":"req_2_7"}"#
        );
        let parsed: SimRequest = serde_json::from_str(
            r#"{"type": "mem_write", "channel_id": 1, "address": 16, "data": [1, 255], "length": 2}"#,
        )
        .unwrap();
        assert_eq!(parsed.kind, "mem_write");
        assert_eq!(
            (parsed.channel_id, parsed.address, parsed.length),
            (1, 16, 2)
        );
        assert_eq!(parsed.data.as_deref(), Some(&[1u8, 255][..]));
        assert!(serde_json::from_str::<SimRequest>(
            r#"{"type": "mem_write", "channel_id": 1, "address": 16, "data": [256], "length": 1}"#
        )
        .is_err());
    }
}
