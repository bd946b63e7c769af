//! The UD post paths. A UD SEND is a frame the driver builds (`bluerdma_core::wire::ud`:
//! BTH 0x64/0x65, DETH, ICRC, UDP port 4792) and sends through the simple NIC, or several
//! (FIRST, MIDDLE, LAST) for a datagram longer than one frame's payload, up to the port's
//! MTU; it completes when posted. A UD receive WR waits in the library for a datagram
//! (`ud_rx.rs`).

use core::ffi::c_int;
use std::sync::atomic::Ordering;

use bluerdma_core::engine::{VerbsError, WcOpcode, WorkCompletion};
use bluerdma_core::qp::QpState;
use bluerdma_core::wire::ud::{
    Deth, UdFrame, UdPart, DEFAULT_PKEY, UD_MAX_DATAGRAM, UD_MAX_FRAME, UD_MAX_PAYLOAD,
};
use bluerdma_core::wire::MacAddr;

use crate::abi::*;
use crate::ah::Ah;
use crate::caps::UD_MAX_SGE as MAX_SGE;
use crate::errors::{fail, set_bad};
use crate::handle::own;
use crate::pd::Pd;
use crate::sge;
use crate::ud_qp::{ud, UdQp};
use crate::ud_rx::Posted;

/// How many times a send waits for a free simple-NIC TX slot before dropping the datagram.
const SEND_TRIES: u32 = 10_000;

/// Copies a send WR's payload (its SGEs, or its inline data) into `datagram`; returns the
/// payload length.
///
/// # Safety
/// `wr`'s SGE list and, for inline data, the bytes it names are readable.
unsafe fn copy_payload(q: &UdQp, wr: &IbvSendWr, frame: &mut [u8]) -> Result<usize, c_int> {
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    let n = wr.num_sge.max(0) as u32;
    let limit = if inline { MAX_SGE } else { q.cap.max_send_sge };
    if (n > 0 && wr.sg_list.is_null()) || n > limit {
        log::error!("post_send (UD): {n} SGEs (the QP takes {limit})");
        return Err(libc::EINVAL);
    }
    // SAFETY: a QP's PD lives as long as the QP.
    let pd = unsafe { Pd::of(q.ibv.pd) };
    // SAFETY: num_sge entries are readable (checked non-null above).
    let sges = unsafe { sge::list(wr.sg_list, n as usize) };
    let mut len = 0usize;
    for (k, s) in sges.iter().enumerate() {
        len += s.length as usize;
        if len > UD_MAX_DATAGRAM {
            log::error!("post_send (UD): more than {UD_MAX_DATAGRAM} bytes (the port's MTU)");
            return Err(libc::EINVAL);
        }
        if !inline && !pd.covers(s.lkey, s.addr, s.length, false) {
            log::error!(
                "post_send (UD): SGE {k} is outside the region of lkey {:#x}",
                s.lkey
            );
            return Err(libc::EINVAL);
        }
    }
    // SAFETY: registered (checked above) or inline bytes the caller lends for the duration
    // of ibv_post_send.
    unsafe { sge::gather(sges, &mut frame[..len]) };
    Ok(len)
}

/// Sends one UD work request; queues its completion when signaled.
///
/// # Safety
/// As ibv_post_send: `wr` and what it points to are valid.
unsafe fn send_one(q: &UdQp, wr: &IbvSendWr, psn: &mut u32) -> Result<(), c_int> {
    let imm = match wr.opcode {
        IBV_WR_SEND => None,
        IBV_WR_SEND_WITH_IMM => Some(u32::from_be(wr.imm_data)),
        other => {
            log::error!("post_send (UD): opcode {other} (UD takes SEND and SEND_WITH_IMM)");
            return Err(libc::EINVAL);
        }
    };
    // wr.ud: ah (offset 40), remote_qpn (48), remote_qkey (52).
    let ah = wr.wr[0] as *mut IbvAh;
    // SAFETY: an AH from ibv_create_ah, or NULL.
    let Some(ah) = (unsafe { own::<Ah, _>(ah) }) else {
        log::error!("post_send (UD): no address handle");
        return Err(libc::EINVAL);
    };
    let remote_qpn = (wr.wr[1] as u32) & 0xFF_FFFF;
    let mut qkey = (wr.wr[1] >> 32) as u32;
    if qkey & 0x8000_0000 != 0 {
        // A Q_Key with the high bit set means "use the QP's own" (IBTA 10.2.5).
        qkey = q.shared.qkey.load(Ordering::Acquire);
    }
    let spec = q.engine.spec();
    let mut f = UdFrame {
        src_mac: spec.mac,
        dst_mac: MacAddr::BROADCAST,
        src_ip: spec.ip,
        dst_ip: ah.ip,
        udp_src_port: 0xC000 | (q.shared.qpn & 0x3FFF) as u16,
        pkey: DEFAULT_PKEY,
        solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
        dst_qpn: remote_qpn,
        psn: *psn,
        deth: Deth {
            qkey,
            src_qpn: q.shared.qpn,
        },
        imm: None,
        part: UdPart::Only,
    };
    let mut datagram = [0u8; UD_MAX_DATAGRAM];
    // SAFETY: the caller's contract.
    let len = unsafe { copy_payload(q, wr, &mut datagram)? };
    let pieces = len.div_ceil(UD_MAX_PAYLOAD).max(1);
    let mut frame = [0u8; UD_MAX_FRAME];
    for (k, piece) in datagram[..len.max(1)].chunks(UD_MAX_PAYLOAD).enumerate() {
        let piece = &piece[..piece.len().min(len)];
        f.part = UdPart::of(k, pieces);
        f.imm = if f.part.ends() { imm } else { None };
        f.psn = *psn;
        let h = f.header_len();
        frame[h..h + piece.len()].copy_from_slice(piece);
        let n = f.emit(&mut frame, piece.len()).map_err(|e| {
            log::error!("post_send (UD): {e}");
            libc::EINVAL
        })?;
        *psn = (*psn + 1) & 0xFF_FFFF;
        if !send_frame(q, &frame[..n])? {
            // UD is unreliable: a datagram the card could not take in time is lost.
            log::warn!("post_send (UD): the simple-NIC TX ring stayed full, datagram dropped");
            break;
        }
    }
    if q.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0 {
        q.scq.push(WorkCompletion {
            wr_id: wr.wr_id,
            opcode: WcOpcode::Send,
            byte_len: len as u32,
            qp_num: q.shared.qpn,
            ..WorkCompletion::EMPTY
        });
    }
    Ok(())
}

/// Hands one frame to the simple NIC, waiting a little for a free TX slot; false if none
/// came free.
fn send_frame(q: &UdQp, frame: &[u8]) -> Result<bool, c_int> {
    for _ in 0..SEND_TRIES {
        match q.engine.send_raw(frame) {
            Ok(()) => return Ok(true),
            Err(e) if matches!(e.kind, VerbsError::Busy { .. }) => std::thread::yield_now(),
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(false)
}

/// ibv_post_send for a UD QP.
///
/// # Safety
/// As ibv_post_send.
pub(crate) unsafe fn post_send(
    qp: *mut IbvQp,
    mut wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { ud(qp) }) else {
        return libc::EINVAL;
    };
    let mut psn = q.psn.lock().unwrap_or_else(|e| e.into_inner());
    while !wr.is_null() {
        let e = if q.shared.state() != QpState::Rts {
            log::error!(
                "post_send (UD): the QP is in {:?}, not RTS",
                q.shared.state()
            );
            Err(libc::EINVAL)
        } else {
            // SAFETY: the caller's contract.
            unsafe { send_one(q, &*wr, &mut psn) }
        };
        if let Err(e) = e {
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, wr) };
            return e;
        }
        // SAFETY: a list of valid requests.
        wr = unsafe { (*wr).next };
    }
    0
}

/// ibv_post_recv for a UD QP: buffers wait in the library for datagrams.
///
/// # Safety
/// As ibv_post_recv.
pub(crate) unsafe fn post_recv(
    qp: *mut IbvQp,
    mut wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(q) = (unsafe { ud(qp) }) else {
        return libc::EINVAL;
    };
    if q.shared.state() == QpState::Reset {
        // Receive WRs are taken from INIT on (IBTA 10.8.2); a RESET QP has no queue.
        log::error!("post_recv (UD): the QP is in RESET (receives are taken from INIT on)");
        // SAFETY: the caller's bad_wr slot.
        unsafe { set_bad(bad, wr) };
        return libc::EINVAL;
    }
    // SAFETY: a QP's PD lives as long as the QP.
    let pd = unsafe { Pd::of(q.ibv.pd) };
    let mut queue = q.shared.recv.lock().unwrap_or_else(|e| e.into_inner());
    while !wr.is_null() {
        // SAFETY: a list of valid requests.
        let w = unsafe { &*wr };
        let n = w.num_sge.max(0) as usize;
        let mut p = Posted {
            wr_id: w.wr_id,
            sges: [IbvSge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE as usize],
            n,
        };
        let mut error = if n > q.cap.max_recv_sge as usize || (n > 0 && w.sg_list.is_null()) {
            log::error!(
                "post_recv (UD): {n} SGEs (the QP takes {})",
                q.cap.max_recv_sge
            );
            Some(libc::EINVAL)
        } else if queue.len() >= q.cap.max_recv_wr as usize {
            log::error!("post_recv (UD): the receive queue is full");
            Some(libc::ENOMEM)
        } else {
            None
        };
        if error.is_none() {
            // SAFETY: num_sge entries are readable (checked non-null above).
            let sges = unsafe { sge::list(w.sg_list, n) };
            for (k, (s, slot)) in sges.iter().zip(&mut p.sges).enumerate() {
                *slot = *s;
                if !pd.covers(s.lkey, s.addr, s.length, true) {
                    log::error!(
                        "post_recv (UD): SGE {k} is outside a region of lkey {:#x} with local \
                         write",
                        s.lkey
                    );
                    error = Some(libc::EINVAL);
                    break;
                }
            }
        }
        if let Some(e) = error {
            // SAFETY: the caller's bad_wr slot.
            unsafe { set_bad(bad, wr) };
            return e;
        }
        queue.push_back(p);
        wr = w.next;
    }
    0
}
