//! The extended device query and the refusals that say why: `verbs_context.query_device_ex`
//! (what `ibv_query_device_ex` calls; without it the inline verb zeroes every extended
//! field, `phys_port_cnt_ex` included) and `alloc_td`, which this device does not have
//! (the inline verb would fail with EOPNOTSUPP without a word; this logs the reason once).
//!
//! The extended capabilities are what the device does: no on-demand paging, no TSO, RSS,
//! packet pacing, tag matching, CQ moderation, device memory or PCI atomics, no completion
//! timestamps (ibv_create_cq_ex refuses IBV_WC_EX_WITH_COMPLETION_TIMESTAMP), and
//! `device_cap_flags_ex` the same flags as ibv_query_device's.

use core::ffi::{c_int, c_void};
use core::mem::size_of;
use std::collections::HashSet;
use std::sync::Mutex;

use crate::abi::*;
use crate::abi_ex::IbvDeviceAttrEx;
use crate::context::Ctx;
use crate::errors::null;
use crate::port::{device_attr, write_sized};

/// `verbs_context.query_device_ex`: the extended attributes into the caller's `attr_size`
/// bytes (an older caller's smaller structure gets its part).
///
/// # Safety
/// As ibv_query_device_ex: `ctx` is an open context, `input` NULL or readable, `attr`
/// NULL or `attr_size` writable bytes.
pub(crate) unsafe extern "C" fn ext_query_device_ex(
    ctx: *mut IbvContext,
    input: *const u32,
    attr: *mut IbvDeviceAttrEx,
    attr_size: usize,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { Ctx::from_ibv(ctx) }) else {
        return libc::EINVAL;
    };
    // `struct ibv_query_device_ex_input` is one comp_mask, which must be 0.
    // SAFETY: the caller's contract.
    if !input.is_null() && unsafe { *input } != 0 {
        return libc::EINVAL;
    }
    if attr.is_null() || attr_size < size_of::<IbvDeviceAttr>() {
        return libc::EINVAL;
    }
    let orig = device_attr(c.dev);
    let out = IbvDeviceAttrEx {
        device_cap_flags_ex: orig.device_cap_flags as u64,
        phys_port_cnt_ex: orig.phys_port_cnt as u32,
        orig_attr: orig,
        comp_mask: 0,
        _pad: 0,
        odp_caps: [0; 3],
        completion_timestamp_mask: 0,
        hca_core_clock: 0,
        tso_caps: [0; 2],
        rss_caps: [0; 4],
        max_wq_type_rq: 0,
        packet_pacing_caps: [0; 3],
        raw_packet_caps: 0,
        tm_caps: [0; 5],
        cq_mod_caps: [0; 2],
        _pad2: 0,
        max_dm_size: 0,
        pci_atomic_caps: [0; 3],
        _pad3: 0,
        xrc_odp_caps: 0,
    };
    // SAFETY: the caller passes `attr_size` writable bytes.
    unsafe { write_sized(&out, attr as *mut u8, attr_size) };
    0
}

/// Logs why `verb` is refused, once per process.
fn refuse_once(verb: &'static str, why: &str) {
    static SAID: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.get_or_insert_with(HashSet::new).insert(verb) {
        log::warn!("{verb}: not supported: {why}");
    }
}

/// `verbs_context.alloc_td`: NULL, errno EOPNOTSUPP.
pub(crate) unsafe extern "C" fn ext_alloc_td(
    _ctx: *mut IbvContext,
    _attr: *mut c_void,
) -> *mut c_void {
    refuse_once(
        "ibv_alloc_td",
        "thread domains are not offered (every object of this library may be used from any \
         thread, with its own locking)",
    );
    null(libc::EOPNOTSUPP)
}
