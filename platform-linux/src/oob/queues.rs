//! The bounded send queues of the OOB channel: encoded records per peer, filled by
//! `send` on the caller's thread and taken by the connection state machine
//! ([`super::machine::Machine::take_outbox`]) when the peer's connection can carry them,
//! and [`withhold`], which takes out what a peer did not announce it takes.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bluerdma_core::oob::{AtomicRequest, Capabilities, CheckOp, RecordKind, RECV_WR_LEN};

/// The peer's queue already holds its limit of records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueueFull;

/// Records per peer not yet handed to a connection, at most `max_records` per peer (32-byte
/// records: an atomic request counts two).
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

    /// Appends one encoded record (32 bytes, or 64 for an atomic request) for `peer`, or
    /// refuses it when the peer's queue is full.
    pub(super) fn push(&mut self, peer: Ipv4Addr, record: &[u8]) -> Result<(), QueueFull> {
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

/// What [`withhold`] took out of a queue.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Withheld {
    /// Records removed (an atomic request counts two).
    pub(super) records: u64,
    /// The atomic requests among them, to be answered with status unsupported.
    pub(super) atomics: Vec<AtomicRequest>,
}

/// Removes from `queued` (whole records, kept in order otherwise) what a peer with
/// capabilities `caps` does not take: receive-WR-too-short records without
/// LENGTH_ERRORS, atomic requests and replies without ATOMICS, access checks and verdicts
/// without ACCESS_CHECKS, remote invalidations (checks of op SEND_WITH_INV) without
/// REMOTE_INVALIDATE.
pub(super) fn withhold(queued: &mut Vec<u8>, caps: Capabilities) -> Withheld {
    let kind = |k: RecordKind| Some(k as u32);
    let refused = |r: &[u8]| {
        let k = RecordKind::of(r);
        !caps.contains(Capabilities::LENGTH_ERRORS) && k == kind(RecordKind::RecvTooShort)
            || !caps.contains(Capabilities::ACCESS_CHECKS)
                && (k == kind(RecordKind::AccessCheck) || k == kind(RecordKind::AccessVerdict))
            || !caps.contains(Capabilities::REMOTE_INVALIDATE)
                && k == kind(RecordKind::AccessCheck)
                && r.first() == Some(&(CheckOp::SendInv as u8))
            || !caps.contains(Capabilities::ATOMICS)
                && [
                    RecordKind::AtomicRequest,
                    RecordKind::AtomicOperands,
                    RecordKind::AtomicReply,
                ]
                .into_iter()
                .any(|a| k == kind(a))
    };
    let mut out = Withheld::default();
    if !queued.chunks_exact(RECV_WR_LEN).any(refused) {
        return out;
    }
    let mut kept = Vec::with_capacity(queued.len());
    let mut at = 0;
    while let Some(head) = queued.get(at..at + RECV_WR_LEN) {
        let len = RecordKind::record_len(head);
        let record = queued.get(at..at + len).unwrap_or(head);
        if refused(head) {
            out.records += (record.len() / RECV_WR_LEN) as u64;
            if let Ok((req, _)) = AtomicRequest::parse(record) {
                out.atomics.push(req);
            }
        } else {
            kept.extend_from_slice(record);
        }
        at += record.len();
    }
    *queued = kept;
    out
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
    fn remote_invalidations_go_only_to_a_peer_that_takes_them() {
        use bluerdma_core::oob::AccessCheck;
        let check = |op| {
            AccessCheck {
                op,
                rkey: 0x3c9,
                qpn: 1,
                ..AccessCheck::default()
            }
            .to_bytes()
            .unwrap()
        };
        let (inv, send) = (check(CheckOp::SendInv), check(CheckOp::Send));
        let all = [&wr(1)[..], &inv, &send].concat();
        let mut q = all.clone();
        let w = withhold(&mut q, Capabilities::OURS - Capabilities::REMOTE_INVALIDATE);
        assert_eq!(w.records, 1);
        assert_eq!(q, [&wr(1)[..], &send].concat());
        let mut q = all.clone();
        assert_eq!(withhold(&mut q, Capabilities::OURS), Withheld::default());
        assert_eq!(q, all);
    }

    #[test]
    fn withholding_takes_out_what_the_peer_does_not_take_and_keeps_the_rest_in_order() {
        let short = RecvTooShort {
            wr_id: 7,
            send_len: 9,
            qpn: 1,
        }
        .to_bytes()
        .unwrap();
        let req = AtomicRequest {
            qpn: 1,
            dest_qpn: 2,
            seq: 5,
            ..AtomicRequest::default()
        };
        let atomic = req.to_bytes().unwrap();
        let all = [&wr(1)[..], &short, &atomic, &wr(2), &short, &wr(3)].concat();
        let mut q = all.clone();
        let w = withhold(&mut q, Capabilities::RECV_WR_RECORDS);
        assert_eq!((w.records, w.atomics), (4, vec![req]));
        assert_eq!(q, [wr(1), wr(2), wr(3)].concat());
        assert_eq!(withhold(&mut q, Capabilities::empty()), Withheld::default());
        // A peer with LENGTH_ERRORS only: the atomic request goes, both records of it.
        let mut q = all.clone();
        let w = withhold(&mut q, Capabilities::LENGTH_ERRORS);
        assert_eq!((w.records, w.atomics.len()), (2, 1));
        assert_eq!(q, [&wr(1)[..], &short, &wr(2), &short, &wr(3)].concat());
        let mut q = all.clone();
        assert_eq!(withhold(&mut q, Capabilities::OURS), Withheld::default());
        assert_eq!(q, all);
    }
}
