//! Completion queues: ibv_create_cq (tied to a completion channel when given one; an
//! extended CQ of ibv_create_cq_ex is the same object with its polling functions set),
//! ibv_destroy_cq, ibv_resize_cq, and the channel's events (`ibv_get_cq_event`,
//! `ibv_ack_cq_events`). Polling and arming are the context's function table (`poll.rs`).

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bluerdma_linux::verbs::{Context, Cq as VCq};

use crate::abi::*;
use crate::abi_ex::{cqx, IbvCqExTail};
use crate::caps;
use crate::channel::Channel;
use crate::context::Ctx;
use crate::errors::{errno_rc, fail, or_null};
use crate::handle::own;
use crate::live::{self, Kind};
use crate::rc_scatter::ScatterUsers;
use crate::srq::SrqMembers;

#[repr(C)]
pub(crate) struct Cq {
    pub ibv: IbvCq,
    /// The rest of `ibv_cq_ex`: the polling functions of a CQ made by ibv_create_cq_ex
    /// (`cq_ex.rs`), zero for one made by ibv_create_cq.
    pub ex: IbvCqExTail,
    /// The completion an extended CQ's poll is at (what its `read_*` functions return).
    pub current: Mutex<IbvWc>,
    pub cq: VCq,
    /// Events handed out by ibv_get_cq_event.
    events: AtomicU32,
    /// The QPs receiving into this CQ from an SRQ.
    pub srq_members: Arc<SrqMembers>,
    /// The QPs receiving into this CQ with receive WRs of several SGEs.
    pub scatter: ScatterUsers,
    /// QPs completing into it (twice for a QP that sends and receives here):
    /// ibv_destroy_cq is refused (EBUSY) while any is left.
    users: AtomicU32,
    _engine: Arc<Context>,
}

const _: () = assert!(core::mem::offset_of!(Cq, ex) == core::mem::size_of::<IbvCq>());

impl Cq {
    /// The CQ behind an application's pointer.
    ///
    /// # Safety
    /// `cq` is a live CQ (its QPs keep it so: ibv_destroy_cq is refused while they live).
    pub(crate) unsafe fn of<'a>(cq: *mut IbvCq) -> &'a Cq {
        // SAFETY: the caller's contract; `ibv` is the first field.
        unsafe { &*(cq as *const Cq) }
    }

    /// A QP completes into this CQ.
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// A QP that completed into this CQ is gone.
    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_cq(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
) -> *mut IbvCq {
    // SAFETY: forwarded contract.
    or_null(unsafe { create_cq(ctx, cqe, cq_context, channel, comp_vector, None) })
}

/// ibv_create_cq, and ibv_create_cq_ex (`cq_ex.rs`) with the polling functions of an
/// extended CQ in `ex_ops`.
///
/// # Safety
/// `ctx` is NULL or an open context; `channel` is NULL or a channel of it.
pub(crate) unsafe fn create_cq(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
    ex_ops: Option<[usize; cqx::COUNT]>,
) -> Result<*mut IbvCq, c_int> {
    live::check(Kind::Ctx, ctx, "create_cq")?;
    // SAFETY: a live context.
    let c = unsafe { Ctx::from_ibv(ctx) }.ok_or(libc::EINVAL)?;
    if !channel.is_null() {
        live::check(Kind::Channel, channel, "create_cq")?;
    }
    let max = caps::MAX_CQE as c_int;
    if !(1..=max).contains(&cqe) || comp_vector != 0 {
        log::error!(
            "create_cq: cqe {cqe} (1..={max}) or comp_vector {comp_vector} (0) out of range"
        );
        return Err(libc::EINVAL);
    }
    let engine = c.engine()?;
    let cq = engine.create_cq_sized(cqe as u32).map_err(fail)?;
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
        ex: IbvCqExTail {
            comp_mask: 0,
            status: UnsafeCell::new(0),
            wr_id: UnsafeCell::new(0),
            ops: ex_ops.unwrap_or([0; cqx::COUNT]),
        },
        current: Mutex::new(IbvWc::default()),
        cq,
        events: AtomicU32::new(0),
        srq_members: Arc::default(),
        scatter: ScatterUsers::default(),
        users: AtomicU32::new(0),
        _engine: engine,
    }));
    live::add(Kind::Cq, b, ctx);
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
    Ok(b as *mut IbvCq)
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_destroy_cq(cq) })
}

/// The work of [`bv_ibv_destroy_cq`]: 0, or the errno it returns (and sets).
unsafe fn ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    if !live::take(Kind::Cq, cq) {
        log::error!("destroy_cq: {cq:p} is not a live CQ (destroyed already?)");
        return libc::EINVAL;
    }
    // SAFETY: a live CQ (just checked).
    let users = unsafe { Cq::of(cq) }.users.load(Ordering::Acquire);
    if users > 0 {
        // SAFETY: as above; still live.
        live::add(Kind::Cq, cq, unsafe { (*cq).context });
        log::error!("destroy_cq: QPs still complete into the CQ");
        return libc::EBUSY;
    }
    // SAFETY: made by ibv_create_cq; the caller gives it up and no QP uses it.
    let b = unsafe { Box::from_raw(cq as *mut Cq) };
    if !b.ibv.channel.is_null() {
        // SAFETY: the channel outlives its CQs.
        unsafe { (*(b.ibv.channel as *mut Channel)).ibv.refcnt -= 1 };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_resize_cq(cq, cqe) })
}

/// The work of [`bv_ibv_resize_cq`]: 0, or the errno it returns (and sets).
unsafe fn ibv_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
    if let Err(e) = live::check(Kind::Cq, cq, "resize_cq") {
        return e;
    }
    // SAFETY: a live CQ.
    let Some(c) = (unsafe { own::<Cq, _>(cq) }) else {
        return libc::EINVAL;
    };
    let max = caps::MAX_CQE as c_int;
    if !(1..=max).contains(&cqe) {
        log::error!("resize_cq: cqe {cqe} out of range (1..={max})");
        return libc::EINVAL;
    }
    if let Err(e) = c.cq.resize(cqe as u32) {
        return fail(e);
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
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_get_cq_event(ch, cq, cq_context) })
}

/// The work of [`bv_ibv_get_cq_event`]: 0, or the errno it returns (and sets).
unsafe fn ibv_get_cq_event(
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
