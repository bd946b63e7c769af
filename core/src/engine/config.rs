//! How a device is set up and what it counts: [`DeviceConfig`], [`EngineStats`], the
//! engine's fixed sizes, and the list of DMA buffers [`Device::open`](super::Device::open)
//! allocates (platforms that carve DMA memory out of one block size it from that list).

use core::net::Ipv4Addr;

use crate::addr::PageSize;
use crate::desc::simple_nic::{RX_BUFFER_SIZE, RX_SLOT_SIZE};
use crate::mac::MacAddr;
use crate::ring::{RING_ALIGN, RING_BYTES};
use crate::time::Nanos;

/// Largest chunk the driver hands the card (64 KiB, ARCHITECTURE.md).
pub const CHUNK_BYTES: u32 = 64 * 1024;
/// Size of one ACK frame slot in the driver's simple-NIC TX buffer.
pub(crate) const ACK_SLOT: usize = 128;
/// ACK frame slots: one per simple-NIC TX ring entry, so a slot is reused only after the
/// card fetched 4096 later frames.
pub(crate) const ACK_SLOTS: usize = 4096;
/// Size of one raw frame slot ([`Device::send_raw`](super::Device::send_raw)): a whole
/// simple-NIC RX slot of the receiving card, the largest frame it takes.
pub const RAW_FRAME_MAX: usize = RX_SLOT_SIZE as usize;
/// Raw frame slots (512 KiB). Fewer than the ring's entries, so a slot is reused only
/// once the card is done with the frame it last held, checked against the ring's tail.
pub(crate) const RAW_SLOTS: usize = 256;
/// The ring's tail counts descriptors fetched, not executed (nic-behaviour.md 6.2): the
/// card reads a frame's bytes after it fetched the descriptor, and fetches the next batch
/// (16 descriptors on the RTL, 64 on the emulated card) only once the batch before is
/// done. A raw frame's slot is free once the card has fetched this many descriptors
/// beyond it.
pub(crate) const RAW_FETCH_MARGIN: u64 = 128;
const _: () = assert!(RAW_SLOTS as u64 > RAW_FETCH_MARGIN);
/// Page-table updates in flight at once: each owns one slot of the staging buffer until
/// the card has answered it (the card reads the entries when it executes the command).
pub(crate) const PGT_STAGING_SLOTS: usize = 8;
/// Bytes of one staging slot: the card wants each update's entries 512-byte aligned
/// (`desc::pgt::check_staging`); 16 entries of 8 bytes fill 128 of them.
pub(crate) const PGT_STAGING_SLOT: usize = 512;
/// Most PSNs in flight per QP, whatever `DeviceConfig::send_window` says: seven of the
/// card's 16-PSN strides. The peer card's window spans the 128 PSNs below the top of its
/// newest stride (nic-behaviour.md 3.3); with at most 112 PSNs past the oldest
/// unacknowledged one, a go-back-N resend from there is never 8 strides behind the newest
/// PSN sent, so the card merges it instead of ignoring it as stale.
pub const SEND_WINDOW_CAP: u32 = crate::transport::bitmap::CARD_PSN_NOW_BIT;
/// Descriptors gathered before one doorbell.
pub(crate) const BATCH: usize = 64;

/// What one DMA buffer of [`Device::open`](super::Device::open) is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaNeed {
    /// Its use.
    pub what: &'static str,
    /// Length in bytes.
    pub len: usize,
    /// Alignment in bytes.
    pub align: usize,
}

const fn need(what: &'static str, len: usize, align: usize) -> DmaNeed {
    DmaNeed { what, len, align }
}

/// Every DMA buffer [`Device::open`](super::Device::open) allocates, in its order: the
/// six rings, the simple-NIC receive buffer, the page-table staging slots, the ACK frame
/// slots and the raw frame slots.
pub const OPEN_BUFFERS: [DmaNeed; 10] = [
    need("command request ring", RING_BYTES, RING_ALIGN),
    need("command response ring", RING_BYTES, RING_ALIGN),
    need("send ring", RING_BYTES, RING_ALIGN),
    need("meta report ring", RING_BYTES, RING_ALIGN),
    need("simple-NIC TX ring", RING_BYTES, RING_ALIGN),
    need("simple-NIC RX ring", RING_BYTES, RING_ALIGN),
    need("simple-NIC RX buffer", RX_BUFFER_SIZE as usize, 2 << 20),
    need(
        "page-table staging",
        PGT_STAGING_SLOT * PGT_STAGING_SLOTS,
        4096,
    ),
    need("ACK frame slots", ACK_SLOT * ACK_SLOTS, 4096),
    need("raw frame slots", RAW_FRAME_MAX * RAW_SLOTS, 4096),
];

/// How the device is set up.
#[derive(Clone, Copy, Debug)]
pub struct DeviceConfig {
    /// The card's MAC.
    pub mac: MacAddr,
    /// The card's IPv4 address.
    pub ip: Ipv4Addr,
    /// Netmask.
    pub netmask: Ipv4Addr,
    /// Gateway.
    pub gateway: Ipv4Addr,
    /// Translation page size; must match the card (correction 8).
    pub page_size: PageSize,
    /// How long a command may take before it fails with
    /// [`VerbsError::CommandTimeout`](super::VerbsError::CommandTimeout). A card answers in
    /// microseconds; a simulator behind a socket takes far longer (the backend sets it).
    pub command_timeout: Nanos,
    /// The least local ACK timeout of every QP, whatever its `timeout` attribute says
    /// (0: none). The application's timeout (14 = 67 ms) assumes a card; over the RTL
    /// simulator's DMA socket (about 2 MB/s) one 64 KiB message takes longer than that, and
    /// retransmitting it only adds load. The backend sets the floor.
    pub ack_timeout_min: Nanos,
    /// Packets in flight per QP before new work waits for ACKs.
    pub send_window: u32,
}

impl DeviceConfig {
    /// A configuration for a card at `ip` with `mac`.
    pub const fn new(mac: MacAddr, ip: Ipv4Addr) -> Self {
        Self {
            mac,
            ip,
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            gateway: Ipv4Addr::UNSPECIFIED,
            page_size: PageSize::Size2M,
            command_timeout: Nanos::from_millis(2_000),
            ack_timeout_min: Nanos(0),
            send_window: 1024,
        }
    }
}

/// Counters of everything the engine refused, dropped or retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Commands sent.
    pub commands: u64,
    /// Chunks (Seg0 + Seg1) posted to the send ring.
    pub chunks: u64,
    /// Meta reports handled.
    pub reports: u64,
    /// Reports that did not decode or named an unknown QP.
    pub bad_reports: u64,
    /// ACK frames sent.
    pub acks_sent: u64,
    /// NAK frames sent (a hole seen in the card's quiet report).
    pub naks_sent: u64,
    /// Retransmissions started (timeout or NAK).
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Retransmission timer expiries while the card had not yet fetched all of the QP's
    /// descriptors: the timer started again, no retry used, nothing resent.
    pub timeouts_queued: u64,
    /// READ requests refused (bad rkey, bounds or access: hardware-contract.md 12a).
    pub read_refused: u64,
    /// Access checks sent after a retransmission timeout (`access_check.rs`).
    pub access_checks: u64,
    /// Verdicts that refused one of our requests (it completed with the error).
    pub access_refused: u64,
    /// Remote invalidations asked of the peer for our SEND_WITH_INVs (`remote_inv.rs`).
    pub remote_invalidations: u64,
    /// Simple-NIC frames received.
    pub raw_frames: u64,
    /// Received simple-NIC frames dropped because no consumer asked for them
    /// ([`Device::set_keep_raw_frames`]).
    pub raw_dropped: u64,
    /// Simple-NIC RX descriptors that did not decode or named bytes outside their slot.
    pub raw_bad: u64,
    /// Raw frames sent ([`Device::send_raw`]).
    pub raw_sent: u64,
    /// Completions lost to a full CQ.
    pub cq_overruns: u64,
    /// Batches the send ring refused (their packets go out again by retransmission).
    pub send_refused: u64,
    /// Receive WRs announced to peers over the out-of-band channel.
    pub recvs_announced: u64,
    /// Receive WRs peers announced to us.
    pub recvs_received: u64,
    /// Announced receive WRs that matched no QP yet and waited for it to reach RTR.
    pub recvs_early: u64,
    /// Announced receive WRs dropped: no QP ever matched and the waiting list was full.
    pub recvs_dropped: u64,
    /// RNR timer expiries (a SEND waited for a receive WR).
    pub rnr_waits: u64,
    /// QPs whose peer's out-of-band connection broke (those with a SEND waiting for a
    /// receive WR went to ERR).
    pub peers_lost: u64,
    /// SENDs longer than the peer's receive WR (REM_INV_REQ_ERR here); the peer was told
    /// over the out-of-band channel if it takes receive-WR-too-short records.
    pub sends_too_long: u64,
    /// Receive WRs a peer found too short for its SEND: completed with LOC_LEN_ERR, their
    /// QP moved to ERR.
    pub recvs_too_short: u64,
    /// Messages that consume a receive WR (SEND, WRITE_WITH_IMM) that found none posted, or
    /// reached a QP in ERR: no completion.
    pub recvs_missing: u64,
    /// Atomic requests sent to peers (first time).
    pub atomics_sent: u64,
    /// Atomic requests sent again after a timeout.
    pub atomics_resent: u64,
    /// Atomic requests of peers executed here (or refused with an error reply).
    pub atomics_executed: u64,
    /// Resent atomic requests of peers answered from the kept reply (not executed again).
    pub atomic_duplicates: u64,
    /// Atomic requests of peers dropped: no connected QP, early, or resent too late.
    pub atomics_dropped: u64,
    /// Atomic replies that found no atomic waiting (a second reply to a resent request).
    pub atomic_replies_stale: u64,
}
