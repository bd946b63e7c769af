//! Completion queues: each holds the `cqe` completions its creator asked for, as a ring in
//! its own range of the shared completion table. A completion that finds its CQ full is
//! never dropped silently: the CQ is in error from then on (IBV_EVENT_CQ_ERR), and every
//! QP that completes into it goes to ERR (IBV_EVENT_QP_FATAL), as on a real card.

use super::error::VerbsError;
use super::events::AsyncEvent;
use super::ranges::Range;
use super::storage::CqRing;
use super::wr::WorkCompletion;
use super::{Device, Platform, Storage};
use crate::qp::QpState;

/// A completion queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct CqSlot {
    pub(super) in_use: bool,
    /// Index of the oldest completion (in the ring).
    head: u32,
    /// Number of completions queued.
    pub(super) len: u32,
    /// Completions it holds (what its creator asked for).
    cap: u32,
    ring: Range,
    /// Completions dropped because the CQ was full (a CQ overrun).
    pub(super) overruns: u64,
    /// It overran and its QPs have not been moved to ERR yet.
    error_pending: bool,
}

impl CqSlot {
    fn ring<'a>(&'a mut self, cqes: &'a mut [WorkCompletion]) -> CqRing<'a> {
        CqRing::new(&mut self.head, &mut self.len, self.cap, cqes, self.ring)
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Creates a completion queue of `cqe` completions; returns its handle.
    pub fn create_cq(&mut self, cqe: u32) -> Result<u32, VerbsError> {
        if cqe == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "a CQ holds at least 1 completion",
            });
        }
        let s = self.storage.slices();
        let i = s
            .cqs
            .iter()
            .position(|c| !c.in_use)
            .ok_or(VerbsError::OutOfResources {
                what: "completion queues",
            })?;
        let ring = self
            .cqe_ranges
            .alloc(cqe)
            .ok_or(VerbsError::OutOfResources {
                what: "completion table (the CQ is larger than the free part of it)",
            })?;
        s.cqs[i] = CqSlot {
            in_use: true,
            cap: cqe,
            ring,
            ..CqSlot::default()
        };
        Ok(i as u32)
    }

    fn cq_slot(&mut self, cq: u32) -> Result<&mut CqSlot, VerbsError> {
        self.storage
            .slices()
            .cqs
            .get_mut(cq as usize)
            .filter(|c| c.in_use)
            .ok_or(VerbsError::NoSuchObject {
                what: "CQ",
                handle: cq,
            })
    }

    /// Destroys a completion queue; refused while a QP uses it.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<(), VerbsError> {
        let ring = self.cq_slot(cq)?.ring;
        let s = self.storage.slices();
        if s.qps
            .iter()
            .any(|q| q.in_use() && (q.attrs.send_cq == cq || q.attrs.recv_cq == cq))
        {
            return Err(VerbsError::Busy { what: "CQ" });
        }
        s.cqs[cq as usize] = CqSlot::default();
        self.cqe_ranges.free(ring);
        Ok(())
    }

    /// Changes how many completions `cq` holds. Refused below the completions it holds now
    /// (they would be lost); the queued ones keep their order.
    pub fn resize_cq(&mut self, cq: u32, cqe: u32) -> Result<(), VerbsError> {
        let slot = *self.cq_slot(cq)?;
        if cqe == 0 || cqe < slot.len {
            return Err(VerbsError::InvalidArgument {
                what: "a CQ cannot shrink below the completions it holds (poll them first)",
            });
        }
        let moved = match self.cqe_ranges.resize_in_place(slot.ring, cqe) {
            Some(r) => r,
            None => {
                let r = self
                    .cqe_ranges
                    .alloc(cqe)
                    .ok_or(VerbsError::OutOfResources {
                        what: "completion table (no free range of that size)",
                    })?;
                self.cqe_ranges.free(slot.ring);
                r
            }
        };
        let s = self.storage.slices();
        let c = &mut s.cqs[cq as usize];
        c.ring(s.cqes).linearize();
        let from = c.ring.base as usize;
        s.cqes
            .copy_within(from..from + c.len as usize, moved.base as usize);
        c.ring = moved;
        c.cap = cqe;
        Ok(())
    }

    /// Moves up to `out.len()` completions of `cq` into `out`; returns how many.
    pub fn poll_cq(&mut self, cq: u32, out: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        self.cq_slot(cq)?;
        let s = self.storage.slices();
        let mut ring = s.cqs[cq as usize].ring(s.cqes);
        let mut n = 0;
        for o in out.iter_mut() {
            let Some(wc) = ring.pop() else { break };
            *o = wc;
            n += 1;
        }
        // Polled send completions give their QPs' places back.
        for o in out[..n].iter_mut() {
            let slots = core::mem::take(&mut o.sq_slots);
            if slots > 0 {
                if let Ok(i) = self.qp_index(crate::keys::Qpn::from_raw(o.qp_num)) {
                    self.qp(i).req.sq.polled(slots);
                }
            }
        }
        Ok(n)
    }

    /// Drops the completions of QP `qpn` still queued in `cq`, keeping the others in order:
    /// a QP moved to RESET takes its completions with it, as rdma-core's providers clean
    /// the CQ (a flushed receive WR of a QP that is then reset and reconnected must not
    /// surface in its next traffic).
    pub(crate) fn purge_completions(&mut self, cq: u32, qpn: u32) {
        let s = self.storage.slices();
        let Some(slot) = s.cqs.get_mut(cq as usize).filter(|c| c.in_use) else {
            return;
        };
        let n = slot.len;
        let mut ring = slot.ring(s.cqes);
        for _ in 0..n {
            if let Some(wc) = ring.pop().filter(|wc| wc.qp_num != qpn) {
                // Room: one was just taken.
                let _ = ring.push(wc);
            }
        }
    }

    /// How many completions `cq` holds (0 for a CQ that does not exist).
    pub fn cq_len(&mut self, cq: u32) -> usize {
        self.cq_slot(cq).map_or(0, |c| c.len as usize)
    }

    /// Adds a completion made outside the engine (a software transport such as UD) to
    /// `cq`, under the same rule as the engine's own: a full CQ overruns.
    pub fn push_completion(&mut self, cq: u32, wc: WorkCompletion) -> Result<(), VerbsError> {
        self.cq_slot(cq)?;
        self.complete(cq, wc);
        Ok(())
    }

    /// Appends `wc` to CQ `cq`. A full CQ loses it and overruns: the CQ raises CQ_ERR once
    /// and its QPs go to ERR on the next poll.
    #[inline]
    pub(crate) fn complete(&mut self, cq: u32, wc: WorkCompletion) {
        let s = self.storage.slices();
        let Some(slot) = s.cqs.get_mut(cq as usize).filter(|c| c.in_use) else {
            return;
        };
        if slot.ring(s.cqes).push(wc).is_ok() {
            return;
        }
        slot.overruns += 1;
        self.stats.cq_overruns += 1;
        if slot.overruns == 1 {
            core_error!(
                "CQ {} overrun ({} completions): completion of wr_id {} lost; the CQ is in error and its QPs go to ERR",
                cq,
                slot.cap,
                wc.wr_id
            );
            slot.error_pending = true;
            self.cq_errors_pending = true;
            self.events.raise(AsyncEvent::CqError { cq });
        }
    }

    /// Moves the QPs of every CQ that overran to ERR (from `poll`: not while a completion
    /// is being pushed).
    pub(crate) fn handle_cq_errors(&mut self) -> bool {
        if !core::mem::take(&mut self.cq_errors_pending) {
            return false;
        }
        for cq in 0..self.storage.slices().cqs.len() as u32 {
            let slot = &mut self.storage.slices().cqs[cq as usize];
            if !core::mem::take(&mut slot.error_pending) {
                continue;
            }
            for i in self.qp_indices() {
                let a = self.qp(i).attrs;
                let uses = a.send_cq == cq || a.recv_cq == cq;
                if self.qp(i).in_use() && uses && a.state != QpState::Err {
                    self.fatal(i);
                }
            }
        }
        true
    }
}
