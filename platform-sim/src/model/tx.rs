//! The transmit thread: command ring, send ring and simple-NIC TX ring
//! (nic-behaviour.md sections 1 and 5).
//!
//! Each work request (Seg0 + Seg1) becomes packets cut at PMTU-aligned *remote* addresses
//! with consecutive PSNs from Seg0.psn; headers follow the card's wire profile; the payload
//! is read through the MR table of Seg1.lkey (by index only: the card checks nothing on
//! transmit). All frames ready in one pass go to the link in one call.
//!
//! A WQE the RTL cannot execute (an lkey without a valid MR entry, a payload-less WQE that
//! is not both first and last) is an RTL stop ([`super::stops`]): a frozen card takes
//! nothing more from its rings.

use std::sync::Arc;
use std::time::Duration;

use bluerdma_core::addr::{DeviceAddr, VirtAddr};
use bluerdma_core::desc::send::{SendFlags, SendRequest, WorkReqOpcode};
use bluerdma_core::desc::simple_nic::SimpleNicTx;
use bluerdma_core::desc::RawDesc;
use bluerdma_core::mac::MacAddr;
use bluerdma_core::regs::{RingId, RingReg};
use bluerdma_core::wire::packet::udp_src_port_for;
use bluerdma_core::wire::{
    Bth, FrameEnvelope, Ieth, ImmDt, PacketHeaders, RdmaOpcode, Reth, RocePacket, Rreth,
};

use super::card::Shared;
use super::cmd;
use super::rings;
use super::stats::NicStats;
use super::stops::RtlStop;
use crate::link::FrameSender;
use crate::mem::DmaPort;

/// Descriptors fetched from a ring per pass.
const FETCH_BATCH: usize = 64;
/// Frames of whole WQEs held before they go to the link in one call.
const FLUSH_BYTES: usize = 256 << 10;
/// Largest frame the simple NIC transmits (a jumbo frame).
const MAX_SIMPLE_FRAME: usize = 9216;

/// The transmit side of one card.
pub struct TxEngine {
    shared: Arc<Shared>,
    dma: Box<dyn DmaPort>,
    link: Box<dyn FrameSender>,
    descs: Vec<RawDesc>,
    /// Send-ring descriptors of a WQE whose has_next chain is not complete yet.
    partial: Vec<RawDesc>,
    /// The frames of this pass, back to back, built in place (the buffer grows to the
    /// largest batch and is reused: no allocation or zeroing per frame).
    frames: FrameArena,
    /// Where the payload of the WQE being packetised lies in host memory: (device address,
    /// length) pieces in order, from the MR table under one lock.
    pieces: Vec<(DeviceAddr, u64)>,
    /// The next payload byte to read: a piece and the offset in it.
    cursor: (usize, u64),
    /// The ring resets (`RegisterFile::resets`) when the descriptors in hand were fetched.
    fetched_under: u64,
}

/// Frames back to back in one reusable buffer.
#[derive(Default)]
struct FrameArena {
    bytes: Vec<u8>,
    /// End of each frame in `bytes`.
    ends: Vec<usize>,
}

impl FrameArena {
    fn used(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    /// `len` bytes for the next frame (not zeroed: the caller writes all of them); it
    /// becomes a frame on [`FrameArena::commit`].
    fn next(&mut self, len: usize) -> &mut [u8] {
        let start = self.used();
        if self.bytes.len() < start + len {
            self.bytes.resize(start + len, 0);
        }
        &mut self.bytes[start..start + len]
    }

    fn commit(&mut self, len: usize) {
        self.ends.push(self.used() + len);
    }

    /// Forgets the frames after the first `n`.
    fn truncate(&mut self, n: usize) {
        self.ends.truncate(n);
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn clear(&mut self) {
        self.ends.clear();
    }

    fn slices(&self) -> Vec<&[u8]> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let f = &self.bytes[start..end];
                start = end;
                f
            })
            .collect()
    }
}

impl TxEngine {
    /// A transmit engine over the card's shared state.
    pub fn new(shared: Arc<Shared>, dma: Box<dyn DmaPort>, link: Box<dyn FrameSender>) -> Self {
        Self {
            shared,
            dma,
            link,
            descs: Vec::with_capacity(FETCH_BATCH),
            partial: Vec::new(),
            frames: FrameArena::default(),
            pieces: Vec::new(),
            cursor: (0, 0),
            fetched_under: 0,
        }
    }

    /// Whether the rings were reset (their driver went away) since the descriptors in hand
    /// were fetched: they are dropped, and a DMA access of theirs that failed is no error.
    fn stale(&self) -> bool {
        self.shared.regs.resets() != self.fetched_under
    }

    /// Logs a failed DMA access: an error, unless its driver has gone.
    fn dma_failed(&self, what: &str, e: &dyn core::fmt::Display) {
        NicStats::bump(&self.shared.stats.dma_faults);
        if self.stale() {
            log::info!(
                "{}: {what} ended: the driver went away ({e})",
                self.shared.config.name
            );
        } else {
            log::error!("{}: {what} failed: {e}", self.shared.config.name);
        }
    }

    /// Runs until the card stops.
    pub fn run(&mut self) {
        while !self.shared.stopping() {
            if !self.step() {
                let regs = Arc::clone(&self.shared.regs);
                // A frozen card has no work, whatever the rings hold.
                let frozen = self.shared.frozen();
                regs.sleep_unless(Duration::from_millis(100), || {
                    !frozen
                        && [RingId::CmdRequest, RingId::Send(0), RingId::SimpleNicTx]
                            .iter()
                            .any(|&id| regs.ring(id, RingReg::Head) != regs.ring(id, RingReg::Tail))
                });
            }
        }
    }

    /// One pass over the three host-to-card rings; returns whether there was work. A frozen
    /// card does nothing.
    pub fn step(&mut self) -> bool {
        if self.shared.frozen() {
            return false;
        }
        let mut work = self.commands();
        work |= self.send_ring();
        work |= self.simple_tx();
        self.flush_frames();
        work
    }

    /// Only the command ring (a driver waiting for a command's response).
    pub fn step_commands(&mut self) -> bool {
        !self.shared.frozen() && self.commands()
    }

    /// Only the send ring (a driver waiting for the card to fetch it); the frames go to
    /// the link.
    pub fn step_send(&mut self) -> bool {
        if self.shared.frozen() {
            return false;
        }
        let work = self.send_ring();
        self.flush_frames();
        work
    }

    fn fetch(&mut self, id: RingId, max: usize) -> usize {
        self.descs.clear();
        self.fetched_under = self.shared.regs.resets();
        match rings::fetch(&self.shared.regs, &mut *self.dma, id, &mut self.descs, max) {
            Ok(n) => n,
            Err(e) => {
                self.dma_failed(&format!("{id:?} ring fetch"), &e);
                0
            }
        }
    }

    fn commands(&mut self) -> bool {
        // An inline card runs in the driver's thread and cannot wait for it to free the
        // response ring: it takes only the commands it can answer (each has one response
        // at most), as a card blocked on a full response ring would.
        let max = if self.shared.inline {
            FETCH_BATCH.min(rings::free_slots(&self.shared.regs, RingId::CmdResponse) as usize)
        } else {
            FETCH_BATCH
        };
        if max == 0 || self.fetch(RingId::CmdRequest, max) == 0 {
            return false;
        }
        let descs = std::mem::take(&mut self.descs);
        for d in &descs {
            if self.shared.frozen() {
                break;
            }
            let response = {
                let mut state = self.shared.state();
                cmd::execute(&self.shared, &mut state, &mut *self.dma, d)
            };
            if let Some(r) = response {
                self.shared
                    .produce_blocking(&mut *self.dma, RingId::CmdResponse, &[r]);
            }
        }
        self.descs = descs;
        true
    }

    fn send_ring(&mut self) -> bool {
        if self.shared.frozen() || self.fetch(RingId::Send(0), FETCH_BATCH) == 0 {
            return false;
        }
        let descs = std::mem::take(&mut self.descs);
        for d in &descs {
            if self.shared.frozen() || self.stale() {
                self.partial.clear();
                break;
            }
            self.partial.push(*d);
            if d.has_next() {
                continue;
            }
            // A WQE is exactly Seg0 (has_next) + Seg1 (correction 6). The RTL pairs the last
            // two of any chain (C10); the model refuses a malformed chain instead.
            if self.partial.len() == 2 {
                match SendRequest::decode(&self.partial[0], &self.partial[1]) {
                    Ok(req) => {
                        self.wqe(&req);
                        if self.frames.used() >= FLUSH_BYTES {
                            self.flush_frames();
                        }
                    }
                    Err(e) => {
                        NicStats::bump(&self.shared.stats.bad_wqes);
                        log::error!("{}: bad send WQE: {e}", self.shared.config.name);
                    }
                }
            } else {
                NicStats::bump(&self.shared.stats.bad_wqes);
                log::error!(
                    "{}: send-ring chain of {} descriptors is not Seg0+Seg1; dropped",
                    self.shared.config.name,
                    self.partial.len()
                );
            }
            self.partial.clear();
        }
        self.descs = descs;
        true
    }

    /// Packetises one work request (nic-behaviour.md 1.2-1.4).
    fn wqe(&mut self, req: &SendRequest) {
        let shared = Arc::clone(&self.shared);
        let stats = &shared.stats;
        NicStats::bump(&stats.wqes);
        let (s0, s1) = (&req.seg0, &req.seg1);
        let op = s0.op;
        let payload_op = matches!(
            op,
            WorkReqOpcode::Write
                | WorkReqOpcode::WriteWithImm
                | WorkReqOpcode::Send
                | WorkReqOpcode::SendWithImm
                | WorkReqOpcode::SendWithInv
                | WorkReqOpcode::ReadResp
        );
        if !payload_op && op != WorkReqOpcode::Read {
            NicStats::bump(&stats.bad_wqes);
            log::error!(
                "{}: WQE op {op:?} is not supported",
                self.shared.config.name
            );
            return;
        }
        let (net_mac, net_ip) = {
            let state = self.shared.state();
            match state.net {
                Some(n) => (n.mac, n.ip),
                None => (MacAddr::default(), std::net::Ipv4Addr::UNSPECIFIED),
            }
        };
        let envelope = FrameEnvelope::new(
            net_mac,
            s1.mac,
            net_ip,
            s0.dqp_ip,
            udp_src_port_for(s1.sqpn),
        );
        let flags = s0.flags;
        let mut bth = Bth::new(RdmaOpcode::Acknowledge, s0.dqpn, s0.psn);
        bth.solicited = flags.contains(SendFlags::SOLICITED);
        bth.ack_req = flags.contains(SendFlags::SIGNALED);
        bth.is_retry = s1.is_retry;
        bth.msn = s0.msn;

        if op == WorkReqOpcode::Read || s1.len == 0 {
            if !(s1.is_first && s1.is_last)
                && self
                    .shared
                    .rtl_stop_at(RtlStop::PayloadlessNotWhole { op: op.raw() })
            {
                return;
            }
            // One payload-less packet with PSN = Seg0.psn.
            let opcode = opcode_for(op, s1.is_first, s1.is_last);
            let mut h = PacketHeaders::new(Bth { opcode, ..bth });
            h.reth = Some(Reth {
                va: s0.raddr,
                rkey: s0.rkey,
                dma_len: s0.total_len,
            });
            if op == WorkReqOpcode::Read {
                h.rreth = Some(Rreth {
                    va: s1.laddr,
                    lkey: s1.lkey,
                });
            }
            self.add_imm(&mut h, op, s1.imm);
            self.emit(envelope, h, 0).ok();
            return;
        }

        let pmtu = s1.pmtu.bytes() as u64;
        let a = s0.raddr.0;
        let len = s1.len as u64;
        let Some(last_byte) = a.checked_add(len - 1) else {
            NicStats::bump(&stats.bad_wqes);
            log::error!(
                "{}: remote range wraps the address space",
                self.shared.config.name
            );
            return;
        };
        // Where the chunk's payload lies, through the sender's MR table (one lock per WQE).
        let lkey_index = s1.lkey.index();
        self.pieces.clear();
        self.cursor = (0, 0);
        {
            let state = self.shared.state();
            if !state.tables.mr(lkey_index).valid {
                drop(state);
                NicStats::bump(&stats.bad_wqes);
                // Carrying on (policy `continue`) drops just this WQE.
                shared.rtl_stop_at(RtlStop::InvalidLkey {
                    lkey: s1.lkey.get(),
                    sqpn: s1.sqpn.get(),
                });
                return;
            }
            let pieces = &mut self.pieces;
            state
                .tables
                .translate(lkey_index, s1.laddr.0, len, |dev, _off, plen| {
                    pieces.push((dev, plen))
                });
        }
        // The WQE's frames go out whole or not at all (a read fault drops them all).
        let first_frame = self.frames.ends.len();
        let n = (last_byte / pmtu) - (a / pmtu) + 1;
        let mut start = a;
        let mut psn = s0.psn;
        for k in 0..n {
            let end = if k + 1 == n {
                a + len
            } else {
                (start / pmtu + 1) * pmtu
            };
            let first = s1.is_first && k == 0;
            let last = s1.is_last && k + 1 == n;
            let opcode = opcode_for(op, first, last);
            let mut h = PacketHeaders::new(Bth { opcode, psn, ..bth });
            let plen = end - start;
            h.reth = Some(Reth {
                va: VirtAddr(start),
                rkey: s0.rkey,
                dma_len: if opcode.is_first() || opcode.is_only() {
                    s0.total_len
                } else {
                    plen as u32
                },
            });
            if last {
                self.add_imm(&mut h, op, s1.imm);
            }
            if let Err(e) = self.emit(envelope, h, plen as usize) {
                self.frames.truncate(first_frame);
                self.dma_failed("payload read", &e);
                return;
            }
            start = end;
            psn = (psn + 1) & 0x00FF_FFFF;
        }
        NicStats::add(&stats.tx_payload_bytes, len);
    }

    fn add_imm(&self, h: &mut PacketHeaders, op: WorkReqOpcode, imm: u32) {
        let opcode = h.bth.opcode;
        if !(opcode.is_last() || opcode.is_only()) {
            return;
        }
        match op {
            WorkReqOpcode::WriteWithImm | WorkReqOpcode::SendWithImm => h.imm = Some(ImmDt(imm)),
            WorkReqOpcode::SendWithInv => {
                h.ieth = Some(Ieth {
                    rkey: bluerdma_core::keys::MrKey::from_raw(imm),
                })
            }
            _ => {}
        }
    }

    /// Builds one frame in place: its headers, then its `plen` payload bytes, the next of
    /// the WQE's payload ([`TxEngine::pieces`] from [`TxEngine::cursor`]), read from host
    /// memory straight into the frame. A frame that cannot be built is counted and
    /// skipped; a read fault is the caller's to handle.
    fn emit(
        &mut self,
        envelope: FrameEnvelope,
        headers: PacketHeaders,
        plen: usize,
    ) -> Result<(), crate::mem::DmaFault> {
        let packet = RocePacket { envelope, headers };
        let len = packet.frame_len(plen);
        let frame = self.frames.next(len);
        let n = match packet.emit_frame_headers(plen, frame) {
            Ok(n) => n,
            Err(e) => {
                NicStats::bump(&self.shared.stats.bad_wqes);
                log::error!("{}: cannot build packet: {e}", self.shared.config.name);
                return Ok(());
            }
        };
        // The WQE's packets take its payload in order: read on from where the last ended.
        let mut dst = &mut frame[n - plen..n];
        while !dst.is_empty() {
            let Some(&(dev, piece)) = self.pieces.get(self.cursor.0) else {
                break;
            };
            let at = self.cursor.1;
            let take = ((piece - at) as usize).min(dst.len());
            let (now, rest) = dst.split_at_mut(take);
            self.dma.read(DeviceAddr(dev.0 + at), now)?;
            dst = rest;
            self.cursor.1 += take as u64;
            if self.cursor.1 == piece {
                self.cursor = (self.cursor.0 + 1, 0);
            }
        }
        self.frames.commit(n);
        NicStats::bump(&self.shared.stats.tx_packets);
        Ok(())
    }

    fn simple_tx(&mut self) -> bool {
        if self.shared.frozen() || self.fetch(RingId::SimpleNicTx, FETCH_BATCH) == 0 {
            return false;
        }
        let descs = std::mem::take(&mut self.descs);
        for d in &descs {
            if self.stale() {
                break;
            }
            let tx = SimpleNicTx::decode(d);
            let len = tx.len as usize;
            if len == 0 || len > MAX_SIMPLE_FRAME {
                NicStats::bump(&self.shared.stats.bad_wqes);
                log::error!(
                    "{}: simple-NIC frame of {len} bytes refused",
                    self.shared.config.name
                );
                continue;
            }
            match self.dma.read(tx.addr, self.frames.next(len)) {
                Ok(()) => {
                    self.frames.commit(len);
                    NicStats::bump(&self.shared.stats.simple_tx);
                }
                Err(e) => self.dma_failed("simple-NIC frame read", &e),
            }
        }
        self.descs = descs;
        true
    }

    fn flush_frames(&mut self) {
        if self.frames.is_empty() {
            return;
        }
        if let Err(e) = self.link.send_frames(&self.frames.slices()) {
            log::error!("{}: link send failed: {e}", self.shared.config.name);
        }
        self.frames.clear();
    }
}

/// The BTH opcode of a packet (nic-behaviour.md 1.2 table).
fn opcode_for(op: WorkReqOpcode, first: bool, last: bool) -> RdmaOpcode {
    use RdmaOpcode as R;
    use WorkReqOpcode as W;
    match (op, first, last) {
        (W::Read, _, _) => R::ReadRequest,
        (W::Write, true, true) => R::WriteOnly,
        (W::Write, true, false) => R::WriteFirst,
        (W::Write | W::WriteWithImm, false, false) => R::WriteMiddle,
        (W::Write, false, true) => R::WriteLast,
        (W::WriteWithImm, true, true) => R::WriteOnlyWithImm,
        (W::WriteWithImm, true, false) => R::WriteFirst,
        (W::WriteWithImm, false, true) => R::WriteLastWithImm,
        (W::Send, true, true) => R::SendOnly,
        (W::Send | W::SendWithImm | W::SendWithInv, true, false) => R::SendFirst,
        (W::Send | W::SendWithImm | W::SendWithInv, false, false) => R::SendMiddle,
        (W::Send, false, true) => R::SendLast,
        (W::SendWithImm, true, true) => R::SendOnlyWithImm,
        (W::SendWithImm, false, true) => R::SendLastWithImm,
        (W::SendWithInv, true, true) => R::SendOnlyWithInvalidate,
        (W::SendWithInv, false, true) => R::SendLastWithInvalidate,
        (W::ReadResp, true, true) => R::ReadResponseOnly,
        (W::ReadResp, true, false) => R::ReadResponseFirst,
        (W::ReadResp, false, false) => R::ReadResponseMiddle,
        (W::ReadResp, false, true) => R::ReadResponseLast,
        _ => R::Unknown(0xFF),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_table_matches_the_rtl() {
        use RdmaOpcode as R;
        use WorkReqOpcode as W;
        assert_eq!(opcode_for(W::Write, true, true), R::WriteOnly);
        assert_eq!(
            opcode_for(W::WriteWithImm, false, true),
            R::WriteLastWithImm
        );
        assert_eq!(opcode_for(W::WriteWithImm, true, false), R::WriteFirst);
        assert_eq!(opcode_for(W::SendWithImm, false, false), R::SendMiddle);
        assert_eq!(opcode_for(W::ReadResp, false, true), R::ReadResponseLast);
        assert_eq!(opcode_for(W::Read, false, false), R::ReadRequest);
        assert_eq!(opcode_for(W::SendWithInv, true, true).raw(), 0x17);
    }
}
