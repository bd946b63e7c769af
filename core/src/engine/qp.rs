//! Queue pairs: the slot (IB attributes plus the state of each role), typed indices, and
//! the verbs that create, modify, query and destroy them. ManageQp goes to the card at
//! create, at the move to RTR (every ManageQp resets the card's ACK tracking: correction
//! 5), at RESET and at destroy.

use core::net::Ipv4Addr;

use crate::desc::cmd::{CmdRequest, ManageQp};
use crate::desc::AccessFlags;
use crate::keys::Qpn;
use crate::mac::MacAddr;
use crate::mtu::Pmtu;
use crate::qp::{check_modify, QpAccessFlags, QpAttr, QpAttrMask, QpState, QpType, RawQpAttr};
use crate::time::{Instant, Nanos};
use crate::transport::Psn;

use super::atomic::Atomics;
use super::command::Ticket;
use super::error::VerbsError;
use super::recv::RecvQueue;
use super::requester::Requester;
use super::responder::Responder;
use super::retire::{SendMark, DESTROY_WAIT};
use super::storage::{QpTimers, SendQueue, SqCounters};
use super::{Device, Platform, Storage};

/// READ responses a QP's send queue has room for by default, beyond its `max_send_wr`:
/// the READs its peer may have in flight (`max_dest_rd_atomic`, which the stand-in
/// reports as 16).
pub const READ_RESPONSE_ROOM: u32 = crate::qp::MAX_RD_ATOMIC as u32;

/// The queue sizes of a new QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send requests the QP holds at once (`max_send_wr`).
    pub max_send_wr: u32,
    /// Receive WRs the QP holds at once (`max_recv_wr`).
    pub max_recv_wr: u32,
    /// READ responses its send queue has room for beyond `max_send_wr` (a READ request
    /// that finds no room is refused and resent by the peer).
    pub read_responses: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            read_responses: READ_RESPONSE_ROOM,
        }
    }
}

/// A QP's handle: its QPN.
pub type QpHandle = Qpn;

/// The index of a QP slot in the storage (QP index in the card = the QP window's start +
/// slot, `TableWindows::qpn_of_slot`; the whole card's window starts at 1: index 0 is
/// reserved by the card).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpIndex(u16);

impl QpIndex {
    /// The index of slot `slot`.
    #[inline]
    pub(crate) const fn from_slot(slot: usize) -> Self {
        QpIndex(slot as u16)
    }

    /// The slot in the storage tables.
    #[inline]
    pub(crate) const fn slot(self) -> usize {
        self.0 as usize
    }
}

/// A QP's IB attributes: what `modify_qp` sets and `query_qp` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttrs {
    /// The QP number.
    pub qpn: Qpn,
    /// QP type.
    pub qp_type: QpType,
    /// State.
    pub state: QpState,
    /// Protection domain.
    pub pd: u32,
    /// Send CQ.
    pub send_cq: u32,
    /// Receive CQ.
    pub recv_cq: u32,
    /// Path MTU.
    pub pmtu: Pmtu,
    /// Peer QP.
    pub dest_qpn: Qpn,
    /// Peer IPv4 address.
    pub peer_ip: Ipv4Addr,
    /// Peer MAC.
    pub peer_mac: MacAddr,
    /// Access flags for remote operations.
    pub access: QpAccessFlags,
    /// `timeout` (IB exponent; 0 = infinite).
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry` (7 = forever).
    pub rnr_retry: u8,
    /// `min_rnr_timer` (IB table code).
    pub min_rnr_timer: u8,
    /// `max_rd_atomic`: READs outstanding at once; 0 (never set) means as many as the
    /// peer has room for, [`READ_RESPONSE_ROOM`] (IB would allow none; a program that never
    /// sets it would hang).
    pub max_rd_atomic: u8,
    /// The next PSN this QP sends (in a query: now; as stored: the `sq_psn` last set).
    pub sq_psn: Psn,
    /// The next PSN this QP expects (in a query: now; as stored: the `rq_psn` last set).
    pub rq_psn: Psn,
    /// Its queue sizes (what create_qp was asked for).
    pub caps: QpCaps,
}

impl Default for QpAttrs {
    /// A QP in RESET. Its ACK timeout and retry count, which IB sets at RTS, start at the
    /// IB defaults (14 = 67 ms, 7 retries): a responder that stays in RTR (perftest's READ
    /// server) sends READ responses, and a lost one must be resent.
    #[inline]
    fn default() -> Self {
        QpAttrs {
            qpn: Qpn::from_raw(0),
            qp_type: QpType::Rc,
            state: QpState::Reset,
            pd: 0,
            send_cq: 0,
            recv_cq: 0,
            pmtu: Pmtu::Mtu4096,
            dest_qpn: Qpn::from_raw(0),
            peer_ip: Ipv4Addr::UNSPECIFIED,
            peer_mac: MacAddr::BROADCAST,
            access: QpAccessFlags::empty(),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 0,
            max_rd_atomic: 0,
            sq_psn: Psn::from_raw(0),
            rq_psn: Psn::from_raw(0),
            caps: QpCaps {
                max_send_wr: 0,
                max_recv_wr: 0,
                read_responses: 0,
            },
        }
    }
}

impl QpAttrs {
    /// The local ACK timeout (`None`: infinite), at least `floor`
    /// ([`DeviceConfig::ack_timeout_min`](super::DeviceConfig::ack_timeout_min): a slow
    /// backend's round trip can exceed what the application asked for).
    #[inline]
    pub(crate) fn ack_timeout(&self, floor: Nanos) -> Option<Nanos> {
        Nanos::ib_local_ack_timeout(self.timeout).map(|t| t.max(floor))
    }

    /// Connected: RTR or later, not in error.
    #[inline]
    pub(crate) fn connected(&self) -> bool {
        matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    }
}

/// Whether the card still holds a QP that went to ERR as valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CardEntry {
    /// As the engine last wrote it (valid since create, RESET and RTR).
    #[default]
    Current,
    /// The QP went to ERR: invalidate it in the card, so that packets for it are dropped
    /// there (an IB responder in ERR takes nothing; the requester's retries run out), once
    /// the card has fetched the send-ring descriptors posted before (`retire`).
    InvalidateDue(SendMark),
    /// The invalidation is on the command ring.
    Invalidating(Ticket),
}

/// A queue pair: its attributes and the state of each role.
#[derive(Clone, Debug, Default)]
pub struct QpSlot {
    in_use: bool,
    pub(super) card: CardEntry,
    pub(super) attrs: QpAttrs,
    /// Requester and completer: PSNs, MSN, retries, the send queue's counters.
    pub(super) req: Requester,
    /// Responder: what arrived, what was acknowledged, messages waiting for completion.
    pub(super) resp: Responder,
    /// Receive WRs posted here and announced by the peer.
    pub(super) rq: RecvQueue,
    /// Atomics: sequence numbers both ways, the responder's last replies.
    pub(super) atomics: Atomics,
}

impl QpSlot {
    /// A QP in RESET whose send queue is `sq` (empty) and which may post `caps.max_recv_wr`
    /// receive WRs.
    #[inline]
    fn fresh(a: &QpAttrs, sq: SqCounters) -> Self {
        let mut q = QpSlot {
            in_use: true,
            attrs: QpAttrs {
                qpn: a.qpn,
                qp_type: a.qp_type,
                pd: a.pd,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                caps: a.caps,
                ..QpAttrs::default()
            },
            resp: Responder::new(a.qpn),
            rq: RecvQueue::new(a.caps.max_recv_wr),
            ..QpSlot::default()
        };
        q.req.sq = sq;
        q
    }

    /// Whether the slot holds a QP.
    #[inline]
    pub fn in_use(&self) -> bool {
        self.in_use
    }

    /// The attributes with the current PSNs.
    #[inline]
    pub(crate) fn snapshot(&self) -> QpAttrs {
        QpAttrs {
            sq_psn: self.req.next_psn(),
            rq_psn: self.resp.acked(),
            ..self.attrs
        }
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Creates an RC QP in RESET on `pd` with the given CQs and queue sizes; tells the card
    /// (ManageQp).
    pub fn create_qp(
        &mut self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        qp_type: QpType,
        caps: QpCaps,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<QpHandle, VerbsError> {
        self.check_pd(pd)?;
        if qp_type != QpType::Rc {
            return Err(VerbsError::Unsupported {
                what: "QP types other than RC (the card has RC only)",
            });
        }
        let key = self.next_key();
        let slot = {
            let windows = &self.cfg.windows;
            let s = self.storage.slices();
            for cq in [send_cq, recv_cq] {
                if !s.cqs.get(cq as usize).is_some_and(|c| c.in_use) {
                    return Err(VerbsError::NoSuchObject {
                        what: "CQ",
                        handle: cq,
                    });
                }
            }
            s.qps[..windows.qp_slots(s.qps.len())]
                .iter()
                .position(|q| !q.in_use)
                .ok_or(VerbsError::OutOfResources {
                    what: "queue pairs",
                })?
        };
        let qpn = self
            .cfg
            .windows
            .qpn_of_slot(slot, key)
            .ok_or(VerbsError::OutOfResources {
                what: "queue pairs",
            })?;
        let ring_len = caps.max_send_wr.checked_add(caps.read_responses).ok_or(
            VerbsError::InvalidArgument {
                what: "max_send_wr too large",
            },
        )?;
        let ring = self
            .wqe_ranges
            .alloc(ring_len)
            .ok_or(VerbsError::OutOfResources {
                what: "send queue table (max_send_wr larger than its free part)",
            })?;
        if !self.recv_pool.reserve(caps.max_recv_wr) {
            self.wqe_ranges.free(ring);
            return Err(VerbsError::OutOfResources {
                what: "receive WR table (max_recv_wr larger than its free part)",
            });
        }
        let i = QpIndex::from_slot(slot);
        let attrs = QpAttrs {
            qpn,
            qp_type,
            pd,
            send_cq,
            recv_cq,
            caps,
            ..QpAttrs::default()
        };
        self.qp_high = self.qp_high.max(slot + 1);
        *self.qp(i) = QpSlot::fresh(&attrs, SqCounters::new(caps.max_send_wr, ring));
        *self.timers(i) = QpTimers::default();
        if let Err(e) = self.manage_qp(i, true, clock) {
            self.free_qp(i);
            return Err(e);
        }
        Ok(qpn)
    }

    /// Gives back QP slot `i`'s send queue range and receive WRs, and empties the slot.
    fn free_qp(&mut self, i: QpIndex) {
        let (ring, cap) = (self.qp(i).req.sq.ring(), self.qp(i).rq.lists.cap());
        self.clear_recvs(i);
        self.wqe_ranges.free(ring);
        self.recv_pool.unreserve(cap);
        *self.qp(i) = QpSlot::default();
        *self.timers(i) = QpTimers::default();
    }

    /// The slot of the QP `qpn` (a stale or foreign QPN, or one outside this engine's QP
    /// window, is refused).
    pub(crate) fn qp_index(&mut self, qpn: Qpn) -> Result<QpIndex, VerbsError> {
        let slot = self.cfg.windows.qp_slot(qpn).unwrap_or(usize::MAX);
        match self.storage.slices().qps.get(slot) {
            Some(q) if q.in_use && q.attrs.qpn == qpn => Ok(QpIndex::from_slot(slot)),
            _ => Err(VerbsError::NoSuchObject {
                what: "QP",
                handle: qpn.get(),
            }),
        }
    }

    /// QP slot `i`.
    pub(crate) fn qp(&mut self, i: QpIndex) -> &mut QpSlot {
        let qps = self.storage.slices().qps;
        &mut qps[i.slot()]
    }

    /// The timers of QP slot `i`.
    pub(crate) fn timers(&mut self, i: QpIndex) -> &mut QpTimers {
        let timers = self.storage.slices().timers;
        &mut timers[i.slot()]
    }

    /// The send queue of QP slot `i`.
    pub(crate) fn sq(&mut self, i: QpIndex) -> SendQueue<'_> {
        let s = self.storage.slices();
        SendQueue::new(&mut s.qps[i.slot()].req.sq, s.wqes)
    }

    /// Every QP slot index that may be in use (the slots below the highest ever used).
    pub(crate) fn qp_indices(&mut self) -> impl Iterator<Item = QpIndex> {
        (0..self.qp_high).map(QpIndex::from_slot)
    }

    fn manage_qp(
        &mut self,
        i: QpIndex,
        valid: bool,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let req = self.manage_request(i, valid);
        self.commands.run(&self.regs, req, clock)
    }

    /// The ManageQp command that writes (or invalidates) QP slot `i` in the card.
    fn manage_request(&mut self, i: QpIndex, valid: bool) -> CmdRequest {
        let q = self.qp(i).attrs;
        // REMOTE_WRITE is always granted in the card: a SEND arrives as a write into the
        // receive buffer and the card checks REMOTE_WRITE on the QP for it (nic-behaviour.md
        // 2.3). A remote WRITE still needs REMOTE_WRITE on the target MR, which the card
        // checks; the QP-level refusal of WRITEs is lost (README, hardware limitations).
        // READ responses arrive as writes into the requester's buffer: the card checks
        // LOCAL_WRITE on the QP for them, so it is always granted.
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | if q.access.contains(QpAccessFlags::REMOTE_READ) {
                AccessFlags::REMOTE_READ
            } else {
                AccessFlags::empty()
            };
        CmdRequest::ManageQp(ManageQp {
            is_valid: valid,
            is_error: false,
            pd: q.pd,
            qpn: q.qpn,
            peer_qpn: q.dest_qpn,
            rq_access_flags: access,
            qp_type: q.qp_type,
            pmtu: q.pmtu,
            local_udp_port: (q.qpn.get() & 0xFFFF) as u16,
            peer_mac: q.peer_mac,
            peer_ip: q.peer_ip,
        })
    }

    /// QP `i` goes to ERR: its outstanding work is flushed and the card is told to drop
    /// its packets (from the next poll on, without waiting here).
    pub(crate) fn enter_error(&mut self, i: QpIndex) {
        self.qp(i).attrs.state = QpState::Err;
        if self.qp(i).card == CardEntry::Current {
            self.qp(i).card = CardEntry::InvalidateDue(self.send_mark());
        }
        self.flush_qp(i);
        self.update_card_entry(i);
    }

    /// Moves QP `i`'s pending invalidation on: submits it, or collects its response.
    /// Returns whether anything changed.
    pub(crate) fn update_card_entry(&mut self, i: QpIndex) -> bool {
        match self.qp(i).card {
            CardEntry::Current => false,
            CardEntry::InvalidateDue(posted) => {
                if !self.send_fetched(posted) {
                    // The card still has descriptors of before: the next poll looks again.
                    return false;
                }
                let req = self.manage_request(i, false);
                match self.commands.submit(&self.regs, req, self.now) {
                    Ok(t) => {
                        self.qp(i).card = CardEntry::Invalidating(t);
                        true
                    }
                    // The queue is busy: the next poll tries again.
                    Err(_) => false,
                }
            }
            CardEntry::Invalidating(t) => {
                let Some(r) = self.commands.check(t, self.now) else {
                    return false;
                };
                if let Err(e) = r {
                    let (timeout, qpn) = (
                        matches!(e, VerbsError::CommandTimeout { .. }),
                        self.qp(i).attrs.qpn.get(),
                    );
                    core_error!(
                        "QP {:#x} in ERR could not be invalidated in the card (timed out: {}): its packets may still be taken",
                        qpn,
                        timeout
                    );
                }
                self.qp(i).card = CardEntry::Current;
                true
            }
        }
    }

    /// Drops a pending invalidation (the QP is reset or destroyed: the engine writes its
    /// card entry itself).
    fn forget_card_update(&mut self, i: QpIndex) {
        if let CardEntry::Invalidating(t) = self.qp(i).card {
            self.commands.forget(t);
        }
        self.qp(i).card = CardEntry::Current;
    }

    /// Modifies a QP (IB state machine, attribute table as const data).
    pub fn modify_qp(
        &mut self,
        qpn: QpHandle,
        raw: &RawQpAttr,
        mask: QpAttrMask,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let attr = QpAttr::decode(raw, mask)?;
        if [attr.rq_psn, attr.sq_psn]
            .into_iter()
            .flatten()
            .any(stale_for_card)
        {
            return Err(VerbsError::InvalidArgument {
                what: "first PSN in 0x7FFFF0..=0xFFFF7F: the card's window after a QP reset takes every such PSN as stale (hardware-contract.md, review P5/P6); map the application's PSNs onto the wire (platform-linux's verbs start every connection at one wire PSN)",
            });
        }
        let QpAttrs { qp_type, state, .. } = self.qp(i).attrs;
        let cur = attr.cur_qp_state.unwrap_or(state);
        let next = check_modify(qp_type, state, mask, cur, attr.qp_state.unwrap_or(state))?;
        apply(self.qp(i), &attr);
        if next == QpState::Rtr && state != QpState::Rtr {
            self.manage_qp(i, true, clock)?;
            // ManageQp reset the card's window: its bits for these PSNs mean nothing.
            self.qp(i).resp.card_reset();
        }
        if next == QpState::Reset && state != QpState::Reset {
            let qpn = self.qp(i).attrs.qpn;
            if let Some(oob) = self.oob.as_mut() {
                crate::platform::OobTransport::unbind(oob, qpn);
            }
            self.forget_card_update(i);
            let a = self.qp(i).attrs;
            let sq = self.qp(i).req.sq;
            self.clear_recvs(i);
            self.purge_completions(a.send_cq, a.qpn.get());
            if a.recv_cq != a.send_cq {
                self.purge_completions(a.recv_cq, a.qpn.get());
            }
            *self.qp(i) = QpSlot::fresh(&a, SqCounters::new(sq.cap(), sq.ring()));
            *self.timers(i) = QpTimers::default();
            self.manage_qp(i, true, clock)?;
        }
        if next == QpState::Err && state != QpState::Err {
            self.enter_error(i);
        }
        self.qp(i).attrs.state = next;
        if next == QpState::Rtr && state != QpState::Rtr {
            let a = self.qp(i).attrs;
            if let Some(oob) = self.oob.as_mut() {
                crate::platform::OobTransport::bind(oob, a.qpn, a.peer_ip, a.dest_qpn);
            }
            let now = clock();
            self.connected(i, now);
        }
        Ok(())
    }

    /// How many of the QP's send WRs have left its send queue (completed, failed or
    /// flushed, signaled or not) since it was created or reset: a caller that numbers its
    /// posts knows which of its buffers the card is done with.
    pub fn sq_retired(&mut self, qpn: QpHandle) -> Result<u64, VerbsError> {
        let i = self.qp_index(qpn)?;
        Ok(self.qp(i).req.retired())
    }

    /// The QP's state and attributes, with its current PSNs.
    pub fn query_qp(&mut self, qpn: QpHandle) -> Result<QpAttrs, VerbsError> {
        let i = self.qp_index(qpn)?;
        Ok(self.qp(i).snapshot())
    }

    /// Destroys a QP: invalidates it in the card (ManageQp is_valid = 0) before its index
    /// can be reused, once the card has fetched every send-ring descriptor posted before
    /// (`retire`); outstanding work is flushed. A card that stops fetching or does not
    /// answer fails the call and leaves the QP as it was.
    pub fn destroy_qp(
        &mut self,
        qpn: QpHandle,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let posted = self.send_mark();
        self.wait_send_fetched(posted, DESTROY_WAIT, clock)?;
        self.forget_card_update(i);
        self.manage_qp(i, false, clock)?;
        let qpn = self.qp(i).attrs.qpn;
        if let Some(oob) = self.oob.as_mut() {
            crate::platform::OobTransport::unbind(oob, qpn);
        }
        self.qp(i).attrs.state = QpState::Err;
        self.flush_qp(i);
        self.free_qp(i);
        Ok(())
    }
}

/// A first PSN the card's reset window (stride 0xFFFFF, nic-behaviour.md 3.1) takes as
/// stale: more than 8 strides behind its top and not inside it.
#[inline]
pub(crate) fn stale_for_card(psn: Psn) -> bool {
    (0x7F_FFF0..=0xFF_FF7F).contains(&psn.get())
}

/// Takes the attributes `attr` carries into the slot (the transition was checked).
fn apply(q: &mut QpSlot, attr: &QpAttr) {
    let a = &mut q.attrs;
    if let Some(v) = attr.path_mtu {
        a.pmtu = v;
        q.resp.set_pmtu(v);
    }
    if let Some(v) = attr.dest_qpn {
        a.dest_qpn = v;
    }
    if let Some(v) = attr.dest_ipv4 {
        a.peer_ip = v;
    }
    if let Some(v) = attr.access {
        a.access = v;
    }
    if let Some(v) = attr.rq_psn {
        a.rq_psn = v;
        q.resp.reset(v);
    }
    if let Some(v) = attr.sq_psn {
        a.sq_psn = v;
        q.req.reset_psn(v);
    }
    if let Some(v) = attr.timeout {
        a.timeout = v;
    }
    if let Some(v) = attr.retry_cnt {
        a.retry_cnt = v;
        q.req.reset_retries(v);
    }
    if let Some(v) = attr.rnr_retry {
        a.rnr_retry = v;
        q.rq.reset_rnr(v);
    }
    if let Some(v) = attr.min_rnr_timer {
        a.min_rnr_timer = v;
    }
    if let Some(v) = attr.max_rd_atomic {
        a.max_rd_atomic = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_floor_raises_short_ack_timeouts_and_keeps_infinite_ones() {
        let mut a = QpAttrs::default();
        let second = Nanos::from_millis(1_000);
        // 14 = 67 ms: raised to the floor; no floor keeps it.
        assert_eq!(a.ack_timeout(second), Some(second));
        assert_eq!(a.ack_timeout(Nanos(0)), Some(Nanos(4_096 << 14)));
        // 20 = 4.3 s is above the floor and stays.
        a.timeout = 20;
        assert_eq!(a.ack_timeout(second), Some(Nanos(4_096 << 20)));
        // 0 = infinite stays infinite.
        a.timeout = 0;
        assert_eq!(a.ack_timeout(second), None);
    }
}
