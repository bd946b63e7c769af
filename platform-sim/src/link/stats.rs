//! Counters of one port on the link, shared by the port and every wrapper around it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One counter of [`LinkStats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkCounter {
    /// Frames put on the wire by the transport (after fault injection: dropped frames are
    /// not counted, duplicates are counted twice).
    FramesSent,
    /// Frames delivered to the port's owner by `recv_frames`.
    FramesReceived,
    /// Frames dropped by fault injection.
    FramesDropped,
    /// Extra copies sent by fault injection.
    FramesDuplicated,
    /// Frames that fault injection held back and that a later frame overtook.
    FramesReordered,
    /// Frames with a byte flipped by fault injection.
    FramesCorrupted,
    /// Frames not sent because their destination is not a reachable card: not IPv4, too
    /// short to carry an IPv4 destination, an address outside 127.0.0.0/8 (UDP), no card
    /// attached at that address (memory hub), or refused by the peer's host.
    FramesUnroutable,
    /// Frames not sent because they do not fit in one datagram.
    FramesOversize,
    /// Datagrams sent by the UDP transport (each carries one or more frames).
    DatagramsSent,
    /// Well-formed datagrams received by the UDP transport.
    DatagramsReceived,
    /// Received datagrams that were malformed (bad magic or version, truncated record,
    /// trailing bytes) and dropped whole.
    BadDatagrams,
    /// Units lost because this port's receive queue was full: datagrams dropped by the
    /// kernel (UDP, from `SO_RXQ_OVFL`) or frames refused by a full queue (memory hub).
    RxQueueDrops,
    /// Frames of [`LinkCounter::FramesSent`] that went into a shared-memory ring.
    ShmFramesSent,
    /// Frames of [`LinkCounter::FramesReceived`] that came out of a shared-memory ring.
    ShmFramesReceived,
}

impl LinkCounter {
    /// Every counter, in the order of [`LinkStatsSnapshot`]'s fields.
    pub const ALL: [LinkCounter; 14] = [
        LinkCounter::FramesSent,
        LinkCounter::FramesReceived,
        LinkCounter::FramesDropped,
        LinkCounter::FramesDuplicated,
        LinkCounter::FramesReordered,
        LinkCounter::FramesCorrupted,
        LinkCounter::FramesUnroutable,
        LinkCounter::FramesOversize,
        LinkCounter::DatagramsSent,
        LinkCounter::DatagramsReceived,
        LinkCounter::BadDatagrams,
        LinkCounter::RxQueueDrops,
        LinkCounter::ShmFramesSent,
        LinkCounter::ShmFramesReceived,
    ];
}

/// The counters of one port: cheap to clone (clones share the counters), readable from any
/// thread at any time. A port and the wrappers around it ([`super::FaultyLink`],
/// [`super::CapturingLink`]) count into the same `LinkStats`, reached through
/// [`super::LinkPort::stats`].
#[derive(Clone, Default)]
pub struct LinkStats {
    counters: Arc<[AtomicU64; LinkCounter::ALL.len()]>,
}

impl LinkStats {
    /// A fresh set of counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` to `counter`.
    pub fn add(&self, counter: LinkCounter, n: u64) {
        // Counters are statistics: no ordering with other memory is implied.
        self.slot(counter).fetch_add(n, Ordering::Relaxed);
    }

    /// The current value of `counter`.
    pub fn get(&self, counter: LinkCounter) -> u64 {
        self.slot(counter).load(Ordering::Relaxed)
    }

    /// Raises `counter` to `value` if it is lower (for counters the kernel keeps as a
    /// running total, such as `SO_RXQ_OVFL`).
    pub(crate) fn raise_to(&self, counter: LinkCounter, value: u64) {
        self.slot(counter).fetch_max(value, Ordering::Relaxed);
    }

    /// Every counter at one moment (each read is atomic; the set is not a single snapshot
    /// while traffic flows).
    pub fn snapshot(&self) -> LinkStatsSnapshot {
        use LinkCounter as C;
        LinkStatsSnapshot {
            frames_sent: self.get(C::FramesSent),
            frames_received: self.get(C::FramesReceived),
            frames_dropped: self.get(C::FramesDropped),
            frames_duplicated: self.get(C::FramesDuplicated),
            frames_reordered: self.get(C::FramesReordered),
            frames_corrupted: self.get(C::FramesCorrupted),
            frames_unroutable: self.get(C::FramesUnroutable),
            frames_oversize: self.get(C::FramesOversize),
            datagrams_sent: self.get(C::DatagramsSent),
            datagrams_received: self.get(C::DatagramsReceived),
            bad_datagrams: self.get(C::BadDatagrams),
            rx_queue_drops: self.get(C::RxQueueDrops),
            shm_frames_sent: self.get(C::ShmFramesSent),
            shm_frames_received: self.get(C::ShmFramesReceived),
        }
    }

    fn slot(&self, counter: LinkCounter) -> &AtomicU64 {
        // The array has one slot per variant, in declaration order, so the index is in bounds.
        &self.counters[counter as usize]
    }
}

impl fmt::Debug for LinkStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// The values of every [`LinkCounter`] (see there for their meaning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // each field is documented by the LinkCounter variant of the same name
pub struct LinkStatsSnapshot {
    pub frames_sent: u64,
    pub frames_received: u64,
    pub frames_dropped: u64,
    pub frames_duplicated: u64,
    pub frames_reordered: u64,
    pub frames_corrupted: u64,
    pub frames_unroutable: u64,
    pub frames_oversize: u64,
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub bad_datagrams: u64,
    pub rx_queue_drops: u64,
    pub shm_frames_sent: u64,
    pub shm_frames_received: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_counters_and_snapshot_names_each_one() {
        let stats = LinkStats::new();
        let other = stats.clone();
        for (i, counter) in LinkCounter::ALL.into_iter().enumerate() {
            other.add(counter, i as u64 + 1);
        }
        let s = stats.snapshot();
        let values = [
            s.frames_sent,
            s.frames_received,
            s.frames_dropped,
            s.frames_duplicated,
            s.frames_reordered,
            s.frames_corrupted,
            s.frames_unroutable,
            s.frames_oversize,
            s.datagrams_sent,
            s.datagrams_received,
            s.bad_datagrams,
            s.rx_queue_drops,
            s.shm_frames_sent,
            s.shm_frames_received,
        ];
        assert_eq!(values, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    }

    #[test]
    fn raise_to_never_lowers() {
        let stats = LinkStats::new();
        stats.raise_to(LinkCounter::RxQueueDrops, 7);
        stats.raise_to(LinkCounter::RxQueueDrops, 3);
        assert_eq!(stats.get(LinkCounter::RxQueueDrops), 7);
    }
}
