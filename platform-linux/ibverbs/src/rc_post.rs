//! The RC post paths: ibv_post_send, where one application request becomes one or more
//! engine requests, and ibv_post_recv.
//!
//! The card takes one local buffer per request. Several SGEs are handled here:
//! - RDMA WRITE and READ with several SGEs are split into one engine request per SGE, at
//!   consecutive remote addresses, only the last one signaled (they complete in order, so
//!   its completion means all of them are done);
//! - SEND, SEND_WITH_IMM and WRITE_WITH_IMM must stay one message (one receive WR, one
//!   byte_len): their SGEs are copied into the QP's gather ring (`rc_rings.rs`) and sent
//!   from there;
//! - inline data (at most [`MAX_INLINE`] bytes, any SGE count, unregistered memory) is
//!   copied into the QP's ring of inline slots;
//! - an atomic (compare-and-swap, fetch-and-add) takes exactly one SGE of 8 bytes, the sink
//!   of the original value (IBV_SEND_INLINE means nothing for it and is ignored).

use core::ffi::c_int;
use std::ptr;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::engine::{RecvWr, SendOp, SendWr};
use bluerdma_core::keys::MrKey;
use bluerdma_core::oob::AtomicOp;

use crate::abi::*;
use crate::caps::{MAX_INLINE, MAX_SGE};
use crate::errors::{fail, set_bad};
use crate::handle::own;
use crate::pd::Pd;
use crate::rc_qp::Qp;
use crate::rc_rings::{PostState, BATCH};
use crate::rc_scatter::QpScatter;
use crate::sge;

/// The engine requests of one application request, appended to `out`.
///
/// # Safety
/// `wr` and its SGE list are valid (the caller of ibv_post_send guarantees it).
unsafe fn expand(
    q: &Qp,
    st: &mut PostState,
    wr: &IbvSendWr,
    inline_used: &mut u64,
    seq: u64,
    out: &mut Vec<SendWr>,
) -> Result<(), c_int> {
    // SAFETY: a QP's PD lives as long as the QP.
    let pd = unsafe { Pd::of(q.ibv.pd) };
    // Everything that can refuse the request comes before a buffer is taken.
    if crate::uc::is_uc(&q.ibv) && crate::uc::refuses(wr.opcode) {
        log::error!(
            "post_send: a UC QP has no RDMA READ, atomics or SEND_WITH_INV (opcode {})",
            wr.opcode
        );
        return Err(libc::EINVAL);
    }
    let imm = u32::from_be(wr.imm_data);
    let op = match wr.opcode {
        IBV_WR_RDMA_WRITE => SendOp::Write,
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm(imm),
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(imm),
        // `invalidate_rkey` shares `imm_data`'s place, in host order.
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv(wr.imm_data),
        IBV_WR_RDMA_READ => SendOp::Read,
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::Atomic(AtomicOp::CompareSwap {
            compare: wr.wr[1],
            swap: wr.wr[2],
        }),
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::Atomic(AtomicOp::FetchAdd { add: wr.wr[1] }),
        other => {
            log::error!("post_send: opcode {other} is not supported");
            return Err(libc::EOPNOTSUPP);
        }
    };
    let n = wr.num_sge.max(0) as usize;
    let is_atomic = matches!(op, SendOp::Atomic(_));
    let inline = wr.send_flags & IBV_SEND_INLINE != 0 && op != SendOp::Read && !is_atomic;
    if n > MAX_SGE && !inline || n > 0 && wr.sg_list.is_null() {
        log::error!("post_send: {n} SGEs (at most {MAX_SGE})");
        return Err(libc::EINVAL);
    }
    // SAFETY: num_sge entries are readable (checked non-null above).
    let sges = unsafe { sge::list(wr.sg_list, n) };
    let total: u64 = sges.iter().map(|s| s.length as u64).sum();
    if total > u32::MAX as u64 {
        return Err(libc::EINVAL);
    }
    let signaled = q.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0;
    // `wr.rdma` means nothing for a SEND (applications leave whatever is there; UCX's
    // am_bcopy did, and the engine refused a "remote range" that wrapped): the receive WR
    // announced by the peer gives the address and key.
    let is_send = matches!(
        op,
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_)
    );
    let (raddr, rkey) = if is_send {
        (0, 0)
    } else if is_atomic {
        (wr.wr[0], wr.wr[3] as u32)
    } else {
        (wr.wr[0], wr.wr[1] as u32)
    };
    let one = |laddr: u64, len: u32, lkey: u32, raddr: u64, signaled: bool| SendWr {
        wr_id: wr.wr_id,
        op,
        laddr: VirtAddr(laddr),
        len,
        lkey: MrKey::from_raw(lkey),
        raddr: VirtAddr(raddr),
        rkey: MrKey::from_raw(rkey),
        signaled,
        solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
    };
    if inline {
        if total > MAX_INLINE as u64 {
            log::error!("post_send: {total} bytes of inline data (at most {MAX_INLINE})");
            return Err(libc::EINVAL);
        }
        let (addr, key, slot) = st.inline_slot(pd, *inline_used)?;
        // SAFETY: the caller's SGE bytes are readable during ibv_post_send (they need not
        // be registered: that is what inline means).
        unsafe { sge::gather(sges, &mut slot[..total as usize]) };
        *inline_used += 1;
        out.push(one(addr, total as u32, key, raddr, signaled));
        return Ok(());
    }
    match (op, sges) {
        (SendOp::Atomic(_), [s]) if s.length == 8 => {
            out.push(one(s.addr, 8, s.lkey, raddr, signaled))
        }
        (SendOp::Atomic(_), _) => {
            log::error!(
                "post_send: an atomic takes one SGE of 8 bytes (the sink of the original \
                 value), not {n} SGEs of {total} bytes"
            );
            return Err(libc::EINVAL);
        }
        (_, []) => out.push(one(0, 0, 0, raddr, signaled)),
        (SendOp::Read, _) => {
            let mut off = 0u64;
            for (k, s) in sges.iter().enumerate() {
                let key = pd.read_sink_key(s.lkey)?;
                let last = k + 1 == sges.len();
                out.push(one(s.addr, s.length, key, raddr + off, signaled && last));
                off += s.length as u64;
            }
        }
        (SendOp::Write, _) => {
            let mut off = 0u64;
            for (k, s) in sges.iter().enumerate() {
                let last = k + 1 == sges.len();
                out.push(one(s.addr, s.length, s.lkey, raddr + off, signaled && last));
                off += s.length as u64;
            }
        }
        (_, [s]) => out.push(one(s.addr, s.length, s.lkey, raddr, signaled)),
        _ => {
            // One message from several buffers: gather.
            let (addr, key, region) = st.gather_region(&q.qp, pd, seq, total as usize)?;
            // SAFETY: as above; the SGEs are registered memory of the caller.
            unsafe { sge::gather(sges, region) };
            out.push(one(addr, total as u32, key, raddr, signaled));
        }
    }
    Ok(())
}

/// ibv_post_send for an RC QP.
///
/// # Safety
/// As ibv_post_send: `qp` is NULL or a live RC QP, and `wr` a list of valid requests whose
/// buffers belong to them until their completions.
pub(crate) unsafe fn post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    let Some(q) = (unsafe { own::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    let mut st = q.post.lock().unwrap_or_else(|e| e.into_inner());
    let (mut wrs, mut owner) = (std::mem::take(&mut st.wrs), std::mem::take(&mut st.owner));
    // SAFETY: forwarded contract.
    let rc = unsafe { post_batches(q, &mut st, wr, &mut wrs, &mut owner) };
    (st.wrs, st.owner) = (wrs, owner);
    match rc {
        Ok(()) => 0,
        Err((at, e)) => {
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, at) };
            e
        }
    }
}

/// Posts the chain from `wr` in batches of up to [`BATCH`] engine requests; on failure, the
/// application request that failed and the errno.
///
/// # Safety
/// As for `ibv_post_send`: a list of valid requests whose buffers belong to them until
/// their completions.
unsafe fn post_batches(
    q: &Qp,
    st: &mut PostState,
    mut wr: *mut IbvSendWr,
    wrs: &mut Vec<SendWr>,
    owner: &mut Vec<(usize, u64)>,
) -> Result<(), (*mut IbvSendWr, c_int)> {
    while !wr.is_null() {
        wrs.clear();
        owner.clear();
        let mut inline_used = 0u64;
        let mut error = None;
        while !wr.is_null() && wrs.len() < BATCH {
            // SAFETY: a list of valid requests, by the caller's contract.
            if crate::mw::is_local(unsafe { &*wr }) {
                // A bind or invalidation takes effect after what was posted before it.
                if !wrs.is_empty() {
                    break;
                }
                // SAFETY: as above.
                if let Err(e) = unsafe { crate::mw::post_local(q, st, &*wr) } {
                    error = Some((wr, e));
                    break;
                }
                // SAFETY: as above.
                wr = unsafe { (*wr).next };
                continue;
            }
            let before = (wrs.len(), inline_used);
            let seq = st.posted + wrs.len() as u64;
            // SAFETY: a list of valid requests, by the caller's contract.
            match unsafe { expand(q, st, &*wr, &mut inline_used, seq, wrs) } {
                Ok(()) => {
                    owner.resize(wrs.len(), (wr as usize, before.1));
                    // SAFETY: as above.
                    wr = unsafe { (*wr).next };
                }
                Err(e) => {
                    wrs.truncate(before.0);
                    inline_used = before.1;
                    error = Some((wr, e));
                    break;
                }
            }
        }
        if wrs.is_empty() {
            // Only local operations (or a refusal) in this round.
            if let Some(e) = error {
                return Err(e);
            }
            continue;
        }
        // SAFETY: the verbs contract: buffers belong to the requests until completion.
        let result = unsafe { q.qp.post_send(wrs) };
        let accepted = match &result {
            Ok(()) => wrs.len(),
            Err((k, _)) => *k,
        };
        st.posted += accepted as u64;
        st.inline_next += owner.get(accepted).map_or(inline_used, |o| o.1);
        let posted = st.posted;
        st.unstage(posted);
        if let Err((k, e)) = result {
            return Err((owner[k].0 as *mut IbvSendWr, fail(e)));
        }
        if let Some(e) = error {
            return Err(e);
        }
    }
    Ok(())
}

/// ibv_post_recv for an RC QP.
///
/// # Safety
/// As ibv_post_recv: `qp` is NULL or a live RC QP, and `wr` a list of valid requests
/// whose buffers belong to them until their completions.
pub(crate) unsafe fn post_recv(
    qp: *mut IbvQp,
    mut wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    let Some(q) = (unsafe { own::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    if q.srq.is_some() {
        log::error!("post_recv: the QP takes its receive WRs from its SRQ (ibv_post_srq_recv)");
        // SAFETY: the caller's bad_wr slot.
        unsafe { set_bad(bad, wr) };
        return libc::EINVAL;
    }
    let mut batch = [RecvWr {
        wr_id: 0,
        addr: VirtAddr(0),
        len: 0,
        lkey: MrKey::from_raw(0),
    }; BATCH];
    let mut ptrs = [ptr::null_mut::<IbvRecvWr>(); BATCH];
    let mut bounced = [false; BATCH];
    let mut scatter = q.scatter.lock().unwrap_or_else(|e| e.into_inner());
    while !wr.is_null() {
        let mut n = 0;
        let mut error = None;
        while !wr.is_null() && n < BATCH {
            // SAFETY: a list of valid requests, by the caller's contract.
            let w = unsafe { &*wr };
            // SAFETY: as above.
            let r = unsafe { recv_wr(q, &mut scatter, w) };
            (batch[n], bounced[n]) = match r {
                Ok(r) => r,
                Err(e) => {
                    error = Some((wr, e));
                    break;
                }
            };
            ptrs[n] = wr;
            n += 1;
            wr = w.next;
        }
        // SAFETY: the verbs contract: buffers belong to the requests until completion.
        if let Err((k, e)) = unsafe { q.qp.post_recv(&batch[..n]) } {
            for _ in bounced[k..n].iter().filter(|b| **b) {
                scatter.unstage();
            }
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, ptrs[k]) };
            return fail(e);
        }
        if let Some((at, e)) = error {
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, at) };
            return e;
        }
    }
    0
}

/// The engine's receive WR for `w`, and whether it is bounced (several SGEs: staged in the
/// QP's bounce ring, `rc_scatter.rs`).
///
/// # Safety
/// `w.sg_list` holds `w.num_sge` readable entries.
unsafe fn recv_wr(q: &Qp, scatter: &mut QpScatter, w: &IbvRecvWr) -> Result<(RecvWr, bool), c_int> {
    let n = w.num_sge.max(0) as usize;
    if n <= 1 {
        // SAFETY: the caller's contract.
        return Ok((unsafe { sge::recv_wr(w, "post_recv") }?, false));
    }
    if n > q.cap.max_recv_sge as usize || w.sg_list.is_null() {
        log::error!(
            "post_recv: {n} SGEs (the QP was made for {})",
            q.cap.max_recv_sge
        );
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract (checked non-null above).
    let sges = unsafe { sge::list(w.sg_list, n) };
    // SAFETY: a QP's PD lives as long as the QP.
    let pd = unsafe { Pd::of(q.ibv.pd) };
    if let Some(k) = (0..n).find(|&k| !pd.covers(sges[k].lkey, sges[k].addr, sges[k].length, true))
    {
        log::error!(
            "post_recv: SGE {k} is outside a region of lkey {:#x} with local write",
            sges[k].lkey
        );
        return Err(libc::EINVAL);
    }
    Ok((scatter.stage(pd, w.wr_id, sges)?, true))
}

// The engine's request type must stay cheap to build per post.
const _: () = assert!(core::mem::size_of::<SendWr>() <= 64);
