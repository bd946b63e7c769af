//! Scatter/gather lists of work requests: reading an application's list, the one buffer of
//! a receive WR, and copying a list's bytes into one buffer (inline data, gathered sends,
//! datagrams).

use core::ffi::c_int;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::engine::RecvWr;
use bluerdma_core::keys::MrKey;

use crate::abi::{IbvRecvWr, IbvSge};

/// The `n` SGEs (or other entries of an application's array) at `sg_list` (none when `n`
/// is 0).
///
/// # Safety
/// When `n > 0`, `sg_list` points at `n` readable entries.
pub(crate) unsafe fn list<'a, T>(sg_list: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(sg_list, n) }
    }
}

/// The one SGE of a receive WR (none: a zero-length buffer).
///
/// # Safety
/// `w.sg_list` holds `w.num_sge` readable entries.
unsafe fn recv_sge(w: &IbvRecvWr, verb: &str) -> Result<IbvSge, c_int> {
    match w.num_sge {
        0 => Ok(IbvSge {
            addr: 0,
            length: 0,
            lkey: 0,
        }),
        // SAFETY: the caller's contract.
        1 if !w.sg_list.is_null() => Ok(unsafe { *w.sg_list }),
        k => {
            log::error!("{verb}: {k} SGEs (the device takes 1)");
            Err(libc::EINVAL)
        }
    }
}

/// The engine's receive WR for an application's (RC QPs and SRQs take one SGE).
///
/// # Safety
/// `w.sg_list` holds `w.num_sge` readable entries.
pub(crate) unsafe fn recv_wr(w: &IbvRecvWr, verb: &str) -> Result<RecvWr, c_int> {
    // SAFETY: the caller's contract.
    let sge = unsafe { recv_sge(w, verb) }?;
    Ok(RecvWr {
        wr_id: w.wr_id,
        addr: VirtAddr(sge.addr),
        len: sge.length,
        lkey: MrKey::from_raw(sge.lkey),
    })
}

/// Copies the bytes of `sges` into `dst` (which has their total length).
///
/// # Safety
/// Each SGE's bytes are readable (the verbs contract for the duration of the post).
pub(crate) unsafe fn gather(sges: &[IbvSge], dst: &mut [u8]) {
    let mut at = 0;
    for s in sges {
        let n = s.length as usize;
        // SAFETY: the caller's contract.
        let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, n) };
        dst[at..at + n].copy_from_slice(src);
        at += n;
    }
}
