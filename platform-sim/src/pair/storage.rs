//! The engine's object tables for a [`super::Pair`]: vectors sized once from the
//! [`super::PairConfig`], small by default so that a test's two engines cost little to open.

use bluerdma_core::engine::{
    CqSlot, EarlyRecv, MrSlot, QpSlot, QpTimers, Slices, Storage, WorkCompletion, Wqe,
};

/// The tables of one engine.
pub struct PairStorage {
    qps: Vec<QpSlot>,
    wqes: Vec<Wqe>,
    timers: Vec<QpTimers>,
    cqs: Vec<CqSlot>,
    cqes: Vec<WorkCompletion>,
    mrs: Vec<MrSlot>,
    early: Vec<EarlyRecv>,
    depths: (usize, usize),
}

impl PairStorage {
    /// Tables for `qps` QPs of `sq_depth` send WQEs, `cqs` CQs of `cq_depth` completions,
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
            wqes: vec![Wqe::default(); qps * sq_depth],
            timers: vec![QpTimers::default(); qps],
            cqs: vec![CqSlot::default(); cqs],
            cqes: vec![WorkCompletion::EMPTY; cqs * cq_depth],
            mrs: vec![MrSlot::default(); mrs],
            early: vec![EarlyRecv::default(); early],
            depths: (sq_depth, cq_depth),
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
            early: &mut self.early,
        }
    }

    fn sq_depth(&self) -> usize {
        self.depths.0
    }

    fn cq_depth(&self) -> usize {
        self.depths.1
    }
}
