//! Receive WRs of several SGEs on RC QPs. The card writes a SEND into the one buffer the
//! receiver announced, so a receive WR with several SGEs is posted as one WR into the QP's
//! bounce ring (registered on first use), and the poll that returns its completion copies
//! the message into the WR's SGEs, in order, and gives the completion the WR's own wr_id.
//! A receive WR of one SGE (the common case) is posted as it is, and only polls of a CQ
//! that has such a QP look here.
//!
//! The engine knows the bounced WR by a token in place of its wr_id, drawn from a per-QP
//! sequence above a per-process random base; receive completions come in posting order, so
//! a completion is a bounced WR's when it carries the oldest live token.

use core::ffi::c_int;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::{RecvWr, WcStatus, WorkCompletion};
use bluerdma_core::keys::MrKey;
use bluerdma_linux::verbs::Mr as VMr;

use crate::abi::IbvSge;
use crate::caps::MAX_SGE;
use crate::errors::fail;
use crate::pd::Pd;

/// Bytes of a QP's bounce ring: the bounced receive WRs posted and not completed.
const RING_BYTES: usize = 4 << 20;

/// The base of every token (high bits set, the rest random per process).
fn token_base() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    *BASE.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mixed = (t ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        0xB000_0000_0000_0000 | (mixed & 0x0FFF_FFFF_0000_0000)
    })
}

/// A bounced receive WR: where its message lands, and where it goes.
struct Bounced {
    token: u64,
    wr_id: u64,
    at: usize,
    len: usize,
    sges: [IbvSge; MAX_SGE],
    n: usize,
}

/// One QP's bounce ring and its bounced WRs, oldest first.
#[derive(Default)]
pub(crate) struct QpScatter {
    ring: Option<VMr>,
    head: usize,
    live: VecDeque<Bounced>,
    next: u64,
}

impl QpScatter {
    /// Stages a receive WR of several SGEs (each checked against the PD by the caller):
    /// the engine's WR into the bounce ring.
    pub(crate) fn stage(&mut self, pd: &Pd, wr_id: u64, sges: &[IbvSge]) -> Result<RecvWr, c_int> {
        let len: usize = sges.iter().map(|s| s.length as usize).sum();
        if len > RING_BYTES || sges.len() > MAX_SGE {
            log::error!(
                "post_recv: {len} bytes in {} SGEs (at most {RING_BYTES})",
                sges.len()
            );
            return Err(libc::EINVAL);
        }
        if self.ring.is_none() {
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            self.ring = Some(pd.pd.alloc_mr(RING_BYTES, access).map_err(fail)?);
        }
        let at = match self.live.front() {
            None => 0,
            Some(oldest) if self.head >= oldest.at => {
                if self.head + len <= RING_BYTES {
                    self.head
                } else if len <= oldest.at {
                    0
                } else {
                    return Err(libc::ENOMEM);
                }
            }
            Some(oldest) if self.head + len <= oldest.at => self.head,
            Some(_) => return Err(libc::ENOMEM),
        };
        let ring = self.ring.as_ref().ok_or(libc::ENOMEM)?;
        let (base, key) = (ring.addr(), ring.key());
        let token = token_base() | (self.next & 0xFFFF_FFFF);
        self.next += 1;
        let mut b = Bounced {
            token,
            wr_id,
            at,
            len,
            sges: [IbvSge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE],
            n: sges.len(),
        };
        b.sges[..sges.len()].copy_from_slice(sges);
        self.live.push_back(b);
        self.head = at + len;
        Ok(RecvWr {
            wr_id: token,
            addr: VirtAddr(base + at as u64),
            len: len as u32,
            lkey: MrKey::from_raw(key.get()),
        })
    }

    /// Gives back the newest staged WR (the engine refused it).
    pub(crate) fn unstage(&mut self) {
        if self.live.pop_back().is_some() {
            self.head = self.live.back().map_or(0, |b| b.at + b.len);
        }
    }

    /// The QP was reset: the engine forgot its receive WRs.
    pub(crate) fn reset(&mut self) {
        self.live.clear();
        self.head = 0;
    }

    /// A receive completion of this QP: when it is the oldest bounced WR's, its message is
    /// copied into the WR's SGEs and the completion takes the WR's wr_id.
    fn complete(&mut self, w: &mut WorkCompletion) {
        if self.live.front().is_none_or(|b| b.token != w.wr_id) {
            return;
        }
        let Some(b) = self.live.pop_front() else {
            return;
        };
        w.wr_id = b.wr_id;
        if w.status != WcStatus::Success {
            return;
        }
        let Some(ring) = self.ring.as_ref() else {
            return;
        };
        let mut left = (w.byte_len as usize).min(b.len);
        let mut from = ring.addr() as usize + b.at;
        for s in &b.sges[..b.n] {
            let n = left.min(s.length as usize);
            // SAFETY: the ring holds the message (the completion says it arrived); the SGE
            // lies in a region of the QP's PD with local write (checked at post), and the
            // verbs contract gives it to the WR until this completion is returned.
            unsafe { std::ptr::copy_nonoverlapping(from as *const u8, s.addr as *mut u8, n) };
            from += n;
            left -= n;
        }
    }

    fn idle(&self) -> bool {
        self.live.is_empty()
    }
}

/// The QPs of one receive CQ that bounce receive WRs, by QP number.
#[derive(Default)]
pub(crate) struct ScatterUsers {
    any: AtomicBool,
    map: Mutex<HashMap<u32, Arc<Mutex<QpScatter>>>>,
}

impl ScatterUsers {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Arc<Mutex<QpScatter>>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// QP `qpn` bounces receive WRs into `state`.
    pub(crate) fn register(&self, qpn: u32, state: &Arc<Mutex<QpScatter>>) {
        self.lock().insert(qpn, Arc::clone(state));
        self.any.store(true, Ordering::Release);
    }

    /// Finishes the bounced WRs among `wcs`, in place.
    pub(crate) fn completed(&self, wcs: &mut [WorkCompletion]) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut map = self.lock();
        for w in wcs.iter_mut() {
            if let Some(s) = map.get(&w.qp_num) {
                s.lock().unwrap_or_else(|e| e.into_inner()).complete(w);
            }
        }
        // A QP that is gone and has nothing bounced left needs no more looking at.
        map.retain(|_, s| Arc::strong_count(s) > 1 || !s.lock().is_ok_and(|s| s.idle()));
        self.any.store(!map.is_empty(), Ordering::Release);
    }
}
