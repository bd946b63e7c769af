//! The responder's per-QP bookkeeping, without the device: which PSNs arrived (from the
//! card's packet reports and its window bitmaps), which messages ended and wait for every
//! PSN before them, how far an ACK may go, and which READ requests were answered. The
//! device feeds it reports (`report.rs`) and completes what it hands back.
//!
//! The rule it keeps: no PSN that ends a message is acknowledged before that message's
//! completion is recorded (see [`ack_limit`]).

use crate::desc::meta::{AckReport, PacketInfo};
use crate::keys::Qpn;
use crate::mtu::Pmtu;
use crate::transport::{num_packets, Psn, PsnBitmap, PsnRange};

use super::card_reset::{still_fresh, trusted_bits, RESET_PHANTOMS};

/// A received message whose last packet was reported: completed once every PSN up to it
/// has arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MsgEnd {
    /// PSN of the last packet.
    pub psn: Psn,
    /// PSN of the first packet (known at delivery for a message of several packets).
    pub first: Psn,
    /// What arrived.
    pub kind: MsgKind,
    /// Immediate data.
    pub imm: u32,
    /// Message length (ONLY packets); for a multi-packet message it comes from its FIRST
    /// packet's report at delivery.
    pub len: u32,
    /// The message was one packet.
    pub only: bool,
    /// The RETH address of the message's first packet (READ responses: the requester's
    /// sink address, which identifies the READ they answer).
    pub addr: u64,
}

/// The kind of a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MsgKind {
    /// An RDMA WRITE: no completion on the responder.
    Write,
    /// An RDMA WRITE with immediate data: a receive completion.
    WriteImm,
    /// A SEND.
    Send,
    /// A SEND with immediate data.
    SendImm,
    /// A READ response: completes the oldest outstanding READ.
    ReadResp,
    /// A READ request: nothing to complete (its PSN is tracked like any other).
    ReadReq,
}

/// PSN window of the receive tracker (1024 PSNs).
pub const RX_WORDS: usize = 16;
/// Received-but-undelivered messages per QP.
pub const MSG_QUEUE: usize = 64;
/// Lost PSN ranges tracked per QP; when full, new losses merge into the last range.
pub const LOST_TRACKED: usize = 64;
/// FIRST packets remembered per QP (their RETH carries the message length).
pub const FIRSTS_TRACKED: usize = 32;
/// READ requests answered and not yet delivered (passed by the delivery point) remembered
/// per QP: twice the READs a requester keeps outstanding (`max_rd_atomic`), and the most
/// READs a requester sends ahead of their acknowledgement (`reads_allow`).
pub const READS_TRACKED: usize = 2 * crate::qp::MAX_RD_ATOMIC as usize;

/// What arrived on one QP and what is still to complete.
#[derive(Clone, Debug)]
pub(crate) struct Responder {
    /// For logs.
    qpn: Qpn,
    /// The QP's path MTU (a message's packet count from its FIRST packet).
    pmtu: Pmtu,
    /// Received PSNs.
    rx: PsnBitmap<RX_WORDS>,
    /// The PSN up to which an ACK was sent.
    acked_rx: Psn,
    /// The card's quiet report showed a hole below received PSNs: NAK it at the next poll.
    nak_due: bool,
    /// The receive base the last NAK was sent for: one NAK per hole, as IB's sequence
    /// error NAK (the requester's timer covers a retransmission that is lost again).
    naked_at: Option<Psn>,
    /// A duplicate arrived (a PSN below the base): the requester missed an ACK, send the
    /// current one again.
    reack: bool,
    /// PSN ranges the card reported lost (they left its window unreceived, or its window
    /// jumped over them) and that have not all arrived since: the card's window bottom is a
    /// cumulative ACK only up to the first of these.
    lost: heapless::Vec<PsnRange, LOST_TRACKED>,
    /// The card's receive window has not moved past PSN 0 since ManageQp, so its bitmaps
    /// still carry the reset bits (see `engine::card_reset`).
    card_fresh: bool,
    /// A message end or FIRST report found no room: its PSNs stay unacknowledged until the
    /// requester resends them; NAK the acknowledgement point to make it do so now.
    reports_dropped: bool,
    /// READ requests answered at or after `next_msg`: one of them arriving again is a
    /// resend. (Before it, every request was answered.) A high-water mark is not enough:
    /// the card takes requests out of order around a lost one, and the lost one, resent,
    /// was taken for a resend and never answered (ib_read_bw failed with RETRY_EXC_ERR).
    reads_answered: heapless::Vec<Psn, READS_TRACKED>,
    /// Received messages waiting for their PSNs, in PSN order.
    msgs: heapless::Deque<MsgEnd, MSG_QUEUE>,
    /// FIRST packets seen of messages not delivered yet, in PSN order: (PSN, message length,
    /// RETH address).
    firsts: heapless::Deque<(Psn, u32, u64), FIRSTS_TRACKED>,
    /// First PSN of the next message to deliver.
    next_msg: Psn,
}

impl Default for Responder {
    #[inline]
    fn default() -> Self {
        Responder {
            qpn: Qpn::from_raw(0),
            pmtu: Pmtu::Mtu4096,
            rx: PsnBitmap::new(Psn::from_raw(0)),
            acked_rx: Psn::from_raw(0),
            nak_due: false,
            naked_at: None,
            reack: false,
            lost: heapless::Vec::new(),
            card_fresh: true,
            reports_dropped: false,
            reads_answered: heapless::Vec::new(),
            msgs: heapless::Deque::new(),
            firsts: heapless::Deque::new(),
            next_msg: Psn::from_raw(0),
        }
    }
}

/// What a READ request report means for the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadRequest {
    /// A new request: answer it.
    Answer,
    /// A resent request: its response is queued, in flight with its own retransmissions, or
    /// acknowledged (the requester has it). Another copy would only push missing packets
    /// further back in the send ring, or be taken by the requester as the answer to its
    /// next READ. Requests are told apart by PSN: perftest reads the same address into the
    /// same buffer every time.
    Resent,
}

impl Responder {
    /// The bookkeeping of QP `qpn`.
    #[inline]
    pub(crate) fn new(qpn: Qpn) -> Self {
        Responder {
            qpn,
            ..Responder::default()
        }
    }

    /// `rq_psn` was set: the next message starts there.
    #[inline]
    pub(crate) fn reset(&mut self, psn: Psn) {
        self.rx.reset(psn);
        self.acked_rx = psn;
        self.next_msg = psn;
        self.reads_answered.clear();
    }

    /// The path MTU was set.
    #[inline]
    pub(crate) fn set_pmtu(&mut self, pmtu: Pmtu) {
        self.pmtu = pmtu;
    }

    /// ManageQp reset the card's window: its bits for the reset strides mean nothing.
    #[inline]
    pub(crate) fn card_reset(&mut self) {
        self.card_fresh = true;
        record_lost(self, RESET_PHANTOMS);
    }

    /// The PSN up to which an ACK was sent (the next PSN expected, as the peer knows it).
    #[inline]
    pub(crate) fn acked(&self) -> Psn {
        self.acked_rx
    }

    /// The first PSN not received.
    #[inline]
    pub(crate) fn base(&self) -> Psn {
        self.rx.base()
    }

    /// Messages recorded and not completed (for dumps).
    #[inline]
    pub(crate) fn queued(&self) -> usize {
        self.msgs.len()
    }

    /// Whether recording the report of `p` needs room made first (completing what can be
    /// completed) in the message or FIRST queue.
    #[inline]
    pub(crate) fn needs_room(&self, p: &PacketInfo) -> bool {
        let op = p.opcode;
        op.is_first() && self.firsts.is_full()
            || (op.is_last() || op.is_only()) && self.msgs.is_full()
    }

    /// The report intake of a packet: marks its PSN, remembers a FIRST packet, records the
    /// end of a message.
    #[inline]
    pub(crate) fn on_packet(&mut self, p: &PacketInfo) {
        if let Some(m) = note_packet(self, p) {
            push_msg(self, m);
        }
    }

    /// Whether a READ request report needs room made first.
    #[inline]
    pub(crate) fn read_needs_room(&self) -> bool {
        self.msgs.is_full()
    }

    /// The report intake of a READ request (checked by the device): tracks its PSN like any
    /// other and tells whether it is new.
    #[inline]
    pub(crate) fn on_read_request(&mut self, psn: Psn, len: u32, addr: u64) -> ReadRequest {
        if psn.is_before(self.rx.base()) {
            self.reack = true;
        }
        let next = self.next_msg;
        self.reads_answered.retain(|p| !p.is_before(next));
        if psn.is_before(next) {
            // Delivered: answered long ago.
            self.rx.set(psn);
            return ReadRequest::Resent;
        }
        let answered = self.reads_answered.contains(&psn);
        if !answered && self.reads_answered.is_full() && !make_read_room(self, psn) {
            // No room to remember the answer: not taken now (neither received nor
            // recorded), so the requester resends it, as after a full message queue.
            self.reports_dropped = true;
            return ReadRequest::Resent;
        }
        self.rx.set(psn);
        // Recorded again if a full queue pushed it out since its answer.
        let queued = push_msg(
            self,
            MsgEnd {
                psn,
                first: psn,
                kind: MsgKind::ReadReq,
                imm: 0,
                len,
                only: true,
                addr,
            },
        );
        if answered || !queued {
            // Answered already; or not recorded, so never acknowledged: resent, and
            // answered then.
            return ReadRequest::Resent;
        }
        let _ = self.reads_answered.push(psn);
        ReadRequest::Answer
    }

    /// The card's quiet-timer report (see [`on_card_quiet`]).
    #[inline]
    pub(crate) fn on_quiet(&mut self, a: &AckReport) {
        on_card_quiet(self, a)
    }

    /// The card's loss report (see [`on_card_loss`]).
    #[inline]
    pub(crate) fn on_loss(&mut self, a: &AckReport, pre_bitmap: u128) {
        on_card_loss(self, a, pre_bitmap)
    }

    /// Advances over what arrived: the first missing PSN, and the point up to which an ACK
    /// may now go. Then [`Responder::next_ready`] hands out the messages to complete.
    #[inline]
    pub(crate) fn deliverable(&mut self) -> (Psn, Psn) {
        let base = self.rx.advance();
        (base, ack_limit(self, base))
    }

    /// The oldest message that ends before `limit`, taken off the books to complete.
    #[inline]
    pub(crate) fn next_ready(&mut self, limit: Psn) -> Option<MsgEnd> {
        next_ready(self, limit)
    }

    /// Whether a NAK of `ack` is due (a hole the card's quiet report showed, or a report
    /// the engine had to drop, whose message can only come back by retransmission; `base`
    /// is the first missing PSN). One NAK per hole.
    #[inline]
    pub(crate) fn take_nak(&mut self, base: Psn, ack: Psn) -> bool {
        let hole = core::mem::take(&mut self.nak_due);
        let dropped = self.reports_dropped && ack != base;
        if dropped {
            self.reports_dropped = false;
        }
        let due = (hole || dropped) && self.naked_at != Some(ack);
        if due {
            self.naked_at = Some(ack);
        }
        due
    }

    /// Whether a duplicate asks for the current ACK again.
    #[inline]
    pub(crate) fn take_reack(&mut self) -> bool {
        core::mem::take(&mut self.reack)
    }

    /// An ACK up to `ack` went out.
    #[inline]
    pub(crate) fn set_acked(&mut self, ack: Psn) {
        self.acked_rx = ack;
    }
}

/// The first PSN a card NAK says is lost: the lowest zero bit of the old window
/// (`pre_bitmap` at `psn_before_slide`) that left the window, or, when the window jumped
/// past its old top, the old top itself. Every PSN from there to the new window bottom may
/// be missing; the ones that arrived are set explicitly by their own reports.
#[inline]
fn first_lost(psn_before_slide: u32, pre_bitmap: u128, new_bottom: Psn) -> Option<Psn> {
    let pre_base = crate::transport::card_bitmap_base(Psn::from_raw(psn_before_slide));
    let old_top = pre_base.wrapping_add(128);
    let zero = (0..128u32)
        .filter(|b| pre_bitmap >> b & 1 == 0)
        .map(|b| pre_base.wrapping_add(b))
        .find(|p| p.is_before(new_bottom));
    match zero {
        Some(z) => Some(z),
        None if old_top.is_before(new_bottom) => Some(old_top),
        None => None,
    }
}

#[inline]
fn record_lost(q: &mut Responder, range: PsnRange) {
    if range.is_empty() {
        return;
    }
    if let Err(r) = q.lost.push(range) {
        // Full: widen the last range so that nothing lost is ever forgotten.
        if let Some(last) = q.lost.last_mut() {
            let start = if r.start().is_before(last.start()) {
                r.start()
            } else {
                last.start()
            };
            let end = if last.end().is_before(r.end()) {
                r.end()
            } else {
                last.end()
            };
            *last = PsnRange::from_bounds(start, end);
        }
    }
}

/// The card reports a PSN only while it is inside its 128-PSN window, and it NAKs every PSN
/// that leaves the window unreceived. So everything below the window bottom arrived except
/// the lost ranges: mark up to the first PSN of those still missing.
fn mark_card_cumulative(q: &mut Responder, bottom: Psn) {
    let base = q.rx.base();
    // Trim each lost range past the PSNs that have arrived since; drop resolved ones.
    let rx = &q.rx;
    for r in q.lost.iter_mut() {
        let mut start = if r.start().is_before(base) {
            base
        } else {
            r.start()
        };
        while start.is_before(r.end()) && rx.is_set(start) {
            start = start.wrapping_add(1);
        }
        *r = PsnRange::from_bounds(start, r.end());
    }
    q.lost.retain(|r| !r.is_empty() && r.end().is_after(base));
    let upto = q
        .lost
        .iter()
        .map(|r| r.start())
        .filter(|l| l.is_before(bottom))
        .min_by(|a, b| {
            if a.is_before(*b) {
                core::cmp::Ordering::Less
            } else {
                core::cmp::Ordering::Greater
            }
        })
        .unwrap_or(bottom);
    if base.is_before(upto) {
        q.rx.set_range(PsnRange::from_bounds(base, upto));
    }
}

/// A packet report of QP `q`: marks its PSN, remembers a FIRST packet (its RETH carries
/// the message length), and returns the end of a message (LAST or ONLY) to record.
fn note_packet(q: &mut Responder, p: &PacketInfo) -> Option<MsgEnd> {
    let psn = Psn::from_raw(p.psn);
    if psn.is_before(q.rx.base()) {
        q.reack = true;
    }
    q.rx.set(psn);
    let op = p.opcode;
    if op.is_first() && !psn.is_before(q.next_msg) && !q.firsts.iter().any(|f| f.0 == psn) {
        let kept = insert_sorted(&mut q.firsts, (psn, p.total_len, p.raddr.0), |f| f.0);
        if !kept {
            q.reports_dropped = true;
            core_warn!(
                "QP {:#x}: FIRST of PSN {:#x} not tracked; its message waits for a resend",
                q.qpn.get(),
                p.psn
            );
        }
    }
    if !op.is_last() && !op.is_only() {
        return None;
    }
    let kind = if op.is_read_response() {
        MsgKind::ReadResp
    } else if op.is_send() {
        if op.has_imm() {
            MsgKind::SendImm
        } else {
            MsgKind::Send
        }
    } else if op.has_imm() {
        MsgKind::WriteImm
    } else {
        MsgKind::Write
    };
    Some(MsgEnd {
        psn,
        first: psn,
        kind,
        imm: p.imm_data,
        len: if op.is_only() { p.total_len } else { 0 },
        only: op.is_only(),
        addr: p.raddr.0,
    })
}

/// The card's quiet-timer report of our receive window: nothing arrived for a while, so a
/// hole below received PSNs is a loss, not reordering; it is NAKed at the next delivery.
#[inline]
fn on_card_quiet(q: &mut Responder, a: &AckReport) {
    let bottom = crate::transport::card_bitmap_base(Psn::from_raw(a.psn_now));
    mark_card_cumulative(q, bottom);
    q.rx.merge_window(bottom, trusted_bits(q.card_fresh, bottom, a.now_bitmap));
    q.card_fresh = still_fresh(q.card_fresh, bottom);
    let hole = q.rx.first_missing();
    q.nak_due = (1..128u32).any(|k| q.rx.is_set(hole.wrapping_add(k)));
}

/// Our card saw a gap leave its window: from the first lost PSN to the new window bottom,
/// only what is reported explicitly arrived.
#[inline]
fn on_card_loss(q: &mut Responder, a: &AckReport, pre_bitmap: u128) {
    let new_bottom = crate::transport::card_bitmap_base(Psn::from_raw(a.psn_now));
    if let Some(first) = first_lost(a.psn_before_slide, pre_bitmap, new_bottom) {
        record_lost(q, PsnRange::from_bounds(first, new_bottom));
    }
    mark_card_cumulative(q, new_bottom);
    let pre_bottom = crate::transport::card_bitmap_base(Psn::from_raw(a.psn_before_slide));
    let fresh = q.card_fresh;
    q.rx.merge_window(pre_bottom, trusted_bits(fresh, pre_bottom, pre_bitmap));
    q.rx.merge_window(new_bottom, trusted_bits(fresh, new_bottom, a.now_bitmap));
    q.card_fresh = still_fresh(fresh, new_bottom);
}

/// Makes room among the answered READs for the request at `psn` by forgetting the newest
/// answer after it; whether it did. Answers are forgotten only as deliveries pass them, and
/// a delivery waits for every PSN below it: a request still missing below a full list of
/// later answers (its first copy lost, or dropped for a full list) would be refused at
/// every resend, and the requester fail with RETRY_EXC_ERR (ib_read_bw, about 1 run in 12).
/// A forgotten answer is given again if its request comes again (a requester's go-back-N
/// resends every READ not acknowledged): a second response, which the requester takes for
/// a READ still waiting for one or ignores.
fn make_read_room(q: &mut Responder, psn: Psn) -> bool {
    let newest = (0..q.reads_answered.len())
        .filter(|&k| q.reads_answered[k].is_after(psn))
        .max_by_key(|&k| psn.forward_distance(q.reads_answered[k]));
    newest.map(|k| q.reads_answered.swap_remove(k)).is_some()
}

/// Records the end of a received message, in PSN order (a retransmitted message can be
/// reported after later ones). A message already delivered or queued is ignored. When the
/// queue is full the message with the highest PSN is dropped: [`ack_limit`] then never
/// acknowledges it, so the requester sends it again.
#[inline]
fn push_msg(q: &mut Responder, m: MsgEnd) -> bool {
    // A retransmitted LAST is reported again: keep one entry per message.
    if m.psn.is_before(q.next_msg) || q.msgs.iter().any(|x| x.psn == m.psn) {
        return true;
    }
    if !insert_sorted(&mut q.msgs, m, |x| x.psn) {
        q.reports_dropped = true;
        core_warn!(
            "QP {:#x}: message queue full; a message waits for its resend",
            q.qpn.get()
        );
        return q.msgs.iter().any(|x| x.psn == m.psn);
    }
    true
}

/// Inserts `item` into `queue`, kept sorted by `psn`. When the queue is full, the entry
/// with the highest PSN (possibly `item`) is dropped; returns false then.
#[inline]
fn insert_sorted<T: Copy, const N: usize>(
    queue: &mut heapless::Deque<T, N>,
    item: T,
    psn: impl Fn(&T) -> Psn,
) -> bool {
    let mut kept = true;
    if queue.is_full() {
        kept = false;
        match queue.back() {
            Some(last) if psn(last).is_after(psn(&item)) => {
                queue.pop_back();
            }
            _ => return false,
        }
    }
    // Entries after `item` move aside (rare: only a resend arrives out of order).
    let mut later: heapless::Vec<T, N> = heapless::Vec::new();
    while queue.back().is_some_and(|b| psn(b).is_after(psn(&item))) {
        if let Some(b) = queue.pop_back() {
            let _ = later.push(b);
        }
    }
    let _ = queue.push_back(item);
    while let Some(b) = later.pop() {
        let _ = queue.push_back(b);
    }
    kept
}

/// The PSN up to which QP `q` may acknowledge, given `base`, its first missing PSN. A PSN
/// that ends a message is acknowledged only once that message's end (and, for a message of
/// several packets, its FIRST with the length) is recorded, so its completion can never be
/// lost: the card's window bitmaps mark PSNs whose own reports may still be on the way (its
/// loss report for the slide that packet P causes comes before P's report), or that the
/// engine had no room to record.
#[inline]
fn ack_limit(q: &Responder, base: Psn) -> Psn {
    // Messages are contiguous in PSN space: the next one starts at `next_msg`.
    let mut cur = q.next_msg;
    for m in q.msgs.iter() {
        if !m.psn.is_before(base) {
            break;
        }
        let whole = if m.only {
            m.psn == cur
        } else {
            cur.is_before(m.psn) && q.firsts.iter().any(|f| f.0 == cur)
        };
        if !whole {
            return open_message_limit(q, cur, m.psn);
        }
        cur = m.psn.wrapping_add(1);
    }
    if cur.is_before(base) {
        open_message_limit(q, cur, base)
    } else {
        base
    }
}

/// How far into the message starting at `start`, whose end is not recorded, an ACK may go
/// (at most `limit`): through its FIRST and MIDDLE packets, which need no report, when its
/// FIRST says where it ends; not at all otherwise.
#[inline]
fn open_message_limit(q: &Responder, start: Psn, limit: Psn) -> Psn {
    let Some(&(_, len, addr)) = q.firsts.iter().find(|f| f.0 == start) else {
        return start;
    };
    let packets = num_packets(addr, len, q.pmtu);
    if packets < 2 {
        return start;
    }
    let last = start.wrapping_add(packets - 1);
    if last.is_before(limit) {
        last
    } else {
        limit
    }
}

/// Takes the oldest message that ends before `limit` off QP `q`'s books, to complete it: a
/// message of several packets gets its length and address from its FIRST packet's report
/// (the message starts right after the previous one), and the next message starts after it.
#[inline]
fn next_ready(q: &mut Responder, limit: Psn) -> Option<MsgEnd> {
    let mut m = match q.msgs.front() {
        Some(m) if m.psn.is_before(limit) => q.msgs.pop_front()?,
        _ => return None,
    };
    let start = q.next_msg;
    m.first = start;
    if !m.only {
        if let Some(f) = q.firsts.iter().find(|f| f.0 == start) {
            m.len = f.1;
            m.addr = f.2;
        }
    }
    q.next_msg = m.psn.wrapping_add(1);
    let next = q.next_msg;
    while q.firsts.front().is_some_and(|f| f.0.is_before(next)) {
        q.firsts.pop_front();
    }
    Some(m)
}

#[cfg(test)]
#[path = "delivery_tests.rs"]
mod delivery_tests;
