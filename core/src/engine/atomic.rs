//! Atomics: fetch-and-add and compare-and-swap on 8 bytes of a peer's registered memory
//! (IBV_ATOMIC_HCA among this driver's users). The card has no atomic engine (its CAS/FAA
//! descriptors carry no operands and its receiver drops those packets: nic-behaviour.md
//! 1.2, 4.1), so an atomic never goes on the card: the requester's driver sends it over
//! the out-of-band channel (`oob::atomic`: request, operands, reply), the responder's
//! driver executes it on its memory ([`MemoryResolver::atomic`]) and answers, and the
//! requester's driver writes the original value into the local sink.
//!
//! **Ordering.** The send queue still retires in posting order (an atomic is done when
//! its reply arrived). On the way out:
//! - an atomic leaves only once every PSN sent before it is acknowledged. The responder
//!   acknowledges a WRITE (or SEND) only once all its packets are reported placed (the
//!   card writes a report after the payload DMA, and no PSN that ends a message is
//!   acknowledged before its report: `responder::ack_limit`), so an atomic executes after
//!   the data of every WRITE posted before it. A READ before it only needs its request
//!   acknowledged: IB lets a later request overtake a READ without IBV_SEND_FENCE.
//! - a request posted after an atomic leaves only once every atomic before it was
//!   answered, so a WRITE after an atomic cannot overtake it.
//! - atomics after atomics go at once, up to [`ATOMIC_WINDOW`] waiting for their reply:
//!   the channel is one ordered stream per pair of devices and the responder executes
//!   them in sequence-number order.
//!
//! **Retransmission.** A request waits under the QP's retransmission timer; when it fires
//! the atomics still waiting are sent again with their sequence numbers (and RETRY_EXC_ERR
//! ends it when the retries run out). The responder executes each sequence number once:
//! it keeps the replies of its last [`ATOMIC_RESULTS`] atomics and answers a resent one
//! from there, as an IB responder does; a request ahead of the next expected number (one
//! before it was lost) is dropped and comes again with the others.
//!
//! **Errors.** A requester-side mistake fails the post (`post_send`). The responder answers
//! a bad rkey, bounds or missing REMOTE_ATOMIC (QP or MR) with an access error, a
//! misaligned address with an invalid request; the requester's WR then completes with
//! REM_ACCESS_ERR or REM_INV_REQ_ERR and its QP goes to ERR, as for every remote error. A
//! peer that does not take atomics (no ATOMICS in its hello) gets no request: the transport
//! answers for it and the WR completes with REM_INV_REQ_ERR.
//!
//! [`MemoryResolver::atomic`]: crate::platform::MemoryResolver::atomic
//!
//! The core touches no user memory itself: the platform executes the atomic and writes the
//! sink, and refuses any address outside what it pinned for writing.

use core::net::Ipv4Addr;

use crate::addr::VirtAddr;
use crate::desc::send::WorkReqOpcode;
use crate::desc::AccessFlags;
use crate::keys::MrKey;
use crate::oob::{AtomicMessage, AtomicOp, AtomicReply, AtomicRequest, AtomicStatus};
use crate::platform::{MemoryResolver, OobTransport, PlatformError};
use crate::qp::QpAccessFlags;
use crate::time::Instant;

use super::error::VerbsError;
use super::qp::{QpAttrs, QpIndex};
use super::storage::Timer;
use super::wqe::{Request, RequestOp, Wqe, WqeKind, WqeState};
use super::wr::{SendWr, WcOpcode, WcStatus};
use super::{Device, Platform, Storage};

/// Atomics one QP may have waiting for their reply (what the stand-in reports as
/// `max_qp_rd_atom`); more wait in the send queue.
pub const ATOMIC_WINDOW: u32 = 16;
/// Replies a responder keeps per QP to answer resent requests (at least the window).
pub const ATOMIC_RESULTS: usize = 16;

const _: () = assert!(ATOMIC_RESULTS >= ATOMIC_WINDOW as usize);

/// What an atomic WQE holds beyond the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AtomicWqe {
    pub(crate) op: AtomicOp,
    /// Its sequence number (assigned when first sent).
    pub(crate) seq: u32,
    /// The reply came and the atomic failed with this status.
    pub(crate) failed: Option<WcStatus>,
}

impl AtomicWqe {
    #[inline]
    pub(crate) const fn new(op: AtomicOp) -> Self {
        AtomicWqe {
            op,
            seq: 0,
            failed: None,
        }
    }

    /// The completion's opcode.
    #[inline]
    pub(crate) const fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            AtomicOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            AtomicOp::CompareSwap { .. } => WcOpcode::CompSwap,
        }
    }

    /// The card's op code for it (never posted: the card cannot carry the operands).
    #[inline]
    pub(crate) const fn card_opcode(&self) -> WorkReqOpcode {
        match self.op {
            AtomicOp::FetchAdd { .. } => WorkReqOpcode::AtomicFetchAdd,
            AtomicOp::CompareSwap { .. } => WorkReqOpcode::AtomicCmpSwp,
        }
    }
}

impl Wqe {
    /// The atomic part of an application atomic.
    #[inline]
    fn atomic(&self) -> Option<&AtomicWqe> {
        match &self.kind {
            WqeKind::Request(Request {
                op: RequestOp::Atomic(a),
                ..
            }) => Some(a),
            _ => None,
        }
    }

    /// An application atomic.
    #[inline]
    pub(crate) fn is_atomic(&self) -> bool {
        self.atomic().is_some()
    }

    /// An atomic sent and not answered.
    #[inline]
    pub(crate) fn atomic_waiting(&self) -> bool {
        self.is_atomic() && self.state == WqeState::Sent
    }

    /// The status an answered atomic failed with.
    #[inline]
    pub(crate) fn atomic_failure(&self) -> Option<WcStatus> {
        self.atomic()
            .filter(|_| self.state == WqeState::Acked)
            .and_then(|a| a.failed)
    }

    /// Waits for a response of the peer beyond the ACK: READ data, an atomic's reply.
    #[inline]
    pub(crate) fn awaits_response(&self) -> bool {
        self.read_pending() || self.atomic_waiting()
    }

    fn atomic_mut(&mut self) -> Option<&mut AtomicWqe> {
        match &mut self.kind {
            WqeKind::Request(Request {
                op: RequestOp::Atomic(a),
                ..
            }) => Some(a),
            _ => None,
        }
    }
}

/// A reply the responder keeps for resent requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Saved {
    seq: u32,
    status: AtomicStatus,
    value: u64,
}

/// A QP's atomics, both roles: the requester's sequence numbers, the responder's next
/// expected one and its last replies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Atomics {
    /// Requester: the sequence number of the next atomic sent.
    next_seq: u32,
    /// Requester: atomics sent and not answered.
    in_flight: u32,
    /// Responder: the sequence number of the next atomic to execute.
    expected: u32,
    /// Responder: the replies of the last atomics executed, at `seq % ATOMIC_RESULTS`.
    results: [Option<Saved>; ATOMIC_RESULTS],
}

impl Atomics {
    /// Atomics sent and not answered.
    #[inline]
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The QP was flushed: nothing waits for a reply any more.
    #[inline]
    pub(crate) fn flushed(&mut self) {
        self.in_flight = 0;
    }

    /// The reply kept for `seq`, if it is one of the last executed.
    fn saved(&self, seq: u32) -> Option<Saved> {
        self.results
            .get(seq as usize % ATOMIC_RESULTS)
            .copied()
            .flatten()
            .filter(|s| s.seq == seq)
    }

    /// `seq` (the expected one) was executed with `status` and `value`.
    fn executed(&mut self, seq: u32, status: AtomicStatus, value: u64) {
        if let Some(slot) = self.results.get_mut(seq as usize % ATOMIC_RESULTS) {
            *slot = Some(Saved { seq, status, value });
        }
        self.expected = seq.wrapping_add(1);
    }
}

/// Where a request stands against the responder's next expected sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrival {
    Next,
    Resent,
    Early,
}

#[inline]
fn arrival(seq: u32, expected: u32) -> Arrival {
    match expected.wrapping_sub(seq) as i32 {
        0 => Arrival::Next,
        d if d > 0 => Arrival::Resent,
        _ => Arrival::Early,
    }
}

/// The request of atomic WQE `w` of the QP with attributes `a`.
fn request_of(a: &QpAttrs, w: &Wqe, at: &AtomicWqe) -> AtomicRequest {
    let (_, _, _, raddr, rkey) = w.buffers();
    AtomicRequest {
        qpn: a.qpn.get(),
        dest_qpn: a.dest_qpn.get(),
        seq: at.seq,
        raddr: raddr.0,
        rkey: rkey.get(),
        op: at.op,
    }
}

/// The requester's status for a reply's.
#[inline]
fn wc_status(s: AtomicStatus) -> WcStatus {
    match s {
        AtomicStatus::Done => WcStatus::Success,
        AtomicStatus::AccessError => WcStatus::RemAccessErr,
        AtomicStatus::InvalidRequest | AtomicStatus::Unsupported => WcStatus::RemInvReqErr,
        AtomicStatus::OperationError | AtomicStatus::Unknown(_) => WcStatus::RemOpErr,
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// The requester's checks of an atomic (`post_send`): a channel to carry it, a local
    /// sink of exactly 8 bytes in an MR with LOCAL_WRITE, an 8-byte aligned remote address.
    pub(crate) fn check_atomic(&mut self, pd: u32, wr: &SendWr) -> Result<(), VerbsError> {
        if self.oob.is_none() {
            return Err(VerbsError::Unsupported {
                what: "atomics on a platform without an out-of-band channel",
            });
        }
        if wr.len != 8 {
            return Err(VerbsError::InvalidArgument {
                what: "an atomic's local buffer (its SGE) must be exactly 8 bytes",
            });
        }
        if wr.raddr.0 % 8 != 0 {
            return Err(VerbsError::InvalidArgument {
                what: "an atomic's remote address must be 8-byte aligned",
            });
        }
        if !self.mr_covers(wr.lkey, wr.laddr.0, 8, AccessFlags::LOCAL_WRITE, Some(pd)) {
            return Err(VerbsError::LocalProtection {
                lkey: wr.lkey.get(),
            });
        }
        Ok(())
    }

    /// Whether `w`, the next WQE of QP `i` to go, may go now as far as atomics are
    /// concerned (the module docs: ordering).
    pub(crate) fn atomics_allow(&mut self, i: QpIndex, w: &Wqe) -> bool {
        let q = self.qp(i);
        if w.is_atomic() {
            q.req.all_acked() && q.atomics.in_flight < ATOMIC_WINDOW
        } else {
            q.atomics.in_flight == 0
        }
    }

    /// Sends atomic WQE `w` (the `k`-th of QP `i`'s send queue) to the responder; false
    /// when the channel cannot take it now (it stays pending and goes at a later poll).
    /// A request the channel lost is waited for like one on the way: the timer resends it.
    pub(crate) fn send_atomic_wqe(
        &mut self,
        i: QpIndex,
        k: u32,
        mut w: Wqe,
        timeout: Option<Instant>,
    ) -> bool {
        let a = self.qp(i).attrs;
        let seq = self.qp(i).atomics.next_seq;
        let Some(at) = w.atomic_mut() else {
            return false;
        };
        at.seq = seq;
        let at = *at;
        let msg = AtomicMessage::Request(request_of(&a, &w, &at));
        match self.oob.as_mut().map(|o| o.send_atomic(a.peer_ip, &msg)) {
            Some(Err(PlatformError::WouldBlock)) => return false,
            Some(Ok(())) => {}
            Some(Err(e)) => core_warn!(
                "QP {:#x}: atomic {} to {} not sent ({}); the retransmission timer resends it",
                a.qpn.get(),
                seq,
                a.peer_ip,
                e
            ),
            None => core_warn!(
                "QP {:#x}: no out-of-band channel for an atomic",
                a.qpn.get()
            ),
        }
        self.stats.atomics_sent += 1;
        let q = self.qp(i);
        q.atomics.next_seq = seq.wrapping_add(1);
        q.atomics.in_flight += 1;
        // No PSN of its own: it sits at the QP's next PSN with none.
        w.psn = q.req.next_psn();
        w.npsn = 0;
        w.state = WqeState::Sent;
        let mut sq = self.sq(i);
        if let Some(slot) = sq.get_mut(k) {
            *slot = w;
        }
        sq.mark_sent();
        self.timers(i).start(Timer::Retransmit, timeout);
        true
    }

    /// The retransmission timer fired: the atomics of QP `i` still waiting for their
    /// reply go again, with their sequence numbers.
    pub(crate) fn resend_atomics(&mut self, i: QpIndex) {
        if self.qp(i).atomics.in_flight == 0 {
            return;
        }
        let a = self.qp(i).attrs;
        for k in 0..self.sq(i).sent() {
            let Some(w) = self.sq(i).get(k).copied() else {
                break;
            };
            let Some(at) = w.atomic().filter(|_| w.atomic_waiting()) else {
                continue;
            };
            let msg = AtomicMessage::Request(request_of(&a, &w, at));
            self.stats.atomics_resent += 1;
            if let Some(Err(e)) = self.oob.as_mut().map(|o| o.send_atomic(a.peer_ip, &msg)) {
                core_warn!("QP {:#x}: atomic {} not resent: {}", a.qpn.get(), at.seq, e);
            }
        }
    }

    /// An atomic message from the driver at `from`.
    pub(crate) fn on_atomic(&mut self, from: Ipv4Addr, msg: AtomicMessage, now: Instant) {
        match msg {
            AtomicMessage::Request(r) => self.on_atomic_request(from, &r),
            AtomicMessage::Reply(r) => self.on_atomic_reply(from, &r, now),
        }
    }

    /// The connected QP that `from`'s QP `peer_qpn` talks to, if it is `qpn`.
    fn atomic_qp(&mut self, from: Ipv4Addr, peer_qpn: u32, qpn: u32) -> Option<QpIndex> {
        self.peer_qp(from, peer_qpn)
            .filter(|&i| self.qp(i).attrs.qpn.get() == qpn)
    }

    /// Responder: executes a new request once, answers a resent one from its kept reply,
    /// drops one that came early (the requester resends it) or names no connected QP (as
    /// the card drops packets for a QP that is not in RTR: the requester retries, then
    /// fails with RETRY_EXC_ERR).
    fn on_atomic_request(&mut self, from: Ipv4Addr, req: &AtomicRequest) {
        let Some(i) = self.atomic_qp(from, req.qpn, req.dest_qpn) else {
            self.stats.atomics_dropped += 1;
            core_warn!(
                "atomic request {} from {} QP {:#x} for QP {:#x}: no connected QP of ours has that peer; dropped",
                req.seq,
                from,
                req.qpn,
                req.dest_qpn
            );
            return;
        };
        let atomics = self.qp(i).atomics;
        let (status, value) = match arrival(req.seq, atomics.expected) {
            Arrival::Next => {
                let (status, value) = self.execute_atomic(i, req);
                self.qp(i).atomics.executed(req.seq, status, value);
                self.stats.atomics_executed += 1;
                (status, value)
            }
            Arrival::Resent => {
                let Some(s) = atomics.saved(req.seq) else {
                    self.stats.atomics_dropped += 1;
                    core_warn!(
                        "atomic request {} from {} resent after its reply was forgotten (next is {}); dropped",
                        req.seq,
                        from,
                        atomics.expected
                    );
                    return;
                };
                self.stats.atomic_duplicates += 1;
                (s.status, s.value)
            }
            Arrival::Early => {
                self.stats.atomics_dropped += 1;
                core_debug!(
                    "atomic request {} from {} before {}: dropped, it comes again",
                    req.seq,
                    from,
                    atomics.expected
                );
                return;
            }
        };
        let reply = AtomicReply {
            qpn: req.dest_qpn,
            dest_qpn: req.qpn,
            seq: req.seq,
            status,
            value,
        };
        if let Some(Err(e)) = self
            .oob
            .as_mut()
            .map(|o| o.send_atomic(from, &AtomicMessage::Reply(reply)))
        {
            // The requester's timer resends the request; the kept reply answers it.
            core_warn!("atomic reply {} to {} not sent: {}", req.seq, from, e);
        }
    }

    /// Responder: checks `req` against QP `i` and its MR and executes it; the status and
    /// the original value.
    fn execute_atomic(&mut self, i: QpIndex, req: &AtomicRequest) -> (AtomicStatus, u64) {
        let a = self.qp(i).attrs;
        let refuse = |status: AtomicStatus, why: &str| {
            core_warn!(
                "QP {:#x}: atomic {} at {:#x} (rkey {:#x}) refused: {}",
                a.qpn.get(),
                req.seq,
                req.raddr,
                req.rkey,
                why
            );
            (status, 0)
        };
        if !a.access.contains(QpAccessFlags::REMOTE_ATOMIC) {
            return refuse(AtomicStatus::AccessError, "the QP lacks REMOTE_ATOMIC");
        }
        if req.raddr % 8 != 0 {
            return refuse(AtomicStatus::InvalidRequest, "address not 8-byte aligned");
        }
        let rkey = MrKey::from_raw(req.rkey);
        if !self.mr_covers(rkey, req.raddr, 8, AccessFlags::REMOTE_ATOMIC, Some(a.pd)) {
            return refuse(
                AtomicStatus::AccessError,
                "rkey, bounds, PD or REMOTE_ATOMIC of the MR",
            );
        }
        // Aligned and inside a valid MR with REMOTE_ATOMIC, which needs LOCAL_WRITE: `reg_mr`
        // pinned it with `write`, and it stays pinned until `dereg_mr`.
        match self.mem.atomic(VirtAddr(req.raddr), req.op) {
            Ok(old) => (AtomicStatus::Done, old),
            Err(e) => {
                core_error!("QP {:#x}: atomic {} failed: {}", a.qpn.get(), req.seq, e);
                (AtomicStatus::OperationError, 0)
            }
        }
    }

    /// Requester: the reply to one of our atomics. The original value goes into its sink,
    /// the WQE is done (or failed), and the send queue goes on in order.
    fn on_atomic_reply(&mut self, from: Ipv4Addr, r: &AtomicReply, now: Instant) {
        let found = self.atomic_qp(from, r.qpn, r.dest_qpn).and_then(|i| {
            let sq = self.sq(i);
            (0..sq.sent())
                .find(|&k| {
                    sq.get(k).is_some_and(|w| {
                        w.atomic_waiting() && w.atomic().map(|a| a.seq) == Some(r.seq)
                    })
                })
                .map(|k| (i, k))
        });
        let Some((i, k)) = found else {
            // A second reply to a resent request, or one for a QP flushed since.
            self.stats.atomic_replies_stale += 1;
            core_debug!(
                "atomic reply {} from {} QP {:#x}: no atomic waits for it",
                r.seq,
                from,
                r.qpn
            );
            return;
        };
        let Some(mut w) = self.sq(i).get(k).copied() else {
            return;
        };
        let failed = match r.status {
            AtomicStatus::Done => self.write_sink(i, &w, r.value),
            other => {
                let status = wc_status(other);
                core_warn!(
                    "QP {:#x}: atomic {} failed at {} (reply status {}): completion status {}, QP to ERR",
                    self.qp(i).attrs.qpn.get(),
                    r.seq,
                    from,
                    other.raw(),
                    status as u32
                );
                Some(status)
            }
        };
        if let Some(at) = w.atomic_mut() {
            at.failed = failed;
        }
        w.state = WqeState::Acked;
        if let Some(slot) = self.sq(i).get_mut(k) {
            *slot = w;
        }
        let a = self.qp(i).attrs;
        let q = self.qp(i);
        q.atomics.in_flight = q.atomics.in_flight.saturating_sub(1);
        // An answer is progress, as an ACK is: the retries refill and the timer restarts
        // for what still waits.
        q.req.reset_retries(a.retry_cnt);
        let waiting = !q.req.all_acked() || self.sq(i).sent_wqes().any(Wqe::awaits_response);
        let at = if waiting {
            a.ack_timeout(self.cfg.ack_timeout_min).map(|t| now + t)
        } else {
            None
        };
        self.timers(i).set(Timer::Retransmit, at);
        self.complete_head(i);
        self.transmit(i, now);
    }

    /// Writes an atomic's original `value` into the sink of WQE `w` of QP `i`; the failure
    /// status if the sink is not there any more.
    fn write_sink(&mut self, i: QpIndex, w: &Wqe, value: u64) -> Option<WcStatus> {
        let (laddr, lkey, _, _, _) = w.buffers();
        let pd = self.qp(i).attrs.pd;
        if !self.mr_covers(lkey, laddr.0, 8, AccessFlags::LOCAL_WRITE, Some(pd)) {
            return Some(WcStatus::LocProtErr);
        }
        // Inside a valid MR with LOCAL_WRITE, which `reg_mr` pinned with `write`.
        match self.mem.write(laddr, &value.to_ne_bytes()) {
            Ok(()) => None,
            Err(e) => {
                core_error!("atomic sink {:#x}: {}", laddr.0, e);
                Some(WcStatus::LocProtErr)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_across_the_wrap() {
        assert_eq!(arrival(5, 5), Arrival::Next);
        assert_eq!(arrival(4, 5), Arrival::Resent);
        assert_eq!(arrival(u32::MAX, 1), Arrival::Resent);
        assert_eq!(arrival(6, 5), Arrival::Early);
        assert_eq!(arrival(0, u32::MAX), Arrival::Early);
    }

    #[test]
    fn the_responder_keeps_its_last_replies() {
        let mut a = Atomics::default();
        for seq in 0..40u32 {
            a.executed(seq, AtomicStatus::Done, seq as u64 * 10);
        }
        assert_eq!(a.expected, 40);
        assert_eq!(a.saved(39).map(|s| s.value), Some(390));
        assert_eq!(a.saved(24).map(|s| s.value), Some(240));
        assert_eq!(a.saved(23), None, "older than the last {ATOMIC_RESULTS}");
    }

    #[test]
    fn reply_statuses_map_to_ib_completion_statuses() {
        assert_eq!(wc_status(AtomicStatus::Done), WcStatus::Success);
        assert_eq!(wc_status(AtomicStatus::AccessError), WcStatus::RemAccessErr);
        assert_eq!(wc_status(AtomicStatus::Unsupported), WcStatus::RemInvReqErr);
        assert_eq!(wc_status(AtomicStatus::Unknown(77)), WcStatus::RemOpErr);
    }
}
