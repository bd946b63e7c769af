//! Heap storage for the engine's tables on a std host.

use bluerdma_core::engine::{
    CqSlot, EarlyRecv, MrSlot, QpSlot, QpTimers, RecvEntry, Slices, Storage, WorkCompletion, Wqe,
};
use bluerdma_core::keys::{MR_TABLE_LEN, QP_TABLE_LEN};

/// The engine's tables in vectors, sized once at open.
pub struct HeapStorage {
    qps: Vec<QpSlot>,
    wqes: Vec<Wqe>,
    timers: Vec<QpTimers>,
    cqs: Vec<CqSlot>,
    cqes: Vec<WorkCompletion>,
    mrs: Vec<MrSlot>,
    recvs: Vec<RecvEntry>,
    early: Vec<EarlyRecv>,
}

/// How many objects a device can hold. The WQE, completion and receive WR tables are
/// shared: each QP and CQ takes the part it asks for at creation (its `max_send_wr`,
/// `max_recv_wr`, `cqe`), so many small queues or a few deep ones fit.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// Queue pairs (the card has 1023: index 0 is reserved).
    pub qps: usize,
    /// Send WQEs of all QPs together.
    pub wqes: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Completions of all CQs together.
    pub cqes: usize,
    /// Memory regions (the card has 8191 usable: index 0 is reserved).
    pub mrs: usize,
    /// Receive WRs of all QPs together, posted here or announced by peers; the QPs'
    /// `max_recv_wr` may reserve half of them.
    pub recvs: usize,
    /// Receive WRs peers may announce for QPs not at RTR yet (see `Slices::early`).
    pub early_recvs: usize,
}

impl Capacity {
    /// The storage's size in bytes.
    pub fn bytes(&self) -> usize {
        use core::mem::size_of;
        let qps = self.qps.min(QP_TABLE_LEN as usize - 1);
        qps * (size_of::<QpSlot>() + size_of::<QpTimers>())
            + self.wqes * size_of::<Wqe>()
            + self.cqs * size_of::<CqSlot>()
            + self.cqes * size_of::<WorkCompletion>()
            + self.mrs.min(MR_TABLE_LEN as usize) * size_of::<MrSlot>()
            + self.recvs * size_of::<RecvEntry>()
            + self.early_recvs * size_of::<EarlyRecv>()
    }
}

impl Default for Capacity {
    /// The card's tables (1023 QPs, 8192 MR slots), 1024 CQs, and 128 Ki send WQEs, 128 Ki
    /// completions and 256 Ki receive WRs shared by them: two QPs may be 8192 deep with 6
    /// SGEs per request, or all 1023 of them 100 deep (about 25 MiB in all).
    fn default() -> Self {
        Self {
            qps: QP_TABLE_LEN as usize - 1,
            wqes: 128 * 1024,
            cqs: 1024,
            cqes: 128 * 1024,
            mrs: MR_TABLE_LEN as usize,
            recvs: 256 * 1024,
            // Eight peers announcing a 512-entry receive queue each before we connect.
            early_recvs: 4096,
        }
    }
}

impl HeapStorage {
    /// Tables of the given capacity.
    pub fn new(c: Capacity) -> Self {
        let qps = c.qps.min(QP_TABLE_LEN as usize - 1);
        Self {
            qps: vec![QpSlot::default(); qps],
            wqes: vec![Wqe::default(); c.wqes],
            timers: vec![QpTimers::default(); qps],
            cqs: vec![CqSlot::default(); c.cqs],
            cqes: vec![WorkCompletion::EMPTY; c.cqes],
            mrs: vec![MrSlot::default(); c.mrs.min(MR_TABLE_LEN as usize)],
            recvs: vec![RecvEntry::default(); c.recvs],
            early: vec![EarlyRecv::default(); c.early_recvs],
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
            recvs: &mut self.recvs,
            early: &mut self.early,
        }
    }
}
