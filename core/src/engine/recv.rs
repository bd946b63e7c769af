//! Receive queues, both ways over the out-of-band channel (oob-channel.md): receive WRs
//! posted here are announced to the peer once the QP is connected; the peer's announced
//! WRs wait here for the SENDs that use them (the RNR rules apply while none is there); a
//! SEND longer than the peer's WR fails both sides through the receive-WR-too-short record.

use core::net::Ipv4Addr;

use crate::desc::AccessFlags;
use crate::keys::MrKey;
use crate::oob::{RecvTooShort, RecvWr as OobRecvWr};
use crate::platform::{OobEvent, OobTransport};
use crate::qp::QpState;
use crate::time::Instant;

use super::error::VerbsError;
use super::qp::{QpHandle, QpIndex};
use super::recv_pool::RecvLists;
use super::storage::{EarlyRecv, Timer};
use super::wqe::WqeState;
use super::wr::{RecvWr, WcOpcode, WcStatus, WorkCompletion};
use super::{Device, Platform, Storage};

/// A QP's receive side: its receive WRs and the peer's (in the shared table), and the RNR
/// state.
#[derive(Clone, Debug)]
pub(crate) struct RecvQueue {
    /// Posted receive WRs (in the order they are announced to the peer) and the peer's
    /// announced ones.
    pub(super) lists: RecvLists,
    /// The out-of-band connection to the peer broke after this QP connected: a SEND that
    /// finds no announced receive WR fails instead of waiting (nothing can announce one).
    oob_lost: bool,
    /// RNR retries left (7 = forever).
    rnr_left: u8,
    /// The window a peer's SEND_WITH_INV invalidated, and the PSN that SEND starts at: its
    /// receive completion carries IBV_WC_WITH_INV and this rkey (`remote_inv`).
    pub(super) invalidated: Option<(crate::transport::Psn, u32)>,
}

impl Default for RecvQueue {
    #[inline]
    fn default() -> Self {
        RecvQueue::new(0)
    }
}

impl RecvQueue {
    /// An empty receive side that may hold `cap` posted receive WRs.
    pub(crate) fn new(cap: u32) -> Self {
        RecvQueue {
            lists: RecvLists::with_cap(cap),
            oob_lost: false,
            rnr_left: 7,
            invalidated: None,
        }
    }

    /// `rnr_retry` was set.
    #[inline]
    pub(crate) fn reset_rnr(&mut self, n: u8) {
        self.rnr_left = n;
    }

    /// A SEND used the peer's next receive WR: the RNR retries refill.
    pub(crate) fn refill_rnr(&mut self, rnr_retry: u8) {
        self.rnr_left = rnr_retry;
    }

    /// The peer can no longer announce receive WRs.
    #[inline]
    pub(crate) fn peer_lost(&self) -> bool {
        self.oob_lost
    }

    /// Receive WRs posted (for dumps).
    #[inline]
    pub(crate) fn posted(&self) -> usize {
        self.lists.posted() as usize
    }

    /// Receive WRs wait to be announced.
    #[inline]
    pub(crate) fn has_unannounced(&self) -> bool {
        self.lists.has_unannounced()
    }

    /// Nothing is left to announce (the QP was flushed).
    #[inline]
    pub(crate) fn forget_unannounced(&mut self) {
        self.lists.forget_unannounced();
    }

    /// The RNR timer fired: whether another wait is allowed (7 = forever).
    #[inline]
    fn rnr_wait(&mut self, rnr_retry: u8) -> bool {
        if rnr_retry == 7 {
            return true;
        }
        match self.rnr_left.checked_sub(1) {
            Some(left) => {
                self.rnr_left = left;
                true
            }
            None => false,
        }
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Posts receive WRs; they are announced to the peer over the out-of-band channel once
    /// the QP is connected (RTR).
    ///
    /// A buffer that no MR of the QP's PD covers with LOCAL_WRITE is posted anyway, as IB
    /// checks a receive WR only when data arrives for it: it is announced under key 0 (the
    /// card's "no MR", which its receiver refuses whatever the PD), so a SEND into it is
    /// dropped, and the sender's access check (`access_check.rs`) ends both with REM_OP_ERR
    /// and LOC_PROT_ERR.
    pub fn post_recv(&mut self, qpn: QpHandle, wrs: &[RecvWr]) -> Result<(), (usize, VerbsError)> {
        let i = self.qp_index(qpn).map_err(|e| (0, e))?;
        for (k, wr) in wrs.iter().enumerate() {
            let a = self.qp(i).attrs;
            let mut wr = *wr;
            if wr.len > 0
                && !self.mr_covers(
                    wr.lkey,
                    wr.addr.0,
                    wr.len,
                    AccessFlags::LOCAL_WRITE,
                    Some(a.pd),
                )
            {
                core_warn!(
                    "QP {:#x}: receive WR {:#x} names {:#x}+{} of key {:#x}, which no MR of its PD covers with LOCAL_WRITE: a SEND into it fails (LOC_PROT_ERR)",
                    a.qpn.get(),
                    wr.wr_id,
                    wr.addr.0,
                    wr.len,
                    wr.lkey.get()
                );
                wr.lkey = MrKey::from_raw(0);
            }
            let wr = &wr;
            if a.state == QpState::Reset {
                let e = VerbsError::WrongQpState {
                    state: a.state,
                    op: "post_recv",
                };
                return Err((k, e));
            }
            let announce = a.state != QpState::Err;
            let s = self.storage.slices();
            let lists = &mut s.qps[i.slot()].rq.lists;
            if !lists.post(&mut self.recv_pool, s.recvs, wr, announce) {
                let what = "receive queue (max_recv_wr receive WRs are posted)";
                return Err((k, VerbsError::OutOfResources { what }));
            }
            if !announce {
                // IB: a receive WR posted to a QP in the error state is flushed.
                self.fail_recv(i, WcStatus::WrFlushErr);
            }
        }
        self.announce_recvs(i);
        Ok(())
    }

    /// Tells the peer about receive WRs posted since the last announcement, once the QP
    /// knows its peer (RTR or later). A record the transport cannot take now stays pending.
    pub(crate) fn announce_recvs(&mut self, i: QpIndex) {
        let Some(oob) = self.oob.as_mut() else {
            return;
        };
        let s = self.storage.slices();
        let q = &mut s.qps[i.slot()];
        if !q.attrs.connected() {
            return;
        }
        let (qpn, peer) = (q.attrs.qpn, q.attrs.peer_ip);
        while let Some(r) = q.rq.lists.next_to_announce(s.recvs) {
            let rec = OobRecvWr {
                wr_id: r.wr_id,
                addr: r.addr.0,
                length: r.len,
                lkey: r.lkey.get(),
                qpn: qpn.get(),
            };
            match oob.send(peer, &rec) {
                Ok(()) => {
                    q.rq.lists.announced(s.recvs);
                    self.stats.recvs_announced += 1;
                }
                Err(e) => {
                    core_warn!("announcing a receive WR to {}: {}", peer, e);
                    break;
                }
            }
        }
    }

    /// Attaches the out-of-band channel that carries receive WRs between drivers
    /// (oob-channel.md). Without one, SEND is refused and WRITE_WITH_IMM does not consume
    /// the peer's receive WRs.
    pub fn attach_oob(&mut self, oob: P::Oob) {
        self.oob = Some(oob);
    }

    /// Takes what arrived on the out-of-band channel: receive WRs go to the QP whose peer
    /// they come from (held until that QP reaches RTR), a lost peer fails its QPs.
    pub(crate) fn poll_oob(&mut self, now: Instant) -> bool {
        let mut any = false;
        for _ in 0..1024 {
            let Some(ev) = self.oob.as_mut().and_then(|o| o.poll()) else {
                break;
            };
            any = true;
            match ev {
                OobEvent::RecvWr { from, wr } => self.on_remote_recv(from, wr, now),
                OobEvent::RecvTooShort { from, rec } => self.on_recv_too_short(from, rec),
                OobEvent::Atomic { from, msg } => self.on_atomic(from, msg, now),
                OobEvent::Check { from, msg } => self.on_check(from, msg),
                OobEvent::PeerLost { peer } => self.on_peer_lost(peer, now),
            }
        }
        any
    }

    /// A receive WR the peer announced: to its QP, or kept until that QP reaches RTR.
    fn on_remote_recv(&mut self, from: Ipv4Addr, wr: OobRecvWr, now: Instant) {
        self.stats.recvs_received += 1;
        if self.deliver_remote_recv(from, wr, now) {
            return;
        }
        self.stats.recvs_early += 1;
        let early = self.storage.slices().early;
        if let Some(slot) = early.get_mut(self.early_len) {
            *slot = EarlyRecv { from, wr };
            self.early_len += 1;
        } else {
            self.stats.recvs_dropped += 1;
            core_error!(
                "receive WR for QP {:#x} from {}: no such QP, waiting list of {} full",
                wr.qpn,
                from,
                early.len()
            );
        }
    }

    /// The out-of-band connection to `peer` broke: the peer is gone (its process exited or
    /// closed the device). What depends on the channel fails, so that nobody waits for it
    /// forever: a QP with a SEND waiting for the peer's receive WR, and a QP that announced
    /// receive WRs to the peer (a passive receiver, which would otherwise never learn), go
    /// to ERR with their work flushed (WR_FLUSH_ERR) and raise QP_FATAL. The receive WRs
    /// the peer announced are dropped. Other QPs keep running, as on a real card: WRITEs
    /// and READs use the link, and a later SEND fails at once.
    ///
    /// A passive receiver fails after a grace, the time a requester of a real card would take
    /// to give up on a silent peer (its ACK timeout times `retry_cnt + 1`): a peer that
    /// exits right after its last SEND closes the channel while the receiver may not have
    /// polled that SEND's completion yet, and a flush next to it failed programs that
    /// poll two completions at once (ibv_rc_pingpong -e). A QP with work that waits for
    /// the channel (a SEND, an atomic) fails after the same grace, as a real card's
    /// requester would give up: a program may have posted more SENDs than its peer, which
    /// has exited, wanted (ibv_srq_pingpong posts one per completion it sees), and flushing
    /// them at once failed its last completions on the slow RTL backend.
    fn on_peer_lost(&mut self, peer: Ipv4Addr, now: Instant) {
        for i in self.qp_indices() {
            let a = self.qp(i).attrs;
            if !self.qp(i).in_use() || a.peer_ip != peer || !a.connected() {
                continue;
            }
            let sq = self.sq(i);
            let waiting = (sq.sent()..sq.len())
                .filter_map(|k| sq.get(k))
                .any(|w| w.needs_recv() && w.state == WqeState::Pending);
            // An atomic's reply can only come over the channel.
            let waiting = waiting || self.qp(i).atomics.in_flight() > 0;
            let receiving = self.qp(i).rq.posted() > 0;
            self.stats.peers_lost += 1;
            self.qp(i).rq.oob_lost = true;
            // The peer's announced receive WRs went with it.
            while self.next_remote(i).is_some() {
                self.pop_remote(i);
            }
            if waiting || receiving {
                core_debug!(
                    "QP {:#x}: the out-of-band connection to {} is lost: QP to ERR after the grace",
                    a.qpn.get(),
                    peer
                );
                let grace = self.peer_lost_grace(i);
                self.timers(i).set(Timer::PeerLost, Some(now + grace));
            }
        }
    }

    /// How long QP `i` goes on after its out-of-band peer is lost: the time a requester of
    /// a real card takes to give up on a silent peer, its ACK timeout times
    /// `retry_cnt + 1` (1 s per try without a timeout).
    pub(crate) fn peer_lost_grace(&mut self, i: QpIndex) -> crate::time::Nanos {
        let a = self.qp(i).attrs;
        let once = a
            .ack_timeout(self.cfg.ack_timeout_min)
            .unwrap_or(crate::time::Nanos(1_000_000_000));
        crate::time::Nanos(once.0.saturating_mul(u64::from(a.retry_cnt) + 1))
    }

    /// The connected QP (RTR or later) whose peer is QP `peer_qpn` at `from`: where the
    /// out-of-band records of that peer QP go.
    pub(super) fn peer_qp(&mut self, from: Ipv4Addr, peer_qpn: u32) -> Option<QpIndex> {
        self.storage
            .slices()
            .qps
            .iter()
            .position(|q| {
                q.in_use()
                    && q.attrs.dest_qpn.get() == peer_qpn
                    && q.attrs.peer_ip == from
                    && q.attrs.connected()
            })
            .map(QpIndex::from_slot)
    }

    /// Hands an announced receive WR to its QP; false if no connected QP matches.
    fn deliver_remote_recv(&mut self, from: Ipv4Addr, wr: OobRecvWr, now: Instant) -> bool {
        let Some(i) = self.peer_qp(from, wr.qpn) else {
            return false;
        };
        let s = self.storage.slices();
        let q = &mut s.qps[i.slot()];
        q.rq.oob_lost = false;
        if !q.rq.lists.add_remote(&mut self.recv_pool, s.recvs, &wr) {
            core_error!(
                "QP {:#x}: announced receive WR {:#x} dropped: the receive WR table is full",
                q.attrs.qpn.get(),
                wr.wr_id
            );
            self.stats.recvs_dropped += 1;
            return true;
        }
        self.timers(i).set(Timer::Rnr, None);
        self.transmit(i, now);
        true
    }

    /// The peer at `from` found the receive WR `rec.wr_id` too short for a SEND of
    /// `rec.send_len` bytes (it completed the SEND with REM_INV_REQ_ERR and wrote nothing):
    /// the messages that arrived before it complete first, then that receive WR with
    /// LOC_LEN_ERR, and the QP goes to ERR with the rest flushed (oob-channel.md).
    fn on_recv_too_short(&mut self, from: Ipv4Addr, rec: RecvTooShort) {
        self.stats.recvs_too_short += 1;
        let Some(i) = self.peer_qp(from, rec.qpn) else {
            core_error!(
                "{} found receive WR {:#x} too short for its {}-byte SEND, but no connected QP has peer QP {:#x} there",
                from,
                rec.wr_id,
                rec.send_len,
                rec.qpn
            );
            return;
        };
        // The requester tells only when the SEND is its oldest request: the SENDs before it
        // were acknowledged, so their completions come first.
        self.deliver_ready(i);
        let s = self.storage.slices();
        let (qpn, head) = (
            s.qps[i.slot()].attrs.qpn.get(),
            s.qps[i.slot()].rq.lists.oldest(s.recvs),
        );
        match head {
            Some(head) if head == rec.wr_id => {}
            Some(head) => core_error!(
                "QP {:#x}: {} found receive WR {:#x} too short for a {}-byte SEND, but the oldest receive WR is {:#x}; completing {:#x} with LOC_LEN_ERR",
                qpn,
                from,
                rec.wr_id,
                rec.send_len,
                head,
                head
            ),
            None => core_error!(
                "QP {:#x}: {} found receive WR {:#x} too short for a {}-byte SEND, but no receive WR is posted",
                qpn,
                from,
                rec.wr_id,
                rec.send_len
            ),
        }
        core_warn!(
            "QP {:#x}: a {}-byte SEND from {} did not fit receive WR {:#x}: LOC_LEN_ERR, QP to ERR",
            qpn,
            rec.send_len,
            from,
            rec.wr_id
        );
        self.fail_recv(i, WcStatus::LocLenErr);
        self.enter_error(i);
    }

    /// After QP `i` reached RTR: announce its receive WRs and take the peer's that came
    /// early.
    pub(crate) fn connected(&mut self, i: QpIndex, now: Instant) {
        self.announce_recvs(i);
        // Deliver in arrival order and compact the rest (kept in order) to the front.
        let mut kept = 0;
        for k in 0..self.early_len {
            let e = self.storage.slices().early[k];
            if !self.deliver_remote_recv(e.from, e.wr, now) {
                self.storage.slices().early[kept] = e;
                kept += 1;
            }
        }
        self.early_len = kept;
    }

    /// The oldest SEND of QP `i` is longer than the peer's receive WR `r` it was matched
    /// with: tell the peer (its receive WR fails with LOC_LEN_ERR), then complete the SEND
    /// with REM_INV_REQ_ERR and move the QP to ERR. Nothing is written.
    pub(crate) fn send_too_long(&mut self, i: QpIndex, r: &OobRecvWr, send_len: u32) {
        self.stats.sends_too_long += 1;
        self.pop_remote(i);
        let q = self.qp(i);
        let (peer, qpn) = (q.attrs.peer_ip, q.attrs.qpn.get());
        let rec = RecvTooShort {
            wr_id: r.wr_id,
            send_len,
            qpn,
        };
        if let Some(oob) = self.oob.as_mut() {
            if let Err(e) = oob.send_too_short(peer, &rec) {
                core_error!(
                    "QP {:#x}: cannot tell {} that its receive WR {:#x} is too short for a {}-byte SEND: {}",
                    qpn,
                    peer,
                    r.wr_id,
                    send_len,
                    e
                );
            }
        }
        self.fail_qp(i, WcStatus::RemInvReqErr);
    }

    /// Completes the oldest receive WR of QP `i` with the error `status` (byte_len 0);
    /// `false` if none is posted.
    pub(crate) fn fail_recv(&mut self, i: QpIndex, status: WcStatus) -> bool {
        let Some(r) = self.pop_recv(i) else {
            return false;
        };
        let q = self.qp(i);
        let (qpn, cq) = (q.attrs.qpn, q.attrs.recv_cq);
        let wc = WorkCompletion {
            wr_id: r.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm_data: 0,
            qp_num: qpn.get(),
            src_qp: 0,
            wc_flags: 0,
            sq_slots: 0,
        };
        self.complete(cq, wc);
        true
    }

    /// Takes QP `i`'s oldest posted receive WR (to complete it).
    pub(crate) fn pop_recv(&mut self, i: QpIndex) -> Option<RecvWr> {
        let s = self.storage.slices();
        s.qps[i.slot()]
            .rq
            .lists
            .pop_local(&mut self.recv_pool, s.recvs)
    }

    /// The peer's next announced receive WR for QP `i`.
    pub(crate) fn next_remote(&mut self, i: QpIndex) -> Option<OobRecvWr> {
        let s = self.storage.slices();
        let q = &s.qps[i.slot()];
        q.rq.lists.next_remote(s.recvs, q.attrs.dest_qpn.get())
    }

    /// Drops the peer's next announced receive WR for QP `i` (a SEND used it).
    pub(crate) fn pop_remote(&mut self, i: QpIndex) {
        let s = self.storage.slices();
        s.qps[i.slot()]
            .rq
            .lists
            .pop_remote(&mut self.recv_pool, s.recvs);
    }

    /// Gives every receive WR of QP `i`, its own and its peer's, back to the table (the QP
    /// is reset or destroyed: nothing completes).
    pub(crate) fn clear_recvs(&mut self, i: QpIndex) {
        let s = self.storage.slices();
        s.qps[i.slot()].rq.lists.clear(&mut self.recv_pool, s.recvs);
    }

    /// A SEND waited `min_rnr_timer` for a receive WR: try again, or give up after
    /// `rnr_retry` waits (7 = wait forever) with RNR_RETRY_EXC_ERR.
    pub(crate) fn on_rnr_timeout(&mut self, i: QpIndex, now: Instant) {
        self.stats.rnr_waits += 1;
        self.timers(i).set(Timer::Rnr, None);
        let rnr_retry = self.qp(i).attrs.rnr_retry;
        if !self.qp(i).rq.rnr_wait(rnr_retry) {
            self.fail_qp(i, WcStatus::RnrRetryExcErr);
            return;
        }
        self.transmit(i, now);
    }
}
