//! Completion queues: each owns `cq_depth` completions of the shared table, as a ring.

use super::error::VerbsError;
use super::storage::{CqRing, Slices};
use super::wr::WorkCompletion;
use super::{Device, EngineStats, Platform, Storage};

/// A completion queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct CqSlot {
    pub(super) in_use: bool,
    /// Index of the oldest completion.
    head: u32,
    /// Number of completions queued.
    pub(super) len: u32,
    /// Completions dropped because the CQ was full (a CQ overrun).
    pub(super) overruns: u64,
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Creates a completion queue; returns its handle.
    pub fn create_cq(&mut self) -> Result<u32, VerbsError> {
        let s = self.storage.slices();
        let i = s
            .cqs
            .iter()
            .position(|c| !c.in_use)
            .ok_or(VerbsError::OutOfResources {
                what: "completion queues",
            })?;
        s.cqs[i] = CqSlot {
            in_use: true,
            ..CqSlot::default()
        };
        Ok(i as u32)
    }

    /// Destroys a completion queue; refused while a QP uses it.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<(), VerbsError> {
        let s = self.storage.slices();
        if !s.cqs.get(cq as usize).is_some_and(|c| c.in_use) {
            return Err(VerbsError::NoSuchObject {
                what: "CQ",
                handle: cq,
            });
        }
        if s.qps
            .iter()
            .any(|q| q.in_use() && (q.attrs.send_cq == cq || q.attrs.recv_cq == cq))
        {
            return Err(VerbsError::Busy { what: "CQ" });
        }
        s.cqs[cq as usize] = CqSlot::default();
        Ok(())
    }

    /// Moves up to `out.len()` completions of `cq` into `out`; returns how many.
    pub fn poll_cq(&mut self, cq: u32, out: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let depth = self.storage.cq_depth();
        let s = self.storage.slices();
        let slot =
            s.cqs
                .get_mut(cq as usize)
                .filter(|c| c.in_use)
                .ok_or(VerbsError::NoSuchObject {
                    what: "CQ",
                    handle: cq,
                })?;
        let mut ring = CqRing::new(&mut slot.head, &mut slot.len, s.cqes, cq as usize, depth);
        let mut n = 0;
        for o in out.iter_mut() {
            let Some(wc) = ring.pop() else { break };
            *o = wc;
            n += 1;
        }
        Ok(n)
    }
}

/// Appends `wc` to CQ `cq`; a full CQ counts an overrun and loses the completion.
#[inline]
pub(crate) fn push_cqe(
    s: &mut Slices<'_>,
    depth: usize,
    stats: &mut EngineStats,
    cq: u32,
    wc: WorkCompletion,
) {
    let Some(slot) = s.cqs.get_mut(cq as usize).filter(|c| c.in_use) else {
        return;
    };
    let mut ring = CqRing::new(&mut slot.head, &mut slot.len, s.cqes, cq as usize, depth);
    if ring.push(wc).is_err() {
        slot.overruns += 1;
        stats.cq_overruns += 1;
        core_error!("CQ {} overrun: completion of wr_id {} lost", cq, wc.wr_id);
    }
}
