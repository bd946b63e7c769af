//! Opening and closing a context, and the function tables it carries: the data-path
//! entries of `struct ibv_context_ops` that the inline verbs of `<infiniband/verbs.h>`
//! jump through (post_send and post_recv choose the RC or UD path in `qp.rs`; poll_cq,
//! req_notify_cq and post_srq_recv have one), and the extended ops of `verbs_context`
//! (query_port, query_device_ex, create_cq_ex, create_qp_ex, and the refusals of
//! alloc_parent_domain and alloc_td, which say why).

use core::ffi::{c_int, c_void};

use crate::abi::*;
use crate::ah::bv_ibv_destroy_ah;
use crate::async_events;
use crate::channel::bv_ibv_destroy_comp_channel;
use crate::context::Ctx;
use crate::cq::bv_ibv_destroy_cq;
use crate::errors::errno_rc;
use crate::live::{self, Kind};
use crate::logging::init_log;
use crate::mr::bv_ibv_dereg_mr;
use crate::pd::bv_ibv_dealloc_pd;
use crate::qp::bv_ibv_destroy_qp;
use crate::srq::bv_ibv_destroy_srq;
use crate::{cq_ex, device_ex, mw, parent_domain, poll, port, qp, qp_ex, srq_post, ud_rx};

/// The ibv_context ops every context carries.
fn context_ops() -> [usize; 32] {
    let mut o = [0usize; 32];
    o[ops::ALLOC_MW] = mw::op_alloc_mw as *const () as usize;
    o[ops::BIND_MW] = mw::op_bind_mw as *const () as usize;
    o[ops::DEALLOC_MW] = mw::op_dealloc_mw as *const () as usize;
    o[ops::POLL_CQ] = poll::op_poll_cq as *const () as usize;
    o[ops::REQ_NOTIFY_CQ] = poll::op_req_notify_cq as *const () as usize;
    o[ops::POST_SEND] = qp::op_post_send as *const () as usize;
    o[ops::POST_RECV] = qp::op_post_recv as *const () as usize;
    o[ops::POST_SRQ_RECV] = srq_post::op_post_srq_recv as *const () as usize;
    o
}

/// The extended ops of the `verbs_context` around every context.
fn ext_ops() -> [usize; ext::WORDS] {
    let mut o = [0usize; ext::WORDS];
    o[ext::QUERY_PORT] = port::ext_query_port as *const () as usize;
    o[ext::QUERY_DEVICE_EX] = device_ex::ext_query_device_ex as *const () as usize;
    o[ext::ALLOC_PARENT_DOMAIN] = parent_domain::ext_alloc_parent_domain as *const () as usize;
    o[ext::ALLOC_TD] = device_ex::ext_alloc_td as *const () as usize;
    o[ext::CREATE_CQ_EX] = cq_ex::ext_create_cq_ex as *const () as usize;
    o[ext::CREATE_QP_EX] = qp_ex::ext_create_qp_ex as *const () as usize;
    o
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_open_device(dev: *mut IbvDevice) -> *mut IbvContext {
    init_log();
    // SAFETY: a device pointer from the list, or NULL.
    unsafe { Ctx::open(dev, context_ops(), ext_ops(), async_events::on_event) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_close_device(ctx: *mut IbvContext) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_close_device(ctx) })
}

/// The work of [`bv_ibv_close_device`]: 0, or the errno it returns (and sets).
///
/// As with rdma-core (where closing the device's file makes the kernel destroy what the
/// process left), the objects the context still holds are destroyed first, each before the
/// ones it uses; then the last context of a device stops its card, its threads and its
/// ports and frees its memory, so the next open in this process starts afresh.
unsafe fn ibv_close_device(ctx: *mut IbvContext) -> c_int {
    if !live::take(Kind::Ctx, ctx) {
        log::error!("close_device: {ctx:p} is not an open context (closed already?)");
        return libc::EINVAL;
    }
    let left = live::children(ctx);
    if !left.is_empty() {
        log::warn!(
            "close_device: the context still holds {} objects ({}); destroying them",
            left.len(),
            names(&left)
        );
    }
    for (kind, obj) in left {
        let p = obj as *mut c_void;
        // SAFETY: live objects of this context, destroyed users first (a QP before its
        // CQs, an MR before its PD), so none is refused as busy.
        let rc = unsafe {
            match kind {
                Kind::Qp => bv_ibv_destroy_qp(p.cast()),
                Kind::Srq => bv_ibv_destroy_srq(p.cast()),
                Kind::Ah => bv_ibv_destroy_ah(p.cast()),
                Kind::Mw => mw::op_dealloc_mw(p.cast()),
                Kind::Mr => bv_ibv_dereg_mr(p.cast()),
                Kind::ParentPd | Kind::Pd => bv_ibv_dealloc_pd(p.cast()),
                Kind::Cq => bv_ibv_destroy_cq(p.cast()),
                Kind::Channel => bv_ibv_destroy_comp_channel(p.cast()),
                Kind::Ctx => 0,
            }
        };
        if rc != 0 {
            log::error!("close_device: destroying the {kind:?} at {p:p} failed ({rc})");
        }
    }
    // SAFETY: an open context (it was live), which the caller gives up.
    let Some(c) = (unsafe { Ctx::take(ctx) }) else {
        return libc::EINVAL;
    };
    if let Some(e) = c.started_engine() {
        log::info!("bluerdma{} closed: {:?}", c.dev.index, e.stats());
        log::info!("bluerdma{} card: {}", c.dev.index, e.card_stats());
        if let Some([malformed, no_qp, qkey, no_buffer, broken]) = ud_rx::drops(&e) {
            log::info!(
                "bluerdma{} UD datagrams dropped: {malformed} malformed, {no_qp} for no ready \
                 QP, {qkey} for a wrong Q_Key, {no_buffer} for no receive buffer, {broken} \
                 missing a frame",
                c.dev.index
            );
        }
    }
    0
}

/// "2 Qp, 1 Mr" for a log line.
fn names(objs: &[(Kind, usize)]) -> String {
    let mut out: Vec<String> = Vec::new();
    for kind in [
        Kind::Qp,
        Kind::Srq,
        Kind::Ah,
        Kind::Mw,
        Kind::Mr,
        Kind::ParentPd,
        Kind::Pd,
        Kind::Cq,
        Kind::Channel,
    ] {
        let n = objs.iter().filter(|(k, _)| *k == kind).count();
        if n > 0 {
            out.push(format!("{n} {kind:?}"));
        }
    }
    out.join(", ")
}
