//! Memory windows: `ibv_alloc_mw`, `ibv_bind_mw` (type 1), `ibv_dealloc_mw`, and the send
//! queue's local operations IBV_WR_BIND_MW (type 2) and IBV_WR_LOCAL_INV, also through
//! `ibv_wr_bind_mw` / `ibv_wr_local_inv`.
//!
//! A bound window is an entry of the card's MR table of its own (the engine's `bind_mw`):
//! its rkey, its part of an MR registered with IBV_ACCESS_MW_BIND, its remote access, and
//! the MR's page table. The card checks a WRITE against it (key, access, bounds) as against
//! any MR, the responder's driver a READ or an atomic; an invalidated window's entry is
//! gone, so its rkey is refused from then on. Rebinding a type 1 window changes its key
//! byte (`ibv_inc_rkey`); a type 2 window takes the rkey of the bind request, which must
//! keep the window's index (the upper 24 bits).
//!
//! A bind or invalidation is a request of the QP's send queue: it waits until every
//! request posted before it on the QP has completed (so completions stay in posting
//! order), takes effect, and completes at once (IBV_WC_BIND_MW / IBV_WC_LOCAL_INV when
//! signaled). A refused one completes with IBV_WC_MW_BIND_ERR (a LOCAL_INV naming no bound
//! window too) and, as every failed request, moves the QP to the error state.
//! SEND_WITH_INV is not offered: the card cannot carry an invalidation in a SEND
//! (nic-behaviour.md 2.3: its `*_INV` opcodes skip the MR checks).

use core::ffi::c_int;
use core::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{WcOpcode, WcStatus, WorkCompletion};
use bluerdma_core::keys::MrKey;
use bluerdma_core::qp::{QpAttrMask, QpState};
use bluerdma_linux::verbs::Mw as VMw;

use crate::abi::*;
use crate::cq::Cq;
use crate::errors::{errno_rc, fail, or_null};
use crate::handle::own;
use crate::live::{self, Kind};
use crate::mr::Mr;
use crate::pd::Pd;
use crate::qp_base::is_ud;
use crate::raw_qp::is_raw;
use crate::rc_qp::Qp;
use crate::rc_rings::PostState;

/// `IBV_WR_LOCAL_INV`, `IBV_WR_BIND_MW`.
pub const IBV_WR_LOCAL_INV: u32 = 7;
pub const IBV_WR_BIND_MW: u32 = 8;
/// `IBV_MW_TYPE_1`, `IBV_MW_TYPE_2`.
const TYPE_1: u32 = 1;
const TYPE_2: u32 = 2;
/// How long a bind waits for the requests before it to complete.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// `struct ibv_mw`.
#[repr(C)]
pub struct IbvMw {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub rkey: u32,
    pub handle: u32,
    pub mw_type: u32,
    pub _pad: u32,
}

const _: () = {
    assert!(size_of::<IbvMw>() == 32);
    assert!(offset_of!(IbvMw, rkey) == 16);
    assert!(offset_of!(IbvMw, mw_type) == 24);
};

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvMwBindInfo {
    pub mr: *mut IbvMr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
    pub _pad: u32,
}

/// `struct ibv_mw_bind`.
#[repr(C)]
pub struct IbvMwBind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub _pad: u32,
    pub bind_info: IbvMwBindInfo,
}

const _: () = assert!(offset_of!(IbvMwBind, bind_info) == 16);

#[repr(C)]
struct Mw {
    ibv: IbvMw,
    /// The key it is bound (or was allocated) under, readable without `mw`'s lock (what a
    /// local invalidation looks for while it holds the object table).
    key: AtomicU32,
    mw: Mutex<MwState>,
}

struct MwState {
    mw: VMw,
    /// The MR it is bound to (its `windows` count includes this window).
    bound: Option<usize>,
}

impl MwState {
    /// The window is no longer bound: its MR forgets it.
    fn unbound(&mut self) {
        if let Some(mr) = self.bound.take() {
            // SAFETY: an MR with a window bound cannot be deregistered (EBUSY), so it is live.
            unsafe { &*(mr as *const Mr) }
                .windows
                .fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// `ibv_context_ops.alloc_mw`.
pub(crate) unsafe extern "C" fn op_alloc_mw(pd: *mut IbvPd, mw_type: u32) -> *mut IbvMw {
    // SAFETY: forwarded contract.
    or_null(unsafe { alloc_mw(pd, mw_type) })
}

/// # Safety
/// `pd` is NULL or a PD of this library.
unsafe fn alloc_mw(pd: *mut IbvPd, mw_type: u32) -> Result<*mut IbvMw, c_int> {
    crate::pd::check(pd, "alloc_mw")?;
    if mw_type != TYPE_1 && mw_type != TYPE_2 {
        log::error!("alloc_mw: type {mw_type} (windows are of type 1 or 2)");
        return Err(libc::EINVAL);
    }
    // SAFETY: a live PD (checked).
    let p = unsafe { Pd::of(pd) };
    let mw = p.pd.alloc_mw().map_err(fail)?;
    let key = mw.key().get();
    let b = Box::new(Mw {
        ibv: IbvMw {
            context: p.ibv.context,
            pd,
            rkey: key,
            handle: key,
            mw_type,
            _pad: 0,
        },
        key: AtomicU32::new(key),
        mw: Mutex::new(MwState { mw, bound: None }),
    });
    p.hold();
    let m = Box::into_raw(b);
    live::add(Kind::Mw, m, p.ibv.context);
    Ok(m as *mut IbvMw)
}

/// `ibv_context_ops.dealloc_mw`.
pub(crate) unsafe extern "C" fn op_dealloc_mw(mw: *mut IbvMw) -> c_int {
    if !live::take(Kind::Mw, mw) {
        log::error!("dealloc_mw: {mw:p} is not a live memory window");
        return errno_rc(libc::EINVAL);
    }
    // SAFETY: made by alloc_mw, given up by the caller.
    let b = unsafe { Box::from_raw(mw as *mut Mw) };
    let mut st = b.mw.lock().unwrap_or_else(|e| e.into_inner());
    st.unbound();
    drop(st);
    // SAFETY: the window holds its PD.
    unsafe { Pd::of(b.ibv.pd) }.release();
    // Dropping the engine's window invalidates and frees it.
    drop(b);
    0
}

/// `ibv_context_ops.bind_mw` (type 1; the inline ibv_bind_mw checked the type and that the
/// MR is on the window's PD).
pub(crate) unsafe extern "C" fn op_bind_mw(
    qp: *mut IbvQp,
    mw: *mut IbvMw,
    mw_bind: *mut IbvMwBind,
) -> c_int {
    if mw_bind.is_null() || live::check(Kind::Mw, mw, "bind_mw").is_err() {
        return errno_rc(libc::EINVAL);
    }
    // SAFETY: the caller passes a live QP.
    if live::check(Kind::Qp, qp, "bind_mw").is_err() || unsafe { is_ud(qp) || is_raw(qp) } {
        log::error!("bind_mw: windows are bound on RC QPs");
        return errno_rc(libc::EINVAL);
    }
    // SAFETY: the caller passes a live QP (the post path's contract) and its bind request.
    let (Some(q), b) = (unsafe { own::<Qp, _>(qp) }, unsafe { &*mw_bind }) else {
        return errno_rc(libc::EINVAL);
    };
    // SAFETY: a live window (checked).
    let w = unsafe { &mut *(mw as *mut Mw) };
    let new_rkey = (w.ibv.rkey & !0xFF) | (w.ibv.rkey.wrapping_add(1) & 0xFF);
    let mut st = q.post.lock().unwrap_or_else(|e| e.into_inner());
    let signaled = q.sq_sig_all || b.send_flags & IBV_SEND_SIGNALED != 0;
    // SAFETY: as above.
    let r = unsafe { bind(w, new_rkey, &b.bind_info) };
    if r.is_ok() {
        w.ibv.rkey = new_rkey;
    }
    local_done(q, &mut st, b.wr_id, signaled, WcOpcode::BindMw, r);
    0
}

/// Binds `w` under `rkey` as `info` says (length 0: unbinds it).
///
/// # Safety
/// `info.mr` is NULL or an MR of this library.
unsafe fn bind(w: &Mw, rkey: u32, info: &IbvMwBindInfo) -> Result<(), c_int> {
    let mut st = w.mw.lock().unwrap_or_else(|e| e.into_inner());
    if info.length == 0 {
        if st.bound.is_some() {
            let key = st.mw.key();
            // SAFETY: the window's context is open (it lives).
            let ctx =
                unsafe { crate::context::Ctx::from_ibv(w.ibv.context) }.ok_or(libc::EINVAL)?;
            ctx.engine()?.invalidate_mw(key).map_err(fail)?;
            st.unbound();
        }
        return Ok(());
    }
    live::check(Kind::Mr, info.mr, "bind_mw")?;
    // SAFETY: a live MR (checked).
    let m = unsafe { &*(info.mr as *const Mr) };
    let access = u8::try_from(info.mw_access_flags)
        .ok()
        .and_then(AccessFlags::from_bits)
        .ok_or(libc::EINVAL)?;
    st.mw
        .bind(
            MrKey::from_raw(rkey),
            m.engine_mr(),
            info.addr,
            info.length,
            access,
        )
        .map_err(fail)?;
    st.unbound();
    m.windows.fetch_add(1, Ordering::AcqRel);
    st.bound = Some(info.mr as usize);
    w.key.store(rkey, Ordering::Release);
    Ok(())
}

/// Whether `wr` is a local operation of the send queue (bind, local invalidation).
pub(crate) fn is_local(wr: &IbvSendWr) -> bool {
    matches!(wr.opcode, IBV_WR_BIND_MW | IBV_WR_LOCAL_INV)
}

/// Executes the local operation `wr` on RC QP `q` (after the requests posted before it)
/// and completes it. Err only for a request that is not posted at all (EINVAL: no window).
///
/// # Safety
/// `wr` is a valid request; a BIND_MW's window and MR are NULL or this library's.
pub(crate) unsafe fn post_local(q: &Qp, st: &mut PostState, wr: &IbvSendWr) -> Result<(), c_int> {
    let signaled = q.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0;
    if wr.opcode == IBV_WR_LOCAL_INV {
        let r = invalidate(q, MrKey::from_raw(wr.imm_data));
        local_done(q, st, wr.wr_id, signaled, WcOpcode::LocalInv, r);
        return Ok(());
    }
    // `bind_mw` overlays the tail: mw, rkey, then bind_info {mr, addr, length, access}.
    let t = &wr._tail;
    let mw = t[0] as *mut IbvMw;
    live::check(Kind::Mw, mw, "post_send(BIND_MW)")?;
    let rkey = t[1] as u32;
    let info = IbvMwBindInfo {
        mr: t[2] as *mut IbvMr,
        addr: t[3],
        length: t[4],
        mw_access_flags: t[5] as u32,
        _pad: 0,
    };
    // SAFETY: a live window (checked), posted on by this thread.
    let w = unsafe { &mut *(mw as *mut Mw) };
    let r = if w.ibv.mw_type != TYPE_2 {
        log::error!("post_send(BIND_MW): a type 1 window is bound with ibv_bind_mw");
        Err(libc::EINVAL)
    } else if !same_pd(w.ibv.pd, q.ibv.pd) {
        log::error!("post_send(BIND_MW): the window is on another PD than the QP");
        Err(libc::EPERM)
    } else {
        // SAFETY: the request's MR is NULL or this library's (the caller's contract).
        unsafe { bind(w, rkey, &info) }
    };
    if r.is_ok() {
        // The window's rkey is the one it is bound under now.
        w.ibv.rkey = rkey;
    }
    local_done(q, st, wr.wr_id, signaled, WcOpcode::BindMw, r);
    Ok(())
}

/// Whether two PDs (protection or parent domains) are the same protection domain.
fn same_pd(a: *mut IbvPd, b: *mut IbvPd) -> bool {
    // SAFETY: a window's and a QP's PDs outlive them (they are held).
    let (a, b) = unsafe { (Pd::of(a), Pd::of(b)) };
    std::sync::Arc::ptr_eq(&a.engine, &b.engine) && a.pd.handle() == b.pd.handle()
}

/// The live window of context `ctx` under `key`.
fn window_of(ctx: usize, key: MrKey) -> Option<usize> {
    // Found under the object table's lock (no window is freed meanwhile), reading only
    // the windows' atomic keys (a bind holds its window's lock, then takes the table's).
    live::lock().iter().find_map(|(p, e)| {
        let mine = e.kind == Kind::Mw && e.ctx == ctx;
        // SAFETY: a live window (the table is locked).
        (mine && unsafe { &*(p as *const Mw) }.key.load(Ordering::Acquire) == key.get())
            .then_some(p)
    })
}

/// A receive of context `ctx` completed with IBV_WC_WITH_INV: the peer's SEND_WITH_INV
/// invalidated the window of `key` (the engine did, `remote_inv`), so its MR forgets it
/// (ibv_dereg_mr no longer refuses) as after IBV_WR_LOCAL_INV.
pub(crate) fn remotely_invalidated(ctx: usize, key: MrKey) {
    let Some(p) = window_of(ctx, key) else {
        return;
    };
    // SAFETY: found live just now; the application does not deallocate a window while it
    // polls the completion that invalidated it (the verbs contract).
    let w = unsafe { &*(p as *const Mw) };
    w.mw.lock().unwrap_or_else(|e| e.into_inner()).unbound();
}

/// IBV_WR_LOCAL_INV of `key` on `q`'s device: the window bound under it is invalidated.
fn invalidate(q: &Qp, key: MrKey) -> Result<(), c_int> {
    let Some(p) = window_of(q.ibv.context as usize, key) else {
        log::error!(
            "local invalidation of {:#x}: no window of this context has it",
            key.get()
        );
        return Err(libc::EINVAL);
    };
    // SAFETY: found live just now; the application does not deallocate a window while a
    // request on it is being posted (the verbs contract).
    let w = unsafe { &*(p as *const Mw) };
    let mut st = w.mw.lock().unwrap_or_else(|e| e.into_inner());
    if st.bound.is_none() {
        log::error!(
            "local invalidation of {:#x}: the window is not bound",
            key.get()
        );
        return Err(libc::EINVAL);
    }
    // SAFETY: the QP's context is open.
    let ctx = unsafe { crate::context::Ctx::from_ibv(q.ibv.context) }.ok_or(libc::EINVAL)?;
    ctx.engine()?.invalidate_mw(key).map_err(fail)?;
    st.unbound();
    Ok(())
}

/// Completes a local operation of `q`: once the requests before it have completed, its
/// completion (when signaled, or on failure) goes to the send CQ; a failure moves the QP
/// to the error state.
fn local_done(
    q: &Qp,
    st: &mut PostState,
    wr_id: u64,
    signaled: bool,
    opcode: WcOpcode,
    r: Result<(), c_int>,
) {
    // The requests before it complete first: wait until the engine retired them.
    let start = Instant::now();
    while q.qp.sq_retired().is_ok_and(|n| n < st.posted) && start.elapsed() < DRAIN_LIMIT {
        std::thread::yield_now();
    }
    let status = match r {
        Ok(()) => WcStatus::Success,
        Err(_) => WcStatus::MwBindErr,
    };
    if signaled || status != WcStatus::Success {
        // SAFETY: the QP's send CQ outlives it.
        let cq = unsafe { Cq::of(q.ibv.send_cq) };
        cq.cq.push(WorkCompletion {
            wr_id,
            status,
            opcode,
            qp_num: q.ibv.qp_num,
            ..WorkCompletion::EMPTY
        });
    }
    if status != WcStatus::Success {
        // SAFETY: ibv_qp_attr is plain data: all zeroes is a valid value.
        let mut attr: IbvQpAttr = unsafe { core::mem::zeroed() };
        attr.qp_state = QpState::Err.to_ibv();
        let qp = &q.ibv as *const IbvQp as *mut IbvQp;
        // SAFETY: a live RC QP of this library, with a valid attribute.
        let rc = unsafe { crate::rc_qp::modify(qp, &attr, QpAttrMask::STATE) };
        if rc != 0 {
            log::error!("QP {:#x}: to ERR after a refused bind: {rc}", q.ibv.qp_num);
        }
    }
}
