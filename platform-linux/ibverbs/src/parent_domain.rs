//! Parent domains (`verbs_context.alloc_parent_domain`, what `ibv_alloc_parent_domain`
//! calls): a protection domain plus the application's allocators for the buffers the
//! library makes on the objects created on it.
//!
//! A parent domain is a [`Pd`] object that shares its protection domain's engine PD and MR
//! table: QPs, SRQs, AHs and MRs made on it are made on the protection domain (an MR
//! registered on the parent serves a QP on the protection domain and the other way round),
//! `ibv_qp->pd` and `ibv_mr->pd` name the parent, and ibv_dealloc_pd frees it (the
//! protection domain is refused with EBUSY while a parent domain holds it). An extended CQ
//! may name one (IBV_CQ_INIT_ATTR_MASK_PD). No thread domain: `td` must be NULL (alloc_td
//! is refused, so there is none to give).
//!
//! What the allocators place: the buffers the library registers for an RC QP on the
//! parent domain, its inline-data ring and its gather ring (`rc_rings.rs`, resource type
//! [`RES_TYPE_QP`], alignment 4096), each when the QP first needs it. The allocator may
//! answer IBV_ALLOCATOR_USE_DEFAULT (the library allocates as without a parent domain) or
//! NULL (the post fails with ENOMEM); its memory is registered like any MR, so it must be
//! ordinary mapped memory, and it is handed back to `free` after the QP's deregistration.
//! The card's own queues (the send ring, the CQs' entries) live in the device's DMA memory
//! and the engine's tables, which no application allocator can place: they are not asked
//! for.

use core::ffi::{c_int, c_void};
use core::mem::{offset_of, size_of};

use bluerdma_core::desc::AccessFlags;
use bluerdma_linux::verbs::Mr as VMr;

use crate::abi::*;
use crate::errors::{fail, or_null};
use crate::handle::own;
use crate::live::{self, Kind};
use crate::pd::{AllocFn, FreeFn, Parent, Pd};

/// `resource_type` of the buffers this library asks a parent domain's allocator for: an RC
/// QP's send-side rings. The upper 32 bits (a provider's driver id in rdma-core) are 0.
pub const RES_TYPE_QP: u64 = 1;

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`.
const ATTR_ALLOCATORS: u32 = 1 << 0;
/// `IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`.
const ATTR_PD_CONTEXT: u32 = 1 << 1;
/// `IBV_ALLOCATOR_USE_DEFAULT`.
const USE_DEFAULT: usize = usize::MAX;
/// The alignment asked of the allocator (a page: what the library's own buffers have).
const RING_ALIGN: usize = 4096;

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct IbvParentDomainInitAttr {
    pub pd: *mut IbvPd,
    pub td: *mut c_void,
    pub comp_mask: u32,
    pub alloc: Option<AllocFn>,
    pub free: Option<FreeFn>,
    pub pd_context: *mut c_void,
}

const _: () = {
    assert!(size_of::<IbvParentDomainInitAttr>() == 48);
    assert!(offset_of!(IbvParentDomainInitAttr, comp_mask) == 16);
    assert!(offset_of!(IbvParentDomainInitAttr, alloc) == 24);
    assert!(offset_of!(IbvParentDomainInitAttr, pd_context) == 40);
};

/// `verbs_context.alloc_parent_domain`.
///
/// # Safety
/// As ibv_alloc_parent_domain: `ctx` is an open context, `attr` NULL or initialised.
pub(crate) unsafe extern "C" fn ext_alloc_parent_domain(
    ctx: *mut IbvContext,
    attr: *mut IbvParentDomainInitAttr,
) -> *mut IbvPd {
    // SAFETY: forwarded contract.
    or_null(unsafe { alloc_parent_domain(ctx, attr) })
}

/// # Safety
/// As [`ext_alloc_parent_domain`].
unsafe fn alloc_parent_domain(
    ctx: *mut IbvContext,
    attr: *mut IbvParentDomainInitAttr,
) -> Result<*mut IbvPd, c_int> {
    live::check(Kind::Ctx, ctx, "alloc_parent_domain")?;
    if attr.is_null() {
        log::error!("alloc_parent_domain: no attributes");
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes an initialised ibv_parent_domain_init_attr.
    let a = unsafe { &*attr };
    if a.comp_mask & !(ATTR_ALLOCATORS | ATTR_PD_CONTEXT) != 0 {
        log::error!(
            "alloc_parent_domain: comp_mask {:#x} has bits rdma-core 44 does not define",
            a.comp_mask
        );
        return Err(libc::EINVAL);
    }
    if !a.td.is_null() {
        log::error!("alloc_parent_domain: a thread domain, which this device does not make");
        return Err(libc::EINVAL);
    }
    // A parent domain's PD is a protection domain, not another parent domain.
    live::check(Kind::Pd, a.pd, "alloc_parent_domain")?;
    // SAFETY: a live PD.
    let p = unsafe { own::<Pd, _>(a.pd) }.ok_or(libc::EINVAL)?;
    if p.ibv.context != ctx {
        log::error!("alloc_parent_domain: the PD belongs to another context");
        return Err(libc::EINVAL);
    }
    let alloc = if a.comp_mask & ATTR_ALLOCATORS != 0 {
        match (a.alloc, a.free) {
            (Some(al), Some(fr)) => Some((al, fr)),
            _ => {
                log::error!("alloc_parent_domain: ALLOCATORS without both alloc and free");
                return Err(libc::EINVAL);
            }
        }
    } else {
        None
    };
    let pd_context = if a.comp_mask & ATTR_PD_CONTEXT != 0 {
        a.pd_context as usize
    } else {
        0
    };
    let parent = Parent {
        protection: a.pd,
        alloc,
        pd_context,
    };
    let b = Box::new(Pd::new(
        ctx,
        p.pd.clone(),
        p.engine.clone(),
        p.mr_table(),
        Some(parent),
    ));
    p.hold();
    let made = Box::into_raw(b);
    live::add(Kind::ParentPd, made, ctx);
    Ok(made as *mut IbvPd)
}

/// Whether `pd` is a live parent domain of context `ctx`.
pub(crate) fn is_parent_of(pd: *mut IbvPd, ctx: *mut IbvContext) -> bool {
    // SAFETY: a live parent domain is a Pd.
    live::is(Kind::ParentPd, pd) && unsafe { (*pd).context } == ctx
}

/// Memory from the application's allocator: handed back to its `free` when dropped.
struct AppMem {
    ptr: usize,
    free: FreeFn,
    pd: usize,
    pd_context: usize,
    res_type: u64,
}

impl Drop for AppMem {
    fn drop(&mut self) {
        // SAFETY: memory the allocator gave for this parent domain, no longer registered
        // (the ring's MR is dropped first) nor used.
        unsafe {
            (self.free)(
                self.pd as *mut IbvPd,
                self.pd_context as *mut c_void,
                self.ptr as *mut c_void,
                self.res_type,
            )
        }
    }
}

/// A registered buffer of the library: from the device's DMA memory, or placed by a parent
/// domain's allocator.
pub(crate) struct RingMem {
    // Field order is drop order: the registration goes before the memory is freed.
    mr: VMr,
    app: Option<AppMem>,
    len: usize,
}

impl RingMem {
    /// Its address.
    pub(crate) fn addr(&self) -> u64 {
        self.mr.addr()
    }

    /// Its key.
    pub(crate) fn key(&self) -> u32 {
        self.mr.key().get()
    }

    /// Its bytes (the card reads them only for the requests the caller posts).
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &self.app {
            None => self.mr.bytes_mut(),
            // SAFETY: `len` bytes the allocator gave, registered, owned by this ring alone.
            Some(m) => Some(unsafe { std::slice::from_raw_parts_mut(m.ptr as *mut u8, self.len) }),
        }
    }
}

/// `len` registered bytes with `access` for a QP on `pd`: from the parent domain's
/// allocator if `pd` is a parent domain with one (and it does not answer "use default"),
/// else from the device's DMA memory.
pub(crate) fn ring(pd: &Pd, len: usize, access: AccessFlags) -> Result<RingMem, c_int> {
    let Some((alloc, free)) = pd.parent.as_ref().and_then(|p| p.alloc) else {
        let mr = pd.pd.alloc_mr(len, access).map_err(fail)?;
        return Ok(RingMem { mr, app: None, len });
    };
    let pd_context = pd.parent.as_ref().map_or(0, |p| p.pd_context);
    let me = &pd.ibv as *const IbvPd as *mut IbvPd;
    // SAFETY: the application's allocator, called as rdma-core's providers do.
    let ptr = unsafe { alloc(me, pd_context as *mut c_void, len, RING_ALIGN, RES_TYPE_QP) };
    if ptr as usize == USE_DEFAULT {
        let mr = pd.pd.alloc_mr(len, access).map_err(fail)?;
        return Ok(RingMem { mr, app: None, len });
    }
    if ptr.is_null() {
        log::error!("the parent domain's allocator gave no memory for {len} bytes");
        return Err(libc::ENOMEM);
    }
    let app = AppMem {
        ptr: ptr as usize,
        free,
        pd: me as usize,
        pd_context,
        res_type: RES_TYPE_QP,
    };
    // SAFETY: the allocator's memory stays valid until `free`, which `AppMem` calls only
    // after the registration is dropped.
    let mr = unsafe { pd.pd.reg_mr(ptr as *mut u8, len, access) }.map_err(fail)?;
    Ok(RingMem {
        mr,
        app: Some(app),
        len,
    })
}
