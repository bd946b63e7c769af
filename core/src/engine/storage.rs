//! Where the device keeps its objects (caller-provided: arrays on firmware, vectors on
//! hosts), and the views that own the index arithmetic of the shared tables: a QP's send
//! queue in the WQE table, a CQ's ring in the completion table, and the timer table. Each
//! QP and CQ gets its own range of the shared table when it is created, as large as the
//! caller asked for (`ranges.rs`); receive WRs live in one table as linked lists
//! (`recv_pool.rs`).

use core::net::Ipv4Addr;

use crate::oob::RecvWr as OobRecvWr;
use crate::time::Instant;

use super::cq::CqSlot;
use super::mr::MrSlot;
use super::qp::QpSlot;
use super::ranges::Range;
use super::recv_pool::RecvEntry;
use super::wqe::Wqe;
use super::wr::WorkCompletion;

/// Caller-provided storage for the device's objects.
pub struct Slices<'a> {
    /// Queue pairs (slot i is QP index `windows.qp_index.start + i` of
    /// [`DeviceConfig::windows`](super::DeviceConfig::windows): i + 1 on the whole card,
    /// where index 0 is reserved). Slots past the window are not used.
    pub qps: &'a mut [QpSlot],
    /// Send WQEs of every QP: each QP's send queue is a range of this table, taken at
    /// create_qp (its `max_send_wr` and room for the READ responses it may owe).
    pub wqes: &'a mut [Wqe],
    /// The QPs' timers (one entry per QP slot), kept apart from the slots so that finding
    /// the next deadline reads one small table.
    pub timers: &'a mut [QpTimers],
    /// Completion queues.
    pub cqs: &'a mut [CqSlot],
    /// Completions of every CQ: each CQ's ring is a range of this table, taken at
    /// create_cq.
    pub cqes: &'a mut [WorkCompletion],
    /// Memory regions and memory windows (slot i is MR table index
    /// `windows.mr_index.start + i`: i + 1 on the whole card, where index 0 is the card's
    /// "no MR"). Slots past the window are not used.
    pub mrs: &'a mut [MrSlot],
    /// Receive WRs of every QP, posted here or announced by the peer. A QP reserves its
    /// `max_recv_wr` at creation; at most half the table is reserved, the rest holds what
    /// peers announce.
    pub recvs: &'a mut [RecvEntry],
    /// Announced receive WRs held for QPs that have not reached RTR yet, in arrival order
    /// (a peer may announce a whole receive queue, ibv_rc_pingpong's 500, before this side
    /// connects). Size it to the receive WRs peers may announce early.
    pub early: &'a mut [EarlyRecv],
}

impl Slices<'_> {
    /// Whether the tables fit each other: a timer entry per QP, and room for at least one
    /// send queue, one CQ and one receive WR.
    #[inline]
    pub(crate) fn consistent(&self) -> bool {
        !self.wqes.is_empty()
            && !self.cqes.is_empty()
            && !self.recvs.is_empty()
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
}

/// Head, length and sent prefix of one QP's send queue, and where its WQEs are in the
/// shared table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SqCounters {
    head: u32,
    len: u32,
    sent: u32,
    /// Queued WQEs the engine made itself (READ responses).
    internal: u32,
    /// Application requests that left the queue but whose completion (or, unsignaled, a
    /// later one's) has not been polled: they still hold their place.
    unpolled: u32,
    /// Application requests that left the queue without a completion of their own since
    /// the last one: the next completion frees their places too.
    carry: u32,
    /// The application's requests the queue takes (`max_send_wr`).
    cap: u32,
    ring: Range,
}

impl SqCounters {
    /// An application request left the queue; `completes` if it has a completion, which
    /// then frees the places of the unsignaled ones before it when polled. Returns how many
    /// places the completion frees (0 without one).
    pub(crate) fn retired(&mut self, completes: bool) -> u32 {
        self.unpolled += 1;
        self.carry += 1;
        if completes {
            core::mem::take(&mut self.carry)
        } else {
            0
        }
    }

    /// A completion that frees `slots` places was polled.
    pub(crate) fn polled(&mut self, slots: u32) {
        self.unpolled = self.unpolled.saturating_sub(slots);
    }

    /// An empty queue of `cap` application requests in `ring`.
    pub(crate) fn new(cap: u32, ring: Range) -> Self {
        SqCounters {
            cap,
            ring,
            ..SqCounters::default()
        }
    }

    /// Where the queue's WQEs are.
    pub(crate) fn ring(&self) -> Range {
        self.ring
    }

    /// The application's requests the queue takes.
    pub(crate) fn cap(&self) -> u32 {
        self.cap
    }
}

/// One QP's send queue: its counters and its range of the shared WQE table. Index k
/// counts from the oldest WQE; the first `sent()` WQEs have been handed to the card.
pub(crate) struct SendQueue<'a> {
    c: &'a mut SqCounters,
    ring: &'a mut [Wqe],
}

impl<'a> SendQueue<'a> {
    /// The send queue of the counters `c` (`wqes` is the whole table).
    #[inline]
    pub(crate) fn new(c: &'a mut SqCounters, wqes: &'a mut [Wqe]) -> Self {
        let (at, len) = (c.ring.base as usize, c.ring.len as usize);
        let ring = wqes.get_mut(at..at + len).unwrap_or(&mut []);
        SendQueue { c, ring }
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
            at % depth.max(1)
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

    /// Every slot is taken (a READ response finds no room).
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.c.len as usize >= self.ring.len()
    }

    /// The application's requests fill the queue: `max_send_wr` of them are queued, or
    /// left it with their completions not polled yet.
    pub(crate) fn is_full_for_app(&self) -> bool {
        self.is_full() || self.c.len - self.c.internal + self.c.unpolled >= self.c.cap
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
        self.c.internal += w.is_internal() as u32;
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
        self.c.internal -= (w.is_internal() && self.c.internal > 0) as u32;
        self.c.sent = self.c.sent.saturating_sub(1);
        Some(w)
    }

    /// Nothing is on the wire any more (the queue was flushed).
    #[inline]
    pub(crate) fn forget_sent(&mut self) {
        self.c.sent = 0;
    }
}

/// A QP's timers: retransmission (local ACK timeout), RNR, and the grace a passive
/// receiver whose out-of-band peer is lost gets before it fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpTimers {
    retransmit: Option<Instant>,
    rnr: Option<Instant>,
    peer_lost: Option<Instant>,
}

/// Which timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// No ACK within the local ACK timeout: retransmit.
    Retransmit,
    /// A SEND waited `min_rnr_timer` for a receive WR.
    Rnr,
    /// The out-of-band peer of a passive receiver went away: fail the QP when it fires.
    PeerLost,
}

impl QpTimers {
    /// When `t` fires.
    #[inline]
    pub(crate) fn get(&self, t: Timer) -> Option<Instant> {
        match t {
            Timer::Retransmit => self.retransmit,
            Timer::Rnr => self.rnr,
            Timer::PeerLost => self.peer_lost,
        }
    }

    /// Sets (or with `None` stops) `t`.
    #[inline]
    pub(crate) fn set(&mut self, t: Timer, at: Option<Instant>) {
        match t {
            Timer::Retransmit => self.retransmit = at,
            Timer::Rnr => self.rnr = at,
            Timer::PeerLost => self.peer_lost = at,
        }
    }

    /// Starts `t` unless it runs.
    #[inline]
    pub(crate) fn start(&mut self, t: Timer, at: Option<Instant>) {
        if self.get(t).is_none() {
            self.set(t, at);
        }
    }

    /// The earliest of them.
    #[inline]
    pub(crate) fn next(&self) -> Option<Instant> {
        [self.retransmit, self.rnr, self.peer_lost]
            .into_iter()
            .flatten()
            .min()
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
    /// Completions the CQ holds (the `cqe` its creator asked for).
    cap: u32,
    ring: &'a mut [WorkCompletion],
}

impl<'a> CqRing<'a> {
    /// The ring in `range` of `cqes` (the whole table), holding `cap` completions.
    #[inline]
    pub(crate) fn new(
        head: &'a mut u32,
        len: &'a mut u32,
        cap: u32,
        cqes: &'a mut [WorkCompletion],
        range: Range,
    ) -> Self {
        let (at, n) = (range.base as usize, range.len as usize);
        let ring = cqes.get_mut(at..at + n).unwrap_or(&mut []);
        CqRing {
            head,
            len,
            cap: cap.min(n as u32),
            ring,
        }
    }

    /// Appends a completion; gives it back when the CQ holds `cap` already.
    #[inline]
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> Result<(), WorkCompletion> {
        if *self.len >= self.cap {
            return Err(wc);
        }
        let depth = self.ring.len();
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

    /// Moves the queued completions to the start of the ring, oldest first (before the
    /// ring is moved or resized).
    pub(crate) fn linearize(&mut self) {
        self.ring.rotate_left(*self.head as usize);
        *self.head = 0;
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
        let mut c = SqCounters::new(4, Range { base: 4, len: 4 });
        let mut q = SendQueue::new(&mut c, &mut table);
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
        let mut c = SqCounters::new(4, Range { base: 0, len: 4 });
        let mut q = SendQueue::new(&mut c, &mut table);
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
        let mut r = CqRing::new(
            &mut head,
            &mut len,
            3,
            &mut table,
            Range { base: 3, len: 3 },
        );
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

    #[test]
    fn the_application_gets_its_cap_and_read_responses_the_rest() {
        let mut table = [Wqe::default(); 8];
        let mut c = SqCounters::new(2, Range { base: 0, len: 8 });
        let mut q = SendQueue::new(&mut c, &mut table);
        q.push(wqe(1)).unwrap();
        q.push(wqe(2)).unwrap();
        assert!(q.is_full_for_app() && !q.is_full());
        q.pop();
        assert!(!q.is_full_for_app());
        let mut empty = SqCounters::default();
        let q = SendQueue::new(&mut empty, &mut table);
        assert!(
            q.is_full() && q.get(0).is_none(),
            "a QP without a ring takes nothing"
        );
    }

    #[test]
    fn a_cq_ring_holds_what_was_asked_and_linearizes_in_order() {
        let mut table = [WorkCompletion::EMPTY; 8];
        let (mut head, mut len) = (0u32, 0u32);
        let wc = |id| WorkCompletion {
            wr_id: id,
            ..WorkCompletion::EMPTY
        };
        let mut r = CqRing::new(
            &mut head,
            &mut len,
            3,
            &mut table,
            Range { base: 4, len: 4 },
        );
        for id in 0..3 {
            r.push(wc(id)).unwrap();
        }
        assert!(r.push(wc(9)).is_err(), "cqe 3 in a ring of 4");
        r.pop();
        r.pop();
        r.push(wc(3)).unwrap();
        r.push(wc(4)).unwrap();
        r.linearize();
        assert_eq!(head, 0);
        assert_eq!(
            table[4..7]
                .iter()
                .map(|w| w.wr_id)
                .collect::<std::vec::Vec<_>>(),
            [2, 3, 4]
        );
    }
}
