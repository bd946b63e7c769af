//! ibv_post_send: one application request becomes one or more engine requests.
//!
//! The card takes one local buffer per request. Several SGEs are handled here:
//! - RDMA WRITE and READ with several SGEs are split into one engine request per SGE, at
//!   consecutive remote addresses, only the last one signaled (they complete in order, so
//!   its completion means all of them are done);
//! - SEND, SEND_WITH_IMM and WRITE_WITH_IMM must stay one message (one receive WR, one
//!   byte_len): their SGEs are copied into a per-QP gather ring (registered once) and sent
//!   from there;
//! - inline data (at most [`MAX_INLINE`] bytes, any SGE count, unregistered memory) is
//!   copied into a per-QP ring of fixed slots.
//!
//! Buffers in both rings are reused only after the engine says the request that used them
//! left the send queue (`Qp::sq_retired`); the inline ring reuses a slot only 2 x sq_depth
//! posts later, which the send queue's size guarantees.

use core::ffi::c_int;
use std::collections::VecDeque;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{SendOp, SendWr};
use bluerdma_core::keys::MrKey;
use bluerdma_linux::verbs::Mr as VMr;

use crate::abi::*;
use crate::device::caps;
use crate::fail;
use crate::objects::{own, Pd, Qp};

/// Inline data up to this many bytes per request (what UCX asks for).
pub(crate) const MAX_INLINE: u32 = 64;
/// SGEs per send request.
pub(crate) const MAX_SGE: usize = 6;
/// Bytes of a QP's gather ring (registered on first use).
const GATHER_BYTES: usize = 4 << 20;
/// Engine requests per engine call (one doorbell per batch).
pub(crate) const BATCH: usize = 32;

/// Per-QP state of the send path (behind the QP's post lock).
#[derive(Default)]
pub(crate) struct PostState {
    inline: Option<VMr>,
    /// Inline requests posted (slot = count mod slots).
    inline_next: u64,
    gather: Option<VMr>,
    /// Next free byte of the gather ring.
    gather_head: usize,
    /// Gather regions in use: (engine post number, offset, length), oldest first.
    gather_live: VecDeque<(u64, usize, usize)>,
    /// Engine requests posted on this QP (what `sq_retired` counts against).
    posted: u64,
    /// Scratch of `op_post_send`, kept so that a post allocates nothing: the engine
    /// requests of one batch, and for each the application request it came from (its
    /// address) and the inline slots used before it.
    wrs: Vec<SendWr>,
    owner: Vec<(usize, u64)>,
}

impl PostState {
    /// A QP moved to RESET: the engine's counts start again.
    pub(crate) fn reset(&mut self) {
        self.inline_next = 0;
        self.gather_head = 0;
        self.gather_live.clear();
        self.posted = 0;
    }

    fn inline_slot(&mut self, pd: &Pd, used: u64) -> Result<(u64, u32, &mut [u8]), c_int> {
        let slots = 2 * caps::capacity().sq_depth as u64;
        if self.inline.is_none() {
            let len = (slots * MAX_INLINE as u64) as usize;
            self.inline = Some(
                pd.pd
                    .alloc_mr(len, AccessFlags::LOCAL_WRITE)
                    .map_err(fail)?,
            );
        }
        let mr = self.inline.as_mut().ok_or(libc::ENOMEM)?;
        let (base, key) = (mr.addr(), mr.key().get());
        let at = (((self.inline_next + used) % slots) * MAX_INLINE as u64) as usize;
        let buf = mr.bytes_mut().ok_or(libc::ENOMEM)?;
        Ok((
            base + at as u64,
            key,
            &mut buf[at..at + MAX_INLINE as usize],
        ))
    }

    /// `len` contiguous bytes of the gather ring for engine post number `seq`.
    fn gather_region(
        &mut self,
        q: &Qp,
        pd: &Pd,
        seq: u64,
        len: usize,
    ) -> Result<(u64, u32, &mut [u8]), c_int> {
        if len > GATHER_BYTES {
            log::error!("post_send: {len} bytes in several SGEs (at most {GATHER_BYTES} gathered)");
            return Err(libc::EINVAL);
        }
        if self.gather.is_none() {
            let mr = pd.pd.alloc_mr(GATHER_BYTES, AccessFlags::LOCAL_WRITE);
            self.gather = Some(mr.map_err(fail)?);
        }
        // Free what the card is done with.
        if !self.gather_live.is_empty() {
            let retired = q.qp.sq_retired().map_err(fail)?;
            while self.gather_live.front().is_some_and(|r| r.0 < retired) {
                self.gather_live.pop_front();
            }
        }
        let at = match self.gather_live.front() {
            None => 0,
            Some(&(_, oldest, _)) if self.gather_head >= oldest => {
                if self.gather_head + len <= GATHER_BYTES {
                    self.gather_head
                } else if len <= oldest {
                    0
                } else {
                    return Err(libc::ENOMEM);
                }
            }
            Some(&(_, oldest, _)) if self.gather_head + len <= oldest => self.gather_head,
            Some(_) => return Err(libc::ENOMEM),
        };
        self.gather_head = at + len;
        self.gather_live.push_back((seq, at, len));
        let mr = self.gather.as_mut().ok_or(libc::ENOMEM)?;
        let (base, key) = (mr.addr(), mr.key().get());
        let buf = mr.bytes_mut().ok_or(libc::ENOMEM)?;
        Ok((base + at as u64, key, &mut buf[at..at + len]))
    }

    /// Forgets gather regions of engine posts numbered `from` and later (not posted).
    fn unstage(&mut self, from: u64) {
        while self.gather_live.back().is_some_and(|r| r.0 >= from) {
            self.gather_live.pop_back();
        }
        self.gather_head = self.gather_live.back().map_or(0, |r| r.1 + r.2);
    }
}

/// Copies the bytes of `sges` into `dst` (which has their total length).
///
/// # Safety
/// Each SGE's bytes are readable (the verbs contract for the duration of the post).
pub(crate) unsafe fn gather(sges: &[IbvSge], dst: &mut [u8]) {
    let mut at = 0;
    for s in sges {
        let n = s.length as usize;
        // SAFETY: the caller's contract.
        let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, n) };
        dst[at..at + n].copy_from_slice(src);
        at += n;
    }
}

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
    let pd = unsafe { &*(q.ibv.pd as *const Pd) };
    // Everything that can refuse the request comes before a buffer is taken.
    let imm = u32::from_be(wr.imm_data);
    let op = match wr.opcode {
        IBV_WR_RDMA_WRITE => SendOp::Write,
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm(imm),
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(imm),
        IBV_WR_RDMA_READ => SendOp::Read,
        other => {
            log::error!("post_send: opcode {other} is not supported");
            return Err(libc::EOPNOTSUPP);
        }
    };
    let n = wr.num_sge.max(0) as usize;
    let inline = wr.send_flags & IBV_SEND_INLINE != 0 && op != SendOp::Read;
    if n > MAX_SGE && !inline || n > 0 && wr.sg_list.is_null() {
        log::error!("post_send: {n} SGEs (at most {MAX_SGE})");
        return Err(libc::EINVAL);
    }
    let sges: &[IbvSge] = if n == 0 {
        &[]
    } else {
        // SAFETY: num_sge entries are readable (checked non-null above).
        unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
    };
    let total: u64 = sges.iter().map(|s| s.length as u64).sum();
    if total > u32::MAX as u64 {
        return Err(libc::EINVAL);
    }
    let signaled = q.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0;
    // `wr.rdma` means nothing for a SEND (applications leave whatever is there; UCX's
    // am_bcopy did, and the engine refused a "remote range" that wrapped): the receive WR
    // announced by the peer gives the address and key.
    let is_send = matches!(op, SendOp::Send | SendOp::SendWithImm(_));
    let (raddr, rkey) = if is_send {
        (0, 0)
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
        unsafe { gather(sges, &mut slot[..total as usize]) };
        *inline_used += 1;
        out.push(one(addr, total as u32, key, raddr, signaled));
        return Ok(());
    }
    match (op, sges) {
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
            let (addr, key, region) = st.gather_region(q, pd, seq, total as usize)?;
            // SAFETY: as above; the SGEs are registered memory of the caller.
            unsafe { gather(sges, region) };
            out.push(one(addr, total as u32, key, raddr, signaled));
        }
    }
    Ok(())
}

pub(crate) unsafe extern "C" fn op_post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    if unsafe { crate::ud::is_ud(qp) } {
        // SAFETY: the caller's contract.
        return unsafe { crate::ud::post_send(qp, wr, bad) };
    }
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
            if !bad.is_null() {
                // SAFETY: the caller passes a writable pointer slot.
                unsafe { *bad = at };
            }
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

// The engine's request type must stay cheap to build per post.
const _: () = assert!(core::mem::size_of::<SendWr>() <= 64);
