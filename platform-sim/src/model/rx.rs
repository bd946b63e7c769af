//! The receive thread: frames from the link through the card's classifier, receive checks,
//! DMA writes, PSN windows and meta reports (nic-behaviour.md sections 2-4, with the
//! review's corrections), and the simple-NIC RX ring (section 5.5).
//!
//! Where the RTL is broken the model does what was intended (hardware-contract.md
//! correction 14): a failed QP-context check drops just that packet (the RTL desynchronises
//! its pipeline), the simple-NIC RX buffer is the one SetRawPacketReceiveMeta named (the
//! RTL writes to address 0). Where the RTL stops ([`super::stops`]: a stale PSN, a frame too
//! short for its pipeline) the card freezes unless its policy says carry on; a frozen card
//! drops every frame it is given.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::desc::meta::{AckExtra, AckReport, MetaReport, PacketInfo, ReadReqExt};
use bluerdma_core::desc::simple_nic::{SimpleNicRx, RX_SLOTS, RX_SLOT_SIZE};
use bluerdma_core::desc::RawDesc;
use bluerdma_core::keys::{Qpn, MR_TABLE_LEN, QP_TABLE_LEN};
use bluerdma_core::mac::MacAddr;
use bluerdma_core::regs::{Counter, RingId};
use bluerdma_core::wire::{Aeth, Bth, FrameEnvelope, Nreth, PacketHeaders, RdmaOpcode, RocePacket};

use super::autoack::{LossReport, MergeOutcome};
use super::card::{CardState, Shared};
use super::rings;
use super::stats::NicStats;
use super::stops::RtlStop;
use super::tables::{access, TranslateError};
use crate::link::LinkPort;
use crate::mem::DmaPort;

/// Events waiting for room in a card-to-host ring before the card takes more frames.
const MAX_PENDING: usize = 4096;

/// One event for a card-to-host ring: one or two descriptors written together.
struct Pending {
    ring: RingId,
    descs: [RawDesc; 2],
    n: usize,
}

/// The receive side of one card.
pub struct RxEngine {
    shared: Arc<Shared>,
    dma: Box<dyn DmaPort>,
    link: Box<dyn LinkPort>,
    pending: VecDeque<Pending>,
    naks: Vec<Vec<u8>>,
}

impl RxEngine {
    /// A receive engine over the card's shared state.
    pub fn new(shared: Arc<Shared>, dma: Box<dyn DmaPort>, link: Box<dyn LinkPort>) -> Self {
        Self {
            shared,
            dma,
            link,
            pending: VecDeque::new(),
            naks: Vec::new(),
        }
    }

    /// Runs until the card stops.
    pub fn run(&mut self) {
        while !self.shared.stopping() {
            let timeout = self.next_timeout();
            self.step(timeout);
        }
    }

    /// The link the card receives from.
    pub fn link_mut(&mut self) -> &mut dyn LinkPort {
        &mut *self.link
    }

    /// Whether reports wait for room in a card-to-host ring.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn next_timeout(&self) -> Duration {
        if self.shared.frozen() {
            // Nothing to flush and no timer to run: only frames to drop.
            return Duration::from_millis(5);
        }
        if !self.pending.is_empty() {
            return Duration::from_micros(20);
        }
        let state = self.shared.state();
        if state.quiet_pending.is_empty() {
            // Idle: also how long stopping the card waits for this thread.
            Duration::from_millis(5)
        } else {
            // Wake in time for the earliest quiet deadline.
            self.shared.config.quiet_timeout / 2
        }
    }

    /// One step without waiting (a stepped card): returns whether a frame arrived, a quiet
    /// timer fired or a waiting report found room.
    pub fn step_now(&mut self) -> bool {
        let pending = self.pending.len();
        let quiet = self.shared.stats.quiet_reports.load(Ordering::Relaxed);
        let frames = self.step(Duration::ZERO);
        frames > 0
            || self.pending.len() != pending
            || self.shared.stats.quiet_reports.load(Ordering::Relaxed) != quiet
    }

    /// Receives for at most `timeout`, then flushes pending reports and runs the timers.
    /// A frozen card only takes frames off the link and drops them.
    pub fn step(&mut self, timeout: Duration) -> usize {
        if self.shared.frozen() {
            let stats = &self.shared.stats;
            let n = self
                .link
                .recv_frames(timeout, &mut |_| NicStats::bump(&stats.frozen_drops))
                .unwrap_or_else(|_| {
                    std::thread::sleep(timeout);
                    0
                });
            return n;
        }
        self.flush_pending();
        let mut n = 0;
        if self.pending.len() < MAX_PENDING {
            let Self {
                shared,
                dma,
                link,
                pending,
                naks,
            } = self;
            let mut ctx = RxContext {
                shared,
                dma: &mut **dma,
                pending,
                naks,
                state: None,
            };
            match link.recv_frames(timeout, &mut |frame| ctx.frame(frame)) {
                Ok(k) => n = k,
                Err(e) => {
                    log::error!("{}: link receive failed: {e}", shared.config.name);
                    std::thread::sleep(timeout);
                }
            }
        } else {
            std::thread::sleep(timeout);
        }
        self.quiet_timers();
        self.flush_pending();
        if !self.naks.is_empty() {
            let refs: Vec<&[u8]> = self.naks.iter().map(Vec::as_slice).collect();
            if let Err(e) = self.link.send_frames(&refs) {
                log::error!("{}: NAK send failed: {e}", self.shared.config.name);
            }
            self.naks.clear();
        }
        n
    }

    fn flush_pending(&mut self) {
        while let Some(p) = self.pending.front() {
            match rings::produce(&self.shared.regs, &mut *self.dma, p.ring, &p.descs[..p.n]) {
                Ok(true) => {
                    self.pending.pop_front();
                }
                Ok(false) => {
                    NicStats::bump(&self.shared.stats.backpressure_waits);
                    return;
                }
                Err(e) => {
                    NicStats::bump(&self.shared.stats.dma_faults);
                    log::error!("{}: report write failed: {e}", self.shared.config.name);
                    self.pending.pop_front();
                }
            }
        }
    }

    fn quiet_timers(&mut self) {
        let now = self.shared.now_ns();
        let quiet = self.shared.config.quiet_timeout.as_nanos() as u64;
        let mut state = self.shared.state();
        if state.quiet_pending.is_empty() {
            return;
        }
        let CardState {
            windows,
            quiet_pending,
            ..
        } = &mut *state;
        quiet_pending.retain(|&index| {
            let Some(w) = windows.get_mut(index as usize) else {
                return false;
            };
            if w.has_reported {
                return false;
            }
            match w.poll_quiet(now, quiet) {
                Some(r) => {
                    let report = AckReport {
                        now_bitmap: r.now_bitmap,
                        msn: 0,
                        qpn: Qpn::from_raw((index << 8) | r.key as u32),
                        psn_now: r.psn_now,
                        psn_before_slide: 0,
                        is_packet_lost: false,
                        is_window_slided: false,
                        is_send_by_driver: false,
                        is_send_by_local_hw: true,
                    };
                    push_report(&mut self.pending, MetaReport::Ack(report));
                    NicStats::bump(&self.shared.stats.quiet_reports);
                    false
                }
                None => true,
            }
        });
    }
}

fn push_report(pending: &mut VecDeque<Pending>, report: MetaReport) {
    let (first, second) = report.encode();
    let (descs, n) = match second {
        Some(s) => ([first, s], 2),
        None => ([first, RawDesc::ZERO], 1),
    };
    pending.push_back(Pending {
        ring: RingId::MetaReport(0),
        descs,
        n,
    });
}

/// What the receive path borrows while the link delivers frames.
struct RxContext<'a> {
    shared: &'a Shared,
    dma: &'a mut dyn DmaPort,
    pending: &'a mut VecDeque<Pending>,
    naks: &'a mut Vec<Vec<u8>>,
    /// The card state, locked at the batch's first frame and held to its end (one lock per
    /// batch, not per frame).
    state: Option<MutexGuard<'a, CardState>>,
}

/// Why a packet was dropped: the counter register it bumps, if any.
struct Drop(Option<Counter>);

impl<'a> RxContext<'a> {
    fn frame(&mut self, frame: &[u8]) {
        let shared: &'a Shared = self.shared;
        let mut state = self.state.take().unwrap_or_else(|| shared.state());
        self.frame_locked(&mut state, frame);
        self.state = Some(state);
    }

    fn frame_locked(&mut self, state: &mut CardState, frame: &[u8]) {
        let stats = &self.shared.stats;
        if self.shared.frozen() {
            // An earlier frame of this batch froze the card.
            NicStats::bump(&stats.frozen_drops);
            return;
        }
        NicStats::bump(&stats.rx_frames);
        let regs = &self.shared.regs;
        let Some(net) = state.net else {
            NicStats::bump(&stats.rx_before_setup);
            return;
        };
        // One beat or less (section 2.1): the RTL's classifier stops.
        if frame.len() <= 32
            && self
                .shared
                .rtl_stop_at(RtlStop::ShortFrame { len: frame.len() })
        {
            return;
        }
        // Address filter (section 2.1): our MAC or broadcast, and our IP at bytes 30..33.
        let dst_mac = frame
            .get(0..6)
            .map(|m| MacAddr([m[0], m[1], m[2], m[3], m[4], m[5]]));
        let dst_ip = frame
            .get(30..34)
            .map(|b| Ipv4Addr::new(b[0], b[1], b[2], b[3]));
        let for_us = matches!(dst_mac, Some(m) if m == net.mac || m.is_broadcast())
            && dst_ip == Some(net.ip);
        if !for_us {
            regs.bump(Counter::EthDiscarded);
            return;
        }
        let is_roce = frame.len() >= 38
            && frame[12..14] == [0x08, 0x00]
            && frame[23] == 17
            && frame[36..38] == 4791u16.to_be_bytes();
        if !is_roce {
            regs.bump(Counter::EthSimpleNic);
            self.simple_rx(state, frame);
            return;
        }
        regs.bump(Counter::EthRdma);
        if roce_too_short(frame)
            && self
                .shared
                .rtl_stop_at(RtlStop::ShortFrame { len: frame.len() })
        {
            return;
        }
        let (packet, payload) = match RocePacket::parse_frame(frame) {
            Ok(p) => p,
            Err(e) => {
                NicStats::bump(&stats.rx_malformed);
                log::warn!(
                    "{}: malformed RoCE frame dropped: {e}",
                    self.shared.config.name
                );
                return;
            }
        };
        let payload = frame.get(payload).unwrap_or(&[]);
        match self.packet(state, &packet.headers, payload) {
            Ok(()) => NicStats::bump(&stats.rx_accepted),
            Err(Drop(counter)) => {
                NicStats::bump(&stats.rx_check_failed);
                if let Some(c) = counter {
                    regs.bump(c);
                }
            }
        }
    }

    /// The checks of section 2.3, first failure wins; then DMA, window, report.
    fn packet(
        &mut self,
        state: &mut CardState,
        h: &PacketHeaders,
        payload: &[u8],
    ) -> Result<(), Drop> {
        let stats = &self.shared.stats;
        let bth = &h.bth;
        let op = bth.opcode;
        if bth.opcode.transport_bits() != 0
            || !(op.is_send() || op.is_write() || op.is_read_response())
                && op != RdmaOpcode::ReadRequest
                && op != RdmaOpcode::Acknowledge
            || op.has_ieth()
        {
            // UC/UD/XRC/CNP, atomics and *_INV: not handled by this card model.
            NicStats::bump(&stats.rx_unsupported);
            return Err(Drop(None));
        }
        let dlen = h.reth.map(|r| r.dma_len).unwrap_or(0);
        let need_mr = (op.is_send() || op.is_write() || op.is_read_response()) && dlen != 0;
        // 1. QP index.
        let qp_index = bth.dqpn.index();
        if qp_index >= QP_TABLE_LEN {
            return Err(Drop(None));
        }
        let reth = h.reth.unwrap_or_default();
        // 2. MR index.
        if need_mr && reth.rkey.get() >> 8 >= MR_TABLE_LEN {
            return Err(Drop(None));
        }
        // 3. QP context valid and key (also for READ requests and ACKs: review correction 3).
        let qpc = *state.tables.qp(qp_index);
        if !qpc.valid || qpc.key != bth.dqpn.key() {
            return Err(Drop(Some(Counter::InvalidQpContext)));
        }
        if need_mr {
            self.check_and_write(state, h, payload, &qpc)?;
        }
        // PSN window (section 3.2): payload packets and zero-length ONLY_WITH_IMM.
        let merges = need_mr
            || matches!(
                op,
                RdmaOpcode::SendOnlyWithImm | RdmaOpcode::WriteOnlyWithImm
            );
        if merges {
            self.merge(state, qp_index, bth);
        }
        // Meta reports (section 4.1).
        if let Some(report) = report_for(h) {
            push_report(self.pending, report);
            NicStats::bump(&stats.meta_reports);
        }
        Ok(())
    }

    fn check_and_write(
        &mut self,
        state: &mut CardState,
        h: &PacketHeaders,
        payload: &[u8],
        qpc: &super::tables::QpContext,
    ) -> Result<(), Drop> {
        let op = h.bth.opcode;
        let reth = h.reth.unwrap_or_default();
        // 4. QP access.
        let qp_need = if op.is_read_response() {
            access::LOCAL_WRITE
        } else {
            access::REMOTE_WRITE
        };
        if qpc.rq_access_flags & qp_need == 0 {
            return Err(Drop(Some(Counter::InvalidQpAccess)));
        }
        // 5. MR key.
        let rkey = reth.rkey.get();
        let mr = *state.tables.mr(rkey >> 8);
        if !mr.valid || mr.key != rkey as u8 {
            return Err(Drop(Some(Counter::InvalidMrKey)));
        }
        // 6. MR access.
        let mr_need = if op.is_send() {
            access::LOCAL_WRITE
        } else {
            access::REMOTE_WRITE
        };
        if mr.acc_flags & mr_need == 0 {
            return Err(Drop(Some(Counter::InvalidMrAccess)));
        }
        // 7. Bounds, with the packet length the receiver expects (section 2.4).
        let va = reth.va.0;
        let len = if op.is_first() {
            let p = qpc.pmtu.map(|p| p.bytes() as u64).unwrap_or(4096);
            p - (va % p)
        } else {
            reth.dma_len as u64
        };
        match state.tables.check_bounds(rkey, va, len) {
            Ok(_) => {}
            Err(TranslateError::OutOfBounds) => return Err(Drop(Some(Counter::MemOutOfBounds))),
            Err(_) => return Err(Drop(Some(Counter::InvalidMrKey))),
        }
        // 8. Length: the payload must be exactly the packet length.
        if payload.len() as u64 != len {
            return Err(Drop(Some(Counter::PacketLengthError)));
        }
        // Strict mode: the protection-domain check the card lacks (correction 10).
        if self.shared.config.strict && state.qp_pd.get(h.bth.dqpn.index() as usize) != Some(&mr.pd)
        {
            NicStats::bump(&self.shared.stats.strict_pd_drops);
            return Err(Drop(None));
        }
        // Translate and write (section 2.5-2.6): the payload is visible before the report.
        let mut fault = None;
        let dma = &mut *self.dma;
        state
            .tables
            .translate(rkey >> 8, va, len, |dev, off, plen| {
                if fault.is_none() {
                    let src = &payload[off as usize..(off + plen) as usize];
                    if let Err(e) = dma.write(dev, src) {
                        fault = Some(e);
                    }
                }
            });
        if let Some(e) = fault {
            NicStats::bump(&self.shared.stats.dma_faults);
            log::error!("{}: payload write failed: {e}", self.shared.config.name);
            return Err(Drop(None));
        }
        NicStats::add(&self.shared.stats.rx_payload_bytes, len);
        Ok(())
    }

    fn merge(&mut self, state: &mut CardState, index: u32, bth: &Bth) {
        let now = self.shared.now_ns();
        let key = bth.dqpn.key();
        let Some(w) = state.windows.get_mut(index as usize) else {
            return;
        };
        let outcome = w.merge(bth.psn, key, now);
        if !state.quiet_pending.contains(&index) {
            state.quiet_pending.push(index);
        }
        match outcome {
            MergeOutcome::Accepted => {}
            MergeOutcome::Stale => {
                NicStats::bump(&self.shared.stats.stale_psns);
                // Carrying on (policy `continue`) ignores the PSN, as the RTL meant to.
                self.shared.rtl_stop_at(RtlStop::StalePsn {
                    qp_index: index,
                    psn: bth.psn,
                    stride: w.left_bound,
                });
            }
            MergeOutcome::Lost(r) => self.loss(state, index, &r),
        }
    }

    /// A gap left the window: a NAK to the peer and a local report (section 3.4).
    fn loss(&mut self, state: &CardState, index: u32, r: &LossReport) {
        let qpc = state.tables.qp(index);
        let net = state
            .net
            .unwrap_or(bluerdma_core::desc::cmd::SetNetworkParam {
                mac: MacAddr::default(),
                ip: Ipv4Addr::UNSPECIFIED,
                netmask: Ipv4Addr::UNSPECIFIED,
                gateway: Ipv4Addr::UNSPECIFIED,
            });
        let mut bth = Bth::new(
            RdmaOpcode::Acknowledge,
            Qpn::from_raw(qpc.peer_qpn),
            r.psn_now,
        );
        bth.msn = r.msn;
        let mut headers = PacketHeaders::new(bth);
        headers.aeth = Some(Aeth {
            pre_bitmap: r.pre_bitmap,
            now_bitmap: r.now_bitmap,
            is_packet_lost: true,
            is_window_slided: true,
            is_send_by_driver: false,
            pre_psn: r.psn_before_slide,
        });
        headers.nreth = Some(Nreth { last_retry_psn: 0 });
        let packet = RocePacket {
            envelope: FrameEnvelope::new(
                net.mac,
                MacAddr::from_bits(qpc.peer_mac),
                net.ip,
                Ipv4Addr::from(qpc.peer_ip),
                qpc.local_udp_port,
            ),
            headers,
        };
        let mut frame = vec![0u8; packet.frame_len(0)];
        match packet.emit_frame(&[], &mut frame) {
            Ok(n) => {
                frame.truncate(n);
                self.naks.push(frame);
                NicStats::bump(&self.shared.stats.naks_sent);
            }
            Err(e) => log::error!("{}: cannot build NAK: {e}", self.shared.config.name),
        }
        let report = AckReport {
            now_bitmap: r.now_bitmap,
            msn: r.msn,
            qpn: Qpn::from_raw((index << 8) | r.key as u32),
            psn_now: r.psn_now,
            psn_before_slide: r.psn_before_slide,
            is_packet_lost: true,
            is_window_slided: true,
            is_send_by_driver: false,
            is_send_by_local_hw: true,
        };
        push_report(
            self.pending,
            MetaReport::Nak(
                report,
                AckExtra {
                    pre_bitmap: r.pre_bitmap,
                },
            ),
        );
        NicStats::bump(&self.shared.stats.meta_reports);
    }

    fn simple_rx(&mut self, state: &mut CardState, frame: &[u8]) {
        let stats = &self.shared.stats;
        let Some(base) = state.raw_rx_base else {
            NicStats::bump(&stats.simple_rx_dropped);
            return;
        };
        if frame.len() > RX_SLOT_SIZE as usize {
            // The RTL would run into the next slot; the model refuses the frame.
            NicStats::bump(&stats.simple_rx_dropped);
            return;
        }
        let slot = state.raw_rx_slot % RX_SLOTS;
        let at = DeviceAddr(base.0 + slot as u64 * RX_SLOT_SIZE as u64);
        if let Err(e) = self.dma.write(at, frame) {
            NicStats::bump(&stats.dma_faults);
            log::error!(
                "{}: simple-NIC RX write failed: {e}",
                self.shared.config.name
            );
            return;
        }
        state.raw_rx_slot = (slot + 1) % RX_SLOTS;
        let desc = SimpleNicRx {
            slot_idx: slot,
            len: frame.len() as u32,
        }
        .encode();
        self.pending.push_back(Pending {
            ring: RingId::SimpleNicRx,
            descs: [desc, RawDesc::ZERO],
            n: 1,
        });
        NicStats::bump(&stats.simple_rx);
    }
}

/// A RoCE frame the RTL's header extractor stops on (section 2.2): one that ends in its
/// second beat (at most 64 bytes), or that ends by byte 96 while it has payload (a payload
/// opcode and RETH.dlen, frame bytes 66..70, not zero).
fn roce_too_short(frame: &[u8]) -> bool {
    if frame.len() <= 64 {
        return true;
    }
    if frame.len() > 96 {
        return false;
    }
    let payload_op = RdmaOpcode::from_raw(frame[42]).has_payload();
    let dlen = frame
        .get(66..70)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    payload_op && dlen != 0
}

/// The meta report of an accepted packet (section 4.1-4.2), if the card writes one.
fn report_for(h: &PacketHeaders) -> Option<MetaReport> {
    let bth = &h.bth;
    let op = bth.opcode;
    if op == RdmaOpcode::Acknowledge {
        let aeth = h.aeth?;
        let ack = AckReport {
            now_bitmap: aeth.now_bitmap,
            msn: bth.msn,
            qpn: bth.dqpn,
            psn_now: bth.psn,
            psn_before_slide: aeth.pre_psn,
            is_packet_lost: aeth.is_packet_lost,
            is_window_slided: aeth.is_window_slided,
            is_send_by_driver: aeth.is_send_by_driver,
            is_send_by_local_hw: false,
        };
        return Some(if aeth.is_window_slided {
            MetaReport::Nak(
                ack,
                AckExtra {
                    pre_bitmap: aeth.pre_bitmap,
                },
            )
        } else {
            MetaReport::Ack(ack)
        });
    }
    let reth = h.reth.unwrap_or_default();
    let mut info = PacketInfo {
        opcode: op,
        psn: bth.psn,
        msn: bth.msn,
        dqpn: bth.dqpn,
        raddr: reth.va,
        rkey: reth.rkey,
        total_len: reth.dma_len,
        imm_data: h.imm.map(|i| i.0).unwrap_or(0),
        is_retry: bth.is_retry,
        ack_req: bth.ack_req,
        solicited: bth.solicited,
        ecn_marked: false,
    };
    if op == RdmaOpcode::ReadRequest {
        let rreth = h.rreth?;
        // The RTL fills imm_data from extension bytes 16..19: the top of RRETH.va.
        info.imm_data = (rreth.va.0 >> 32) as u32;
        return Some(MetaReport::ReadRequest(
            info,
            ReadReqExt {
                lkey: rreth.lkey,
                laddr: rreth.va,
                total_len: reth.dma_len,
            },
        ));
    }
    if op.is_middle() && !bth.is_retry {
        return None;
    }
    Some(MetaReport::Packet(info))
}
