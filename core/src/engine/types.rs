//! The engine's verbs-level types: work requests, completions, and the per-object records
//! kept in caller-provided storage (no allocation in the core).

use core::net::Ipv4Addr;

use crate::addr::VirtAddr;
use crate::desc::send::WorkReqOpcode;
use crate::keys::{MrKey, Qpn};
use crate::mac::MacAddr;
use crate::mtu::Pmtu;
use crate::qp::{QpAccessFlags, QpState, QpType};
use crate::time::Instant;
use crate::transport::{Psn, PsnBitmap, PsnRange};

/// Work-completion status (the `ibv_wc_status` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum WcStatus {
    /// Completed successfully.
    Success = 0,
    /// A receive buffer was too small for the SEND.
    LocLenErr = 1,
    /// The QP could not execute the request.
    LocQpOpErr = 2,
    /// The responder's receive buffer is too small for the SEND.
    RemInvReqErr = 9,
    /// A local key or address was invalid.
    LocProtErr = 4,
    /// The QP went to the error state before this request completed.
    WrFlushErr = 5,
    /// The responder refused access.
    RemAccessErr = 10,
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
    /// A receive completed (a SEND arrived).
    Recv = 128,
    /// An RDMA WRITE_WITH_IMM arrived.
    RecvRdmaWithImm = 129,
}

/// `wc_flags`: IBV_WC_WITH_IMM.
pub const WC_WITH_IMM: u32 = 2;

/// A work completion, as `poll_cq` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives and READs).
    pub byte_len: u32,
    /// Immediate data (with [`WC_WITH_IMM`]).
    pub imm_data: u32,
    /// The local QP.
    pub qp_num: u32,
    /// The remote QP (receives).
    pub src_qp: u32,
    /// IBV_WC_* flags.
    pub wc_flags: u32,
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
    /// Remote address (WRITE, READ).
    pub raddr: VirtAddr,
    /// Remote key (WRITE, READ).
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

/// Where a send WQE is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WqeState {
    /// Posted, not yet handed to the card (the send window or ring was full).
    #[default]
    Pending,
    /// Handed to the card; waiting for the peer's acknowledgement.
    Sent,
    /// Acknowledged (a READ also needs its response data: `read_done`).
    Acked,
}

/// A send WQE as the engine keeps it until its completion is delivered.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wqe {
    /// Caller's id.
    pub wr_id: u64,
    /// Card op code.
    pub op: Option<WorkReqOpcode>,
    /// Immediate data.
    pub imm: u32,
    /// Local buffer.
    pub laddr: u64,
    /// Local key.
    pub lkey: u32,
    /// Length.
    pub len: u32,
    /// Remote address.
    pub raddr: u64,
    /// Remote key.
    pub rkey: u32,
    /// First PSN.
    pub psn: u32,
    /// Number of PSNs the request occupies.
    pub npsn: u32,
    /// Message sequence number.
    pub msn: u16,
    /// Completion wanted.
    pub signaled: bool,
    /// Solicited event.
    pub solicited: bool,
    /// An internal READ response (no completion; answers a peer's READ request).
    pub internal: bool,
    /// State.
    pub state: WqeState,
    /// READ: the response data has arrived.
    pub read_done: bool,
    /// SEND (and WRITE_WITH_IMM with an out-of-band channel): consumes the peer's next
    /// announced receive WR; `raddr`/`rkey` are filled from it before transmission.
    pub needs_recv: bool,
}

/// A received message whose last packet was reported: completed once every PSN up to it
/// has arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgEnd {
    /// PSN of the last packet.
    pub psn: Psn,
    /// What arrived.
    pub kind: MsgKind,
    /// Immediate data.
    pub imm: u32,
    /// Message length (ONLY packets); for a multi-packet message it comes from its FIRST
    /// packet's report at delivery.
    pub len: u32,
    /// The message was one packet.
    pub only: bool,
    /// The RETH address of the message's first packet (READ responses: the requester's
    /// sink address, which identifies the READ they answer).
    pub addr: u64,
}

/// The kind of a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgKind {
    /// An RDMA WRITE: no completion on the responder.
    Write,
    /// An RDMA WRITE with immediate data: a receive completion.
    WriteImm,
    /// A SEND.
    Send,
    /// A SEND with immediate data.
    SendImm,
    /// A READ response: completes the oldest outstanding READ.
    ReadResp,
    /// A READ request: nothing to complete (its PSN is tracked like any other).
    ReadReq,
}

/// PSN window of the receive tracker (1024 PSNs).
pub const RX_WORDS: usize = 16;
/// Received-but-undelivered messages per QP.
pub const MSG_QUEUE: usize = 64;
/// Lost PSN ranges tracked per QP; when full, new losses merge into the last range.
pub const LOST_TRACKED: usize = 64;
/// FIRST packets remembered per QP (their RETH carries the message length).
pub const FIRSTS_TRACKED: usize = 32;
/// Receive WRs per QP (posted locally, and announced by the peer): perftest posts up to 512.
pub const RECV_QUEUE: usize = 512;

/// A queue pair.
#[derive(Clone, Debug)]
pub struct QpSlot {
    /// Whether the slot is in use.
    pub in_use: bool,
    /// The QP number.
    pub qpn: Qpn,
    /// QP type.
    pub qp_type: QpType,
    /// State.
    pub state: QpState,
    /// Protection domain.
    pub pd: u32,
    /// Send CQ index.
    pub send_cq: u32,
    /// Receive CQ index.
    pub recv_cq: u32,
    /// Path MTU.
    pub pmtu: Pmtu,
    /// Peer QP.
    pub dest_qpn: Qpn,
    /// Peer IPv4 address.
    pub peer_ip: Ipv4Addr,
    /// Peer MAC.
    pub peer_mac: MacAddr,
    /// Access flags for remote operations.
    pub access: QpAccessFlags,
    /// `timeout` attribute (IB exponent; 0 = infinite).
    pub timeout: u8,
    /// `retry_cnt` attribute.
    pub retry_cnt: u8,
    /// `rnr_retry` attribute.
    pub rnr_retry: u8,
    /// `min_rnr_timer` attribute.
    pub min_rnr_timer: u8,
    /// Next PSN to assign.
    pub next_psn: Psn,
    /// First PSN not yet acknowledged by the peer.
    pub acked_psn: Psn,
    /// Next MSN to assign.
    pub next_msn: u16,
    /// SQ ring: index of the oldest WQE.
    pub sq_head: u32,
    /// Number of WQEs in the SQ.
    pub sq_len: u32,
    /// WQEs already handed to the card (a prefix of the SQ from `sq_head`).
    pub sq_sent: u32,
    /// Retransmission timer deadline.
    pub deadline: Option<Instant>,
    /// Retransmissions left before RETRY_EXC_ERR.
    pub retries_left: u8,
    /// Received PSNs (responder side).
    pub rx: PsnBitmap<RX_WORDS>,
    /// The PSN up to which an ACK was sent.
    pub acked_rx: Psn,
    /// The card's quiet report showed a hole below received PSNs: NAK it at the next poll.
    pub nak_due: bool,
    /// The receive base the last NAK was sent for: one NAK per hole, as IB's sequence
    /// error NAK (the requester's timer covers a retransmission that is lost again).
    pub naked_at: Option<Psn>,
    /// A duplicate arrived (a PSN below the base): the requester missed an ACK, send the
    /// current one again.
    pub reack: bool,
    /// PSN ranges the card reported lost (they left its window unreceived, or its window
    /// jumped over them) and that have not all arrived since: the card's window bottom is a
    /// cumulative ACK only up to the first of these.
    pub lost: heapless::Vec<PsnRange, LOST_TRACKED>,
    /// The card's receive window has not moved past PSN 0 since ManageQp, so its bitmaps
    /// still carry the reset bits (see `engine::card_reset`).
    pub card_fresh: bool,
    /// A message end or FIRST report found no room: its PSNs stay unacknowledged until the
    /// requester resends them; NAK the acknowledgement point to make it do so now.
    pub reports_dropped: bool,
    /// The out-of-band connection to the peer broke after this QP connected: a SEND that
    /// finds no announced receive WR fails instead of waiting (nothing can announce one).
    pub oob_lost: bool,
    /// The newest READ request answered (responder): a request at or before it is a resend.
    pub read_answered: Option<Psn>,
    /// Send WRs of the caller (not internal READ responses) retired so far.
    pub retired: u64,
    /// Received messages waiting for their PSNs, in PSN order.
    pub msgs: heapless::Deque<MsgEnd, MSG_QUEUE>,
    /// FIRST packets seen of messages not delivered yet, in PSN order: (PSN, message length,
    /// RETH address).
    pub firsts: heapless::Deque<(Psn, u32, u64), FIRSTS_TRACKED>,
    /// First PSN of the next message to deliver.
    pub next_msg: Psn,
    /// Posted receive WRs, in the order they were announced to the peer.
    pub recvs: heapless::Deque<RecvWr, RECV_QUEUE>,
    /// How many of the newest `recvs` are not announced yet (posted before RTR).
    pub to_announce: u32,
    /// Receive WRs the peer announced, not yet used by a SEND.
    pub remote_recvs: heapless::Deque<crate::oob::RecvWr, RECV_QUEUE>,
    /// A SEND waits for a receive WR: when the RNR timer fires.
    pub rnr_deadline: Option<Instant>,
    /// RNR retries left (7 = forever).
    pub rnr_left: u8,
}

impl Default for QpSlot {
    fn default() -> Self {
        Self {
            in_use: false,
            qpn: Qpn::from_raw(0),
            qp_type: QpType::Rc,
            state: QpState::Reset,
            pd: 0,
            send_cq: 0,
            recv_cq: 0,
            pmtu: Pmtu::Mtu4096,
            dest_qpn: Qpn::from_raw(0),
            peer_ip: Ipv4Addr::UNSPECIFIED,
            peer_mac: MacAddr::BROADCAST,
            access: QpAccessFlags::empty(),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 0,
            next_psn: Psn::from_raw(0),
            acked_psn: Psn::from_raw(0),
            next_msn: 0,
            sq_head: 0,
            sq_len: 0,
            sq_sent: 0,
            deadline: None,
            retries_left: 7,
            rx: PsnBitmap::new(Psn::from_raw(0)),
            acked_rx: Psn::from_raw(0),
            nak_due: false,
            naked_at: None,
            reack: false,
            lost: heapless::Vec::new(),
            card_fresh: true,
            reports_dropped: false,
            oob_lost: false,
            read_answered: None,
            retired: 0,
            msgs: heapless::Deque::new(),
            firsts: heapless::Deque::new(),
            next_msg: Psn::from_raw(0),
            recvs: heapless::Deque::new(),
            to_announce: 0,
            remote_recvs: heapless::Deque::new(),
            rnr_deadline: None,
            rnr_left: 7,
        }
    }
}

/// A completion queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct CqSlot {
    /// Whether the slot is in use.
    pub in_use: bool,
    /// Index of the oldest completion.
    pub head: u32,
    /// Number of completions queued.
    pub len: u32,
    /// Completions dropped because the CQ was full (a CQ overrun).
    pub overruns: u64,
}

/// A registered memory region.
#[derive(Clone, Copy, Debug, Default)]
pub struct MrSlot {
    /// Whether the slot is in use.
    pub in_use: bool,
    /// The key (lkey = rkey).
    pub key: u32,
    /// Start address.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// ibv access flags.
    pub access: u32,
    /// Protection domain.
    pub pd: u32,
    /// First PGT index.
    pub pgt_offset: u32,
    /// Number of PGT entries.
    pub pages: u32,
}
