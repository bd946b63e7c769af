//! The bounded send queues of the OOB channel: encoded records per peer, filled by
//! `send` on the caller's thread and taken by the connection state machine
//! ([`super::machine::Machine::take_outbox`]) when the peer's connection can carry them.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bluerdma_core::oob::{RecordKind, RECV_WR_LEN};

/// The peer's queue already holds its limit of records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueueFull;

/// Records per peer not yet handed to a connection, at most `max_records` per peer.
#[derive(Debug)]
pub(super) struct Outbox {
    queues: HashMap<Ipv4Addr, Vec<u8>>,
    max_bytes: usize,
}

impl Outbox {
    pub(super) fn new(max_records: usize) -> Self {
        Outbox {
            queues: HashMap::new(),
            max_bytes: max_records.saturating_mul(RECV_WR_LEN),
        }
    }

    /// Appends one encoded record for `peer`, or refuses it when the peer's queue is full.
    pub(super) fn push(
        &mut self,
        peer: Ipv4Addr,
        record: &[u8; RECV_WR_LEN],
    ) -> Result<(), QueueFull> {
        let queue = self.queues.entry(peer).or_default();
        if queue.len() >= self.max_bytes {
            return Err(QueueFull);
        }
        queue.extend_from_slice(record);
        Ok(())
    }

    /// Drops what is queued for `peer`; returns how many records that was.
    pub(super) fn drop_peer(&mut self, peer: Ipv4Addr) -> usize {
        self.queues
            .remove(&peer)
            .map_or(0, |q| q.len() / RECV_WR_LEN)
    }

    /// Records queued for `peer`.
    #[cfg(test)]
    pub(super) fn queued(&self, peer: Ipv4Addr) -> usize {
        self.queues.get(&peer).map_or(0, |q| q.len() / RECV_WR_LEN)
    }

    /// Calls `take` for every peer with records queued, which may take some or all of them
    /// (whole records, from the front); forgets the queues left empty.
    pub(super) fn drain_with(&mut self, mut take: impl FnMut(Ipv4Addr, &mut Vec<u8>)) {
        for (peer, queued) in self.queues.iter_mut() {
            if !queued.is_empty() {
                take(*peer, queued);
            }
        }
        self.queues.retain(|_, queued| !queued.is_empty());
    }
}

/// Removes the receive-WR-too-short records from `queued` (whole 32-byte records, kept in
/// order otherwise), for a peer that did not announce them; returns how many.
pub(super) fn withhold_too_short(queued: &mut Vec<u8>) -> u64 {
    let too_short = (RecordKind::RecvTooShort as u32).to_be_bytes();
    let is_too_short = |r: &[u8]| r.get(28..RECV_WR_LEN) == Some(&too_short[..]);
    let n = queued
        .chunks_exact(RECV_WR_LEN)
        .filter(|r| is_too_short(r))
        .count();
    if n > 0 {
        let kept: Vec<u8> = queued
            .chunks_exact(RECV_WR_LEN)
            .filter(|r| !is_too_short(r))
            .flatten()
            .copied()
            .collect();
        *queued = kept;
    }
    n as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use bluerdma_core::oob::{RecvTooShort, RecvWr};

    const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn wr(i: u64) -> [u8; RECV_WR_LEN] {
        RecvWr {
            wr_id: i,
            ..RecvWr::default()
        }
        .to_bytes()
        .unwrap()
    }

    #[test]
    fn a_peer_queue_refuses_records_beyond_its_bound_and_other_peers_are_not_affected() {
        let mut outbox = Outbox::new(3);
        for i in 0..3 {
            assert_eq!(outbox.push(PEER, &wr(i)), Ok(()));
        }
        assert_eq!(outbox.push(PEER, &wr(3)), Err(QueueFull));
        assert_eq!(outbox.push(Ipv4Addr::new(10, 0, 0, 3), &wr(3)), Ok(()));
        assert_eq!(outbox.queued(PEER), 3);
        // Taking one record frees one place.
        outbox.drain_with(|peer, q| {
            if peer == PEER {
                q.drain(..RECV_WR_LEN);
            }
        });
        assert_eq!(outbox.push(PEER, &wr(4)), Ok(()));
        assert_eq!(outbox.drop_peer(PEER), 3);
        assert_eq!(outbox.queued(PEER), 0);
    }

    #[test]
    fn withholding_too_short_records_keeps_the_others_in_order() {
        let short = RecvTooShort {
            wr_id: 7,
            send_len: 9,
            qpn: 1,
        }
        .to_bytes()
        .unwrap();
        let mut q = [wr(1), short, wr(2), short, wr(3)].concat();
        assert_eq!(withhold_too_short(&mut q), 2);
        assert_eq!(q, [wr(1), wr(2), wr(3)].concat());
        assert_eq!(withhold_too_short(&mut q), 0);
    }
}
