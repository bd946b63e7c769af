//! Address handles: the peer of a UD send, named by a GRH with an IPv4-mapped GID (RoCE
//! v2), made from attributes or from a received datagram's completion and GRH area.

use core::ffi::c_int;
use std::net::Ipv4Addr;
use std::ptr;

use bluerdma_core::qp::Gid;

use crate::abi::*;
use crate::caps::GID_TABLE_LEN;
use crate::errors::null;
use crate::handle::{free, own};
use crate::pd::Pd;

#[repr(C)]
pub(crate) struct Ah {
    ibv: IbvAh,
    /// The peer's address.
    pub ip: Ipv4Addr,
}

/// The peer an address vector names: RoCE v2 needs a GRH with an IPv4-mapped GID.
fn peer_of(a: &IbvAhAttr, verb: &str) -> Result<Ipv4Addr, c_int> {
    if a.is_global == 0 {
        log::error!("{verb}: the address vector has no GRH (this RoCE device names peers by GID)");
        return Err(libc::EINVAL);
    }
    if a.port_num > 1 || u32::from(a.grh.sgid_index) >= GID_TABLE_LEN {
        log::error!(
            "{verb}: port {} or sgid_index {} does not exist",
            a.port_num,
            a.grh.sgid_index
        );
        return Err(libc::EINVAL);
    }
    Gid(a.grh.dgid).to_ipv4().map_err(|e| {
        log::error!("{verb}: {e}");
        libc::EINVAL
    })
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    // SAFETY: the caller passes a PD from ibv_alloc_pd.
    let (Some(p), false) = ((unsafe { own::<Pd, _>(pd) }), attr.is_null()) else {
        return null(libc::EINVAL);
    };
    // SAFETY: the caller passes an ibv_ah_attr.
    let ip = match peer_of(unsafe { &*attr }, "create_ah") {
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
    Box::into_raw(b) as *mut IbvAh
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
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
