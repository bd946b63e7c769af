//! The QP verbs: ibv_create_qp, ibv_destroy_qp, ibv_modify_qp and ibv_query_qp, each
//! choosing the RC (`rc_qp.rs`) or UD (`ud_qp.rs`) QP by its type.

use core::ffi::{c_int, c_void};

use bluerdma_core::qp::QpAttrMask;

use crate::abi::*;
use crate::errors::{null, or_null};
use crate::handle::{free, own};
use crate::pd::Pd;
use crate::qp_base::is_ud;
use crate::rc_qp::{self, Qp};
use crate::ud_qp;

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    // SAFETY: the caller passes a PD from ibv_alloc_pd.
    let (Some(p), false) = ((unsafe { own::<Pd, _>(pd) }), attr.is_null()) else {
        return null(libc::EINVAL);
    };
    // SAFETY: the caller passes an initialised ibv_qp_init_attr.
    let a = unsafe { &mut *attr };
    match a.qp_type {
        // SAFETY: `p` is `pd`; the CQs (and SRQ) are the caller's.
        IBV_QPT_UD => or_null(unsafe { ud_qp::create(p, pd, a) }),
        // SAFETY: as above.
        IBV_QPT_RC => or_null(unsafe { rc_qp::create(p, pd, a) }),
        other => {
            log::error!("create_qp: QP type {other} is not supported (RC and UD only)");
            null(libc::EOPNOTSUPP)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    if unsafe { is_ud(qp) } {
        // SAFETY: a UD QP the caller gives up.
        return unsafe { ud_qp::destroy(qp) };
    }
    // SAFETY: made by ibv_create_qp; the caller gives it up.
    unsafe { free::<Qp, _>(qp) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_modify_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes an ibv_qp_attr.
    let a = unsafe { &*attr };
    let mask = QpAttrMask::from_bits_truncate(mask as u32);
    // SAFETY: the caller passes a live QP.
    if unsafe { is_ud(qp) } {
        // SAFETY: as above.
        unsafe { ud_qp::modify(qp, a, mask) }
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
    if qp.is_null() || attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes a live QP.
    if unsafe { is_ud(qp) } {
        // SAFETY: as above; both structures are writable.
        unsafe { ud_qp::query(qp, attr, init) }
    } else {
        // SAFETY: as above.
        unsafe { rc_qp::query(qp, attr, init) }
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_qp_to_qp_ex(_qp: *mut IbvQp) -> *mut c_void {
    // The extended post API (ibv_wr_*) is not offered; callers fall back to ibv_post_send.
    null(libc::EOPNOTSUPP)
}
