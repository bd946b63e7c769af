//! Opening and closing a context, and the function tables it carries: the data-path
//! entries of `struct ibv_context_ops` that the inline verbs of `<infiniband/verbs.h>`
//! jump through (post_send and post_recv choose the RC or UD path here; poll_cq,
//! req_notify_cq and post_srq_recv have one), and `verbs_context.query_port`.

use core::ffi::c_int;

use crate::abi::*;
use crate::context::Ctx;
use crate::logging::init_log;
use crate::qp_base::is_ud;
use crate::{poll, port, rc_post, srq_post, ud_post, ud_rx};

/// The ibv_context ops every context carries.
fn context_ops() -> [usize; 32] {
    let mut o = [0usize; 32];
    o[ops::POLL_CQ] = poll::op_poll_cq as *const () as usize;
    o[ops::REQ_NOTIFY_CQ] = poll::op_req_notify_cq as *const () as usize;
    o[ops::POST_SEND] = op_post_send as *const () as usize;
    o[ops::POST_RECV] = op_post_recv as *const () as usize;
    o[ops::POST_SRQ_RECV] = srq_post::op_post_srq_recv as *const () as usize;
    o
}

/// The extended ops of the `verbs_context` around every context.
fn ext_ops() -> [usize; ext::WORDS] {
    let mut o = [0usize; ext::WORDS];
    o[ext::QUERY_PORT] = port::ext_query_port as *const () as usize;
    o
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_open_device(dev: *mut IbvDevice) -> *mut IbvContext {
    init_log();
    // SAFETY: a device pointer from the list, or NULL.
    unsafe { Ctx::open(dev, context_ops(), ext_ops()) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_close_device(ctx: *mut IbvContext) -> c_int {
    // SAFETY: the caller passes an open context and gives it up.
    let Some(c) = (unsafe { Ctx::take(ctx) }) else {
        return libc::EINVAL;
    };
    if let Some(e) = c.started_engine() {
        log::info!("bluerdma{} closed: {:?}", c.dev.index, e.stats());
        log::info!("bluerdma{} card: {}", c.dev.index, e.card_stats());
        if let Some([malformed, no_qp, qkey, no_buffer]) = ud_rx::drops(&e) {
            log::info!(
                "bluerdma{} UD datagrams dropped: {malformed} malformed, {no_qp} for no ready \
                 QP, {qkey} for a wrong Q_Key, {no_buffer} for no receive buffer",
                c.dev.index
            );
        }
    }
    0
}

/// `ibv_context_ops.post_send`.
///
/// # Safety
/// As ibv_post_send.
unsafe extern "C" fn op_post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    if unsafe { is_ud(qp) } {
        // SAFETY: the caller's contract.
        unsafe { ud_post::post_send(qp, wr, bad) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rc_post::post_send(qp, wr, bad) }
    }
}

/// `ibv_context_ops.post_recv`.
///
/// # Safety
/// As ibv_post_recv.
unsafe extern "C" fn op_post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    if unsafe { is_ud(qp) } {
        // SAFETY: the caller's contract.
        unsafe { ud_post::post_recv(qp, wr, bad) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rc_post::post_recv(qp, wr, bad) }
    }
}
