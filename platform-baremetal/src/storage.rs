//! The engine's tables in fixed arrays: capacities are const generics, nothing is
//! allocated, and running out is the engine's `OutOfResources` error.

use bluerdma_core::engine::{
    CqSlot, EarlyRecv, MrSlot, QpSlot, QpTimers, RecvEntry, Slices, Storage, WorkCompletion, Wqe,
};

/// Receive WRs peers may announce for QPs not connected yet (the soft-core has few QPs).
pub const EARLY_RECVS: usize = 64;
/// Receive WRs of all QPs (posted here, or announced by peers): half may be reserved by
/// the QPs' `max_recv_wr`.
pub const RECVS: usize = 64;

/// Tables for `QPS` queue pairs with `SQ_DEPTH` send WQEs each on average, `CQS`
/// completion queues of `CQ_DEPTH` completions each on average (each QP and CQ takes the
/// part of the shared table it asks for at creation), and `MRS` memory-region slots (slot
/// 0 is reserved by the card, so `MRS` must be at least 2 to register anything).
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
    recvs: [RecvEntry; RECVS],
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
            recvs: [RecvEntry::default(); RECVS],
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
            recvs: &mut self.recvs,
            early: &mut self.early,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_hold_depth_entries_per_object() {
        let mut s = StaticStorage::<3, 8, 2, 16, 5>::new();
        let t = s.slices();
        assert_eq!(t.recvs.len(), RECVS);
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
