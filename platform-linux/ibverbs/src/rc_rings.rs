//! The per-QP buffers of the RC send path (`rc_post.rs`): a ring of fixed inline slots
//! and a gather ring for one message from several SGEs, both registered on first use, and
//! the count of engine requests posted that their reuse is measured against.
//!
//! Buffers in both rings are reused only after the engine says the request that used them
//! left the send queue (`Qp::sq_retired`); the inline ring reuses a slot only after as many
//! inline posts as the QP's send queue holds and one batch more, so the request that used
//! it has left the queue.

use core::ffi::c_int;
use std::collections::VecDeque;

use bluerdma_core::desc::AccessFlags;
use bluerdma_core::engine::SendWr;
use bluerdma_linux::verbs::Qp as VQp;

use crate::caps::MAX_INLINE;
use crate::errors::fail;
use crate::parent_domain::{ring, RingMem};
use crate::pd::Pd;

/// Engine requests the post path hands the engine per call (one doorbell per batch).
pub(crate) const BATCH: usize = 32;

/// Bytes of a QP's gather ring (registered on first use).
const GATHER_BYTES: usize = 4 << 20;

/// Per-QP state of the send path (behind the QP's post lock).
pub(crate) struct PostState {
    inline: Option<RingMem>,
    /// Slots of the inline ring.
    inline_slots: u64,
    /// Inline requests posted (slot = count mod slots).
    pub(crate) inline_next: u64,
    gather: Option<RingMem>,
    /// Next free byte of the gather ring.
    gather_head: usize,
    /// Gather regions in use: (engine post number, offset, length), oldest first.
    gather_live: VecDeque<(u64, usize, usize)>,
    /// Engine requests posted on this QP (what `sq_retired` counts against).
    pub(crate) posted: u64,
    /// Scratch of the RC post_send, kept so that a post allocates nothing: the engine
    /// requests of one batch, and for each the application request it came from (its
    /// address) and the inline slots used before it.
    pub(crate) wrs: Vec<SendWr>,
    pub(crate) owner: Vec<(usize, u64)>,
}

impl PostState {
    /// The state of a QP whose send queue holds `sq_depth` engine requests.
    pub(crate) fn new(sq_depth: u32) -> Self {
        PostState {
            inline: None,
            inline_slots: sq_depth as u64 + 2 * BATCH as u64,
            inline_next: 0,
            gather: None,
            gather_head: 0,
            gather_live: VecDeque::new(),
            posted: 0,
            wrs: Vec::new(),
            owner: Vec::new(),
        }
    }

    /// A QP moved to RESET: the engine's counts start again.
    pub(crate) fn reset(&mut self) {
        self.inline_next = 0;
        self.gather_head = 0;
        self.gather_live.clear();
        self.posted = 0;
    }

    /// The inline slot for the `used`-th inline request of the batch being built: its
    /// address, key and bytes.
    pub(crate) fn inline_slot(
        &mut self,
        pd: &Pd,
        used: u64,
    ) -> Result<(u64, u32, &mut [u8]), c_int> {
        let slots = self.inline_slots;
        if self.inline.is_none() {
            let len = (slots * MAX_INLINE as u64) as usize;
            self.inline = Some(ring(pd, len, AccessFlags::LOCAL_WRITE)?);
        }
        let mr = self.inline.as_mut().ok_or(libc::ENOMEM)?;
        let (base, key) = (mr.addr(), mr.key());
        let at = (((self.inline_next + used) % slots) * MAX_INLINE as u64) as usize;
        let buf = mr.bytes_mut().ok_or(libc::ENOMEM)?;
        Ok((
            base + at as u64,
            key,
            &mut buf[at..at + MAX_INLINE as usize],
        ))
    }

    /// `len` contiguous bytes of the gather ring of `qp` for engine post number `seq`.
    pub(crate) fn gather_region(
        &mut self,
        qp: &VQp,
        pd: &Pd,
        seq: u64,
        len: usize,
    ) -> Result<(u64, u32, &mut [u8]), c_int> {
        if len > GATHER_BYTES {
            log::error!("post_send: {len} bytes in several SGEs (at most {GATHER_BYTES} gathered)");
            return Err(libc::EINVAL);
        }
        if self.gather.is_none() {
            self.gather = Some(ring(pd, GATHER_BYTES, AccessFlags::LOCAL_WRITE)?);
        }
        // Free what the card is done with.
        if !self.gather_live.is_empty() {
            let retired = qp.sq_retired().map_err(fail)?;
            while self.gather_live.front().is_some_and(|r| r.0 < retired) {
                self.gather_live.pop_front();
            }
        }
        let at = match self.gather_live.front() {
            None => 0,
            Some(&(_, oldest, _)) if self.gather_head >= oldest => {
                if self.gather_head + len <= GATHER_BYTES {
                    self.gather_head
                } else if len <= oldest {
                    0
                } else {
                    return Err(libc::ENOMEM);
                }
            }
            Some(&(_, oldest, _)) if self.gather_head + len <= oldest => self.gather_head,
            Some(_) => return Err(libc::ENOMEM),
        };
        self.gather_head = at + len;
        self.gather_live.push_back((seq, at, len));
        let mr = self.gather.as_mut().ok_or(libc::ENOMEM)?;
        let (base, key) = (mr.addr(), mr.key());
        let buf = mr.bytes_mut().ok_or(libc::ENOMEM)?;
        Ok((base + at as u64, key, &mut buf[at..at + len]))
    }

    /// Forgets gather regions of engine posts numbered `from` and later (not posted).
    pub(crate) fn unstage(&mut self, from: u64) {
        while self.gather_live.back().is_some_and(|r| r.0 >= from) {
            self.gather_live.pop_back();
        }
        self.gather_head = self.gather_live.back().map_or(0, |r| r.1 + r.2);
    }
}
