//! `ibv_create_qp_ex` (`verbs_context.create_qp_ex`, which the inline verb of
//! `<infiniband/verbs.h>` calls for any mask but a bare IBV_QP_INIT_ATTR_PD) and the
//! `ibv_qp_ex` post API: the `wr_*` function pointers the inline `ibv_wr_*` verbs call.
//!
//! A QP made with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS is an ordinary RC or UD QP of this library
//! whose `ibv_qp_ex` carries the table below; `ibv_qp_to_qp_ex` hands it out (`qp.rs`).
//! The requests are built in the QP's batch (`wr_batch.rs`) and `ibv_wr_complete` posts them
//! through `ibv_context_ops.post_send` (`qp::op_post_send`): the same path, checks and
//! completions as ibv_post_send.
//!
//! What the device cannot do is refused when the QP is made (EOPNOTSUPP, naming it):
//! ATOMIC_WRITE, SEND_WITH_INV, TSO, XRC and RSS QPs,
//! creation flags. Compare-and-swap and fetch-and-add are there (RC), executed by the
//! responder's driver (`bluerdma_core::engine`'s atomics). Calling one of those `ibv_wr_*` anyway fails the batch instead of
//! jumping through a NULL pointer.

use core::ffi::{c_int, c_void};

use crate::abi::*;
use crate::abi_ex::*;
use crate::errors::or_null;
use crate::live::{self, Kind};
use crate::mw::{IbvMwBindInfo, IBV_WR_BIND_MW, IBV_WR_LOCAL_INV};
use crate::qp::{self, op_post_send};
use crate::qp_base::is_ud;
use crate::wr_batch::{send_wr, ExtOps, QpExt};

/// The send operations of each QP type (`ibv_qp_create_send_ops_flags`).
const RC_OPS: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV;
const UD_OPS: u64 = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
/// UC QPs (`uc.rs`): no READ, no atomics.
const UC_OPS: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM;

/// The names of the send operations, by bit.
const OP_NAMES: &[(u64, &str)] = &[
    (IBV_QP_EX_WITH_RDMA_WRITE, "RDMA_WRITE"),
    (IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, "RDMA_WRITE_WITH_IMM"),
    (IBV_QP_EX_WITH_SEND, "SEND"),
    (IBV_QP_EX_WITH_SEND_WITH_IMM, "SEND_WITH_IMM"),
    (IBV_QP_EX_WITH_RDMA_READ, "RDMA_READ"),
    (IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, "ATOMIC_CMP_AND_SWP"),
    (IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, "ATOMIC_FETCH_AND_ADD"),
    (IBV_QP_EX_WITH_LOCAL_INV, "LOCAL_INV"),
    (IBV_QP_EX_WITH_BIND_MW, "BIND_MW"),
    (IBV_QP_EX_WITH_SEND_WITH_INV, "SEND_WITH_INV"),
    (1 << 10, "TSO"),
    (1 << 12, "ATOMIC_WRITE"),
];

/// The comp_mask bits of `ibv_qp_init_attr_ex` rdma-core 44 defines.
const KNOWN_MASK: u32 = IBV_QP_INIT_ATTR_PD
    | IBV_QP_INIT_ATTR_XRCD
    | IBV_QP_INIT_ATTR_CREATE_FLAGS
    | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
    | IBV_QP_INIT_ATTR_IND_TABLE
    | IBV_QP_INIT_ATTR_RX_HASH
    | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// `verbs_context.create_qp_ex`.
///
/// # Safety
/// As ibv_create_qp_ex: `ctx` is an open context, `attr` NULL or an initialised
/// `ibv_qp_init_attr_ex` whose objects are NULL or this library's.
pub(crate) unsafe extern "C" fn ext_create_qp_ex(
    ctx: *mut IbvContext,
    attr: *mut IbvQpInitAttrEx,
) -> *mut IbvQp {
    // SAFETY: forwarded contract.
    or_null(unsafe { create_qp_ex(ctx, attr) })
}

/// # Safety
/// As [`ext_create_qp_ex`].
unsafe fn create_qp_ex(
    ctx: *mut IbvContext,
    attr: *mut IbvQpInitAttrEx,
) -> Result<*mut IbvQp, c_int> {
    live::check(Kind::Ctx, ctx, "create_qp_ex")?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes an initialised ibv_qp_init_attr_ex.
    let a = unsafe { &mut *attr };
    let mask = a.comp_mask;
    if mask & !KNOWN_MASK != 0 {
        log::error!("create_qp_ex: comp_mask {mask:#x} has bits rdma-core 44 does not define");
        return Err(libc::EINVAL);
    }
    let refuse = |what: &str| {
        log::error!("create_qp_ex: {what} not supported by this device");
        Err(libc::EOPNOTSUPP)
    };
    if mask & (IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH) != 0 {
        return refuse("XRC and RSS QPs (IBV_QP_INIT_ATTR_XRCD, _IND_TABLE, _RX_HASH) are");
    }
    if mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0 && a.max_tso_header != 0 {
        return refuse("TSO (max_tso_header) is");
    }
    if mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return refuse(&format!("create_flags {:#x} are", a.create_flags));
    }
    if mask & IBV_QP_INIT_ATTR_PD == 0 {
        log::error!("create_qp_ex: IBV_QP_INIT_ATTR_PD is required (a QP needs a PD)");
        return Err(libc::EINVAL);
    }
    crate::pd::check(a.pd, "create_qp_ex")?;
    // SAFETY: a live PD.
    if unsafe { (*a.pd).context } != ctx {
        log::error!("create_qp_ex: the PD belongs to another context");
        return Err(libc::EINVAL);
    }
    let ext = if mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        Some(ext_ops(a.qp_type, a.send_ops_flags)?)
    } else {
        None
    };
    let mut base = IbvQpInitAttr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
        _pad: 0,
    };
    // SAFETY: the PD is live; the CQs and SRQ are checked by create_qp.
    let qp = unsafe { qp::create_qp(a.pd, &mut base, ext) }?;
    a.cap = base.cap;
    Ok(qp)
}

/// The table of an extended QP of `qp_type` for `flags`, or EOPNOTSUPP naming what the
/// device lacks.
fn ext_ops(qp_type: u32, flags: u64) -> Result<ExtOps, c_int> {
    let have = match qp_type {
        IBV_QPT_RC => RC_OPS,
        IBV_QPT_UC => UC_OPS,
        crate::raw_qp::IBV_QPT_RAW_PACKET => IBV_QP_EX_WITH_SEND,
        IBV_QPT_UD => UD_OPS,
        // ibv_create_qp names the type it refuses.
        _ => flags,
    };
    if flags & !have != 0 {
        let missing: Vec<&str> = OP_NAMES
            .iter()
            .filter(|(bit, _)| flags & !have & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        log::error!(
            "create_qp_ex: send_ops_flags {flags:#x} ask for {} which this device does not \
             support{} (RC QPs: RDMA_WRITE[_WITH_IMM], SEND[_WITH_IMM], RDMA_READ, \
             ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, BIND_MW, LOCAL_INV; UC QPs: \
             RDMA_WRITE[_WITH_IMM], SEND[_WITH_IMM]; UD QPs: SEND[_WITH_IMM])",
            if missing.is_empty() {
                "operations".to_string()
            } else {
                missing.join(", ")
            },
            if qp_type == IBV_QPT_UD {
                " on a UD QP"
            } else {
                ""
            }
        );
        return Err(libc::EOPNOTSUPP);
    }
    Ok(ExtOps {
        send_ops: flags,
        table: table(),
    })
}

/// The `wr_*` pointers of every extended QP (the ones the device lacks fail the batch).
fn table() -> [usize; qpx::COUNT] {
    let mut t = [0usize; qpx::COUNT];
    t[qpx::ATOMIC_CMP_SWP] = wr_atomic_cmp_swp as *const () as usize;
    t[qpx::ATOMIC_FETCH_ADD] = wr_atomic_fetch_add as *const () as usize;
    t[qpx::BIND_MW] = wr_bind_mw as *const () as usize;
    t[qpx::LOCAL_INV] = wr_local_inv as *const () as usize;
    t[qpx::RDMA_READ] = wr_rdma_read as *const () as usize;
    t[qpx::RDMA_WRITE] = wr_rdma_write as *const () as usize;
    t[qpx::RDMA_WRITE_IMM] = wr_rdma_write_imm as *const () as usize;
    t[qpx::SEND] = wr_send as *const () as usize;
    t[qpx::SEND_IMM] = wr_send_imm as *const () as usize;
    t[qpx::SEND_INV] = wr_send_inv as *const () as usize;
    t[qpx::SEND_TSO] = wr_send_tso as *const () as usize;
    t[qpx::SET_UD_ADDR] = wr_set_ud_addr as *const () as usize;
    t[qpx::SET_XRC_SRQN] = wr_set_xrc_srqn as *const () as usize;
    t[qpx::SET_INLINE_DATA] = wr_set_inline_data as *const () as usize;
    t[qpx::SET_INLINE_DATA_LIST] = wr_set_inline_data_list as *const () as usize;
    t[qpx::SET_SGE] = wr_set_sge as *const () as usize;
    t[qpx::SET_SGE_LIST] = wr_set_sge_list as *const () as usize;
    t[qpx::START] = wr_start as *const () as usize;
    t[qpx::COMPLETE] = wr_complete as *const () as usize;
    t[qpx::ABORT] = wr_abort as *const () as usize;
    t[qpx::ATOMIC_WRITE] = wr_atomic_write as *const () as usize;
    t
}

/// Begins a request of `opcode` (`fill` sets its remote part) if the QP's type can do it.
///
/// # Safety
/// `qp` is an extended QP of this library (the application's `ibv_qp_ex`).
unsafe fn begin(qp: *mut IbvQp, verb: &str, opcode: u32, fill: impl FnOnce(&mut IbvSendWr)) {
    // SAFETY: the caller's contract.
    let (x, ud) = unsafe { (QpExt::of(qp), is_ud(qp)) };
    let (wr_id, flags) = x.next_ids();
    let mut b = x.batch();
    if ud && !matches!(opcode, IBV_WR_SEND | IBV_WR_SEND_WITH_IMM) {
        return b.refuse(libc::EOPNOTSUPP, format_args!("{verb}: a UD QP only sends"));
    }
    let mut wr = send_wr(opcode, wr_id, flags);
    fill(&mut wr);
    b.push(verb, wr);
}

/// An operation this device does not have: the batch fails.
///
/// # Safety
/// As [`begin`].
unsafe fn lacks(qp: *mut IbvQp, verb: &str) {
    // SAFETY: the caller's contract.
    unsafe { QpExt::of(qp) }.batch().refuse(
        libc::EOPNOTSUPP,
        format_args!("{verb}: not supported by this device (the QP was not made for it)"),
    );
}

unsafe extern "C" fn wr_start(qp: *mut IbvQp) {
    // SAFETY: the application's ibv_qp_ex (an extended QP of this library).
    unsafe { QpExt::of(qp) }.batch().start();
}

unsafe extern "C" fn wr_complete(qp: *mut IbvQp) -> c_int {
    // SAFETY: as wr_start.
    let x = unsafe { QpExt::of(qp) };
    x.batch().complete(|wr, bad| {
        // SAFETY: the chain the batch built: valid requests whose buffers (registered
        // SGEs, or the batch's own copy of inline data) belong to them, as for
        // ibv_post_send.
        unsafe { op_post_send(qp, wr, bad) }
    })
}

unsafe extern "C" fn wr_abort(qp: *mut IbvQp) {
    // SAFETY: as wr_start.
    unsafe { QpExt::of(qp) }.batch().abort();
}

unsafe extern "C" fn wr_rdma_write(qp: *mut IbvQp, rkey: u32, raddr: u64) {
    // SAFETY: as wr_start.
    unsafe {
        begin(qp, "ibv_wr_rdma_write", IBV_WR_RDMA_WRITE, |w| {
            w.wr[0] = raddr;
            w.wr[1] = rkey as u64;
        })
    }
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut IbvQp, rkey: u32, raddr: u64, imm_be: u32) {
    // SAFETY: as wr_start.
    unsafe {
        begin(
            qp,
            "ibv_wr_rdma_write_imm",
            IBV_WR_RDMA_WRITE_WITH_IMM,
            |w| {
                w.wr[0] = raddr;
                w.wr[1] = rkey as u64;
                w.imm_data = imm_be;
            },
        )
    }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut IbvQp, rkey: u32, raddr: u64) {
    // SAFETY: as wr_start.
    unsafe {
        begin(qp, "ibv_wr_rdma_read", IBV_WR_RDMA_READ, |w| {
            w.wr[0] = raddr;
            w.wr[1] = rkey as u64;
        })
    }
}

unsafe extern "C" fn wr_send(qp: *mut IbvQp) {
    // SAFETY: as wr_start.
    unsafe { begin(qp, "ibv_wr_send", IBV_WR_SEND, |_| {}) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut IbvQp, imm_be: u32) {
    // SAFETY: as wr_start.
    unsafe {
        begin(qp, "ibv_wr_send_imm", IBV_WR_SEND_WITH_IMM, |w| {
            w.imm_data = imm_be
        })
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut IbvQp, lkey: u32, addr: u64, length: u32) {
    let sge = IbvSge { addr, length, lkey };
    // SAFETY: as wr_start; one entry.
    unsafe { QpExt::of(qp).batch().set_sges("ibv_wr_set_sge", &sge, 1) }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut IbvQp, n: usize, list: *const IbvSge) {
    // SAFETY: as wr_start; the application passes `n` entries.
    unsafe {
        QpExt::of(qp)
            .batch()
            .set_sges("ibv_wr_set_sge_list", list, n)
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut IbvQp, addr: *mut c_void, length: usize) {
    let buf = IbvDataBuf { addr, length };
    // SAFETY: as wr_start; the application lends `length` bytes at `addr` for the call.
    unsafe {
        QpExt::of(qp)
            .batch()
            .set_inline("ibv_wr_set_inline_data", &buf, 1)
    }
}

unsafe extern "C" fn wr_set_inline_data_list(qp: *mut IbvQp, n: usize, bufs: *const IbvDataBuf) {
    // SAFETY: as wr_start; the application passes `n` buffers it lends for the call.
    unsafe {
        QpExt::of(qp)
            .batch()
            .set_inline("ibv_wr_set_inline_data_list", bufs, n)
    }
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut IbvQp, ah: *mut IbvAh, remote_qpn: u32, qkey: u32) {
    // SAFETY: as wr_start.
    let (x, ud) = unsafe { (QpExt::of(qp), is_ud(qp)) };
    let mut b = x.batch();
    if ud {
        b.set_ud_addr(ah, remote_qpn, qkey);
    } else {
        b.refuse(
            libc::EINVAL,
            format_args!("ibv_wr_set_ud_addr: the QP is not a UD QP"),
        );
    }
}

/// Begins an atomic (`wr.atomic`: the remote address, compare or add, swap, rkey) if the
/// QP was made for it (`op`, its send_ops bit); otherwise the batch fails, as the
/// operation's pointer would be missing on another provider.
///
/// # Safety
/// As [`begin`].
unsafe fn begin_atomic(qp: *mut IbvQp, verb: &str, op: u64, opcode: u32, fields: [u64; 4]) {
    // SAFETY: the caller's contract.
    if unsafe { QpExt::of(qp) }.send_ops.unwrap_or(0) & op == 0 {
        // SAFETY: as above.
        return unsafe { lacks(qp, verb) };
    }
    // SAFETY: as above.
    unsafe { begin(qp, verb, opcode, |w| w.wr = fields) }
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut IbvQp, rkey: u32, raddr: u64, cmp: u64, swap: u64) {
    let (verb, op) = ("ibv_wr_atomic_cmp_swp", IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP);
    let fields = [raddr, cmp, swap, rkey as u64];
    // SAFETY: as wr_start.
    unsafe { begin_atomic(qp, verb, op, IBV_WR_ATOMIC_CMP_AND_SWP, fields) }
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut IbvQp, rkey: u32, raddr: u64, add: u64) {
    let (verb, op) = (
        "ibv_wr_atomic_fetch_add",
        IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
    );
    let fields = [raddr, add, 0, rkey as u64];
    // SAFETY: as wr_start.
    unsafe { begin_atomic(qp, verb, op, IBV_WR_ATOMIC_FETCH_AND_ADD, fields) }
}

unsafe extern "C" fn wr_atomic_write(qp: *mut IbvQp, _rkey: u32, _raddr: u64, _wr: *const c_void) {
    // SAFETY: as wr_start.
    unsafe { lacks(qp, "ibv_wr_atomic_write") }
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut IbvQp,
    mw: *mut c_void,
    rkey: u32,
    info: *const IbvMwBindInfo,
) {
    let verb = "ibv_wr_bind_mw";
    // SAFETY: as wr_start.
    let ops = unsafe { QpExt::of(qp) }.send_ops.unwrap_or(0);
    if info.is_null() || ops & IBV_QP_EX_WITH_BIND_MW == 0 {
        // SAFETY: as wr_start.
        return unsafe { lacks(qp, verb) };
    }
    // SAFETY: the application's bind info (checked non-NULL).
    let i = unsafe { *info };
    // `bind_mw` overlays the request's tail (mw.rs reads it back).
    let tail = [
        mw as u64,
        rkey as u64,
        i.mr as u64,
        i.addr,
        i.length,
        i.mw_access_flags as u64,
    ];
    // SAFETY: as wr_start.
    unsafe { begin(qp, verb, IBV_WR_BIND_MW, |w| w._tail = tail) }
}

unsafe extern "C" fn wr_local_inv(qp: *mut IbvQp, rkey: u32) {
    let verb = "ibv_wr_local_inv";
    // SAFETY: as wr_start.
    if unsafe { QpExt::of(qp) }.send_ops.unwrap_or(0) & IBV_QP_EX_WITH_LOCAL_INV == 0 {
        // SAFETY: as wr_start.
        return unsafe { lacks(qp, verb) };
    }
    // `invalidate_rkey` shares `imm_data`'s place, in host order.
    // SAFETY: as wr_start.
    unsafe { begin(qp, verb, IBV_WR_LOCAL_INV, |w| w.imm_data = rkey) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut IbvQp, rkey: u32) {
    let verb = "ibv_wr_send_inv";
    // SAFETY: as wr_start.
    if unsafe { QpExt::of(qp) }.send_ops.unwrap_or(0) & IBV_QP_EX_WITH_SEND_WITH_INV == 0 {
        // SAFETY: as wr_start.
        return unsafe { lacks(qp, verb) };
    }
    // `invalidate_rkey` shares `imm_data`'s place, in host order.
    // SAFETY: as wr_start.
    unsafe { begin(qp, verb, IBV_WR_SEND_WITH_INV, |w| w.imm_data = rkey) }
}

unsafe extern "C" fn wr_send_tso(qp: *mut IbvQp, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // SAFETY: as wr_start.
    unsafe { lacks(qp, "ibv_wr_send_tso") }
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut IbvQp, _srqn: u32) {
    // SAFETY: as wr_start.
    unsafe { lacks(qp, "ibv_wr_set_xrc_srqn") }
}
