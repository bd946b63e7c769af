//! Asynchronous events. The engine names a CQ or a QP by its handle; this finds the object
//! among the live ones of the contexts open on the device and writes the event to the
//! async file of the context that owns it (`ibv_get_async_event`). A CQ that overran also
//! fails the UD QPs that complete into it, as the engine fails its RC QPs: UD QPs are this
//! library's, not the engine's.

use core::ffi::c_void;
use std::ptr;
use std::sync::atomic::Ordering;

use bluerdma_core::engine::AsyncEvent;
use bluerdma_core::qp::QpState;

use crate::abi::*;
use crate::context::Ctx;
use crate::cq::Cq;
use crate::device::Device;
use crate::live::{self, Kind};
use crate::qp_base::is_ud;
use crate::ud_qp::ud;

/// The event sink of every engine (see `Ctx::open`).
pub(crate) fn on_event(dev: &'static Device, e: AsyncEvent) {
    let mut live = live::lock();
    let objs: Vec<(usize, live::Entry)> = live.iter().collect();
    let mut failed_cqs = Vec::new();
    let mut found = false;
    for &(p, entry) in &objs {
        if !live.ctx_open(entry.ctx) {
            continue;
        }
        // SAFETY: an open context (it is live, and the table is locked).
        let Some(ctx) = (unsafe { Ctx::from_ibv(entry.ctx as *mut IbvContext) }) else {
            continue;
        };
        if !ptr::eq(ctx.dev, dev) {
            continue;
        }
        // SAFETY: a live object (the table is locked: it cannot be destroyed meanwhile).
        let handle = unsafe { engine_handle(p, entry.kind) };
        match (e, entry.kind, handle) {
            (AsyncEvent::CqError { cq }, Kind::Cq, Some(h)) if h == cq => {
                log::error!("CQ {p:#x} overran: IBV_EVENT_CQ_ERR, its QPs go to ERR");
                ctx.post_event(p as *mut c_void, IBV_EVENT_CQ_ERR);
                failed_cqs.push((p, entry.ctx));
                found = true;
            }
            (AsyncEvent::QpFatal { qpn }, Kind::Qp, Some(h)) if h == qpn.get() => {
                log::info!("QP {h:#x} went to ERR: IBV_EVENT_QP_FATAL");
                ctx.post_event(p as *mut c_void, IBV_EVENT_QP_FATAL);
                found = true;
            }
            _ => {}
        }
    }
    for (cq, ctx) in failed_cqs {
        for &(p, entry) in &objs {
            let qp = p as *mut IbvQp;
            // SAFETY: live QPs of the context (the table is still locked).
            if entry.kind != Kind::Qp || entry.ctx != ctx || unsafe { !is_ud(qp) } {
                continue;
            }
            // SAFETY: as above.
            let (scq, rcq) = unsafe { ((*qp).send_cq as usize, (*qp).recv_cq as usize) };
            if scq == cq || rcq == cq {
                // SAFETY: a live UD QP; its context is open.
                unsafe { fail_ud(qp, entry.ctx) };
            }
        }
    }
    if !found {
        log::debug!("{e:?} for an object no open context holds any more");
    }
}

/// What the engine calls the object at `p`: a CQ's handle, an RC QP's number (`None` for
/// anything else).
///
/// # Safety
/// `p` is a live object of `kind`.
unsafe fn engine_handle(p: usize, kind: Kind) -> Option<u32> {
    match kind {
        // SAFETY: the caller's contract.
        Kind::Cq => Some(unsafe { Cq::of(p as *mut IbvCq) }.cq.handle()),
        // SAFETY: as above.
        Kind::Qp if unsafe { !is_ud(p as *mut IbvQp) } => {
            // SAFETY: as above.
            Some(unsafe { (*(p as *mut IbvQp)).qp_num })
        }
        _ => None,
    }
}

/// Moves UD QP `qp` to ERR (its receive WRs flushed) and raises QP_FATAL.
///
/// # Safety
/// `qp` is a live UD QP of the open context `ctx`.
unsafe fn fail_ud(qp: *mut IbvQp, ctx: usize) {
    // SAFETY: the caller's contract.
    let (Some(q), Some(c)) = (unsafe { ud(qp) }, unsafe {
        Ctx::from_ibv(ctx as *mut IbvContext)
    }) else {
        return;
    };
    if q.shared.state() == QpState::Err {
        return;
    }
    q.shared
        .state
        .store(QpState::Err.to_ibv(), Ordering::Release);
    q.shared.flush();
    // SAFETY: `state` is ours to update; applications read it.
    unsafe { (*qp).state = QpState::Err.to_ibv() };
    c.post_event(qp as *mut c_void, IBV_EVENT_QP_FATAL);
}
