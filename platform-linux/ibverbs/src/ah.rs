//! Address handles: the peer of a UD send, named by a GRH with an IPv4-mapped GID (RoCE
//! v2), made from attributes or from a received datagram's completion and GRH area.

use core::ffi::c_int;
use std::net::Ipv4Addr;
use std::ptr;

use bluerdma_core::qp::Gid;

use crate::abi::*;
use crate::av;
use crate::caps::MAX_AH;
use crate::errors::{errno_rc, null};
use crate::handle::{free, own};
use crate::live::{self, Kind};
use crate::pd::Pd;

#[repr(C)]
pub(crate) struct Ah {
    ibv: IbvAh,
    /// The peer's address.
    pub ip: Ipv4Addr,
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    if crate::pd::check(pd, "create_ah").is_err() {
        return null(libc::EINVAL);
    }
    // SAFETY: a live PD.
    let (Some(p), false) = ((unsafe { own::<Pd, _>(pd) }), attr.is_null()) else {
        return null(libc::EINVAL);
    };
    if live::count(Kind::Ah) >= MAX_AH as usize {
        log::error!("create_ah: {MAX_AH} address handles exist (max_ah)");
        return null(libc::ENOMEM);
    }
    // SAFETY: the caller passes an ibv_ah_attr.
    let ip = match av::peer(unsafe { &*attr }, "create_ah") {
        Ok(ip) => ip,
        Err(e) => return null(e),
    };
    let b = Box::new(Ah {
        ibv: IbvAh {
            context: p.ibv.context,
            pd,
            handle: u32::from(ip),
            _pad: 0,
        },
        ip,
    });
    p.hold();
    let ah = Box::into_raw(b);
    live::add(Kind::Ah, ah, p.ibv.context);
    ah as *mut IbvAh
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_destroy_ah(ah) })
}

/// The work of [`bv_ibv_destroy_ah`]: 0, or the errno it returns (and sets).
unsafe fn ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
    if !live::take(Kind::Ah, ah) {
        log::error!("destroy_ah: {ah:p} is not a live AH (destroyed already?)");
        return libc::EINVAL;
    }
    // SAFETY: a live AH's PD outlives it (it refuses to go while the AH lives).
    unsafe { Pd::of((*ah).pd) }.release();
    // SAFETY: made by ibv_create_ah; the caller gives it up.
    unsafe { free::<Ah, _>(ah) }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_init_ah_from_wc(
    _ctx: *mut IbvContext,
    port_num: u8,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    attr: *mut IbvAhAttr,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_init_ah_from_wc(_ctx, port_num, wc, grh, attr) })
}

/// The work of [`bv_ibv_init_ah_from_wc`]: 0, or the errno it returns (and sets).
unsafe fn ibv_init_ah_from_wc(
    _ctx: *mut IbvContext,
    port_num: u8,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    attr: *mut IbvAhAttr,
) -> c_int {
    if wc.is_null() || grh.is_null() || attr.is_null() || port_num != 1 {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes the completion and the GRH area of its receive buffer.
    let (w, g) = unsafe { (&*wc, &*(grh as *const [u8; GRH_LEN])) };
    if w.wc_flags & IBV_WC_GRH == 0 {
        return libc::EINVAL;
    }
    // An IPv4 GRH area: the IPv4 header in bytes 20..39, its source address at 32..35.
    let src = Ipv4Addr::new(g[32], g[33], g[34], g[35]);
    let mut a = IbvAhAttr {
        is_global: 1,
        port_num,
        sl: w.sl,
        ..IbvAhAttr::default()
    };
    a.grh.dgid = Gid::from_ipv4(src).0;
    a.grh.hop_limit = 64;
    // SAFETY: the caller passes room for an ibv_ah_attr.
    unsafe { attr.write(a) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *mut IbvWc,
    grh: *mut IbvGrh,
    port_num: u8,
) -> *mut IbvAh {
    let mut a = IbvAhAttr::default();
    // SAFETY: the caller's pointers, passed on.
    let pd_ctx = unsafe { own::<Pd, _>(pd) }.map_or(ptr::null_mut(), |p| p.ibv.context);
    // SAFETY: as above; `a` is local.
    match unsafe { bv_ibv_init_ah_from_wc(pd_ctx, port_num, wc, grh, &mut a) } {
        // SAFETY: as above.
        0 => unsafe { bv_ibv_create_ah(pd, &mut a) },
        e => null(e),
    }
}
