//! ibv_post_srq_recv: WRs join the SRQ's pool, which then tops up its QPs (`srq.rs`).

use core::ffi::{c_int, c_void};

use crate::abi::IbvRecvWr;
use crate::errors::set_bad;
use crate::sge;
use crate::srq::Srq;

/// `ibv_context_ops.post_srq_recv`.
///
/// # Safety
/// As ibv_post_srq_recv: `srq` is NULL or a live SRQ, and `wr` a list of valid requests
/// whose buffers belong to them until their completions.
pub(crate) unsafe extern "C" fn op_post_srq_recv(
    srq: *mut c_void,
    mut wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes a live SRQ.
    let Some(s) = (unsafe { Srq::from_ibv(srq) }) else {
        return libc::EINVAL;
    };
    let mut pool = s.pool.post();
    while !wr.is_null() {
        // SAFETY: a list of valid requests, by the caller's contract.
        let w = unsafe { &*wr };
        // SAFETY: as above.
        let refused = match unsafe { sge::recv_wr(w, "post_srq_recv") } {
            Ok(r) => pool.push(r, s.max_wr).err().map(|_| libc::ENOMEM),
            Err(e) => Some(e),
        };
        if let Some(e) = refused {
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, wr) };
            return e;
        }
        wr = w.next;
    }
    pool.refill_all();
    0
}
