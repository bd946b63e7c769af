//! The driver engine: verbs on top of the rings, single-threaded and poll-driven, with
//! fixed capacities in caller-provided storage and no allocation.
//!
//! What the card does and what the driver must do is split as hardware-contract.md "Who
//! does what" says: the engine assigns PSNs and MSNs, cuts work requests into 64 KiB
//! chunks, answers READ requests with READ responses (after checking them: 12a), sends the
//! positive ACKs itself through the simple-NIC ring, retransmits on NAK or timeout, and
//! produces completions in posting order.
//!
//! [`Device`] (this file) opens and closes the card and dispatches `poll(now)`; each role
//! has its own module (ARCHITECTURE.md "The engine by role"):
//!
//! - `config`: [`DeviceConfig`], [`EngineStats`], fixed sizes, the DMA buffers `open` takes,
//!   [`TableWindows`] (which card table entries this engine hands out)
//! - `storage`: [`Storage`] and the views that own index arithmetic (send queue, CQ ring,
//!   timer table); `ranges`: each QP's and CQ's range of the shared tables; `recv_pool`:
//!   the shared table of receive WRs
//! - `events`: asynchronous events (a CQ overrun, a QP that failed on its own)
//! - `command`: the command queue (submit, complete on poll, blocking helper)
//! - `pd`, `mr`, `cq`, `qp`: the objects (MR registration is a job the command queue
//!   completes)
//! - `wr`, `wqe`: what the application posts and gets back; what the send queue holds
//! - `requester`: post_send (validate, convert) and transmit (window, chunks, doorbell)
//! - `completer`: ACK/NAK/timeout, go-back-N, retry exhaustion, flush
//! - `responder`: per-QP receive bookkeeping (what arrived, how far an ACK may go)
//! - `report`: meta-report intake, one handler per kind; delivery and ACK frames
//! - `recv`: receive WRs both ways over the out-of-band channel, RNR
//! - `raw`: the simple NIC's raw frames
//! - `retire`: what the send ring may still name (an MR is invalidated in the card, a QP
//!   destroyed, only once the card has fetched the descriptors posted before)
//! - `atomic`: fetch-and-add and compare-and-swap, executed by the responder's driver and
//!   carried over the out-of-band channel (the card has no atomic engine)

mod access_check;
mod atomic;
mod card_reset;
mod command;
mod completer;
mod config;
mod cq;
mod dump;
mod error;
mod events;
mod mr;
mod mr_change;
mod pd;
mod qp;
mod ranges;
mod raw;
mod recv;
mod recv_pool;
mod remote_inv;
mod report;
mod requester;
mod responder;
mod retire;
mod storage;
mod wqe;
mod wr;

use crate::desc::cmd::{CmdRequest, SetNetworkParam, SetRawPacketReceiveMeta};
use crate::platform::{DmaAllocator, DmaBuffer, Platform};
use crate::regs::{RingId, DECODED_CHANNELS};
use crate::ring::{ConsumerRing, ProducerRing, RingMemory, RingRegs};
use crate::time::Instant;

pub use atomic::{ATOMIC_RESULTS, ATOMIC_WINDOW};
pub use command::{op_name, CommandQueue, Ticket};
pub use config::{
    DeviceConfig, DmaNeed, EngineStats, TableWindows, CHUNK_BYTES, OPEN_BUFFERS, RAW_FRAME_MAX,
    SEND_WINDOW_CAP,
};
pub use cq::CqSlot;
pub use error::VerbsError;
pub use events::AsyncEvent;
pub use mr::{MrSlot, PendingMr};
pub use qp::{QpAttrs, QpCaps, QpHandle, QpSlot, READ_RESPONSE_ROOM};
pub use recv_pool::RecvEntry;
pub use responder::{FIRSTS_TRACKED, LOST_TRACKED, MSG_QUEUE, RX_WORDS};
pub use retire::TxBacklog;
pub use storage::{EarlyRecv, QpTimers, Slices, Storage};
pub use wqe::{Wqe, WqeState};
pub use wr::{
    RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion, WC_WITH_IMM, WC_WITH_INV,
};

use config::{OPEN_BUFFERS as BUFFERS, PGT_STAGING_SLOTS, RAW_SLOTS};
use events::Events;
use mr::{MrJob, PgtWindow, MR_JOBS};
use pd::PdTable;
use ranges::Carver;
use raw::TxSlots;
use recv_pool::RecvPool;
use remote_inv::REMOTE_INVS;
use storage::Timer;

/// The device.
pub struct Device<P: Platform, S: Storage> {
    regs: P::Regs,
    dma: P::Dma,
    mem: P::Mem,
    storage: S,
    cfg: DeviceConfig,
    commands: CommandQueue,
    send: ProducerRing,
    meta: ConsumerRing,
    sn_tx: ProducerRing,
    sn_rx: ConsumerRing,
    rx_buf: Option<DmaBuffer>,
    /// Page-table staging slots, and which of them are free (bit per slot).
    staging: Option<DmaBuffer>,
    staging_free: u32,
    ack_slots: TxSlots,
    raw_slots: TxSlots,
    /// For each raw slot, the simple-NIC TX sequence number of the frame it last held.
    raw_seq: [Option<u64>; RAW_SLOTS],
    /// Descriptors pushed on the simple-NIC TX ring so far.
    sn_tx_seq: u64,
    /// Bytes of the frames those descriptors name.
    sn_tx_bytes: u64,
    /// Descriptors pushed on the send ring so far (`retire`'s marks count them).
    send_posted: u64,
    /// A consumer takes received simple-NIC frames ([`Device::take_raw_frames`]).
    keep_raw_frames: bool,
    key_seq: u32,
    /// The free entries of this engine's page-table window.
    pgt: PgtWindow,
    /// Which parts of the WQE and completion tables the QPs' send queues and the CQs hold.
    wqe_ranges: Carver,
    cqe_ranges: Carver,
    /// The free entries of the receive WR table.
    recv_pool: RecvPool,
    events: Events,
    /// A CQ overran and its QPs still have to go to ERR.
    cq_errors_pending: bool,
    pds: PdTable,
    mr_jobs: [Option<MrJob>; MR_JOBS],
    stats: EngineStats,
    oob: Option<P::Oob>,
    /// How many entries of `Slices::early` are in use (a prefix, in arrival order).
    early_len: usize,
    /// Remote invalidations peers asked for, carried out by
    /// [`Device::run_remote_invalidations`] (`remote_inv`).
    remote_invs: heapless::Deque<(core::net::Ipv4Addr, crate::oob::AccessCheck), REMOTE_INVS>,
    /// One past the highest QP slot ever used: loops over QPs stop there.
    qp_high: usize,
    /// The latest time the engine was given (commands submitted from within a poll step
    /// take their deadline from it).
    now: Instant,
}

fn ring_regs(id: RingId) -> Result<RingRegs, VerbsError> {
    RingRegs::of(id, DECODED_CHANNELS).ok_or(VerbsError::Unsupported {
        what: "ring channel",
    })
}

/// Allocates the buffers of [`OPEN_BUFFERS`], in order; on failure frees what it took.
fn alloc_all(dma: &impl DmaAllocator) -> Result<[DmaBuffer; BUFFERS.len()], VerbsError> {
    let mut got: heapless::Vec<DmaBuffer, { BUFFERS.len() }> = heapless::Vec::new();
    for need in BUFFERS.iter() {
        match dma.alloc(need.len, need.align) {
            Ok(b) => {
                let _ = got.push(b);
            }
            Err(e) => {
                for b in got {
                    crate::platform::release(dma, b);
                }
                return Err(e.into());
            }
        }
    }
    got.into_array().map_err(|_| VerbsError::OutOfResources {
        what: "DMA buffers",
    })
}

fn ring_memory(dma: &impl DmaAllocator, buf: DmaBuffer) -> Result<RingMemory, VerbsError> {
    RingMemory::new(buf).map_err(|rejected| {
        crate::platform::release(dma, rejected.buffer);
        VerbsError::OutOfResources {
            what: "ring memory with the card's alignment",
        }
    })
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Opens the device: allocates and programs the six rings, the simple-NIC buffers and
    /// the PGT staging buffer, then sets the network parameters and the raw-packet RX buffer.
    /// Windows that are empty or leave the card's tables (`cfg.windows`,
    /// [`TableWindows::validate`]) are refused before anything is touched.
    pub fn open(
        regs: P::Regs,
        dma: P::Dma,
        mem: P::Mem,
        mut storage: S,
        cfg: DeviceConfig,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<Self, VerbsError> {
        cfg.windows.validate()?;
        let key_seed = cfg.key_seed;
        let (wqes, cqes, recvs) = {
            let s = storage.slices();
            if !s.consistent() {
                return Err(VerbsError::InvalidArgument {
                    what: "storage: every table needs entries, and the timers one per QP",
                });
            }
            (s.wqes.len(), s.cqes.len(), s.recvs.len())
        };
        let [cmd, resp, send, meta, sn_tx, sn_rx, rx_buf, staging, acks, raws] = alloc_all(&dma)?;
        let mut cmd = ProducerRing::new(ring_memory(&dma, cmd)?, ring_regs(RingId::CmdRequest)?);
        let mut resp = ConsumerRing::new(ring_memory(&dma, resp)?, ring_regs(RingId::CmdResponse)?);
        let mut send = ProducerRing::new(ring_memory(&dma, send)?, ring_regs(RingId::Send(0))?);
        let mut meta =
            ConsumerRing::new(ring_memory(&dma, meta)?, ring_regs(RingId::MetaReport(0))?);
        let mut sn_tx =
            ProducerRing::new(ring_memory(&dma, sn_tx)?, ring_regs(RingId::SimpleNicTx)?);
        let mut sn_rx =
            ConsumerRing::new(ring_memory(&dma, sn_rx)?, ring_regs(RingId::SimpleNicRx)?);
        crate::ring::program_rings(
            &regs,
            [&mut cmd, &mut send, &mut sn_tx],
            [&mut resp, &mut meta, &mut sn_rx],
        )?;
        let rx_addr = rx_buf.device_addr();
        let network = SetNetworkParam {
            mac: cfg.mac,
            ip: cfg.ip,
            netmask: cfg.netmask,
            gateway: cfg.gateway,
        };
        let mut dev = Device {
            regs,
            dma,
            mem,
            storage,
            commands: CommandQueue::new(cmd, resp, cfg.command_timeout),
            pgt: PgtWindow::new(&cfg.windows.pgt),
            cfg,
            send,
            meta,
            sn_tx,
            sn_rx,
            rx_buf: Some(rx_buf),
            staging: Some(staging),
            staging_free: (1u32 << PGT_STAGING_SLOTS) - 1,
            ack_slots: TxSlots::new(acks, config::ACK_SLOT),
            raw_slots: TxSlots::new(raws, RAW_FRAME_MAX),
            raw_seq: [None; RAW_SLOTS],
            sn_tx_seq: 0,
            sn_tx_bytes: 0,
            send_posted: 0,
            keep_raw_frames: false,
            key_seq: key_seed,
            wqe_ranges: Carver::new(wqes),
            cqe_ranges: Carver::new(cqes),
            recv_pool: RecvPool::new(recvs),
            events: Events::default(),
            cq_errors_pending: false,
            pds: PdTable::default(),
            mr_jobs: [None; MR_JOBS],
            stats: EngineStats::default(),
            oob: None,
            early_len: 0,
            remote_invs: heapless::Deque::new(),
            qp_high: 0,
            now: clock(),
        };
        dev.command(CmdRequest::SetNetworkParam(network), clock)?;
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
        EngineStats {
            commands: self.commands.submitted,
            ..self.stats
        }
    }

    /// The platform's memory resolver (for MRs the caller pins itself).
    pub fn memory(&mut self) -> &mut P::Mem {
        &mut self.mem
    }

    /// Sends a command and waits for its response (the command queue's blocking helper).
    fn command(
        &mut self,
        req: CmdRequest,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        self.commands.run(&self.regs, req, clock)
    }

    fn next_key(&mut self) -> u8 {
        // A different key byte each time an index is reused, so a stale key misses.
        self.key_seq = self
            .key_seq
            .wrapping_mul(1_103_515_245)
            .wrapping_add(12_345);
        (self.key_seq >> 16) as u8
    }

    /// Drives the device: command responses, card reports, completions, ACK frames,
    /// waiting work, timers. Returns whether anything happened.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.now = now;
        let mut work = self.commands.poll(&self.regs);
        work |= self.advance_mr_jobs(now);
        work |= self.poll_meta(now);
        work |= self.poll_raw_rx();
        work |= self.poll_oob(now);
        work |= self.deliver_and_ack(now);
        work |= self.handle_cq_errors();
        for i in self.qp_indices() {
            if !self.qp(i).in_use() {
                continue;
            }
            work |= self.update_card_entry(i);
            if self.qp(i).rq.has_unannounced() {
                // A record the transport refused (its queue was full) goes again.
                self.announce_recvs(i);
            }
            if self.has_pending(i) {
                self.transmit(i, now);
            }
            if self.timers(i).is_due(Timer::Retransmit, now) {
                self.on_timeout(i, now);
                work = true;
            }
            if self.timers(i).is_due(Timer::Rnr, now) {
                self.on_rnr_timeout(i, now);
                work = true;
            }
            if self.timers(i).is_due(Timer::PeerLost, now) {
                self.timers(i).set(Timer::PeerLost, None);
                if self.qp(i).attrs.connected() {
                    core_debug!(
                        "QP {:#x}: its out-of-band peer is gone: QP to ERR",
                        self.qp(i).attrs.qpn.get()
                    );
                    self.fatal(i);
                }
                work = true;
            }
        }
        work
    }

    /// The earliest timer deadline, so a progress thread knows how long it may sleep.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let timers = self.storage.slices().timers;
        storage::next_deadline(&timers[..self.qp_high.min(timers.len())])
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
            crate::platform::release(&self.dma, b);
        }
        // Ring memory is returned too; the card must be reset before it is reused.
        let Device {
            regs,
            dma,
            mem,
            storage,
            commands,
            send,
            meta,
            sn_tx,
            sn_rx,
            ..
        } = self;
        let (cmd, resp) = commands.into_rings();
        for r in [cmd.into_slots(), send.into_slots(), sn_tx.into_slots()] {
            crate::platform::release(&dma, r.into_buffer());
        }
        for r in [resp.into_slots(), meta.into_slots(), sn_rx.into_slots()] {
            crate::platform::release(&dma, r.into_buffer());
        }
        (regs, dma, mem, storage)
    }
}
