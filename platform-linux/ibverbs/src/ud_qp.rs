//! UD queue pairs, built in this library (the card has no UD): creation, the UD state
//! machine (RESET -> INIT -> RTR -> RTS, no peer) and ibv_query_qp's answer. Datagrams
//! are received by `ud_rx.rs` and posted by `ud_post.rs`.

use core::ffi::c_int;
use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bluerdma_core::qp::{QpAttrMask, QpState};
use bluerdma_core::wire::ud::UD_MAX_DATAGRAM;
use bluerdma_linux::verbs::{Context, Cq as VCq};

use crate::abi::*;
use crate::caps::{self, UD_MAX_RECV_WR as MAX_RECV_WR, UD_MAX_SGE as MAX_SGE};
use crate::handle::{free, own};
use crate::pd::Pd;
use crate::qp_base::{check_attrs, init_attr_of, new_ibv_qp, qp_cqs};
use crate::ud_rx::{dispatch_for, Dispatch, UdShared};
use crate::wr_batch::{ExtOps, QpExt};

/// How many UD QPs this process has made: the `n` of [`bluerdma_linux::verbs::ud_qpn`]
/// (0x800000 and up, inside the engine's QP window, so that processes sharing a device
/// never have the same one).
static NEXT_QPN: AtomicU32 = AtomicU32::new(0);

/// A UD QP: `ibv_qp` first, like the RC one (`rc_qp::Qp`); `ibv.qp_type` tells them
/// apart.
#[repr(C)]
pub(crate) struct UdQp {
    pub ibv: IbvQp,
    /// The rest of `ibv_qp_ex` and the `ibv_wr_*` batch.
    pub ext: QpExt,
    pub shared: Arc<UdShared>,
    dispatch: Arc<Dispatch>,
    pub engine: Arc<Context>,
    pub scq: VCq,
    pub cap: IbvQpCap,
    pub sq_sig_all: bool,
    /// PSN of the next datagram; the lock also serialises posts on this QP.
    pub psn: Mutex<u32>,
}

impl Drop for UdQp {
    fn drop(&mut self) {
        self.dispatch.remove(self.shared.qpn);
    }
}

/// ibv_create_qp for IBV_QPT_UD.
///
/// # Safety
/// `pd` is the PD `p` was read from; `a`'s CQs are NULL or from ibv_create_cq.
pub(crate) unsafe fn create(
    p: &Pd,
    pd: *mut IbvPd,
    a: &mut IbvQpInitAttr,
    ext: Option<ExtOps>,
) -> Result<*mut IbvQp, c_int> {
    let cap = a.cap;
    let sq = caps::MAX_QP_WR;
    if !a.srq.is_null()
        || cap.max_send_wr > sq
        || cap.max_recv_wr > MAX_RECV_WR
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data as usize > UD_MAX_DATAGRAM
    {
        log::error!(
            "create_qp (UD): {cap:?} exceeds the device (max_send_wr {sq}, max_recv_wr \
             {MAX_RECV_WR}, {MAX_SGE} SGEs, {UD_MAX_DATAGRAM} bytes of inline data, no SRQ)"
        );
        return Err(libc::EINVAL);
    }
    // SAFETY: CQs from ibv_create_cq on this context, or NULL.
    let (scq, rcq) = unsafe { qp_cqs(a) }.ok_or(libc::EINVAL)?;
    let qpn = bluerdma_linux::verbs::ud_qpn(
        &p.engine.qp_window(),
        NEXT_QPN.fetch_add(1, Ordering::Relaxed),
    );
    let shared = Arc::new(UdShared {
        qpn,
        state: AtomicU32::new(QpState::Reset.to_ibv()),
        qkey: AtomicU32::new(0),
        recv: Mutex::new(VecDeque::new()),
        frags: Mutex::default(),
        rcq: rcq.cq.clone(),
    });
    let dispatch = dispatch_for(&p.engine);
    dispatch.add(&shared);
    let cap = IbvQpCap {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1),
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: cap.max_inline_data,
    };
    a.cap = cap;
    let b = Box::new(UdQp {
        ibv: new_ibv_qp(p, pd, a, qpn),
        ext: QpExt::new(&cap, ext),
        shared,
        dispatch,
        engine: Arc::clone(&p.engine),
        scq: scq.cq.clone(),
        cap,
        sq_sig_all: a.sq_sig_all != 0,
        psn: Mutex::new(0),
    });
    Ok(Box::into_raw(b) as *mut IbvQp)
}

/// The UD QP behind an application's pointer.
///
/// # Safety
/// `qp` is NULL or a live UD QP.
pub(crate) unsafe fn ud<'a>(qp: *mut IbvQp) -> Option<&'a UdQp> {
    // SAFETY: the caller's contract.
    unsafe { own::<UdQp, _>(qp) }
}

/// ibv_destroy_qp for a UD QP.
///
/// # Safety
/// `qp` is a live UD QP the caller gives up.
pub(crate) unsafe fn destroy(qp: *mut IbvQp) -> c_int {
    // SAFETY: made by create; the caller gives it up.
    unsafe { free::<UdQp, _>(qp) }
}

/// ibv_modify_qp for a UD QP: RESET -> INIT (Q_Key, port, P_Key index) -> RTR -> RTS
/// (SQ PSN); ERR and RESET from any state. There is no peer.
///
/// # Safety
/// `qp` is a live UD QP; `a` is the caller's attributes.
pub(crate) unsafe fn modify(qp: *mut IbvQp, a: &IbvQpAttr, mask: QpAttrMask) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { ud(qp) }) else {
        return libc::EINVAL;
    };
    let cur = q.shared.state();
    let to = if mask.contains(QpAttrMask::STATE) {
        QpState::from_ibv(a.qp_state)
    } else {
        cur
    };
    use QpState as S;
    let (allowed, required) = match (cur, to) {
        (S::Reset, S::Init) => (
            QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            QpAttrMask::QKEY,
        ),
        (S::Init, S::Init) => (
            QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            QpAttrMask::empty(),
        ),
        (S::Init, S::Rtr) => (
            QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY,
            QpAttrMask::empty(),
        ),
        (S::Rtr, S::Rts) => (QpAttrMask::SQ_PSN | QpAttrMask::QKEY, QpAttrMask::empty()),
        (S::Rts, S::Rts) => (QpAttrMask::QKEY, QpAttrMask::empty()),
        (_, S::Reset | S::Err) => (QpAttrMask::empty(), QpAttrMask::empty()),
        _ => {
            log::error!("modify_qp (UD): {cur:?} -> {to:?} is not a UD transition");
            return libc::EINVAL;
        }
    };
    let given = mask - QpAttrMask::STATE - QpAttrMask::CUR_STATE;
    if let Err(e) = check_attrs("UD", (cur, to), a, given, (allowed, required)) {
        return e;
    }
    if given.contains(QpAttrMask::QKEY) {
        q.shared.qkey.store(a.qkey, Ordering::Release);
    }
    if given.contains(QpAttrMask::SQ_PSN) {
        *q.psn.lock().unwrap_or_else(|e| e.into_inner()) = a.sq_psn & 0xFF_FFFF;
    }
    q.shared.state.store(to.to_ibv(), Ordering::Release);
    match to {
        S::Err => q.shared.flush(),
        S::Reset => {
            q.shared
                .recv
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            q.shared
                .frags
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
        _ => {}
    }
    // SAFETY: `state` is ours to update; applications read it.
    unsafe { (*qp).state = to.to_ibv() };
    0
}

/// ibv_query_qp for a UD QP.
///
/// # Safety
/// `qp` is a live UD QP; `attr` and `init` are writable.
pub(crate) unsafe fn query(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { ud(qp) }) else {
        return libc::EINVAL;
    };
    let state = q.shared.state().to_ibv();
    // SAFETY: the caller passes both structures; every field of ibv_qp_attr is plain data
    // for which zero is a valid value.
    unsafe {
        let out = &mut *attr;
        ptr::write_bytes(attr, 0, 1);
        out.qp_state = state;
        out.cur_qp_state = state;
        out.path_mtu = IBV_MTU_4096;
        out.qkey = q.shared.qkey.load(Ordering::Acquire);
        out.sq_psn = *q.psn.lock().unwrap_or_else(|e| e.into_inner());
        out.cap = q.cap;
        out.port_num = 1;
        init.write(init_attr_of(&q.ibv, q.cap, q.sq_sig_all));
    }
    0
}

const _: () = assert!(core::mem::offset_of!(UdQp, ibv) == 0);
const _: () = assert!(core::mem::offset_of!(UdQp, ext) == core::mem::size_of::<IbvQp>());
