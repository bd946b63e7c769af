//! Raw packet QPs (IBV_QPT_RAW_PACKET) on the card's simple NIC: each send request is one
//! whole Ethernet frame, gathered from its SGEs (or inline data) and handed to the simple
//! NIC's TX ring as it is (the engine's `send_raw`), completed once the ring took it.
//!
//! - Making one needs root (the kernel asks for CAP_NET_RAW): EPERM otherwise.
//! - States: RESET -> INIT (port) -> RTR -> RTS; ERR and RESET from any state. Only RTS
//!   sends; receive WRs may be posted from INIT.
//! - A frame is 14..=2048 bytes (an Ethernet header, at most what a simple-NIC slot takes);
//!   IBV_WR_SEND is the only opcode. The application builds the headers: the card sends
//!   the bytes as they are (a frame to UDP port 4791 of a peer card is taken as RoCE by it).
//! - Nothing is received: a NIC hands frames to a raw packet QP only through flow rules
//!   (ibv_create_flow), which this device does not offer. Posted receive WRs stay posted
//!   until the QP goes to ERR (flushed) or RESET.
//!
//! The QP number is from 0xC00000 up, apart from RC (the card's) and UD numbers.

use core::ffi::c_int;
use std::collections::VecDeque;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bluerdma_core::engine::{WcOpcode, WcStatus, WorkCompletion};
use bluerdma_core::qp::{QpAttrMask, QpState};
use bluerdma_linux::verbs::{Context, Cq as VCq};

use crate::abi::*;
use crate::caps::{MAX_QP_WR, MAX_SGE};
use crate::errors::{fail, set_bad};
use crate::handle::{free, own};
use crate::pd::Pd;
use crate::qp_base::{check_attrs, init_attr_of, new_ibv_qp, qp_cqs};
use crate::sge;
use crate::wr_batch::{ExtOps, QpExt};

/// `IBV_QPT_RAW_PACKET`.
pub const IBV_QPT_RAW_PACKET: u32 = 8;
/// Raw packet QP numbers.
const QPN_BASE: u32 = 0xC0_0000;
/// The largest frame: one simple-NIC slot.
const MAX_FRAME: usize = 2048;
/// The smallest: an Ethernet header.
const MIN_FRAME: usize = 14;
/// Send attempts while the TX ring is full.
const BUSY_TRIES: u32 = 1000;

static NEXT_QPN: AtomicU32 = AtomicU32::new(0);

/// A raw packet QP: `ibv_qp` first, its `ibv_qp_ex` part second, like the others.
#[repr(C)]
pub(crate) struct RawQp {
    pub ibv: IbvQp,
    pub ext: QpExt,
    engine: Arc<Context>,
    scq: VCq,
    rcq: VCq,
    cap: IbvQpCap,
    sq_sig_all: bool,
    /// The state and the posted receive WRs; the lock also serialises posts.
    st: Mutex<(QpState, VecDeque<u64>)>,
}

const _: () = assert!(core::mem::offset_of!(RawQp, ext) == core::mem::size_of::<IbvQp>());

/// Whether `qp` is a raw packet QP.
///
/// # Safety
/// `qp` is NULL or a live QP.
pub(crate) unsafe fn is_raw(qp: *mut IbvQp) -> bool {
    // SAFETY: the caller's contract; qp_type never changes.
    !qp.is_null() && unsafe { (*qp).qp_type } == IBV_QPT_RAW_PACKET
}

/// ibv_create_qp for IBV_QPT_RAW_PACKET.
///
/// # Safety
/// `pd` is the PD `p` was read from; `a`'s CQs are NULL or this library's.
pub(crate) unsafe fn create(
    p: &Pd,
    pd: *mut IbvPd,
    a: &mut IbvQpInitAttr,
    ext: Option<ExtOps>,
) -> Result<*mut IbvQp, c_int> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        log::error!("create_qp (raw packet): needs root (the kernel asks for CAP_NET_RAW)");
        return Err(libc::EPERM);
    }
    let cap = a.cap;
    if !a.srq.is_null()
        || cap.max_send_wr > MAX_QP_WR
        || cap.max_recv_wr > MAX_QP_WR
        || cap.max_send_sge > MAX_SGE as u32
        || cap.max_recv_sge > MAX_SGE as u32
        || cap.max_inline_data as usize > MAX_FRAME
    {
        log::error!(
            "create_qp (raw packet): {cap:?} exceeds the device (max_send_wr and max_recv_wr \
             {MAX_QP_WR}, {MAX_SGE} SGEs, {MAX_FRAME} bytes of inline data, no SRQ)"
        );
        return Err(libc::EINVAL);
    }
    // SAFETY: CQs from ibv_create_cq on this context, or NULL.
    let (scq, rcq) = unsafe { qp_cqs(a) }.ok_or(libc::EINVAL)?;
    let qpn = QPN_BASE | (NEXT_QPN.fetch_add(1, Ordering::Relaxed) % 0x3F_FFFF);
    let cap = IbvQpCap {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1),
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: cap.max_inline_data,
    };
    a.cap = cap;
    let b = Box::new(RawQp {
        ibv: new_ibv_qp(p, pd, a, qpn),
        ext: QpExt::new(&cap, ext),
        engine: Arc::clone(&p.engine),
        scq: scq.cq.clone(),
        rcq: rcq.cq.clone(),
        cap,
        sq_sig_all: a.sq_sig_all != 0,
        st: Mutex::new((QpState::Reset, VecDeque::new())),
    });
    Ok(Box::into_raw(b) as *mut IbvQp)
}

/// # Safety
/// `qp` is NULL or a live raw packet QP.
unsafe fn raw<'a>(qp: *mut IbvQp) -> Option<&'a RawQp> {
    // SAFETY: the caller's contract.
    unsafe { own::<RawQp, _>(qp) }
}

/// ibv_destroy_qp for a raw packet QP.
///
/// # Safety
/// `qp` is a live raw packet QP the caller gives up.
pub(crate) unsafe fn destroy(qp: *mut IbvQp) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { free::<RawQp, _>(qp) }
}

/// ibv_modify_qp for a raw packet QP.
///
/// # Safety
/// `qp` is a live raw packet QP; `a` the caller's attributes.
pub(crate) unsafe fn modify(qp: *mut IbvQp, a: &IbvQpAttr, mask: QpAttrMask) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { raw(qp) }) else {
        return libc::EINVAL;
    };
    let mut st = q.st.lock().unwrap_or_else(|e| e.into_inner());
    let cur = st.0;
    let to = if mask.contains(QpAttrMask::STATE) {
        QpState::from_ibv(a.qp_state)
    } else {
        cur
    };
    use QpState as S;
    let (allowed, required) = match (cur, to) {
        (S::Reset, S::Init) => (QpAttrMask::PORT, QpAttrMask::PORT),
        (S::Init, S::Init) => (QpAttrMask::PORT, QpAttrMask::empty()),
        (S::Init, S::Rtr) | (S::Rtr, S::Rts) | (S::Rts, S::Rts) => {
            (QpAttrMask::empty(), QpAttrMask::empty())
        }
        (_, S::Reset | S::Err) => (QpAttrMask::empty(), QpAttrMask::empty()),
        _ => {
            log::error!("modify_qp (raw packet): {cur:?} -> {to:?} is not a transition");
            return libc::EINVAL;
        }
    };
    let given = mask - QpAttrMask::STATE - QpAttrMask::CUR_STATE;
    if let Err(e) = check_attrs("raw packet", (cur, to), a, given, (allowed, required)) {
        return e;
    }
    st.0 = to;
    match to {
        S::Err => {
            for wr_id in st.1.drain(..) {
                q.rcq.push(completion(
                    q,
                    wr_id,
                    WcStatus::WrFlushErr,
                    WcOpcode::Recv,
                    0,
                ));
            }
        }
        S::Reset => st.1.clear(),
        _ => {}
    }
    // SAFETY: `state` is ours to update; applications read it.
    unsafe { (*qp).state = to.to_ibv() };
    0
}

/// ibv_query_qp for a raw packet QP.
///
/// # Safety
/// `qp` is a live raw packet QP; `attr` and `init` are writable.
pub(crate) unsafe fn query(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { raw(qp) }) else {
        return libc::EINVAL;
    };
    let state = q.st.lock().unwrap_or_else(|e| e.into_inner()).0.to_ibv();
    // SAFETY: the caller passes both structures; ibv_qp_attr is plain data for which zero
    // is a valid value.
    unsafe {
        ptr::write_bytes(attr, 0, 1);
        let out = &mut *attr;
        out.qp_state = state;
        out.cur_qp_state = state;
        out.cap = q.cap;
        out.port_num = 1;
        init.write(init_attr_of(&q.ibv, q.cap, q.sq_sig_all));
    }
    0
}

fn completion(
    q: &RawQp,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    len: u32,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len: len,
        qp_num: q.ibv.qp_num,
        ..WorkCompletion::EMPTY
    }
}

/// ibv_post_send for a raw packet QP: one frame per request.
///
/// # Safety
/// As ibv_post_send: `qp` a live raw packet QP, `wr` a list of valid requests.
pub(crate) unsafe fn post_send(
    qp: *mut IbvQp,
    mut wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { raw(qp) }) else {
        return libc::EINVAL;
    };
    let st = q.st.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: a QP's PD lives as long as the QP.
    let pd = unsafe { Pd::of(q.ibv.pd) };
    let mut frame = [0u8; MAX_FRAME];
    while !wr.is_null() {
        // SAFETY: a list of valid requests (the caller's contract).
        let w = unsafe { &*wr };
        // SAFETY: as above.
        if let Err(e) = unsafe { send_one(q, st.0, pd, w, &mut frame) } {
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, wr) };
            return e;
        }
        wr = w.next;
    }
    0
}

/// Sends request `w` as one frame.
///
/// # Safety
/// `w` and its SGE list are valid.
unsafe fn send_one(
    q: &RawQp,
    state: QpState,
    pd: &Pd,
    w: &IbvSendWr,
    frame: &mut [u8; MAX_FRAME],
) -> Result<(), c_int> {
    if state != QpState::Rts {
        log::error!("post_send (raw packet): the QP is in {state:?}, not RTS");
        return Err(libc::EINVAL);
    }
    if w.opcode != IBV_WR_SEND {
        log::error!(
            "post_send (raw packet): opcode {} (a raw QP sends frames: IBV_WR_SEND)",
            w.opcode
        );
        return Err(libc::EINVAL);
    }
    let n = w.num_sge.max(0) as usize;
    if n > q.cap.max_send_sge as usize || n > 0 && w.sg_list.is_null() {
        log::error!(
            "post_send (raw packet): {n} SGEs (the QP was made for {})",
            q.cap.max_send_sge
        );
        return Err(libc::EINVAL);
    }
    // SAFETY: num_sge readable entries (checked non-NULL).
    let sges = unsafe { sge::list(w.sg_list, n) };
    let total: usize = sges.iter().map(|s| s.length as usize).sum();
    if !(MIN_FRAME..=MAX_FRAME).contains(&total) {
        log::error!("post_send (raw packet): a frame of {total} bytes ({MIN_FRAME}..={MAX_FRAME})");
        return Err(libc::EINVAL);
    }
    let inline = w.send_flags & IBV_SEND_INLINE != 0;
    if inline && total > q.cap.max_inline_data as usize {
        log::error!(
            "post_send (raw packet): {total} bytes inline (the QP takes {})",
            q.cap.max_inline_data
        );
        return Err(libc::EINVAL);
    }
    if !inline {
        if let Some(s) = sges
            .iter()
            .find(|s| !pd.covers(s.lkey, s.addr, s.length, false))
        {
            log::error!(
                "post_send (raw packet): SGE {:#x}+{} is outside a region of lkey {:#x}",
                s.addr,
                s.length,
                s.lkey
            );
            return Err(libc::EINVAL);
        }
    }
    // SAFETY: the SGEs' bytes are readable during the post (registered, or inline data).
    unsafe { sge::gather(sges, &mut frame[..total]) };
    let mut tries = 0;
    loop {
        match q.engine.send_raw(&frame[..total]) {
            Ok(()) => break,
            Err(e) if matches!(e.kind, bluerdma_core::engine::VerbsError::Busy { .. }) => {
                tries += 1;
                if tries >= BUSY_TRIES {
                    log::error!("post_send (raw packet): the simple NIC's TX ring stays full");
                    return Err(libc::ENOMEM);
                }
                std::thread::yield_now();
            }
            Err(e) => return Err(fail(e)),
        }
    }
    if q.sq_sig_all || w.send_flags & IBV_SEND_SIGNALED != 0 {
        q.scq.push(completion(
            q,
            w.wr_id,
            WcStatus::Success,
            WcOpcode::Send,
            total as u32,
        ));
    }
    Ok(())
}

/// ibv_post_recv for a raw packet QP: the WRs are kept (no flow rule ever fills them).
///
/// # Safety
/// As ibv_post_recv.
pub(crate) unsafe fn post_recv(
    qp: *mut IbvQp,
    mut wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { raw(qp) }) else {
        return libc::EINVAL;
    };
    let mut st = q.st.lock().unwrap_or_else(|e| e.into_inner());
    while !wr.is_null() {
        // SAFETY: a list of valid requests.
        let w = unsafe { &*wr };
        let refuse = if st.0 == QpState::Reset {
            Some("the QP is in RESET")
        } else if w.num_sge.max(0) as u32 > q.cap.max_recv_sge {
            Some("too many SGEs")
        } else if st.1.len() >= q.cap.max_recv_wr as usize {
            Some("the receive queue is full")
        } else {
            None
        };
        if let Some(why) = refuse {
            log::error!("post_recv (raw packet): {why}");
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, wr) };
            return if why.ends_with("full") {
                libc::ENOMEM
            } else {
                libc::EINVAL
            };
        }
        if st.0 == QpState::Err {
            q.rcq.push(completion(
                q,
                w.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            ));
        } else {
            st.1.push_back(w.wr_id);
        }
        wr = w.next;
    }
    0
}
