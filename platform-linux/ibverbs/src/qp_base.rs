//! What RC and UD QPs share: both are a box whose first field is the `ibv_qp`, told apart
//! by its `qp_type`; both need a send and a receive CQ, start in RESET and report their
//! creation attributes the same way.

use core::ffi::c_int;
use std::ptr;

use bluerdma_core::qp::{QpAttrMask, QpState};

use crate::abi::*;
use crate::cq::Cq;
use crate::handle::own;
use crate::pd::Pd;

/// Whether `qp` (a QP from ibv_create_qp) is a UD QP.
///
/// # Safety
/// `qp` is NULL or a live QP.
pub(crate) unsafe fn is_ud(qp: *mut IbvQp) -> bool {
    // SAFETY: the caller's contract; qp_type is set at creation and never changes.
    !qp.is_null() && unsafe { (*qp).qp_type } == IBV_QPT_UD
}

/// Checks the attributes of a software QP's transition `cur` -> `to` (`given`, without
/// STATE and CUR_STATE) against what it `allowed` and `required`, and a port or P_Key
/// index the device does not have; EINVAL, logged for `what` ("UD", "raw packet").
pub(crate) fn check_attrs(
    what: &str,
    (cur, to): (QpState, QpState),
    a: &IbvQpAttr,
    given: QpAttrMask,
    (allowed, required): (QpAttrMask, QpAttrMask),
) -> Result<(), c_int> {
    if !required.difference(given).is_empty() || !given.difference(allowed).is_empty() {
        log::error!(
            "modify_qp ({what}): {cur:?} -> {to:?} takes {allowed:?} (requires {required:?}), \
             got {given:?}"
        );
        return Err(libc::EINVAL);
    }
    if (given.contains(QpAttrMask::PORT) && a.port_num != 1)
        || (given.contains(QpAttrMask::PKEY_INDEX) && a.pkey_index != 0)
    {
        log::error!(
            "modify_qp ({what}): port {} / P_Key index {} do not exist",
            a.port_num,
            a.pkey_index
        );
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The send and receive CQs a new QP names (both are required).
///
/// # Safety
/// `a.send_cq` and `a.recv_cq` are NULL or CQs from ibv_create_cq.
pub(crate) unsafe fn qp_cqs<'a>(a: &IbvQpInitAttr) -> Option<(&'a Cq, &'a Cq)> {
    // SAFETY: the caller's contract.
    let cqs = unsafe { (own::<Cq, _>(a.send_cq), own::<Cq, _>(a.recv_cq)) };
    match cqs {
        (Some(s), Some(r)) => Some((s, r)),
        _ => {
            log::error!("create_qp: a send and a receive CQ are required");
            None
        }
    }
}

/// The `ibv_qp` of a new QP (in RESET) made on `pd` from `a`.
pub(crate) fn new_ibv_qp(p: &Pd, pd: *mut IbvPd, a: &IbvQpInitAttr, qpn: u32) -> IbvQp {
    IbvQp {
        context: p.ibv.context,
        qp_context: a.qp_context,
        pd,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        handle: qpn,
        qp_num: qpn,
        state: QpState::Reset.to_ibv(),
        qp_type: a.qp_type,
        mutex: [0; 40],
        cond: [0; 48],
        events_completed: 0,
        _pad: 0,
    }
}

/// The creation attributes ibv_query_qp reports for a QP.
pub(crate) fn init_attr_of(ibv: &IbvQp, cap: IbvQpCap, sq_sig_all: bool) -> IbvQpInitAttr {
    IbvQpInitAttr {
        qp_context: ibv.qp_context,
        send_cq: ibv.send_cq,
        recv_cq: ibv.recv_cq,
        srq: ptr::null_mut(),
        cap,
        qp_type: ibv.qp_type,
        sq_sig_all: sq_sig_all as c_int,
        _pad: 0,
    }
}
