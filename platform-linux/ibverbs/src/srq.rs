//! Shared receive queues, kept by this library on top of the engine's per-QP receive WRs.
//!
//! The card has no receive queue at all: a receive WR is announced to the peer over the
//! out-of-band channel, and the peer's SEND writes into it (issue D). So a WR must belong
//! to one QP before its buffer can be used, and it cannot be taken back once announced: an
//! SRQ is a pool that hands WRs to the QPs attached to it, fairly, so that no QP starves
//! while the pool has WRs (a starved QP's peer would wait for a buffer forever, and with it
//! every QP whose WRs wait on that peer: ibv_srq_pingpong -q 64 did):
//! - each attached QP is owed a share: the SRQ's WRs divided among its QPs, at least 1 and
//!   at most [`SHARE`];
//! - WRs of the pool always go to the QP that holds the fewest (below its share) first, so
//!   a QP that holds none gets the next one;
//! - every receive completion a poll returns frees a place: the pool's next WR goes out at
//!   once (announced), and `ibv_post_srq_recv` hands out what it adds the same way; with
//!   the pool empty, a SEND waits under the RNR rules (min_rnr_timer, rnr_retry) as on any
//!   QP without a receive WR;
//! - a QP attached before it can take receive WRs (RESET) is served by modify_qp.
//!
//! WRs handed to a QP stay with it: when the QP is destroyed they are flushed with it
//! (WR_FLUSH_ERR on its CQ) instead of returning to the pool.
//!
//! This module holds the pool and the SRQ verbs; `srq_post.rs` is ibv_post_srq_recv, and
//! a CQ's [`SrqMembers`] is how its polls find the pool of a QP whose receive completed.

use core::ffi::{c_int, c_void};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bluerdma_core::engine::{RecvWr, WcOpcode, WcStatus, WorkCompletion};
use bluerdma_linux::verbs::Qp as VQp;

use crate::abi::*;
use crate::caps::{MAX_SRQ, MAX_SRQ_WR};
use crate::errors::{errno_rc, null};
use crate::handle::free;
use crate::live::{self, Kind};
use crate::pd::Pd;

/// Receive WRs of the pool an attached QP holds at most (fewer when the SRQ's WRs do not
/// go round).
const SHARE: u32 = 16;

/// A QP attached to an SRQ.
struct Member {
    /// The engine QP, owned by the library's QP object, which detaches before dropping it.
    qp: *const VQp,
    /// WRs of the pool posted to it and not completed yet.
    posted: u32,
    /// A WR of it was flushed: the QP is in ERR, and a WR posted to it now would only be
    /// flushed too (taken from the pool for nothing), so it gets no more.
    failed: bool,
}

#[derive(Default)]
struct State {
    pool: VecDeque<RecvWr>,
    members: HashMap<u32, Member>,
}

/// The part of an SRQ its QPs and CQ polls share: the pool and the attached QPs.
pub(crate) struct SrqPool {
    state: Mutex<State>,
}

// SAFETY: `Member::qp` points at a verbs QP (itself Send + Sync) that stays alive while it
// is in `members` (see `detach`); everything else is plain data behind the mutex.
unsafe impl Send for SrqPool {}
// SAFETY: as above; all access goes through the mutex.
unsafe impl Sync for SrqPool {}

impl State {
    /// What each member is owed: the SRQ's WRs (pooled and posted) over its members, at
    /// least 1, at most [`SHARE`].
    fn share(&self) -> u32 {
        let live = self.members.values().filter(|m| !m.failed).count().max(1) as u32;
        let posted: u32 = self.members.values().map(|m| m.posted).sum();
        ((self.pool.len() as u32 + posted) / live).clamp(1, SHARE)
    }

    /// Hands pool WRs out, one at a time to the member that holds the fewest below its
    /// share, until the pool is empty or every member holds its share. A member that
    /// cannot take one now (RESET, or its queue is full) is skipped this time.
    fn distribute(&mut self) {
        let share = self.share();
        let mut skip: Vec<u32> = Vec::new();
        while !self.pool.is_empty() {
            let neediest = self
                .members
                .iter()
                .filter(|(q, m)| !m.failed && m.posted < share && !skip.contains(q))
                .min_by_key(|(q, m)| (m.posted, **q))
                .map(|(q, _)| *q);
            let Some(qpn) = neediest else { break };
            let Some(wr) = self.pool.pop_front() else {
                break;
            };
            let Some(m) = self.members.get_mut(&qpn) else {
                break;
            };
            // SAFETY: members hold live QPs (see the Send impl); the WR's buffer belongs to
            // the request until its completion (the verbs contract of post_srq_recv).
            if unsafe { (*m.qp).post_recv(&[wr]) }.is_ok() {
                m.posted += 1;
            } else {
                self.pool.push_front(wr);
                skip.push(qpn);
            }
        }
    }
}

impl SrqPool {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches `qp` (number `qpn`); it gets WRs as the pool has them.
    fn attach(&self, qpn: u32, qp: *const VQp) {
        let mut s = self.lock();
        s.members.insert(
            qpn,
            Member {
                qp,
                posted: 0,
                failed: false,
            },
        );
        s.distribute();
    }

    /// Detaches `qpn`; call before its QP is dropped.
    fn detach(&self, qpn: u32) {
        self.lock().members.remove(&qpn);
    }

    /// After modify_qp moved `qpn` to `state` (ibv_qp_state): RESET drops what it held (the
    /// engine forgets its receive WRs), ERR stops handing it WRs, and any other state lets
    /// it take WRs again (a QP leaving RESET can).
    fn state_changed(&self, qpn: u32, state: u32) {
        let mut s = self.lock();
        if let Some(m) = s.members.get_mut(&qpn) {
            match state {
                0 => {
                    m.posted = 0;
                    m.failed = false;
                }
                6 => m.failed = true,
                _ => {}
            }
        }
        s.distribute();
    }

    /// A receive WR of `qpn` completed: the pool's next WR goes to the neediest QP (a
    /// flushed WR means the QP is in ERR and gets no more).
    fn consumed(&self, qpn: u32, ok: bool) {
        let mut s = self.lock();
        if let Some(m) = s.members.get_mut(&qpn) {
            m.posted = m.posted.saturating_sub(1);
            m.failed |= !ok;
        }
        s.distribute();
    }

    /// Whether QPs are attached (an SRQ with QPs cannot be destroyed).
    fn has_members(&self) -> bool {
        !self.lock().members.is_empty()
    }

    /// The pool, locked for one chain of ibv_post_srq_recv.
    pub(crate) fn post(&self) -> PoolPost<'_> {
        PoolPost(self.lock())
    }
}

/// The pool of an SRQ while ibv_post_srq_recv adds a chain of WRs to it.
pub(crate) struct PoolPost<'a>(MutexGuard<'a, State>);

impl PoolPost<'_> {
    /// Adds `wr` to the pool; gives it back when the pool already holds `max` WRs.
    pub(crate) fn push(&mut self, wr: RecvWr, max: u32) -> Result<(), RecvWr> {
        if self.0.pool.len() >= max as usize {
            return Err(wr);
        }
        self.0.pool.push_back(wr);
        Ok(())
    }

    /// Hands the pool's WRs to the attached QPs, the neediest first.
    pub(crate) fn refill_all(mut self) {
        self.0.distribute();
    }
}

/// The QPs that receive into one CQ and take their WRs from an SRQ, by QP number: a poll
/// that returns one of their receive completions hands the QP its next WR.
#[derive(Default)]
pub(crate) struct SrqMembers(Mutex<HashMap<u32, Arc<SrqPool>>>);

impl SrqMembers {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Arc<SrqPool>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands an SRQ's next WR to each QP whose receive WR completed in `wcs`.
    pub(crate) fn completed(&self, wcs: &[WorkCompletion]) {
        let is_recv =
            |w: &&WorkCompletion| matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        // The common poll (empty, or send completions only) takes no lock.
        if !wcs.iter().any(|w| is_recv(&w)) {
            return;
        }
        let map = self.lock();
        for w in wcs.iter().filter(is_recv) {
            if let Some(srq) = map.get(&w.qp_num) {
                // A flushed WR means the QP is in ERR: nothing more goes to it.
                srq.consumed(w.qp_num, w.status == WcStatus::Success);
            }
        }
    }
}

/// An RC QP's tie to its SRQ: the pool, and the members of its receive CQ.
pub(crate) struct SrqLink {
    pool: Arc<SrqPool>,
    members: Arc<SrqMembers>,
}

impl SrqLink {
    /// The tie of a QP receiving into the CQ of `members` to `pool`.
    pub(crate) fn new(pool: Arc<SrqPool>, members: Arc<SrqMembers>) -> SrqLink {
        SrqLink { pool, members }
    }

    /// Attaches QP `qpn` (engine QP `qp`, which stays where it is until [`SrqLink::detach`])
    /// and gives it its share.
    pub(crate) fn attach(&self, qpn: u32, qp: *const VQp) {
        self.members.lock().insert(qpn, Arc::clone(&self.pool));
        self.pool.attach(qpn, qp);
    }

    /// Detaches `qpn`; call before its QP is dropped.
    pub(crate) fn detach(&self, qpn: u32) {
        self.pool.detach(qpn);
        self.members.lock().remove(&qpn);
    }

    /// See [`SrqPool::state_changed`].
    pub(crate) fn state_changed(&self, qpn: u32, state: u32) {
        self.pool.state_changed(qpn, state);
    }
}

/// An SRQ as handed to the application: `ibv_srq` first.
#[repr(C)]
pub(crate) struct Srq {
    ibv: IbvSrq,
    pub pool: Arc<SrqPool>,
    pub max_wr: u32,
}

impl Srq {
    /// # Safety
    /// `srq` is NULL or made by ibv_create_srq and not destroyed.
    pub(crate) unsafe fn from_ibv<'a>(srq: *mut c_void) -> Option<&'a Srq> {
        // SAFETY: the caller's contract; `ibv` is the first field.
        (!srq.is_null()).then(|| unsafe { &*(srq as *const Srq) })
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_srq(
    pd: *mut IbvPd,
    init: *mut IbvSrqInitAttr,
) -> *mut IbvSrq {
    if crate::pd::check(pd, "create_srq").is_err() || init.is_null() {
        return null(libc::EINVAL);
    }
    if live::count(Kind::Srq) >= MAX_SRQ as usize {
        log::error!("create_srq: {MAX_SRQ} SRQs exist (max_srq)");
        return null(libc::ENOMEM);
    }
    // SAFETY: a live PD, and the caller's initialised ibv_srq_init_attr.
    let (ctx, a) = unsafe { ((*pd).context, &mut *init) };
    if a.attr.max_wr > MAX_SRQ_WR || a.attr.max_sge > 1 {
        log::error!(
            "create_srq: max_wr {} (<= {MAX_SRQ_WR}) or max_sge {} (1) out of range",
            a.attr.max_wr,
            a.attr.max_sge
        );
        return null(libc::EINVAL);
    }
    let max_wr = a.attr.max_wr.max(1);
    a.attr.max_wr = max_wr;
    a.attr.max_sge = 1;
    let b = Box::new(Srq {
        ibv: IbvSrq {
            context: ctx,
            srq_context: a.srq_context,
            pd,
            handle: 0,
            _pad: 0,
            mutex: [0; 40],
            cond: [0; 48],
            events_completed: 0,
            _pad2: 0,
        },
        pool: Arc::new(SrqPool {
            state: Mutex::new(State::default()),
        }),
        max_wr,
    });
    // SAFETY: a live PD.
    unsafe { Pd::of(pd) }.hold();
    let s = Box::into_raw(b);
    live::add(Kind::Srq, s, ctx);
    s as *mut IbvSrq
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_srq(srq: *mut IbvSrq) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_destroy_srq(srq) })
}

/// The work of [`bv_ibv_destroy_srq`]: 0, or the errno it returns (and sets).
unsafe fn ibv_destroy_srq(srq: *mut IbvSrq) -> c_int {
    if let Err(e) = live::check(Kind::Srq, srq, "destroy_srq") {
        return e;
    }
    // SAFETY: a live SRQ.
    let Some(s) = (unsafe { Srq::from_ibv(srq as *mut c_void) }) else {
        return libc::EINVAL;
    };
    if s.pool.has_members() {
        log::error!("destroy_srq: QPs still take their receive WRs from it");
        return libc::EBUSY;
    }
    live::take(Kind::Srq, srq);
    // SAFETY: a live SRQ's PD outlives it (it refuses to go while the SRQ lives).
    unsafe { Pd::of((*srq).pd) }.release();
    // SAFETY: made by ibv_create_srq; the caller gives it up.
    unsafe { free::<Srq, _>(srq) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_modify_srq(
    srq: *mut IbvSrq,
    attr: *mut IbvSrqAttr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_modify_srq(srq, attr, mask) })
}

/// The work of [`bv_ibv_modify_srq`]: 0, or the errno it returns (and sets).
unsafe fn ibv_modify_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr, mask: c_int) -> c_int {
    // SAFETY: the caller passes a live SRQ.
    if unsafe { Srq::from_ibv(srq as *mut c_void) }.is_none() || attr.is_null() {
        return libc::EINVAL;
    }
    // IBV_SRQ_MAX_WR (resize) is not supported; IBV_SRQ_LIMIT (an event when the pool runs
    // low) is accepted, and the event never fires: the pool hands WRs out on demand.
    if mask & 1 != 0 {
        return libc::EOPNOTSUPP;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_query_srq(srq, attr) })
}

/// The work of [`bv_ibv_query_srq`]: 0, or the errno it returns (and sets).
unsafe fn ibv_query_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr) -> c_int {
    // SAFETY: the caller passes a live SRQ.
    let Some(s) = (unsafe { Srq::from_ibv(srq as *mut c_void) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes an ibv_srq_attr.
    unsafe {
        attr.write(IbvSrqAttr {
            max_wr: s.max_wr,
            max_sge: 1,
            srq_limit: 0,
        })
    };
    0
}
