//! A send WQE as the engine keeps it until its completion is delivered: either a request of
//! the application or a READ response the engine made for a peer's READ request. What can
//! exist is spelled out by the type (a READ has a "data arrived" flag, a SEND may wait for
//! the peer's receive WR, a READ response never completes to the application).

use crate::addr::VirtAddr;
use crate::desc::send::WorkReqOpcode;
use crate::keys::{MrKey, Qpn};
use crate::mtu::Pmtu;
use crate::transport::{num_packets, Psn, WrSpan};

use super::atomic::AtomicWqe;
use super::config::CHUNK_BYTES;
use super::wr::{SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

/// Where a send WQE is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WqeState {
    /// Posted, not yet handed to the card (the send window or ring was full).
    #[default]
    Pending,
    /// Handed to the card (perhaps only its first packets); waiting for the peer's ACK.
    Sent,
    /// Acknowledged (a READ also needs its response data).
    Acked,
}

/// The operation of an application request, with what only that operation has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestOp {
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate data.
    WriteImm(u32),
    /// RDMA READ; `done` once its response data has arrived.
    Read {
        /// The response arrived.
        done: bool,
    },
    /// SEND, with immediate data or not.
    Send(Option<u32>),
    /// RDMA READ of zero bytes. It moves no data, so it goes on the wire as the card's
    /// zero-length WRITE (acknowledged like any other; IB checks no R_Key for either) and
    /// completes as a READ of 0 bytes, in posting order.
    EmptyRead,
    /// An atomic: executed by the responder's driver, never posted to the card
    /// (`engine::atomic`).
    Atomic(AtomicWqe),
}

/// What the application asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) wr_id: u64,
    pub(crate) op: RequestOp,
    pub(crate) laddr: VirtAddr,
    pub(crate) lkey: MrKey,
    pub(crate) len: u32,
    /// Remote address and key: the caller's for WRITE and READ, the peer's receive WR's for
    /// a SEND (filled in when it is matched).
    pub(crate) raddr: VirtAddr,
    pub(crate) rkey: MrKey,
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    /// Consumes the peer's next announced receive WR, not matched yet (SEND, and
    /// WRITE_WITH_IMM when the peer announces its receive WRs).
    pub(crate) needs_recv: bool,
    /// A SEND_WITH_INV: the rkey the responder invalidates, and how far that went.
    pub(crate) invalidate: Option<Invalidate>,
}

/// The remote invalidation of a SEND_WITH_INV (`engine::remote_inv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Invalidate {
    /// The responder's rkey to invalidate.
    pub(crate) rkey: u32,
    /// Where the request stands.
    pub(crate) step: InvStep,
}

/// Where a SEND_WITH_INV's invalidation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InvStep {
    /// The responder was not asked yet (the SEND waits to be the oldest request).
    Unasked,
    /// Asked, for the SEND that starts at this PSN; the SEND waits for the verdict.
    Asked(Psn),
    /// The responder invalidated the window: the SEND goes.
    Done,
}

/// A READ response the engine sends for a peer's READ request: no completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadResponse {
    /// The data: the requested range of our MR.
    pub(crate) laddr: VirtAddr,
    pub(crate) lkey: MrKey,
    pub(crate) len: u32,
    /// The requester's sink buffer.
    pub(crate) raddr: VirtAddr,
    pub(crate) rkey: MrKey,
}

/// What a WQE slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum WqeKind {
    /// Nothing (a free slot of the send queue).
    #[default]
    Free,
    /// An application request.
    Request(Request),
    /// A READ response of the engine.
    ReadResponse(ReadResponse),
}

/// A send WQE: what it is, and where its packets are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wqe {
    pub(crate) kind: WqeKind,
    /// First PSN (assigned at first transmission).
    pub(crate) psn: Psn,
    /// PSNs the request occupies.
    pub(crate) npsn: u32,
    /// Message sequence number.
    pub(crate) msn: u16,
    pub(crate) state: WqeState,
}

impl Wqe {
    /// The WQE of an application request (validated by the requester).
    #[inline]
    pub(crate) fn request(wr: &SendWr, needs_recv: bool) -> Self {
        let op = match wr.op {
            SendOp::Write => RequestOp::Write,
            SendOp::WriteWithImm(imm) => RequestOp::WriteImm(imm),
            SendOp::Read if wr.len == 0 => RequestOp::EmptyRead,
            SendOp::Read => RequestOp::Read { done: false },
            SendOp::Send | SendOp::SendWithInv(_) => RequestOp::Send(None),
            SendOp::SendWithImm(imm) => RequestOp::Send(Some(imm)),
            SendOp::Atomic(op) => RequestOp::Atomic(AtomicWqe::new(op)),
        };
        Wqe {
            kind: WqeKind::Request(Request {
                wr_id: wr.wr_id,
                op,
                laddr: wr.laddr,
                lkey: wr.lkey,
                len: wr.len,
                raddr: wr.raddr,
                rkey: wr.rkey,
                signaled: wr.signaled,
                solicited: wr.solicited,
                needs_recv,
                invalidate: match wr.op {
                    SendOp::SendWithInv(rkey) => Some(Invalidate {
                        rkey,
                        step: InvStep::Unasked,
                    }),
                    _ => None,
                },
            }),
            ..Wqe::default()
        }
    }

    /// The WQE of a READ response; its PSN count is known at once (one packet per PMTU of
    /// the requester's sink).
    #[inline]
    pub(crate) fn read_response(r: ReadResponse, pmtu: Pmtu) -> Self {
        Wqe {
            kind: WqeKind::ReadResponse(r),
            npsn: num_packets(r.raddr.0, r.len, pmtu),
            ..Wqe::default()
        }
    }

    /// The card's op code.
    #[inline]
    pub(crate) fn opcode(&self) -> WorkReqOpcode {
        match self.kind {
            WqeKind::Request(r) => match r.op {
                RequestOp::Write | RequestOp::EmptyRead => WorkReqOpcode::Write,
                RequestOp::WriteImm(_) => WorkReqOpcode::WriteWithImm,
                RequestOp::Read { .. } => WorkReqOpcode::Read,
                RequestOp::Send(None) => WorkReqOpcode::Send,
                RequestOp::Send(Some(_)) => WorkReqOpcode::SendWithImm,
                RequestOp::Atomic(a) => a.card_opcode(),
            },
            WqeKind::ReadResponse(_) => WorkReqOpcode::ReadResp,
            WqeKind::Free => WorkReqOpcode::Write,
        }
    }

    /// Local buffer, length, remote buffer and keys: (laddr, lkey, len, raddr, rkey).
    #[inline]
    pub(crate) fn buffers(&self) -> (VirtAddr, MrKey, u32, VirtAddr, MrKey) {
        match self.kind {
            WqeKind::Request(r) => (r.laddr, r.lkey, r.len, r.raddr, r.rkey),
            WqeKind::ReadResponse(r) => (r.laddr, r.lkey, r.len, r.raddr, r.rkey),
            WqeKind::Free => (
                VirtAddr(0),
                MrKey::default(),
                0,
                VirtAddr(0),
                MrKey::default(),
            ),
        }
    }

    /// Length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.buffers().2
    }

    /// The local key.
    #[inline]
    pub(crate) fn lkey(&self) -> MrKey {
        self.buffers().1
    }

    /// Immediate data (0 without).
    #[inline]
    pub(crate) fn imm(&self) -> u32 {
        match self.kind {
            WqeKind::Request(Request {
                op: RequestOp::WriteImm(imm) | RequestOp::Send(Some(imm)),
                ..
            }) => imm,
            _ => 0,
        }
    }

    /// The solicited-event bit.
    #[inline]
    pub(crate) fn solicited(&self) -> bool {
        matches!(self.kind, WqeKind::Request(r) if r.solicited)
    }

    /// An application READ.
    #[inline]
    pub(crate) fn is_read(&self) -> bool {
        matches!(
            self.kind,
            WqeKind::Request(Request {
                op: RequestOp::Read { .. },
                ..
            })
        )
    }

    /// An application READ whose response data has not arrived.
    #[inline]
    pub(crate) fn read_pending(&self) -> bool {
        matches!(
            self.kind,
            WqeKind::Request(Request {
                op: RequestOp::Read { done: false },
                ..
            })
        )
    }

    /// Marks a READ's response data as arrived.
    #[inline]
    pub(crate) fn set_read_done(&mut self) {
        if let WqeKind::Request(Request {
            op: RequestOp::Read { done },
            ..
        }) = &mut self.kind
        {
            *done = true;
        }
    }

    /// A READ response the engine made (no completion).
    #[inline]
    pub(crate) fn is_internal(&self) -> bool {
        matches!(self.kind, WqeKind::ReadResponse(_))
    }

    /// A SEND or SEND_WITH_IMM.
    #[inline]
    pub(crate) fn is_send(&self) -> bool {
        matches!(
            self.kind,
            WqeKind::Request(Request {
                op: RequestOp::Send(_),
                ..
            })
        )
    }

    /// Waits for the peer's next announced receive WR.
    #[inline]
    pub(crate) fn needs_recv(&self) -> bool {
        matches!(self.kind, WqeKind::Request(r) if r.needs_recv)
    }

    /// Matches the peer's receive WR: a SEND writes into its buffer.
    #[inline]
    pub(crate) fn match_recv(&mut self, addr: VirtAddr, key: MrKey) {
        if let WqeKind::Request(r) = &mut self.kind {
            if matches!(r.op, RequestOp::Send(_)) {
                r.raddr = addr;
                r.rkey = key;
            }
            r.needs_recv = false;
        }
    }

    /// Goes to the card as one chunk whatever its length: a READ request, or a request of
    /// zero bytes.
    #[inline]
    pub(crate) fn is_whole(&self) -> bool {
        self.is_read() || self.len() == 0
    }

    /// Its PSN is never marked in the card's bitmap (nic-behaviour.md 3.2): a READ request
    /// or a zero-length WRITE.
    #[inline]
    pub(crate) fn unmarked_by_card(&self) -> bool {
        self.is_read() || self.len() == 0 && self.opcode() == WorkReqOpcode::Write
    }

    /// Done: acknowledged, and a READ's data arrived.
    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.state == WqeState::Acked && !self.read_pending()
    }

    /// Assigns the PSN range and MSN at first transmission, in posting order.
    #[inline]
    pub(crate) fn assign(&mut self, psn: Psn, msn: u16, pmtu: Pmtu) {
        self.npsn = if self.is_read() {
            1
        } else {
            let (_, _, len, raddr, _) = self.buffers();
            num_packets(raddr.0, len, pmtu)
        };
        self.psn = psn;
        self.msn = msn;
    }

    /// The PSN after its last.
    #[inline]
    pub(crate) fn end_psn(&self) -> Psn {
        self.psn.wrapping_add(self.npsn)
    }

    /// Packets not handed to the card yet: all of a pending request; for a sent one, those
    /// from the QP's `next_psn` on (the send window can stop a request in the middle).
    #[inline]
    pub(crate) fn unsent_packets(&self, next_psn: Psn) -> u32 {
        match self.state {
            WqeState::Pending => self.npsn,
            WqeState::Sent => self
                .npsn
                .saturating_sub(self.psn.forward_distance(next_psn)),
            WqeState::Acked => 0,
        }
    }

    /// Its span for the fragmenter (a READ moves no data of its own).
    #[inline]
    pub(crate) fn span(&self) -> WrSpan {
        let (laddr, _, len, raddr, _) = self.buffers();
        WrSpan {
            laddr,
            raddr,
            len: if self.is_read() { 0 } else { len },
            first_psn: self.psn,
        }
    }

    /// Upper bound of the chunks it is cut into.
    #[inline]
    pub(crate) fn chunk_count(&self) -> usize {
        if self.is_read() {
            1
        } else {
            chunk_count_len(self.len())
        }
    }

    /// The completion to deliver when it leaves the send queue with `status`: an error
    /// always, a success only when signaled (with the length), never for a READ response.
    #[inline]
    pub(crate) fn completion(&self, status: WcStatus, qpn: Qpn) -> Option<WorkCompletion> {
        let WqeKind::Request(r) = self.kind else {
            return None;
        };
        let success = status == WcStatus::Success;
        if success && !r.signaled {
            return None;
        }
        let opcode = match r.op {
            RequestOp::Read { .. } | RequestOp::EmptyRead => WcOpcode::RdmaRead,
            RequestOp::Send(_) => WcOpcode::Send,
            RequestOp::Write | RequestOp::WriteImm(_) => WcOpcode::RdmaWrite,
            RequestOp::Atomic(a) => a.wc_opcode(),
        };
        Some(WorkCompletion {
            wr_id: r.wr_id,
            status,
            opcode,
            byte_len: if success { r.len } else { 0 },
            imm_data: 0,
            qp_num: qpn.get(),
            src_qp: 0,
            wc_flags: 0,
            sq_slots: 0,
        })
    }
}

/// Upper bound of the chunks of a request of `len` bytes (an unaligned start adds one).
#[inline]
pub(crate) fn chunk_count_len(len: u32) -> usize {
    (len as usize).div_ceil(CHUNK_BYTES as usize) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(op: SendOp, len: u32, signaled: bool) -> SendWr {
        SendWr {
            wr_id: 7,
            op,
            laddr: VirtAddr(0x1000),
            len,
            lkey: MrKey::from_raw(0x105),
            raddr: VirtAddr(0x2000),
            rkey: MrKey::from_raw(0x206),
            signaled,
            solicited: false,
        }
    }

    #[test]
    fn a_read_is_done_only_with_its_data() {
        let mut w = Wqe::request(&wr(SendOp::Read, 100, true), false);
        w.assign(Psn::from_raw(5), 0, Pmtu::Mtu4096);
        assert_eq!((w.npsn, w.opcode()), (1, WorkReqOpcode::Read));
        w.state = WqeState::Acked;
        assert!(!w.is_done() && w.read_pending());
        w.set_read_done();
        assert!(w.is_done());
    }

    #[test]
    fn a_send_takes_the_receive_wr_address_when_matched() {
        let mut w = Wqe::request(&wr(SendOp::SendWithImm(9), 10, true), true);
        assert!(w.needs_recv() && w.is_send() && w.imm() == 9);
        w.match_recv(VirtAddr(0x9000), MrKey::from_raw(0x333));
        let (_, _, _, raddr, rkey) = w.buffers();
        assert_eq!(
            (raddr.0, rkey.get(), w.needs_recv()),
            (0x9000, 0x333, false)
        );
        // WRITE_WITH_IMM consumes a receive WR but keeps its own target.
        let mut w = Wqe::request(&wr(SendOp::WriteWithImm(1), 10, true), true);
        w.match_recv(VirtAddr(0x9000), MrKey::from_raw(0x333));
        assert_eq!(w.buffers().3 .0, 0x2000);
    }

    #[test]
    fn completions_follow_signaling_and_never_come_from_read_responses() {
        let qpn = Qpn::from_raw(0x101);
        let w = Wqe::request(&wr(SendOp::Write, 64, false), false);
        assert_eq!(w.completion(WcStatus::Success, qpn), None);
        let failed = w.completion(WcStatus::RetryExcErr, qpn).unwrap();
        assert_eq!((failed.wr_id, failed.byte_len), (7, 0));
        let w = Wqe::request(&wr(SendOp::Read, 64, true), false);
        let done = w.completion(WcStatus::Success, qpn).unwrap();
        assert_eq!(
            (done.opcode, done.byte_len, done.qp_num),
            (WcOpcode::RdmaRead, 64, 0x101)
        );
        let r = Wqe::read_response(
            ReadResponse {
                laddr: VirtAddr(0),
                lkey: MrKey::default(),
                len: 9000,
                raddr: VirtAddr(0x1000),
                rkey: MrKey::default(),
            },
            Pmtu::Mtu4096,
        );
        assert_eq!(r.npsn, 3);
        assert_eq!(r.completion(WcStatus::WrFlushErr, qpn), None);
    }

    #[test]
    fn a_sent_request_counts_its_unsent_tail() {
        let mut w = Wqe::request(&wr(SendOp::Write, 5 * 4096, true), false);
        w.assign(Psn::from_raw(0xFF_FFFE), 0, Pmtu::Mtu4096);
        assert_eq!(w.unsent_packets(Psn::from_raw(0)), 5);
        w.state = WqeState::Sent;
        assert_eq!(w.unsent_packets(Psn::from_raw(1)), 2, "across the wrap");
        assert_eq!(w.end_psn(), Psn::from_raw(3));
    }
}
