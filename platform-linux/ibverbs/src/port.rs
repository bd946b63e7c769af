//! The queries of a context: ibv_query_device, ibv_query_port (both entries), the GID
//! table (`ibv_query_gid`, `_ex`, `_table`, the GID type) and the P_Key table: what
//! ibv_devinfo prints and what applications size themselves by.

use core::ffi::c_int;
use core::mem::size_of;
use std::ptr;

use crate::abi::*;
use crate::caps::{self, GID_TABLE_LEN};
use crate::context::Ctx;
use crate::device::{fill, Device};
use crate::errors::{errno_rc, set_errno};

/// What ibv_query_device reports for `d` (and ibv_query_device_ex's `orig_attr`).
pub(crate) fn device_attr(d: &Device) -> IbvDeviceAttr {
    let cap = caps::capacity();
    let mut a = IbvDeviceAttr {
        fw_ver: [0; 64],
        node_guid: d.guid().to_be(),
        sys_image_guid: d.guid().to_be(),
        // The card's MR length field is 32 bits.
        max_mr_size: u32::MAX as u64,
        page_size_cap: 0x1000 | 0x20_0000,
        // Xilinx's vendor id and a part id no tool knows: perftest then uses the classic
        // post path and no inline data (ibverbs-abi.md 3.2).
        vendor_id: 0x10ee,
        vendor_part_id: 0xb1e0,
        hw_ver: 1,
        max_qp: cap.qps as c_int,
        max_qp_wr: caps::MAX_QP_WR as c_int,
        // IBV_DEVICE_RC_RNR_NAK_GEN, IBV_DEVICE_MEM_WINDOW, IBV_DEVICE_MEM_WINDOW_TYPE_2B
        // (type 2 windows bound to a QP of their PD: `mw.rs`; IBV_WR_LOCAL_INV and
        // IBV_WR_SEND_WITH_INV invalidate them). Not IBV_DEVICE_MEM_MGT_EXTENSIONS: that
        // also promises fast registration, which this device has not.
        device_cap_flags: (1 << 12) | (1 << 17) | (1 << 24),
        // Several SGEs both ways: split or gathered by the library on send, bounced on
        // receive (one for receives from an SRQ: max_srq_sge).
        max_sge: caps::MAX_SGE as c_int,
        max_sge_rd: caps::MAX_SGE as c_int,
        max_cq: cap.cqs as c_int,
        max_cqe: caps::MAX_CQE as c_int,
        // MR table index 0 is the card's "no MR".
        max_mr: cap.mrs as c_int - 1,
        max_pd: caps::MAX_PD as c_int,
        max_qp_rd_atom: caps::MAX_RD_ATOM as c_int,
        max_ee_rd_atom: 0,
        max_res_rd_atom: caps::MAX_RD_ATOM as c_int * cap.qps as c_int,
        max_qp_init_rd_atom: caps::MAX_RD_ATOM as c_int,
        max_ee_init_rd_atom: 0,
        // Atomics are executed by the responder's driver, one at a time per device, on the
        // registered memory: atomic among this device's users, not against the CPU.
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        // Windows take MR-table entries: as many as MRs.
        max_mw: cap.mrs as c_int - 1,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: caps::MAX_AH,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: caps::MAX_SRQ as c_int,
        max_srq_wr: caps::MAX_SRQ_WR as c_int,
        max_srq_sge: 1,
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
        _pad: 0,
    };
    fill(
        &mut a.fw_ver,
        concat!("bluerdma-emu ", env!("CARGO_PKG_VERSION")),
    );
    a
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_device(
    ctx: *mut IbvContext,
    attr: *mut IbvDeviceAttr,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_query_device(ctx, attr) })
}

/// The work of [`bv_ibv_query_device`]: 0, or the errno it returns (and sets).
unsafe fn ibv_query_device(ctx: *mut IbvContext, attr: *mut IbvDeviceAttr) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes room for an ibv_device_attr.
    unsafe { attr.write(device_attr(c.dev)) };
    0
}

fn port_attr() -> IbvPortAttr {
    IbvPortAttr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_4096,
        gid_tbl_len: GID_TABLE_LEN as c_int,
        // IBV_PORT_IP_BASED_GIDS: the GIDs are the device's IPv4-mapped address. IBV_PORT_CM_SUP
        // is not claimed (it means the kernel's IB CM, which librdmacm's stand-in does not
        // use); nothing else applies to RoCE.
        port_cap_flags: 1 << 26,
        max_msg_sz: caps::MAX_MSG,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 4X at 25 Gb/s (EDR): 100 Gb/s, the card's line rate.
        active_width: 2,
        active_speed: 32,
        // LinkUp.
        phys_state: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: 0,
        port_cap_flags2: 0,
        _pad: 0,
    }
}

/// Writes the first `len` bytes of `v` (all of it at most) to `dst`, and zeroes the rest of
/// the `len` bytes: an older caller gets the part of the structure it knows, a newer one
/// (built against later headers, with fields this library does not fill) zeroes where
/// they are, as rdma-core's providers do.
///
/// # Safety
/// `dst` has `len` writable bytes.
pub(crate) unsafe fn write_sized<T>(v: &T, dst: *mut u8, len: usize) {
    let n = len.min(size_of::<T>());
    // SAFETY: `v` has `size_of::<T>()` readable bytes; the caller's contract for `dst`.
    unsafe {
        ptr::copy_nonoverlapping(v as *const T as *const u8, dst, n);
        ptr::write_bytes(dst.add(n), 0, len - n);
    }
}

/// The port's attributes into the caller's `len` bytes at `attr`.
///
/// # Safety
/// `ctx` is NULL or an open context; `attr` is NULL or has `len` writable bytes.
unsafe fn query_port(ctx: *mut IbvContext, port: u8, attr: *mut IbvPortAttr, len: usize) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() || attr.is_null() || port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    unsafe { write_sized(&port_attr(), attr as *mut u8, len) };
    0
}

/// The IBVERBS_1.1 entry: writes the 48-byte compat structure only.
#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_port(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_query_port(ctx, port, attr) })
}

/// The work of [`bv_ibv_query_port`]: 0, or the errno it returns (and sets).
unsafe fn ibv_query_port(ctx: *mut IbvContext, port: u8, attr: *mut IbvPortAttr) -> c_int {
    // SAFETY: the caller passes at least the 48-byte compat structure.
    unsafe { query_port(ctx, port, attr, COMPAT_PORT_ATTR_LEN) }
}

/// `verbs_context.query_port`, which the inline `ibv_query_port` calls with the caller's
/// structure size.
pub(crate) unsafe extern "C" fn ext_query_port(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
    len: usize,
) -> c_int {
    // SAFETY: the caller passes `len` writable bytes.
    unsafe { query_port(ctx, port, attr, len) }
}

/// The GID at `index` of the table (see [`GID_TABLE_LEN`]).
fn gid_at(d: &Device, index: c_int) -> Option<[u8; 16]> {
    u32::try_from(index)
        .is_ok_and(|i| caps::GID_INDEXES.contains(&i))
        .then(|| d.gid())
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_gid(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_query_gid(ctx, port, index, gid) })
}

/// The work of [`bv_ibv_query_gid`]: 0, or the errno it returns (and sets).
unsafe fn ibv_query_gid(ctx: *mut IbvContext, port: u8, index: c_int, gid: *mut [u8; 16]) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return -1;
    };
    if port != 1 || gid.is_null() || !(0..GID_TABLE_LEN as c_int).contains(&index) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes a 16-byte GID.
    unsafe { gid.write(gid_at(c.dev, index).unwrap_or([0; 16])) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_gid_type(
    ctx: *mut IbvContext,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_query_gid_type(ctx, port, index, ty) })
}

/// The work of [`bv_ibv_query_gid_type`]: 0, or the errno it returns (and sets).
unsafe fn ibv_query_gid_type(ctx: *mut IbvContext, port: u8, index: u32, ty: *mut c_int) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    if port != 1 || ty.is_null() || gid_at(c.dev, index as c_int).is_none() {
        return libc::EINVAL;
    }
    // SAFETY: the caller passes an int.
    unsafe { ty.write(IBV_GID_TYPE_SYSFS_ROCE_V2) };
    0
}

fn gid_entry(d: &Device, index: u32) -> Option<IbvGidEntry> {
    Some(IbvGidEntry {
        gid: gid_at(d, index as c_int)?,
        gid_index: index,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    })
}

#[no_mangle]
pub unsafe extern "C" fn bv__ibv_query_gid_ex(
    ctx: *mut IbvContext,
    port: u32,
    index: u32,
    entry: *mut IbvGidEntry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    if port != 1 || entry.is_null() || flags != 0 || index >= GID_TABLE_LEN {
        return libc::EINVAL;
    }
    let Some(e) = gid_entry(c.dev, index) else {
        return libc::ENODATA;
    };
    // SAFETY: the caller passes `entry_size` writable bytes.
    unsafe { write_sized(&e, entry as *mut u8, entry_size) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv__ibv_query_gid_table(
    ctx: *mut IbvContext,
    entries: *mut u8,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return -(libc::EINVAL as isize);
    };
    if flags != 0 || (entries.is_null() && max_entries > 0) {
        return -(libc::EINVAL as isize);
    }
    let mut out = 0usize;
    for index in 0..GID_TABLE_LEN {
        let Some(e) = gid_entry(c.dev, index) else {
            continue;
        };
        if out >= max_entries {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: the caller passes `max_entries` entries of `entry_size` bytes.
        unsafe { write_sized(&e, entries.add(out * entry_size), entry_size) };
        out += 1;
    }
    out as isize
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_query_pkey(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_query_pkey(ctx, port, index, pkey) })
}

/// The work of [`bv_ibv_query_pkey`]: 0, or the errno it returns (and sets).
unsafe fn ibv_query_pkey(ctx: *mut IbvContext, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
        return -1;
    }
    // SAFETY: the caller passes a u16; the default P_Key, big-endian.
    unsafe { pkey.write(0xFFFFu16.to_be()) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_get_pkey_index(ctx: *mut IbvContext, port: u8, pkey: u16) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { Ctx::from_ibv(ctx) }.is_none() || port != 1 {
        return -libc::EINVAL;
    }
    if u16::from_be(pkey) == 0xFFFF {
        0
    } else {
        -libc::ENOENT
    }
}
