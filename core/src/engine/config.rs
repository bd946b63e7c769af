//! How a device is set up and what it counts: [`DeviceConfig`], [`EngineStats`], the
//! engine's fixed sizes, and the list of DMA buffers [`Device::open`](super::Device::open)
//! allocates (platforms that carve DMA memory out of one block size it from that list).

use core::net::Ipv4Addr;
use core::ops::Range;

use crate::addr::PageSize;
use crate::desc::simple_nic::{RX_BUFFER_SIZE, RX_SLOT_SIZE};
use crate::keys::{MrKey, Qpn, MR_TABLE_LEN, PGT_LEN, QP_TABLE_LEN};
use crate::mac::MacAddr;
use crate::ring::{RING_ALIGN, RING_BYTES};
use crate::time::Nanos;

use super::error::VerbsError;

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

/// The parts of the card's tables one engine hands out: QP table indices, MR table indices
/// and page-table entries. Several engines share one card (a daemon multiplexes their rings
/// onto the card's single set) when each allocates only inside its own windows, which the
/// daemon assigns disjoint ([`TableWindows::split`]). QPNs and MR keys are
/// `(index << 8) | key8` ([`crate::keys`]): the window bounds the index.
///
/// The engine's storage still bounds what it can hold: an engine with `n` QP slots uses the
/// first `n` indices of its QP window (and so on for MRs); its storage slot `k` is card
/// index `window.start + k`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableWindows {
    /// QP table indices; inside `1..QP_TABLE_LEN` (index 0 is reserved by the card).
    pub qp_index: Range<u32>,
    /// MR table indices; inside `1..MR_TABLE_LEN` (index 0 is the card's "no MR", which
    /// the driver never hands out).
    pub mr_index: Range<u32>,
    /// Page-table entries (the `pgt_offset` ranges of MRs); inside `0..PGT_LEN`.
    pub pgt: Range<u32>,
}

impl TableWindows {
    /// The whole card, what an engine alone on its card uses: QP indices 1..1024, MR indices
    /// 1..8192, page-table entries 0..131072.
    pub const WHOLE: TableWindows = TableWindows {
        qp_index: 1..QP_TABLE_LEN,
        mr_index: 1..MR_TABLE_LEN,
        pgt: 0..PGT_LEN,
    };

    /// Whether the QP table index of `qpn` is in the QP window.
    #[inline]
    pub fn contains_qpn(&self, qpn: Qpn) -> bool {
        self.qp_index.contains(&qpn.index())
    }

    /// Whether the MR table index of `key`, as the card decodes it ([`MrKey::index`]), is in
    /// the MR window.
    #[inline]
    pub fn contains_mr_key(&self, key: MrKey) -> bool {
        self.mr_index.contains(&key.index())
    }

    /// Whether the page-table entries `r` lie in the page-table window (an empty `r` does
    /// if its bounds do; a reversed one never).
    #[inline]
    pub fn contains_pgt(&self, r: Range<u32>) -> bool {
        r.start <= r.end && self.pgt.start <= r.start && r.end <= self.pgt.end
    }

    /// Slot `i` of `n` equal slices of the whole card: each table is cut into `n` parts of
    /// `len / n` entries (a remainder at the end stays unused), and slot 0 leaves out the
    /// reserved QP and MR index 0. `None` if `i >= n` or a slice would be empty. `split(1,
    /// 0)` is [`TableWindows::WHOLE`].
    pub fn split(n: u32, i: u32) -> Option<TableWindows> {
        if i >= n {
            return None;
        }
        let slice = |len: u32, whole: Range<u32>| -> Option<Range<u32>> {
            let part = len / n;
            let (start, end) = (part * i, part * (i + 1));
            let r = start.max(whole.start)..end.min(whole.end);
            (r.start < r.end).then_some(r)
        };
        Some(TableWindows {
            qp_index: slice(QP_TABLE_LEN, Self::WHOLE.qp_index)?,
            mr_index: slice(MR_TABLE_LEN, Self::WHOLE.mr_index)?,
            pgt: slice(PGT_LEN, Self::WHOLE.pgt)?,
        })
    }

    /// Checks that every window is non-empty and inside [`TableWindows::WHOLE`] (what
    /// [`Device::open`](super::Device::open) refuses otherwise).
    pub fn validate(&self) -> Result<(), VerbsError> {
        let bad = |what| Err(VerbsError::InvalidArgument { what });
        let whole = Self::WHOLE;
        let inside = |r: &Range<u32>, w: &Range<u32>| w.start <= r.start && r.end <= w.end;
        if self.qp_index.is_empty() {
            return bad("table windows: the QP window is empty");
        }
        if !inside(&self.qp_index, &whole.qp_index) {
            return bad("table windows: the QP window is outside the card's QP indices 1..1024");
        }
        if self.mr_index.is_empty() {
            return bad("table windows: the MR window is empty");
        }
        if !inside(&self.mr_index, &whole.mr_index) {
            return bad("table windows: the MR window is outside the card's MR indices 1..8192");
        }
        if self.pgt.is_empty() {
            return bad("table windows: the page-table window is empty");
        }
        if !inside(&self.pgt, &whole.pgt) {
            return bad("table windows: the page-table window is outside the card's 0..131072");
        }
        Ok(())
    }

    /// The storage slots usable for QPs: those of a storage of `slots` that the window
    /// has card indices for.
    #[inline]
    pub(crate) fn qp_slots(&self, slots: usize) -> usize {
        slots.min(self.qp_index.len())
    }

    /// The QPN of storage slot `slot` with key byte `key`; `None` past the window.
    #[inline]
    pub(crate) fn qpn_of_slot(&self, slot: usize, key: u8) -> Option<Qpn> {
        card_index(&self.qp_index, slot).and_then(|index| Qpn::new(index, key))
    }

    /// The storage slot of the QP table index of `qpn`; `None` outside the window.
    #[inline]
    pub(crate) fn qp_slot(&self, qpn: Qpn) -> Option<usize> {
        slot_of(&self.qp_index, qpn.index())
    }

    /// The storage slots usable for MRs (as [`TableWindows::qp_slots`]).
    #[inline]
    pub(crate) fn mr_slots(&self, slots: usize) -> usize {
        slots.min(self.mr_index.len())
    }

    /// The MR key of storage slot `slot` with key byte `key`; `None` past the window.
    #[inline]
    pub(crate) fn mr_key_of_slot(&self, slot: usize, key: u8) -> Option<MrKey> {
        card_index(&self.mr_index, slot).and_then(|index| MrKey::new(index, key))
    }

    /// The storage slot of the MR table index of `key` (any key byte); `None` outside the
    /// window.
    #[inline]
    pub(crate) fn mr_slot(&self, key: MrKey) -> Option<usize> {
        slot_of(&self.mr_index, key.index())
    }
}

/// The card index of storage slot `slot` in `window`.
#[inline]
fn card_index(window: &Range<u32>, slot: usize) -> Option<u32> {
    u32::try_from(slot)
        .ok()
        .and_then(|k| window.start.checked_add(k))
        .filter(|index| *index < window.end)
}

/// The storage slot of card index `index` in `window`.
#[inline]
fn slot_of(window: &Range<u32>, index: u32) -> Option<usize> {
    window
        .contains(&index)
        .then(|| (index - window.start) as usize)
}

/// How the device is set up.
#[derive(Clone, Debug)]
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
    /// The parts of the card's tables this engine allocates in (the whole card unless
    /// several engines share it).
    pub windows: TableWindows,
    /// Where the sequence of key bytes (the low byte of every QPN and MR key) starts. Engines
    /// that share a card one after another in the same window start apart, so that a record
    /// or packet meant for a QP of the one before does not name a QP of the next.
    pub key_seed: u32,
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
            windows: TableWindows::WHOLE,
            key_seed: 0x5A,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_slices_halve_each_table_and_leave_out_the_reserved_indices() {
        let a = TableWindows::split(2, 0).unwrap();
        let b = TableWindows::split(2, 1).unwrap();
        assert_eq!(
            (a.qp_index.clone(), b.qp_index.clone()),
            (1..512, 512..1024)
        );
        assert_eq!(
            (a.mr_index.clone(), b.mr_index.clone()),
            (1..4096, 4096..8192)
        );
        assert_eq!((a.pgt.clone(), b.pgt.clone()), (0..65536, 65536..131_072));
        assert_eq!(TableWindows::split(1, 0), Some(TableWindows::WHOLE));
        assert_eq!(TableWindows::split(2, 2), None);
        assert_eq!(TableWindows::split(0, 0), None);
        // 1024 slices: slot 0's QP slice would be index 0 only.
        assert_eq!(TableWindows::split(1024, 0), None);
        assert_eq!(TableWindows::split(1024, 1).unwrap().qp_index, 1..2);
        assert_eq!(TableWindows::split(1025, 1), None, "slices of no QP index");
        // Three slices: equal, the remainder unused.
        let c = TableWindows::split(3, 2).unwrap();
        assert_eq!((c.qp_index, c.mr_index), (682..1023, 5460..8190));
        for n in 1..=16 {
            for i in 0..n {
                let w = TableWindows::split(n, i).unwrap();
                assert_eq!(w.validate(), Ok(()), "{n} {i}");
            }
        }
    }

    #[test]
    fn a_window_contains_the_handles_of_its_indices_only() {
        let w = TableWindows::split(2, 1).unwrap();
        let qpn = |i| Qpn::new(i, 0xAB).unwrap();
        assert!(w.contains_qpn(qpn(512)) && w.contains_qpn(qpn(1023)));
        assert!(!w.contains_qpn(qpn(511)));
        // A raw QPN above the card's 10 bits is no index of any window.
        assert!(!w.contains_qpn(Qpn::from_raw(1030 << 8)));
        assert!(w.contains_mr_key(MrKey::new(4096, 0).unwrap()));
        assert!(!w.contains_mr_key(MrKey::new(4095, 0xFF).unwrap()));
        // The card decodes 13 index bits: bits above them do not move a key into the window.
        assert!(!w.contains_mr_key(MrKey::from_raw((1 << 21) | (1 << 8))));
        assert!(w.contains_pgt(65536..65600) && w.contains_pgt(131_000..131_072));
        assert!(!w.contains_pgt(65535..65600) && !w.contains_pgt(131_000..131_073));
        assert!(w.contains_pgt(70_000..70_000));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 70_001..70_000;
        assert!(!w.contains_pgt(reversed));
    }

    #[test]
    fn slots_map_to_the_window_and_back() {
        let w = TableWindows {
            qp_index: 10..13,
            mr_index: 100..102,
            pgt: 0..1,
        };
        assert_eq!(w.qpn_of_slot(0, 7), Qpn::new(10, 7));
        assert_eq!(w.qpn_of_slot(2, 7), Qpn::new(12, 7));
        assert_eq!(w.qpn_of_slot(3, 7), None);
        assert_eq!(w.qp_slot(Qpn::new(12, 1).unwrap()), Some(2));
        assert_eq!(w.qp_slot(Qpn::new(13, 1).unwrap()), None);
        assert_eq!(w.qp_slot(Qpn::new(9, 1).unwrap()), None);
        assert_eq!((w.qp_slots(8), w.qp_slots(2)), (3, 2));
        assert_eq!(w.mr_key_of_slot(1, 9), MrKey::new(101, 9));
        assert_eq!(w.mr_key_of_slot(2, 9), None);
        assert_eq!(w.mr_slot(MrKey::new(100, 3).unwrap()), Some(0));
        assert_eq!(w.mr_slot(MrKey::new(0, 3).unwrap()), None);
        // The whole card: QP slot i is index i + 1, MR slot i index i + 1.
        let whole = TableWindows::WHOLE;
        assert_eq!(whole.qpn_of_slot(0, 0xB7).map(Qpn::get), Some(0x01B7));
        assert_eq!(whole.qpn_of_slot(1022, 0), Qpn::new(1023, 0));
        assert_eq!(whole.qpn_of_slot(1023, 0), None);
        assert_eq!(whole.mr_key_of_slot(0, 6).map(MrKey::get), Some(0x0106));
        assert_eq!(whole.mr_slots(usize::MAX), 8191);
    }

    #[test]
    fn validation_names_the_window_that_is_wrong() {
        let whole = TableWindows::WHOLE;
        let what = |w: TableWindows| match w.validate() {
            Err(VerbsError::InvalidArgument { what }) => what,
            r => panic!("{w:?}: {r:?}"),
        };
        let empty_qp = TableWindows {
            qp_index: 3..3,
            ..whole.clone()
        };
        assert!(what(empty_qp).contains("QP window is empty"));
        let reserved = TableWindows {
            qp_index: 0..3,
            ..whole.clone()
        };
        assert!(what(reserved).contains("QP window is outside"));
        let mr = TableWindows {
            mr_index: 1..8193,
            ..whole.clone()
        };
        assert!(what(mr).contains("MR window is outside"));
        let pgt = TableWindows {
            pgt: 0..0,
            ..whole.clone()
        };
        assert!(what(pgt).contains("page-table window is empty"));
        assert_eq!(whole.validate(), Ok(()));
    }
}
