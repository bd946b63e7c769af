//! The card's meta reports, one handler per kind, and the responder's delivery round:
//! packet reports feed the QP's [`Responder`](super::responder::Responder); READ requests
//! are checked (the card checks only the QP: hardware-contract.md 12a) and answered with a
//! READ response WQE; ACK and NAK reports go to the completer, or, when our own card sent
//! them about our receive window, to the responder. `deliver_and_ack` completes what
//! arrived and sends the driver's cumulative ACK frames through the simple NIC.

use crate::desc::meta::{AckExtra, AckReport, MetaReport, PacketInfo, ReadReqExt};
use crate::desc::simple_nic::SimpleNicTx;
use crate::desc::{AccessFlags, RawDesc};
use crate::qp::QpAccessFlags;
use crate::ring::Popped;
use crate::time::Instant;
use crate::transport::Psn;
use crate::wire::{AckVerdict, DriverAckFrame};

use super::qp::QpIndex;
use super::requester::{Batch, Path};
use super::responder::{MsgEnd, MsgKind, ReadRequest};
use super::wqe::{ReadResponse, Wqe};
use super::wr::{WcOpcode, WcStatus, WorkCompletion, WC_WITH_IMM, WC_WITH_INV};
use super::{Device, Platform, Storage};

impl<P: Platform, S: Storage> Device<P, S> {
    /// Drains the meta-report ring (at most 256 reports a call).
    pub(crate) fn poll_meta(&mut self, now: Instant) -> bool {
        let mut any = false;
        for _ in 0..256 {
            let Some(p) = self.meta.pop() else {
                break;
            };
            any = true;
            self.stats.reports += 1;
            let decoded = match p {
                Popped::One(d) => MetaReport::decode(&d, None),
                Popped::Pair(a, b) => MetaReport::decode(&a, Some(&b)),
                Popped::Overlong(..) | Popped::OverlongRest(_) => {
                    self.stats.bad_reports += 1;
                    continue;
                }
            };
            match decoded {
                Ok(r) => self.on_report(&r, now),
                Err(e) => {
                    self.stats.bad_reports += 1;
                    core_error!("meta report dropped: {}", e);
                }
            }
        }
        if any {
            self.meta.sync_tail(&self.regs);
        }
        any
    }

    /// One decoded report, to its handler. A report naming no QP of ours is counted.
    pub(crate) fn on_report(&mut self, r: &MetaReport, now: Instant) {
        let qpn = match r {
            MetaReport::Packet(p) | MetaReport::ReadRequest(p, _) => p.dqpn,
            MetaReport::Ack(a) | MetaReport::Nak(a, _) => a.qpn,
        };
        let Ok(i) = self.qp_index(qpn) else {
            self.stats.bad_reports += 1;
            return;
        };
        match r {
            MetaReport::Packet(p) => self.on_packet_report(i, p),
            MetaReport::ReadRequest(p, ext) => self.on_read_request(i, p, ext, now),
            MetaReport::Ack(a) => self.on_ack_report(i, a, now),
            MetaReport::Nak(a, extra) => self.on_nak_report(i, a, extra, now),
        }
    }

    fn on_packet_report(&mut self, i: QpIndex, p: &PacketInfo) {
        if self.qp(i).resp.needs_room(p) {
            // Make room: what can be completed is completed before the report is recorded
            // (its ACK still goes out at the next delivery round).
            self.deliver_ready(i);
        }
        self.qp(i).resp.on_packet(p);
    }

    /// The card checks nothing of a READ request but its QP (12a): the driver checks rkey,
    /// bounds, REMOTE_READ on MR and QP, and the PD. A refused request is not acknowledged
    /// either: the requester times out.
    fn on_read_request(&mut self, i: QpIndex, p: &PacketInfo, ext: &ReadReqExt, now: Instant) {
        let a = self.qp(i).attrs;
        let ok = a.access.contains(QpAccessFlags::REMOTE_READ)
            && a.connected()
            && self.mr_covers(
                p.rkey,
                p.raddr.0,
                p.total_len,
                AccessFlags::REMOTE_READ,
                Some(a.pd),
            );
        if !ok {
            self.stats.read_refused += 1;
            core_warn!(
                "READ request refused: rkey {:#x} range or access",
                p.rkey.get()
            );
            return;
        }
        if self.sq(i).is_full() {
            self.stats.read_refused += 1;
            core_warn!(
                "READ request refused: the send queue of QP {:#x} is full",
                p.dqpn.get()
            );
            return;
        }
        if self.qp(i).resp.read_needs_room() {
            self.deliver_ready(i);
        }
        let psn = Psn::from_raw(p.psn);
        if self.qp(i).resp.on_read_request(psn, p.total_len, p.raddr.0) == ReadRequest::Resent {
            return;
        }
        let response = ReadResponse {
            laddr: p.raddr,
            lkey: p.rkey,
            len: p.total_len,
            raddr: ext.laddr,
            rkey: ext.lkey,
        };
        let _ = self.sq(i).push(Wqe::read_response(response, a.pmtu));
        self.transmit(i, now);
    }

    fn on_ack_report(&mut self, i: QpIndex, a: &AckReport, now: Instant) {
        if a.is_send_by_local_hw {
            // The card's quiet-timer report of our receive window: nothing arrived for a
            // while, so a hole below received PSNs is a loss, not reordering. NAK it now
            // instead of letting the requester wait for its timeout.
            self.qp(i).resp.on_quiet(a);
        } else {
            // The peer driver's cumulative ACK: every PSN before psn_now arrived.
            self.on_ack(i, Psn::from_raw(a.psn_now), now);
        }
    }

    fn on_nak_report(&mut self, i: QpIndex, a: &AckReport, extra: &AckExtra, now: Instant) {
        if a.is_send_by_local_hw {
            // Our card saw a gap leave its window: from the first lost PSN to the new window
            // bottom, only what is reported explicitly arrived.
            self.qp(i).resp.on_loss(a, extra.pre_bitmap);
        } else if a.is_send_by_driver {
            self.on_driver_nak(i, Psn::from_raw(a.psn_before_slide), now);
        } else {
            self.on_card_nak(i, a.psn_before_slide, extra.pre_bitmap, a.psn_now, now);
        }
    }

    /// Responder side: completes received messages whose PSNs all arrived and sends one
    /// cumulative ACK per QP whose acknowledgeable point moved. The ACK never covers a PSN
    /// whose message's completion is not recorded yet.
    pub(crate) fn deliver_and_ack(&mut self, now: Instant) -> bool {
        let mut acks = Batch::new();
        let mut any = false;
        for i in self.qp_indices() {
            if !self.qp(i).in_use() {
                continue;
            }
            let acked = self.qp(i).resp.acked();
            let (base, ack) = self.deliver_ready(i);
            if self.qp(i).resp.take_nak(base, ack) {
                let nak = AckVerdict::Nak { pre_psn: ack.get() };
                if self.push_ack(&mut acks, i, ack, nak) {
                    self.stats.naks_sent += 1;
                }
            }
            let reack = self.qp(i).resp.take_reack();
            if ack == acked && !reack {
                continue;
            }
            any = true;
            if ack != acked {
                self.response_progress(i, now);
            }
            self.push_ack(&mut acks, i, ack, AckVerdict::Ack);
            self.qp(i).resp.set_acked(ack);
        }
        if acks.len() > 0 {
            self.flush_acks(&mut acks);
        }
        any
    }

    /// Adds QP `i`'s ACK frame (or NAK) for `base` to `acks`; false if no frame slot.
    fn push_ack(&mut self, acks: &mut Batch, i: QpIndex, base: Psn, verdict: AckVerdict) -> bool {
        let Some(d) = self.ack_frame(i, base, verdict) else {
            return false;
        };
        if !acks.fits(1) {
            self.flush_acks(acks);
        }
        acks.push(d);
        true
    }

    /// Completes the messages of QP `i` that may be acknowledged; returns the first missing
    /// PSN and the point up to which an ACK may now go.
    pub(crate) fn deliver_ready(&mut self, i: QpIndex) -> (Psn, Psn) {
        let (base, limit) = self.qp(i).resp.deliverable();
        while let Some(m) = self.qp(i).resp.next_ready(limit) {
            self.deliver(i, &m);
        }
        (base, limit)
    }

    /// Records the completion of message `m` (its length and address already filled in by
    /// the responder).
    fn deliver(&mut self, i: QpIndex, m: &MsgEnd) {
        let opcode = match m.kind {
            MsgKind::Write | MsgKind::ReadReq => return,
            MsgKind::ReadResp => return self.read_response_arrived(i, m.addr, m.len),
            MsgKind::WriteImm => WcOpcode::RecvRdmaWithImm,
            MsgKind::Send | MsgKind::SendImm => WcOpcode::Recv,
        };
        // A QP in ERR completes nothing more (its receive WRs were flushed; the card was told
        // to drop its packets, but reports already on the ring still come).
        let r = if self.qp(i).attrs.connected() {
            self.pop_recv(i)
        } else {
            None
        };
        let q = self.qp(i);
        let (qpn, peer, cq, state) = (
            q.attrs.qpn,
            q.attrs.dest_qpn,
            q.attrs.recv_cq,
            q.attrs.state,
        );
        let Some(r) = r else {
            self.stats.recvs_missing += 1;
            core_warn!(
                "QP {:#x}: a message that consumes a receive WR arrived with none posted (state {}): no completion",
                qpn.get(),
                state.to_ibv()
            );
            return;
        };
        let with_imm = m.kind != MsgKind::Send;
        let (imm_data, wc_flags) = match self.take_invalidated(i, m) {
            Some(rkey) => (rkey, WC_WITH_INV),
            None if with_imm => (m.imm, WC_WITH_IMM),
            None => (0, 0),
        };
        let wc = WorkCompletion {
            wr_id: r.wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len: m.len,
            imm_data,
            qp_num: qpn.get(),
            src_qp: peer.get(),
            wc_flags,
            sq_slots: 0,
        };
        self.complete(cq, wc);
    }

    fn ack_frame(&mut self, i: QpIndex, base: Psn, verdict: AckVerdict) -> Option<RawDesc> {
        let q = Path::of(&self.qp(i).attrs);
        let frame = DriverAckFrame {
            src_mac: self.cfg.mac,
            dst_mac: q.peer_mac,
            src_ip: self.cfg.ip,
            dst_ip: q.peer_ip,
            dqpn: q.dest_qpn,
            psn: base.get(),
            verdict,
        };
        let (addr, out) = self.ack_slots.take()?;
        let len = frame.emit(out).ok()?;
        self.stats.acks_sent += 1;
        Some(
            SimpleNicTx {
                addr,
                len: len as u32,
            }
            .encode(),
        )
    }

    fn flush_acks(&mut self, acks: &mut Batch) {
        let descs = acks.take();
        if self.sn_tx.push_batch(&self.regs, descs).is_err() {
            // ACKs are cumulative: a lost one is repaired by the next, or by the
            // requester's retransmission.
            core_warn!("simple-NIC ring full: {} ACK frames not sent", descs.len());
            return;
        }
        self.sn_tx_seq += descs.len() as u64;
        self.sn_tx_bytes += descs
            .iter()
            .map(|d| u64::from(SimpleNicTx::decode(d).len))
            .sum::<u64>();
    }
}
