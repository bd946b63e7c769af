//! SEND_WITH_INV: a SEND that invalidates one of the responder's memory windows before the
//! responder reports its receive completion (IB's Send with Invalidate). The card has
//! *_INV opcodes, but its receiver skips every MR check for them and writes through an
//! undefined MR entry (nic-behaviour.md 2.3), so the SEND goes as the card's plain SEND
//! and the invalidation over the out-of-band channel (an access check of op
//! [`CheckOp::SendInv`], `oob::check`), to peers whose hello announces
//! [`Capabilities::REMOTE_INVALIDATE`]:
//!
//! 1. the requester waits until the SEND is its oldest request (every request before it
//!    is acknowledged, so the responder has completed them) and the peer has announced the
//!    receive WR it will take, then asks with the PSN the SEND will start at;
//! 2. the responder invalidates the window (a type-2 window bound in its QP's PD under
//!    that very rkey; an MR or anything else is refused), remembers the rkey for that
//!    PSN and answers with a verdict;
//! 3. accepted: the SEND goes to the card; its receive completion carries
//!    IBV_WC_WITH_INV and the rkey. Refused: the SEND completes with REM_OP_ERR, the
//!    receive WR with LOC_PROT_ERR, and both QPs go to ERR.
//!
//! The SEND's data leaves only after the invalidation took effect, so the order in which
//! the data and the records arrive cannot matter. The invalidation blocks on the card's
//! command (as IBV_WR_LOCAL_INV does), so the responder queues what arrives during a poll
//! and carries it out in [`Device::run_remote_invalidations`], which has a clock.

use core::net::Ipv4Addr;

use crate::keys::MrKey;
use crate::oob::{AccessCheck, AccessVerdict, Capabilities, CheckMessage, CheckOp, CheckVerdict};
use crate::platform::OobTransport;
use crate::time::Instant;
use crate::transport::Psn;

use super::qp::QpIndex;
use super::responder::{MsgEnd, MsgKind};
use super::storage::Timer;
use super::wqe::{InvStep, Invalidate, Wqe, WqeKind};
use super::wr::WcStatus;
use super::{Device, Platform, Storage};

/// Remote invalidations that may wait for [`Device::run_remote_invalidations`].
pub(super) const REMOTE_INVS: usize = 16;

/// The invalidation of a SEND_WITH_INV WQE.
fn invalidate_of(w: &Wqe) -> Option<Invalidate> {
    match w.kind {
        WqeKind::Request(r) => r.invalidate,
        _ => None,
    }
}

/// `w` with its invalidation at `step`.
fn with_step(mut w: Wqe, step: InvStep) -> Wqe {
    if let WqeKind::Request(ref mut r) = w.kind {
        if let Some(ref mut inv) = r.invalidate {
            inv.step = step;
        }
    }
    w
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Whether the peer at `peer` takes remote invalidations (`None`: not known yet).
    pub(crate) fn peer_invalidates(&self, peer: Ipv4Addr) -> Option<bool> {
        let caps = self.oob.as_ref()?.peer_capabilities(peer)?;
        Some(caps.contains(Capabilities::REMOTE_INVALIDATE))
    }

    /// Whether the pending WQE `w`, the `k`-th of QP `i`'s send queue, may go to the card
    /// now (`next_psn`: the PSN it would start at). A SEND_WITH_INV first has its
    /// invalidation carried out by the responder.
    pub(crate) fn invalidate_ready(&mut self, i: QpIndex, k: u32, w: &Wqe, next_psn: Psn) -> bool {
        let Some(inv) = invalidate_of(w) else {
            return true;
        };
        match inv.step {
            InvStep::Done => return true,
            InvStep::Asked(_) => return false,
            InvStep::Unasked => {}
        }
        // Every request before it is acknowledged: the responder completed them.
        if k != 0 {
            return false;
        }
        // No receive WR announced yet: the SEND waits for one under the RNR rules.
        if self.next_remote(i).is_none() {
            return true;
        }
        let a = self.qp(i).attrs;
        if self.peer_invalidates(a.peer_ip) != Some(true) {
            core_warn!(
                "QP {:#x}: the driver at {} does not take remote invalidations: the SEND_WITH_INV fails (LOC_QP_OP_ERR)",
                a.qpn.get(),
                a.peer_ip
            );
            self.fail_qp(i, WcStatus::LocQpOpErr);
            return false;
        }
        let check = AccessCheck {
            op: CheckOp::SendInv,
            psn: next_psn.get(),
            addr: 0,
            len: 0,
            rkey: inv.rkey,
            qpn: a.qpn.get(),
        };
        let Some(oob) = self.oob.as_mut() else {
            return false;
        };
        match oob.send_check(a.peer_ip, &CheckMessage::Check(check)) {
            Ok(()) => {
                self.stats.remote_invalidations += 1;
                self.put_wqe(i, k, with_step(*w, InvStep::Asked(next_psn)));
                // A verdict that never comes (the peer's QP is gone) ends in RETRY_EXC_ERR.
                let at = a
                    .ack_timeout(self.cfg.ack_timeout_min)
                    .map(|t| self.now + t);
                self.timers(i).set(Timer::Retransmit, at);
            }
            // Asked again at the next poll (the WQE stays pending).
            Err(e) => core_debug!(
                "QP {:#x}: remote invalidation not sent yet: {}",
                a.qpn.get(),
                e
            ),
        }
        false
    }

    /// The peer's verdict on our SEND_WITH_INV's invalidation; false if `v` is about
    /// something else.
    pub(crate) fn on_inv_verdict(&mut self, from: Ipv4Addr, v: &AccessVerdict) -> bool {
        let Some(i) = self.peer_qp(from, v.qpn) else {
            return false;
        };
        let Some(w) = self.sq(i).get(0).copied() else {
            return false;
        };
        let asked = InvStep::Asked(Psn::from_raw(v.psn));
        if invalidate_of(&w).is_none_or(|inv| inv.step != asked) {
            return false;
        }
        self.timers(i).set(Timer::Retransmit, None);
        if v.verdict == CheckVerdict::Accepted {
            self.put_wqe(i, 0, with_step(w, InvStep::Done));
            let now = self.now;
            self.transmit(i, now);
        } else {
            core_warn!(
                "QP {:#x}: {} refused to invalidate the rkey of a SEND_WITH_INV: REM_OP_ERR",
                self.qp(i).attrs.qpn.get(),
                from
            );
            self.fail_qp(i, WcStatus::RemOpErr);
        }
        true
    }

    /// The retransmission timer of QP `i` fired while its oldest request, a SEND_WITH_INV,
    /// waits for the verdict on its invalidation (a responder whose QP is gone or in ERR
    /// does not answer): another wait uses a retry, as a lost request would; none left is
    /// RETRY_EXC_ERR. The responder is not asked twice (it may have invalidated the window
    /// already). False: not that case.
    pub(crate) fn on_inv_timeout(&mut self, i: QpIndex) -> bool {
        if self.sq(i).sent() != 0 {
            return false;
        }
        let Some(w) = self.sq(i).get(0).copied() else {
            return false;
        };
        if !invalidate_of(&w).is_some_and(|inv| matches!(inv.step, InvStep::Asked(_))) {
            return false;
        }
        self.stats.timeouts += 1;
        if !self.qp(i).req.use_retry() {
            core_warn!(
                "QP {:#x}: no verdict on a SEND_WITH_INV's invalidation: RETRY_EXC_ERR",
                self.qp(i).attrs.qpn.get()
            );
            self.fail_qp(i, WcStatus::RetryExcErr);
            return true;
        }
        let a = self.qp(i).attrs;
        let at = a
            .ack_timeout(self.cfg.ack_timeout_min)
            .map(|t| self.now + t);
        self.timers(i).set(Timer::Retransmit, at);
        true
    }

    /// A peer asks to invalidate a window for its SEND_WITH_INV: queued for
    /// [`Device::run_remote_invalidations`].
    pub(crate) fn queue_remote_inv(&mut self, from: Ipv4Addr, c: AccessCheck) {
        if self.remote_invs.push_back((from, c)).is_err() {
            core_error!(
                "{}: {} remote invalidations wait already; refusing the one for rkey {:#x}",
                from,
                REMOTE_INVS,
                c.rkey
            );
            self.finish_remote_inv(from, c, false);
        }
    }

    /// Carries out the remote invalidations peers asked for (SEND_WITH_INV) and answers
    /// them; call it after [`Device::poll`]. Each may wait for the card's command, as a
    /// local invalidation does. Returns whether there was any.
    pub fn run_remote_invalidations(&mut self, clock: &mut dyn FnMut() -> Instant) -> bool {
        let mut any = false;
        while let Some((from, c)) = self.remote_invs.pop_front() {
            any = true;
            let ok = self.remote_invalidate(from, &c, clock);
            self.finish_remote_inv(from, c, ok);
        }
        any
    }

    /// Invalidates the window the peer's check names, if it is bound under that rkey in
    /// the PD of the QP the check is for.
    fn remote_invalidate(
        &mut self,
        from: Ipv4Addr,
        c: &AccessCheck,
        clock: &mut dyn FnMut() -> Instant,
    ) -> bool {
        let Some(i) = self.peer_qp(from, c.qpn) else {
            return false;
        };
        let key = MrKey::from_raw(c.rkey);
        let pd = self.qp(i).attrs.pd;
        if !self.window_bound_in(key, pd) {
            return false;
        }
        match self.invalidate_mw(key, clock) {
            Ok(()) => {
                self.qp(i).rq.invalidated = Some((Psn::from_raw(c.psn), c.rkey));
                true
            }
            Err(_e) => {
                // VerbsError has no defmt::Format: the firmware's line names the key only.
                #[cfg(not(feature = "defmt"))]
                core_error!("remote invalidation of {:#x}: {}", c.rkey, _e);
                #[cfg(feature = "defmt")]
                core_error!("remote invalidation of {:#x} failed", c.rkey);
                false
            }
        }
    }

    /// Answers the peer's remote invalidation; a refused one fails the receive WR the SEND
    /// would have taken (LOC_PROT_ERR) and the QP.
    fn finish_remote_inv(&mut self, from: Ipv4Addr, c: AccessCheck, ok: bool) {
        let Some(i) = self.peer_qp(from, c.qpn) else {
            core_warn!(
                "{} asks to invalidate {:#x} for its QP {:#x}, which no connected QP here has as peer",
                from,
                c.rkey,
                c.qpn
            );
            return;
        };
        let qpn = self.qp(i).attrs.qpn.get();
        let verdict = if ok {
            CheckVerdict::Accepted
        } else {
            CheckVerdict::OperationError
        };
        let reply = AccessVerdict {
            psn: c.psn,
            verdict,
            qpn,
        };
        if let Some(oob) = self.oob.as_mut() {
            if let Err(e) = oob.send_check(from, &CheckMessage::Verdict(reply)) {
                core_warn!(
                    "QP {:#x}: cannot answer a remote invalidation of {}: {}",
                    qpn,
                    from,
                    e
                );
            }
        }
        if !ok {
            core_warn!(
                "QP {:#x}: a SEND_WITH_INV from {} names rkey {:#x}, which is no memory window bound in the QP's PD: LOC_PROT_ERR, QP to ERR",
                qpn,
                from,
                c.rkey
            );
            // Every message before the SEND was acknowledged: it completes first.
            self.deliver_ready(i);
            self.fail_recv(i, WcStatus::LocProtErr);
            self.enter_error(i);
        }
    }

    /// The rkey message `m` invalidated (a SEND_WITH_INV), for its receive completion.
    pub(crate) fn take_invalidated(&mut self, i: QpIndex, m: &MsgEnd) -> Option<u32> {
        let rq = &mut self.qp(i).rq;
        match rq.invalidated {
            Some((psn, rkey)) if psn == m.first && m.kind == MsgKind::Send => {
                rq.invalidated = None;
                Some(rkey)
            }
            _ => None,
        }
    }
}
