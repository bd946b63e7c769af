//! QPs and SRQs on ids: `rdma_create_qp` (and `_ex`), `rdma_destroy_qp`, the SRQ calls,
//! `rdma_init_qp_attr`, and the active side's RTR/RTS on the peer's REP.
//!
//! A QP the CM makes is moved to INIT at once (UD: INIT, RTR and RTS, with the port space's
//! Q_Key); RTR and RTS follow with the peer's QPN and PSN from the CM exchange, in
//! `rdma_accept` on the passive side and in `rdma_get_cm_event` (the REP) on the active one.
//! Without CQs in the init attributes, one CQ with a completion channel is made for each
//! direction and put in `id->send_cq`/`id->recv_cq`, as the real library does.

use core::ffi::{c_int, c_void};

use crate::abi::*;
use crate::channel::EventBox;
use crate::err;
use crate::state::{self, Id, IdEntry, St};
use crate::verbs::{self, devices, QpPlan};
use crate::wire::{self, Msg, Params};

/// The parameters this side grants a request: what `rdma_accept` chose, or before it the
/// defaults (answer the requester's depths, clamped to the device).
fn granted(e: &IdEntry, req: &Params) -> Params {
    if e.state != St::ReqReceived {
        return e.mine;
    }
    let dev = e.device.map(|d| &devices()[d]);
    Params {
        responder_resources: req
            .initiator_depth
            .min(dev.map_or(255, |d| d.max_responder)),
        initiator_depth: req
            .responder_resources
            .min(dev.map_or(255, |d| d.max_initiator)),
        rnr_retry_count: 7,
        ..e.mine
    }
}

/// The QP plan of id `e` in its current state.
pub(crate) fn plan(e: &IdEntry) -> QpPlan {
    let dev_mtu = e.device.map_or(IBV_MTU_4096 as u8, |d| devices()[d].mtu);
    let mut p = QpPlan {
        ud: e.ud,
        psn: e.psn,
        mtu: dev_mtu,
        timeout: e.ack_timeout,
        tos: e.tos,
        ..QpPlan::default()
    };
    if let Some(peer) = e.peer.filter(|_| !e.ud) {
        p.peer_ip = e.remote.map(|r| *r.ip());
        p.peer_qpn = peer.qpn;
        p.peer_psn = peer.psn;
        p.mtu = dev_mtu.min(peer.mtu);
        if e.passive {
            let g = granted(e, &peer);
            p.responder_resources = g.responder_resources;
            p.initiator_depth = g.initiator_depth;
            p.retry_count = peer.retry_count;
            p.rnr_retry = peer.rnr_retry_count;
        } else {
            p.responder_resources = peer.initiator_depth;
            p.initiator_depth = peer.responder_resources;
            p.retry_count = e.mine.retry_count;
            p.rnr_retry = peer.rnr_retry_count;
        }
    }
    p
}

/// The REP of an active id reached the application: move its QP to RTR and RTS and send
/// the RTU (ESTABLISHED), or leave CONNECT_RESPONSE for an application-managed QP. A
/// connection that closed meanwhile is UNREACHABLE; a QP that cannot move is CONNECT_ERROR
/// (and the peer gets a REJ).
pub(crate) fn connect_response(ev: &mut EventBox) {
    let token = ev.token;
    let gone = |ev: &mut EventBox, errno: c_int| {
        ev.ev.event = RDMA_CM_EVENT_UNREACHABLE;
        ev.ev.status = -errno;
    };
    let (qp, plan) = {
        let mut cm = state::lock();
        let Some(e) = cm.ids.get_mut(&token) else {
            return;
        };
        if let Some(errno) = e.peer_gone.take() {
            e.state = St::Failed;
            return gone(ev, errno);
        }
        // SAFETY: the id is live (its entry is); its QP is the library's or the application's.
        (unsafe { (*(ev.ev.id as *mut Id)).c.qp }, plan(e))
    };
    if qp.is_null() {
        return;
    }
    // SAFETY: the id's live QP.
    let moved = unsafe { verbs::transition(qp, &plan, &[IBV_QPS_RTR, IBV_QPS_RTS]) };
    let mut cm = state::lock();
    let Some(e) = cm.ids.get_mut(&token) else {
        return;
    };
    let conn = e.conn;
    match (moved, e.peer_gone.take()) {
        (Err(errno), _) => {
            e.state = St::Failed;
            ev.ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
            ev.ev.status = -errno;
            if let Some(c) = conn {
                let rej = wire::Rej {
                    reason: wire::reason::CONSUMER_DEFINED,
                    private: vec![],
                };
                cm.send(c, &Msg::Rej(rej));
                cm.close(c);
            }
        }
        (Ok(()), Some(errno)) => {
            e.state = St::Failed;
            gone(ev, errno);
        }
        (Ok(()), None) => {
            if e.state == St::RepReceived {
                e.state = St::Connected;
                if let Some(c) = conn {
                    cm.send(c, &Msg::Rtu);
                }
            }
            ev.ev.event = RDMA_CM_EVENT_ESTABLISHED;
        }
    }
    drop(cm);
    crate::reactor::wake();
}

/// A CQ and its completion channel on `ctx`, for `rdma_create_qp` without CQs.
///
/// # Safety
/// `ctx` is an open context.
unsafe fn cq_with_channel(
    ctx: *mut c_void,
    cqe: u32,
    id: *mut c_void,
) -> Result<(*mut c_void, *mut c_void), c_int> {
    // SAFETY: per the contract.
    let ch = unsafe { verbs::ibv_create_comp_channel(ctx) };
    if ch.is_null() {
        return Err(errno_or(libc::ENOMEM));
    }
    // SAFETY: as above; the channel is this context's.
    let cq = unsafe { verbs::ibv_create_cq(ctx, cqe.clamp(1, 65536) as c_int, id, ch, 0) };
    if cq.is_null() {
        let e = errno_or(libc::ENOMEM);
        // SAFETY: the channel just made, unused.
        unsafe { verbs::ibv_destroy_comp_channel(ch) };
        return Err(e);
    }
    Ok((cq, ch))
}

fn errno_or(default: c_int) -> c_int {
    // SAFETY: errno of this thread.
    match unsafe { *libc::__errno_location() } {
        0 => default,
        e => e,
    }
}

/// Destroys the CQs and channels `rdma_create_qp` made for the id.
fn destroy_own_cqs(cid: &mut Id) {
    if !cid.own_cqs {
        return;
    }
    cid.own_cqs = false;
    let c = &mut cid.c;
    // SAFETY: the library made these; the QP that used them is gone.
    unsafe {
        for (cq, ch) in [
            (&mut c.send_cq, &mut c.send_cq_channel),
            (&mut c.recv_cq, &mut c.recv_cq_channel),
        ] {
            if !cq.is_null() {
                verbs::ibv_destroy_cq(*cq);
            }
            if !ch.is_null() {
                verbs::ibv_destroy_comp_channel(*ch);
            }
            *cq = core::ptr::null_mut();
            *ch = core::ptr::null_mut();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_create_qp(
    id: *mut RdmaCmId,
    pd: *mut c_void,
    attr: *mut IbvQpInitAttr,
) -> c_int {
    let Ok(token) = crate::api::live(id) else {
        return err(libc::EINVAL);
    };
    if attr.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: a live id of this library.
    let cid = unsafe { &mut *(id as *mut Id) };
    let Some(plan) = state::lock().ids.get(&token).map(plan) else {
        return err(libc::EINVAL);
    };
    let (ctx, pd) = (cid.c.verbs, if pd.is_null() { cid.c.pd } else { pd });
    if ctx.is_null() {
        log::error!("rdma_create_qp: the id has no device yet (bind or resolve an address first)");
        return err(libc::EINVAL);
    }
    if pd.is_null() {
        log::error!("rdma_create_qp: no protection domain (the device's could not be allocated)");
        return err(libc::EINVAL);
    }
    // SAFETY: the application's init attributes.
    let mut a = unsafe { *attr };
    if a.qp_type == 0 {
        // rdma_client leaves it to the id (the addrinfo's QP type).
        a.qp_type = cid.c.qp_type;
    }
    if (a.qp_type == IBV_QPT_UD) != plan.ud {
        log::error!(
            "rdma_create_qp: QP type {} does not match the id's port space",
            a.qp_type
        );
        return err(libc::EINVAL);
    }
    if !cid.c.qp.is_null() {
        return err(libc::EEXIST);
    }
    let made = a.send_cq.is_null() || a.recv_cq.is_null();
    if made {
        let me = id as *mut c_void;
        // SAFETY: the id's open context.
        match unsafe { cq_with_channel(ctx, a.cap.max_send_wr, me) } {
            Ok((cq, ch)) => (cid.c.send_cq, cid.c.send_cq_channel) = (cq, ch),
            Err(e) => return err(e),
        }
        // SAFETY: as above.
        match unsafe { cq_with_channel(ctx, a.cap.max_recv_wr, me) } {
            Ok((cq, ch)) => (cid.c.recv_cq, cid.c.recv_cq_channel) = (cq, ch),
            Err(e) => {
                cid.own_cqs = true;
                destroy_own_cqs(cid);
                return err(e);
            }
        }
        cid.own_cqs = true;
        if a.send_cq.is_null() {
            a.send_cq = cid.c.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = cid.c.recv_cq;
        }
    }
    if a.srq.is_null() {
        a.srq = cid.c.srq;
    }
    // SAFETY: a PD of the id's device and complete init attributes.
    let qp = unsafe { verbs::ibv_create_qp(pd, &mut a) };
    if qp.is_null() {
        let e = errno_or(libc::EINVAL);
        if made {
            destroy_own_cqs(cid);
        }
        return err(e);
    }
    let steps: &[u32] = if plan.ud {
        &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS]
    } else {
        &[IBV_QPS_INIT]
    };
    // SAFETY: the QP just made.
    if let Err(e) = unsafe { verbs::transition(qp, &plan, steps) } {
        // SAFETY: as above, unused.
        unsafe { verbs::ibv_destroy_qp(qp) };
        if made {
            destroy_own_cqs(cid);
        }
        return err(e);
    }
    // SAFETY: the application's attributes get the QP's capabilities, as from ibv_create_qp.
    unsafe { (*attr).cap = a.cap };
    cid.c.qp = qp;
    0
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_create_qp_ex(
    id: *mut RdmaCmId,
    attr: *mut IbvQpInitAttrEx,
) -> c_int {
    // SAFETY: the application's attributes.
    let Some(x) = (unsafe { attr.as_mut() }) else {
        return err(libc::EINVAL);
    };
    if x.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
        log::error!(
            "rdma_create_qp_ex: comp_mask {:#x} asks for more than a PD (not supported)",
            x.comp_mask
        );
        return err(libc::EOPNOTSUPP);
    }
    let mut a = IbvQpInitAttr {
        qp_context: x.qp_context,
        send_cq: x.send_cq,
        recv_cq: x.recv_cq,
        srq: x.srq,
        cap: x.cap,
        qp_type: x.qp_type,
        sq_sig_all: x.sq_sig_all,
        _pad: 0,
    };
    let pd = if x.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        x.pd
    } else {
        core::ptr::null_mut()
    };
    // SAFETY: forwarded from the application.
    let rc = unsafe { cm_rdma_create_qp(id, pd, &mut a) };
    x.cap = a.cap;
    rc
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_destroy_qp(id: *mut RdmaCmId) {
    if crate::api::live(id).is_err() {
        return;
    }
    // SAFETY: a live id of this library.
    let cid = unsafe { &mut *(id as *mut Id) };
    if !cid.c.qp.is_null() {
        // SAFETY: the id's QP; the application gives it up.
        unsafe { verbs::ibv_destroy_qp(cid.c.qp) };
        cid.c.qp = core::ptr::null_mut();
    }
    destroy_own_cqs(cid);
}

fn create_srq(id: *mut RdmaCmId, pd: *mut c_void, mut attr: IbvSrqInitAttr) -> Result<(), c_int> {
    crate::api::live(id)?;
    // SAFETY: a live id (checked).
    let c = unsafe { &mut *id };
    let pd = if pd.is_null() { c.pd } else { pd };
    if pd.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a PD of the id's device and complete attributes.
    let srq = unsafe { verbs::ibv_create_srq(pd, &mut attr) };
    if srq.is_null() {
        return Err(errno_or(libc::EINVAL));
    }
    c.srq = srq;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_create_srq(
    id: *mut RdmaCmId,
    pd: *mut c_void,
    attr: *mut IbvSrqInitAttr,
) -> c_int {
    // SAFETY: the application's attributes.
    match unsafe { attr.as_ref() } {
        Some(a) => create_srq(id, pd, *a).map_or_else(err, |()| 0),
        None => err(libc::EINVAL),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_create_srq_ex(
    id: *mut RdmaCmId,
    attr: *mut IbvSrqInitAttrEx,
) -> c_int {
    // SAFETY: the application's attributes.
    let Some(x) = (unsafe { attr.as_ref() }) else {
        return err(libc::EINVAL);
    };
    if x.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && x.srq_type != IBV_SRQT_BASIC {
        log::error!(
            "rdma_create_srq_ex: only basic SRQs are supported (type {})",
            x.srq_type
        );
        return err(libc::EOPNOTSUPP);
    }
    let pd = if x.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
        x.pd
    } else {
        core::ptr::null_mut()
    };
    let a = IbvSrqInitAttr {
        srq_context: x.srq_context,
        max_wr: x.max_wr,
        max_sge: x.max_sge,
        srq_limit: x.srq_limit,
        _pad: 0,
    };
    create_srq(id, pd, a).map_or_else(err, |()| 0)
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_destroy_srq(id: *mut RdmaCmId) {
    if crate::api::live(id).is_err() {
        return;
    }
    // SAFETY: a live id (checked).
    if let Some(c) = unsafe { id.as_mut() } {
        if !c.srq.is_null() {
            // SAFETY: the id's SRQ; the application gives it up.
            unsafe { verbs::ibv_destroy_srq(c.srq) };
            c.srq = core::ptr::null_mut();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cm_rdma_init_qp_attr(
    id: *mut RdmaCmId,
    attr: *mut IbvQpAttr,
    mask: *mut c_int,
) -> c_int {
    if attr.is_null() || mask.is_null() {
        return err(libc::EINVAL);
    }
    let Ok(token) = crate::api::live(id) else {
        return err(libc::EINVAL);
    };
    let Some(plan) = state::lock().ids.get(&token).map(plan) else {
        return err(libc::EINVAL);
    };
    // SAFETY: the application's attributes; qp_state names the step it asks about.
    let want = unsafe { (*attr).qp_state };
    match verbs::qp_attr(&plan, want) {
        Ok((a, m)) => {
            // SAFETY: both are writable.
            unsafe {
                *attr = a;
                *mask = m;
            }
            0
        }
        Err(e) => err(e),
    }
}
