//! `ibv_create_cq_ex` (`verbs_context.create_cq_ex`) and the polling functions of an
//! extended CQ: `start_poll`, `next_poll`, `end_poll` and the `read_*` accessors the inline
//! `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll` and `ibv_wc_read_*` call.
//!
//! An extended CQ is a CQ of `cq.rs` with its `ibv_cq_ex` table set, so `ibv_cq_ex_to_cq`,
//! ibv_poll_cq, completion channels, ibv_req_notify_cq, ibv_resize_cq and ibv_destroy_cq work
//! on it as on any other. Each `start_poll` / `next_poll` takes one completion through the
//! same poll path as ibv_poll_cq (`poll::poll_some`), writes its `status` and `wr_id` into
//! the `ibv_cq_ex`, and keeps it for the accessors until the next one.
//!
//! The work-completion fields this device fills are the standard ones
//! (IBV_WC_STANDARD_FLAGS); completion timestamps (it has no completion clock), CVLAN, flow
//! tags and tag matching are refused with EOPNOTSUPP, as is
//! IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN (an overrun is reported, IBV_EVENT_CQ_ERR). A parent
//! domain (IBV_CQ_INIT_ATTR_MASK_PD) is accepted and must be a live one.

use core::ffi::c_int;
use std::ptr;
use std::sync::MutexGuard;

use bluerdma_core::engine::WorkCompletion;

use crate::abi::*;
use crate::abi_ex::*;
use crate::cq::{self, Cq};
use crate::errors::or_null;
use crate::handle::own;
use crate::live::{self, Kind};
use crate::parent_domain::is_parent_of;
use crate::poll::{poll_some, wc_of};

/// The comp_mask bits of `ibv_cq_init_attr_ex` rdma-core 44 defines.
const KNOWN_MASK: u32 = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;

/// `verbs_context.create_cq_ex`.
///
/// # Safety
/// As ibv_create_cq_ex: `ctx` is an open context and `attr` NULL or an initialised
/// `ibv_cq_init_attr_ex` whose channel is NULL or one of this library's.
pub(crate) unsafe extern "C" fn ext_create_cq_ex(
    ctx: *mut IbvContext,
    attr: *mut IbvCqInitAttrEx,
) -> *mut IbvCq {
    // SAFETY: forwarded contract.
    or_null(unsafe { create_cq_ex(ctx, attr) })
}

/// # Safety
/// As [`ext_create_cq_ex`].
unsafe fn create_cq_ex(
    ctx: *mut IbvContext,
    attr: *mut IbvCqInitAttrEx,
) -> Result<*mut IbvCq, c_int> {
    live::check(Kind::Ctx, ctx, "create_cq_ex")?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes an initialised ibv_cq_init_attr_ex.
    let a = unsafe { &*attr };
    if a.comp_mask & !KNOWN_MASK != 0 {
        log::error!(
            "create_cq_ex: comp_mask {:#x} has bits rdma-core 44 does not define",
            a.comp_mask
        );
        return Err(libc::EINVAL);
    }
    let refuse = |what: &str| {
        log::error!("create_cq_ex: {what}");
        Err(libc::EOPNOTSUPP)
    };
    if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
        return refuse(&format!(
            "wc_flags {:#x}: this device fills the standard fields only \
             (IBV_WC_STANDARD_FLAGS, {IBV_WC_STANDARD_FLAGS:#x}); it has no completion \
             timestamps, CVLAN, flow tags or tag matching",
            a.wc_flags
        ));
    }
    // A parent domain may be named; the CQ's entries are the engine's, which its
    // allocator cannot place (parent_domain.rs), so the CQ does not keep it.
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !is_parent_of(a.parent_domain, ctx) {
        log::error!(
            "create_cq_ex: IBV_CQ_INIT_ATTR_MASK_PD with {:p}, which is not a live parent \
             domain of this context",
            a.parent_domain
        );
        return Err(libc::EINVAL);
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        && a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0
    {
        return refuse(&format!(
            "flags {:#x}: only IBV_CREATE_CQ_ATTR_SINGLE_THREADED (an overrun cannot be \
             ignored: it is reported as IBV_EVENT_CQ_ERR)",
            a.flags
        ));
    }
    let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
        log::error!(
            "create_cq_ex: cqe {} or comp_vector {} out of range",
            a.cqe,
            a.comp_vector
        );
        return Err(libc::EINVAL);
    };
    // SAFETY: an open context; the channel is checked by create_cq.
    unsafe { cq::create_cq(ctx, cqe, a.cq_context, a.channel, vector, Some(table())) }
}

/// The polling functions of every extended CQ.
fn table() -> [usize; cqx::COUNT] {
    let mut t = [0usize; cqx::COUNT];
    t[cqx::START_POLL] = start_poll as *const () as usize;
    t[cqx::NEXT_POLL] = next_poll as *const () as usize;
    t[cqx::END_POLL] = end_poll as *const () as usize;
    t[cqx::READ_OPCODE] = read_opcode as *const () as usize;
    t[cqx::READ_VENDOR_ERR] = read_vendor_err as *const () as usize;
    t[cqx::READ_BYTE_LEN] = read_byte_len as *const () as usize;
    t[cqx::READ_IMM_DATA] = read_imm_data as *const () as usize;
    t[cqx::READ_QP_NUM] = read_qp_num as *const () as usize;
    t[cqx::READ_SRC_QP] = read_src_qp as *const () as usize;
    t[cqx::READ_WC_FLAGS] = read_wc_flags as *const () as usize;
    t[cqx::READ_SLID] = read_slid as *const () as usize;
    t[cqx::READ_SL] = read_sl as *const () as usize;
    t[cqx::READ_DLID_PATH_BITS] = read_dlid_path_bits as *const () as usize;
    t
}

/// Takes the next completion of `c`: 0 (its status and wr_id are in the `ibv_cq_ex`, the
/// rest in `current`), ENOENT when there is none, or the errno of a failed poll.
fn advance(c: &Cq) -> c_int {
    let mut one = [WorkCompletion::EMPTY];
    match poll_some(c, &mut one) {
        Ok(0) => libc::ENOENT,
        Ok(_) => {
            let wc = wc_of(&one[0]);
            // SAFETY: the ibv_cq_ex's status and wr_id are written only here, by the thread
            // polling, and read by the application after this returns.
            unsafe {
                ptr::write(c.ex.status.get(), wc.status);
                ptr::write(c.ex.wr_id.get(), wc.wr_id);
            }
            *current(c) = wc;
            0
        }
        Err(e) => e,
    }
}

fn current(c: &Cq) -> MutexGuard<'_, IbvWc> {
    c.current.lock().unwrap_or_else(|e| e.into_inner())
}

/// The CQ behind the application's `ibv_cq_ex`.
///
/// # Safety
/// `cq` is NULL or a live CQ of this library.
unsafe fn cq_of<'a>(cq: *mut IbvCq) -> Option<&'a Cq> {
    // SAFETY: the caller's contract.
    unsafe { own::<Cq, _>(cq) }
}

/// `ibv_cq_ex.start_poll`: `attr->comp_mask` must be 0.
unsafe extern "C" fn start_poll(cq: *mut IbvCq, attr: *mut u32) -> c_int {
    // SAFETY: the application's ibv_cq_ex, a live CQ of this library.
    let Some(c) = (unsafe { cq_of(cq) }) else {
        return libc::EINVAL;
    };
    // `struct ibv_poll_cq_attr` is one comp_mask.
    // SAFETY: the application passes an ibv_poll_cq_attr or NULL.
    if !attr.is_null() && unsafe { *attr } != 0 {
        log::error!("ibv_start_poll: ibv_poll_cq_attr.comp_mask must be 0");
        return libc::EINVAL;
    }
    advance(c)
}

/// `ibv_cq_ex.next_poll`.
unsafe extern "C" fn next_poll(cq: *mut IbvCq) -> c_int {
    // SAFETY: as start_poll.
    match unsafe { cq_of(cq) } {
        Some(c) => advance(c),
        None => libc::EINVAL,
    }
}

/// `ibv_cq_ex.end_poll`: nothing is held between the calls of a poll.
unsafe extern "C" fn end_poll(_cq: *mut IbvCq) {}

/// One field of the current completion (zero for a NULL CQ).
///
/// # Safety
/// As start_poll.
unsafe fn read<T: Default>(cq: *mut IbvCq, f: impl FnOnce(&IbvWc) -> T) -> T {
    // SAFETY: the caller's contract.
    unsafe { cq_of(cq) }.map_or_else(T::default, |c| f(&current(c)))
}

unsafe extern "C" fn read_opcode(cq: *mut IbvCq) -> u32 {
    // SAFETY: the application's ibv_cq_ex.
    unsafe { read(cq, |w| w.opcode) }
}

unsafe extern "C" fn read_vendor_err(cq: *mut IbvCq) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.vendor_err) }
}

unsafe extern "C" fn read_byte_len(cq: *mut IbvCq) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.byte_len) }
}

/// Network byte order, as `ibv_wc.imm_data`; with IBV_WC_WITH_INV the invalidated rkey in
/// host order (`ibv_wc_read_invalidated_rkey` reads it through this entry).
unsafe extern "C" fn read_imm_data(cq: *mut IbvCq) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.imm_data) }
}

unsafe extern "C" fn read_qp_num(cq: *mut IbvCq) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.qp_num) }
}

unsafe extern "C" fn read_src_qp(cq: *mut IbvCq) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.src_qp) }
}

unsafe extern "C" fn read_wc_flags(cq: *mut IbvCq) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.wc_flags) }
}

unsafe extern "C" fn read_slid(cq: *mut IbvCq) -> u32 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.slid as u32) }
}

unsafe extern "C" fn read_sl(cq: *mut IbvCq) -> u8 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.sl) }
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut IbvCq) -> u8 {
    // SAFETY: as read_opcode.
    unsafe { read(cq, |w| w.dlid_path_bits) }
}
