//! The poll path: `ibv_context_ops.poll_cq` (RC and UD completions alike; each receive of
//! an SRQ's QP hands that QP the pool's next WR) and `req_notify_cq`, which extended CQs
//! share (`cq_ex.rs` polls through [`poll_some`]).

use core::ffi::c_int;

use bluerdma_core::engine::{WcOpcode, WorkCompletion, WC_WITH_INV};

use crate::abi::*;
use crate::cq::Cq;
use crate::errors::fail;
use crate::handle::own;

/// The application's completion for an engine's.
pub(crate) fn wc_of(w: &WorkCompletion) -> IbvWc {
    IbvWc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: 0,
        byte_len: w.byte_len,
        // The union of `ibv_wc`: immediate data in network order, an invalidated rkey
        // (IBV_WC_WITH_INV) in host order.
        imm_data: if w.wc_flags & WC_WITH_INV != 0 {
            w.imm_data
        } else {
            w.imm_data.to_be()
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags,
        pkey_index: 0,
        slid: 0,
        // UD receives carry a GRH; sl bits 2..0 are then the RoCE L3 type, 2 = IPv4 (the
        // mlx5 convention UCX reads).
        sl: if w.wc_flags & IBV_WC_GRH != 0 { 2 } else { 0 },
        dlid_path_bits: 0,
        _pad: 0,
    }
}

/// `ibv_context_ops.poll_cq`.
///
/// # Safety
/// As ibv_poll_cq: `cq` is NULL or a live CQ, and `wc` has room for `n` completions.
pub(crate) unsafe extern "C" fn op_poll_cq(cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
    // SAFETY: the caller passes a live CQ.
    let Some(c) = (unsafe { own::<Cq, _>(cq) }) else {
        return -1;
    };
    if n <= 0 {
        return 0;
    }
    if wc.is_null() {
        return -1;
    }
    let mut buf = [WorkCompletion::EMPTY; 32];
    let mut got = 0usize;
    while got < n as usize {
        let want = (n as usize - got).min(buf.len());
        let Ok(k) = poll_some(c, &mut buf[..want]) else {
            return -1;
        };
        for (i, w) in buf[..k].iter().enumerate() {
            // SAFETY: the caller passes room for `n` completions.
            unsafe { wc.add(got + i).write(wc_of(w)) };
        }
        got += k;
        if k < want {
            break;
        }
    }
    got as c_int
}

/// Up to `buf.len()` completions of `c` with the library's part done (receives of several
/// SGEs copied out of their bounce buffer, SRQ members topped up): how many, or the errno
/// (logged and set).
pub(crate) fn poll_some(c: &Cq, buf: &mut [WorkCompletion]) -> Result<usize, c_int> {
    let k = c.cq.poll(buf).map_err(fail)?;
    c.scatter.completed(&mut buf[..k]);
    c.srq_members.completed(&buf[..k]);
    for w in &buf[..k] {
        if w.wc_flags & WC_WITH_INV != 0 {
            let key = bluerdma_core::keys::MrKey::from_raw(w.imm_data);
            crate::mw::remotely_invalidated(c.ibv.context as usize, key);
        }
    }
    Ok(k)
}

/// `ibv_context_ops.req_notify_cq`.
///
/// # Safety
/// `cq` is NULL or a live CQ.
pub(crate) unsafe extern "C" fn op_req_notify_cq(cq: *mut IbvCq, _solicited_only: c_int) -> c_int {
    // SAFETY: the caller passes a live CQ.
    let Some(c) = (unsafe { own::<Cq, _>(cq) }) else {
        return libc::EINVAL;
    };
    if c.ibv.channel.is_null() {
        return libc::EINVAL;
    }
    // Every completion is treated as solicited: an event for any completion is a superset
    // of what a solicited-only request asks for.
    c.cq.arm();
    0
}

// Keep the opcode numbering honest: the engine's completion opcodes are the ibv values.
const _: () = assert!(WcOpcode::Recv as u32 == 128 && WcOpcode::RecvRdmaWithImm as u32 == 129);
