//! RC queue pairs: creation (with the device's limits, an SRQ when given one), the state
//! machine through `Qp::modify`, and ibv_query_qp's answer. The type-choosing verbs are
//! `qp.rs`; the post paths are `rc_post.rs`.

use core::ffi::c_int;
use std::sync::{Arc, Mutex};

use bluerdma_core::engine::{QpCaps, READ_RESPONSE_ROOM};
use bluerdma_core::qp::{Gid, QpAttrMask, QpState, RawQpAttr};
use bluerdma_linux::verbs::Qp as VQp;

use crate::abi::*;
use crate::av;
use crate::caps::{self, MAX_INLINE, MAX_SGE};
use crate::errors::fail;
use crate::handle::own;
use crate::pd::Pd;
use crate::qp_base::{init_attr_of, new_ibv_qp, qp_cqs};
use crate::rc_rings::PostState;
use crate::rc_scatter::QpScatter;
use crate::srq::{Srq, SrqLink};
use crate::uc;
use crate::wr_batch::{ExtOps, QpExt};

#[repr(C)]
pub(crate) struct Qp {
    pub(crate) ibv: IbvQp,
    /// The rest of `ibv_qp_ex` and the `ibv_wr_*` batch.
    pub(crate) ext: QpExt,
    pub(crate) qp: VQp,
    pub(crate) cap: IbvQpCap,
    pub(crate) sq_sig_all: bool,
    /// Inline and gather buffers and the post count; the lock also serialises posts on
    /// this QP.
    pub(crate) post: Mutex<PostState>,
    /// The shared receive queue this QP takes its receive WRs from.
    pub(crate) srq: Option<SrqLink>,
    /// Its receive WRs of several SGEs, bounced (`rc_scatter.rs`).
    pub(crate) scatter: Arc<Mutex<QpScatter>>,
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Some(srq) = &self.srq {
            srq.detach(self.ibv.qp_num);
        }
    }
}

const _: () = assert!(core::mem::offset_of!(Qp, ext) == core::mem::size_of::<IbvQp>());

/// ibv_create_qp for IBV_QPT_RC and IBV_QPT_UC (`uc.rs`; and ibv_create_qp_ex, which passes
/// the `ibv_wr_*` table).
///
/// # Safety
/// `pd` is the PD `p` was read from; `a`'s CQs and SRQ are NULL or from this library.
pub(crate) unsafe fn create(
    p: &Pd,
    pd: *mut IbvPd,
    a: &mut IbvQpInitAttr,
    ext: Option<ExtOps>,
) -> Result<*mut IbvQp, c_int> {
    // SAFETY: an SRQ from ibv_create_srq, or NULL.
    let srq = unsafe { Srq::from_ibv(a.srq) };
    let srq_wrs = srq.map(|s| s.max_wr);
    let srq = srq.map(|s| Arc::clone(&s.pool));
    let cap = a.cap;
    let max = caps::MAX_QP_WR;
    if cap.max_send_wr > max
        || cap.max_recv_wr > max
        || cap.max_send_sge > MAX_SGE as u32
        || cap.max_recv_sge > MAX_SGE as u32
        || (srq.is_some() && cap.max_recv_sge > 1)
        || cap.max_inline_data > MAX_INLINE
    {
        log::error!(
            "create_qp: {cap:?} exceeds the device (max_send_wr and max_recv_wr {max}, {} \
             SGEs each way (1 for receives from an SRQ), {} bytes of inline data)",
            MAX_SGE,
            MAX_INLINE
        );
        return Err(libc::EINVAL);
    }
    // SAFETY: CQs from ibv_create_cq on this context, or NULL.
    let (scq, rcq) = unsafe { qp_cqs(a) }.ok_or(libc::EINVAL)?;
    // A WRITE or READ with several SGEs is one engine request per SGE: room for
    // max_send_wr requests of max_send_sge each. An SRQ's QP may take every WR of its pool.
    let engine_caps = QpCaps {
        max_send_wr: cap.max_send_wr.max(1) * cap.max_send_sge.clamp(1, MAX_SGE as u32),
        max_recv_wr: srq_wrs.unwrap_or(cap.max_recv_wr),
        read_responses: READ_RESPONSE_ROOM,
    };
    let qp =
        p.pd.create_qp_with(&scq.cq, &rcq.cq, engine_caps)
            .map_err(fail)?;
    let qpn = qp.qpn().get();
    // The queue sizes the application asked for are what it gets, and what ibv_query_qp
    // says; inline data is the device's (at least what was asked).
    let cap = IbvQpCap {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: MAX_INLINE,
    };
    a.cap = cap;
    let b = Box::new(Qp {
        ibv: new_ibv_qp(p, pd, a, qpn),
        ext: QpExt::new(&cap, ext),
        qp,
        cap,
        sq_sig_all: a.sq_sig_all != 0,
        post: Mutex::new(PostState::new(engine_caps.max_send_wr)),
        srq: srq.map(|pool| SrqLink::new(pool, Arc::clone(&rcq.srq_members))),
        scatter: Arc::default(),
    });
    if b.cap.max_recv_sge > 1 {
        rcq.scatter.register(qpn, &b.scatter);
    }
    if let Some(srq) = &b.srq {
        // The box does not move: the pointer stays valid until Drop detaches it.
        srq.attach(qpn, &b.qp);
    }
    Ok(Box::into_raw(b) as *mut IbvQp)
}

/// ibv_modify_qp for an RC QP: checks what this RoCE device has (port 1, P_Key index 0, a
/// GRH), then the engine's state machine.
///
/// # Safety
/// `qp` is a live RC QP; `a` is the caller's attributes.
pub(crate) unsafe fn modify(qp: *mut IbvQp, a: &IbvQpAttr, mask: QpAttrMask) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { own::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    let uc_rc;
    let (a, mask) = if uc::is_uc(&q.ibv) {
        let state = QpState::from_ibv(q.ibv.state);
        match uc::as_rc(state, a, mask) {
            Ok(rc) => {
                uc_rc = rc;
                (&uc_rc.0, uc_rc.1)
            }
            Err(e) => return e,
        }
    } else {
        (a, mask)
    };
    if mask.contains(QpAttrMask::PORT) && a.port_num != 1 {
        log::error!(
            "modify_qp: port {} does not exist (the device has port 1)",
            a.port_num
        );
        return libc::EINVAL;
    }
    if mask.contains(QpAttrMask::PKEY_INDEX) && a.pkey_index != 0 {
        log::error!(
            "modify_qp: P_Key index {} does not exist (the table has 0)",
            a.pkey_index
        );
        return libc::EINVAL;
    }
    let mut mask = mask;
    let mut dgid = Gid(a.ah_attr.grh.dgid);
    if mask.contains(QpAttrMask::AV) {
        let to_rtr = mask.contains(QpAttrMask::STATE) && a.qp_state == QpState::Rtr.to_ibv();
        if !to_rtr && av::ignorable_after_rtr(&a.ah_attr, "modify_qp") {
            mask.remove(QpAttrMask::AV);
        } else {
            match av::peer(&a.ah_attr, "modify_qp") {
                Ok(ip) => dgid = Gid::from_ipv4(ip),
                Err(e) => return e,
            }
        }
    }
    if mask.contains(QpAttrMask::CAP) {
        log::error!("modify_qp: changing the QP's capabilities is not supported");
        return libc::EINVAL;
    }
    let raw = RawQpAttr {
        qp_state: a.qp_state,
        cur_qp_state: a.cur_qp_state,
        path_mtu: a.path_mtu,
        dest_qp_num: a.dest_qp_num,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        qp_access_flags: a.qp_access_flags,
        dgid,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
        max_rd_atomic: a.max_rd_atomic,
    };
    if let Err(e) = q.qp.modify(&raw, mask) {
        return fail(e);
    }
    if mask.contains(QpAttrMask::STATE) {
        // SAFETY: `state` is ours to update; applications read it.
        unsafe { (*qp).state = a.qp_state };
        if let Some(srq) = &q.srq {
            srq.state_changed(q.ibv.qp_num, a.qp_state);
        }
        if a.qp_state == QpState::Reset.to_ibv() {
            q.post.lock().unwrap_or_else(|e| e.into_inner()).reset();
            q.scatter.lock().unwrap_or_else(|e| e.into_inner()).reset();
        }
    }
    0
}

/// ibv_query_qp for an RC QP.
///
/// # Safety
/// `qp` is NULL or a live RC QP; `attr` and `init` are NULL or writable.
pub(crate) unsafe fn query(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    let (Some(q), false, false) = (
        (unsafe { own::<Qp, _>(qp) }),
        attr.is_null(),
        init.is_null(),
    ) else {
        return libc::EINVAL;
    };
    let out = match attr_of(q) {
        Ok(a) => a,
        Err(e) => return e,
    };
    // SAFETY: the caller passes both structures.
    unsafe {
        attr.write(out);
        init.write(init_attr_of(&q.ibv, q.cap, q.sq_sig_all));
    }
    0
}

/// The attributes ibv_query_qp reports for `q`. This is the one place that reads the
/// engine's answer to a query (`Qp::query`, `Qp::psns`): a change of what it returns is
/// an edit here only.
fn attr_of(q: &Qp) -> Result<IbvQpAttr, c_int> {
    let s = q.qp.query().map_err(fail)?;
    let (sq_psn, rq_psn) = q.qp.psns(&s);
    let mut ah = IbvAhAttr {
        is_global: 1,
        port_num: 1,
        ..IbvAhAttr::default()
    };
    ah.grh.dgid = Gid::from_ipv4(s.peer_ip).0;
    ah.grh.hop_limit = 64;
    let out = IbvQpAttr {
        qp_state: s.state.to_ibv(),
        cur_qp_state: s.state.to_ibv(),
        path_mtu: s.pmtu as u32,
        path_mig_state: 0,
        qkey: 0,
        rq_psn,
        sq_psn,
        dest_qp_num: s.dest_qpn.get(),
        qp_access_flags: s.access.bits(),
        cap: q.cap,
        ah_attr: ah,
        alt_ah_attr: IbvAhAttr::default(),
        pkey_index: 0,
        alt_pkey_index: 0,
        en_sqd_async_notify: 0,
        sq_draining: 0,
        max_rd_atomic: s.max_rd_atomic,
        max_dest_rd_atomic: caps::MAX_RD_ATOM,
        min_rnr_timer: s.min_rnr_timer,
        port_num: 1,
        timeout: s.timeout,
        retry_cnt: s.retry_cnt,
        rnr_retry: s.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        _pad: 0,
        rate_limit: 0,
        _pad2: 0,
    };
    Ok(out)
}
