//! The device: rings, command queue, verbs and the poll loop.
//!
//! Single-threaded and poll-driven (ARCHITECTURE.md "The core"): every verb runs to
//! completion on the caller's thread; `poll(now)` drains the card's reports, delivers
//! completions, sends the driver's ACK frames, transmits work that waited for the send
//! window and runs the retransmission timers. Objects live in caller-provided [`Storage`].

use core::net::Ipv4Addr;

use crate::addr::{DeviceAddr, PageSize, VirtAddr};
use crate::desc::cmd::{
    CmdRequest, CmdResponse, ManageQp, SetNetworkParam, SetRawPacketReceiveMeta, UpdateMrTable,
};
use crate::desc::meta::{AckReport, MetaReport, PacketInfo};
use crate::desc::pgt::{stage_pgt_update, DRIVER_ENTRIES_PER_UPDATE};
use crate::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use crate::desc::simple_nic::{SimpleNicRx, SimpleNicTx, RX_BUFFER_SIZE, RX_SLOTS, RX_SLOT_SIZE};
use crate::desc::{AccessFlags, MacAddr, RawDesc};
use crate::keys::{MrKey, Qpn, MR_TABLE_LEN, PGT_LEN};
use crate::oob::{RecvTooShort, RecvWr as OobRecvWr};
use crate::platform::{DmaAllocator, DmaBuffer, MemoryResolver, OobEvent, OobTransport, Platform};
use crate::qp::{check_modify, QpAccessFlags, QpAttr, QpAttrMask, QpState, QpType, RawQpAttr};
use crate::regs::{RingId, DECODED_CHANNELS};
use crate::ring::{
    ConsumerRing, Popped, ProducerRing, RingMemory, RingRegs, RING_ALIGN, RING_BYTES,
};
use crate::time::{Instant, Nanos};
use crate::transport::{num_packets, Chunk, Fragmenter, PacketFragmenter, Psn, PsnRange, WrSpan};
use crate::wire::{AckVerdict, DriverAckFrame};

use super::card_reset::{still_fresh, trusted_bits, RESET_PHANTOMS};
use super::error::VerbsError;
use super::types::*;

#[path = "dump.rs"]
mod dump;

#[cfg(test)]
#[path = "delivery_tests.rs"]
mod delivery_tests;

/// Largest chunk the driver hands the card (64 KiB, ARCHITECTURE.md).
pub const CHUNK_BYTES: u32 = 64 * 1024;
/// Size of one ACK frame slot in the driver's simple-NIC TX buffer.
const ACK_SLOT: usize = 128;
/// ACK frame slots: one per simple-NIC TX ring entry, so a slot is reused only after the
/// card fetched 4096 later frames.
const ACK_SLOTS: usize = 4096;
/// Size of one raw frame slot ([`Device::send_raw`]): a whole simple-NIC RX slot of the
/// receiving card, the largest frame it takes.
pub const RAW_FRAME_MAX: usize = RX_SLOT_SIZE as usize;
/// Raw frame slots (512 KiB). Fewer than the ring's entries, so a slot is reused only
/// once the card is done with the frame it last held, checked against the ring's tail.
const RAW_SLOTS: usize = 256;
/// The ring's tail counts descriptors fetched, not executed (nic-behaviour.md 6.2): the
/// card reads a frame's bytes after it fetched the descriptor, and fetches the next batch
/// (16 descriptors on the RTL, 64 on the emulated card) only once the batch before is
/// done. A raw frame's slot is free once the card has fetched this many descriptors
/// beyond it.
const RAW_FETCH_MARGIN: u64 = 128;
const _: () = assert!(RAW_SLOTS as u64 > RAW_FETCH_MARGIN);
/// Most PSNs in flight per QP, whatever `DeviceConfig::send_window` says: seven of the
/// card's 16-PSN strides. The peer card's window spans the 128 PSNs below the top of its
/// newest stride (nic-behaviour.md 3.3); with at most 112 PSNs past the oldest
/// unacknowledged one, a go-back-N resend from there is never 8 strides behind the newest
/// PSN sent, so the card merges it instead of ignoring it as stale.
pub const SEND_WINDOW_CAP: u32 = crate::transport::bitmap::CARD_PSN_NOW_BIT;
/// Descriptors gathered before one doorbell.
const BATCH: usize = 64;

/// Caller-provided storage for the device's objects.
pub struct Slices<'a> {
    /// Queue pairs (slot i is QP index i + 1: index 0 is reserved by the card).
    pub qps: &'a mut [QpSlot],
    /// Send WQEs: `sq_depth` per QP, QP slot i owns `[i * sq_depth, (i + 1) * sq_depth)`.
    pub wqes: &'a mut [Wqe],
    /// Completion queues.
    pub cqs: &'a mut [CqSlot],
    /// Completions: `cq_depth` per CQ.
    pub cqes: &'a mut [WorkCompletion],
    /// Memory regions (slot i is MR table index i).
    pub mrs: &'a mut [MrSlot],
    /// Announced receive WRs held for QPs that have not reached RTR yet, in arrival order
    /// (a peer may announce a whole receive queue, ibv_rc_pingpong's 500, before this side
    /// connects). Size it to the receive WRs peers may announce early.
    pub early: &'a mut [EarlyRecv],
}

/// A receive WR a peer announced before the QP it belongs to reached RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EarlyRecv {
    /// The announcing device.
    pub from: Ipv4Addr,
    /// The record.
    pub wr: OobRecvWr,
}

impl Default for EarlyRecv {
    fn default() -> Self {
        Self {
            from: Ipv4Addr::UNSPECIFIED,
            wr: OobRecvWr::default(),
        }
    }
}

/// Where the device keeps its objects: arrays on firmware, vectors on hosts.
pub trait Storage {
    /// All tables at once.
    fn slices(&mut self) -> Slices<'_>;
    /// Send WQEs per QP.
    fn sq_depth(&self) -> usize;
    /// Completions per CQ.
    fn cq_depth(&self) -> usize;
}

/// How the device is set up.
#[derive(Clone, Copy, Debug)]
pub struct DeviceConfig {
    /// The card's MAC.
    pub mac: MacAddr,
    /// The card's IPv4 address.
    pub ip: Ipv4Addr,
    /// Netmask.
    pub netmask: Ipv4Addr,
    /// Gateway.
    pub gateway: Ipv4Addr,
    /// Translation page size; must match the card (correction 8).
    pub page_size: PageSize,
    /// How long a command may take.
    pub command_timeout: Nanos,
    /// Packets in flight per QP before new work waits for ACKs.
    pub send_window: u32,
}

impl DeviceConfig {
    /// A configuration for a card at `ip` with `mac`.
    pub const fn new(mac: MacAddr, ip: Ipv4Addr) -> Self {
        Self {
            mac,
            ip,
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            gateway: Ipv4Addr::UNSPECIFIED,
            page_size: PageSize::Size2M,
            command_timeout: Nanos::from_millis(2_000),
            send_window: 1024,
        }
    }
}

/// Counters of everything the engine refused, dropped or retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Commands sent.
    pub commands: u64,
    /// Chunks (Seg0 + Seg1) posted to the send ring.
    pub chunks: u64,
    /// Meta reports handled.
    pub reports: u64,
    /// Reports that did not decode or named an unknown QP.
    pub bad_reports: u64,
    /// ACK frames sent.
    pub acks_sent: u64,
    /// NAK frames sent (a hole seen in the card's quiet report).
    pub naks_sent: u64,
    /// Retransmissions started (timeout or NAK).
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// READ requests refused (bad rkey, bounds or access: hardware-contract.md 12a).
    pub read_refused: u64,
    /// Simple-NIC frames received.
    pub raw_frames: u64,
    /// Received simple-NIC frames dropped because no consumer asked for them
    /// ([`Device::set_keep_raw_frames`]).
    pub raw_dropped: u64,
    /// Simple-NIC RX descriptors that did not decode or named bytes outside their slot.
    pub raw_bad: u64,
    /// Raw frames sent ([`Device::send_raw`]).
    pub raw_sent: u64,
    /// Completions lost to a full CQ.
    pub cq_overruns: u64,
    /// Batches the send ring refused (their packets go out again by retransmission).
    pub send_refused: u64,
    /// Receive WRs announced to peers over the out-of-band channel.
    pub recvs_announced: u64,
    /// Receive WRs peers announced to us.
    pub recvs_received: u64,
    /// Announced receive WRs that matched no QP yet and waited for it to reach RTR.
    pub recvs_early: u64,
    /// Announced receive WRs dropped: no QP ever matched and the waiting list was full.
    pub recvs_dropped: u64,
    /// RNR timer expiries (a SEND waited for a receive WR).
    pub rnr_waits: u64,
    /// QPs whose peer's out-of-band connection broke (those with a SEND waiting for a
    /// receive WR went to ERR).
    pub peers_lost: u64,
    /// SENDs longer than the peer's receive WR (REM_INV_REQ_ERR here); the peer was told
    /// over the out-of-band channel if it takes receive-WR-too-short records.
    pub sends_too_long: u64,
    /// Receive WRs a peer found too short for its SEND: completed with LOC_LEN_ERR, their
    /// QP moved to ERR.
    pub recvs_too_short: u64,
}

/// A QP's handle: its QPN.
pub type QpHandle = Qpn;

/// The device.
pub struct Device<P: Platform, S: Storage> {
    regs: P::Regs,
    dma: P::Dma,
    mem: P::Mem,
    storage: S,
    cfg: DeviceConfig,
    cmd: ProducerRing,
    resp: ConsumerRing,
    send: ProducerRing,
    meta: ConsumerRing,
    sn_tx: ProducerRing,
    sn_rx: ConsumerRing,
    rx_buf: Option<DmaBuffer>,
    staging: Option<DmaBuffer>,
    ack_slots: TxSlots,
    raw_slots: TxSlots,
    /// For each raw slot, the simple-NIC TX sequence number of the frame it last held.
    raw_seq: [Option<u64>; RAW_SLOTS],
    /// Descriptors pushed on the simple-NIC TX ring so far.
    sn_tx_seq: u64,
    /// A consumer takes received simple-NIC frames ([`Device::take_raw_frames`]).
    keep_raw_frames: bool,
    next_tag: u8,
    key_seq: u32,
    pgt_used: [u64; (PGT_LEN / 64) as usize],
    pd_used: [u64; 4],
    stats: EngineStats,
    oob: Option<P::Oob>,
    /// How many entries of `Slices::early` are in use (a prefix, in arrival order).
    early_len: usize,
}

fn ring_regs(id: RingId) -> Result<RingRegs, VerbsError> {
    RingRegs::of(id, DECODED_CHANNELS).ok_or(VerbsError::Unsupported {
        what: "ring channel",
    })
}

fn ring_memory(dma: &impl DmaAllocator) -> Result<RingMemory, VerbsError> {
    let buf = dma.alloc(RING_BYTES, RING_ALIGN)?;
    RingMemory::new(buf).map_err(|rejected| {
        dma_free(dma, rejected.buffer);
        VerbsError::OutOfResources {
            what: "ring memory with the card's alignment",
        }
    })
}

fn dma_free(dma: &impl DmaAllocator, buf: DmaBuffer) {
    crate::platform::release(dma, buf)
}

/// A DMA buffer cut into equal slots for simple-NIC TX frames, used round-robin.
struct TxSlots {
    buf: Option<DmaBuffer>,
    size: usize,
    next: usize,
}

impl TxSlots {
    fn new(buf: DmaBuffer, size: usize) -> Self {
        TxSlots {
            buf: Some(buf),
            size,
            next: 0,
        }
    }

    /// The next slot (its device address and bytes); the one after it comes next time.
    fn take(&mut self) -> Option<(DeviceAddr, &mut [u8])> {
        let buf = self.buf.as_mut()?;
        let count = buf.len() / self.size;
        let slot = self.next;
        self.next = (slot + 1) % count.max(1);
        let at = slot * self.size;
        let addr = DeviceAddr(buf.device_addr().0 + at as u64);
        Some((addr, buf.as_mut_slice().get_mut(at..at + self.size)?))
    }
}

/// Writes a send request into two consecutive batch slots.
fn encode_pair(req: &SendRequest, batch: &mut [RawDesc], n: usize) {
    if let Some([seg0, seg1]) = batch
        .get_mut(n..n + 2)
        .and_then(|s| <&mut [RawDesc; 2]>::try_from(s).ok())
    {
        req.encode_into(seg0, seg1);
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Opens the device: allocates and programs the six rings, the simple-NIC buffers and
    /// the PGT staging buffer, then sets the network parameters and the raw-packet RX buffer.
    pub fn open(
        regs: P::Regs,
        dma: P::Dma,
        mem: P::Mem,
        mut storage: S,
        cfg: DeviceConfig,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<Self, VerbsError> {
        {
            let (sq, cqd) = (storage.sq_depth(), storage.cq_depth());
            let s = storage.slices();
            if sq == 0
                || cqd == 0
                || s.wqes.len() < s.qps.len() * sq
                || s.cqes.len() < s.cqs.len() * cqd
            {
                return Err(VerbsError::InvalidArgument {
                    what: "storage: wqes must hold sq_depth per QP and cqes cq_depth per CQ",
                });
            }
        }
        let cmd = ProducerRing::new(ring_memory(&dma)?, ring_regs(RingId::CmdRequest)?);
        let resp = ConsumerRing::new(ring_memory(&dma)?, ring_regs(RingId::CmdResponse)?);
        let send = ProducerRing::new(ring_memory(&dma)?, ring_regs(RingId::Send(0))?);
        let meta = ConsumerRing::new(ring_memory(&dma)?, ring_regs(RingId::MetaReport(0))?);
        let sn_tx = ProducerRing::new(ring_memory(&dma)?, ring_regs(RingId::SimpleNicTx)?);
        let sn_rx = ConsumerRing::new(ring_memory(&dma)?, ring_regs(RingId::SimpleNicRx)?);
        for p in [&cmd, &send, &sn_tx] {
            p.program(&regs);
        }
        for c in [&resp, &meta, &sn_rx] {
            c.program(&regs);
        }
        let rx_buf = dma.alloc(RX_BUFFER_SIZE as usize, 2 << 20)?;
        let staging = dma.alloc(4096, 4096)?;
        let ack_slots = TxSlots::new(dma.alloc(ACK_SLOT * ACK_SLOTS, 4096)?, ACK_SLOT);
        let raw_slots = TxSlots::new(dma.alloc(RAW_FRAME_MAX * RAW_SLOTS, 4096)?, RAW_FRAME_MAX);
        let rx_addr = rx_buf.device_addr();
        let mut dev = Device {
            regs,
            dma,
            mem,
            storage,
            cfg,
            cmd,
            resp,
            send,
            meta,
            sn_tx,
            sn_rx,
            rx_buf: Some(rx_buf),
            staging: Some(staging),
            ack_slots,
            raw_slots,
            raw_seq: [None; RAW_SLOTS],
            sn_tx_seq: 0,
            keep_raw_frames: false,
            next_tag: 0,
            key_seq: 0x5A,
            pgt_used: [0; (PGT_LEN / 64) as usize],
            pd_used: [1; 4],
            stats: EngineStats::default(),
            oob: None,
            early_len: 0,
        };
        dev.command(
            CmdRequest::SetNetworkParam(SetNetworkParam {
                mac: cfg.mac,
                ip: cfg.ip,
                netmask: cfg.netmask,
                gateway: cfg.gateway,
            }),
            clock,
        )?;
        dev.command(
            CmdRequest::SetRawPacketReceiveMeta(SetRawPacketReceiveMeta {
                write_base_addr: rx_addr,
            }),
            clock,
        )?;
        Ok(dev)
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// The platform's memory resolver (for MRs the caller pins itself).
    pub fn memory(&mut self) -> &mut P::Mem {
        &mut self.mem
    }

    // ----------------------------------------------------------------------------------
    // Command queue.

    /// Sends a command and waits for its response, matched by user_data, with the
    /// configured timeout (an unknown op code is never answered: correction 4).
    fn command(
        &mut self,
        req: CmdRequest,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<CmdResponse, VerbsError> {
        let op = match req {
            CmdRequest::UpdateMrTable(_) => "UpdateMrTable",
            CmdRequest::UpdatePgt(_) => "UpdatePgt",
            CmdRequest::ManageQp(_) => "ManageQp",
            CmdRequest::SetNetworkParam(_) => "SetNetworkParam",
            CmdRequest::SetRawPacketReceiveMeta(_) => "SetRawPacketReceiveMeta",
        };
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        self.cmd
            .push_batch(&self.regs, &[req.encode(tag)])
            .map_err(|_| VerbsError::OutOfResources {
                what: "command ring",
            })?;
        self.stats.commands += 1;
        let deadline = clock() + self.cfg.command_timeout;
        loop {
            while let Some(p) = self.resp.pop() {
                let Popped::One(d) = p else {
                    continue;
                };
                match CmdResponse::decode(&d) {
                    Ok(r) if r.user_data == tag => {
                        self.resp.sync_tail(&self.regs);
                        return if r.is_success {
                            Ok(r)
                        } else {
                            Err(VerbsError::CommandFailed { op })
                        };
                    }
                    Ok(r) => {
                        core_warn!("late command response (tag {}) ignored", r.user_data);
                    }
                    Err(e) => core_error!("bad command response: {}", e),
                }
            }
            self.resp.sync_tail(&self.regs);
            if clock() >= deadline {
                return Err(VerbsError::CommandTimeout { op });
            }
            core::hint::spin_loop();
        }
    }

    fn next_key(&mut self) -> u8 {
        // A different key byte each time an index is reused, so a stale key misses.
        self.key_seq = self
            .key_seq
            .wrapping_mul(1_103_515_245)
            .wrapping_add(12_345);
        (self.key_seq >> 16) as u8
    }

    // ----------------------------------------------------------------------------------
    // Protection domains.

    /// Allocates a protection domain (1..=255).
    pub fn alloc_pd(&mut self) -> Result<u32, VerbsError> {
        for (w, word) in self.pd_used.iter_mut().enumerate() {
            if *word != u64::MAX {
                let bit = (!*word).trailing_zeros();
                *word |= 1 << bit;
                return Ok(w as u32 * 64 + bit);
            }
        }
        Err(VerbsError::OutOfResources {
            what: "protection domains",
        })
    }

    /// Frees a protection domain; refused while an MR or QP uses it.
    pub fn dealloc_pd(&mut self, pd: u32) -> Result<(), VerbsError> {
        let (w, bit) = ((pd / 64) as usize, pd % 64);
        let used = pd != 0 && self.pd_used.get(w).is_some_and(|x| x & (1 << bit) != 0);
        if !used {
            return Err(VerbsError::NoSuchObject {
                what: "PD",
                handle: pd,
            });
        }
        let s = self.storage.slices();
        if s.mrs.iter().any(|m| m.in_use && m.pd == pd)
            || s.qps.iter().any(|q| q.in_use && q.pd == pd)
        {
            return Err(VerbsError::Busy { what: "PD" });
        }
        self.pd_used[w] &= !(1 << bit);
        Ok(())
    }

    fn check_pd(&self, pd: u32) -> Result<(), VerbsError> {
        let (w, bit) = ((pd / 64) as usize, pd % 64);
        if pd != 0 && self.pd_used.get(w).is_some_and(|x| x & (1 << bit) != 0) {
            Ok(())
        } else {
            Err(VerbsError::NoSuchObject {
                what: "PD",
                handle: pd,
            })
        }
    }

    // ----------------------------------------------------------------------------------
    // Memory regions.

    fn alloc_pgt(&mut self, pages: u32) -> Option<u32> {
        let mut run = 0u32;
        for i in 0..PGT_LEN {
            let used = self.pgt_used[(i / 64) as usize] & (1 << (i % 64)) != 0;
            if used {
                run = 0;
                continue;
            }
            run += 1;
            if run == pages {
                let start = i + 1 - pages;
                self.mark_pgt(start, pages, true);
                return Some(start);
            }
        }
        None
    }

    fn mark_pgt(&mut self, start: u32, pages: u32, used: bool) {
        for i in start..start + pages {
            let (w, b) = ((i / 64) as usize, i % 64);
            if used {
                self.pgt_used[w] |= 1 << b;
            } else {
                self.pgt_used[w] &= !(1 << b);
            }
        }
    }

    /// Registers `[va, va + len)`: pins it, writes its page table (<= 16 entries per
    /// command), then the MR table entry, so the card never sees an MR whose pages are not
    /// there yet. Returns the key (lkey = rkey).
    pub fn reg_mr(
        &mut self,
        pd: u32,
        va: VirtAddr,
        len: u64,
        access: AccessFlags,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<MrKey, VerbsError> {
        self.check_pd(pd)?;
        if len == 0 || len > u32::MAX as u64 {
            return Err(VerbsError::InvalidArgument {
                what: "MR length must be 1..=4 GiB-1 (the card's field is 32 bits)",
            });
        }
        if va.0.checked_add(len).is_none() {
            return Err(VerbsError::InvalidArgument {
                what: "MR range wraps the address space",
            });
        }
        let index = {
            let s = self.storage.slices();
            let n = s.mrs.len().min(MR_TABLE_LEN as usize);
            (1..n).find(|&i| !s.mrs[i].in_use)
        }
        .ok_or(VerbsError::OutOfResources { what: "MR table" })? as u32;
        let page = self.cfg.page_size;
        let pages = page.pages_spanned(va.0, len) as u32;
        let pgt_offset = self
            .alloc_pgt(pages)
            .ok_or(VerbsError::OutOfResources { what: "page table" })?;
        if let Err(e) = self.mem.pin(va, len as usize) {
            self.mark_pgt(pgt_offset, pages, false);
            return Err(e.into());
        }
        let key = MrKey::new(index, self.next_key())
            .ok_or(VerbsError::OutOfResources { what: "MR table" })?;
        let result = self.write_mr(key, va, len, access, pd, pgt_offset, pages, clock);
        if let Err(e) = result {
            self.mem.unpin(va, len as usize);
            self.mark_pgt(pgt_offset, pages, false);
            return Err(e);
        }
        let s = self.storage.slices();
        s.mrs[index as usize] = MrSlot {
            in_use: true,
            key: key.get(),
            va: va.0,
            len,
            access: access.bits() as u32,
            pd,
            pgt_offset,
            pages,
        };
        Ok(key)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_mr(
        &mut self,
        key: MrKey,
        va: VirtAddr,
        len: u64,
        access: AccessFlags,
        pd: u32,
        pgt_offset: u32,
        pages: u32,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let page = self.cfg.page_size;
        let mut done = 0u32;
        while done < pages {
            let n = (pages - done).min(DRIVER_ENTRIES_PER_UPDATE as u32) as usize;
            let mut entries = [DeviceAddr(0); DRIVER_ENTRIES_PER_UPDATE];
            let first = VirtAddr(page.base_of(va.0) + done as u64 * page.bytes());
            self.mem.translate(first, page, &mut entries[..n])?;
            let staging = self.staging.as_mut().ok_or(VerbsError::Unsupported {
                what: "closed device",
            })?;
            let dev = staging.device_addr();
            let cmd = stage_pgt_update(
                staging.as_mut_slice(),
                dev,
                pgt_offset + done,
                &entries[..n],
            )?;
            self.command(CmdRequest::UpdatePgt(cmd), clock)?;
            done += n as u32;
        }
        self.command(
            CmdRequest::UpdateMrTable(UpdateMrTable {
                mr_base_va: va,
                mr_length: len as u32,
                mr_key: key,
                pd,
                acc_flags: access,
                pgt_offset,
            }),
            clock,
        )?;
        Ok(())
    }

    /// Deregisters an MR: invalidates it in the card first (mr_length 0), then unpins and
    /// frees its key and page-table range.
    pub fn dereg_mr(
        &mut self,
        key: MrKey,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let slot = self.mr_slot(key)?;
        self.retire_mr_users(key);
        self.command(
            CmdRequest::UpdateMrTable(UpdateMrTable {
                mr_base_va: VirtAddr(0),
                mr_length: 0,
                mr_key: key,
                pd: 0,
                acc_flags: AccessFlags::empty(),
                pgt_offset: 0,
            }),
            clock,
        )?;
        self.mem.unpin(VirtAddr(slot.va), slot.len as usize);
        self.mark_pgt(slot.pgt_offset, slot.pages, false);
        self.storage.slices().mrs[key.index() as usize] = MrSlot::default();
        Ok(())
    }

    /// Work still queued on an MR that is being deregistered must never reach the card (a
    /// WQE with an invalid lkey stops the RTL). Internal READ responses using it are dropped
    /// (the requester times out, as if the data were gone); an application request still
    /// using it fails its QP with LOC_PROT_ERR.
    fn retire_mr_users(&mut self, key: MrKey) {
        let depth = self.storage.sq_depth();
        let nqps = self.storage.slices().qps.len();
        for i in 0..nqps {
            let mut app_user = false;
            {
                let s = self.storage.slices();
                let q = &s.qps[i];
                if !q.in_use {
                    continue;
                }
                for k in 0..q.sq_len {
                    let w = &mut s.wqes[i * depth + ((q.sq_head + k) as usize % depth)];
                    if w.lkey != key.get() || w.state == WqeState::Acked && w.read_done {
                        continue;
                    }
                    if w.internal {
                        w.state = WqeState::Acked;
                        w.read_done = true;
                    } else if w.state != WqeState::Acked
                        || !w.read_done && w.op == Some(WorkReqOpcode::Read)
                    {
                        app_user = true;
                    }
                }
            }
            if app_user {
                self.fail_qp(i, WcStatus::LocProtErr);
            } else {
                self.complete_head(i);
            }
        }
    }

    fn mr_slot(&mut self, key: MrKey) -> Result<MrSlot, VerbsError> {
        let s = self.storage.slices();
        match s.mrs.get(key.index() as usize) {
            Some(m) if m.in_use && m.key == key.get() => Ok(*m),
            _ => Err(VerbsError::NoSuchObject {
                what: "MR",
                handle: key.get(),
            }),
        }
    }

    /// Whether `[va, va + len)` lies in the MR of `key` with `access` (and PD `pd`).
    fn mr_covers(&mut self, key: MrKey, va: u64, len: u32, access: u32, pd: Option<u32>) -> bool {
        let Ok(m) = self.mr_slot(key) else {
            return false;
        };
        let inside = va >= m.va
            && va
                .checked_add(len as u64)
                .is_some_and(|end| end <= m.va + m.len);
        inside && m.access & access == access && pd.is_none_or(|p| p == m.pd)
    }

    // ----------------------------------------------------------------------------------
    // Completion queues.

    /// Creates a completion queue; returns its handle.
    pub fn create_cq(&mut self) -> Result<u32, VerbsError> {
        let s = self.storage.slices();
        let i = s
            .cqs
            .iter()
            .position(|c| !c.in_use)
            .ok_or(VerbsError::OutOfResources {
                what: "completion queues",
            })?;
        s.cqs[i] = CqSlot {
            in_use: true,
            ..CqSlot::default()
        };
        Ok(i as u32)
    }

    /// Destroys a completion queue; refused while a QP uses it.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<(), VerbsError> {
        let s = self.storage.slices();
        if !s.cqs.get(cq as usize).is_some_and(|c| c.in_use) {
            return Err(VerbsError::NoSuchObject {
                what: "CQ",
                handle: cq,
            });
        }
        if s.qps
            .iter()
            .any(|q| q.in_use && (q.send_cq == cq || q.recv_cq == cq))
        {
            return Err(VerbsError::Busy { what: "CQ" });
        }
        s.cqs[cq as usize] = CqSlot::default();
        Ok(())
    }

    /// Moves up to `out.len()` completions of `cq` into `out`; returns how many.
    pub fn poll_cq(&mut self, cq: u32, out: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let depth = self.storage.cq_depth();
        let s = self.storage.slices();
        let slot =
            s.cqs
                .get_mut(cq as usize)
                .filter(|c| c.in_use)
                .ok_or(VerbsError::NoSuchObject {
                    what: "CQ",
                    handle: cq,
                })?;
        let n = (slot.len as usize).min(out.len());
        let base = cq as usize * depth;
        for o in out.iter_mut().take(n) {
            *o = s.cqes[base + slot.head as usize];
            slot.head = (slot.head + 1) % depth as u32;
            slot.len -= 1;
        }
        Ok(n)
    }

    fn push_cqe(storage: &mut S, stats: &mut EngineStats, cq: u32, wc: WorkCompletion) {
        let depth = storage.cq_depth();
        let s = storage.slices();
        let Some(slot) = s.cqs.get_mut(cq as usize).filter(|c| c.in_use) else {
            return;
        };
        if slot.len as usize >= depth {
            slot.overruns += 1;
            stats.cq_overruns += 1;
            core_error!("CQ {} overrun: completion of wr_id {} lost", cq, wc.wr_id);
            return;
        }
        let at = cq as usize * depth + ((slot.head + slot.len) as usize % depth);
        s.cqes[at] = wc;
        slot.len += 1;
    }

    // ----------------------------------------------------------------------------------
    // Queue pairs.

    /// Creates an RC QP in RESET on `pd` with the given CQs; tells the card (ManageQp).
    pub fn create_qp(
        &mut self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        qp_type: QpType,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<QpHandle, VerbsError> {
        self.check_pd(pd)?;
        if qp_type != QpType::Rc {
            return Err(VerbsError::Unsupported {
                what: "QP types other than RC (the card has RC only)",
            });
        }
        let key = self.next_key();
        let index = {
            let s = self.storage.slices();
            for cq in [send_cq, recv_cq] {
                if !s.cqs.get(cq as usize).is_some_and(|c| c.in_use) {
                    return Err(VerbsError::NoSuchObject {
                        what: "CQ",
                        handle: cq,
                    });
                }
            }
            let i = s
                .qps
                .iter()
                .position(|q| !q.in_use)
                .ok_or(VerbsError::OutOfResources {
                    what: "queue pairs",
                })?;
            i as u32 + 1
        };
        let qpn = Qpn::new(index, key).ok_or(VerbsError::OutOfResources {
            what: "queue pairs",
        })?;
        let slot = fresh_qp(qpn, qp_type, pd, send_cq, recv_cq);
        self.storage.slices().qps[index as usize - 1] = slot;
        if let Err(e) = self.manage_qp(qpn, true, clock) {
            self.storage.slices().qps[index as usize - 1] = QpSlot::default();
            return Err(e);
        }
        Ok(qpn)
    }

    fn qp_index(&mut self, qpn: Qpn) -> Result<usize, VerbsError> {
        let i = (qpn.index() as usize).wrapping_sub(1);
        let s = self.storage.slices();
        match s.qps.get(i) {
            Some(q) if q.in_use && q.qpn == qpn => Ok(i),
            _ => Err(VerbsError::NoSuchObject {
                what: "QP",
                handle: qpn.get(),
            }),
        }
    }

    fn manage_qp(
        &mut self,
        qpn: Qpn,
        valid: bool,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let q = self.storage.slices().qps[i].clone();
        // REMOTE_WRITE is always granted in the card: a SEND arrives as a write into the
        // receive buffer and the card checks REMOTE_WRITE on the QP for it (nic-behaviour.md
        // 2.3). A remote WRITE still needs REMOTE_WRITE on the target MR, which the card
        // checks; the QP-level refusal of WRITEs is lost (README, hardware limitations).
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | if q.access.contains(QpAccessFlags::REMOTE_READ) {
                AccessFlags::REMOTE_READ
            } else {
                AccessFlags::empty()
            };
        // READ responses arrive as writes into the requester's buffer: the card checks
        // LOCAL_WRITE on the QP for them (nic-behaviour.md 2.3), so it is always granted;
        // REMOTE_WRITE follows the QP's attribute.
        self.command(
            CmdRequest::ManageQp(ManageQp {
                is_valid: valid,
                is_error: false,
                pd: q.pd,
                qpn,
                peer_qpn: q.dest_qpn,
                rq_access_flags: access,
                qp_type: q.qp_type,
                pmtu: q.pmtu,
                local_udp_port: (qpn.get() & 0xFFFF) as u16,
                peer_mac: q.peer_mac,
                peer_ip: q.peer_ip,
            }),
            clock,
        )?;
        Ok(())
    }

    /// Modifies a QP (IB state machine, attribute table as const data). ManageQp is sent
    /// only when the QP reaches RTR (and at create and destroy), because every ManageQp
    /// resets the card's ACK tracking (correction 5).
    pub fn modify_qp(
        &mut self,
        qpn: QpHandle,
        raw: &RawQpAttr,
        mask: QpAttrMask,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let attr = QpAttr::decode(raw, mask)?;
        let (qp_type, state) = {
            let q = &self.storage.slices().qps[i];
            (q.qp_type, q.state)
        };
        let cur = attr.cur_qp_state.unwrap_or(state);
        let next = check_modify(qp_type, state, mask, cur, attr.qp_state.unwrap_or(state))?;
        {
            let q = &mut self.storage.slices().qps[i];
            if let Some(v) = attr.path_mtu {
                q.pmtu = v;
            }
            if let Some(v) = attr.dest_qpn {
                q.dest_qpn = v;
            }
            if let Some(v) = attr.dest_ipv4 {
                q.peer_ip = v;
            }
            if let Some(v) = attr.access {
                q.access = v;
            }
            if let Some(v) = attr.rq_psn {
                q.rx.reset(v);
                q.acked_rx = v;
                q.next_msg = v;
            }
            if let Some(v) = attr.sq_psn {
                q.next_psn = v;
                q.acked_psn = v;
            }
            if let Some(v) = attr.timeout {
                q.timeout = v;
            }
            if let Some(v) = attr.retry_cnt {
                q.retry_cnt = v;
                q.retries_left = v;
            }
            if let Some(v) = attr.rnr_retry {
                q.rnr_retry = v;
                q.rnr_left = v;
            }
            if let Some(v) = attr.min_rnr_timer {
                q.min_rnr_timer = v;
            }
        }
        if next == QpState::Rtr && state != QpState::Rtr {
            self.manage_qp(qpn, true, clock)?;
            // ManageQp reset the card's window: its bits for these PSNs mean nothing.
            let q = &mut self.storage.slices().qps[i];
            q.card_fresh = true;
            record_lost(q, RESET_PHANTOMS);
        }
        if next == QpState::Reset && state != QpState::Reset {
            self.reset_qp(i);
            self.manage_qp(qpn, true, clock)?;
        }
        if next == QpState::Err && state != QpState::Err {
            self.storage.slices().qps[i].state = QpState::Err;
            self.flush_qp(i);
        }
        self.storage.slices().qps[i].state = next;
        if next == QpState::Rtr && state != QpState::Rtr {
            let now = clock();
            self.connected(i, now);
        }
        Ok(())
    }

    fn reset_qp(&mut self, i: usize) {
        let q = &mut self.storage.slices().qps[i];
        *q = fresh_qp(q.qpn, q.qp_type, q.pd, q.send_cq, q.recv_cq);
    }

    /// How many of the QP's send WRs have left its send queue (completed, failed or
    /// flushed, signaled or not) since it was created or reset: a caller that numbers its
    /// posts knows which of its buffers the card is done with.
    pub fn sq_retired(&mut self, qpn: QpHandle) -> Result<u64, VerbsError> {
        let i = self.qp_index(qpn)?;
        Ok(self.storage.slices().qps[i].retired)
    }

    /// The QP's state and the attributes the driver honours.
    pub fn query_qp(&mut self, qpn: QpHandle) -> Result<QpSlot, VerbsError> {
        let i = self.qp_index(qpn)?;
        Ok(self.storage.slices().qps[i].clone())
    }

    /// Destroys a QP: invalidates it in the card (ManageQp is_valid = 0) before its index
    /// can be reused; outstanding work is flushed.
    pub fn destroy_qp(
        &mut self,
        qpn: QpHandle,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        self.manage_qp(qpn, false, clock)?;
        self.storage.slices().qps[i].state = QpState::Err;
        self.flush_qp(i);
        self.storage.slices().qps[i] = QpSlot::default();
        Ok(())
    }

    // ----------------------------------------------------------------------------------
    // Posting.

    /// Posts a chain of send work requests. On the first failure, returns its index in
    /// `wrs` (`bad_wr`) and the reason; the requests before it are posted.
    pub fn post_send(
        &mut self,
        qpn: QpHandle,
        wrs: &[SendWr],
        now: Instant,
    ) -> Result<(), (usize, VerbsError)> {
        let i = self.qp_index(qpn).map_err(|e| (0, e))?;
        for (k, wr) in wrs.iter().enumerate() {
            self.post_one(i, wr).map_err(|e| (k, e))?;
        }
        self.transmit(i, now);
        Ok(())
    }

    fn post_one(&mut self, i: usize, wr: &SendWr) -> Result<(), VerbsError> {
        let depth = self.storage.sq_depth();
        let (state, pd, pmtu, sq_len, dest) = {
            let q = &self.storage.slices().qps[i];
            (q.state, q.pd, q.pmtu, q.sq_len, q.dest_qpn)
        };
        if state != QpState::Rts {
            return Err(VerbsError::WrongQpState {
                state,
                op: "post_send",
            });
        }
        let _ = dest;
        if sq_len as usize >= depth {
            return Err(VerbsError::SendQueueFull);
        }
        let (op, imm) = match wr.op {
            SendOp::Write => (WorkReqOpcode::Write, 0),
            SendOp::WriteWithImm(imm) => (WorkReqOpcode::WriteWithImm, imm),
            SendOp::Read => (WorkReqOpcode::Read, 0),
            SendOp::Send | SendOp::SendWithImm(_) if self.oob.is_none() => {
                return Err(VerbsError::Unsupported {
                    what: "SEND on a platform without an out-of-band channel",
                })
            }
            SendOp::Send => (WorkReqOpcode::Send, 0),
            SendOp::SendWithImm(imm) => (WorkReqOpcode::SendWithImm, imm),
        };
        // SEND, and WRITE_WITH_IMM when the peer announces its receive WRs, use the peer's
        // next receive WR (oob-channel.md): its address is known only when it is matched.
        let needs_recv = matches!(op, WorkReqOpcode::Send | WorkReqOpcode::SendWithImm)
            || op == WorkReqOpcode::WriteWithImm && self.oob.is_some();
        if wr.len > 0 {
            // The local buffer: READ writes it, WRITE reads it.
            let need = if op == WorkReqOpcode::Read {
                AccessFlags::LOCAL_WRITE.bits() as u32
            } else {
                0
            };
            if !self.mr_covers(wr.lkey, wr.laddr.0, wr.len, need, Some(pd)) {
                return Err(VerbsError::LocalProtection {
                    lkey: wr.lkey.get(),
                });
            }
        }
        if op == WorkReqOpcode::Read && wr.len == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "READ of zero bytes",
            });
        }
        if op == WorkReqOpcode::Read
            && !self.mr_covers(
                wr.lkey,
                wr.laddr.0,
                wr.len,
                AccessFlags::REMOTE_WRITE.bits() as u32,
                None,
            )
        {
            return Err(VerbsError::Unsupported {
                what: "READ into an MR without REMOTE_WRITE (the card checks REMOTE_WRITE on read responses)",
            });
        }
        if chunk_count_len(wr.len) * 2 > crate::ring::RING_LEN as usize / 2 {
            return Err(VerbsError::InvalidArgument {
                what: "length above 64 MiB (one request must fit half the send ring)",
            });
        }
        // A SEND's remote address comes from the peer's receive WR: the caller's is ignored.
        let is_send = matches!(op, WorkReqOpcode::Send | WorkReqOpcode::SendWithImm);
        if !is_send && wr.raddr.0.checked_add(wr.len as u64).is_none() {
            return Err(VerbsError::InvalidArgument {
                what: "remote range wraps the address space",
            });
        }
        let _ = pmtu;
        self.enqueue(
            i,
            Wqe {
                wr_id: wr.wr_id,
                op: Some(op),
                imm,
                laddr: wr.laddr.0,
                lkey: wr.lkey.get(),
                len: wr.len,
                raddr: wr.raddr.0,
                rkey: wr.rkey.get(),
                psn: 0,
                npsn: 0,
                msn: 0,
                signaled: wr.signaled,
                solicited: wr.solicited,
                internal: false,
                state: WqeState::Pending,
                read_done: false,
                needs_recv,
            },
        );
        Ok(())
    }

    /// Appends a WQE. Its PSN range and MSN are assigned when it is first transmitted (in
    /// posting order): a SEND's packet count depends on the receive buffer it is matched with.
    fn enqueue(&mut self, i: usize, w: Wqe) {
        let depth = self.storage.sq_depth();
        let s = self.storage.slices();
        let q = &mut s.qps[i];
        let at = i * depth + ((q.sq_head + q.sq_len) as usize % depth);
        s.wqes[at] = w;
        q.sq_len += 1;
    }

    /// Posts receive WRs; they are announced to the peer over the out-of-band channel once
    /// the QP is connected (RTR).
    pub fn post_recv(&mut self, qpn: QpHandle, wrs: &[RecvWr]) -> Result<(), (usize, VerbsError)> {
        let i = self.qp_index(qpn).map_err(|e| (0, e))?;
        for (k, wr) in wrs.iter().enumerate() {
            let pd = self.storage.slices().qps[i].pd;
            if wr.len > 0
                && !self.mr_covers(
                    wr.lkey,
                    wr.addr.0,
                    wr.len,
                    AccessFlags::LOCAL_WRITE.bits() as u32,
                    Some(pd),
                )
            {
                return Err((
                    k,
                    VerbsError::LocalProtection {
                        lkey: wr.lkey.get(),
                    },
                ));
            }
            let q = &mut self.storage.slices().qps[i];
            if q.state == QpState::Reset {
                return Err((
                    k,
                    VerbsError::WrongQpState {
                        state: q.state,
                        op: "post_recv",
                    },
                ));
            }
            q.recvs.push_back(*wr).map_err(|_| {
                (
                    k,
                    VerbsError::OutOfResources {
                        what: "receive queue",
                    },
                )
            })?;
            if q.state == QpState::Err {
                // IB: a receive WR posted to a QP in the error state is flushed.
                self.fail_recv(i, WcStatus::WrFlushErr);
            } else {
                q.to_announce += 1;
            }
        }
        self.announce_recvs(i);
        Ok(())
    }

    /// Tells the peer about receive WRs posted since the last announcement, once the QP
    /// knows its peer (RTR or later). A record the transport cannot take now stays pending.
    fn announce_recvs(&mut self, i: usize) {
        let Some(oob) = self.oob.as_mut() else {
            return;
        };
        let s = self.storage.slices();
        let q = &mut s.qps[i];
        if !matches!(q.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return;
        }
        let total = q.recvs.len() as u32;
        while q.to_announce > 0 {
            let Some(r) = q.recvs.iter().nth((total - q.to_announce) as usize) else {
                q.to_announce = 0;
                break;
            };
            let rec = OobRecvWr {
                wr_id: r.wr_id,
                addr: r.addr.0,
                length: r.len,
                lkey: r.lkey.get(),
                qpn: q.qpn.get(),
            };
            match oob.send(q.peer_ip, &rec) {
                Ok(()) => {
                    q.to_announce -= 1;
                    self.stats.recvs_announced += 1;
                }
                Err(e) => {
                    core_warn!("announcing a receive WR to {}: {}", q.peer_ip, e);
                    break;
                }
            }
        }
    }

    /// Attaches the out-of-band channel that carries receive WRs between drivers
    /// (oob-channel.md). Without one, SEND is refused and WRITE_WITH_IMM does not consume
    /// the peer's receive WRs.
    pub fn attach_oob(&mut self, oob: P::Oob) {
        self.oob = Some(oob);
    }

    /// Takes what arrived on the out-of-band channel: receive WRs go to the QP whose peer
    /// they come from (held until that QP reaches RTR), a lost peer fails its QPs.
    fn poll_oob(&mut self, now: Instant) -> bool {
        let mut any = false;
        for _ in 0..1024 {
            let Some(ev) = self.oob.as_mut().and_then(|o| o.poll()) else {
                break;
            };
            any = true;
            match ev {
                OobEvent::RecvWr { from, wr } => {
                    self.stats.recvs_received += 1;
                    if !self.deliver_remote_recv(from, wr, now) {
                        self.stats.recvs_early += 1;
                        let early = self.storage.slices().early;
                        if let Some(slot) = early.get_mut(self.early_len) {
                            *slot = EarlyRecv { from, wr };
                            self.early_len += 1;
                        } else {
                            self.stats.recvs_dropped += 1;
                            core_error!(
                                "receive WR for QP {:#x} from {}: no such QP, waiting list of {} full",
                                wr.qpn,
                                from,
                                early.len()
                            );
                        }
                    }
                }
                OobEvent::RecvTooShort { from, rec } => self.on_recv_too_short(from, rec),
                OobEvent::PeerLost { peer } => {
                    // Only what needs the channel fails: a QP with a SEND waiting for the
                    // peer's receive WR goes to ERR (its WRs flushed). Others keep running,
                    // as on a real card when a peer process exits: WRITEs and READs use the
                    // link, receive WRs stay posted, and a later SEND fails at once.
                    let nqps = self.storage.slices().qps.len();
                    let depth = self.storage.sq_depth();
                    for i in 0..nqps {
                        let (hit, waiting) = {
                            let s = self.storage.slices();
                            let q = &s.qps[i];
                            let hit = q.in_use
                                && q.peer_ip == peer
                                && matches!(q.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
                            let waiting = hit
                                && (q.sq_sent..q.sq_len).any(|k| {
                                    let w = &s.wqes[i * depth + ((q.sq_head + k) as usize % depth)];
                                    w.needs_recv && w.state == WqeState::Pending
                                });
                            (hit, waiting)
                        };
                        if !hit {
                            continue;
                        }
                        self.stats.peers_lost += 1;
                        let q = &mut self.storage.slices().qps[i];
                        q.oob_lost = true;
                        if waiting {
                            q.state = QpState::Err;
                            self.flush_qp(i);
                        }
                    }
                }
            }
        }
        any
    }

    /// The connected QP (RTR or later) whose peer is QP `peer_qpn` at `from`: where the
    /// out-of-band records of that peer QP go.
    fn peer_qp(&mut self, from: Ipv4Addr, peer_qpn: u32) -> Option<usize> {
        self.storage.slices().qps.iter().position(|q| {
            q.in_use
                && q.dest_qpn.get() == peer_qpn
                && q.peer_ip == from
                && matches!(q.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
        })
    }

    /// Hands an announced receive WR to its QP; false if no connected QP matches.
    fn deliver_remote_recv(&mut self, from: Ipv4Addr, wr: OobRecvWr, now: Instant) -> bool {
        let Some(i) = self.peer_qp(from, wr.qpn) else {
            return false;
        };
        let q = &mut self.storage.slices().qps[i];
        q.oob_lost = false;
        if q.remote_recvs.push_back(wr).is_err() {
            core_error!(
                "QP {:#x}: more announced receive WRs than the queue holds",
                q.qpn.get()
            );
            self.stats.recvs_dropped += 1;
            return true;
        }
        q.rnr_deadline = None;
        self.transmit(i, now);
        true
    }

    /// The peer at `from` found the receive WR `rec.wr_id` too short for a SEND of
    /// `rec.send_len` bytes (it completed the SEND with REM_INV_REQ_ERR and wrote nothing):
    /// the messages that arrived before it complete first, then that receive WR with
    /// LOC_LEN_ERR, and the QP goes to ERR with the rest flushed (oob-channel.md).
    fn on_recv_too_short(&mut self, from: Ipv4Addr, rec: RecvTooShort) {
        self.stats.recvs_too_short += 1;
        let Some(i) = self.peer_qp(from, rec.qpn) else {
            core_error!(
                "{} found receive WR {:#x} too short for its {}-byte SEND, but no connected QP has peer QP {:#x} there",
                from,
                rec.wr_id,
                rec.send_len,
                rec.qpn
            );
            return;
        };
        // The requester tells only when the SEND is its oldest request: the SENDs before it
        // were acknowledged, so their completions come first.
        self.deliver_ready(i);
        let (qpn, head) = {
            let q = &self.storage.slices().qps[i];
            (q.qpn.get(), q.recvs.front().map(|r| r.wr_id))
        };
        match head {
            Some(head) if head == rec.wr_id => {}
            Some(head) => core_error!(
                "QP {:#x}: {} found receive WR {:#x} too short for a {}-byte SEND, but the oldest receive WR is {:#x}; completing {:#x} with LOC_LEN_ERR",
                qpn,
                from,
                rec.wr_id,
                rec.send_len,
                head,
                head
            ),
            None => core_error!(
                "QP {:#x}: {} found receive WR {:#x} too short for a {}-byte SEND, but no receive WR is posted",
                qpn,
                from,
                rec.wr_id,
                rec.send_len
            ),
        }
        core_warn!(
            "QP {:#x}: a {}-byte SEND from {} did not fit receive WR {:#x}: LOC_LEN_ERR, QP to ERR",
            qpn,
            rec.send_len,
            from,
            rec.wr_id
        );
        self.fail_recv(i, WcStatus::LocLenErr);
        let q = &mut self.storage.slices().qps[i];
        q.state = QpState::Err;
        self.flush_qp(i);
    }

    /// After QP `i` reached RTR: announce its receive WRs and take the peer's that came
    /// early.
    fn connected(&mut self, i: usize, now: Instant) {
        self.announce_recvs(i);
        // Deliver in arrival order and compact the rest (kept in order) to the front.
        let mut kept = 0;
        for k in 0..self.early_len {
            let e = self.storage.slices().early[k];
            if !self.deliver_remote_recv(e.from, e.wr, now) {
                self.storage.slices().early[kept] = e;
                kept += 1;
            }
        }
        self.early_len = kept;
    }

    /// Hands pending WQEs of QP `i` to the card while the send window has room.
    fn transmit(&mut self, i: usize, now: Instant) {
        let depth = self.storage.sq_depth();
        let mut batch = [RawDesc::ZERO; BATCH];
        let mut n = 0usize;
        loop {
            // Copies of the few fields used below: the slot itself, with its receive
            // queues, is tens of KiB and must not be copied per WQE.
            let (mut w, path, idx, sq_sent, next_psn, next_msn, acked_psn) = {
                let s = self.storage.slices();
                let q = &s.qps[i];
                // The newest request handed over may still have packets the window held
                // back: it goes on first.
                let cut = cut_short(q, s.wqes, i, depth);
                let partial = cut.is_some();
                let idx = cut.unwrap_or(i * depth + ((q.sq_head + q.sq_sent) as usize % depth));
                // A responder in RTR answers READ requests (internal WQEs, the only kind
                // an RTR QP can hold); everything else waits for RTS.
                let may_send = match q.state {
                    QpState::Rts | QpState::Sqd => true,
                    QpState::Rtr => s.wqes[idx].internal,
                    _ => false,
                };
                if !partial && q.sq_sent >= q.sq_len || !may_send {
                    break;
                }
                let p = Path::of(q);
                (
                    s.wqes[idx],
                    p,
                    idx,
                    q.sq_sent,
                    q.next_psn,
                    q.next_msn,
                    q.acked_psn,
                )
            };
            if w.state == WqeState::Pending && w.needs_recv {
                // Match the peer's next announced receive WR (oob-channel.md), or wait for
                // one under the RNR rules.
                let Some(r) = self.storage.slices().qps[i].remote_recvs.front().copied() else {
                    if self.storage.slices().qps[i].oob_lost {
                        // No receive WR can be announced any more.
                        self.storage.slices().qps[i].state = QpState::Err;
                        self.flush_qp(i);
                        break;
                    }
                    let q = &mut self.storage.slices().qps[i];
                    if q.rnr_deadline.is_none() {
                        q.rnr_deadline = Some(now + Nanos::ib_rnr_timer(q.min_rnr_timer));
                    }
                    break;
                };
                let is_send =
                    matches!(w.op, Some(WorkReqOpcode::Send | WorkReqOpcode::SendWithImm));
                if is_send && w.len > r.length {
                    // Too long for the receive buffer: only once it is the oldest request,
                    // so the error completes the right WR and the receiver, told, has
                    // completed the SENDs before it.
                    if sq_sent == 0 {
                        self.send_too_long(i, &r, w.len);
                    }
                    break;
                }
                let q = &mut self.storage.slices().qps[i];
                q.remote_recvs.pop_front();
                q.rnr_deadline = None;
                q.rnr_left = q.rnr_retry;
                if is_send {
                    w.raddr = r.addr;
                    w.rkey = r.lkey;
                }
                w.needs_recv = false;
            }
            if w.state == WqeState::Pending {
                // PSNs and the MSN are assigned at first transmission, in posting order.
                w.npsn = if w.op == Some(WorkReqOpcode::Read) {
                    1
                } else {
                    num_packets(w.raddr, w.len, path.pmtu)
                };
                w.psn = next_psn.get();
                w.msn = next_msn;
            }
            let Some((sent, need)) = self.window_room(w, next_psn, acked_psn) else {
                self.storage.slices().wqes[idx] = w;
                break;
            };
            if n + need > BATCH && n > 0 {
                self.flush_send(&batch[..n]);
                n = 0;
            }
            if (self.send.free_slots() as usize) < n + need {
                let _ = self.send.refresh_tail(&self.regs);
                if (self.send.free_slots() as usize) < n + need {
                    self.storage.slices().wqes[idx] = w;
                    break;
                }
            }
            let Ok(frag) = Fragmenter::new(span_of(&w), path.pmtu, CHUNK_BYTES) else {
                self.storage.slices().wqes[idx] = w;
                break;
            };
            // Packets of `w` already handed over (a request the window cut short), and
            // the ones that go now.
            let from = Psn::from_raw(w.psn).forward_distance(next_psn).min(w.npsn);
            let to = from + sent;
            let whole = w.op == Some(WorkReqOpcode::Read) || w.len == 0;
            for c in frag.filter_map(|c| packets_of(&c, path.pmtu, w.psn, (from, to), whole)) {
                n = self.append_chunk(&path, &w, &c, &mut batch, n, false);
                self.stats.chunks += 1;
            }
            let s = self.storage.slices();
            let first = w.state == WqeState::Pending;
            w.state = WqeState::Sent;
            s.wqes[idx] = w;
            let q = &mut s.qps[i];
            q.next_psn = Psn::from_raw(w.psn).wrapping_add(to);
            if first {
                q.next_msn = w.msn.wrapping_add(1);
                q.sq_sent += 1;
            }
            if q.deadline.is_none() {
                q.deadline = timeout_of(q).map(|t| now + t);
            }
            if to < w.npsn {
                // The window is full in the middle of this request: the rest goes out as
                // ACKs open it.
                break;
            }
        }
        if n > 0 {
            self.flush_send(&batch[..n]);
        }
    }

    /// How many more packets of `w` the send window lets go now (none: `None`), and the
    /// send-ring slots they may take. The window is capped below the card's 128-PSN receive
    /// window ([`SEND_WINDOW_CAP`]) even within one request, so a go-back-N resend from the
    /// oldest unacknowledged PSN always lands inside the peer card's window, never in its
    /// stale zone.
    fn window_room(&self, w: Wqe, next_psn: Psn, acked_psn: Psn) -> Option<(u32, usize)> {
        let window = self.cfg.send_window.clamp(1, SEND_WINDOW_CAP);
        let outstanding = acked_psn.forward_distance(next_psn);
        let left = unsent_packets(&w, next_psn);
        let room = window.saturating_sub(outstanding);
        if room == 0 || left == 0 {
            return None;
        }
        let whole = w.op == Some(WorkReqOpcode::Read) || w.len == 0;
        let count = if whole { left } else { left.min(room) };
        Some((count, 2 * chunk_count(&w)))
    }

    fn flush_send(&mut self, descs: &[RawDesc]) {
        if self.send.push_batch(&self.regs, descs).is_err() {
            self.stats.send_refused += 1;
            // The caller checked the free slots; a refusal here means the card reported an
            // impossible tail. The WQEs stay Sent and the retransmission timer resends them.
            core_error!("send ring refused a batch of {} descriptors", descs.len());
        }
    }

    /// The send request (Seg0 + Seg1) of one chunk of `w`.
    fn chunk_request(&self, q: &Path, w: &Wqe, c: &Chunk) -> SendRequest {
        let mut flags = SendFlags::SIGNALED; // AckReq on every packet (correction 13)
        if w.solicited {
            flags |= SendFlags::SOLICITED;
        }
        let op = w.op.unwrap_or(WorkReqOpcode::Write);
        SendRequest {
            seg0: SendSeg0 {
                op,
                flags,
                dqpn: q.dest_qpn,
                qp_type: QpType::Rc,
                psn: c.psn.get(),
                raddr: c.raddr,
                dqp_ip: q.peer_ip,
                rkey: MrKey::from_raw(w.rkey),
                total_len: w.len,
                msn: w.msn,
            },
            seg1: SendSeg1 {
                laddr: c.laddr,
                len: if op == WorkReqOpcode::Read {
                    w.len
                } else {
                    c.len
                },
                lkey: MrKey::from_raw(w.lkey),
                sqpn: q.qpn,
                mac: q.peer_mac,
                imm: w.imm,
                enable_ecn: false,
                is_retry: c.is_retry,
                is_last: c.is_last,
                is_first: c.is_first,
                pmtu: q.pmtu,
            },
        }
    }

    // ----------------------------------------------------------------------------------
    // The poll loop.

    /// Drives the device: card reports, completions, ACK frames, waiting work, timers.
    /// Returns whether anything happened.
    pub fn poll(&mut self, now: Instant) -> bool {
        let mut work = self.poll_meta(now);
        work |= self.poll_raw_rx();
        work |= self.poll_oob(now);
        work |= self.deliver_and_ack(now);
        let nqps = self.storage.slices().qps.len();
        for i in 0..nqps {
            let (in_use, has_pending, deadline) = {
                let depth = self.storage.sq_depth();
                let s = self.storage.slices();
                let q = &s.qps[i];
                let pending = q.sq_sent < q.sq_len || cut_short(q, s.wqes, i, depth).is_some();
                (q.in_use, pending, q.deadline)
            };
            if !in_use {
                continue;
            }
            if has_pending {
                self.transmit(i, now);
            }
            if deadline.is_some_and(|d| now >= d) {
                self.on_timeout(i, now);
                work = true;
            }
            let rnr = self.storage.slices().qps[i].rnr_deadline;
            if rnr.is_some_and(|d| now >= d) {
                self.on_rnr_timeout(i, now);
                work = true;
            }
        }
        work
    }

    /// A SEND waited `min_rnr_timer` for a receive WR: try again, or give up after
    /// `rnr_retry` waits (7 = wait forever) with RNR_RETRY_EXC_ERR.
    fn on_rnr_timeout(&mut self, i: usize, now: Instant) {
        self.stats.rnr_waits += 1;
        let q = &mut self.storage.slices().qps[i];
        q.rnr_deadline = None;
        if q.rnr_retry != 7 {
            if q.rnr_left == 0 {
                self.fail_qp(i, WcStatus::RnrRetryExcErr);
                return;
            }
            q.rnr_left -= 1;
        }
        self.transmit(i, now);
    }

    /// The earliest retransmission deadline, so a progress thread knows how long it may sleep.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let rnr = self
            .storage
            .slices()
            .qps
            .iter()
            .filter(|q| q.in_use)
            .filter_map(|q| q.rnr_deadline)
            .min();
        let retx = self
            .storage
            .slices()
            .qps
            .iter()
            .filter(|q| q.in_use)
            .filter_map(|q| q.deadline)
            .min();
        match (rnr, retx) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn poll_meta(&mut self, now: Instant) -> bool {
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

    fn poll_raw_rx(&mut self) -> bool {
        // A consumer drains the ring with take_raw_frames; without one the frames are
        // dropped here, since the card stops receiving when the ring stays full
        // (correction 1).
        if self.keep_raw_frames {
            return false;
        }
        let mut dropped = 0;
        let popped = self.drain_raw(&mut |_| dropped += 1);
        self.stats.raw_dropped += dropped;
        popped > 0
    }

    /// Asks `poll` to leave received simple-NIC frames for [`Device::take_raw_frames`]
    /// (`true`) or to drop them (`false`, the default). A consumer that keeps them must
    /// call `take_raw_frames` as often as it polls: the card stops receiving, RDMA
    /// included, while the ring is full.
    pub fn set_keep_raw_frames(&mut self, keep: bool) {
        self.keep_raw_frames = keep;
    }

    /// Hands each received simple-NIC frame to `f` (the bytes in the RX buffer slot, as
    /// long as its descriptor says) and frees its ring entry; returns how many frames `f`
    /// saw. A descriptor that does not decode or names bytes beyond its 2048-byte slot is
    /// counted in `raw_bad` and skipped. At most one buffer's worth (1024 frames) per call.
    pub fn take_raw_frames(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        self.drain_raw(&mut |frame| {
            n += 1;
            f(frame)
        });
        n
    }

    /// Pops up to RX_SLOTS simple-NIC RX descriptors, `f` seeing each good frame; returns
    /// how many descriptors were popped.
    fn drain_raw(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        let mut popped = 0;
        while popped < RX_SLOTS as usize {
            let Some(p) = self.sn_rx.pop() else { break };
            popped += 1;
            self.stats.raw_frames += 1;
            let rx = match p {
                Popped::One(d) => SimpleNicRx::decode(&d).ok(),
                _ => None,
            };
            let frame = rx.filter(|rx| rx.len <= RX_SLOT_SIZE).and_then(|rx| {
                let start = rx.buffer_offset() as usize;
                let buf = self.rx_buf.as_mut()?.as_mut_slice();
                buf.get(start..start + rx.len as usize)
            });
            match frame {
                Some(bytes) => f(bytes),
                None => self.stats.raw_bad += 1,
            }
        }
        if popped > 0 {
            self.sn_rx.sync_tail(&self.regs);
        }
        popped
    }

    /// Sends one whole Ethernet frame (at most [`RAW_FRAME_MAX`] bytes, the receiving
    /// card's RX slot) through the simple NIC: the bytes are copied into a DMA slot, so
    /// `frame` may be reused at once. Errors: an empty or oversized frame
    /// (InvalidArgument); every slot still waiting for the card, or a full ring (Busy: try
    /// again after a poll).
    pub fn send_raw(&mut self, frame: &[u8]) -> Result<(), VerbsError> {
        if frame.is_empty() || frame.len() > RAW_FRAME_MAX {
            return Err(VerbsError::InvalidArgument {
                what: "raw frame length (1..=2048 bytes)",
            });
        }
        let busy = VerbsError::Busy {
            what: "the simple-NIC TX ring",
        };
        let slot = self.raw_slots.next;
        if let Some(seq) = self.raw_seq[slot] {
            // Descriptors before `fetched` have been fetched by the card.
            let fetched = |ring: &ProducerRing| self.sn_tx_seq - u64::from(ring.pending());
            if seq + RAW_FETCH_MARGIN >= fetched(&self.sn_tx) {
                let _ = self.sn_tx.refresh_tail(&self.regs);
                if seq + RAW_FETCH_MARGIN >= fetched(&self.sn_tx) {
                    return Err(busy);
                }
            }
        }
        let (addr, out) = self.raw_slots.take().ok_or(busy)?;
        out[..frame.len()].copy_from_slice(frame);
        let desc = SimpleNicTx {
            addr,
            len: frame.len() as u32,
        }
        .encode();
        self.sn_tx
            .push_batch(&self.regs, &[desc])
            .map_err(|_| busy)?;
        self.raw_seq[slot] = Some(self.sn_tx_seq);
        self.sn_tx_seq += 1;
        self.stats.raw_sent += 1;
        Ok(())
    }

    fn local_qp(&mut self, qpn: Qpn) -> Option<usize> {
        self.qp_index(qpn).ok()
    }

    fn on_report(&mut self, r: &MetaReport, now: Instant) {
        match *r {
            MetaReport::Packet(p) => {
                let Some(i) = self.local_qp(p.dqpn) else {
                    self.stats.bad_reports += 1;
                    return;
                };
                let op = p.opcode;
                let full = {
                    let q = &self.storage.slices().qps[i];
                    op.is_first() && q.firsts.is_full()
                        || (op.is_last() || op.is_only()) && q.msgs.is_full()
                };
                if full {
                    // Make room: what can be completed is completed before the report is
                    // recorded (its ACK still goes out at the next delivery round).
                    self.deliver_ready(i);
                }
                let q = &mut self.storage.slices().qps[i];
                if let Some(m) = note_packet(q, &p) {
                    push_msg(q, m);
                }
            }
            MetaReport::ReadRequest(p, ext) => {
                let Some(i) = self.local_qp(p.dqpn) else {
                    self.stats.bad_reports += 1;
                    return;
                };
                // The card checks nothing of a READ request but its QP (12a): the driver
                // checks rkey, bounds, REMOTE_READ on MR and QP, and the PD. A refused
                // request is not acknowledged either: the requester times out.
                let (pd, qp_access, state) = {
                    let q = &self.storage.slices().qps[i];
                    (q.pd, q.access, q.state)
                };
                let ok = qp_access.contains(QpAccessFlags::REMOTE_READ)
                    && matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd)
                    && self.mr_covers(
                        p.rkey,
                        p.raddr.0,
                        p.total_len,
                        AccessFlags::REMOTE_READ.bits() as u32,
                        Some(pd),
                    );
                if !ok {
                    self.stats.read_refused += 1;
                    core_warn!(
                        "READ request refused: rkey {:#x} range or access",
                        p.rkey.get()
                    );
                    return;
                }
                let pmtu = self.storage.slices().qps[i].pmtu;
                let depth = self.storage.sq_depth();
                if self.storage.slices().qps[i].sq_len as usize >= depth {
                    self.stats.read_refused += 1;
                    core_warn!(
                        "READ request refused: the send queue of QP {:#x} is full",
                        p.dqpn.get()
                    );
                    return;
                }
                let psn = Psn::from_raw(p.psn);
                if self.storage.slices().qps[i].msgs.is_full() {
                    self.deliver_ready(i);
                }
                {
                    let q = &mut self.storage.slices().qps[i];
                    if psn.is_before(q.rx.base()) {
                        q.reack = true;
                    }
                    q.rx.set(psn);
                    push_msg(
                        q,
                        MsgEnd {
                            psn,
                            kind: MsgKind::ReadReq,
                            imm: 0,
                            len: p.total_len,
                            only: true,
                            addr: p.raddr.0,
                        },
                    );
                }
                let answered = self.storage.slices().qps[i].read_answered;
                if answered.is_some_and(|last| !last.is_before(psn)) {
                    // A resent request (the requester's READ timer): its response is queued,
                    // in flight with its own retransmissions, or acknowledged (the requester
                    // has it). Another copy would only push missing packets further back in
                    // the send ring, or be taken by the requester as the answer to its next
                    // READ. Requests are told apart by PSN: perftest reads the same address
                    // into the same buffer every time.
                    return;
                }
                self.storage.slices().qps[i].read_answered = Some(psn);
                self.enqueue(
                    i,
                    Wqe {
                        wr_id: 0,
                        op: Some(WorkReqOpcode::ReadResp),
                        imm: 0,
                        laddr: p.raddr.0,
                        lkey: p.rkey.get(),
                        len: p.total_len,
                        raddr: ext.laddr.0,
                        rkey: ext.lkey.get(),
                        psn: 0,
                        npsn: num_packets(ext.laddr.0, p.total_len, pmtu),
                        msn: 0,
                        signaled: false,
                        solicited: false,
                        internal: true,
                        state: WqeState::Pending,
                        read_done: true,
                        needs_recv: false,
                    },
                );
                self.transmit(i, now);
            }
            MetaReport::Ack(a) => {
                let Some(i) = self.local_qp(a.qpn) else {
                    self.stats.bad_reports += 1;
                    return;
                };
                if a.is_send_by_local_hw {
                    // The card's quiet-timer report of our receive window: nothing arrived
                    // for a while, so a hole below received PSNs is a loss, not reordering.
                    // NAK it now instead of letting the requester wait for its timeout.
                    on_card_quiet(&mut self.storage.slices().qps[i], &a);
                } else {
                    // The peer driver's cumulative ACK: every PSN before psn_now arrived.
                    self.on_ack(i, Psn::from_raw(a.psn_now), now);
                }
            }
            MetaReport::Nak(a, extra) => {
                let Some(i) = self.local_qp(a.qpn) else {
                    self.stats.bad_reports += 1;
                    return;
                };
                if a.is_send_by_local_hw {
                    // Our card saw a gap leave its window: from the first lost PSN to the new
                    // window bottom, only what is reported explicitly arrived.
                    on_card_loss(&mut self.storage.slices().qps[i], &a, extra.pre_bitmap);
                } else if a.is_send_by_driver {
                    let from = Psn::from_raw(a.psn_before_slide);
                    self.on_ack(i, from, now);
                    self.retransmit(i, from, now);
                } else {
                    // The peer card's NAK. The card never marks READ requests or zero-length
                    // WRITEs in its bitmap (nic-behaviour.md 3.2), so their PSNs always look
                    // lost: resend only from a PSN that carried data. A NAK with no such PSN
                    // (e.g. the card's first packet after a reset: review correction 7)
                    // carries no loss.
                    let new_bottom = crate::transport::card_bitmap_base(Psn::from_raw(a.psn_now));
                    if let Some(lost) =
                        self.first_data_lost(i, a.psn_before_slide, extra.pre_bitmap, new_bottom)
                    {
                        self.retransmit(i, lost, now);
                    }
                }
            }
        }
    }

    /// The first PSN a peer card's NAK reports lost that this QP sent with data (the card
    /// cannot mark READ requests or zero-length WRITEs) and that is not yet acknowledged.
    fn first_data_lost(
        &mut self,
        i: usize,
        psn_before_slide: u32,
        pre_bitmap: u128,
        new_bottom: Psn,
    ) -> Option<Psn> {
        let depth = self.storage.sq_depth();
        let s = self.storage.slices();
        let q = &s.qps[i];
        let wqes = &s.wqes;
        let unmarked = |psn: Psn| {
            (0..q.sq_sent).any(|k| {
                let w = &wqes[i * depth + ((q.sq_head + k) as usize % depth)];
                w.psn == psn.get()
                    && (w.op == Some(WorkReqOpcode::Read)
                        || w.len == 0 && w.op == Some(WorkReqOpcode::Write))
            })
        };
        let pre_base = crate::transport::card_bitmap_base(Psn::from_raw(psn_before_slide));
        let old_top = pre_base.wrapping_add(128);
        let jumped = if old_top.is_before(new_bottom) {
            PsnRange::from_bounds(old_top, new_bottom)
        } else {
            PsnRange::new(old_top, 0)
        };
        let mut candidates = (0..128u32)
            .filter(|b| pre_bitmap >> b & 1 == 0)
            .map(|b| pre_base.wrapping_add(b))
            .chain(jumped.iter().take(4096))
            .filter(|p| {
                p.is_before(new_bottom) && !p.is_before(q.acked_psn) && p.is_before(q.next_psn)
            });
        candidates.find(|p| !unmarked(*p))
    }

    /// The peer's packets keep arriving on QP `i` (its receive window moved): a READ waiting
    /// for its response is being answered, so its timer and retries start again, as an ACK
    /// would for a WRITE. Without this a response longer than `retry_cnt + 1` timeouts
    /// failed with RETRY_EXC_ERR while its data was still flowing in.
    fn response_progress(&mut self, i: usize, now: Instant) {
        let depth = self.storage.sq_depth();
        let s = self.storage.slices();
        let q = &mut s.qps[i];
        let reading = (0..q.sq_sent).any(|k| {
            let w = &s.wqes[i * depth + ((q.sq_head + k) as usize % depth)];
            w.op == Some(WorkReqOpcode::Read) && !w.read_done
        });
        if reading && q.deadline.is_some() {
            q.retries_left = q.retry_cnt;
            q.deadline = timeout_of(q).map(|t| now + t);
        }
    }

    /// Retires acknowledged WQEs (in order) up to `psn` (exclusive).
    fn on_ack(&mut self, i: usize, psn: Psn, now: Instant) {
        let depth = self.storage.sq_depth();
        let s = self.storage.slices();
        let q = &mut s.qps[i];
        // Only an ACK that moves forward, and not past what was sent, counts.
        if !q.acked_psn.is_before(psn) || q.next_psn.is_before(psn) {
            return;
        }
        q.acked_psn = psn;
        q.retries_left = q.retry_cnt;
        let mut read_waiting = false;
        for k in 0..q.sq_sent {
            let w = &mut s.wqes[i * depth + ((q.sq_head + k) as usize % depth)];
            let end = Psn::from_raw(w.psn).wrapping_add(w.npsn);
            if w.state == WqeState::Sent && !psn.is_before(end) {
                w.state = WqeState::Acked;
            }
            read_waiting |= w.op == Some(WorkReqOpcode::Read) && !w.read_done;
        }
        // A READ whose request was acknowledged still waits for its response: keep the
        // timer, which resends the request if the response never comes.
        q.deadline = if q.acked_psn == q.next_psn && !read_waiting {
            None
        } else {
            timeout_of(q).map(|t| now + t)
        };
        self.complete_head(i);
    }

    /// Delivers completions from the head of QP `i`'s send queue, in posting order.
    fn complete_head(&mut self, i: usize) {
        let depth = self.storage.sq_depth();
        loop {
            let head = {
                let s = self.storage.slices();
                let q = &mut s.qps[i];
                if q.sq_sent == 0 {
                    // Nothing on the wire any more (e.g. a READ completed by its response
                    // after its ACK): a timer left running would fail the idle QP.
                    q.deadline = None;
                    return;
                }
                s.wqes[i * depth + q.sq_head as usize % depth]
            };
            let done = head.state == WqeState::Acked
                && (head.op != Some(WorkReqOpcode::Read) || head.read_done);
            if !done {
                return;
            }
            self.retire_head(i, WcStatus::Success);
        }
    }

    /// Takes the head WQE off QP `i`'s send queue and completes it with `status`: an error
    /// always, a success only when signaled (with the length), never a WQE the engine made
    /// itself (a READ response). `None` if the queue is empty.
    fn retire_head(&mut self, i: usize, status: WcStatus) -> Option<Wqe> {
        let depth = self.storage.sq_depth();
        let (w, qpn, cq) = {
            let s = self.storage.slices();
            let q = &mut s.qps[i];
            if q.sq_len == 0 {
                return None;
            }
            let w = s.wqes[i * depth + q.sq_head as usize % depth];
            q.sq_head = (q.sq_head + 1) % depth as u32;
            q.sq_len -= 1;
            if !w.internal {
                q.retired += 1;
            }
            // The head is the oldest WQE: if anything was sent, it was.
            q.sq_sent = q.sq_sent.saturating_sub(1);
            (w, q.qpn, q.send_cq)
        };
        let success = status == WcStatus::Success;
        if !w.internal && (w.signaled || !success) {
            Self::push_cqe(
                &mut self.storage,
                &mut self.stats,
                cq,
                WorkCompletion {
                    wr_id: w.wr_id,
                    status,
                    opcode: wc_opcode(&w),
                    byte_len: if success { w.len } else { 0 },
                    imm_data: 0,
                    qp_num: qpn.get(),
                    src_qp: 0,
                    wc_flags: 0,
                },
            );
        }
        Some(w)
    }

    /// Go-back-N from `from`: every sent packet at or after it is posted again with
    /// is_retry, including the packets of a WQE that started before it.
    fn retransmit(&mut self, i: usize, from: Psn, now: Instant) {
        self.resend(i, from, now, false)
    }

    /// Go-back-N from `from`; after a timeout (`reads_too`) also the requests of READs
    /// that were acknowledged but whose response never came.
    fn resend(&mut self, i: usize, from: Psn, now: Instant, reads_too: bool) {
        self.stats.retransmits += 1;
        let depth = self.storage.sq_depth();
        let (path, acked_psn, sq_sent, sq_head, next_psn) = {
            let q = &self.storage.slices().qps[i];
            (Path::of(q), q.acked_psn, q.sq_sent, q.sq_head, q.next_psn)
        };
        let from = if from.is_before(acked_psn) {
            acked_psn
        } else {
            from
        };
        let mut batch = [RawDesc::ZERO; BATCH];
        let mut n = 0usize;
        for k in 0..sq_sent {
            let w = self.storage.slices().wqes[i * depth + ((sq_head + k) as usize % depth)];
            let read_waiting = reads_too && w.op == Some(WorkReqOpcode::Read) && !w.read_done;
            if w.state != WqeState::Sent && !read_waiting {
                continue;
            }
            let span = span_of(&w);
            // Only what was sent: the window may have stopped the newest request early.
            let psns = PsnRange::new(Psn::from_raw(w.psn), w.npsn - unsent_packets(&w, next_psn));
            if !psns.contains(from) && from.is_after(psns.start()) && !read_waiting {
                continue;
            }
            let range = PsnRange::from_bounds(
                if psns.contains(from) {
                    from
                } else {
                    psns.start()
                },
                psns.end(),
            );
            if w.op == Some(WorkReqOpcode::Read) || w.len == 0 {
                let whole = Chunk {
                    laddr: VirtAddr(w.laddr),
                    raddr: VirtAddr(w.raddr),
                    len: w.len,
                    psn: Psn::from_raw(w.psn),
                    packets: w.npsn,
                    is_first: true,
                    is_last: true,
                    is_retry: true,
                };
                n = self.append_chunk(&path, &w, &whole, &mut batch, n, true);
                continue;
            }
            let Ok(frag) = PacketFragmenter::new(span, path.pmtu, range) else {
                continue;
            };
            for c in frag {
                n = self.append_chunk(&path, &w, &c, &mut batch, n, true);
            }
        }
        if n > 0 {
            self.flush_send_checked(&batch[..n]);
        }
        let q = &mut self.storage.slices().qps[i];
        q.deadline = timeout_of(q).map(|t| now + t);
    }

    /// Adds one chunk's two descriptors to `batch` (holding `n`), flushing it to the send
    /// ring first when full; a retransmission (`retry`) waits for ring space. Returns the new
    /// fill.
    fn append_chunk(
        &mut self,
        q: &Path,
        w: &Wqe,
        c: &Chunk,
        batch: &mut [RawDesc; BATCH],
        n: usize,
        retry: bool,
    ) -> usize {
        let mut n = n;
        if n + 2 > BATCH {
            if retry {
                self.flush_send_checked(&batch[..n]);
            } else {
                self.flush_send(&batch[..n]);
            }
            n = 0;
        }
        let req = self.chunk_request(q, w, c);
        encode_pair(&req, batch, n);
        n + 2
    }

    fn flush_send_checked(&mut self, descs: &[RawDesc]) {
        // A retransmission waits for ring space rather than dropping: the ring drains as
        // fast as the card fetches.
        let mut tries = 0u32;
        while self.send.push_batch(&self.regs, descs).is_err() {
            tries += 1;
            if tries > 1_000_000 {
                core_error!("send ring stuck; retransmission dropped");
                return;
            }
            core::hint::spin_loop();
        }
    }

    fn on_timeout(&mut self, i: usize, now: Instant) {
        self.stats.timeouts += 1;
        let (left, acked) = {
            let q = &self.storage.slices().qps[i];
            (q.retries_left, q.acked_psn)
        };
        if left == 0 {
            self.fail_qp(i, WcStatus::RetryExcErr);
            return;
        }
        self.storage.slices().qps[i].retries_left = left - 1;
        self.resend(i, acked, now, true);
    }

    /// The head WQE completes with `status`, the QP goes to ERR and the rest is flushed.
    fn fail_qp(&mut self, i: usize, status: WcStatus) {
        {
            let q = &mut self.storage.slices().qps[i];
            q.state = QpState::Err;
            q.deadline = None;
        }
        self.retire_head(i, status);
        self.flush_qp(i);
    }

    /// The oldest SEND of QP `i` is longer than the peer's receive WR `r` it was matched
    /// with: tell the peer (its receive WR fails with LOC_LEN_ERR), then complete the SEND
    /// with REM_INV_REQ_ERR and move the QP to ERR. Nothing is written.
    fn send_too_long(&mut self, i: usize, r: &OobRecvWr, send_len: u32) {
        self.stats.sends_too_long += 1;
        let (peer, qpn) = {
            let q = &mut self.storage.slices().qps[i];
            q.remote_recvs.pop_front();
            (q.peer_ip, q.qpn.get())
        };
        let rec = RecvTooShort {
            wr_id: r.wr_id,
            send_len,
            qpn,
        };
        if let Some(oob) = self.oob.as_mut() {
            if let Err(e) = oob.send_too_short(peer, &rec) {
                core_error!(
                    "QP {:#x}: cannot tell {} that its receive WR {:#x} is too short for a {}-byte SEND: {}",
                    qpn,
                    peer,
                    r.wr_id,
                    send_len,
                    e
                );
            }
        }
        self.fail_qp(i, WcStatus::RemInvReqErr);
    }

    /// Completes every outstanding WQE and receive WR of QP `i` with WR_FLUSH_ERR.
    fn flush_qp(&mut self, i: usize) {
        while self.retire_head(i, WcStatus::WrFlushErr).is_some() {}
        while self.fail_recv(i, WcStatus::WrFlushErr) {}
        let q = &mut self.storage.slices().qps[i];
        q.sq_sent = 0;
        q.deadline = None;
        q.to_announce = 0;
    }

    /// Completes the oldest receive WR of QP `i` with the error `status` (byte_len 0);
    /// `false` if none is posted.
    fn fail_recv(&mut self, i: usize, status: WcStatus) -> bool {
        let (r, qpn, cq) = {
            let q = &mut self.storage.slices().qps[i];
            match q.recvs.pop_front() {
                Some(r) => (r, q.qpn, q.recv_cq),
                None => return false,
            }
        };
        Self::push_cqe(
            &mut self.storage,
            &mut self.stats,
            cq,
            WorkCompletion {
                wr_id: r.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm_data: 0,
                qp_num: qpn.get(),
                src_qp: 0,
                wc_flags: 0,
            },
        );
        true
    }

    /// Responder side: completes received messages whose PSNs all arrived and sends one
    /// cumulative ACK per QP whose acknowledgeable point moved. The ACK never covers a PSN
    /// whose message's completion is not recorded yet ([`ack_limit`]).
    fn deliver_and_ack(&mut self, now: Instant) -> bool {
        let nqps = self.storage.slices().qps.len();
        let mut acks = [RawDesc::ZERO; BATCH];
        let mut n = 0usize;
        let mut any = false;
        for i in 0..nqps {
            if !self.storage.slices().qps[i].in_use {
                continue;
            }
            let acked = self.storage.slices().qps[i].acked_rx;
            let (base, ack) = self.deliver_ready(i);
            let nak_due = {
                let q = &mut self.storage.slices().qps[i];
                // A hole the card's quiet report showed, or a report the engine had to drop
                // (its message can only come back by retransmission): resend from `ack`.
                let hole = core::mem::take(&mut q.nak_due);
                let dropped = q.reports_dropped && ack != base;
                if dropped {
                    q.reports_dropped = false;
                }
                let due = (hole || dropped) && q.naked_at != Some(ack);
                if due {
                    q.naked_at = Some(ack);
                }
                due
            };
            if nak_due {
                if let Some(d) = self.ack_frame(i, ack, AckVerdict::Nak { pre_psn: ack.get() }) {
                    if n == BATCH {
                        self.flush_acks(&acks[..n]);
                        n = 0;
                    }
                    acks[n] = d;
                    n += 1;
                    self.stats.naks_sent += 1;
                }
            }
            let reack = core::mem::take(&mut self.storage.slices().qps[i].reack);
            if ack == acked && !reack {
                continue;
            }
            any = true;
            if ack != acked {
                self.response_progress(i, now);
            }
            if let Some(d) = self.ack_frame(i, ack, AckVerdict::Ack) {
                if n == BATCH {
                    self.flush_acks(&acks[..n]);
                    n = 0;
                }
                acks[n] = d;
                n += 1;
            }
            self.storage.slices().qps[i].acked_rx = ack;
        }
        if n > 0 {
            self.flush_acks(&acks[..n]);
        }
        any
    }

    /// Completes the messages of QP `i` that may be acknowledged; returns the first missing
    /// PSN and the point up to which an ACK may now go.
    fn deliver_ready(&mut self, i: usize) -> (Psn, Psn) {
        let (base, limit) = {
            let q = &mut self.storage.slices().qps[i];
            let base = q.rx.advance();
            (base, ack_limit(q, base))
        };
        while let Some(m) = next_ready(&mut self.storage.slices().qps[i], limit) {
            self.deliver(i, &m);
        }
        (base, limit)
    }

    /// Records the completion of message `m` (its length and address already filled in by
    /// [`next_ready`]).
    fn deliver(&mut self, i: usize, m: &MsgEnd) {
        let depth = self.storage.sq_depth();
        match m.kind {
            MsgKind::Write | MsgKind::ReadReq => {}
            MsgKind::WriteImm | MsgKind::Send | MsgKind::SendImm => {
                let (r, qpn, peer, cq) = {
                    let q = &mut self.storage.slices().qps[i];
                    (q.recvs.pop_front(), q.qpn, q.dest_qpn, q.recv_cq)
                };
                let opcode = if m.kind == MsgKind::WriteImm {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                };
                let with_imm = m.kind != MsgKind::Send;
                Self::push_cqe(
                    &mut self.storage,
                    &mut self.stats,
                    cq,
                    WorkCompletion {
                        wr_id: r.map(|r| r.wr_id).unwrap_or(0),
                        status: WcStatus::Success,
                        opcode,
                        byte_len: m.len,
                        imm_data: if with_imm { m.imm } else { 0 },
                        qp_num: qpn.get(),
                        src_qp: peer.get(),
                        wc_flags: if with_imm { WC_WITH_IMM } else { 0 },
                    },
                );
            }
            MsgKind::ReadResp => {
                // A response belongs to the oldest READ waiting for data with the same sink
                // address and length. A resent request gets a second response (the card
                // has no duplicate detection): it finds no waiting READ and is ignored.
                let s = self.storage.slices();
                let q = &s.qps[i];
                for k in 0..q.sq_sent {
                    let w = &mut s.wqes[i * depth + ((q.sq_head + k) as usize % depth)];
                    if w.op == Some(WorkReqOpcode::Read)
                        && !w.read_done
                        && w.laddr == m.addr
                        && w.len == m.len
                    {
                        w.read_done = true;
                        break;
                    }
                }
                self.complete_head(i);
            }
        }
    }

    fn ack_frame(&mut self, i: usize, base: Psn, verdict: AckVerdict) -> Option<RawDesc> {
        let q = Path::of(&self.storage.slices().qps[i]);
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

    fn flush_acks(&mut self, descs: &[RawDesc]) {
        if self.sn_tx.push_batch(&self.regs, descs).is_err() {
            // ACKs are cumulative: a lost one is repaired by the next, or by the
            // requester's retransmission.
            core_warn!("simple-NIC ring full: {} ACK frames not sent", descs.len());
            return;
        }
        self.sn_tx_seq += descs.len() as u64;
    }

    /// Releases the device's DMA buffers. Rings stop being used.
    pub fn close(mut self) -> (P::Regs, P::Dma, P::Mem, S) {
        for b in [
            self.rx_buf.take(),
            self.staging.take(),
            self.ack_slots.buf.take(),
            self.raw_slots.buf.take(),
        ]
        .into_iter()
        .flatten()
        {
            dma_free(&self.dma, b);
        }
        // Ring memory is returned too; the card must be reset before it is reused.
        let Device {
            regs,
            dma,
            mem,
            storage,
            cmd,
            resp,
            send,
            meta,
            sn_tx,
            sn_rx,
            ..
        } = self;
        for r in [cmd.into_slots(), send.into_slots(), sn_tx.into_slots()] {
            dma_free(&dma, r.into_buffer());
        }
        for r in [resp.into_slots(), meta.into_slots(), sn_rx.into_slots()] {
            dma_free(&dma, r.into_buffer());
        }
        (regs, dma, mem, storage)
    }
}

/// The first PSN a card NAK says is lost: the lowest zero bit of the old window
/// (`pre_bitmap` at `psn_before_slide`) that left the window, or, when the window jumped
/// past its old top, the old top itself. Every PSN from there to the new window bottom may
/// be missing; the ones that arrived are set explicitly by their own reports.
fn first_lost(psn_before_slide: u32, pre_bitmap: u128, new_bottom: Psn) -> Option<Psn> {
    let pre_base = crate::transport::card_bitmap_base(Psn::from_raw(psn_before_slide));
    let old_top = pre_base.wrapping_add(128);
    let zero = (0..128u32)
        .filter(|b| pre_bitmap >> b & 1 == 0)
        .map(|b| pre_base.wrapping_add(b))
        .find(|p| p.is_before(new_bottom));
    match zero {
        Some(z) => Some(z),
        None if old_top.is_before(new_bottom) => Some(old_top),
        None => None,
    }
}

fn record_lost(q: &mut QpSlot, range: PsnRange) {
    if range.is_empty() {
        return;
    }
    if let Err(r) = q.lost.push(range) {
        // Full: widen the last range so that nothing lost is ever forgotten.
        if let Some(last) = q.lost.last_mut() {
            let start = if r.start().is_before(last.start()) {
                r.start()
            } else {
                last.start()
            };
            let end = if last.end().is_before(r.end()) {
                r.end()
            } else {
                last.end()
            };
            *last = PsnRange::from_bounds(start, end);
        }
    }
}

/// The card reports a PSN only while it is inside its 128-PSN window, and it NAKs every PSN
/// that leaves the window unreceived. So everything below the window bottom arrived except
/// the lost ranges: mark up to the first PSN of those still missing.
fn mark_card_cumulative(q: &mut QpSlot, bottom: Psn) {
    let base = q.rx.base();
    // Trim each lost range past the PSNs that have arrived since; drop resolved ones.
    let rx = &q.rx;
    for r in q.lost.iter_mut() {
        let mut start = if r.start().is_before(base) {
            base
        } else {
            r.start()
        };
        while start.is_before(r.end()) && rx.is_set(start) {
            start = start.wrapping_add(1);
        }
        *r = PsnRange::from_bounds(start, r.end());
    }
    q.lost.retain(|r| !r.is_empty() && r.end().is_after(base));
    let upto = q
        .lost
        .iter()
        .map(|r| r.start())
        .filter(|l| l.is_before(bottom))
        .min_by(|a, b| {
            if a.is_before(*b) {
                core::cmp::Ordering::Less
            } else {
                core::cmp::Ordering::Greater
            }
        })
        .unwrap_or(bottom);
    if base.is_before(upto) {
        q.rx.set_range(PsnRange::from_bounds(base, upto));
    }
}

/// A packet report of QP `q`: marks its PSN, remembers a FIRST packet (its RETH carries
/// the message length), and returns the end of a message (LAST or ONLY) to record.
fn note_packet(q: &mut QpSlot, p: &PacketInfo) -> Option<MsgEnd> {
    let psn = Psn::from_raw(p.psn);
    if psn.is_before(q.rx.base()) {
        q.reack = true;
    }
    q.rx.set(psn);
    let op = p.opcode;
    if op.is_first() && !psn.is_before(q.next_msg) && !q.firsts.iter().any(|f| f.0 == psn) {
        let kept = insert_sorted(&mut q.firsts, (psn, p.total_len, p.raddr.0), |f| f.0);
        if !kept {
            q.reports_dropped = true;
            core_warn!(
                "QP {:#x}: FIRST of PSN {:#x} not tracked; its message waits for a resend",
                q.qpn.get(),
                p.psn
            );
        }
    }
    if !op.is_last() && !op.is_only() {
        return None;
    }
    let kind = if op.is_read_response() {
        MsgKind::ReadResp
    } else if op.is_send() {
        if op.has_imm() {
            MsgKind::SendImm
        } else {
            MsgKind::Send
        }
    } else if op.has_imm() {
        MsgKind::WriteImm
    } else {
        MsgKind::Write
    };
    Some(MsgEnd {
        psn,
        kind,
        imm: p.imm_data,
        len: if op.is_only() { p.total_len } else { 0 },
        only: op.is_only(),
        addr: p.raddr.0,
    })
}

/// The card's quiet-timer report of our receive window: nothing arrived for a while, so a
/// hole below received PSNs is a loss, not reordering; it is NAKed at the next delivery.
fn on_card_quiet(q: &mut QpSlot, a: &AckReport) {
    let bottom = crate::transport::card_bitmap_base(Psn::from_raw(a.psn_now));
    mark_card_cumulative(q, bottom);
    q.rx.merge_window(bottom, trusted_bits(q.card_fresh, bottom, a.now_bitmap));
    q.card_fresh = still_fresh(q.card_fresh, bottom);
    let hole = q.rx.first_missing();
    q.nak_due = (1..128u32).any(|k| q.rx.is_set(hole.wrapping_add(k)));
}

/// Our card saw a gap leave its window: from the first lost PSN to the new window bottom,
/// only what is reported explicitly arrived.
fn on_card_loss(q: &mut QpSlot, a: &AckReport, pre_bitmap: u128) {
    let new_bottom = crate::transport::card_bitmap_base(Psn::from_raw(a.psn_now));
    if let Some(first) = first_lost(a.psn_before_slide, pre_bitmap, new_bottom) {
        record_lost(q, PsnRange::from_bounds(first, new_bottom));
    }
    mark_card_cumulative(q, new_bottom);
    let pre_bottom = crate::transport::card_bitmap_base(Psn::from_raw(a.psn_before_slide));
    let fresh = q.card_fresh;
    q.rx.merge_window(pre_bottom, trusted_bits(fresh, pre_bottom, pre_bitmap));
    q.rx.merge_window(new_bottom, trusted_bits(fresh, new_bottom, a.now_bitmap));
    q.card_fresh = still_fresh(fresh, new_bottom);
}

/// Records the end of a received message, in PSN order (a retransmitted message can be
/// reported after later ones). A message already delivered or queued is ignored. When the
/// queue is full the message with the highest PSN is dropped: [`ack_limit`] then never
/// acknowledges it, so the requester sends it again.
fn push_msg(q: &mut QpSlot, m: MsgEnd) {
    // A retransmitted LAST is reported again: keep one entry per message.
    if m.psn.is_before(q.next_msg) || q.msgs.iter().any(|x| x.psn == m.psn) {
        return;
    }
    if !insert_sorted(&mut q.msgs, m, |x| x.psn) {
        q.reports_dropped = true;
        core_warn!(
            "QP {:#x}: message queue full; a message waits for its resend",
            q.qpn.get()
        );
    }
}

/// Inserts `item` into `queue`, kept sorted by `psn`. When the queue is full, the entry
/// with the highest PSN (possibly `item`) is dropped; returns false then.
fn insert_sorted<T: Copy, const N: usize>(
    queue: &mut heapless::Deque<T, N>,
    item: T,
    psn: impl Fn(&T) -> Psn,
) -> bool {
    let mut kept = true;
    if queue.is_full() {
        kept = false;
        match queue.back() {
            Some(last) if psn(last).is_after(psn(&item)) => {
                queue.pop_back();
            }
            _ => return false,
        }
    }
    // Entries after `item` move aside (rare: only a resend arrives out of order).
    let mut later: heapless::Vec<T, N> = heapless::Vec::new();
    while queue.back().is_some_and(|b| psn(b).is_after(psn(&item))) {
        if let Some(b) = queue.pop_back() {
            let _ = later.push(b);
        }
    }
    let _ = queue.push_back(item);
    while let Some(b) = later.pop() {
        let _ = queue.push_back(b);
    }
    kept
}

/// The PSN up to which QP `q` may acknowledge, given `base`, its first missing PSN. A PSN
/// that ends a message is acknowledged only once that message's end (and, for a message of
/// several packets, its FIRST with the length) is recorded, so its completion can never be
/// lost: the card's window bitmaps mark PSNs whose own reports may still be on the way (its
/// loss report for the slide that packet P causes comes before P's report), or that the
/// engine had no room to record.
fn ack_limit(q: &QpSlot, base: Psn) -> Psn {
    // Messages are contiguous in PSN space: the next one starts at `next_msg`.
    let mut cur = q.next_msg;
    for m in q.msgs.iter() {
        if !m.psn.is_before(base) {
            break;
        }
        let whole = if m.only {
            m.psn == cur
        } else {
            cur.is_before(m.psn) && q.firsts.iter().any(|f| f.0 == cur)
        };
        if !whole {
            return open_message_limit(q, cur, m.psn);
        }
        cur = m.psn.wrapping_add(1);
    }
    if cur.is_before(base) {
        open_message_limit(q, cur, base)
    } else {
        base
    }
}

/// How far into the message starting at `start`, whose end is not recorded, an ACK may go
/// (at most `limit`): through its FIRST and MIDDLE packets, which need no report, when its
/// FIRST says where it ends; not at all otherwise.
fn open_message_limit(q: &QpSlot, start: Psn, limit: Psn) -> Psn {
    let Some(&(_, len, addr)) = q.firsts.iter().find(|f| f.0 == start) else {
        return start;
    };
    let packets = num_packets(addr, len, q.pmtu);
    if packets < 2 {
        return start;
    }
    let last = start.wrapping_add(packets - 1);
    if last.is_before(limit) {
        last
    } else {
        limit
    }
}

/// Takes the oldest message that ends before `limit` off QP `q`'s books, to complete it: a
/// message of several packets gets its length and address from its FIRST packet's report
/// (the message starts right after the previous one), and the next message starts after it.
fn next_ready(q: &mut QpSlot, limit: Psn) -> Option<MsgEnd> {
    let mut m = match q.msgs.front() {
        Some(m) if m.psn.is_before(limit) => q.msgs.pop_front()?,
        _ => return None,
    };
    let start = q.next_msg;
    if !m.only {
        if let Some(f) = q.firsts.iter().find(|f| f.0 == start) {
            m.len = f.1;
            m.addr = f.2;
        }
    }
    q.next_msg = m.psn.wrapping_add(1);
    let next = q.next_msg;
    while q.firsts.front().is_some_and(|f| f.0.is_before(next)) {
        q.firsts.pop_front();
    }
    Some(m)
}

/// The index in `wqes` of QP `i`'s newest sent request if the send window stopped it before
/// its last packet.
fn cut_short(q: &QpSlot, wqes: &[Wqe], i: usize, depth: usize) -> Option<usize> {
    if q.sq_sent == 0 {
        return None;
    }
    let last = i * depth + ((q.sq_head + q.sq_sent - 1) as usize % depth);
    let w = wqes.get(last)?;
    (unsent_packets(w, q.next_psn) > 0).then_some(last)
}

/// Packets of `w` not handed to the card yet: all of a pending request; for a sent one, those
/// from the QP's `next_psn` on (the send window can stop a request in the middle).
fn unsent_packets(w: &Wqe, next_psn: Psn) -> u32 {
    match w.state {
        WqeState::Pending => w.npsn,
        WqeState::Sent => w
            .npsn
            .saturating_sub(Psn::from_raw(w.psn).forward_distance(next_psn)),
        WqeState::Acked => 0,
    }
}

/// The part of chunk `c` of the request starting at PSN `first` whose packets fall in
/// `[from, to)` (packet indices of the request), cut at packet boundaries; `None` if no
/// packet of it does. A READ or zero-length request (`whole`) goes as one chunk.
fn packets_of(
    c: &Chunk,
    pmtu: crate::mtu::Pmtu,
    first: u32,
    (from, to): (u32, u32),
    whole: bool,
) -> Option<Chunk> {
    if whole {
        return (from == 0 && to > 0).then_some(*c);
    }
    let off = Psn::from_raw(first).forward_distance(c.psn);
    let lo = from.max(off) - off;
    let hi = to.min(off + c.packets).saturating_sub(off);
    if lo >= hi {
        return None;
    }
    if lo == 0 && hi == c.packets {
        return Some(*c);
    }
    let p = u64::from(pmtu.bytes());
    let aligned = c.raddr.0 & !(p - 1);
    let at = |k: u32| {
        if k == 0 {
            c.raddr.0
        } else {
            aligned + u64::from(k) * p
        }
    };
    let start = at(lo);
    let end = if hi == c.packets {
        c.raddr.0 + u64::from(c.len)
    } else {
        at(hi)
    };
    let skip = start - c.raddr.0;
    Some(Chunk {
        laddr: VirtAddr(c.laddr.0 + skip),
        raddr: VirtAddr(start),
        len: (end - start) as u32,
        psn: c.psn.wrapping_add(lo),
        packets: hi - lo,
        is_first: c.is_first && lo == 0,
        is_last: c.is_last && hi == c.packets,
        is_retry: c.is_retry,
    })
}

/// What a packet of a QP needs from its slot: the two ends and the PMTU. Copied out so the
/// transmit and ACK paths do not copy the whole slot.
#[derive(Clone, Copy)]
struct Path {
    qpn: Qpn,
    dest_qpn: Qpn,
    peer_ip: Ipv4Addr,
    peer_mac: MacAddr,
    pmtu: crate::mtu::Pmtu,
}

impl Path {
    fn of(q: &QpSlot) -> Self {
        Path {
            qpn: q.qpn,
            dest_qpn: q.dest_qpn,
            peer_ip: q.peer_ip,
            peer_mac: q.peer_mac,
            pmtu: q.pmtu,
        }
    }
}

fn span_of(w: &Wqe) -> WrSpan {
    WrSpan {
        laddr: VirtAddr(w.laddr),
        raddr: VirtAddr(w.raddr),
        len: if w.op == Some(WorkReqOpcode::Read) {
            0
        } else {
            w.len
        },
        first_psn: Psn::from_raw(w.psn),
    }
}

fn chunk_count(w: &Wqe) -> usize {
    if w.op == Some(WorkReqOpcode::Read) {
        1
    } else {
        chunk_count_len(w.len)
    }
}

/// Upper bound of the chunks of a request of `len` bytes (an unaligned start adds one).
fn chunk_count_len(len: u32) -> usize {
    (len as usize).div_ceil(CHUNK_BYTES as usize) + 1
}

/// A QP in RESET. Its ACK timeout and retry count, which IB sets at RTS, start at the IB
/// defaults (14 = 67 ms, 7 retries): a responder that stays in RTR (perftest's READ server)
/// sends READ responses, and a lost one must be resent.
fn fresh_qp(qpn: Qpn, qp_type: QpType, pd: u32, send_cq: u32, recv_cq: u32) -> QpSlot {
    QpSlot {
        in_use: true,
        qpn,
        qp_type,
        pd,
        send_cq,
        recv_cq,
        timeout: 14,
        retry_cnt: 7,
        retries_left: 7,
        ..QpSlot::default()
    }
}

fn timeout_of(q: &QpSlot) -> Option<Nanos> {
    Nanos::ib_local_ack_timeout(q.timeout)
}

fn wc_opcode(w: &Wqe) -> WcOpcode {
    match w.op {
        Some(WorkReqOpcode::Read) => WcOpcode::RdmaRead,
        Some(WorkReqOpcode::Send | WorkReqOpcode::SendWithImm) => WcOpcode::Send,
        _ => WcOpcode::RdmaWrite,
    }
}
