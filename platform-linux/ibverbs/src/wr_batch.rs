//! The extended part of a QP (`ibv_qp_ex` after its `ibv_qp`) and the batch of send work
//! requests an application builds with the `ibv_wr_*` API between `ibv_wr_start` and
//! `ibv_wr_complete`.
//!
//! Each `ibv_wr_<op>` starts a request (its `wr_id` and `wr_flags` are read from the
//! `ibv_qp_ex` fields the application set just before); `ibv_wr_set_*` fill in its buffers
//! or UD address. SGE lists and inline data are copied when set (the application may reuse
//! its arrays and inline buffers as soon as the call returns, as with rdma-core's
//! providers). `ibv_wr_complete` turns the batch into an `ibv_send_wr` chain, which takes the
//! same post path as ibv_post_send (`qp_ex.rs` hands it over); `ibv_wr_abort` drops it.
//!
//! The `ibv_wr_*` calls return nothing, so a mistake while building (an operation this QP
//! cannot do, a buffer before any request, too many SGEs or requests) is logged and kept:
//! `ibv_wr_complete` then posts nothing and returns its errno, as rdma-core's providers roll
//! the whole batch back.

use core::ffi::c_int;
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::{Mutex, MutexGuard};

use crate::abi::*;
use crate::abi_ex::{qpx, IbvDataBuf, IbvQpExTail};

/// Empty buffers an `ibv_wr_set_inline_data_list` may name beyond one per inline byte.
const MAX_EMPTY_BUFS: usize = 64;

/// What [`QpExt::new`] needs to make a QP extended: the send operations it was created
/// for and its `wr_*` function table (see [`qpx`]).
pub(crate) struct ExtOps {
    pub send_ops: u64,
    pub table: [usize; qpx::COUNT],
}

/// The second field of every QP (`rc_qp::Qp`, `ud_qp::UdQp`), right after its `ibv_qp`.
#[repr(C)]
pub(crate) struct QpExt {
    /// The rest of `ibv_qp_ex`: function pointers only when the QP is extended.
    pub tail: IbvQpExTail,
    /// The send operations the QP was created with (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS); None
    /// for a QP made without them, which has no `ibv_qp_ex` (ibv_qp_to_qp_ex gives NULL).
    pub send_ops: Option<u64>,
    batch: Mutex<Batch>,
}

impl QpExt {
    /// The extended part of a new QP with capabilities `cap`; extended when `ops` is given.
    pub(crate) fn new(cap: &IbvQpCap, ops: Option<ExtOps>) -> QpExt {
        QpExt {
            tail: IbvQpExTail {
                comp_mask: 0,
                wr_id: UnsafeCell::new(0),
                wr_flags: UnsafeCell::new(0),
                _pad: 0,
                ops: ops.as_ref().map_or([0; qpx::COUNT], |o| o.table),
            },
            send_ops: ops.map(|o| o.send_ops),
            batch: Mutex::new(Batch::new(cap)),
        }
    }

    /// The extended part of the QP at `qp`.
    ///
    /// # Safety
    /// `qp` is a live QP of this library (its `QpExt` sits right after the `ibv_qp`).
    pub(crate) unsafe fn of<'a>(qp: *mut IbvQp) -> &'a QpExt {
        // SAFETY: the caller's contract; rc_qp and ud_qp check the offset at compile time.
        unsafe { &*((qp as *const u8).add(size_of::<IbvQp>()) as *const QpExt) }
    }

    /// The batch, locked for one `ibv_wr_*` call.
    pub(crate) fn batch(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `wr_id` and `wr_flags` the application set for the next request.
    pub(crate) fn next_ids(&self) -> (u64, u32) {
        // SAFETY: plain words of the application's ibv_qp_ex; it writes them before calling
        // ibv_wr_<op> on this thread, and nothing else writes them.
        unsafe {
            (
                ptr::read(self.tail.wr_id.get()),
                ptr::read(self.tail.wr_flags.get()),
            )
        }
    }
}

use core::mem::size_of;

/// Where one request's buffers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payload {
    None,
    /// `count` entries of [`Batch::sges`] from `first`.
    Sges {
        first: usize,
        count: usize,
    },
    /// `len` bytes of [`Batch::inline`] from `at`.
    Inline {
        at: usize,
        len: usize,
    },
}

/// The requests built since `ibv_wr_start`.
pub(crate) struct Batch {
    open: bool,
    wrs: Vec<IbvSendWr>,
    payloads: Vec<Payload>,
    sges: Vec<IbvSge>,
    inline: Vec<u8>,
    /// The first mistake since `ibv_wr_start` (its errno).
    error: Option<c_int>,
    max_wrs: usize,
    max_sge: usize,
    max_inline: usize,
}

impl Batch {
    fn new(cap: &IbvQpCap) -> Batch {
        Batch {
            open: false,
            wrs: Vec::new(),
            payloads: Vec::new(),
            sges: Vec::new(),
            inline: Vec::new(),
            error: None,
            max_wrs: cap.max_send_wr.max(1) as usize,
            max_sge: cap.max_send_sge.max(1) as usize,
            max_inline: cap.max_inline_data as usize,
        }
    }

    /// `ibv_wr_start`: a new, empty batch (one left open is dropped).
    pub(crate) fn start(&mut self) {
        if self.open && !self.wrs.is_empty() {
            log::warn!(
                "ibv_wr_start: {} work requests of the previous batch were never completed \
                 or aborted; dropped",
                self.wrs.len()
            );
        }
        self.clear();
        self.open = true;
    }

    fn clear(&mut self) {
        self.open = false;
        self.wrs.clear();
        self.payloads.clear();
        self.sges.clear();
        self.inline.clear();
        self.error = None;
    }

    /// Records a mistake (the first one is what `ibv_wr_complete` returns) and logs it
    /// (later ones, often its consequences, at debug level).
    pub(crate) fn refuse(&mut self, errno: c_int, what: std::fmt::Arguments<'_>) {
        if self.error.is_none() {
            log::error!("{what}");
            self.error = Some(errno);
        } else {
            log::debug!("{what}");
        }
    }

    /// Begins a request of `opcode`: `wr` carries its remote address, key or immediate.
    pub(crate) fn push(&mut self, verb: &str, mut wr: IbvSendWr) {
        if !self.open {
            return self.refuse(
                libc::EINVAL,
                format_args!("{verb}: called outside ibv_wr_start .. ibv_wr_complete"),
            );
        }
        let max = self.max_wrs;
        if self.wrs.len() >= max {
            return self.refuse(
                libc::ENOMEM,
                format_args!(
                    "{verb}: more than {max} work requests in one batch (the QP's max_send_wr)"
                ),
            );
        }
        // Inline is what ibv_wr_set_inline_data says, not a flag.
        wr.send_flags &= !IBV_SEND_INLINE;
        self.wrs.push(wr);
        self.payloads.push(Payload::None);
    }

    /// The request being built, or a refusal naming `verb`.
    fn current(&mut self, verb: &str) -> Option<usize> {
        if self.open && !self.wrs.is_empty() {
            return Some(self.wrs.len() - 1);
        }
        self.refuse(
            libc::EINVAL,
            format_args!("{verb}: no work request to set (call ibv_wr_<op> first)"),
        );
        None
    }

    /// `ibv_wr_set_sge` and `ibv_wr_set_sge_list`: the request's `n` SGEs at `list`, copied.
    ///
    /// # Safety
    /// `list` is NULL or points at `n` readable entries.
    pub(crate) unsafe fn set_sges(&mut self, verb: &str, list: *const IbvSge, n: usize) {
        let Some(k) = self.current(verb) else { return };
        let max = self.max_sge;
        if n > max || (n > 0 && list.is_null()) {
            return self.refuse(
                libc::EINVAL,
                format_args!("{verb}: {n} SGEs at {list:p} (the QP takes {max})"),
            );
        }
        let first = self.sges.len();
        // SAFETY: the caller's contract (non-null when n > 0, checked above).
        self.sges
            .extend_from_slice(unsafe { crate::sge::list(list, n) });
        self.payloads[k] = Payload::Sges { first, count: n };
    }

    /// `ibv_wr_set_inline_data` and `_list`: the request's bytes, copied now.
    ///
    /// # Safety
    /// `bufs` is NULL or points at `n` readable entries, each naming `length` readable
    /// bytes.
    pub(crate) unsafe fn set_inline(&mut self, verb: &str, bufs: *const IbvDataBuf, n: usize) {
        let Some(k) = self.current(verb) else { return };
        // Each buffer but empty ones adds a byte at least.
        if n > self.max_inline + MAX_EMPTY_BUFS || (n > 0 && bufs.is_null()) {
            return self.refuse(
                libc::EINVAL,
                format_args!("{verb}: {n} buffers at {bufs:p}"),
            );
        }
        // SAFETY: the caller's contract (non-null when n > 0, checked above).
        let bufs = unsafe { crate::sge::list(bufs, n) };
        let len = bufs.iter().map(|b| b.length).fold(0, usize::saturating_add);
        let max = self.max_inline;
        if len > max || bufs.iter().any(|b| b.addr.is_null() && b.length > 0) {
            return self.refuse(
                libc::EINVAL,
                format_args!(
                    "{verb}: {len} bytes of inline data (the QP takes {max}), or a NULL buffer"
                ),
            );
        }
        let at = self.inline.len();
        for b in bufs.iter().filter(|b| b.length > 0) {
            // SAFETY: the caller's contract (non-null, checked above).
            self.inline.extend_from_slice(unsafe {
                std::slice::from_raw_parts(b.addr as *const u8, b.length)
            });
        }
        self.wrs[k].send_flags |= IBV_SEND_INLINE;
        self.payloads[k] = Payload::Inline { at, len };
    }

    /// `ibv_wr_set_ud_addr`: `wr.ud` of the request (ah, remote QPN, Q_Key).
    pub(crate) fn set_ud_addr(&mut self, ah: *mut IbvAh, qpn: u32, qkey: u32) {
        let Some(k) = self.current("ibv_wr_set_ud_addr") else {
            return;
        };
        self.wrs[k].wr[0] = ah as u64;
        self.wrs[k].wr[1] = qpn as u64 | (qkey as u64) << 32;
    }

    /// `ibv_wr_complete`: posts the batch with `post` (an ibv_post_send over the chain it
    /// is given) unless a mistake was made while building it; 0 or the errno.
    pub(crate) fn complete(
        &mut self,
        post: impl FnOnce(*mut IbvSendWr, *mut *mut IbvSendWr) -> c_int,
    ) -> c_int {
        if !self.open {
            log::error!("ibv_wr_complete: no ibv_wr_start before it");
            return libc::EINVAL;
        }
        if let Some(e) = self.error {
            log::error!(
                "ibv_wr_complete: the batch of {} work requests is not posted (a call while \
                 building it failed; see above)",
                self.wrs.len()
            );
            self.clear();
            return e;
        }
        if self.wrs.is_empty() {
            self.clear();
            return 0;
        }
        let rc = self.link(post);
        self.clear();
        rc
    }

    /// Points each request at its buffers and at the next request, then posts the chain.
    fn link(&mut self, post: impl FnOnce(*mut IbvSendWr, *mut *mut IbvSendWr) -> c_int) -> c_int {
        // Inline bytes become one SGE each, after the application's SGEs (the vectors do
        // not grow once pointers into them are taken).
        let base = self.inline.as_ptr() as u64;
        for p in self.payloads.iter_mut() {
            if let Payload::Inline { at, len } = *p {
                let first = self.sges.len();
                self.sges.push(IbvSge {
                    addr: base + at as u64,
                    length: len as u32,
                    lkey: 0,
                });
                *p = Payload::Sges { first, count: 1 };
            }
        }
        let sges = self.sges.as_mut_ptr();
        let n = self.wrs.len();
        let wrs = self.wrs.as_mut_ptr();
        for (k, p) in self.payloads.iter().enumerate() {
            let (list, count) = match *p {
                // SAFETY: `first + count <= sges.len()` (set_sges and the loop above).
                Payload::Sges { first, count } => (unsafe { sges.add(first) }, count),
                _ => (ptr::null_mut(), 0),
            };
            // SAFETY: `k < n`; `k + 1 <= n` is one past the end only for the last, which
            // is not dereferenced.
            unsafe {
                let w = &mut *wrs.add(k);
                w.sg_list = list;
                w.num_sge = count as c_int;
                w.next = if k + 1 < n {
                    wrs.add(k + 1)
                } else {
                    ptr::null_mut()
                };
            }
        }
        let mut bad: *mut IbvSendWr = ptr::null_mut();
        let rc = post(wrs, &mut bad);
        if rc != 0 && !bad.is_null() {
            let at = (bad as usize - wrs as usize) / size_of::<IbvSendWr>();
            log::error!(
                "ibv_wr_complete: work request {at} of {n} (wr_id {:#x}) and those after it \
                 were not posted",
                self.wrs.get(at).map_or(0, |w| w.wr_id)
            );
        }
        rc
    }

    /// `ibv_wr_abort`: the batch is dropped.
    pub(crate) fn abort(&mut self) {
        self.clear();
    }
}

/// An `ibv_send_wr` of `opcode` with the application's `wr_id` and `flags`.
pub(crate) fn send_wr(opcode: u32, wr_id: u64, flags: u32) -> IbvSendWr {
    IbvSendWr {
        wr_id,
        next: ptr::null_mut(),
        sg_list: ptr::null_mut(),
        num_sge: 0,
        opcode,
        send_flags: flags,
        imm_data: 0,
        wr: [0; 4],
        qp_type: [0; 2],
        _tail: [0; 6],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> IbvQpCap {
        IbvQpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 8,
        }
    }

    /// What a post saw: (opcode, flags, sges as (addr, len), inline bytes).
    type Seen = Vec<(u32, u32, Vec<(u64, u32)>, Vec<u8>)>;

    fn complete(b: &mut Batch) -> (c_int, Seen) {
        let mut seen = Vec::new();
        let rc = b.complete(|mut wr, _| {
            while !wr.is_null() {
                // SAFETY: the chain link() built.
                let w = unsafe { &*wr };
                // SAFETY: as above.
                let sges = unsafe { crate::sge::list(w.sg_list, w.num_sge as usize) };
                let bytes = if w.send_flags & IBV_SEND_INLINE != 0 {
                    // SAFETY: the inline SGE points into the batch's bytes.
                    unsafe {
                        std::slice::from_raw_parts(
                            sges[0].addr as *const u8,
                            sges[0].length as usize,
                        )
                    }
                    .to_vec()
                } else {
                    Vec::new()
                };
                seen.push((
                    w.opcode,
                    w.send_flags,
                    sges.iter().map(|s| (s.addr, s.length)).collect(),
                    bytes,
                ));
                wr = w.next;
            }
            0
        });
        (rc, seen)
    }

    #[test]
    fn a_batch_becomes_a_chain_with_its_buffers() {
        let mut b = Batch::new(&cap());
        b.start();
        b.push(
            "w",
            send_wr(IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE),
        );
        let sge = |addr, length| IbvSge {
            addr,
            length,
            lkey: 7,
        };
        let list = [sge(0x1000, 10), sge(0x2000, 20)];
        // SAFETY: two entries.
        unsafe { b.set_sges("s", list.as_ptr(), 2) };
        b.push("s", send_wr(IBV_WR_SEND, 2, 0));
        let mut data = *b"abcdefgh";
        let p = data.as_mut_ptr() as *mut core::ffi::c_void;
        // SAFETY: both buffers are readable.
        let bufs = unsafe {
            [
                IbvDataBuf { addr: p, length: 3 },
                IbvDataBuf {
                    addr: p.add(5),
                    length: 3,
                },
            ]
        };
        // SAFETY: two entries naming readable bytes.
        unsafe { b.set_inline("i", bufs.as_ptr(), 2) };
        data.fill(0); // copied when set
        let (rc, seen) = complete(&mut b);
        assert_eq!(rc, 0);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, IBV_WR_RDMA_WRITE);
        assert_eq!(
            seen[0].1, IBV_SEND_SIGNALED,
            "INLINE comes from set_inline_data only"
        );
        assert_eq!(seen[0].2, [(0x1000, 10), (0x2000, 20)]);
        assert_eq!(seen[1].3, b"abcfgh");
    }

    #[test]
    fn a_mistake_while_building_posts_nothing_and_is_returned() {
        let mut b = Batch::new(&cap());
        b.start();
        b.push("s", send_wr(IBV_WR_SEND, 1, 0));
        let s = [IbvSge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; 3];
        // SAFETY: three entries.
        unsafe { b.set_sges("s", s.as_ptr(), 3) };
        let mut posted = false;
        assert_eq!(
            b.complete(|_, _| {
                posted = true;
                0
            }),
            libc::EINVAL
        );
        assert!(!posted);
        // A buffer before any request, too much inline data, too many requests.
        b.start();
        // SAFETY: one entry.
        unsafe { b.set_sges("s", s.as_ptr(), 1) };
        assert_eq!(complete(&mut b).0, libc::EINVAL);
        b.start();
        b.push("s", send_wr(IBV_WR_SEND, 1, 0));
        let big = [IbvDataBuf {
            addr: ptr::null_mut(),
            length: 9,
        }];
        // SAFETY: one entry; its bytes are not read (the length is refused first).
        unsafe { b.set_inline("i", big.as_ptr(), 1) };
        assert_eq!(complete(&mut b).0, libc::EINVAL);
        b.start();
        for k in 0..5 {
            b.push("s", send_wr(IBV_WR_SEND, k, 0));
        }
        assert_eq!(complete(&mut b).0, libc::ENOMEM);
        // Outside start .. complete.
        b.push("s", send_wr(IBV_WR_SEND, 1, 0));
        assert_eq!(complete(&mut b).0, libc::EINVAL);
        // Aborted: nothing left for the next batch.
        b.start();
        b.push("s", send_wr(IBV_WR_SEND, 1, 0));
        b.abort();
        b.start();
        let (rc, seen) = complete(&mut b);
        assert_eq!((rc, seen.len()), (0, 0));
    }
}
