//! Protection domains, memory regions, completion queues and channels, queue pairs and the
//! data path (the four function pointers the inline verbs jump through).

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{RecvWr, WcOpcode, WcStatus, WorkCompletion};
use bluerdma_core::keys::MrKey;
use bluerdma_core::qp::{Gid, QpAttrMask, QpState, RawQpAttr};
use bluerdma_linux::verbs::{Context, Cq as VCq, Mr as VMr, Pd as VPd, Qp as VQp};

use crate::abi::*;
use crate::device::{caps, Ctx};
use crate::{fail, set_errno};

/// Reports a failed object-creating verb: errno set, NULL returned.
pub(crate) fn null<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    ptr::null_mut()
}

// ---------------------------------------------------------------------------------------
// Protection domains.

#[repr(C)]
pub(crate) struct Pd {
    pub ibv: IbvPd,
    pub(crate) pd: VPd,
    pub engine: Arc<Context>,
    /// The PD's MRs by key, for READ sinks (see [`Pd::read_sink_key`]).
    mrs: Mutex<HashMap<u32, MrEntry>>,
}

/// What a READ needs to know about a registered region.
struct MrEntry {
    addr: u64,
    len: usize,
    local_write: bool,
    remote_write: bool,
    /// A second registration of the same bytes with REMOTE_WRITE, made on the first READ
    /// into a region that lacks it.
    shadow: Option<VMr>,
}

impl Pd {
    /// Whether `[addr, addr + len)` lies in the PD's MR of key `lkey` (with LOCAL_WRITE
    /// when `write`): what a software transport checks before it touches an SGE's bytes.
    pub fn covers(&self, lkey: u32, addr: u64, len: u32, write: bool) -> bool {
        let mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        mrs.get(&lkey).is_some_and(|e| {
            (e.local_write || !write)
                && addr >= e.addr
                && addr
                    .checked_add(len.into())
                    .is_some_and(|end| end <= e.addr + e.len as u64)
        })
    }

    /// The key a READ into the region of `lkey` must name as its sink.
    ///
    /// The card accepts READ response packets only into an MR with REMOTE_WRITE
    /// (nic-behaviour.md 2.3 check 6), where verbs ask for LOCAL_WRITE; perftest's
    /// ib_read_bw registers LOCAL_WRITE | REMOTE_READ. So the first READ into such a region
    /// registers the same bytes again with REMOTE_WRITE and uses that key for every READ
    /// into it. The application's own key stays without REMOTE_WRITE; the sink key travels
    /// in READ requests, so a peer that reads it from the wire could write the region
    /// (README, hardware limitations).
    pub(crate) fn read_sink_key(&self, lkey: u32) -> Result<u32, c_int> {
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        // An unknown key is the engine's to refuse (LOC_PROT_ERR names it).
        let Some(e) = mrs.get_mut(&lkey) else {
            return Ok(lkey);
        };
        if e.remote_write {
            return Ok(lkey);
        }
        if let Some(s) = &e.shadow {
            return Ok(s.key().get());
        }
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // SAFETY: the same bytes as the application's registration, which the verbs
        // contract keeps valid until ibv_dereg_mr; the shadow is dropped with it.
        let shadow = unsafe { self.pd.reg_mr(e.addr as *mut u8, e.len, access) }.map_err(fail)?;
        let key = shadow.key().get();
        e.shadow = Some(shadow);
        Ok(key)
    }
}

/// # Safety
/// `p` is NULL or a live object of type `T` whose first field is the ibv struct.
pub(crate) unsafe fn own<'a, T, I>(p: *mut I) -> Option<&'a T> {
    // SAFETY: the caller's contract.
    (!p.is_null()).then(|| unsafe { &*(p as *const T) })
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_alloc_pd(ctx: *mut IbvContext) -> *mut IbvPd {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return null(libc::EINVAL);
    };
    let engine = match c.engine() {
        Ok(e) => e,
        Err(errno) => return null(errno),
    };
    let pd = match engine.alloc_pd() {
        Ok(pd) => pd,
        Err(e) => return null(fail(e)),
    };
    let b = Box::new(Pd {
        ibv: IbvPd {
            context: ctx,
            handle: pd.handle(),
            _pad: 0,
        },
        pd,
        engine,
        mrs: Mutex::new(HashMap::new()),
    });
    Box::into_raw(b) as *mut IbvPd
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    // SAFETY: made by ibv_alloc_pd; the caller gives it up. The engine keeps the PD alive
    // while MRs and QPs made from it exist (they hold clones).
    unsafe { free::<Pd, _>(pd) }
}

/// Frees an object a verb handed out as a box of `T` (EINVAL for NULL).
///
/// # Safety
/// `p` is NULL or a `Box<T>` made by this library, which the caller gives up.
pub(crate) unsafe fn free<T, I>(p: *mut I) -> c_int {
    if p.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(p as *mut T) });
    0
}

// ---------------------------------------------------------------------------------------
// Memory regions.

#[repr(C)]
struct Mr {
    ibv: IbvMr,
    _mr: VMr,
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the PD outlives its MRs (ibv_dealloc_pd with MRs left is the
        // application's error, as with the real library).
        let pd = unsafe { &*(self.ibv.pd as *const Pd) };
        pd.mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.ibv.lkey);
    }
}

/// Access bits 20..=29 are optional: a device that does not know one ignores it
/// (IBV_ACCESS_RELAXED_ORDERING, which perftest always passes, is bit 20).
const OPTIONAL_ACCESS: u32 = 0x3FF0_0000;

fn mr_access(access: c_int) -> Result<AccessFlags, c_int> {
    let bits = access as u32 & !OPTIONAL_ACCESS;
    let supported = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let flags = u8::try_from(bits)
        .ok()
        .and_then(AccessFlags::from_bits)
        .filter(|f| supported.contains(*f));
    flags.ok_or_else(|| {
        log::error!(
            "reg_mr: access {access:#x} has flags this device does not support \
             (supported: LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC)"
        );
        libc::EINVAL
    })
}

unsafe fn reg(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: the caller passes a PD from ibv_alloc_pd.
    let Some(p) = (unsafe { own::<Pd, _>(pd) }) else {
        return null(libc::EINVAL);
    };
    if iova != addr as u64 {
        log::error!("reg_mr: an iova different from the address is not supported");
        return null(libc::EOPNOTSUPP);
    }
    if len == 0 || addr.is_null() {
        log::error!("reg_mr: an empty region or a NULL address");
        return null(libc::EINVAL);
    }
    let access = match mr_access(access) {
        Ok(a) => a,
        Err(e) => return null(e),
    };
    // SAFETY: the verbs contract: the region stays valid until ibv_dereg_mr.
    let mr = match unsafe { p.pd.reg_mr(addr as *mut u8, len, access) } {
        Ok(m) => m,
        Err(e) => return null(fail(e)),
    };
    let key = mr.key().get();
    p.mrs.lock().unwrap_or_else(|e| e.into_inner()).insert(
        key,
        MrEntry {
            addr: addr as u64,
            len,
            local_write: access.contains(AccessFlags::LOCAL_WRITE),
            remote_write: access.contains(AccessFlags::REMOTE_WRITE),
            shadow: None,
        },
    );
    let b = Box::new(Mr {
        ibv: IbvMr {
            context: p.ibv.context,
            pd,
            addr,
            length: len,
            handle: key,
            lkey: key,
            rkey: key,
            _pad: 0,
        },
        _mr: mr,
    });
    Box::into_raw(b) as *mut IbvMr
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded contract.
    unsafe { reg(pd, addr, len, addr as u64, access) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded contract.
    unsafe { reg(pd, addr, len, iova, access) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    // SAFETY: forwarded contract.
    unsafe { reg(pd, addr, len, iova, access as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    // SAFETY: made by ibv_reg_mr; dropping deregisters it in the card.
    unsafe { free::<Mr, _>(mr) }
}

// ---------------------------------------------------------------------------------------
// Completion channels and queues.

#[repr(C)]
struct Channel {
    ibv: IbvCompChannel,
    /// The pipe's write end; each event is one `ibv_cq` pointer.
    write_fd: c_int,
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_comp_channel(ctx: *mut IbvContext) -> *mut IbvCompChannel {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() {
        return null(libc::EINVAL);
    }
    let mut fds = [-1; 2];
    // SAFETY: room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return ptr::null_mut();
    }
    let b = Box::new(Channel {
        ibv: IbvCompChannel {
            context: ctx,
            fd: fds[0],
            refcnt: 0,
        },
        write_fd: fds[1],
    });
    Box::into_raw(b) as *mut IbvCompChannel
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_comp_channel(ch: *mut IbvCompChannel) -> c_int {
    if ch.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_comp_channel.
    let c = unsafe { &*(ch as *const Channel) };
    if c.ibv.refcnt != 0 {
        return libc::EBUSY;
    }
    // SAFETY: made by ibv_create_comp_channel; the caller gives it up.
    let c = unsafe { Box::from_raw(ch as *mut Channel) };
    // SAFETY: the channel's own descriptors.
    unsafe {
        libc::close(c.ibv.fd);
        libc::close(c.write_fd);
    }
    0
}

#[repr(C)]
pub(crate) struct Cq {
    ibv: IbvCq,
    pub cq: VCq,
    /// Events handed out by ibv_get_cq_event.
    events: AtomicU32,
    _engine: Arc<Context>,
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_cq(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
) -> *mut IbvCq {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return null(libc::EINVAL);
    };
    let max = caps::capacity().cq_depth as c_int;
    if !(1..=max).contains(&cqe) || comp_vector != 0 {
        log::error!(
            "create_cq: cqe {cqe} (1..={max}) or comp_vector {comp_vector} (0) out of range"
        );
        return null(libc::EINVAL);
    }
    let engine = match c.engine() {
        Ok(e) => e,
        Err(errno) => return null(errno),
    };
    let cq = match engine.create_cq() {
        Ok(cq) => cq,
        Err(e) => return null(fail(e)),
    };
    let b = Box::into_raw(Box::new(Cq {
        ibv: IbvCq {
            context: ctx,
            channel,
            cq_context,
            handle: 0,
            cqe,
            mutex: [0; 40],
            cond: [0; 48],
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        cq,
        events: AtomicU32::new(0),
        _engine: engine,
    }));
    if !channel.is_null() {
        // SAFETY: a channel from ibv_create_comp_channel; it outlives its CQs (destroying it
        // is refused while refcnt > 0).
        let ch = unsafe { &mut *(channel as *mut Channel) };
        ch.ibv.refcnt += 1;
        let (fd, cq_ptr) = (ch.write_fd, b as usize);
        // SAFETY: `b` was just made and lives until ibv_destroy_cq.
        unsafe { &*b }.cq.set_notify(Box::new(move || {
            let bytes = cq_ptr.to_ne_bytes();
            // SAFETY: writes 8 bytes from a local buffer to the channel's pipe.
            let n = unsafe { libc::write(fd, bytes.as_ptr() as *const c_void, bytes.len()) };
            if n != bytes.len() as isize {
                log::error!(
                    "completion channel: event lost ({})",
                    std::io::Error::last_os_error()
                );
            }
        }));
    }
    b as *mut IbvCq
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_create_cq; the caller gives it up (its QPs are destroyed).
    let b = unsafe { Box::from_raw(cq as *mut Cq) };
    if !b.ibv.channel.is_null() {
        // SAFETY: the channel outlives its CQs.
        unsafe { (*(b.ibv.channel as *mut Channel)).ibv.refcnt -= 1 };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
    // SAFETY: the caller passes a live CQ.
    let Some(c) = (unsafe { own::<Cq, _>(cq) }) else {
        return libc::EINVAL;
    };
    // Every CQ already has the device's full depth.
    let max = caps::capacity().cq_depth as c_int;
    if !(1..=max).contains(&cqe) {
        return libc::EINVAL;
    }
    // SAFETY: `cqe` is the application-visible size; no one else writes it.
    unsafe { (*(c as *const Cq as *mut Cq)).ibv.cqe = cqe };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_cq_event(
    ch: *mut IbvCompChannel,
    cq: *mut *mut IbvCq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq.is_null() || cq_context.is_null() {
        return -1;
    }
    let mut b = [0u8; 8];
    // SAFETY: reads into a local buffer from the channel's pipe (blocking unless the
    // application made the fd non-blocking, as with the real library).
    let n = unsafe { libc::read((*ch).fd, b.as_mut_ptr() as *mut c_void, 8) };
    if n != 8 {
        return -1;
    }
    let p = usize::from_ne_bytes(b) as *mut Cq;
    // SAFETY: the notify callback wrote a pointer to a live CQ of this channel.
    unsafe {
        (*p).events.fetch_add(1, Ordering::Relaxed);
        *cq = p as *mut IbvCq;
        *cq_context = (*p).ibv.cq_context;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_ack_cq_events(cq: *mut IbvCq, n: u32) {
    // SAFETY: the caller passes a live CQ.
    if let Some(c) = unsafe { own::<Cq, _>(cq) } {
        // SAFETY: the counter field is ours to update; applications only read it.
        unsafe {
            let p = ptr::addr_of_mut!((*(c as *const Cq as *mut Cq)).ibv.comp_events_completed);
            p.write(p.read().wrapping_add(n));
        }
    }
}

fn wc_of(w: &WorkCompletion) -> IbvWc {
    IbvWc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: w.imm_data.to_be(),
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags,
        pkey_index: 0,
        slid: 0,
        // UD receives carry a GRH; sl bits 2..0 are then the RoCE L3 type, 2 = IPv4 (the
        // mlx5 convention UCX reads).
        sl: if w.wc_flags & crate::ud::WC_GRH != 0 {
            2
        } else {
            0
        },
        dlid_path_bits: 0,
        _pad: 0,
    }
}

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
        let k = match c.cq.poll(&mut buf[..want]) {
            Ok(k) => k,
            Err(e) => {
                fail(e);
                return -1;
            }
        };
        for (i, w) in buf[..k].iter().enumerate() {
            // SAFETY: the caller passes room for `n` completions.
            unsafe { wc.add(got + i).write(wc_of(w)) };
        }
        srq_consumed(c, &buf[..k]);
        got += k;
        if k < want {
            break;
        }
    }
    got as c_int
}

/// Hands an SRQ's next WR to each QP whose receive WR completed in `wcs`.
fn srq_consumed(c: &Cq, wcs: &[WorkCompletion]) {
    let is_recv =
        |w: &&WorkCompletion| matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
    // The common poll (empty, or send completions only) takes no lock.
    if !wcs.iter().any(|w| is_recv(&w)) {
        return;
    }
    // SAFETY: the context outlives its CQs.
    let Some(ctx) = (unsafe { Ctx::from_ibv(c.ibv.context) }) else {
        return;
    };
    let map = ctx.srq_qps.lock().unwrap_or_else(|e| e.into_inner());
    for w in wcs.iter().filter(is_recv) {
        if let Some(srq) = map.get(&w.qp_num) {
            // A flushed WR means the QP is in ERR: nothing more goes to it.
            srq.consumed(w.qp_num, w.status == WcStatus::Success);
        }
    }
}

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

// ---------------------------------------------------------------------------------------
// Queue pairs.

#[repr(C)]
pub(crate) struct Qp {
    pub(crate) ibv: IbvQp,
    pub(crate) qp: VQp,
    pub(crate) cap: IbvQpCap,
    pub(crate) sq_sig_all: bool,
    /// Inline and gather buffers and the post count; the lock also serialises posts on
    /// this QP.
    pub(crate) post: Mutex<crate::post::PostState>,
    /// The shared receive queue this QP takes its receive WRs from.
    srq: Option<Arc<crate::srq::Shared>>,
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Some(srq) = &self.srq {
            srq.detach(self.ibv.qp_num);
            // SAFETY: the context outlives its QPs.
            if let Some(c) = unsafe { Ctx::from_ibv(self.ibv.context) } {
                c.srq_qps
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&self.ibv.qp_num);
            }
        }
    }
}

/// The send and receive CQs a new QP names (both are required).
///
/// # Safety
/// `a.send_cq` and `a.recv_cq` are NULL or CQs from ibv_create_cq.
pub(crate) unsafe fn qp_cqs<'a>(a: &IbvQpInitAttr) -> Option<(&'a Cq, &'a Cq)> {
    // SAFETY: the caller's contract.
    let cqs = unsafe { (own::<Cq, _>(a.send_cq), own::<Cq, _>(a.recv_cq)) };
    match cqs {
        (Some(s), Some(r)) => Some((s, r)),
        _ => {
            log::error!("create_qp: a send and a receive CQ are required");
            None
        }
    }
}

/// The `ibv_qp` of a new QP (in RESET) made on `pd` from `a`.
pub(crate) fn new_ibv_qp(p: &Pd, pd: *mut IbvPd, a: &IbvQpInitAttr, qpn: u32) -> IbvQp {
    IbvQp {
        context: p.ibv.context,
        qp_context: a.qp_context,
        pd,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        handle: qpn,
        qp_num: qpn,
        state: QpState::Reset.to_ibv(),
        qp_type: a.qp_type,
        mutex: [0; 40],
        cond: [0; 48],
        events_completed: 0,
        _pad: 0,
    }
}

/// The creation attributes ibv_query_qp reports for a QP.
pub(crate) fn init_attr_of(ibv: &IbvQp, cap: IbvQpCap, sq_sig_all: bool) -> IbvQpInitAttr {
    IbvQpInitAttr {
        qp_context: ibv.qp_context,
        send_cq: ibv.send_cq,
        recv_cq: ibv.recv_cq,
        srq: ptr::null_mut(),
        cap,
        qp_type: ibv.qp_type,
        sq_sig_all: sq_sig_all as c_int,
        _pad: 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    // SAFETY: the caller passes a PD from ibv_alloc_pd.
    let (Some(p), false) = ((unsafe { own::<Pd, _>(pd) }), attr.is_null()) else {
        return null(libc::EINVAL);
    };
    // SAFETY: the caller passes an initialised ibv_qp_init_attr.
    let a = unsafe { &mut *attr };
    if a.qp_type == IBV_QPT_UD {
        // SAFETY: `p` is `pd`; the CQs are the caller's.
        return unsafe { crate::ud::create_qp(p, pd, a) };
    }
    if a.qp_type != IBV_QPT_RC {
        log::error!(
            "create_qp: QP type {} is not supported (RC and UD only)",
            a.qp_type
        );
        return null(libc::EOPNOTSUPP);
    }
    // SAFETY: an SRQ from ibv_create_srq, or NULL.
    let srq = unsafe { crate::srq::Srq::from_ibv(a.srq) }.map(|s| Arc::clone(&s.shared));
    let sq = caps::capacity().sq_depth as u32;
    let cap = a.cap;
    if cap.max_send_wr > sq
        || cap.max_recv_wr > caps::MAX_RECV_WR
        || cap.max_send_sge > crate::post::MAX_SGE as u32
        || cap.max_recv_sge > 1
        || cap.max_inline_data > crate::post::MAX_INLINE
    {
        log::error!(
            "create_qp: {cap:?} exceeds the device (max_send_wr {sq}, max_recv_wr {}, {} send \
             SGEs, 1 receive SGE, \
             {} bytes of inline data)",
            caps::MAX_RECV_WR,
            crate::post::MAX_SGE,
            crate::post::MAX_INLINE
        );
        return null(libc::EINVAL);
    }
    // SAFETY: CQs from ibv_create_cq on this context, or NULL.
    let Some((scq, rcq)) = (unsafe { qp_cqs(a) }) else {
        return null(libc::EINVAL);
    };
    let qp = match p.pd.create_qp(&scq.cq, &rcq.cq) {
        Ok(q) => q,
        Err(e) => return null(fail(e)),
    };
    let qpn = qp.qpn().get();
    let cap = IbvQpCap {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1),
        max_send_sge: crate::post::MAX_SGE as u32,
        max_recv_sge: 1,
        max_inline_data: crate::post::MAX_INLINE,
    };
    a.cap = cap;
    let b = Box::new(Qp {
        ibv: new_ibv_qp(p, pd, a, qpn),
        qp,
        cap,
        sq_sig_all: a.sq_sig_all != 0,
        post: Mutex::new(crate::post::PostState::default()),
        srq: srq.clone(),
    });
    if let Some(srq) = srq {
        // SAFETY: the context of a PD is open.
        if let Some(c) = unsafe { Ctx::from_ibv(p.ibv.context) } {
            c.srq_qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(qpn, Arc::clone(&srq));
        }
        // The box does not move: the pointer stays valid until Drop detaches it.
        srq.attach(qpn, &b.qp);
    }
    Box::into_raw(b) as *mut IbvQp
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    if unsafe { crate::ud::is_ud(qp) } {
        // SAFETY: a UD QP the caller gives up.
        return unsafe { crate::ud::destroy_qp(qp) };
    }
    // SAFETY: made by ibv_create_qp; the caller gives it up.
    unsafe { free::<Qp, _>(qp) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_modify_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    let (Some(q), false) = ((unsafe { own::<Qp, _>(qp) }), attr.is_null()) else {
        return libc::EINVAL;
    };
    // SAFETY: the caller passes an ibv_qp_attr.
    let a = unsafe { &*attr };
    let mask = QpAttrMask::from_bits_truncate(mask as u32);
    // SAFETY: a live QP.
    if unsafe { crate::ud::is_ud(qp) } {
        // SAFETY: as above.
        return unsafe { crate::ud::modify_qp(qp, a, mask) };
    }
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
    if mask.contains(QpAttrMask::AV) && a.ah_attr.is_global == 0 {
        log::error!(
            "modify_qp: the address vector has no GRH: on this RoCE device the peer is named by \
             its GID (run ibv_rc_pingpong with -g 0)"
        );
        return libc::EINVAL;
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
        dgid: Gid(a.ah_attr.grh.dgid),
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        min_rnr_timer: a.min_rnr_timer,
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
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    _mask: c_int,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    if unsafe { crate::ud::is_ud(qp) } && !attr.is_null() && !init.is_null() {
        // SAFETY: as above; both structures are writable.
        return unsafe { crate::ud::query_qp(qp, attr, init) };
    }
    // SAFETY: the caller passes a live QP.
    let (Some(q), false, false) = (
        (unsafe { own::<Qp, _>(qp) }),
        attr.is_null(),
        init.is_null(),
    ) else {
        return libc::EINVAL;
    };
    let s = match q.qp.query() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
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
        max_rd_atomic: caps::MAX_RD_ATOM,
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
    // SAFETY: the caller passes both structures.
    unsafe {
        attr.write(out);
        init.write(init_attr_of(&q.ibv, q.cap, q.sq_sig_all));
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_qp_to_qp_ex(_qp: *mut IbvQp) -> *mut c_void {
    // The extended post API (ibv_wr_*) is not offered; callers fall back to ibv_post_send.
    null(libc::EOPNOTSUPP)
}

/// The one SGE of a receive WR (none: a zero-length buffer).
///
/// # Safety
/// `w.sg_list` holds `w.num_sge` readable entries.
pub(crate) unsafe fn recv_sge(w: &IbvRecvWr, verb: &str) -> Result<IbvSge, c_int> {
    match w.num_sge {
        0 => Ok(IbvSge {
            addr: 0,
            length: 0,
            lkey: 0,
        }),
        // SAFETY: the caller's contract.
        1 if !w.sg_list.is_null() => Ok(unsafe { *w.sg_list }),
        k => {
            log::error!("{verb}: {k} SGEs (the device takes 1)");
            Err(libc::EINVAL)
        }
    }
}

pub(crate) unsafe extern "C" fn op_post_recv(
    qp: *mut IbvQp,
    mut wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller passes a live QP.
    if unsafe { crate::ud::is_ud(qp) } {
        // SAFETY: the caller's contract.
        return unsafe { crate::ud::post_recv(qp, wr, bad) };
    }
    // SAFETY: the caller passes a live QP.
    let Some(q) = (unsafe { own::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    let set_bad = |p: *mut IbvRecvWr| {
        if !bad.is_null() {
            // SAFETY: the caller passes a writable pointer slot.
            unsafe { *bad = p };
        }
    };
    if q.srq.is_some() {
        log::error!("post_recv: the QP takes its receive WRs from its SRQ (ibv_post_srq_recv)");
        set_bad(wr);
        return libc::EINVAL;
    }
    let mut batch = [RecvWr {
        wr_id: 0,
        addr: VirtAddr(0),
        len: 0,
        lkey: MrKey::from_raw(0),
    }; crate::post::BATCH];
    let mut ptrs = [ptr::null_mut::<IbvRecvWr>(); crate::post::BATCH];
    while !wr.is_null() {
        let mut n = 0;
        let mut error = None;
        while !wr.is_null() && n < crate::post::BATCH {
            // SAFETY: a list of valid requests, by the caller's contract.
            let w = unsafe { &*wr };
            // SAFETY: as above.
            let sge = match unsafe { recv_sge(w, "post_recv") } {
                Ok(sge) => sge,
                Err(e) => {
                    error = Some((wr, e));
                    break;
                }
            };
            batch[n] = RecvWr {
                wr_id: w.wr_id,
                addr: VirtAddr(sge.addr),
                len: sge.length,
                lkey: MrKey::from_raw(sge.lkey),
            };
            ptrs[n] = wr;
            n += 1;
            wr = w.next;
        }
        // SAFETY: the verbs contract: buffers belong to the requests until completion.
        if let Err((k, e)) = unsafe { q.qp.post_recv(&batch[..n]) } {
            set_bad(ptrs[k]);
            return fail(e);
        }
        if let Some((at, e)) = error {
            set_bad(at);
            return e;
        }
    }
    0
}

// Keep the opcode numbering honest: the engine's completion opcodes are the ibv values.
const _: () = assert!(WcOpcode::Recv as u32 == 128 && WcOpcode::RecvRdmaWithImm as u32 == 129);
