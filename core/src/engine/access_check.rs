//! What the card never says: why it dropped a packet. A WRITE whose rkey, bounds or access
//! the responder's card refuses is dropped without a NAK (nic-behaviour.md 2.3), a READ
//! the responder's driver refuses is not answered (12a), and a SEND into a receive WR
//! whose MR is gone or moved is dropped like a WRITE. The requester would only time out
//! and end in RETRY_EXC_ERR. So when its retransmission timer fires (a real expiry, one
//! that uses a retry), the requester asks the responder's driver about its oldest request
//! with an access check (`oob::check`); the responder checks it as its card and its own
//! READ checks do (QP access, MR key, access, bounds and PD) and answers:
//! - accepted: nothing changes, the retransmission goes on (the loss was a loss);
//! - refused: the request completes with REM_ACCESS_ERR (WRITE, READ) or REM_OP_ERR
//!   (SEND), the requester's QP goes to ERR as after any remote error, as it would after
//!   the NAK an IB responder sends; for a SEND the responder completes the receive WR
//!   with LOC_PROT_ERR and its QP goes to ERR too, as an IB responder's does.
//!
//! A verdict names the request's first PSN; one that no longer names the oldest request
//! (it was acknowledged meanwhile) is ignored. A peer that does not answer checks (no
//! ACCESS_CHECKS in its hello) is not asked, and the request ends as before.

use core::net::Ipv4Addr;

use crate::desc::AccessFlags;
use crate::keys::MrKey;
use crate::oob::{AccessCheck, AccessVerdict, CheckMessage, CheckOp, CheckVerdict};
use crate::platform::OobTransport;
use crate::qp::QpAccessFlags;

use super::qp::QpIndex;
use super::wqe::{Request, RequestOp, WqeKind};
use super::wr::WcStatus;
use super::{Device, Platform, Storage};

/// What of a request the responder is asked about.
fn check_of(r: &Request) -> Option<(CheckOp, u64, u32, u32)> {
    let (op, len) = match r.op {
        RequestOp::Write | RequestOp::WriteImm(_) => (CheckOp::Write, r.len),
        RequestOp::Read { done: false } => (CheckOp::Read, r.len),
        RequestOp::Send(_) => (CheckOp::Send, r.len),
        // Nothing the card could have refused (an empty READ travels as a zero-length
        // WRITE, which names no MR), or answered otherwise (atomics have their reply).
        RequestOp::Read { done: true } | RequestOp::EmptyRead | RequestOp::Atomic(_) => {
            return None
        }
    };
    (len > 0).then_some((op, r.raddr.0, len, r.rkey.get()))
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// The retransmission timer of QP `i` expired for real: ask the responder about the
    /// oldest request.
    pub(crate) fn send_access_check(&mut self, i: QpIndex) {
        let Some(w) = self.sq(i).get(0).copied() else {
            return;
        };
        let WqeKind::Request(r) = w.kind else {
            return;
        };
        let Some((op, addr, len, rkey)) = check_of(&r) else {
            return;
        };
        let a = self.qp(i).attrs;
        let check = AccessCheck {
            op,
            psn: w.psn.get(),
            addr,
            len,
            rkey,
            qpn: a.qpn.get(),
        };
        let Some(oob) = self.oob.as_mut() else {
            return;
        };
        match oob.send_check(a.peer_ip, &CheckMessage::Check(check)) {
            Ok(()) => self.stats.access_checks += 1,
            // A transport without checks, or a full queue: the retries go on regardless.
            Err(e) => core_debug!("QP {:#x}: no access check sent: {}", a.qpn.get(), e),
        }
    }

    /// An access check from the peer at `from`, or the verdict on one of ours.
    pub(crate) fn on_check(&mut self, from: Ipv4Addr, msg: CheckMessage) {
        match msg {
            CheckMessage::Check(c) => self.answer_check(from, c),
            CheckMessage::Verdict(v) => self.on_verdict(from, v),
        }
    }

    /// Checks a peer's request as the card (and, for a READ, this driver) would.
    fn answer_check(&mut self, from: Ipv4Addr, c: AccessCheck) {
        if c.op == CheckOp::SendInv {
            return self.queue_remote_inv(from, c);
        }
        let Some(i) = self.peer_qp(from, c.qpn) else {
            core_warn!(
                "{} asks about a request of its QP {:#x}, which no connected QP here has as peer",
                from,
                c.qpn
            );
            return;
        };
        let a = self.qp(i).attrs;
        let (qp_access, mr_access) = match c.op {
            CheckOp::Write => (QpAccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_WRITE),
            CheckOp::Read => (QpAccessFlags::REMOTE_READ, AccessFlags::REMOTE_READ),
            // A SEND needs no access flag on the QP (IB 10.6.1), only LOCAL_WRITE on the
            // receive buffer. The card checks REMOTE_WRITE on the QP for SENDs too, but
            // the driver grants it on the card whatever the application set, so the QP's
            // attributes (ibv_rc_pingpong sets none) are not the test: they refused a
            // lost SEND's check and put both QPs in ERR.
            CheckOp::Send | CheckOp::SendInv => (QpAccessFlags::empty(), AccessFlags::LOCAL_WRITE),
        };
        let ok = a.access.contains(qp_access)
            && self.mr_covers(
                MrKey::from_raw(c.rkey),
                c.addr,
                c.len,
                mr_access,
                Some(a.pd),
            );
        let verdict = match (ok, c.op) {
            (true, _) => CheckVerdict::Accepted,
            (false, CheckOp::Send) => CheckVerdict::OperationError,
            (false, _) => CheckVerdict::AccessError,
        };
        let reply = AccessVerdict {
            psn: c.psn,
            verdict,
            qpn: a.qpn.get(),
        };
        if let Some(oob) = self.oob.as_mut() {
            if let Err(e) = oob.send_check(from, &CheckMessage::Verdict(reply)) {
                core_warn!(
                    "QP {:#x}: cannot answer an access check of {}: {}",
                    a.qpn.get(),
                    from,
                    e
                );
            }
        }
        if verdict == CheckVerdict::OperationError {
            // The SEND's receive WR cannot take it: it fails here as it does there.
            core_warn!(
                "QP {:#x}: a SEND from {} names receive buffer {:#x}+{} of key {:#x}, which no MR of the QP's PD covers with LOCAL_WRITE: LOC_PROT_ERR, QP to ERR",
                a.qpn.get(),
                from,
                c.addr,
                c.len,
                c.rkey
            );
            self.deliver_ready(i);
            self.fail_recv(i, WcStatus::LocProtErr);
            self.enter_error(i);
        }
    }

    /// The peer's verdict on our oldest request.
    fn on_verdict(&mut self, from: Ipv4Addr, v: AccessVerdict) {
        if self.on_inv_verdict(from, &v) {
            return;
        }
        let status = match v.verdict {
            CheckVerdict::Accepted => return,
            CheckVerdict::AccessError => WcStatus::RemAccessErr,
            CheckVerdict::OperationError => WcStatus::RemOpErr,
        };
        let Some(i) = self.peer_qp(from, v.qpn) else {
            return;
        };
        let head = self.sq(i).get(0).copied();
        let still = head.is_some_and(|w| {
            w.psn.get() == v.psn
                && matches!(w.kind, WqeKind::Request(ref r) if check_of(r).is_some())
        });
        if !still {
            return;
        }
        self.stats.access_refused += 1;
        core_warn!(
            "QP {:#x}: {} refused the request at PSN {:#x} (status {}): the card dropped it",
            self.qp(i).attrs.qpn.get(),
            from,
            v.psn,
            status as u32
        );
        self.fail_qp(i, status);
    }
}
