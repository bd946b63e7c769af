//! The daemon's multiplexer: the card's one ring set, shared by the virtual ring sets of
//! every client ([`super::page`]).
//!
//! Each round it fetches what clients posted (commands, send WQEs, simple-NIC frames),
//! checks that each names only the client's own QPs, MRs, page-table entries and memory,
//! and puts it on the card's ring; it takes what the card reports and hands each report to
//! the client that owns its QP (command responses by the tag the daemon put in user_data,
//! meta reports by QPN, simple-NIC frames by the RoCE destination QP, or to every client
//! for other frames). A client that goes away is cleaned up in the card: once the card has
//! fetched every descriptor it posted, its QPs and MRs are invalidated with the daemon's
//! own commands, and its mappings are removed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::desc::cmd::{
    CmdRequest, CmdResponse, ManageQp, SetNetworkParam, SetRawPacketReceiveMeta, UpdateMrTable,
    ECHO_LEN, USER_DATA,
};
use bluerdma_core::desc::meta::MetaReport;
use bluerdma_core::desc::send::SendRequest;
use bluerdma_core::desc::simple_nic::{
    SimpleNicRx, SimpleNicTx, RX_BUFFER_SIZE, RX_SLOTS, RX_SLOT_SIZE,
};
use bluerdma_core::desc::{AccessFlags, RawDesc, DESC_SIZE};
use bluerdma_core::engine::TableWindows;
use bluerdma_core::keys::{MrKey, Qpn};
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, RegisterAccess};
use bluerdma_core::regs::{Counter, RingId, DECODED_CHANNELS};
use bluerdma_core::ring::{
    ConsumerRing, Popped, ProducerRing, RingMemory, RingRegs, RING_BYTES, RING_LEN,
};
use bluerdma_core::wire::ud::UD_UDP_PORT;

use super::page::{notify_client, ring_slot, Page, PageLayout};
use super::sys::{read_remote, write_remote};
use crate::backend::{DynDma, DynRegs, RemoteMemory};

const PTR_MASK: u32 = 0x1FFF;
const TAGS: usize = 256;
/// Page-table entries per UpdatePgt (the card's limit).
const PGT_PER_CMD: usize = bluerdma_core::desc::cmd::MAX_PGT_ENTRIES as usize;

/// Counters of what the multiplexer refused or dropped.
#[derive(Clone, Copy, Debug, Default)]
pub struct MuxStats {
    /// Commands refused (outside the client's tables or memory).
    pub refused_commands: u64,
    /// Send WQEs dropped (outside the client's QPs or MRs).
    pub refused_sends: u64,
    /// Simple-NIC frames a client asked to send from memory not its own.
    pub refused_frames: u64,
    /// Meta reports for a QP no client owns.
    pub orphan_reports: u64,
    /// Received frames dropped (no owner, or the owner's ring was full).
    pub dropped_frames: u64,
    /// Clients cleaned up after they left.
    pub reaped: u64,
}

/// One mapping of a client's memory for the card.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    /// The client's virtual address.
    pub va: u64,
    /// Bytes.
    pub len: u64,
    /// One of the engine's DMA buffers (rings are read there).
    pub dma: bool,
}

/// What the multiplexer knows of a client.
pub struct MuxClient {
    /// A number no other client of this daemon had.
    pub id: u64,
    /// Its process.
    pub pid: i32,
    /// Its register page.
    pub page: Arc<Page<PageLayout>>,
    /// Its share of the card's tables.
    pub windows: TableWindows,
    /// Its mappings by device address, none overlapping another: the daemon's IOVA
    /// mappings, or on the PCI card its checked claims (a DMA buffer's bytes, or one page of
    /// the card's size of user memory each).
    pub maps: BTreeMap<u64, Mapping>,
    /// Fetch pointers (host-to-card rings) and write pointers (card-to-host), by ring slot.
    ptr: [u32; 6],
    /// The tails published to the client (host-to-card rings).
    tail: [u32; 6],
    /// Descriptors waiting for room in its card-to-host rings, by ring slot.
    out: [VecDeque<RawDesc>; 6],
    /// Its live QPs (index: the ManageQp that made it valid) and MRs (index: key).
    qps: BTreeMap<u32, ManageQp>,
    mrs: BTreeMap<u32, MrKey>,
    /// Its simple-NIC receive buffer (virtual address) and next slot.
    rx_va: Option<u64>,
    rx_slot: u32,
    /// Set when it has gone: what the card must fetch before its tables are cleaned.
    leaving: Option<Leaving>,
    /// The client broke the ring protocol (an impossible head): it is dropped.
    pub broken: bool,
}

struct Leaving {
    send_mark: u64,
    ntx_mark: u64,
    cleanup_sent: bool,
}

impl MuxClient {
    /// A client at `pid` on `page`, owning `windows`.
    pub fn new(id: u64, pid: i32, page: Arc<Page<PageLayout>>, windows: TableWindows) -> Self {
        MuxClient {
            id,
            pid,
            page,
            windows,
            maps: BTreeMap::new(),
            ptr: [0; 6],
            tail: [0; 6],
            out: Default::default(),
            qps: BTreeMap::new(),
            mrs: BTreeMap::new(),
            rx_va: None,
            rx_slot: 0,
            leaving: None,
            broken: false,
        }
    }

    /// The mapping holding `[dev, dev + len)`, if one does (only DMA buffers with `dma`).
    fn lookup(&self, dev: u64, len: u64, dma_only: bool) -> Option<u64> {
        let (&start, m) = self.maps.range(..=dev).next_back()?;
        let end = dev.checked_add(len)?;
        (end <= start + m.len && (!dma_only || m.dma)).then(|| m.va + (dev - start))
    }

    /// Whether the page at `base` (`page` bytes) lies in the pages of one of its mappings:
    /// the daemon's device addresses reserve whole pages per mapping, and a claim is
    /// checked over all the pages it touches.
    fn owns_page(&self, base: u64, page: u64) -> bool {
        if base % page != 0 {
            return false;
        }
        self.maps
            .range(..base.saturating_add(page))
            .next_back()
            .is_some_and(|(&start, m)| {
                let first = start & !(page - 1);
                let end = (start + m.len).div_ceil(page) * page;
                (first..end).contains(&base)
            })
    }

    fn ring_va(&self, id: RingId) -> Option<u64> {
        let r = &self.page.get().rings[ring_slot(id)];
        let base = u64::from(r[0].load(Ordering::Acquire))
            | (u64::from(r[1].load(Ordering::Acquire)) << 32);
        if base == 0 {
            return None;
        }
        self.lookup(base, RING_BYTES as u64, true)
    }

    fn reg(&self, id: RingId, k: usize) -> u32 {
        self.page.get().rings[ring_slot(id)][k].load(Ordering::Acquire) & PTR_MASK
    }

    fn set_reg(&self, id: RingId, k: usize, v: u32) {
        self.page.get().rings[ring_slot(id)][k].store(v & PTR_MASK, Ordering::Release);
    }

    /// Descriptors posted on host-to-card ring `id` and not fetched yet.
    fn posted(&self, id: RingId) -> u32 {
        self.reg(id, 2).wrapping_sub(self.ptr[ring_slot(id)]) & PTR_MASK
    }

    /// Reads up to `max` posted descriptors of host-to-card ring `id` (not yet consumed:
    /// [`MuxClient::consume`] moves the tail).
    fn peek(&mut self, id: RingId, max: u32, out: &mut Vec<RawDesc>) -> Result<(), String> {
        out.clear();
        let posted = self.posted(id);
        if posted > RING_LEN as u32 {
            return Err(format!("{id:?}: impossible head {:#x}", self.reg(id, 2)));
        }
        let n = posted.min(max);
        if n == 0 {
            return Ok(());
        }
        let va = self
            .ring_va(id)
            .ok_or_else(|| format!("{id:?}: the ring's base is not a DMA buffer of this client"))?;
        let idx = self.ptr[ring_slot(id)] & (RING_LEN as u32 - 1);
        let first = n.min(RING_LEN as u32 - idx);
        let mut bytes = vec![0u8; n as usize * DESC_SIZE];
        let (a, b) = bytes.split_at_mut(first as usize * DESC_SIZE);
        read_remote(self.pid, va + u64::from(idx) * DESC_SIZE as u64, a)
            .and_then(|()| read_remote(self.pid, va, b))
            .map_err(|e| format!("{id:?}: reading the client's ring: {e}"))?;
        out.extend(bytes.chunks_exact(DESC_SIZE).map(|c| {
            let mut d = RawDesc::ZERO;
            d.0.copy_from_slice(c);
            d
        }));
        Ok(())
    }

    /// Moves the read pointer of host-to-card ring `id` past `n` descriptors; with
    /// `publish`, the tail the client sees too (commands, which the daemon has answered or
    /// copied). WQEs and frames are published by [`MuxClient::publish`] once the card has
    /// fetched them: the client reuses what a descriptor names (an ACK frame's buffer) when
    /// its tail passes it, as it would on the card.
    fn consume(&mut self, id: RingId, n: u32, publish: bool) {
        let s = ring_slot(id);
        self.ptr[s] = (self.ptr[s] + n) & PTR_MASK;
        if publish {
            self.publish(id, n);
        }
    }

    /// Moves the tail the client sees of host-to-card ring `id` by `n`.
    fn publish(&mut self, id: RingId, n: u32) {
        let s = ring_slot(id);
        self.tail[s] = (self.tail[s] + n) & PTR_MASK;
        self.set_reg(id, 3, self.tail[s]);
    }

    /// Writes what waits for card-to-host ring `id`, as far as the client's tail allows;
    /// whether it wrote anything.
    fn flush(&mut self, id: RingId) -> Result<bool, String> {
        let s = ring_slot(id);
        if self.out[s].is_empty() {
            return Ok(false);
        }
        let tail = self.reg(id, 3);
        let used = self.ptr[s].wrapping_sub(tail) & PTR_MASK;
        if used > RING_LEN as u32 {
            return Err(format!("{id:?}: impossible tail {tail:#x}"));
        }
        let free = RING_LEN as u32 - used;
        let n = (self.out[s].len() as u32).min(free);
        if n == 0 {
            return Ok(false);
        }
        let va = self
            .ring_va(id)
            .ok_or_else(|| format!("{id:?}: the ring's base is not a DMA buffer of this client"))?;
        let descs: Vec<RawDesc> = self.out[s].drain(..n as usize).collect();
        // Bodies first, then the valid bytes, in one call (copied in order).
        let mut parts: Vec<(u64, &[u8])> = Vec::with_capacity(2 * descs.len());
        let mut at = self.ptr[s];
        let mut slots = Vec::with_capacity(descs.len());
        for d in &descs {
            let slot = va + u64::from(at & (RING_LEN as u32 - 1)) * DESC_SIZE as u64;
            parts.push((slot, &d.0[..DESC_SIZE - 1]));
            slots.push(slot);
            at = (at + 1) & PTR_MASK;
        }
        for (d, slot) in descs.iter().zip(&slots) {
            parts.push((slot + DESC_SIZE as u64 - 1, &d.0[DESC_SIZE - 1..]));
        }
        write_remote(self.pid, &parts)
            .map_err(|e| format!("{id:?}: writing the client's ring: {e}"))?;
        self.ptr[s] = at;
        self.set_reg(id, 2, at);
        Ok(true)
    }

    fn owns_qpn(&self, qpn: Qpn) -> bool {
        self.windows.qp_index.contains(&qpn.index())
    }

    fn owns_key(&self, key: MrKey) -> bool {
        self.windows.mr_index.contains(&key.index())
    }

    fn owns_pgt(&self, start: u32, count: u32) -> bool {
        start >= self.windows.pgt.start
            && start
                .checked_add(count)
                .is_some_and(|e| e <= self.windows.pgt.end)
    }
}

/// A command on the card's ring, by tag.
#[derive(Clone, Copy)]
struct Pending {
    client: u64,
    user_data: u8,
    request: RawDesc,
    sent: RawDesc,
}

/// The card's ring set and the clients sharing it.
pub struct Mux {
    name: String,
    regs: DynRegs,
    dma: DynDma,
    /// `None` where clients claim memory they pinned themselves (the PCI card).
    remote: Option<Arc<dyn RemoteMemory>>,
    page_size: PageSize,
    net: SetNetworkParam,
    cmd: ProducerRing,
    resp: ConsumerRing,
    send: ProducerRing,
    meta: ConsumerRing,
    ntx: ProducerRing,
    nrx: ConsumerRing,
    rx_buf: DmaBuffer,
    staging: DmaBuffer,
    tags: Vec<Option<Pending>>,
    next_tag: usize,
    /// Commands waiting for a tag or room on the card's ring.
    cmd_wait: VecDeque<(u64, RawDesc, RawDesc)>,
    sent_send: u64,
    sent_ntx: u64,
    /// Batches of clients' WQEs and frames on the card's rings, in order: (client, its
    /// ring, descriptors of its ring, the card ring's count once they are fetched).
    unfetched: VecDeque<(u64, RingId, u32, u64)>,
    /// The clients, by slot.
    pub clients: Vec<Option<MuxClient>>,
    /// What was refused or dropped.
    pub stats: MuxStats,
    scratch: Vec<RawDesc>,
}

fn ring(dma: &DynDma) -> Result<RingMemory, String> {
    let buf = dma
        .alloc(RING_BYTES, bluerdma_core::ring::RING_ALIGN)
        .map_err(|e| format!("a ring buffer: {e:?}"))?;
    RingMemory::new(buf).map_err(|e| format!("a ring buffer: {:?}", e.error))
}

fn regs_of(id: RingId) -> RingRegs {
    RingRegs::of(id, DECODED_CHANNELS).expect("channel 0 rings are decoded")
}

impl Mux {
    /// Takes the card behind `regs` and `dma`: its rings, its simple-NIC receive buffer and
    /// its network parameters (the daemon's own commands, answered before it returns).
    /// Clients' memory reaches the card through `remote`, or, with none, at the bus
    /// addresses they claim (the daemon checks the claims before it records them in
    /// [`MuxClient::maps`]).
    pub fn open(
        name: &str,
        regs: DynRegs,
        dma: DynDma,
        remote: Option<Arc<dyn RemoteMemory>>,
        page_size: PageSize,
        net: SetNetworkParam,
        slots: usize,
    ) -> Result<Mux, String> {
        let mut cmd = ProducerRing::new(ring(&dma)?, regs_of(RingId::CmdRequest));
        let mut resp = ConsumerRing::new(ring(&dma)?, regs_of(RingId::CmdResponse));
        let mut send = ProducerRing::new(ring(&dma)?, regs_of(RingId::Send(0)));
        let mut meta = ConsumerRing::new(ring(&dma)?, regs_of(RingId::MetaReport(0)));
        let mut ntx = ProducerRing::new(ring(&dma)?, regs_of(RingId::SimpleNicTx));
        let mut nrx = ConsumerRing::new(ring(&dma)?, regs_of(RingId::SimpleNicRx));
        bluerdma_core::ring::program_rings(
            &regs,
            [&mut cmd, &mut send, &mut ntx],
            [&mut resp, &mut meta, &mut nrx],
        )
        .map_err(|e| e.to_string())?;
        let rx_buf = dma
            .alloc(RX_BUFFER_SIZE as usize, 4096)
            .map_err(|e| format!("the simple-NIC buffer: {e:?}"))?;
        let staging = dma
            .alloc(TAGS * PGT_PER_CMD * 8, 4096)
            .map_err(|e| format!("the page-table staging buffer: {e:?}"))?;
        let mut mux = Mux {
            name: name.to_string(),
            regs,
            dma,
            remote,
            page_size,
            net,
            cmd,
            resp,
            send,
            meta,
            ntx,
            nrx,
            rx_buf,
            staging,
            tags: vec![None; TAGS],
            next_tag: 0,
            cmd_wait: VecDeque::new(),
            sent_send: 0,
            sent_ntx: 0,
            unfetched: VecDeque::new(),
            clients: (0..slots).map(|_| None).collect(),
            stats: MuxStats::default(),
            scratch: Vec::new(),
        };
        let setup = [
            CmdRequest::SetNetworkParam(net),
            CmdRequest::SetRawPacketReceiveMeta(SetRawPacketReceiveMeta {
                write_base_addr: mux.rx_buf.device_addr(),
            }),
        ];
        for req in setup {
            mux.cmd_wait.push_back((0, req.encode(0), RawDesc::ZERO));
        }
        let start = std::time::Instant::now();
        while !mux.cmd_wait.is_empty() || mux.tags.iter().any(Option::is_some) {
            mux.commands_to_card();
            mux.card_responses();
            if start.elapsed() > std::time::Duration::from_secs(10) {
                return Err("the card did not answer its setup commands in 10 s".into());
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        Ok(mux)
    }

    /// The card's page size.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// The device address space the card reaches client memory through (`None`: clients
    /// claim bus addresses).
    pub fn remote(&self) -> Option<&Arc<dyn RemoteMemory>> {
        self.remote.as_ref()
    }

    /// Wakes every client's progress thread that sleeps (records from peers for one of
    /// them went into its relay socket).
    pub fn notify_clients(&self) {
        for c in self.clients.iter().flatten() {
            notify_client(&c.page);
        }
    }

    /// Copies the card's counters into every client's page.
    pub fn mirror_counters(&self) {
        let vals: Vec<u32> = Counter::ALL
            .iter()
            .map(|c| self.regs.read32(c.reg()))
            .collect();
        for c in self.clients.iter().flatten() {
            for (slot, v) in c.page.get().counters.iter().zip(&vals) {
                slot.store(*v, Ordering::Relaxed);
            }
        }
    }

    /// One round; whether anything moved.
    pub fn round(&mut self) -> bool {
        let mut work = false;
        for slot in 0..self.clients.len() {
            work |= self.fetch_from_client(slot);
        }
        work |= self.commands_to_card();
        work |= self.card_responses();
        work |= self.card_reports();
        work |= self.card_frames();
        work |= self.publish_fetched();
        for slot in 0..self.clients.len() {
            work |= self.deliver_to_client(slot);
        }
        work |= self.reap();
        work
    }

    fn client_by_id(&mut self, id: u64) -> Option<&mut MuxClient> {
        self.clients
            .iter_mut()
            .flatten()
            .find(|c| c.id == id && c.leaving.is_none())
    }

    fn broken(&mut self, slot: usize, why: String) {
        if let Some(c) = self.clients[slot].as_mut() {
            if !c.broken {
                log::error!(
                    "{}: client {} (pid {}): {why}; dropping it",
                    self.name,
                    c.id,
                    c.pid
                );
                c.broken = true;
            }
        }
    }

    /// Fetches a client's posted descriptors onto the card's rings.
    fn fetch_from_client(&mut self, slot: usize) -> bool {
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = self.fetch_client_rings(slot, &mut scratch);
        self.scratch = scratch;
        match r {
            Ok(w) => w,
            Err(why) => {
                self.broken(slot, why);
                false
            }
        }
    }

    fn fetch_client_rings(&mut self, slot: usize, buf: &mut Vec<RawDesc>) -> Result<bool, String> {
        let Some(c) = self.clients[slot].as_mut() else {
            return Ok(false);
        };
        if c.leaving.is_some() || c.broken {
            return Ok(false);
        }
        let mut work = false;
        // Commands.
        c.peek(RingId::CmdRequest, 64, buf)?;
        if !buf.is_empty() {
            let n = buf.len() as u32;
            let id = c.id;
            let descs = std::mem::take(buf);
            for d in &descs {
                self.client_command(slot, id, d);
            }
            *buf = descs;
            if let Some(c) = self.clients[slot].as_mut() {
                c.consume(RingId::CmdRequest, n, true);
            }
            work = true;
        }
        // Send WQEs, as far as the card's ring has room.
        let free = self.card_free(true);
        let Some(c) = self.clients[slot].as_mut() else {
            return Ok(work);
        };
        c.peek(RingId::Send(0), u32::from(free) & !1, buf)?;
        if !buf.is_empty() {
            let mut ok = Vec::with_capacity(buf.len());
            let mut k = 0;
            while k < buf.len() {
                let first = buf[k];
                if !first.has_next() || k + 1 == buf.len() {
                    // A lone Seg0 or an unpaired descriptor: the card would mis-pair it.
                    self.stats.refused_sends += 1;
                    k += 1;
                    continue;
                }
                let second = buf[k + 1];
                match SendRequest::decode(&first, &second) {
                    Ok(w)
                        if c.owns_qpn(w.seg1.sqpn)
                            && (w.seg1.len == 0 || c.owns_key(w.seg1.lkey)) =>
                    {
                        ok.push(first);
                        ok.push(second);
                    }
                    Ok(w) => {
                        self.stats.refused_sends += 1;
                        log::warn!(
                            "{}: client {} posted a WQE for QP {:#x} / lkey {:#x}, not its own: dropped",
                            self.name, c.pid, w.seg1.sqpn.get(), w.seg1.lkey.get()
                        );
                    }
                    Err(e) => {
                        self.stats.refused_sends += 1;
                        log::warn!(
                            "{}: client {}: a WQE that does not decode ({e:?}): dropped",
                            self.name,
                            c.pid
                        );
                    }
                }
                k += 2;
            }
            let n = buf.len() as u32;
            c.consume(RingId::Send(0), n, false);
            let id = c.id;
            if !ok.is_empty() {
                if let Err(e) = self.send.push_batch(&self.regs, &ok) {
                    log::error!(
                        "{}: the card's send ring refused {} WQEs: {e:?}",
                        self.name,
                        ok.len()
                    );
                } else {
                    self.sent_send += ok.len() as u64;
                }
            }
            self.unfetched
                .push_back((id, RingId::Send(0), n, self.sent_send));
            work = true;
        }
        // Simple-NIC frames.
        let free = self.card_free(false);
        let Some(c) = self.clients[slot].as_mut() else {
            return Ok(work);
        };
        c.peek(RingId::SimpleNicTx, u32::from(free), buf)?;
        if !buf.is_empty() {
            let mut ok = Vec::with_capacity(buf.len());
            for d in buf.iter() {
                let f = SimpleNicTx::decode(d);
                if c.lookup(f.addr.0, u64::from(f.len), true).is_some() {
                    ok.push(*d);
                } else {
                    self.stats.refused_frames += 1;
                    log::warn!(
                        "{}: client {}: a frame at {:#x} outside its buffers: dropped",
                        self.name,
                        c.pid,
                        f.addr.0
                    );
                }
            }
            let n = buf.len() as u32;
            c.consume(RingId::SimpleNicTx, n, false);
            let id = c.id;
            if !ok.is_empty() {
                if let Err(e) = self.ntx.push_batch(&self.regs, &ok) {
                    log::error!(
                        "{}: the card's simple-NIC ring refused {} frames: {e:?}",
                        self.name,
                        ok.len()
                    );
                } else {
                    self.sent_ntx += ok.len() as u64;
                }
            }
            self.unfetched
                .push_back((id, RingId::SimpleNicTx, n, self.sent_ntx));
            work = true;
        }
        Ok(work)
    }

    /// Free slots of the card's send (or simple-NIC TX) ring.
    fn card_free(&mut self, send: bool) -> u16 {
        let r = if send { &mut self.send } else { &mut self.ntx };
        if r.free_slots() < 64 {
            let _ = r.refresh_tail(&self.regs);
        }
        r.free_slots()
    }

    /// Answers a client's command itself (success or refusal).
    fn answer(&mut self, slot: usize, d: &RawDesc, ok: bool) {
        let mut r = CmdResponse::header_only(d);
        r.is_success = ok;
        if let Some(c) = self.clients[slot].as_mut() {
            c.out[ring_slot(RingId::CmdResponse)].push_back(r.encode());
        }
    }

    fn refuse(&mut self, slot: usize, d: &RawDesc, why: &str) {
        self.stats.refused_commands += 1;
        if let Some(c) = &self.clients[slot] {
            log::warn!(
                "{}: client {} (pid {}): command refused: {why}",
                self.name,
                c.id,
                c.pid
            );
        }
        self.answer(slot, d, false);
    }

    fn client_command(&mut self, slot: usize, id: u64, d: &RawDesc) {
        let req = match CmdRequest::decode(d) {
            Ok((req, _)) => req,
            Err(e) => return self.refuse(slot, d, &format!("it does not decode: {e:?}")),
        };
        let Some(c) = self.clients[slot].as_mut() else {
            return;
        };
        let mut sent = *d;
        match req {
            CmdRequest::SetNetworkParam(n) => {
                let same = n.ip == self.net.ip && n.mac == self.net.mac;
                return if same {
                    self.answer(slot, d, true)
                } else {
                    self.refuse(slot, d, "network parameters other than the device's")
                };
            }
            CmdRequest::SetRawPacketReceiveMeta(m) => {
                return match c.lookup(m.write_base_addr.0, u64::from(RX_BUFFER_SIZE), true) {
                    Some(va) => {
                        c.rx_va = Some(va);
                        c.rx_slot = 0;
                        self.answer(slot, d, true)
                    }
                    None => self.refuse(slot, d, "a simple-NIC buffer outside its DMA buffers"),
                };
            }
            CmdRequest::ManageQp(q) => {
                if !c.owns_qpn(q.qpn) {
                    return self.refuse(
                        slot,
                        d,
                        &format!("QP {:#x} is not in its window", q.qpn.get()),
                    );
                }
                if q.is_valid {
                    c.qps.insert(q.qpn.index(), q);
                } else {
                    c.qps.remove(&q.qpn.index());
                }
            }
            CmdRequest::UpdateMrTable(m) => {
                if !c.owns_key(m.mr_key) {
                    return self.refuse(
                        slot,
                        d,
                        &format!("MR key {:#x} is not in its window", m.mr_key.get()),
                    );
                }
                if m.mr_length > 0 {
                    let s = self.page_size.shift();
                    let pages = ((m.mr_base_va.0 + u64::from(m.mr_length) - 1) >> s)
                        - (m.mr_base_va.0 >> s)
                        + 1;
                    if !c.owns_pgt(m.pgt_offset, pages as u32) {
                        return self.refuse(slot, d, "page-table entries outside its window");
                    }
                    c.mrs.insert(m.mr_key.index(), m.mr_key);
                } else {
                    c.mrs.remove(&m.mr_key.index());
                }
            }
            CmdRequest::UpdatePgt(p) => {
                if !c.owns_pgt(p.start_index, p.entry_count) || p.entry_count as usize > PGT_PER_CMD
                {
                    return self.refuse(slot, d, "page-table entries outside its window");
                }
                let bytes = p.entry_count as u64 * 8;
                let Some(va) = c.lookup(p.dma_addr.0, bytes, true) else {
                    return self.refuse(slot, d, "a staging buffer outside its DMA buffers");
                };
                let mut entries = vec![0u8; bytes as usize];
                if let Err(e) = read_remote(c.pid, va, &mut entries) {
                    return self.refuse(slot, d, &format!("its staging buffer: {e}"));
                }
                let page = self.page_size.bytes();
                let foreign = entries
                    .chunks_exact(8)
                    .map(|e| u64::from_le_bytes(e.try_into().expect("8 bytes")))
                    .find(|&a| !c.owns_page(a, page));
                if let Some(a) = foreign {
                    return self.refuse(
                        slot,
                        d,
                        &format!("a page at {a:#x} that is not its memory"),
                    );
                }
                // The card reads the checked copy, not the client's buffer (which the
                // client could change after the check). The tag picks the copy's place.
                let Some(tag) = self.free_tag() else {
                    // No tag: try again next round (the descriptor is re-read then).
                    self.cmd_wait.push_back((id, *d, RawDesc::ZERO));
                    return;
                };
                let at = tag * PGT_PER_CMD * 8;
                // SAFETY: the staging buffer is TAGS * PGT_PER_CMD * 8 bytes, `at` is a
                // multiple of PGT_PER_CMD * 8 below that and entries.len() <= PGT_PER_CMD * 8;
                // the card reads this slot only after the doorbell below.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        entries.as_ptr(),
                        self.staging.cpu().as_ptr().add(at),
                        entries.len(),
                    )
                };
                let mut q = p;
                q.dma_addr = DeviceAddr(self.staging.device_addr().0 + at as u64);
                let user_data = d.get(USER_DATA) as u8;
                sent = CmdRequest::UpdatePgt(q).encode(tag as u8);
                self.tags[tag] = Some(Pending {
                    client: id,
                    user_data,
                    request: *d,
                    sent,
                });
                return self.push_tagged(tag);
            }
        }
        self.cmd_wait.push_back((id, *d, sent));
    }

    fn free_tag(&mut self) -> Option<usize> {
        (0..TAGS)
            .map(|k| (self.next_tag + k) % TAGS)
            .find(|&t| self.tags[t].is_none())
            .inspect(|&t| self.next_tag = (t + 1) % TAGS)
    }

    fn push_tagged(&mut self, tag: usize) {
        let Some(p) = self.tags[tag] else { return };
        if let Err(e) = self.cmd.push_batch(&self.regs, &[p.sent]) {
            log::error!(
                "{}: the card's command ring refused a command: {e:?}",
                self.name
            );
            self.tags[tag] = None;
        }
    }

    /// Moves waiting commands onto the card's ring, each with a tag.
    fn commands_to_card(&mut self) -> bool {
        let mut work = false;
        while let Some(&(client, request, sent)) = self.cmd_wait.front() {
            if self.cmd.free_slots() == 0 && self.cmd.refresh_tail(&self.regs).unwrap_or(0) == 0 {
                break;
            }
            let Some(tag) = self.free_tag() else { break };
            self.cmd_wait.pop_front();
            if sent == RawDesc::ZERO && client != 0 {
                // An UpdatePgt that found no tag: check and copy it again.
                let slot = self
                    .clients
                    .iter()
                    .position(|c| c.as_ref().is_some_and(|c| c.id == client));
                if let Some(slot) = slot {
                    self.client_command(slot, client, &request);
                }
                work = true;
                continue;
            }
            let mut out = if client == 0 { request } else { sent };
            out.set(USER_DATA, tag as u64);
            self.tags[tag] = Some(Pending {
                client,
                user_data: request.get(USER_DATA) as u8,
                request,
                sent: out,
            });
            self.push_tagged(tag);
            work = true;
        }
        work
    }

    /// Command responses, to the client that sent each command.
    fn card_responses(&mut self) -> bool {
        let mut got = Vec::new();
        self.resp.poll(&self.regs, 256, |p| {
            if let Popped::One(d) = p {
                got.push(d);
            }
        });
        let work = !got.is_empty();
        for d in got {
            let Ok(r) = CmdResponse::decode(&d) else {
                log::error!("{}: a command response that does not decode", self.name);
                continue;
            };
            let Some(p) = self
                .tags
                .get_mut(r.user_data as usize)
                .and_then(Option::take)
            else {
                log::error!(
                    "{}: a command response with tag {} nobody waits for",
                    self.name,
                    r.user_data
                );
                continue;
            };
            if !r.is_success {
                log::warn!(
                    "{}: the card failed a command of client {}",
                    self.name,
                    p.client
                );
            }
            if p.client == 0 {
                continue;
            }
            let mut answer = r;
            answer.user_data = p.user_data;
            if r.echo[..] == p.sent.0[..ECHO_LEN] {
                answer.echo.copy_from_slice(&p.request.0[..ECHO_LEN]);
            }
            if let Some(c) = self.client_by_id(p.client) {
                c.out[ring_slot(RingId::CmdResponse)].push_back(answer.encode());
            }
        }
        work
    }

    /// The client whose window holds the QP index of `qpn`: the card's QPs (index << 8 |
    /// key) and the library's UD QPs (0x800000 | index << 8 | n) alike.
    fn owner_of_qpn(&self, qpn: Qpn) -> Option<usize> {
        let index = (qpn.get() >> 8) & 0x3FF;
        self.clients.iter().position(|c| {
            c.as_ref()
                .is_some_and(|c| c.leaving.is_none() && c.windows.qp_index.contains(&index))
        })
    }

    /// Meta reports, to the client that owns the QP.
    fn card_reports(&mut self) -> bool {
        let mut n = 0;
        while n < 1024 {
            let Some(p) = self.meta.pop() else { break };
            n += 1;
            let (first, second) = match p {
                Popped::One(a) => (a, None),
                Popped::Pair(a, b) => (a, Some(b)),
                Popped::Overlong(..) | Popped::OverlongRest(_) => {
                    self.stats.orphan_reports += 1;
                    continue;
                }
            };
            let qpn = match MetaReport::decode(&first, second.as_ref()) {
                Ok(MetaReport::Packet(i)) | Ok(MetaReport::ReadRequest(i, _)) => i.dqpn,
                Ok(MetaReport::Ack(a)) | Ok(MetaReport::Nak(a, _)) => a.qpn,
                Err(e) => {
                    log::warn!(
                        "{}: a meta report that does not decode ({e:?}): dropped",
                        self.name
                    );
                    self.stats.orphan_reports += 1;
                    continue;
                }
            };
            match self.owner_of_qpn(qpn) {
                Some(slot) => {
                    let c = self.clients[slot].as_mut().expect("owner exists");
                    let out = &mut c.out[ring_slot(RingId::MetaReport(0))];
                    out.push_back(first);
                    out.extend(second);
                }
                None => self.stats.orphan_reports += 1,
            }
        }
        self.meta.sync_tail(&self.regs);
        n > 0
    }

    /// Received simple-NIC frames: RoCE frames to the owner of their destination QP, every
    /// other frame to every client. The ring's tail is published after the frames are
    /// copied out: the card may reuse a frame's slot once it is.
    fn card_frames(&mut self) -> bool {
        let mut n = 0;
        while n < RX_SLOTS / 2 {
            let Some(p) = self.nrx.pop() else { break };
            n += 1;
            if let Popped::One(d) = p {
                self.card_frame(&d);
            } else {
                self.stats.dropped_frames += 1;
            }
        }
        self.nrx.sync_tail(&self.regs);
        n > 0
    }

    fn card_frame(&mut self, d: &RawDesc) {
        let rx = match SimpleNicRx::decode(d) {
            Ok(rx) if rx.len <= RX_SLOT_SIZE => rx,
            _ => {
                self.stats.dropped_frames += 1;
                return;
            }
        };
        let at = rx.slot_idx as usize * RX_SLOT_SIZE as usize;
        // SAFETY: slot_idx < RX_SLOTS (decode checks it) and len <= RX_SLOT_SIZE, so the
        // frame lies inside the RX_BUFFER_SIZE buffer, which the card wrote before the
        // descriptor (the ring's valid bit, acquired by the pop) and does not write again
        // before the ring's tail passes the descriptor (after this frame is copied).
        let frame = unsafe {
            std::slice::from_raw_parts(self.rx_buf.cpu().as_ptr().add(at), rx.len as usize)
        };
        // One owner (a RoCE or UD frame), or every client (ARP and the like).
        let owner = roce_dest_qpn(frame).map(|q| self.owner_of_qpn(Qpn::from_raw(q)));
        let mut delivered = false;
        for slot in 0..self.clients.len() {
            if owner.is_some_and(|o| o != Some(slot)) {
                continue;
            }
            let Some(c) = self.clients[slot].as_mut() else {
                continue;
            };
            if c.leaving.is_some() {
                continue;
            }
            let s = ring_slot(RingId::SimpleNicRx);
            let Some(va) = c.rx_va else { continue };
            let outstanding = c.out[s].len() as u32
                + (c.ptr[s].wrapping_sub(c.reg(RingId::SimpleNicRx, 3)) & PTR_MASK);
            if outstanding >= RX_SLOTS / 2 {
                continue;
            }
            let k = c.rx_slot;
            c.rx_slot = (k + 1) % RX_SLOTS;
            let to = va + u64::from(k) * u64::from(RX_SLOT_SIZE);
            if write_remote(c.pid, &[(to, frame)]).is_err() {
                continue;
            }
            c.out[s].push_back(
                SimpleNicRx {
                    slot_idx: k,
                    len: rx.len,
                }
                .encode(),
            );
            delivered = true;
        }
        if !delivered {
            self.stats.dropped_frames += 1;
        }
    }

    fn deliver_to_client(&mut self, slot: usize) -> bool {
        let Some(c) = self.clients[slot].as_mut() else {
            return false;
        };
        if c.leaving.is_some() || c.broken {
            return false;
        }
        let mut wrote = false;
        for id in [
            RingId::CmdResponse,
            RingId::MetaReport(0),
            RingId::SimpleNicRx,
        ] {
            match c.flush(id) {
                Ok(w) => wrote |= w,
                Err(why) => {
                    self.broken(slot, why);
                    return false;
                }
            }
        }
        if wrote {
            notify_client(&c.page);
        }
        wrote
    }

    /// A client has gone: from now on nothing is fetched for it, nothing is delivered to it,
    /// and its tables are cleaned once the card has fetched what it posted.
    pub fn leave(&mut self, slot: usize) {
        let (send_mark, ntx_mark) = (self.sent_send, self.sent_ntx);
        if let Some(c) = self.clients[slot].as_mut() {
            if c.leaving.is_none() {
                c.leaving = Some(Leaving {
                    send_mark,
                    ntx_mark,
                    cleanup_sent: false,
                });
            }
        }
    }

    /// Publishes to each client the tails of the batches the card has fetched.
    fn publish_fetched(&mut self) -> bool {
        if self.unfetched.is_empty() {
            return false;
        }
        let (send_done, ntx_done) = self.fetched();
        let mut work = false;
        while let Some(&(client, ring, n, mark)) = self.unfetched.front() {
            let done = if ring == RingId::SimpleNicTx {
                ntx_done
            } else {
                send_done
            };
            if mark > done {
                // Each ring's batches are in order; the other ring's may be done already.
                let other = self.unfetched.iter().position(|u| {
                    u.1 != ring
                        && u.3
                            <= if u.1 == RingId::SimpleNicTx {
                                ntx_done
                            } else {
                                send_done
                            }
                });
                match other {
                    Some(k) => {
                        let (client, ring, n, _) = self.unfetched.remove(k).expect("found");
                        if let Some(c) = self.client_by_id(client) {
                            c.publish(ring, n);
                            notify_client(&c.page);
                        }
                        work = true;
                        continue;
                    }
                    None => break,
                }
            }
            self.unfetched.pop_front();
            if let Some(c) = self.client_by_id(client) {
                c.publish(ring, n);
                notify_client(&c.page);
            }
            work = true;
        }
        work
    }

    fn fetched(&mut self) -> (u64, u64) {
        let _ = self.send.refresh_tail(&self.regs);
        let _ = self.ntx.refresh_tail(&self.regs);
        (
            self.sent_send - u64::from(self.send.pending()),
            self.sent_ntx - u64::from(self.ntx.pending()),
        )
    }

    /// Cleans up clients that left; whether it did anything.
    fn reap(&mut self) -> bool {
        if !self.clients.iter().flatten().any(|c| c.leaving.is_some()) {
            return false;
        }
        let (send_done, ntx_done) = self.fetched();
        let mut work = false;
        for slot in 0..self.clients.len() {
            let Some(c) = self.clients[slot].as_mut() else {
                continue;
            };
            let Some(l) = c.leaving.as_mut() else {
                continue;
            };
            if send_done < l.send_mark || ntx_done < l.ntx_mark {
                continue;
            }
            if !l.cleanup_sent {
                l.cleanup_sent = true;
                let qps: Vec<ManageQp> = c.qps.values().copied().collect();
                let mrs: Vec<MrKey> = c.mrs.values().copied().collect();
                log::info!(
                    "{}: client {} (pid {}) left: invalidating {} QPs and {} MRs in the card",
                    self.name,
                    c.id,
                    c.pid,
                    qps.len(),
                    mrs.len()
                );
                c.qps.clear();
                c.mrs.clear();
                for mut q in qps {
                    q.is_valid = false;
                    self.cmd_wait
                        .push_back((0, CmdRequest::ManageQp(q).encode(0), RawDesc::ZERO));
                }
                for key in mrs {
                    let inv = CmdRequest::UpdateMrTable(UpdateMrTable {
                        mr_base_va: VirtAddr(0),
                        mr_length: 0,
                        mr_key: key,
                        pd: 0,
                        acc_flags: AccessFlags::empty(),
                        pgt_offset: 0,
                    });
                    self.cmd_wait.push_back((0, inv.encode(0), RawDesc::ZERO));
                }
                work = true;
                continue;
            }
            // Every command of the daemon's is answered (ours, tag client 0) before the
            // mappings go: the card may still read through them until then.
            let ours_pending = self.cmd_wait.iter().any(|w| w.0 == 0)
                || self
                    .tags
                    .iter()
                    .flatten()
                    .any(|p| p.client == 0 || p.client == c.id);
            if ours_pending {
                continue;
            }
            let c = self.clients[slot].take().expect("checked above");
            if let Some(remote) = &self.remote {
                for dev in c.maps.keys() {
                    remote.unmap(DeviceAddr(*dev));
                }
            }
            self.stats.reaped += 1;
            log::info!("{}: client {} (pid {}) cleaned up", self.name, c.id, c.pid);
            work = true;
        }
        work
    }

    /// QPs and MRs the daemon holds valid in the card for each client (slot, QPs, MRs).
    pub fn tables(&self) -> Vec<(usize, i32, usize, usize)> {
        self.clients
            .iter()
            .enumerate()
            .filter_map(|(s, c)| c.as_ref().map(|c| (s, c.pid, c.qps.len(), c.mrs.len())))
            .collect()
    }

    /// Whether nothing of the daemon's own waits for the card.
    pub fn idle(&self) -> bool {
        self.cmd_wait.is_empty() && self.tags.iter().all(Option::is_none)
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        // The buffers go back to the card's allocator; the daemon stops the card first.
        let rx = std::mem::replace(&mut self.rx_buf, empty_buffer());
        let st = std::mem::replace(&mut self.staging, empty_buffer());
        // SAFETY: the daemon drops the mux only after the card is stopped (its handle
        // dropped), so nothing reads these buffers any more.
        unsafe {
            self.dma.free(rx);
            self.dma.free(st);
        }
    }
}

fn empty_buffer() -> DmaBuffer {
    // SAFETY: a zero-length buffer at a dangling address is never read or written.
    unsafe { DmaBuffer::new(std::ptr::NonNull::dangling(), DeviceAddr(0), 0) }
}

/// The destination QPN of a RoCEv2 frame (Ethernet, IPv4, UDP to 4791, BTH) or of the
/// driver's UD frames (UDP to [`UD_UDP_PORT`], BTH), if it is one.
pub fn roce_dest_qpn(f: &[u8]) -> Option<u32> {
    if f.len() < 14 + 20 + 8 + 12 || f[12..14] != [0x08, 0x00] {
        return None;
    }
    let ihl = usize::from(f[14] & 0x0F) * 4;
    if ihl < 20 || f[14 + 9] != 17 {
        return None;
    }
    let udp = 14 + ihl;
    let bth = udp + 8;
    let port = f.get(udp + 2..udp + 4)?;
    if f.len() < bth + 12 || (port != 4791u16.to_be_bytes() && port != UD_UDP_PORT.to_be_bytes()) {
        return None;
    }
    Some(u32::from_be_bytes([0, f[bth + 5], f[bth + 6], f[bth + 7]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_frames_name_their_destination_qp_and_others_none() {
        let mut f = vec![0u8; 14 + 20 + 8 + 12 + 4];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[34 + 2..34 + 4].copy_from_slice(&4791u16.to_be_bytes());
        f[42 + 5..42 + 8].copy_from_slice(&[0x00, 0x12, 0x34]);
        assert_eq!(roce_dest_qpn(&f), Some(0x1234));
        f[34 + 3] = 0;
        assert_eq!(roce_dest_qpn(&f), None);
        assert_eq!(roce_dest_qpn(&f[..20]), None);
        assert_eq!(roce_dest_qpn(&[]), None);
    }

    #[test]
    fn ud_frames_name_a_qp_whose_index_is_in_the_senders_window() {
        let mut f = vec![0u8; 14 + 20 + 8 + 12 + 4];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[34 + 2..34 + 4].copy_from_slice(&UD_UDP_PORT.to_be_bytes());
        // The library's UD QPN on a shared device: 0x800000 | index << 8 | n.
        let qpn: u32 = 0x80_0000 | (130 << 8) | 5;
        f[42 + 5..42 + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        assert_eq!(roce_dest_qpn(&f), Some(qpn));
        let index = (qpn >> 8) & 0x3FF;
        assert!(TableWindows::split(8, 1).unwrap().qp_index.contains(&index));
        assert!(!TableWindows::split(8, 0).unwrap().qp_index.contains(&index));
    }
}
