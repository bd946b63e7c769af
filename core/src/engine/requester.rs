//! The requester: `post_send` validates a work request and queues its WQE; `transmit`
//! hands queued WQEs to the card while the send window has room, in posting order:
//! match the peer's receive WR (SEND), assign PSNs and the MSN at first transmission, cut
//! into chunks, encode two descriptors per chunk, and ring one doorbell per batch.

use crate::addr::VirtAddr;
use crate::desc::send::{SendFlags, SendRequest, SendSeg0, SendSeg1, WorkReqOpcode};
use crate::desc::{AccessFlags, RawDesc};
use crate::keys::Qpn;
use crate::mac::MacAddr;
use crate::mtu::Pmtu;
use crate::qp::{QpState, QpType};
use crate::ring::DescStaging;
use crate::time::{Instant, Nanos};
use crate::transport::{Chunk, Fragmenter, Psn};

use super::config::{BATCH, CHUNK_BYTES, SEND_WINDOW_CAP};
use super::error::VerbsError;
use super::qp::{QpAttrs, QpHandle, QpIndex, READ_RESPONSE_ROOM};
use super::responder::READS_TRACKED;
use super::retire::SendMark;
use super::storage::{SendQueue, SqCounters, Timer};
use super::wqe::{chunk_count_len, Wqe, WqeState};
use super::wr::{SendOp, SendWr};
use super::{Device, Platform, Storage};

/// The send side of a QP: PSNs, MSN, retries, and its send queue's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Requester {
    pub(super) sq: SqCounters,
    /// Next PSN to assign.
    next_psn: Psn,
    /// First PSN not yet acknowledged by the peer.
    acked_psn: Psn,
    next_msn: u16,
    /// Retransmissions left before RETRY_EXC_ERR.
    retries_left: u8,
    /// Send WRs of the caller (not READ responses) retired so far.
    retired: u64,
    /// The send ring's descriptor count after this QP's last descriptor: until the card
    /// has fetched that many, its packets are not all on the wire yet.
    ring_mark: SendMark,
    /// Timer expiries in a row that found the QP's descriptors still in the send ring.
    queued_waits: u8,
}

/// Expiries in a row a QP waits for the card to fetch its descriptors before they count
/// as timeouts anyway (a card that stopped fetching must not hang the QP forever).
pub(crate) const QUEUED_WAITS_MAX: u8 = 32;

impl Default for Requester {
    #[inline]
    fn default() -> Self {
        Requester {
            sq: SqCounters::default(),
            next_psn: Psn::from_raw(0),
            acked_psn: Psn::from_raw(0),
            next_msn: 0,
            retries_left: 7,
            retired: 0,
            ring_mark: SendMark::default(),
            queued_waits: 0,
        }
    }
}

impl Requester {
    /// `sq_psn` was set: nothing is outstanding from it.
    #[inline]
    pub(crate) fn reset_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.acked_psn = psn;
    }

    /// The send ring's descriptor count after this QP's last descriptor.
    #[inline]
    pub(crate) fn ring_mark(&self) -> SendMark {
        self.ring_mark
    }

    /// The timer fired with descriptors still in the send ring: whether to wait once more
    /// (false after [`QUEUED_WAITS_MAX`] in a row). `fetched`: the card has them all.
    #[inline]
    pub(crate) fn wait_for_card(&mut self, fetched: bool) -> bool {
        if fetched || self.queued_waits >= QUEUED_WAITS_MAX {
            self.queued_waits = 0;
            return false;
        }
        self.queued_waits += 1;
        true
    }

    /// This QP's descriptors went on the send ring, up to `mark`.
    #[inline]
    pub(crate) fn mark_ring(&mut self, mark: SendMark) {
        self.ring_mark = mark;
    }

    /// The next PSN to assign.
    #[inline]
    pub(crate) fn next_psn(&self) -> Psn {
        self.next_psn
    }

    /// The oldest PSN not acknowledged.
    #[inline]
    pub(crate) fn acked_psn(&self) -> Psn {
        self.acked_psn
    }

    /// Every PSN sent is acknowledged.
    #[inline]
    pub(crate) fn all_acked(&self) -> bool {
        self.acked_psn == self.next_psn
    }

    /// An ACK up to `psn` (exclusive): counts only if it moves forward and not past what
    /// was sent. A counting ACK refills the retries.
    #[inline]
    pub(crate) fn ack(&mut self, psn: Psn, retry_cnt: u8) -> bool {
        if !self.acked_psn.is_before(psn) || self.next_psn.is_before(psn) {
            return false;
        }
        self.acked_psn = psn;
        self.retries_left = retry_cnt;
        true
    }

    /// `n` retries again (retry_cnt set, or progress seen).
    #[inline]
    pub(crate) fn reset_retries(&mut self, n: u8) {
        self.retries_left = n;
    }

    /// Uses one retry; false when none is left.
    #[inline]
    pub(crate) fn use_retry(&mut self) -> bool {
        match self.retries_left.checked_sub(1) {
            Some(left) => {
                self.retries_left = left;
                true
            }
            None => false,
        }
    }

    /// Retries left (for dumps).
    #[inline]
    pub(crate) fn retries_left(&self) -> u8 {
        self.retries_left
    }

    /// Send WRs of the caller that left the send queue.
    #[inline]
    pub(crate) fn retired(&self) -> u64 {
        self.retired
    }

    /// One more left the send queue.
    #[inline]
    pub(crate) fn note_retired(&mut self) {
        self.retired += 1;
    }
}

/// What a packet of a QP needs from its slot: the two ends and the PMTU.
#[derive(Clone, Copy)]
pub(crate) struct Path {
    pub(crate) qpn: Qpn,
    pub(crate) dest_qpn: Qpn,
    pub(crate) peer_ip: core::net::Ipv4Addr,
    pub(crate) peer_mac: MacAddr,
    pub(crate) pmtu: Pmtu,
}

impl Path {
    #[inline]
    pub(crate) fn of(a: &QpAttrs) -> Self {
        Path {
            qpn: a.qpn,
            dest_qpn: a.dest_qpn,
            peer_ip: a.peer_ip,
            peer_mac: a.peer_mac,
            pmtu: a.pmtu,
        }
    }
}

/// Descriptors gathered for one doorbell (not zeroed up front: [`DescStaging`]).
pub(crate) struct Batch {
    descs: DescStaging<BATCH>,
}

impl Batch {
    #[inline]
    pub(crate) fn new() -> Self {
        Batch {
            descs: DescStaging::new(),
        }
    }

    /// Descriptors gathered.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.descs.len()
    }

    /// Whether `more` descriptors still fit.
    #[inline]
    pub(crate) fn fits(&self, more: usize) -> bool {
        self.descs.len() + more <= BATCH
    }

    /// Appends a send request's two descriptors (the caller checked `fits(2)`).
    #[inline]
    pub(crate) fn push_pair(&mut self, req: &SendRequest) {
        if self.fits(2) {
            let (mut seg0, mut seg1) = (RawDesc::ZERO, RawDesc::ZERO);
            req.encode_into(&mut seg0, &mut seg1);
            self.descs.push(seg0);
            self.descs.push(seg1);
        }
    }

    /// Appends one descriptor (the caller checked `fits(1)`).
    #[inline]
    pub(crate) fn push(&mut self, d: RawDesc) {
        self.descs.push(d);
    }

    /// The gathered descriptors, and the batch emptied.
    #[inline]
    pub(crate) fn take(&mut self) -> &[RawDesc] {
        self.descs.take()
    }
}

/// The send request (Seg0 + Seg1) of one chunk of `w`.
pub(crate) fn chunk_request(q: &Path, w: &Wqe, c: &Chunk) -> SendRequest {
    let mut flags = SendFlags::SIGNALED; // AckReq on every packet (correction 13)
    if w.solicited() {
        flags |= SendFlags::SOLICITED;
    }
    let op = w.opcode();
    let (_, lkey, len, _, rkey) = w.buffers();
    SendRequest {
        seg0: SendSeg0 {
            op,
            flags,
            dqpn: q.dest_qpn,
            qp_type: QpType::Rc,
            psn: c.psn.get(),
            raddr: c.raddr,
            dqp_ip: q.peer_ip,
            rkey,
            total_len: len,
            msn: w.msn,
        },
        seg1: SendSeg1 {
            laddr: c.laddr,
            len: if op == WorkReqOpcode::Read {
                len
            } else {
                c.len
            },
            lkey,
            sqpn: q.qpn,
            mac: q.peer_mac,
            imm: w.imm(),
            enable_ecn: false,
            is_retry: c.is_retry,
            is_last: c.is_last,
            is_first: c.is_first,
            pmtu: q.pmtu,
        },
    }
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Posts a chain of send work requests. On the first failure, returns its index in
    /// `wrs` (`bad_wr`) and the reason; the requests before it are posted.
    pub fn post_send(
        &mut self,
        qpn: QpHandle,
        wrs: &[SendWr],
        now: Instant,
    ) -> Result<(), (usize, VerbsError)> {
        self.now = now;
        let i = self.qp_index(qpn).map_err(|e| (0, e))?;
        let QpAttrs { state, pd, .. } = self.qp(i).attrs;
        if state != QpState::Rts {
            let e = VerbsError::WrongQpState {
                state,
                op: "post_send",
            };
            return Err((0, e));
        }
        for (k, wr) in wrs.iter().enumerate() {
            let w = self.validate(i, pd, wr).map_err(|e| (k, e))?;
            if self.sq(i).push(w).is_err() {
                return Err((k, VerbsError::SendQueueFull));
            }
        }
        self.transmit(i, now);
        Ok(())
    }

    /// Checks a work request against the QP (in RTS, on PD `pd`) and its MRs and converts
    /// it to a WQE. Its PSN range and MSN are assigned when it is first transmitted (in
    /// posting order): a SEND's packet count depends on the receive buffer it is matched
    /// with.
    fn validate(&mut self, i: QpIndex, pd: u32, wr: &SendWr) -> Result<Wqe, VerbsError> {
        if self.sq(i).is_full_for_app() {
            return Err(VerbsError::SendQueueFull);
        }
        if let SendOp::Atomic(_) = wr.op {
            self.check_atomic(pd, wr)?;
            return Ok(Wqe::request(wr, false));
        }
        let is_send = matches!(
            wr.op,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_)
        );
        if is_send && self.oob.is_none() {
            return Err(VerbsError::Unsupported {
                what: "SEND on a platform without an out-of-band channel",
            });
        }
        // A peer that is known not to invalidate is refused now; one not known yet is
        // asked when the SEND is due (`remote_inv`).
        if let SendOp::SendWithInv(_) = wr.op {
            let peer = self.qp(i).attrs.peer_ip;
            if self.peer_invalidates(peer) == Some(false) {
                return Err(VerbsError::Unsupported {
                    what: "SEND_WITH_INV to a peer whose driver does not take remote invalidations",
                });
            }
        }
        let is_read = wr.op == SendOp::Read;
        if wr.len > 0 {
            // The local buffer: READ writes it, WRITE reads it.
            let need = if is_read {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::empty()
            };
            if !self.mr_covers(wr.lkey, wr.laddr.0, wr.len, need, Some(pd)) {
                return Err(VerbsError::LocalProtection {
                    lkey: wr.lkey.get(),
                });
            }
        }
        // A READ of zero bytes writes nothing locally: no MR is needed (it travels as a
        // zero-length WRITE, see `RequestOp::EmptyRead`).
        if is_read
            && wr.len > 0
            && !self.mr_covers(wr.lkey, wr.laddr.0, wr.len, AccessFlags::REMOTE_WRITE, None)
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
        if !is_send && wr.raddr.0.checked_add(wr.len as u64).is_none() {
            return Err(VerbsError::InvalidArgument {
                what: "remote range wraps the address space",
            });
        }
        // SEND, and WRITE_WITH_IMM when the peer announces its receive WRs, use the peer's
        // next receive WR (oob-channel.md): its address is known only when it is matched.
        let needs_recv = is_send || matches!(wr.op, SendOp::WriteWithImm(_)) && self.oob.is_some();
        Ok(Wqe::request(wr, needs_recv))
    }

    /// Whether QP `i` has work for the card: WQEs not handed over, or a request the send
    /// window stopped in the middle.
    pub(crate) fn has_pending(&mut self, i: QpIndex) -> bool {
        let next = self.qp(i).req.next_psn();
        let sq = self.sq(i);
        sq.sent() < sq.len() || sq.last_sent().is_some_and(|w| w.unsent_packets(next) > 0)
    }

    /// Hands pending WQEs of QP `i` to the card while the send window has room.
    pub(crate) fn transmit(&mut self, i: QpIndex, now: Instant) {
        let mut batch = Batch::new();
        // The attributes cannot change while this runs (a QP that goes to ERR stops it).
        let attrs = self.qp(i).attrs;
        let timeout = attrs.ack_timeout(self.cfg.ack_timeout_min).map(|t| now + t);
        let before = self.send_mark();
        while self.transmit_one(i, &attrs, timeout, now, &mut batch) {}
        if batch.len() > 0 {
            self.flush_send(&mut batch);
        }
        let mark = self.send_mark();
        if mark != before {
            self.qp(i).req.mark_ring(mark);
        }
    }

    /// The next step of `transmit`: one WQE (or the rest of a cut one) into `batch`.
    /// Returns whether to go on.
    fn transmit_one(
        &mut self,
        i: QpIndex,
        attrs: &QpAttrs,
        timeout: Option<Instant>,
        now: Instant,
        batch: &mut Batch,
    ) -> bool {
        // Step 1: the WQE to go on with. The newest request handed over may still have
        // packets the window held back: it goes on first.
        let (k, mut w, next_psn, acked_psn, next_msn) = {
            let s = self.storage.slices();
            let q = &mut s.qps[i.slot()];
            let r = (q.req.next_psn, q.req.acked_psn, q.req.next_msn);
            let sq = SendQueue::new(&mut q.req.sq, s.wqes);
            let cut = sq.last_sent().filter(|w| w.unsent_packets(r.0) > 0);
            let (k, w) = match cut {
                Some(w) => (sq.sent() - 1, *w),
                None => match sq.get(sq.sent()) {
                    Some(w) => (sq.sent(), *w),
                    None => return false,
                },
            };
            (k, w, r.0, r.1, r.2)
        };
        // A responder in RTR answers READ requests (READ responses, the only WQEs an RTR
        // QP can hold); everything else waits for RTS.
        let may_send = match attrs.state {
            QpState::Rts | QpState::Sqd => true,
            QpState::Rtr => w.is_internal(),
            _ => false,
        };
        if !may_send {
            return false;
        }
        // Step 2: atomics keep their order with the rest (`atomic`), and go over the
        // out-of-band channel; a SEND takes the peer's receive WR; PSNs and MSN at first
        // transmission.
        let first = w.state == WqeState::Pending;
        if first && !self.atomics_allow(i, &w) {
            return false;
        }
        if w.is_atomic() {
            return self.send_atomic_wqe(i, k, w, timeout);
        }
        if first && w.is_read() && !self.reads_allow(i, attrs) {
            // Waits (and the WQEs after it, in order) for a response to come in.
            return false;
        }
        if first && !self.invalidate_ready(i, k, &w, next_psn) {
            return false;
        }
        if first && w.needs_recv() && !self.match_remote_recv(i, &mut w, now) {
            return false;
        }
        if first {
            w.assign(next_psn, next_msn, attrs.pmtu);
        }
        // Step 3: the window and the ring.
        let Some((sent, need)) = self.window_room(&w, next_psn, acked_psn) else {
            self.put_wqe(i, k, w);
            return false;
        };
        if !batch.fits(need) && batch.len() > 0 {
            self.flush_send(batch);
        }
        if (self.send.free_slots() as usize) < batch.len() + need {
            let _ = self.send.refresh_tail(&self.regs);
            if (self.send.free_slots() as usize) < batch.len() + need {
                self.put_wqe(i, k, w);
                return false;
            }
        }
        // Step 4: chunks into descriptors. Packets of `w` already handed over (a request the
        // window cut short), and the ones that go now.
        let Ok(frag) = Fragmenter::new(w.span(), attrs.pmtu, CHUNK_BYTES) else {
            self.put_wqe(i, k, w);
            return false;
        };
        let from = w.psn.forward_distance(next_psn).min(w.npsn);
        let to = from + sent;
        let (path, whole) = (Path::of(attrs), w.is_whole());
        for c in frag.filter_map(|c| packets_of(&c, attrs.pmtu, w.psn.get(), (from, to), whole)) {
            self.append_chunk(&path, &w, &c, batch, false);
            self.stats.chunks += 1;
        }
        // Step 5: publish the WQE's progress (the doorbell rings per batch, in `transmit`).
        w.state = WqeState::Sent;
        let s = self.storage.slices();
        let q = &mut s.qps[i.slot()];
        q.req.next_psn = w.psn.wrapping_add(to);
        if first {
            q.req.next_msn = w.msn.wrapping_add(1);
        }
        let mut sq = SendQueue::new(&mut q.req.sq, s.wqes);
        if let Some(slot) = sq.get_mut(k) {
            *slot = w;
        }
        if first {
            sq.mark_sent();
        }
        s.timers[i.slot()].start(Timer::Retransmit, timeout);
        // The window may be full in the middle of this request: the rest goes out as ACKs
        // open it.
        to >= w.npsn
    }

    /// Whether QP `i` may send one more READ: fewer than its `max_rd_atomic` wait for their
    /// response data. The peer answers at most that many at once (its
    /// `max_dest_rd_atomic`, [`READ_RESPONSE_ROOM`]); beyond, its answers dropped or
    /// queued past the requester's message queue, and ib_read_bw's 128 outstanding READs
    /// ended in RETRY_EXC_ERR under load.
    ///
    /// Nor may more READs be sent and not yet acknowledged than the peer's responder
    /// remembers answers for ([`READS_TRACKED`]): it forgets an answer only once its
    /// acknowledgement is due, and a request past a full memory is dropped for the timer
    /// to resend. READs whose response came but whose ACK waits behind a request that
    /// arrived late (frames overtaking each other when a link moves from UDP to shared
    /// memory) let ib_read_bw run 48 requests ahead, and one timeout (67 ms) fired with
    /// nothing lost in about 1 run of 12.
    fn reads_allow(&mut self, i: QpIndex, attrs: &QpAttrs) -> bool {
        let limit = match attrs.max_rd_atomic {
            0 => READ_RESPONSE_ROOM,
            n => u32::from(n),
        } as usize;
        let (mut waiting, mut unacked) = (0, 0);
        for w in self.sq(i).sent_wqes().filter(|w| w.is_read()) {
            waiting += usize::from(w.read_pending());
            unacked += usize::from(w.state == WqeState::Sent);
            if waiting >= limit || unacked >= READS_TRACKED {
                return false;
            }
        }
        true
    }

    /// Writes back the k-th WQE of QP `i`'s send queue.
    pub(super) fn put_wqe(&mut self, i: QpIndex, k: u32, w: Wqe) {
        if let Some(slot) = self.sq(i).get_mut(k) {
            *slot = w;
        }
    }

    /// Matches a pending SEND (or WRITE_WITH_IMM) with the peer's next announced receive WR
    /// (oob-channel.md), or leaves it waiting under the RNR rules. False: not now.
    fn match_remote_recv(&mut self, i: QpIndex, w: &mut Wqe, now: Instant) -> bool {
        let Some(r) = self.next_remote(i) else {
            if self.qp(i).rq.peer_lost() {
                // No receive WR can be announced any more: the QP fails when the grace
                // after the loss runs out (`on_peer_lost`), not now, so that the work sent
                // before this SEND is still acknowledged and its completions come first.
                let grace = self.peer_lost_grace(i);
                self.timers(i).start(Timer::PeerLost, Some(now + grace));
                return false;
            }
            let wait = Nanos::ib_rnr_timer(self.qp(i).attrs.min_rnr_timer);
            self.timers(i).start(Timer::Rnr, Some(now + wait));
            return false;
        };
        if w.is_send() && w.len() > r.length {
            // Too long for the receive buffer: only once it is the oldest request, so the
            // error completes the right WR and the receiver, told, has completed the SENDs
            // before it.
            if self.sq(i).sent() == 0 {
                self.send_too_long(i, &r, w.len());
            }
            return false;
        }
        let rnr_retry = self.qp(i).attrs.rnr_retry;
        self.pop_remote(i);
        self.qp(i).rq.refill_rnr(rnr_retry);
        self.timers(i).set(Timer::Rnr, None);
        w.match_recv(VirtAddr(r.addr), crate::keys::MrKey::from_raw(r.lkey));
        true
    }

    /// How many more packets of `w` the send window lets go now (none: `None`), and the
    /// send-ring slots they may take. The window is capped below the card's 128-PSN receive
    /// window ([`SEND_WINDOW_CAP`]) even within one request, so a go-back-N resend from the
    /// oldest unacknowledged PSN always lands inside the peer card's window, never in its
    /// stale zone.
    fn window_room(&self, w: &Wqe, next_psn: Psn, acked_psn: Psn) -> Option<(u32, usize)> {
        let window = self.cfg.send_window.clamp(1, SEND_WINDOW_CAP);
        let outstanding = acked_psn.forward_distance(next_psn);
        let left = w.unsent_packets(next_psn);
        let room = window.saturating_sub(outstanding);
        if room == 0 || left == 0 {
            return None;
        }
        let count = if w.is_whole() { left } else { left.min(room) };
        Some((count, 2 * w.chunk_count()))
    }

    /// Rings the doorbell for `batch`.
    pub(crate) fn flush_send(&mut self, batch: &mut Batch) {
        let descs = batch.take();
        let n = descs.len();
        if self.send.push_batch(&self.regs, descs).is_err() {
            self.stats.send_refused += 1;
            // The caller checked the free slots; a refusal here means the card reported an
            // impossible tail. The WQEs stay Sent and the retransmission timer resends them.
            core_error!("send ring refused a batch of {} descriptors", n);
            return;
        }
        self.note_send_posted(n);
    }

    /// Adds one chunk's two descriptors to `batch`, flushing it to the send ring first when
    /// full; a retransmission (`retry`) waits for ring space.
    pub(crate) fn append_chunk(
        &mut self,
        q: &Path,
        w: &Wqe,
        c: &Chunk,
        batch: &mut Batch,
        retry: bool,
    ) {
        if !batch.fits(2) {
            if retry {
                self.flush_send_waiting(batch);
            } else {
                self.flush_send(batch);
            }
        }
        batch.push_pair(&chunk_request(q, w, c));
    }

    /// Rings the doorbell for a retransmission, waiting for ring space rather than
    /// dropping: the ring drains as fast as the card fetches.
    pub(crate) fn flush_send_waiting(&mut self, batch: &mut Batch) {
        let descs = batch.take();
        let n = descs.len();
        let mut tries = 0u32;
        while self.send.push_batch(&self.regs, descs).is_err() {
            tries += 1;
            if tries > 1_000_000 {
                core_error!("send ring stuck; retransmission dropped");
                return;
            }
            core::hint::spin_loop();
        }
        self.note_send_posted(n);
    }
}

/// The part of chunk `c` of the request starting at PSN `first` whose packets fall in
/// `[from, to)` (packet indices of the request), cut at packet boundaries; `None` if no
/// packet of it does. A READ or zero-length request (`whole`) goes as one chunk.
pub(crate) fn packets_of(
    c: &Chunk,
    pmtu: Pmtu,
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
