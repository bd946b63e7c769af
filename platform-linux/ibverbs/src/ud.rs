//! Unreliable Datagram QPs and address handles, built in this library: the card has no UD,
//! so a UD SEND is one frame the driver builds (`bluerdma_core::wire::ud`: BTH 0x64/0x65,
//! DETH, ICRC, UDP port 4792) and sends through the simple NIC, and the progress thread
//! hands every frame the card's classifier put on the simple-NIC RX ring to [`Dispatch`],
//! which checks it (ICRC, destination QP, Q_Key) and fills the QP's next receive buffer:
//! the 40-byte GRH area first (the IPv4 header in its last 20 bytes), then the payload.
//!
//! Sends complete when posted. A datagram that finds no QP, a wrong Q_Key or no receive
//! buffer is dropped and counted, as UD allows. Completions go to the same CQs as RC ones
//! (`Cq::push`), so polls and completion channels see both.

use core::ffi::c_int;
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bluerdma_core::engine::{VerbsError, WcOpcode, WcStatus, WorkCompletion, WC_WITH_IMM};
use bluerdma_core::qp::{Gid, QpAttrMask, QpState};
use bluerdma_core::wire::ud::{Deth, UdFrame, DEFAULT_PKEY, IPV4_RANGE, UD_MAX_FRAME};
use bluerdma_core::wire::MacAddr;
use bluerdma_linux::verbs::{Context, Cq as VCq};

use crate::abi::*;
use crate::device::{caps, GID_TABLE_LEN};
use crate::objects::{free, init_attr_of, new_ibv_qp, null, own, qp_cqs, Pd};

pub use bluerdma_core::wire::ud::UD_MAX_PAYLOAD;

/// `wc_flags`: IBV_WC_GRH.
pub const WC_GRH: u32 = 1;
/// The GRH area before a UD receive's payload.
pub const GRH_LEN: usize = 40;
/// SGEs per UD work request, both ways.
pub const MAX_SGE: u32 = 8;
/// Receive WRs a UD QP may hold.
pub const MAX_RECV_WR: u32 = 16384;
/// Address handles per process (a limit reported, not enforced: each is a small box).
pub const MAX_AH: c_int = 1 << 16;
/// UD QP numbers: 0x800000 and up, apart from the card's RC QP numbers (index << 8 | key).
const QPN_BASE: u32 = 0x80_0000;
/// How many times a send waits for a free simple-NIC TX slot before dropping the datagram.
const SEND_TRIES: u32 = 10_000;

static NEXT_QPN: AtomicU32 = AtomicU32::new(0);

// ---------------------------------------------------------------------------------------
// Address handles.

#[repr(C)]
struct Ah {
    ibv: IbvAh,
    ip: Ipv4Addr,
}

/// The peer an address vector names: RoCE v2 needs a GRH with an IPv4-mapped GID.
fn peer_of(a: &IbvAhAttr, verb: &str) -> Result<Ipv4Addr, c_int> {
    if a.is_global == 0 {
        log::error!("{verb}: the address vector has no GRH (this RoCE device names peers by GID)");
        return Err(libc::EINVAL);
    }
    if a.port_num > 1 || u32::from(a.grh.sgid_index) >= GID_TABLE_LEN {
        log::error!(
            "{verb}: port {} or sgid_index {} does not exist",
            a.port_num,
            a.grh.sgid_index
        );
        return Err(libc::EINVAL);
    }
    Gid(a.grh.dgid).to_ipv4().map_err(|e| {
        log::error!("{verb}: {e}");
        libc::EINVAL
    })
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    // SAFETY: the caller passes a PD from ibv_alloc_pd.
    let (Some(p), false) = ((unsafe { own::<Pd, _>(pd) }), attr.is_null()) else {
        return null(libc::EINVAL);
    };
    // SAFETY: the caller passes an ibv_ah_attr.
    let ip = match peer_of(unsafe { &*attr }, "create_ah") {
        Ok(ip) => ip,
        Err(e) => return null(e),
    };
    let b = Box::new(Ah {
        ibv: IbvAh {
            context: p.ibv.context,
            pd,
            handle: u32::from(ip),
            _pad: 0,
        },
        ip,
    });
    Box::into_raw(b) as *mut IbvAh
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
    // SAFETY: made by ibv_create_ah; the caller gives it up.
    unsafe { free::<Ah, _>(ah) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_init_ah_from_wc(
    _ctx: *mut IbvContext,
    port_num: u8,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    attr: *mut IbvAhAttr,
) -> c_int {
    if wc.is_null() || grh.is_null() || attr.is_null() || port_num != 1 {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes the completion and the GRH area of its receive buffer.
    let (w, g) = unsafe { (&*wc, &*(grh as *const [u8; GRH_LEN])) };
    if w.wc_flags & WC_GRH == 0 {
        return libc::EINVAL;
    }
    // An IPv4 GRH area: the IPv4 header in bytes 20..39, its source address at 32..35.
    let src = Ipv4Addr::new(g[32], g[33], g[34], g[35]);
    let mut a = IbvAhAttr {
        is_global: 1,
        port_num,
        sl: w.sl,
        ..IbvAhAttr::default()
    };
    a.grh.dgid = Gid::from_ipv4(src).0;
    a.grh.hop_limit = 64;
    // SAFETY: the caller passes room for an ibv_ah_attr.
    unsafe { attr.write(a) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    port_num: u8,
) -> *mut IbvAh {
    let mut a = IbvAhAttr::default();
    // SAFETY: the caller's pointers, passed on.
    let pd_ctx = unsafe { own::<Pd, _>(pd) }.map_or(ptr::null_mut(), |p| p.ibv.context);
    // SAFETY: as above; `a` is local.
    match unsafe { bv_ibv_init_ah_from_wc(pd_ctx, port_num, wc, grh, &mut a) } {
        // SAFETY: as above.
        0 => unsafe { bv_ibv_create_ah(pd, &mut a) },
        e => null(e),
    }
}

// ---------------------------------------------------------------------------------------
// Receiving: one dispatcher per device engine.

/// Counters of datagrams this process dropped, per device.
#[derive(Default)]
struct Drops {
    /// Not a UD frame of ours, or a bad ICRC.
    malformed: AtomicU64,
    /// No UD QP with the destination QPN, or the QP is not ready to receive.
    no_qp: AtomicU64,
    /// The Q_Key did not match the QP's.
    qkey: AtomicU64,
    /// The QP had no receive buffer.
    no_buffer: AtomicU64,
}

/// The UD QPs of one device engine, by QPN; the engine's raw-frame handler.
struct Dispatch {
    qps: Mutex<HashMap<u32, Weak<Shared>>>,
    drops: Drops,
}

/// One dispatcher per engine, made with the first UD QP on it.
static DISPATCH: Mutex<Vec<(Weak<Context>, Arc<Dispatch>)>> = Mutex::new(Vec::new());

fn dispatch_for(engine: &Arc<Context>) -> Arc<Dispatch> {
    let mut all = DISPATCH.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(w, _)| w.strong_count() > 0);
    if let Some((_, d)) = all
        .iter()
        .find(|(w, _)| ptr::eq(w.as_ptr(), Arc::as_ptr(engine)))
    {
        return Arc::clone(d);
    }
    let d = Arc::new(Dispatch {
        qps: Mutex::new(HashMap::new()),
        drops: Drops::default(),
    });
    let handler = Arc::clone(&d);
    // The handler holds the dispatcher, which holds its QPs weakly: no cycle through the
    // engine (a QP holds its CQs, which hold the engine).
    engine.set_raw_handler(Some(Box::new(move |f: &[u8]| handler.on_frame(f))));
    all.push((Arc::downgrade(engine), Arc::clone(&d)));
    d
}

impl Dispatch {
    fn on_frame(&self, frame: &[u8]) {
        let bump = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        let (f, payload) = match UdFrame::parse(frame) {
            Ok(p) => p,
            Err(e) => {
                log::debug!("UD: frame of {} bytes dropped: {e}", frame.len());
                return bump(&self.drops.malformed);
            }
        };
        let qp = {
            let qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
            qps.get(&f.dst_qpn).and_then(Weak::upgrade)
        };
        let Some(qp) = qp else {
            return bump(&self.drops.no_qp);
        };
        let (Some(ip), Some(data)) = (frame.get(IPV4_RANGE), frame.get(payload)) else {
            return bump(&self.drops.malformed);
        };
        match qp.deliver(&f, ip, data) {
            Delivery::Done => {}
            Delivery::NotReady => bump(&self.drops.no_qp),
            Delivery::BadQkey => bump(&self.drops.qkey),
            Delivery::NoBuffer => bump(&self.drops.no_buffer),
        }
    }
}

// ---------------------------------------------------------------------------------------
// UD QPs.

/// A posted receive WR.
struct Posted {
    wr_id: u64,
    sges: [IbvSge; MAX_SGE as usize],
    n: usize,
}

/// What the receive side of a UD QP shares with the dispatcher.
struct Shared {
    qpn: u32,
    state: AtomicU32,
    qkey: AtomicU32,
    recv: Mutex<VecDeque<Posted>>,
    rcq: VCq,
}

enum Delivery {
    Done,
    NotReady,
    BadQkey,
    NoBuffer,
}

impl Shared {
    fn state(&self) -> QpState {
        QpState::from_ibv(self.state.load(Ordering::Acquire))
    }

    /// Puts one datagram in the next receive buffer: the GRH area (zeros, then the IPv4
    /// header `ip`), then `payload`.
    fn deliver(&self, f: &UdFrame, ip: &[u8], payload: &[u8]) -> Delivery {
        if !matches!(self.state(), QpState::Rtr | QpState::Rts) {
            return Delivery::NotReady;
        }
        if f.deth.qkey != self.qkey.load(Ordering::Acquire) {
            return Delivery::BadQkey;
        }
        let Some(wr) = self
            .recv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
        else {
            return Delivery::NoBuffer;
        };
        let mut grh = [0u8; GRH_LEN];
        grh[GRH_LEN - ip.len()..].copy_from_slice(ip);
        let total = GRH_LEN + payload.len();
        let room: usize = wr.sges[..wr.n].iter().map(|s| s.length as usize).sum();
        let mut wc = WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: total as u32,
            imm_data: f.imm.unwrap_or(0),
            qp_num: self.qpn,
            src_qp: f.deth.src_qpn,
            wc_flags: WC_GRH | if f.imm.is_some() { WC_WITH_IMM } else { 0 },
        };
        if total > room {
            wc.status = WcStatus::LocLenErr;
            wc.byte_len = 0;
        } else {
            let mut src = grh.iter().chain(payload).copied();
            for s in &wr.sges[..wr.n] {
                let dst = s.addr as *mut u8;
                for i in 0..s.length as usize {
                    let Some(b) = src.next() else { break };
                    // SAFETY: post_recv checked that the SGE lies in a registered region
                    // with local write access; the verbs contract gives the buffer to the
                    // library until its completion is polled.
                    unsafe { dst.add(i).write(b) };
                }
            }
        }
        self.rcq.push(wc);
        Delivery::Done
    }

    /// Completes every queued receive with WR_FLUSH_ERR (the QP went to ERR).
    fn flush(&self) {
        let wrs: Vec<Posted> = self
            .recv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for wr in wrs {
            self.rcq.push(WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: self.qpn,
                ..WorkCompletion::EMPTY
            });
        }
    }
}

/// A UD QP: `ibv_qp` first, like the RC one (`objects::Qp`); `ibv.qp_type` tells them
/// apart.
#[repr(C)]
pub(crate) struct UdQp {
    ibv: IbvQp,
    shared: Arc<Shared>,
    dispatch: Arc<Dispatch>,
    engine: Arc<Context>,
    scq: VCq,
    cap: IbvQpCap,
    sq_sig_all: bool,
    /// PSN of the next datagram; the lock also serialises posts on this QP.
    psn: Mutex<u32>,
}

impl Drop for UdQp {
    fn drop(&mut self) {
        self.dispatch
            .qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.shared.qpn);
    }
}

/// Whether `qp` (a QP from ibv_create_qp) is a UD QP.
///
/// # Safety
/// `qp` is NULL or a live QP.
pub(crate) unsafe fn is_ud(qp: *mut IbvQp) -> bool {
    // SAFETY: the caller's contract; qp_type is set at creation and never changes.
    !qp.is_null() && unsafe { (*qp).qp_type } == IBV_QPT_UD
}

/// ibv_create_qp for IBV_QPT_UD.
///
/// # Safety
/// `pd` is the PD `p` was read from; `a`'s CQs are NULL or from ibv_create_cq.
pub(crate) unsafe fn create_qp(p: &Pd, pd: *mut IbvPd, a: &mut IbvQpInitAttr) -> *mut IbvQp {
    let cap = a.cap;
    let sq = caps::capacity().sq_depth as u32;
    if !a.srq.is_null()
        || cap.max_send_wr > sq
        || cap.max_recv_wr > MAX_RECV_WR
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data as usize > UD_MAX_PAYLOAD
    {
        log::error!(
            "create_qp (UD): {cap:?} exceeds the device (max_send_wr {sq}, max_recv_wr \
             {MAX_RECV_WR}, {MAX_SGE} SGEs, {UD_MAX_PAYLOAD} bytes of inline data, no SRQ)"
        );
        return null(libc::EINVAL);
    }
    // SAFETY: CQs from ibv_create_cq on this context, or NULL.
    let Some((scq, rcq)) = (unsafe { qp_cqs(a) }) else {
        return null(libc::EINVAL);
    };
    let qpn = QPN_BASE | (NEXT_QPN.fetch_add(1, Ordering::Relaxed) % (QPN_BASE - 1));
    let shared = Arc::new(Shared {
        qpn,
        state: AtomicU32::new(QpState::Reset.to_ibv()),
        qkey: AtomicU32::new(0),
        recv: Mutex::new(VecDeque::new()),
        rcq: rcq.cq.clone(),
    });
    let dispatch = dispatch_for(&p.engine);
    dispatch
        .qps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(qpn, Arc::downgrade(&shared));
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
        shared,
        dispatch,
        engine: Arc::clone(&p.engine),
        scq: scq.cq.clone(),
        cap,
        sq_sig_all: a.sq_sig_all != 0,
        psn: Mutex::new(0),
    });
    Box::into_raw(b) as *mut IbvQp
}

/// # Safety
/// `qp` is a live UD QP.
unsafe fn ud<'a>(qp: *mut IbvQp) -> Option<&'a UdQp> {
    // SAFETY: the caller's contract.
    unsafe { own::<UdQp, _>(qp) }
}

/// ibv_destroy_qp for a UD QP.
///
/// # Safety
/// `qp` is a live UD QP the caller gives up.
pub(crate) unsafe fn destroy_qp(qp: *mut IbvQp) -> c_int {
    // SAFETY: made by create_qp; the caller gives it up.
    unsafe { free::<UdQp, _>(qp) }
}

/// ibv_modify_qp for a UD QP: RESET -> INIT (Q_Key, port, P_Key index) -> RTR -> RTS
/// (SQ PSN); ERR and RESET from any state. There is no peer.
///
/// # Safety
/// `qp` is a live UD QP; `a` is the caller's attributes.
pub(crate) unsafe fn modify_qp(qp: *mut IbvQp, a: &IbvQpAttr, mask: QpAttrMask) -> c_int {
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
    if !required.difference(given).is_empty() || !given.difference(allowed).is_empty() {
        log::error!(
            "modify_qp (UD): {cur:?} -> {to:?} takes {allowed:?} (requires {required:?}), \
             got {given:?}"
        );
        return libc::EINVAL;
    }
    if (given.contains(QpAttrMask::PORT) && a.port_num != 1)
        || (given.contains(QpAttrMask::PKEY_INDEX) && a.pkey_index != 0)
    {
        log::error!(
            "modify_qp (UD): port {} / P_Key index {} do not exist",
            a.port_num,
            a.pkey_index
        );
        return libc::EINVAL;
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
        S::Reset => q
            .shared
            .recv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear(),
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
pub(crate) unsafe fn query_qp(
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
        out.path_mtu = IBV_MTU_1024;
        out.qkey = q.shared.qkey.load(Ordering::Acquire);
        out.sq_psn = *q.psn.lock().unwrap_or_else(|e| e.into_inner());
        out.cap = q.cap;
        out.port_num = 1;
        init.write(init_attr_of(&q.ibv, q.cap, q.sq_sig_all));
    }
    0
}

/// Copies a send WR's payload (its SGEs, or its inline data) after the headers in `frame`;
/// returns the payload length.
///
/// # Safety
/// `wr`'s SGE list and, for inline data, the bytes it names are readable.
unsafe fn gather(q: &UdQp, wr: &IbvSendWr, frame: &mut [u8]) -> Result<usize, c_int> {
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    let n = wr.num_sge.max(0) as u32;
    let limit = if inline { MAX_SGE } else { q.cap.max_send_sge };
    if (n > 0 && wr.sg_list.is_null()) || n > limit {
        log::error!("post_send (UD): {n} SGEs (the QP takes {limit})");
        return Err(libc::EINVAL);
    }
    // SAFETY: a QP's PD lives as long as the QP.
    let pd = unsafe { &*(q.ibv.pd as *const Pd) };
    let sges: &[IbvSge] = if n == 0 {
        &[]
    } else {
        // SAFETY: num_sge entries are readable (checked non-null above).
        unsafe { std::slice::from_raw_parts(wr.sg_list, n as usize) }
    };
    let mut len = 0usize;
    for (k, s) in sges.iter().enumerate() {
        len += s.length as usize;
        if len > UD_MAX_PAYLOAD {
            log::error!("post_send (UD): more than {UD_MAX_PAYLOAD} bytes (the UD MTU)");
            return Err(libc::EINVAL);
        }
        if !inline && !pd.covers(s.lkey, s.addr, s.length, false) {
            log::error!(
                "post_send (UD): SGE {k} is outside the region of lkey {:#x}",
                s.lkey
            );
            return Err(libc::EINVAL);
        }
    }
    // SAFETY: registered (checked above) or inline bytes the caller lends for the duration
    // of ibv_post_send.
    unsafe { crate::post::gather(sges, &mut frame[..len]) };
    Ok(len)
}

/// Sends one UD work request; queues its completion when signaled.
///
/// # Safety
/// As ibv_post_send: `wr` and what it points to are valid.
unsafe fn send_one(q: &UdQp, wr: &IbvSendWr, psn: &mut u32) -> Result<(), c_int> {
    let imm = match wr.opcode {
        IBV_WR_SEND => None,
        IBV_WR_SEND_WITH_IMM => Some(u32::from_be(wr.imm_data)),
        other => {
            log::error!("post_send (UD): opcode {other} (UD takes SEND and SEND_WITH_IMM)");
            return Err(libc::EINVAL);
        }
    };
    // wr.ud: ah (offset 40), remote_qpn (48), remote_qkey (52).
    let ah = wr.wr[0] as *mut IbvAh;
    // SAFETY: an AH from ibv_create_ah, or NULL.
    let Some(ah) = (unsafe { own::<Ah, _>(ah) }) else {
        log::error!("post_send (UD): no address handle");
        return Err(libc::EINVAL);
    };
    let remote_qpn = (wr.wr[1] as u32) & 0xFF_FFFF;
    let mut qkey = (wr.wr[1] >> 32) as u32;
    if qkey & 0x8000_0000 != 0 {
        // A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
        qkey = q.shared.qkey.load(Ordering::Acquire);
    }
    let spec = q.engine.spec();
    let f = UdFrame {
        src_mac: spec.mac,
        dst_mac: MacAddr::BROADCAST,
        src_ip: spec.ip,
        dst_ip: ah.ip,
        udp_src_port: 0xC000 | (q.shared.qpn & 0x3FFF) as u16,
        pkey: DEFAULT_PKEY,
        solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
        dst_qpn: remote_qpn,
        psn: *psn,
        deth: Deth {
            qkey,
            src_qpn: q.shared.qpn,
        },
        imm,
    };
    let mut frame = [0u8; UD_MAX_FRAME];
    let h = f.header_len();
    // SAFETY: the caller's contract.
    let len = unsafe { gather(q, wr, &mut frame[h..])? };
    let n = f.emit(&mut frame, len).map_err(|e| {
        log::error!("post_send (UD): {e}");
        libc::EINVAL
    })?;
    *psn = (*psn + 1) & 0xFF_FFFF;
    let mut sent = false;
    for _ in 0..SEND_TRIES {
        match q.engine.send_raw(&frame[..n]) {
            Ok(()) => {
                sent = true;
                break;
            }
            Err(e) if matches!(e.kind, VerbsError::Busy { .. }) => std::thread::yield_now(),
            Err(e) => return Err(crate::fail(e)),
        }
    }
    if !sent {
        // UD is unreliable: a datagram the card could not take in time is lost.
        log::warn!("post_send (UD): the simple-NIC TX ring stayed full, datagram dropped");
    }
    if q.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0 {
        q.scq.push(WorkCompletion {
            wr_id: wr.wr_id,
            opcode: WcOpcode::Send,
            byte_len: len as u32,
            qp_num: q.shared.qpn,
            ..WorkCompletion::EMPTY
        });
    }
    Ok(())
}

/// ibv_post_send for a UD QP.
///
/// # Safety
/// As ibv_post_send.
pub(crate) unsafe fn post_send(
    qp: *mut IbvQp,
    mut wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { ud(qp) }) else {
        return libc::EINVAL;
    };
    let mut psn = q.psn.lock().unwrap_or_else(|e| e.into_inner());
    while !wr.is_null() {
        let e = if q.shared.state() != QpState::Rts {
            log::error!(
                "post_send (UD): the QP is in {:?}, not RTS",
                q.shared.state()
            );
            Err(libc::EINVAL)
        } else {
            // SAFETY: the caller's contract.
            unsafe { send_one(q, &*wr, &mut psn) }
        };
        if let Err(e) = e {
            if !bad.is_null() {
                // SAFETY: the caller passes a writable pointer slot.
                unsafe { *bad = wr };
            }
            return e;
        }
        // SAFETY: a list of valid requests.
        wr = unsafe { (*wr).next };
    }
    0
}

/// ibv_post_recv for a UD QP: buffers wait in the library for datagrams.
///
/// # Safety
/// As ibv_post_recv.
pub(crate) unsafe fn post_recv(
    qp: *mut IbvQp,
    mut wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { ud(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a QP's PD lives as long as the QP.
    let pd = unsafe { &*(q.ibv.pd as *const Pd) };
    let mut queue = q.shared.recv.lock().unwrap_or_else(|e| e.into_inner());
    while !wr.is_null() {
        // SAFETY: a list of valid requests.
        let w = unsafe { &*wr };
        let n = w.num_sge.max(0) as usize;
        let mut p = Posted {
            wr_id: w.wr_id,
            sges: [IbvSge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE as usize],
            n,
        };
        let mut error = if n > q.cap.max_recv_sge as usize || (n > 0 && w.sg_list.is_null()) {
            log::error!(
                "post_recv (UD): {n} SGEs (the QP takes {})",
                q.cap.max_recv_sge
            );
            Some(libc::EINVAL)
        } else if queue.len() >= q.cap.max_recv_wr as usize {
            log::error!("post_recv (UD): the receive queue is full");
            Some(libc::ENOMEM)
        } else {
            None
        };
        for k in 0..n.min(MAX_SGE as usize) {
            if error.is_some() {
                break;
            }
            // SAFETY: num_sge entries are readable.
            let s = unsafe { *w.sg_list.add(k) };
            if !pd.covers(s.lkey, s.addr, s.length, true) {
                log::error!(
                    "post_recv (UD): SGE {k} is outside a region of lkey {:#x} with local write",
                    s.lkey
                );
                error = Some(libc::EINVAL);
            }
            p.sges[k] = s;
        }
        if let Some(e) = error {
            if !bad.is_null() {
                // SAFETY: the caller passes a writable pointer slot.
                unsafe { *bad = wr };
            }
            return e;
        }
        queue.push_back(p);
        wr = w.next;
    }
    0
}

/// Datagrams dropped on receive, for the close log: malformed, no QP, Q_Key, no buffer.
pub(crate) fn drops(engine: &Arc<Context>) -> Option<[u64; 4]> {
    let all = DISPATCH.lock().unwrap_or_else(|e| e.into_inner());
    let (_, d) = all
        .iter()
        .find(|(w, _)| ptr::eq(w.as_ptr(), Arc::as_ptr(engine)))?;
    let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
    Some([
        r(&d.drops.malformed),
        r(&d.drops.no_qp),
        r(&d.drops.qkey),
        r(&d.drops.no_buffer),
    ])
}

const _: () = assert!(core::mem::offset_of!(UdQp, ibv) == 0);
