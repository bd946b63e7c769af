//! Placeholder; filled in by the OOB codec work.

/// A receive WR as announced over the out-of-band channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RecvWr {
    /// The receiver's work-request id.
    pub wr_id: u64,
    /// Receive buffer address (0 with no SGE).
    pub addr: u64,
    /// Receive buffer length.
    pub length: u32,
    /// The buffer's lkey (used as rkey by the sender).
    pub lkey: u32,
    /// The responder's own QPN.
    pub qpn: u32,
}
