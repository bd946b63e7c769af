//! The out-of-band channel between the two engines of a [`super::Pair`]: records in order
//! per direction, as the TCP channel delivers them (oob-channel.md), each visible to its
//! receiver once the virtual clock reaches its send time plus the direction's delay. The
//! test can delay a direction, bound how many records it holds (sends beyond that fail with
//! [`PlatformError::WouldBlock`], as the TCP channel's full queue does), or cut the channel
//! ("peer lost"): both ends then get [`OobEvent::PeerLost`], what was in flight is lost,
//! and sends fail until it is restored. Atomic messages can be lost one by one, and a side
//! can be made one whose hello lacks ATOMICS: its channel peer then answers requests for
//! it with status unsupported, as the TCP channel does. Access checks reach a side only
//! when it is made one that answers them (`Pair::set_oob_access_checks`).

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};

use bluerdma_core::oob::{
    AtomicMessage, AtomicReply, AtomicStatus, CheckMessage, RecvTooShort, RecvWr,
};
use bluerdma_core::platform::{OobEvent, OobTransport, PlatformError};

use super::Side;
use crate::model::VirtualClock;

/// Both directions of the channel.
#[derive(Debug)]
pub(super) struct OobWire {
    ips: [Ipv4Addr; 2],
    /// Records on their way to each side, with the time they become visible (ns).
    lanes: [VecDeque<(u64, OobEvent)>; 2],
    /// Delay of the records to each side (ns).
    pub(super) delay_ns: [u64; 2],
    /// Most records in flight to each side (`None`: unbounded).
    pub(super) capacity: [Option<usize>; 2],
    cut: bool,
    /// Records each side sent.
    pub(super) sent: [u64; 2],
    /// Whether each side takes atomics (its hello's ATOMICS).
    pub(super) atomics: [bool; 2],
    /// Atomic messages to each side still to be lost.
    pub(super) drop_atomics: [u32; 2],
    /// Whether each side answers access checks (its hello's ACCESS_CHECKS; default no, so
    /// a refused request ends in RETRY_EXC_ERR as on a card without them).
    pub(super) access_checks: [bool; 2],
}

impl OobWire {
    pub(super) fn new(ips: [Ipv4Addr; 2]) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            ips,
            lanes: Default::default(),
            delay_ns: [0; 2],
            capacity: [None; 2],
            cut: false,
            sent: [0; 2],
            atomics: [true; 2],
            drop_atomics: [0; 2],
            access_checks: [false; 2],
        }))
    }

    /// Cuts the channel: in-flight records are lost, each side is told its peer is gone.
    pub(super) fn cut(&mut self, now_ns: u64) {
        self.cut = true;
        for to in Side::BOTH {
            let lane = &mut self.lanes[to.index()];
            lane.clear();
            lane.push_back((
                now_ns,
                OobEvent::PeerLost {
                    peer: self.ips[to.peer().index()],
                },
            ));
        }
    }

    /// Lets records through again (a new connection).
    pub(super) fn restore(&mut self) {
        self.cut = false;
    }

    /// Records on their way to `to`.
    pub(super) fn in_flight(&self, to: Side) -> usize {
        self.lanes[to.index()].len()
    }

    /// When the next record to either side becomes visible.
    pub(super) fn next_due_ns(&self) -> Option<u64> {
        self.lanes
            .iter()
            .filter_map(|l| l.front().map(|(at, _)| *at))
            .min()
    }
}

/// One engine's end of the channel.
pub struct PairOob {
    side: Side,
    wire: Arc<Mutex<OobWire>>,
    clock: VirtualClock,
}

impl PairOob {
    pub(super) fn new(side: Side, wire: Arc<Mutex<OobWire>>, clock: VirtualClock) -> Self {
        Self { side, wire, clock }
    }

    fn wire(&self) -> MutexGuard<'_, OobWire> {
        self.wire.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn queue(&mut self, peer: Ipv4Addr, event: OobEvent) -> Result<(), PlatformError> {
        let now = self.clock.now_ns();
        let me = self.side;
        let mut w = self.wire();
        let to = me.peer();
        if w.cut || peer != w.ips[to.index()] {
            return Err(PlatformError::Disconnected { peer });
        }
        if w.capacity[to.index()].is_some_and(|c| w.lanes[to.index()].len() >= c) {
            return Err(PlatformError::WouldBlock);
        }
        let at = now.saturating_add(w.delay_ns[to.index()]);
        w.lanes[to.index()].push_back((at, event));
        w.sent[me.index()] += 1;
        Ok(())
    }
}

impl OobTransport for PairOob {
    fn send(&mut self, peer: Ipv4Addr, wr: &RecvWr) -> Result<(), PlatformError> {
        let from = self.wire().ips[self.side.index()];
        self.queue(peer, OobEvent::RecvWr { from, wr: *wr })
    }

    fn send_too_short(&mut self, peer: Ipv4Addr, rec: &RecvTooShort) -> Result<(), PlatformError> {
        let from = self.wire().ips[self.side.index()];
        self.queue(peer, OobEvent::RecvTooShort { from, rec: *rec })
    }

    fn send_atomic(&mut self, peer: Ipv4Addr, msg: &AtomicMessage) -> Result<(), PlatformError> {
        let (me, to) = (self.side.index(), self.side.peer().index());
        let mut w = self.wire();
        let from = w.ips[me];
        if let AtomicMessage::Request(req) = msg {
            if !w.atomics[to] && !w.cut && peer == w.ips[to] {
                // The peer's hello lacks ATOMICS: our channel answers for it.
                let reply = AtomicReply::refusal(req, AtomicStatus::Unsupported);
                let now = self.clock.now_ns();
                let msg = AtomicMessage::Reply(reply);
                w.lanes[me].push_back((now, OobEvent::Atomic { from: peer, msg }));
                return Ok(());
            }
        }
        if w.drop_atomics[to] > 0 && !w.cut && peer == w.ips[to] {
            w.drop_atomics[to] -= 1;
            w.sent[me] += 1;
            return Ok(());
        }
        drop(w);
        self.queue(peer, OobEvent::Atomic { from, msg: *msg })
    }

    fn send_check(&mut self, peer: Ipv4Addr, msg: &CheckMessage) -> Result<(), PlatformError> {
        let (me, to) = (self.side.index(), self.side.peer().index());
        let w = self.wire();
        let from = w.ips[me];
        if !w.access_checks[to] && !w.cut && peer == w.ips[to] {
            // The peer's hello lacks ACCESS_CHECKS: withheld, never answered (TcpOob).
            return Ok(());
        }
        drop(w);
        self.queue(peer, OobEvent::Check { from, msg: *msg })
    }

    fn poll(&mut self) -> Option<OobEvent> {
        let now = self.clock.now_ns();
        let me = self.side.index();
        let mut w = self.wire();
        // In order: a record that is not due yet holds back the ones behind it.
        match w.lanes[me].front() {
            Some((at, _)) if *at <= now => w.lanes[me].pop_front().map(|(_, e)| e),
            _ => None,
        }
    }
}
