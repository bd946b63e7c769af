//! Heap storage for the engine's tables on a std host.

use bluerdma_core::engine::{
    CqSlot, EarlyRecv, MrSlot, QpSlot, QpTimers, Slices, Storage, WorkCompletion, Wqe,
};
use bluerdma_core::keys::MR_TABLE_LEN;

/// The engine's tables in vectors, sized once at open.
pub struct HeapStorage {
    qps: Vec<QpSlot>,
    wqes: Vec<Wqe>,
    timers: Vec<QpTimers>,
    cqs: Vec<CqSlot>,
    cqes: Vec<WorkCompletion>,
    mrs: Vec<MrSlot>,
    early: Vec<EarlyRecv>,
    sq_depth: usize,
    cq_depth: usize,
}

/// How many objects a device can hold.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// Queue pairs (the card has 1023).
    pub qps: usize,
    /// Send WQEs per QP.
    pub sq_depth: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Completions per CQ.
    pub cq_depth: usize,
    /// Memory regions (the card has 8191 usable).
    pub mrs: usize,
    /// Receive WRs peers may announce for QPs not at RTR yet (see `Slices::early`).
    pub early_recvs: usize,
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            qps: 256,
            sq_depth: 512,
            cqs: 64,
            cq_depth: 8192,
            mrs: 1024,
            // Eight peers announcing a full 512-entry receive queue each before we connect.
            early_recvs: 4096,
        }
    }
}

impl HeapStorage {
    /// Tables of the given capacity.
    pub fn new(c: Capacity) -> Self {
        Self {
            qps: vec![QpSlot::default(); c.qps.min(1023)],
            wqes: vec![Wqe::default(); c.qps.min(1023) * c.sq_depth],
            timers: vec![QpTimers::default(); c.qps.min(1023)],
            cqs: vec![CqSlot::default(); c.cqs],
            cqes: vec![WorkCompletion::EMPTY; c.cqs * c.cq_depth],
            mrs: vec![MrSlot::default(); c.mrs.min(MR_TABLE_LEN as usize)],
            early: vec![EarlyRecv::default(); c.early_recvs],
            sq_depth: c.sq_depth,
            cq_depth: c.cq_depth,
        }
    }
}

impl Storage for HeapStorage {
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
        self.sq_depth
    }
    fn cq_depth(&self) -> usize {
        self.cq_depth
    }
}
