//! The engine's tables in fixed arrays: capacities are const generics, nothing is
//! allocated, and running out is the engine's `OutOfResources` error.

use bluerdma_core::engine::{
    CqSlot, EarlyRecv, MrSlot, QpSlot, QpTimers, Slices, Storage, WorkCompletion, Wqe,
};

/// Receive WRs peers may announce for QPs not connected yet (the soft-core has few QPs).
pub const EARLY_RECVS: usize = 64;

/// Tables for `QPS` queue pairs of `SQ_DEPTH` send WQEs each, `CQS` completion queues of
/// `CQ_DEPTH` completions each, and `MRS` memory-region slots (slot 0 is reserved by the
/// card, so `MRS` must be at least 2 to register anything).
pub struct StaticStorage<
    const QPS: usize,
    const SQ_DEPTH: usize,
    const CQS: usize,
    const CQ_DEPTH: usize,
    const MRS: usize,
> {
    qps: [QpSlot; QPS],
    wqes: [[Wqe; SQ_DEPTH]; QPS],
    timers: [QpTimers; QPS],
    cqs: [CqSlot; CQS],
    cqes: [[WorkCompletion; CQ_DEPTH]; CQS],
    mrs: [MrSlot; MRS],
    early: [EarlyRecv; EARLY_RECVS],
}

impl<
        const QPS: usize,
        const SQ_DEPTH: usize,
        const CQS: usize,
        const CQ_DEPTH: usize,
        const MRS: usize,
    > StaticStorage<QPS, SQ_DEPTH, CQS, CQ_DEPTH, MRS>
{
    /// Empty tables.
    pub fn new() -> Self {
        Self {
            qps: core::array::from_fn(|_| QpSlot::default()),
            wqes: [[Wqe::default(); SQ_DEPTH]; QPS],
            timers: [QpTimers::default(); QPS],
            cqs: [CqSlot::default(); CQS],
            cqes: [[WorkCompletion::EMPTY; CQ_DEPTH]; CQS],
            mrs: [MrSlot::default(); MRS],
            early: [EarlyRecv::default(); EARLY_RECVS],
        }
    }
}

impl<
        const QPS: usize,
        const SQ_DEPTH: usize,
        const CQS: usize,
        const CQ_DEPTH: usize,
        const MRS: usize,
    > Default for StaticStorage<QPS, SQ_DEPTH, CQS, CQ_DEPTH, MRS>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<
        const QPS: usize,
        const SQ_DEPTH: usize,
        const CQS: usize,
        const CQ_DEPTH: usize,
        const MRS: usize,
    > Storage for StaticStorage<QPS, SQ_DEPTH, CQS, CQ_DEPTH, MRS>
{
    fn slices(&mut self) -> Slices<'_> {
        Slices {
            qps: &mut self.qps,
            wqes: self.wqes.as_flattened_mut(),
            timers: &mut self.timers,
            cqs: &mut self.cqs,
            cqes: self.cqes.as_flattened_mut(),
            mrs: &mut self.mrs,
            early: &mut self.early,
        }
    }
    fn sq_depth(&self) -> usize {
        SQ_DEPTH
    }
    fn cq_depth(&self) -> usize {
        CQ_DEPTH
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_hold_depth_entries_per_object() {
        let mut s = StaticStorage::<3, 8, 2, 16, 5>::new();
        assert_eq!((s.sq_depth(), s.cq_depth()), (8, 16));
        let t = s.slices();
        assert_eq!(
            (
                t.qps.len(),
                t.wqes.len(),
                t.cqs.len(),
                t.cqes.len(),
                t.mrs.len()
            ),
            (3, 24, 2, 32, 5)
        );
        assert!(t.qps.iter().all(|q| !q.in_use()) && t.mrs.iter().all(|m| !m.in_use()));
    }
}
