//! Memory regions (`ibv_reg_mr` and its iova forms, `ibv_dereg_mr`), recorded in their PD's
//! table, and the fork verbs, which concern registered memory.

use core::ffi::{c_int, c_void};

use bluerdma_core::desc::AccessFlags;
use bluerdma_linux::verbs::Mr as VMr;

use crate::abi::*;
use crate::errors::{errno_rc, fail, or_null};
use crate::handle::{free, own};
use crate::live::{self, Kind};
use crate::pd::{MrEntry, Pd};

#[repr(C)]
struct Mr {
    ibv: IbvMr,
    _mr: VMr,
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

/// IBV_ACCESS_MW_BIND, IBV_ACCESS_ZERO_BASED and IBV_ACCESS_ON_DEMAND: features this
/// device does not have (EOPNOTSUPP, as a device without them answers).
const UNSUPPORTED_ACCESS: u32 = (1 << 4) | (1 << 5) | (1 << 6);
/// IBV_ACCESS_HUGETLB: a hint that the memory is huge pages; nothing to do with it.
const HUGETLB_HINT: u32 = 1 << 7;

fn mr_access(access: c_int) -> Result<AccessFlags, c_int> {
    if access as u32 & UNSUPPORTED_ACCESS != 0 {
        log::error!(
            "reg_mr: access {access:#x} asks for memory windows, zero-based or on-demand \
             regions, which this device does not support"
        );
        return Err(libc::EOPNOTSUPP);
    }
    let bits = access as u32 & !OPTIONAL_ACCESS & !HUGETLB_HINT;
    let supported = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let flags = u8::try_from(bits)
        .ok()
        .and_then(AccessFlags::from_bits)
        .filter(|f| supported.contains(*f));
    flags.ok_or_else(|| {
        log::error!(
            "reg_mr: access {access:#x} has flags this device does not support \
             (supported: LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC)"
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
    if len == 0 || addr.is_null() {
        log::error!("reg_mr: an empty region or a NULL address");
        return Err(libc::EINVAL);
    }
    let access = mr_access(access)?;
    // SAFETY: the verbs contract: the region stays valid until ibv_dereg_mr.
    let mr = unsafe { p.pd.reg_mr(addr as *mut u8, len, access) }.map_err(fail)?;
    let key = mr.key().get();
    p.add_mr(
        key,
        MrEntry {
            addr: addr as u64,
            len,
            local_write: access.contains(AccessFlags::LOCAL_WRITE),
            remote_write: access.contains(AccessFlags::REMOTE_WRITE),
            shadow: None,
        },
    );
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
        _mr: mr,
    });
    p.hold();
    let m = Box::into_raw(b);
    live::add(Kind::Mr, m, p.ibv.context);
    Ok(m as *mut IbvMr)
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
    // SAFETY: made by ibv_reg_mr; dropping deregisters it in the card.
    unsafe { free::<Mr, _>(mr) }
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
