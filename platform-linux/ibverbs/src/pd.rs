//! Protection domains, and the table each keeps of the memory regions registered in it:
//! what the library's own transports (UD, READ sinks) check before they touch an SGE's
//! bytes. A parent domain (`parent_domain.rs`) is a [`Pd`] too, sharing its protection
//! domain's engine PD and MR table, so every verb that takes a PD takes either.

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bluerdma_core::desc::AccessFlags;
use bluerdma_linux::verbs::{Context, Mr as VMr, Pd as VPd};

use crate::abi::*;
use crate::context::Ctx;
use crate::errors::{errno_rc, fail, or_null};
use crate::handle::free;
use crate::live::{self, Kind};

/// A parent domain's allocator and free function (`ibv_parent_domain_init_attr`).
pub(crate) type AllocFn =
    unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, usize, u64) -> *mut c_void;
pub(crate) type FreeFn = unsafe extern "C" fn(*mut IbvPd, *mut c_void, *mut c_void, u64);

/// What makes a [`Pd`] a parent domain (`parent_domain.rs`). Pointers are kept as addresses (the library's
/// objects are shared between threads; these are only handed back to the application).
pub(crate) struct Parent {
    /// The protection domain (held: it cannot be deallocated first).
    pub protection: *mut IbvPd,
    pub alloc: Option<(AllocFn, FreeFn)>,
    pub pd_context: usize,
}

// SAFETY: `protection` is a live PD for as long as the parent exists (it is held), and PDs
// are used from any thread; the allocators are the application's, which rdma-core calls
// from whichever thread creates a resource.
unsafe impl Send for Parent {}
// SAFETY: as above; nothing in `Parent` changes after creation.
unsafe impl Sync for Parent {}

#[repr(C)]
pub(crate) struct Pd {
    pub ibv: IbvPd,
    pub(crate) pd: VPd,
    pub engine: Arc<Context>,
    /// The PD's MRs by key, for SGE checks and READ sinks (see [`Pd::read_sink_key`]);
    /// a parent domain shares its protection domain's.
    mrs: Arc<Mutex<HashMap<u32, MrEntry>>>,
    /// MRs, QPs, SRQs, AHs and parent domains made from it: ibv_dealloc_pd is refused
    /// (EBUSY) while any is left.
    users: AtomicU32,
    /// For a parent domain: its protection domain and the application's allocators.
    pub(crate) parent: Option<Parent>,
}

/// What the library's transports need to know about a registered region.
pub(crate) struct MrEntry {
    pub addr: u64,
    pub len: usize,
    pub local_write: bool,
    pub remote_write: bool,
    /// A second registration of the same bytes with REMOTE_WRITE, made on the first READ
    /// into a region that lacks it.
    pub shadow: Option<VMr>,
}

impl Pd {
    /// A PD object for `pd` on `ctx`, sharing `mrs` (a new table for a protection domain,
    /// the protection domain's for a parent domain).
    pub(crate) fn new(
        ctx: *mut IbvContext,
        pd: VPd,
        engine: Arc<Context>,
        mrs: Arc<Mutex<HashMap<u32, MrEntry>>>,
        parent: Option<Parent>,
    ) -> Pd {
        Pd {
            ibv: IbvPd {
                context: ctx,
                handle: pd.handle(),
                _pad: 0,
            },
            pd,
            engine,
            mrs,
            users: AtomicU32::new(0),
            parent,
        }
    }

    /// The MR table, for a parent domain made on this PD.
    pub(crate) fn mr_table(&self) -> Arc<Mutex<HashMap<u32, MrEntry>>> {
        self.mrs.clone()
    }

    /// An object made from this PD holds it.
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// An object made from this PD is gone.
    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }

    /// The PD an object of it names.
    ///
    /// # Safety
    /// `pd` comes from ibv_alloc_pd and is not deallocated: the application keeps a PD
    /// while MRs and QPs made from it exist (deallocating it earlier is the application's
    /// error, as with the real library).
    pub(crate) unsafe fn of<'a>(pd: *mut IbvPd) -> &'a Pd {
        // SAFETY: the caller's contract; `ibv` is the first field.
        unsafe { &*(pd as *const Pd) }
    }

    /// Records a region registered with key `key`.
    pub(crate) fn add_mr(&self, key: u32, entry: MrEntry) {
        self.mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, entry);
    }

    /// Forgets the region of key `key` (deregistered), with its READ sink.
    pub(crate) fn remove_mr(&self, key: u32) {
        self.mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }

    /// Whether `[addr, addr + len)` lies in the PD's MR of key `lkey` (with LOCAL_WRITE
    /// when `write`): what a software transport checks before it touches an SGE's bytes.
    pub fn covers(&self, lkey: u32, addr: u64, len: u32, write: bool) -> bool {
        let mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        mrs.get(&lkey).is_some_and(|e| {
            (e.local_write || !write)
                && addr >= e.addr
                && addr
                    .checked_add(len.into())
                    .is_some_and(|end| end <= e.addr + e.len as u64)
        })
    }

    /// The key a READ into the region of `lkey` must name as its sink.
    ///
    /// The card accepts READ response packets only into an MR with REMOTE_WRITE
    /// (nic-behaviour.md 2.3 check 6), where verbs ask for LOCAL_WRITE; perftest's
    /// ib_read_bw registers LOCAL_WRITE | REMOTE_READ. So the first READ into such a region
    /// registers the same bytes again with REMOTE_WRITE and uses that key for every READ
    /// into it. The application's own key stays without REMOTE_WRITE; the sink key travels
    /// in READ requests, so a peer that reads it from the wire could write the region
    /// (README, hardware limitations).
    pub(crate) fn read_sink_key(&self, lkey: u32) -> Result<u32, c_int> {
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        // An unknown key is the engine's to refuse (LOC_PROT_ERR names it).
        let Some(e) = mrs.get_mut(&lkey) else {
            return Ok(lkey);
        };
        if e.remote_write {
            return Ok(lkey);
        }
        if let Some(s) = &e.shadow {
            return Ok(s.key().get());
        }
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // SAFETY: the same bytes as the application's registration, which the verbs
        // contract keeps valid until ibv_dereg_mr; the shadow is dropped with it.
        let shadow = unsafe { self.pd.reg_mr(e.addr as *mut u8, e.len, access) }.map_err(fail)?;
        let key = shadow.key().get();
        e.shadow = Some(shadow);
        Ok(key)
    }
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_alloc_pd(ctx: *mut IbvContext) -> *mut IbvPd {
    // SAFETY: forwarded contract.
    or_null(unsafe { alloc_pd(ctx) })
}

/// # Safety
/// `ctx` is NULL or an open context.
unsafe fn alloc_pd(ctx: *mut IbvContext) -> Result<*mut IbvPd, c_int> {
    live::check(Kind::Ctx, ctx, "alloc_pd")?;
    // SAFETY: a live context.
    let c = unsafe { Ctx::from_ibv(ctx) }.ok_or(libc::EINVAL)?;
    let engine = c.engine()?;
    let pd = engine.alloc_pd().map_err(fail)?;
    let b = Box::new(Pd::new(ctx, pd, engine, Arc::default(), None));
    let p = Box::into_raw(b);
    live::add(Kind::Pd, p, ctx);
    Ok(p as *mut IbvPd)
}

#[no_mangle]
pub unsafe extern "C" fn bv_ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    // SAFETY: the caller's contract, forwarded.
    errno_rc(unsafe { ibv_dealloc_pd(pd) })
}

/// The work of [`bv_ibv_dealloc_pd`] (a protection or a parent domain): 0, or the errno it
/// returns (and sets).
unsafe fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    let kind = if live::take(Kind::Pd, pd) {
        Kind::Pd
    } else if live::take(Kind::ParentPd, pd) {
        Kind::ParentPd
    } else {
        log::error!("dealloc_pd: {pd:p} is not a live PD (deallocated already?)");
        return libc::EINVAL;
    };
    // SAFETY: a live PD (just checked).
    let p = unsafe { Pd::of(pd) };
    let users = p.users.load(Ordering::Acquire);
    if users > 0 {
        // SAFETY: as above; still live.
        live::add(kind, pd, unsafe { (*pd).context });
        log::error!("dealloc_pd: {users} MRs, QPs, SRQs, AHs or parent domains still use the PD");
        return libc::EBUSY;
    }
    if let Some(parent) = &p.parent {
        // SAFETY: a parent domain holds its protection domain, which is therefore live.
        unsafe { Pd::of(parent.protection) }.release();
    }
    // SAFETY: made by ibv_alloc_pd or ibv_alloc_parent_domain; the caller gives it up and
    // nothing uses it.
    unsafe { free::<Pd, _>(pd) }
}

/// Refuses what is neither a live protection domain nor a live parent domain (EINVAL,
/// logged with the verb's name).
pub(crate) fn check(pd: *mut IbvPd, verb: &str) -> Result<(), c_int> {
    if live::is(Kind::ParentPd, pd) {
        return Ok(());
    }
    live::check(Kind::Pd, pd, verb)
}
