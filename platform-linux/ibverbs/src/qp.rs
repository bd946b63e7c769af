//! The QP verbs: ibv_create_qp, ibv_destroy_qp, ibv_modify_qp and ibv_query_qp, and the
//! post entries of the context's table (`ibv_context_ops.post_send` and `post_recv`), each
//! choosing the RC (`rc_qp.rs`, `rc_post.rs`) or UD (`ud_qp.rs`, `ud_post.rs`) QP by its
//! type.

use core::ffi::{c_int, c_void};

use bluerdma_core::qp::QpAttrMask;

use crate::abi::*;
use crate::cq::Cq;
use crate::errors::{errno_rc, null, or_null};
use crate::handle::{free, own};
use crate::live::{self, Kind};
use crate::pd::Pd;
use crate::qp_base::is_ud;
use crate::raw_qp::{self, is_raw, IBV_QPT_RAW_PACKET};
use crate::rc_qp::{self, Qp};
use crate::ud_qp;
use crate::wr_batch::{ExtOps, QpExt};
use crate::{rc_post, ud_post};

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    // SAFETY: forwarded contract.
    or_null(unsafe { create_qp(pd, attr, None) })
}

/// ibv_create_qp, and ibv_create_qp_ex (`qp_ex.rs`) with the `ibv_wr_*` table of an
/// extended QP in `ext`.
///
/// # Safety
/// `pd` and the objects `attr` names are NULL or this library's.
pub(crate) unsafe fn create_qp(
    pd: *mut IbvPd,
    attr: *mut IbvQpInitAttr,
    ext: Option<ExtOps>,
) -> Result<*mut IbvQp, c_int> {
    crate::pd::check(pd, "create_qp")?;
    // SAFETY: a live PD.
    let (Some(p), false) = ((unsafe { own::<Pd, _>(pd) }), attr.is_null()) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: the caller passes an initialised ibv_qp_init_attr.
    let a = unsafe { &mut *attr };
    for cq in [a.send_cq, a.recv_cq].into_iter().filter(|c| !c.is_null()) {
        live::check(Kind::Cq, cq, "create_qp")?;
    }
    if !a.srq.is_null() {
        live::check(Kind::Srq, a.srq, "create_qp")?;
    }
    let qp = match a.qp_type {
        // SAFETY: `p` is `pd`; the CQs (and SRQ) are live objects of this library.
        IBV_QPT_UD => unsafe { ud_qp::create(p, pd, a, ext) }?,
        // SAFETY: as above. A UC QP is an RC QP with UC's interface (uc.rs).
        IBV_QPT_RC | IBV_QPT_UC => unsafe { rc_qp::create(p, pd, a, ext) }?,
        // SAFETY: as above.
        IBV_QPT_RAW_PACKET => unsafe { raw_qp::create(p, pd, a, ext) }?,
        other => {
            log::error!(
                "create_qp: QP type {other} is not supported (RC, UC, UD and raw packet only)"
            );
            return Err(libc::EOPNOTSUPP);
        }
    };
    // The QP holds its PD and CQs until it is destroyed (they refuse to go before).
    p.hold();
    // SAFETY: both CQs are live (the create checked them).
    unsafe {
        Cq::of(a.send_cq).hold();
        Cq::of(a.recv_cq).hold();
    }
    live::add(Kind::Qp, qp, p.ibv.context);
    Ok(qp)
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_destroy_qp(qp) })
}

/// The work of [`bv_ibv_destroy_qp`]: 0, or the errno it returns (and sets).
unsafe fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    if !live::take(Kind::Qp, qp) {
        log::error!("destroy_qp: {qp:p} is not a live QP (destroyed already?)");
        return libc::EINVAL;
    }
    // SAFETY: a live QP (just checked): what it holds, read before it goes.
    let (pd, scq, rcq) = unsafe { ((*qp).pd, (*qp).send_cq, (*qp).recv_cq) };
    // SAFETY: a live QP.
    let (ud, raw) = unsafe { (is_ud(qp), is_raw(qp)) };
    let rc = if ud {
        // SAFETY: a UD QP the caller gives up.
        unsafe { ud_qp::destroy(qp) }
    } else if raw {
        // SAFETY: a raw packet QP the caller gives up.
        unsafe { raw_qp::destroy(qp) }
    } else {
        // SAFETY: made by ibv_create_qp; the caller gives it up.
        unsafe { free::<Qp, _>(qp) }
    };
    // SAFETY: a QP's PD and CQs outlive it (they refuse to go while it lives).
    unsafe {
        Pd::of(pd).release();
        Cq::of(scq).release();
        Cq::of(rcq).release();
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_modify_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_modify_qp(qp, attr, mask) })
}

/// The work of [`bv_ibv_modify_qp`]: 0, or the errno it returns (and sets).
unsafe fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int {
    if let Err(e) = live::check(Kind::Qp, qp, "modify_qp") {
        return e;
    }
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes an ibv_qp_attr.
    let a = unsafe { &*attr };
    let mask = QpAttrMask::from_bits_truncate(mask as u32);
    // SAFETY: the caller passes a live QP.
    let (ud, raw) = unsafe { (is_ud(qp), is_raw(qp)) };
    if ud {
        // SAFETY: as above.
        unsafe { ud_qp::modify(qp, a, mask) }
    } else if raw {
        // SAFETY: as above.
        unsafe { raw_qp::modify(qp, a, mask) }
    } else {
        // SAFETY: as above.
        unsafe { rc_qp::modify(qp, a, mask) }
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    _mask: c_int,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_query_qp(qp, attr, _mask, init) })
}

/// The work of [`bv_ibv_query_qp`]: 0, or the errno it returns (and sets).
unsafe fn ibv_query_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    _mask: c_int,
    init: *mut IbvQpInitAttr,
) -> c_int {
    if let Err(e) = live::check(Kind::Qp, qp, "query_qp") {
        return e;
    }
    if attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes a live QP.
    let (ud, raw) = unsafe { (is_ud(qp), is_raw(qp)) };
    if ud {
        // SAFETY: as above; both structures are writable.
        unsafe { ud_qp::query(qp, attr, init) }
    } else if raw {
        // SAFETY: as above.
        unsafe { raw_qp::query(qp, attr, init) }
    } else {
        // SAFETY: as above.
        unsafe { rc_qp::query(qp, attr, init) }
    }
}

/// Whether data of `op` arrives in order on `qp`: 0, no guarantee (rdma-core's answer for a
/// device that does not say; a retransmission may write a buffer again).
#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_qp_data_in_order(
    _qp: *mut IbvQp,
    _op: u32,
    _flags: u32,
) -> c_int {
    0
}

/// The `ibv_qp_ex` of a QP made by ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
/// (the QP itself: its box starts with one); NULL for any other QP, as with rdma-core.
#[no_mangle]
pub unsafe extern "C" fn bv_ibv_qp_to_qp_ex(qp: *mut IbvQp) -> *mut c_void {
    if !live::is(Kind::Qp, qp) {
        log::error!("ibv_qp_to_qp_ex: {qp:p} is not a live QP of this library");
        return null(libc::EINVAL);
    }
    // SAFETY: a live QP of this library.
    if unsafe { QpExt::of(qp) }.send_ops.is_some() {
        qp as *mut c_void
    } else {
        null(libc::EOPNOTSUPP)
    }
}

/// `ibv_context_ops.post_send`.
///
/// # Safety
/// As ibv_post_send.
pub(crate) unsafe extern "C" fn op_post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    let (ud, raw) = unsafe { (is_ud(qp), is_raw(qp)) };
    if ud {
        // SAFETY: the caller's contract.
        unsafe { ud_post::post_send(qp, wr, bad) }
    } else if raw {
        // SAFETY: the caller's contract.
        unsafe { raw_qp::post_send(qp, wr, bad) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rc_post::post_send(qp, wr, bad) }
    }
}

/// `ibv_context_ops.post_recv`.
///
/// # Safety
/// As ibv_post_recv.
pub(crate) unsafe extern "C" fn op_post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    let (ud, raw) = unsafe { (is_ud(qp), is_raw(qp)) };
    if ud {
        // SAFETY: the caller's contract.
        unsafe { ud_post::post_recv(qp, wr, bad) }
    } else if raw {
        // SAFETY: the caller's contract.
        unsafe { raw_qp::post_recv(qp, wr, bad) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rc_post::post_recv(qp, wr, bad) }
    }
}
