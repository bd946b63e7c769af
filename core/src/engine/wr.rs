//! What the application hands the engine and gets back: send and receive work requests, and
//! work completions (the `ibv_wc_*` values).

use crate::addr::VirtAddr;
use crate::keys::MrKey;
use crate::oob::AtomicOp;

/// Work-completion status (the `ibv_wc_status` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WcStatus {
    /// Completed successfully.
    Success = 0,
    /// A receive buffer was too small for the SEND.
    LocLenErr = 1,
    /// The responder's receive buffer is too small for the SEND, or the responder refused
    /// an atomic as invalid (misaligned, or it takes no atomics).
    RemInvReqErr = 9,
    /// The responder refused an atomic: rkey, bounds or REMOTE_ATOMIC access.
    RemAccessErr = 10,
    /// The responder could not execute an atomic on its memory.
    RemOpErr = 11,
    /// The local QP could not carry out the request (a SEND_WITH_INV to a peer whose driver
    /// does not take remote invalidations).
    LocQpOpErr = 2,
    /// A local key or address was invalid.
    LocProtErr = 4,
    /// The QP went to the error state before this request completed.
    WrFlushErr = 5,
    /// A memory-window bind or invalidation was refused (the window, MR, range or access).
    MwBindErr = 6,
    /// No acknowledgement after `retry_cnt` retransmissions.
    RetryExcErr = 12,
    /// The responder had no receive buffer after `rnr_retry` attempts.
    RnrRetryExcErr = 13,
}

/// Work-completion opcode (the `ibv_wc_opcode` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND (or SEND_WITH_IMM) completed.
    Send = 0,
    /// An RDMA WRITE (or WRITE_WITH_IMM) completed.
    RdmaWrite = 1,
    /// An RDMA READ completed.
    RdmaRead = 2,
    /// An atomic compare-and-swap completed.
    CompSwap = 3,
    /// An atomic fetch-and-add completed.
    FetchAdd = 4,
    /// A memory window was bound.
    BindMw = 5,
    /// A memory window was invalidated (IBV_WR_LOCAL_INV).
    LocalInv = 6,
    /// A receive completed (a SEND arrived).
    Recv = 128,
    /// An RDMA WRITE_WITH_IMM arrived.
    RecvRdmaWithImm = 129,
}

/// `wc_flags`: IBV_WC_WITH_IMM.
pub const WC_WITH_IMM: u32 = 2;
/// `wc_flags`: IBV_WC_WITH_INV (a SEND_WITH_INV arrived: `imm_data` is the invalidated
/// rkey).
pub const WC_WITH_INV: u32 = 8;

/// A work completion, as `poll_cq` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives, READs, 8 for an atomic).
    pub byte_len: u32,
    /// Immediate data (with [`WC_WITH_IMM`]), or the invalidated rkey (with
    /// [`WC_WITH_INV`]), as in `ibv_wc`'s union.
    pub imm_data: u32,
    /// The local QP.
    pub qp_num: u32,
    /// The remote QP (receives).
    pub src_qp: u32,
    /// IBV_WC_* flags.
    pub wc_flags: u32,
    /// The engine's own bookkeeping: the send-queue places this completion frees when it
    /// is polled (its WQE and the unsignaled ones before it: a send queue holds
    /// `max_send_wr` requests until their completions are polled, as on a real card).
    /// Always 0 in the completions `poll_cq` returns; leave it 0 in ones made elsewhere.
    pub sq_slots: u32,
}

impl WorkCompletion {
    /// An all-zero completion (to initialise caller buffers).
    pub const EMPTY: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_data: 0,
        qp_num: 0,
        src_qp: 0,
        wc_flags: 0,
        sq_slots: 0,
    };
}

/// The operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate data.
    WriteWithImm(u32),
    /// RDMA READ into the local buffer.
    Read,
    /// SEND (needs the out-of-band receive announcements of issue D).
    Send,
    /// SEND with immediate data (issue D).
    SendWithImm(u32),
    /// SEND that invalidates the peer's memory window of this rkey before its receive
    /// completes (IBV_WR_SEND_WITH_INV). The card's *_INV opcodes skip its MR checks, so
    /// the invalidation travels over the out-of-band channel (`engine::remote_inv`).
    SendWithInv(u32),
    /// An atomic on the 8 bytes at the remote address (8-byte aligned); the original value
    /// is written to the local buffer, whose length must be 8 and whose MR needs
    /// LOCAL_WRITE. Executed by the responder's driver (`engine::atomic`).
    Atomic(AtomicOp),
}

/// A send work request (one SGE: the card takes one buffer per request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local buffer address.
    pub laddr: VirtAddr,
    /// Local buffer length.
    pub len: u32,
    /// Local key of the buffer's MR.
    pub lkey: MrKey,
    /// Remote address (WRITE, READ, atomics).
    pub raddr: VirtAddr,
    /// Remote key (WRITE, READ, atomics).
    pub rkey: MrKey,
    /// Generate a completion on success.
    pub signaled: bool,
    /// Set the solicited-event bit.
    pub solicited: bool,
}

/// A receive work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's id.
    pub wr_id: u64,
    /// Buffer address (0 with no SGE).
    pub addr: VirtAddr,
    /// Buffer length.
    pub len: u32,
    /// Buffer's lkey.
    pub lkey: MrKey,
}
