//! The engine's object tables for a [`super::Pair`]: vectors sized once from the
//! [`super::PairConfig`], small by default so that a test's two engines cost little to open.

use bluerdma_core::engine::{
    CqSlot, EarlyRecv, MrSlot, QpSlot, QpTimers, RecvEntry, Slices, Storage, WorkCompletion, Wqe,
    READ_RESPONSE_ROOM,
};

/// Receive WRs each QP of a pair may post (the table holds as many again for its peer's).
pub const PAIR_RECV_WRS: usize = 512;

/// The tables of one engine.
pub struct PairStorage {
    qps: Vec<QpSlot>,
    wqes: Vec<Wqe>,
    timers: Vec<QpTimers>,
    cqs: Vec<CqSlot>,
    cqes: Vec<WorkCompletion>,
    mrs: Vec<MrSlot>,
    recvs: Vec<RecvEntry>,
    early: Vec<EarlyRecv>,
}

impl PairStorage {
    /// Tables for `qps` QPs of `sq_depth` send WQEs (and room for their READ responses),
    /// `cqs` CQs of `cq_depth` completions, [`PAIR_RECV_WRS`] receive WRs per QP each way,
    /// `mrs` MRs and `early` receive WRs announced before their QP connects.
    pub fn new(
        qps: usize,
        sq_depth: usize,
        cqs: usize,
        cq_depth: usize,
        mrs: usize,
        early: usize,
    ) -> Self {
        Self {
            qps: vec![QpSlot::default(); qps],
            wqes: vec![Wqe::default(); qps * (sq_depth + READ_RESPONSE_ROOM as usize)],
            timers: vec![QpTimers::default(); qps],
            cqs: vec![CqSlot::default(); cqs],
            cqes: vec![WorkCompletion::EMPTY; cqs * cq_depth],
            mrs: vec![MrSlot::default(); mrs],
            recvs: vec![RecvEntry::default(); qps * 2 * PAIR_RECV_WRS],
            early: vec![EarlyRecv::default(); early],
        }
    }
}

impl Storage for PairStorage {
    fn slices(&mut self) -> Slices<'_> {
        Slices {
            qps: &mut self.qps,
            wqes: &mut self.wqes,
            timers: &mut self.timers,
            cqs: &mut self.cqs,
            cqes: &mut self.cqes,
            mrs: &mut self.mrs,
            recvs: &mut self.recvs,
            early: &mut self.early,
        }
    }
}
