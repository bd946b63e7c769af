//! Memory regions (`ibv_reg_mr` and its iova forms, `ibv_rereg_mr`, `ibv_dereg_mr`),
//! recorded in their PD's table, and the fork verbs, which concern registered memory.
//!
//! ibv_rereg_mr changes the MR in place under the same lkey and rkey (the engine's
//! `rereg_mr`: a new translation's page table is written before the one table update that
//! switches to it), so a peer holding the rkey keeps it; with CHANGE_PD the keys change
//! (the card checks no PD, so the old PD's key must stop working); a failure leaves the MR
//! as it was (IBV_REREG_MR_ERR_INPUT, errno set). An MR with memory windows bound to it is
//! refused (EBUSY).

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use bluerdma_core::desc::AccessFlags;
use bluerdma_linux::verbs::Mr as VMr;

use crate::abi::*;
use crate::errors::{errno_rc, fail, or_null, set_errno};
use crate::handle::{free, own};
use crate::live::{self, Kind};
use crate::pd::{MrEntry, Pd};

#[repr(C)]
pub(crate) struct Mr {
    pub ibv: IbvMr,
    mr: VMr,
    /// The access it was registered with (what ibv_rereg_mr keeps without CHANGE_ACCESS).
    access: c_int,
    /// Memory windows bound to it (`mw.rs`): ibv_dereg_mr and ibv_rereg_mr are refused
    /// (EBUSY) while any is.
    pub(crate) windows: AtomicU32,
}

impl Mr {
    /// The engine's registration (what a memory window binds to).
    pub(crate) fn engine_mr(&self) -> &VMr {
        &self.mr
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the PD outlives its MRs (ibv_dealloc_pd is refused while they live).
        let pd = unsafe { Pd::of(self.ibv.pd) };
        pd.remove_mr(self.ibv.lkey);
        pd.release();
    }
}

/// Access bits 20..=29 are optional: a device that does not know one ignores it
/// (IBV_ACCESS_RELAXED_ORDERING, which perftest always passes, is bit 20).
const OPTIONAL_ACCESS: u32 = 0x3FF0_0000;

/// IBV_ACCESS_ZERO_BASED and IBV_ACCESS_ON_DEMAND: features this device does not have
/// (EOPNOTSUPP, as a device without them answers).
const UNSUPPORTED_ACCESS: u32 = (1 << 5) | (1 << 6);
/// IBV_ACCESS_HUGETLB: a hint that the memory is huge pages; nothing to do with it.
const HUGETLB_HINT: u32 = 1 << 7;

fn mr_access(access: c_int) -> Result<AccessFlags, c_int> {
    if access as u32 & UNSUPPORTED_ACCESS != 0 {
        log::error!(
            "reg_mr: access {access:#x} asks for zero-based or on-demand regions, which \
             this device does not support"
        );
        return Err(libc::EOPNOTSUPP);
    }
    let bits = access as u32 & !OPTIONAL_ACCESS & !HUGETLB_HINT;
    let supported = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::MW_BIND;
    let flags = u8::try_from(bits)
        .ok()
        .and_then(AccessFlags::from_bits)
        .filter(|f| supported.contains(*f));
    flags.ok_or_else(|| {
        log::error!(
            "reg_mr: access {access:#x} has flags this device does not support \
             (supported: LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC, MW_BIND)"
        );
        libc::EINVAL
    })
}

/// # Safety
/// `pd` is NULL or a PD from ibv_alloc_pd; the region stays valid until ibv_dereg_mr.
unsafe fn reg(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> Result<*mut IbvMr, c_int> {
    crate::pd::check(pd, "reg_mr")?;
    // SAFETY: a live PD.
    let p = unsafe { own::<Pd, _>(pd) }.ok_or(libc::EINVAL)?;
    if iova != addr as u64 {
        log::error!("reg_mr: an iova different from the address is not supported");
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: the verbs contract: the region stays valid until ibv_dereg_mr.
    let mr = unsafe { register(p, addr, len, access) }?;
    let key = mr.key().get();
    let b = Box::new(Mr {
        ibv: IbvMr {
            context: p.ibv.context,
            pd,
            addr,
            length: len,
            handle: key,
            lkey: key,
            rkey: key,
            _pad: 0,
        },
        mr,
        access,
        windows: AtomicU32::new(0),
    });
    p.hold();
    let m = Box::into_raw(b);
    live::add(Kind::Mr, m, p.ibv.context);
    Ok(m as *mut IbvMr)
}

/// Registers `[addr, addr + len)` on `p` with the verbs access `access` and records it in
/// the PD's table.
///
/// # Safety
/// The region stays valid until the returned registration is dropped.
unsafe fn register(p: &Pd, addr: *mut c_void, len: usize, access: c_int) -> Result<VMr, c_int> {
    if len == 0 || addr.is_null() {
        log::error!("reg_mr: an empty region or a NULL address");
        return Err(libc::EINVAL);
    }
    let flags = mr_access(access)?;
    // SAFETY: the caller's contract.
    let mr = unsafe { p.pd.reg_mr(addr as *mut u8, len, flags) }.map_err(fail)?;
    p.add_mr(mr.key().get(), entry(addr, len, flags));
    Ok(mr)
}

/// The PD table's record of a region.
fn entry(addr: *mut c_void, len: usize, flags: AccessFlags) -> MrEntry {
    MrEntry {
        addr: addr as u64,
        len,
        local_write: flags.contains(AccessFlags::LOCAL_WRITE),
        remote_write: flags.contains(AccessFlags::REMOTE_WRITE),
        shadow: None,
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded contract.
    or_null(unsafe { reg(pd, addr, len, addr as u64, access) })
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded contract.
    or_null(unsafe { reg(pd, addr, len, iova, access) })
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    // SAFETY: forwarded contract.
    or_null(unsafe { reg(pd, addr, len, iova, access as c_int) })
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_dereg_mr(mr) })
}

/// The work of [`bv_ibv_dereg_mr`]: 0, or the errno it returns (and sets).
unsafe fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    if !live::take(Kind::Mr, mr) {
        log::error!("dereg_mr: {mr:p} is not a live MR (deregistered already?)");
        return libc::EINVAL;
    }
    // SAFETY: a live MR (just checked).
    let windows = unsafe { &*(mr as *const Mr) }
        .windows
        .load(Ordering::Acquire);
    if windows > 0 {
        // SAFETY: as above; still live.
        live::add(Kind::Mr, mr, unsafe { (*mr).context });
        log::error!("dereg_mr: {windows} memory windows are bound to the MR");
        return libc::EBUSY;
    }
    // SAFETY: made by ibv_reg_mr; dropping deregisters it in the card.
    unsafe { free::<Mr, _>(mr) }
}

/// `IBV_REREG_MR_CHANGE_TRANSLATION`, `_PD`, `_ACCESS`.
const REREG_TRANSLATION: c_int = 1 << 0;
const REREG_PD: c_int = 1 << 1;
const REREG_ACCESS: c_int = 1 << 2;
/// `IBV_REREG_MR_ERR_INPUT`: the MR is as it was.
const REREG_ERR_INPUT: c_int = -1;

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    match unsafe { rereg(mr, flags, pd, addr, length, access) } {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            REREG_ERR_INPUT
        }
    }
}

/// The work of [`bv_ibv_rereg_mr`]: the errno of a refusal, after which the MR is as it
/// was.
///
/// # Safety
/// As ibv_rereg_mr: `mr` is NULL or an MR of this library that no other thread uses
/// meanwhile; with CHANGE_TRANSLATION the new region stays valid until ibv_dereg_mr.
unsafe fn rereg(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<(), c_int> {
    live::check(Kind::Mr, mr, "rereg_mr")?;
    let all = REREG_TRANSLATION | REREG_PD | REREG_ACCESS;
    if flags == 0 || flags & !all != 0 {
        log::error!("rereg_mr: flags {flags:#x} (one or more of CHANGE_TRANSLATION, _PD, _ACCESS)");
        return Err(libc::EINVAL);
    }
    // SAFETY: a live MR, used by this thread alone (the verbs contract).
    let m = unsafe { &mut *(mr as *mut Mr) };
    if m.windows.load(Ordering::Acquire) > 0 {
        log::error!("rereg_mr: memory windows are bound to the MR");
        return Err(libc::EBUSY);
    }
    let new_pd = if flags & REREG_PD != 0 {
        crate::pd::check(pd, "rereg_mr")?;
        // SAFETY: a live PD (just checked).
        let np = unsafe { Pd::of(pd) };
        if np.ibv.context != m.ibv.context {
            log::error!("rereg_mr: the new PD belongs to another context");
            return Err(libc::EINVAL);
        }
        pd
    } else {
        m.ibv.pd
    };
    let (addr, length) = if flags & REREG_TRANSLATION != 0 {
        if addr.is_null() || length == 0 {
            log::error!("rereg_mr: CHANGE_TRANSLATION with a NULL address or length 0");
            return Err(libc::EINVAL);
        }
        (addr, length)
    } else {
        (m.ibv.addr, m.ibv.length)
    };
    let access = if flags & REREG_ACCESS != 0 {
        access
    } else {
        m.access
    };
    let flags_new = mr_access(access)?;
    // SAFETY: the new PD is live (checked, or the MR's own).
    let np = unsafe { Pd::of(new_pd) };
    // SAFETY: the region is the caller's (CHANGE_TRANSLATION) or the one registered
    // already, valid until ibv_dereg_mr (the verbs contract).
    unsafe { m.mr.rereg(&np.pd, addr as *mut u8, length, flags_new) }.map_err(fail)?;
    let (old_key, key) = (m.ibv.lkey, m.mr.key().get());
    // SAFETY: the MR's PD is live (it holds it).
    let old_pd = unsafe { Pd::of(m.ibv.pd) };
    old_pd.remove_mr(old_key);
    np.add_mr(key, entry(addr, length, flags_new));
    np.hold();
    old_pd.release();
    m.access = access;
    m.ibv.pd = new_pd;
    m.ibv.addr = addr;
    m.ibv.length = length;
    (m.ibv.handle, m.ibv.lkey, m.ibv.rkey) = (key, key, key);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_fork_init() -> c_int {
    // Registered memory is the process's own and the emulated card runs in it: a child
    // after fork has its own copy and no card, so there is nothing to protect.
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_is_fork_initialized() -> c_int {
    // IBV_FORK_UNNEEDED.
    2
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
