//! The receive side of UD QPs: the card has no UD, so the progress thread hands every
//! frame the card's classifier put on the simple-NIC RX ring to the device engine's
//! [`Dispatch`], which checks it (ICRC, destination QP, Q_Key), puts a datagram of several
//! frames back together (`ud_reassembly.rs`) and fills the QP's next receive buffer: the
//! 40-byte GRH area first (the IPv4 header in its last 20 bytes), then the payload. A datagram that finds no QP, a wrong Q_Key or no receive buffer is dropped
//! and counted, as UD allows. Completions go to the same CQs as RC ones (`Cq::push`), so
//! polls and completion channels see both.

use std::collections::{HashMap, VecDeque};
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bluerdma_core::engine::{WcOpcode, WcStatus, WorkCompletion, WC_WITH_IMM};
use bluerdma_core::qp::QpState;
use bluerdma_core::wire::ud::{UdFrame, IPV4_RANGE};
use bluerdma_linux::verbs::{Context, Cq as VCq};

use crate::abi::*;
use crate::caps::UD_MAX_SGE;
use crate::ud_reassembly::{Assembled, Reassembly};

/// Counters of datagrams this process dropped, per device.
#[derive(Default)]
struct Drops {
    /// Not a UD frame of ours, or a bad ICRC.
    malformed: AtomicU64,
    /// No UD QP with the destination QPN, or the QP is not ready to receive.
    no_qp: AtomicU64,
    /// The Q_Key did not match the QP's.
    qkey: AtomicU64,
    /// The QP had no receive buffer.
    no_buffer: AtomicU64,
    /// Frames of datagrams of several that never completed (one lost on the way, or the
    /// datagram past the MTU).
    broken: AtomicU64,
}

/// The UD QPs of one device engine, by QPN; the engine's raw-frame handler.
pub(crate) struct Dispatch {
    qps: Mutex<HashMap<u32, Weak<UdShared>>>,
    drops: Drops,
}

/// One dispatcher per engine, made with the first UD QP on it.
static DISPATCH: Mutex<Vec<(Weak<Context>, Arc<Dispatch>)>> = Mutex::new(Vec::new());

pub(crate) fn dispatch_for(engine: &Arc<Context>) -> Arc<Dispatch> {
    let mut all = DISPATCH.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(w, _)| w.strong_count() > 0);
    if let Some((_, d)) = all
        .iter()
        .find(|(w, _)| ptr::eq(w.as_ptr(), Arc::as_ptr(engine)))
    {
        return Arc::clone(d);
    }
    let d = Arc::new(Dispatch {
        qps: Mutex::new(HashMap::new()),
        drops: Drops::default(),
    });
    let handler = Arc::clone(&d);
    // The handler holds the dispatcher, which holds its QPs weakly: no cycle through the
    // engine (a QP holds its CQs, which hold the engine).
    engine.set_raw_handler(Some(Box::new(move |f: &[u8]| handler.on_frame(f))));
    all.push((Arc::downgrade(engine), Arc::clone(&d)));
    d
}

impl Dispatch {
    fn on_frame(&self, frame: &[u8]) {
        let bump = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        let (f, payload) = match UdFrame::parse(frame) {
            Ok(p) => p,
            Err(e) => {
                log::debug!("UD: frame of {} bytes dropped: {e}", frame.len());
                return bump(&self.drops.malformed);
            }
        };
        let qp = {
            let qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
            qps.get(&f.dst_qpn).and_then(Weak::upgrade)
        };
        let Some(qp) = qp else {
            return bump(&self.drops.no_qp);
        };
        let (Some(ip), Some(data)) = (frame.get(IPV4_RANGE), frame.get(payload)) else {
            return bump(&self.drops.malformed);
        };
        let (whole, imm) = {
            let mut frags = qp.frags.lock().unwrap_or_else(|e| e.into_inner());
            let got = frags.add(&f, data);
            self.drops
                .broken
                .fetch_add(frags.take_broken(), Ordering::Relaxed);
            match got {
                Assembled::Whole => (None, f.imm),
                Assembled::Complete { data, imm } => (Some(data), imm),
                Assembled::Incomplete => return,
            }
        };
        // The completion's immediate data rides on the LAST frame, which need not be the
        // one that completed the datagram.
        let f = UdFrame { imm, ..f };
        match qp.deliver(&f, ip, whole.as_deref().unwrap_or(data)) {
            Delivery::Done => {}
            Delivery::NotReady => bump(&self.drops.no_qp),
            Delivery::BadQkey => bump(&self.drops.qkey),
            Delivery::NoBuffer => bump(&self.drops.no_buffer),
        }
    }

    /// Routes datagrams for `shared`'s QP number to it (while it lives).
    pub(crate) fn add(&self, shared: &Arc<UdShared>) {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(shared.qpn, Arc::downgrade(shared));
    }

    /// Stops routing datagrams to `qpn`.
    pub(crate) fn remove(&self, qpn: u32) {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn);
    }
}

/// Datagrams dropped on receive, for the close log: malformed, no QP, Q_Key, no buffer,
/// missing a frame.
pub(crate) fn drops(engine: &Arc<Context>) -> Option<[u64; 5]> {
    let all = DISPATCH.lock().unwrap_or_else(|e| e.into_inner());
    let (_, d) = all
        .iter()
        .find(|(w, _)| ptr::eq(w.as_ptr(), Arc::as_ptr(engine)))?;
    let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
    Some([
        r(&d.drops.malformed),
        r(&d.drops.no_qp),
        r(&d.drops.qkey),
        r(&d.drops.no_buffer),
        r(&d.drops.broken),
    ])
}

/// A posted receive WR.
pub(crate) struct Posted {
    pub wr_id: u64,
    pub sges: [IbvSge; UD_MAX_SGE as usize],
    pub n: usize,
}

/// What the receive side of a UD QP shares with the dispatcher (and its send side reads:
/// the state and the Q_Key).
pub(crate) struct UdShared {
    pub qpn: u32,
    /// The QP's state (ibv_qp_state).
    pub state: AtomicU32,
    pub qkey: AtomicU32,
    /// Posted receive WRs, oldest first.
    pub recv: Mutex<VecDeque<Posted>>,
    /// Datagrams of several frames in progress.
    pub frags: Mutex<Reassembly>,
    pub rcq: VCq,
}

enum Delivery {
    Done,
    NotReady,
    BadQkey,
    NoBuffer,
}

impl UdShared {
    pub(crate) fn state(&self) -> QpState {
        QpState::from_ibv(self.state.load(Ordering::Acquire))
    }

    /// Puts one datagram in the next receive buffer: the GRH area (zeros, then the IPv4
    /// header `ip`), then `payload`.
    fn deliver(&self, f: &UdFrame, ip: &[u8], payload: &[u8]) -> Delivery {
        if !matches!(self.state(), QpState::Rtr | QpState::Rts) {
            return Delivery::NotReady;
        }
        if f.deth.qkey != self.qkey.load(Ordering::Acquire) {
            return Delivery::BadQkey;
        }
        let Some(wr) = self
            .recv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
        else {
            return Delivery::NoBuffer;
        };
        let mut grh = [0u8; GRH_LEN];
        grh[GRH_LEN - ip.len()..].copy_from_slice(ip);
        let total = GRH_LEN + payload.len();
        let room: usize = wr.sges[..wr.n].iter().map(|s| s.length as usize).sum();
        let mut wc = WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: total as u32,
            imm_data: f.imm.unwrap_or(0),
            qp_num: self.qpn,
            src_qp: f.deth.src_qpn,
            wc_flags: IBV_WC_GRH | if f.imm.is_some() { WC_WITH_IMM } else { 0 },
            ..WorkCompletion::EMPTY
        };
        if total > room {
            wc.status = WcStatus::LocLenErr;
            wc.byte_len = 0;
        } else {
            // The GRH area, then the payload, across the SGEs in order: one copy per piece.
            let mut parts = [&grh[..], payload];
            let mut part = 0;
            for s in &wr.sges[..wr.n] {
                let dst = s.addr as *mut u8;
                let mut at = 0usize;
                while at < s.length as usize && part < parts.len() {
                    let src = parts[part];
                    let n = src.len().min(s.length as usize - at);
                    // SAFETY: post_recv checked that the SGE lies in a registered region
                    // with local write access; the verbs contract gives the buffer to the
                    // library until its completion is polled; `at + n` stays within the
                    // SGE's length, and `src` is the library's own bytes.
                    unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst.add(at), n) };
                    at += n;
                    parts[part] = &src[n..];
                    if parts[part].is_empty() {
                        part += 1;
                    }
                }
            }
        }
        self.rcq.push(wc);
        Delivery::Done
    }

    /// Completes every queued receive with WR_FLUSH_ERR (the QP went to ERR).
    pub(crate) fn flush(&self) {
        let wrs: Vec<Posted> = self
            .recv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for wr in wrs {
            self.rcq.push(WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: self.qpn,
                ..WorkCompletion::EMPTY
            });
        }
    }
}
