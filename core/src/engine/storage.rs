//! Where the device keeps its objects (caller-provided: arrays on firmware, vectors on
//! hosts), and the views that own the index arithmetic of the shared tables: a QP's send
//! queue in the WQE table, a CQ's ring in the completion table, and the timer table.

use core::net::Ipv4Addr;

use crate::oob::RecvWr as OobRecvWr;
use crate::time::Instant;

use super::cq::CqSlot;
use super::mr::MrSlot;
use super::qp::{QpIndex, QpSlot};
use super::wqe::Wqe;
use super::wr::WorkCompletion;

/// Caller-provided storage for the device's objects.
pub struct Slices<'a> {
    /// Queue pairs (slot i is QP index i + 1: index 0 is reserved by the card).
    pub qps: &'a mut [QpSlot],
    /// Send WQEs: `sq_depth` per QP, QP slot i owns `[i * sq_depth, (i + 1) * sq_depth)`.
    pub wqes: &'a mut [Wqe],
    /// The QPs' timers (one entry per QP slot), kept apart from the slots so that finding
    /// the next deadline reads one small table.
    pub timers: &'a mut [QpTimers],
    /// Completion queues.
    pub cqs: &'a mut [CqSlot],
    /// Completions: `cq_depth` per CQ.
    pub cqes: &'a mut [WorkCompletion],
    /// Memory regions (slot i is MR table index i).
    pub mrs: &'a mut [MrSlot],
    /// Announced receive WRs held for QPs that have not reached RTR yet, in arrival order
    /// (a peer may announce a whole receive queue, ibv_rc_pingpong's 500, before this side
    /// connects). Size it to the receive WRs peers may announce early.
    pub early: &'a mut [EarlyRecv],
}

impl Slices<'_> {
    /// Whether the tables fit each other: `sq_depth` WQEs per QP, `cq_depth` completions
    /// per CQ, a timer entry per QP.
    #[inline]
    pub(crate) fn consistent(&self, sq_depth: usize, cq_depth: usize) -> bool {
        sq_depth > 0
            && cq_depth > 0
            && self.wqes.len() >= self.qps.len() * sq_depth
            && self.cqes.len() >= self.cqs.len() * cq_depth
            && self.timers.len() >= self.qps.len()
    }
}

/// A receive WR a peer announced before the QP it belongs to reached RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EarlyRecv {
    /// The announcing device.
    pub from: Ipv4Addr,
    /// The record.
    pub wr: OobRecvWr,
}

impl Default for EarlyRecv {
    #[inline]
    fn default() -> Self {
        Self {
            from: Ipv4Addr::UNSPECIFIED,
            wr: OobRecvWr::default(),
        }
    }
}

/// Where the device keeps its objects: arrays on firmware, vectors on hosts.
pub trait Storage {
    /// All tables at once.
    fn slices(&mut self) -> Slices<'_>;
    /// Send WQEs per QP.
    fn sq_depth(&self) -> usize;
    /// Completions per CQ.
    fn cq_depth(&self) -> usize;
}

/// Head, length and sent prefix of one QP's send queue (the WQEs live in the shared table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SqCounters {
    head: u32,
    len: u32,
    sent: u32,
}

/// One QP's send queue: its counters and its `sq_depth` WQEs of the shared table. Index k
/// counts from the oldest WQE; the first `sent()` WQEs have been handed to the card.
pub(crate) struct SendQueue<'a> {
    c: &'a mut SqCounters,
    ring: &'a mut [Wqe],
}

impl<'a> SendQueue<'a> {
    /// The send queue of QP slot `i` (`wqes` is the whole table).
    #[inline]
    pub(crate) fn new(
        c: &'a mut SqCounters,
        wqes: &'a mut [Wqe],
        i: QpIndex,
        depth: usize,
    ) -> Self {
        let at = i.slot() * depth;
        SendQueue {
            c,
            ring: &mut wqes[at..at + depth],
        }
    }

    #[inline]
    fn at(&self, k: u32) -> usize {
        // head < depth and k <= depth on every path: one subtraction, not a division.
        let (at, depth) = (self.c.head as usize + k as usize, self.ring.len());
        if at < depth {
            at
        } else if at < 2 * depth {
            at - depth
        } else {
            at % depth
        }
    }

    /// WQEs queued.
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.c.len
    }

    /// WQEs handed to the card (a prefix).
    #[inline]
    pub(crate) fn sent(&self) -> u32 {
        self.c.sent
    }

    /// Every slot is taken.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.c.len as usize >= self.ring.len()
    }

    /// The k-th WQE from the oldest.
    #[inline]
    pub(crate) fn get(&self, k: u32) -> Option<&Wqe> {
        (k < self.c.len).then(|| &self.ring[self.at(k)])
    }

    /// The k-th WQE from the oldest, to change.
    #[inline]
    pub(crate) fn get_mut(&mut self, k: u32) -> Option<&mut Wqe> {
        let at = self.at(k);
        (k < self.c.len).then(|| &mut self.ring[at])
    }

    /// The WQEs handed to the card, oldest first.
    #[inline]
    pub(crate) fn sent_wqes(&self) -> impl Iterator<Item = &Wqe> + '_ {
        (0..self.c.sent).filter_map(|k| self.get(k))
    }

    /// The same, to change.
    #[inline]
    pub(crate) fn for_each_sent(&mut self, mut f: impl FnMut(&mut Wqe)) {
        for k in 0..self.c.sent {
            let at = self.at(k);
            f(&mut self.ring[at]);
        }
    }

    /// Every queued WQE, to change.
    #[inline]
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(&mut Wqe)) {
        for k in 0..self.c.len {
            let at = self.at(k);
            f(&mut self.ring[at]);
        }
    }

    /// The newest WQE handed to the card.
    #[inline]
    pub(crate) fn last_sent(&self) -> Option<&Wqe> {
        self.c.sent.checked_sub(1).and_then(|k| self.get(k))
    }

    /// Appends a WQE; gives it back when the queue is full.
    #[inline]
    pub(crate) fn push(&mut self, w: Wqe) -> Result<(), Wqe> {
        if self.is_full() {
            return Err(w);
        }
        let at = self.at(self.c.len);
        self.ring[at] = w;
        self.c.len += 1;
        Ok(())
    }

    /// The oldest WQE not handed to the card yet became sent.
    #[inline]
    pub(crate) fn mark_sent(&mut self) {
        self.c.sent = (self.c.sent + 1).min(self.c.len);
    }

    /// Takes the oldest WQE off the queue (if anything was sent, it was).
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Wqe> {
        if self.c.len == 0 {
            return None;
        }
        let w = self.ring[self.at(0)];
        self.ring[self.at(0)] = Wqe::default();
        self.c.head = (self.c.head + 1) % self.ring.len() as u32;
        self.c.len -= 1;
        self.c.sent = self.c.sent.saturating_sub(1);
        Some(w)
    }

    /// Nothing is on the wire any more (the queue was flushed).
    #[inline]
    pub(crate) fn forget_sent(&mut self) {
        self.c.sent = 0;
    }
}

/// A QP's two timers: retransmission (local ACK timeout) and RNR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpTimers {
    retransmit: Option<Instant>,
    rnr: Option<Instant>,
}

/// Which timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// No ACK within the local ACK timeout: retransmit.
    Retransmit,
    /// A SEND waited `min_rnr_timer` for a receive WR.
    Rnr,
}

impl QpTimers {
    /// When `t` fires.
    #[inline]
    pub(crate) fn get(&self, t: Timer) -> Option<Instant> {
        match t {
            Timer::Retransmit => self.retransmit,
            Timer::Rnr => self.rnr,
        }
    }

    /// Sets (or with `None` stops) `t`.
    #[inline]
    pub(crate) fn set(&mut self, t: Timer, at: Option<Instant>) {
        match t {
            Timer::Retransmit => self.retransmit = at,
            Timer::Rnr => self.rnr = at,
        }
    }

    /// Starts `t` unless it runs.
    #[inline]
    pub(crate) fn start(&mut self, t: Timer, at: Option<Instant>) {
        if self.get(t).is_none() {
            self.set(t, at);
        }
    }

    /// The earlier of the two.
    #[inline]
    pub(crate) fn next(&self) -> Option<Instant> {
        match (self.retransmit, self.rnr) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether `t` runs and is due at `now`.
    #[inline]
    pub(crate) fn is_due(&self, t: Timer, now: Instant) -> bool {
        self.get(t).is_some_and(|d| now >= d)
    }
}

/// The earliest deadline of a timer table.
#[inline]
pub(crate) fn next_deadline(timers: &[QpTimers]) -> Option<Instant> {
    timers.iter().filter_map(QpTimers::next).min()
}

/// One CQ's ring of completions in the shared table.
pub(crate) struct CqRing<'a> {
    head: &'a mut u32,
    len: &'a mut u32,
    ring: &'a mut [WorkCompletion],
}

impl<'a> CqRing<'a> {
    /// The ring of CQ `cq` (`cqes` is the whole table, `depth` completions per CQ).
    #[inline]
    pub(crate) fn new(
        head: &'a mut u32,
        len: &'a mut u32,
        cqes: &'a mut [WorkCompletion],
        cq: usize,
        depth: usize,
    ) -> Self {
        CqRing {
            head,
            len,
            ring: &mut cqes[cq * depth..(cq + 1) * depth],
        }
    }

    /// Appends a completion; gives it back when the ring is full.
    #[inline]
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> Result<(), WorkCompletion> {
        let depth = self.ring.len();
        if *self.len as usize >= depth {
            return Err(wc);
        }
        self.ring[(*self.head as usize + *self.len as usize) % depth] = wc;
        *self.len += 1;
        Ok(())
    }

    /// Takes the oldest completion.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<WorkCompletion> {
        if *self.len == 0 {
            return None;
        }
        let wc = self.ring[*self.head as usize];
        *self.head = (*self.head + 1) % self.ring.len() as u32;
        *self.len -= 1;
        Some(wc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Nanos;

    fn wqe(n: u32) -> Wqe {
        Wqe {
            npsn: n,
            ..Wqe::default()
        }
    }

    #[test]
    fn a_send_queue_wraps_inside_its_own_slots() {
        let mut table = [Wqe::default(); 12];
        let mut c = SqCounters::default();
        let mut q = SendQueue::new(&mut c, &mut table, QpIndex::from_slot(1), 4);
        q.push(wqe(100)).unwrap();
        q.pop();
        // The head now sits at slot 1: every round wraps past the end of the QP's slots.
        for round in 0..3u32 {
            for k in 0..4 {
                assert!(q.push(wqe(round * 10 + k)).is_ok());
            }
            assert!(q.push(wqe(99)).is_err(), "full at depth 4");
            q.mark_sent();
            assert_eq!(q.get(3).map(|w| w.npsn), Some(round * 10 + 3));
            assert_eq!(q.get(4), None);
            let got: [u32; 4] = core::array::from_fn(|_| q.pop().unwrap().npsn);
            assert_eq!(got, [0, 1, 2, 3].map(|k| round * 10 + k));
            assert_eq!((q.len(), q.sent()), (0, 0));
        }
        // Slots of QP slots 0 and 2 untouched.
        assert!(table[..4]
            .iter()
            .chain(&table[8..])
            .all(|w| *w == Wqe::default()));
    }

    #[test]
    fn the_sent_prefix_never_outgrows_the_queue() {
        let mut table = [Wqe::default(); 4];
        let mut c = SqCounters::default();
        let mut q = SendQueue::new(&mut c, &mut table, QpIndex::from_slot(0), 4);
        q.mark_sent();
        assert_eq!(q.sent(), 0);
        q.push(wqe(1)).unwrap();
        q.push(wqe(2)).unwrap();
        q.mark_sent();
        assert_eq!(q.last_sent().map(|w| w.npsn), Some(1));
        assert_eq!(q.sent_wqes().count(), 1);
        q.forget_sent();
        assert_eq!(q.last_sent(), None);
    }

    #[test]
    fn the_next_deadline_is_the_earliest_of_every_timer() {
        let t = |ms| Some(Instant(0) + Nanos::from_millis(ms));
        let mut table = [QpTimers::default(); 3];
        assert_eq!(next_deadline(&table), None);
        table[0].set(Timer::Retransmit, t(50));
        table[2].set(Timer::Rnr, t(7));
        table[2].start(Timer::Rnr, t(1));
        assert_eq!(next_deadline(&table), t(7), "start keeps a running timer");
        let at7 = Instant(0) + Nanos::from_millis(7);
        assert!(table[2].is_due(Timer::Rnr, at7) && !table[0].is_due(Timer::Retransmit, at7));
        table[2].set(Timer::Rnr, None);
        assert_eq!(next_deadline(&table), t(50));
    }

    #[test]
    fn a_cq_ring_refuses_past_its_depth_and_keeps_order() {
        let mut table = [WorkCompletion::EMPTY; 6];
        let (mut head, mut len) = (0u32, 0u32);
        let mut r = CqRing::new(&mut head, &mut len, &mut table, 1, 3);
        for id in 0..5u64 {
            let wc = WorkCompletion {
                wr_id: id,
                ..WorkCompletion::EMPTY
            };
            let res = r.push(wc);
            assert_eq!(res.is_ok(), id < 3 || id == 4, "{id}");
            if id == 3 {
                assert_eq!(r.pop().map(|w| w.wr_id), Some(0));
            }
        }
        let ids: [u64; 3] = core::array::from_fn(|_| r.pop().unwrap().wr_id);
        assert_eq!(ids, [1, 2, 4]);
        assert!(r.pop().is_none());
    }
}
