//! The completer: ACKs and NAKs from the peer retire the send queue in order, a NAK or a
//! timeout resends go-back-N from the first lost PSN, retries run out into RETRY_EXC_ERR,
//! and completions go to the send CQ in posting order.

use crate::qp::QpState;
use crate::time::Instant;
use crate::transport::{card_bitmap_base, Chunk, PacketFragmenter, Psn, PsnRange};

use super::qp::QpIndex;
use super::requester::{Batch, Path};
use super::storage::Timer;
use super::wqe::{Wqe, WqeState};
use super::wr::WcStatus;
use super::{Device, Platform, Storage};

impl<P: Platform, S: Storage> Device<P, S> {
    /// The peer's cumulative ACK: every PSN before `psn` arrived. Retires acknowledged
    /// WQEs in order.
    pub(crate) fn on_ack(&mut self, i: QpIndex, psn: Psn, now: Instant) {
        let a = self.qp(i).attrs;
        if !self.qp(i).req.ack(psn, a.retry_cnt) {
            return;
        }
        let mut read_waiting = false;
        self.sq(i).for_each_sent(|w| {
            if w.state == WqeState::Sent && !psn.is_before(w.end_psn()) && !w.is_atomic() {
                w.state = WqeState::Acked;
            }
            read_waiting |= w.awaits_response();
        });
        // A READ whose request was acknowledged still waits for its response: keep the
        // timer, which resends the request if the response never comes.
        let idle = self.qp(i).req.all_acked() && !read_waiting;
        let at = if idle {
            None
        } else {
            a.ack_timeout(self.cfg.ack_timeout_min).map(|t| now + t)
        };
        self.timers(i).set(Timer::Retransmit, at);
        self.complete_head(i);
    }

    /// A NAK the peer's driver sent (the card's quiet report showed it a hole): resend
    /// from `from`.
    pub(crate) fn on_driver_nak(&mut self, i: QpIndex, from: Psn, now: Instant) {
        self.on_ack(i, from, now);
        self.retransmit(i, from, now);
    }

    /// The peer card's NAK. The card never marks READ requests or zero-length WRITEs in
    /// its bitmap (nic-behaviour.md 3.2), so their PSNs always look lost: resend only from
    /// a PSN that carried data. A NAK with no such PSN (e.g. the card's first packet after
    /// a reset: review correction 7) carries no loss.
    pub(crate) fn on_card_nak(
        &mut self,
        i: QpIndex,
        psn_before_slide: u32,
        pre_bitmap: u128,
        psn_now: u32,
        now: Instant,
    ) {
        let new_bottom = card_bitmap_base(Psn::from_raw(psn_now));
        if let Some(lost) = self.first_data_lost(i, psn_before_slide, pre_bitmap, new_bottom) {
            self.retransmit(i, lost, now);
        }
    }

    /// The first PSN a peer card's NAK reports lost that this QP sent with data and that
    /// is not yet acknowledged.
    fn first_data_lost(
        &mut self,
        i: QpIndex,
        psn_before_slide: u32,
        pre_bitmap: u128,
        new_bottom: Psn,
    ) -> Option<Psn> {
        let (acked, next) = (self.qp(i).req.acked_psn(), self.qp(i).req.next_psn());
        let sq = self.sq(i);
        let unmarked = |psn: Psn| sq.sent_wqes().any(|w| w.psn == psn && w.unmarked_by_card());
        let pre_base = card_bitmap_base(Psn::from_raw(psn_before_slide));
        let old_top = pre_base.wrapping_add(128);
        let jumped = if old_top.is_before(new_bottom) {
            PsnRange::from_bounds(old_top, new_bottom)
        } else {
            PsnRange::new(old_top, 0)
        };
        let mut candidates = (0..128u32)
            .filter(|b| pre_bitmap >> b & 1 == 0)
            .map(|b| pre_base.wrapping_add(b))
            .chain(jumped.iter().take(4096))
            .filter(|p| p.is_before(new_bottom) && !p.is_before(acked) && p.is_before(next));
        candidates.find(|p| !unmarked(*p))
    }

    /// The peer's packets keep arriving on QP `i` (its receive window moved): a READ waiting
    /// for its response is being answered, so its timer and retries start again, as an ACK
    /// would for a WRITE. Without this a response longer than `retry_cnt + 1` timeouts
    /// failed with RETRY_EXC_ERR while its data was still flowing in.
    pub(crate) fn response_progress(&mut self, i: QpIndex, now: Instant) {
        let reading = self.sq(i).sent_wqes().any(Wqe::read_pending);
        if reading && self.timers(i).get(Timer::Retransmit).is_some() {
            let a = self.qp(i).attrs;
            self.qp(i).req.reset_retries(a.retry_cnt);
            let at = a.ack_timeout(self.cfg.ack_timeout_min).map(|t| now + t);
            self.timers(i).set(Timer::Retransmit, at);
        }
    }

    /// The response data of a READ arrived: it belongs to the oldest READ waiting for data
    /// with the same sink address and length. A resent request gets a second response (the
    /// card has no duplicate detection): it finds no waiting READ and is ignored.
    pub(crate) fn read_response_arrived(&mut self, i: QpIndex, addr: u64, len: u32) {
        let mut found = false;
        self.sq(i).for_each_sent(|w| {
            let (laddr, _, wlen, _, _) = w.buffers();
            if !found && w.read_pending() && laddr.0 == addr && wlen == len {
                w.set_read_done();
                found = true;
            }
        });
        self.complete_head(i);
    }

    /// Delivers completions from the head of QP `i`'s send queue, in posting order.
    pub(crate) fn complete_head(&mut self, i: QpIndex) {
        loop {
            let sq = self.sq(i);
            if sq.sent() == 0 {
                // Nothing on the wire any more (e.g. a READ completed by its response after
                // its ACK): a timer left running would fail the idle QP.
                self.timers(i).set(Timer::Retransmit, None);
                return;
            }
            if let Some(status) = sq.get(0).and_then(Wqe::atomic_failure) {
                return self.fail_qp(i, status);
            }
            if !sq.get(0).is_some_and(Wqe::is_done) {
                return;
            }
            self.retire_head(i, WcStatus::Success);
        }
    }

    /// Takes the head WQE off QP `i`'s send queue and completes it with `status`: an error
    /// always, a success only when signaled (with the length), never a WQE the engine made
    /// itself (a READ response). `None` if the queue is empty.
    pub(crate) fn retire_head(&mut self, i: QpIndex, status: WcStatus) -> Option<Wqe> {
        let w = self.sq(i).pop()?;
        let (qpn, cq) = (self.qp(i).attrs.qpn, self.qp(i).attrs.send_cq);
        let wc = w.completion(status, qpn);
        if !w.is_internal() {
            let q = self.qp(i);
            q.req.note_retired();
            let slots = q.req.sq.retired(wc.is_some());
            if let Some(mut wc) = wc {
                wc.sq_slots = slots;
                self.complete(cq, wc);
            }
        }
        Some(w)
    }

    /// Go-back-N from `from`: every sent packet at or after it is posted again with
    /// is_retry, including the packets of a WQE that started before it.
    pub(crate) fn retransmit(&mut self, i: QpIndex, from: Psn, now: Instant) {
        self.resend(i, from, now, false)
    }

    /// Go-back-N from `from`; after a timeout (`reads_too`) also the requests of READs
    /// that were acknowledged but whose response never came.
    ///
    /// Nothing on the wire (a NAK that arrived after the ACKs that made it stale): nothing
    /// is resent and no timer armed; an idle QP with a running timer would fail with
    /// RETRY_EXC_ERR after `retry_cnt + 1` expiries over nothing.
    fn resend(&mut self, i: QpIndex, from: Psn, now: Instant, reads_too: bool) {
        if self.sq(i).sent() == 0 {
            self.timers(i).set(Timer::Retransmit, None);
            return;
        }
        let a = self.qp(i).attrs;
        if !a.connected() {
            // A QP in ERR (or RESET) sends nothing again: its work was flushed, and what it
            // posted may name an MR being deregistered.
            return;
        }
        self.stats.retransmits += 1;
        let path = Path::of(&a);
        let (acked, next) = (self.qp(i).req.acked_psn(), self.qp(i).req.next_psn());
        let from = if from.is_before(acked) { acked } else { from };
        let mut batch = Batch::new();
        let sent = self.sq(i).sent();
        for k in 0..sent {
            let Some(w) = self.sq(i).get(k).copied() else {
                break;
            };
            let read_waiting = reads_too && w.read_pending();
            if w.state != WqeState::Sent && !read_waiting || w.is_atomic() {
                continue;
            }
            // Only what was sent: the window may have stopped the newest request early.
            let psns = PsnRange::new(w.psn, w.npsn - w.unsent_packets(next));
            if !psns.contains(from) && from.is_after(psns.start()) && !read_waiting {
                continue;
            }
            if w.is_whole() {
                let (laddr, _, len, raddr, _) = w.buffers();
                let whole = Chunk {
                    laddr,
                    raddr,
                    len,
                    psn: w.psn,
                    packets: w.npsn,
                    is_first: true,
                    is_last: true,
                    is_retry: true,
                };
                self.append_chunk(&path, &w, &whole, &mut batch, true);
                continue;
            }
            let start = if psns.contains(from) {
                from
            } else {
                psns.start()
            };
            let range = PsnRange::from_bounds(start, psns.end());
            let Ok(frag) = PacketFragmenter::new(w.span(), path.pmtu, range) else {
                continue;
            };
            for c in frag {
                self.append_chunk(&path, &w, &c, &mut batch, true);
            }
        }
        if batch.len() > 0 {
            self.flush_send_waiting(&mut batch);
            let mark = self.send_mark();
            self.qp(i).req.mark_ring(mark);
        }
        let at = a.ack_timeout(self.cfg.ack_timeout_min).map(|t| now + t);
        self.timers(i).set(Timer::Retransmit, at);
    }

    /// The retransmission timer fired: resend from the oldest unacknowledged PSN, or fail
    /// with RETRY_EXC_ERR when no retry is left.
    ///
    /// A timer that fires while the card has not yet fetched every descriptor of the QP
    /// from the send ring is not a loss: the packets are queued behind other QPs' (a busy
    /// card, a loaded host), not on the wire. The timer starts again without using a
    /// retry, as the IB timer starts when a packet is sent; only a silence after the
    /// card took everything counts (or [`super::requester::QUEUED_WAITS_MAX`] such
    /// expiries in a row: a card that stopped fetching).
    pub(crate) fn on_timeout(&mut self, i: QpIndex, now: Instant) {
        if self.on_inv_timeout(i) {
            return;
        }
        if self.sq(i).sent() == 0 || !self.qp(i).attrs.connected() {
            // Nothing to wait for (a timer left armed), or a QP that sends nothing again.
            self.timers(i).set(Timer::Retransmit, None);
            return;
        }
        let mark = self.qp(i).req.ring_mark();
        let fetched = self.send_fetched(mark);
        if self.qp(i).req.wait_for_card(fetched) {
            self.stats.timeouts_queued += 1;
            let a = self.qp(i).attrs;
            let at = a.ack_timeout(self.cfg.ack_timeout_min).map(|t| now + t);
            self.timers(i).set(Timer::Retransmit, at);
            return;
        }
        self.stats.timeouts += 1;
        let (acked, next) = (self.qp(i).req.acked_psn(), self.qp(i).req.next_psn());
        core_debug!(
            "QP {:#x}: no ACK for PSNs {:#x}..{:#x} within the timeout",
            self.qp(i).attrs.qpn.get(),
            acked.get(),
            next.get()
        );
        if !self.qp(i).req.use_retry() {
            let sq = self.sq(i);
            let (sent, queued) = (sq.sent(), sq.len());
            let reads = sq.sent_wqes().filter(|w| w.read_pending()).count();
            let a = self.qp(i).attrs;
            core_warn!(
                "QP {:#x}: retry count ({}) exceeded: no answer from QP {:#x} for PSNs {:#x}..{:#x}; {} of {} WQEs sent, {} READs without their response",
                a.qpn.get(),
                a.retry_cnt,
                a.dest_qpn.get(),
                acked.get(),
                next.get(),
                sent,
                queued,
                reads
            );
            self.fail_qp(i, WcStatus::RetryExcErr);
            return;
        }
        self.resend(i, acked, now, true);
        self.resend_atomics(i);
        // The card says nothing of what it refused: ask the responder (access_check.rs).
        self.send_access_check(i);
    }

    /// The head WQE completes with `status`, the QP goes to ERR and the rest is flushed.
    pub(crate) fn fail_qp(&mut self, i: QpIndex, status: WcStatus) {
        self.qp(i).attrs.state = QpState::Err;
        self.timers(i).set(Timer::Retransmit, None);
        self.retire_head(i, status);
        self.enter_error(i);
    }

    /// QP `i` goes to ERR on its own (its CQ overran, its peer is gone): its work is
    /// flushed and QP_FATAL raised.
    pub(crate) fn fatal(&mut self, i: QpIndex) {
        self.enter_error(i);
        let qpn = self.qp(i).attrs.qpn;
        self.events
            .raise(super::events::AsyncEvent::QpFatal { qpn });
    }

    /// Completes every outstanding WQE and receive WR of QP `i` with WR_FLUSH_ERR.
    pub(crate) fn flush_qp(&mut self, i: QpIndex) {
        while self.retire_head(i, WcStatus::WrFlushErr).is_some() {}
        while self.fail_recv(i, WcStatus::WrFlushErr) {}
        self.sq(i).forget_sent();
        self.qp(i).atomics.flushed();
        self.timers(i).set(Timer::Retransmit, None);
        self.qp(i).rq.forget_unannounced();
    }
}
