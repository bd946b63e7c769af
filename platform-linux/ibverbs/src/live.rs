//! The objects this library handed out and has not taken back, by address, with the
//! context each belongs to. A verb given an object that is not (or no longer) one of them
//! refuses it with EINVAL instead of touching freed memory (a second ibv_destroy_qp, an
//! ibv_dereg_mr after ibv_close_device); ibv_close_device finds here what a context still
//! holds and destroys it, as the kernel does for rdma-core; the asynchronous events find
//! the object an engine handle belongs to.
//!
//! Only the verbs that make, destroy, modify or query objects look here: the post and poll
//! paths take no global lock.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::abi::IbvContext;

/// What an object is, in the order ibv_close_device destroys what a context left: an
/// object before the ones it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// An RC or UD QP.
    Qp,
    Srq,
    Ah,
    /// A memory window: before the MR it is bound to.
    Mw,
    Mr,
    /// A parent domain: before the protection domain it holds.
    ParentPd,
    Pd,
    Cq,
    Channel,
    /// An open context (its own entry names itself).
    Ctx,
}

/// A live object: its kind and its context's `ibv_context`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub kind: Kind,
    pub ctx: usize,
}

static LIVE: Mutex<Option<HashMap<usize, Entry>>> = Mutex::new(None);

/// The table, locked.
pub(crate) struct Live(MutexGuard<'static, Option<HashMap<usize, Entry>>>);

impl Live {
    fn map(&mut self) -> &mut HashMap<usize, Entry> {
        self.0.get_or_insert_with(HashMap::new)
    }

    /// Every live object.
    pub(crate) fn iter(&mut self) -> impl Iterator<Item = (usize, Entry)> + '_ {
        self.map().iter().map(|(p, e)| (*p, *e))
    }

    /// Whether `ctx` is an open context.
    pub(crate) fn ctx_open(&mut self, ctx: usize) -> bool {
        self.map().get(&ctx).is_some_and(|e| e.kind == Kind::Ctx)
    }
}

/// Locks the table (briefly: no verb runs while it is held).
pub(crate) fn lock() -> Live {
    Live(LIVE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Records a new object of `kind` at `obj` on context `ctx`.
pub(crate) fn add<T>(kind: Kind, obj: *const T, ctx: *mut IbvContext) {
    lock().map().insert(
        obj as usize,
        Entry {
            kind,
            ctx: ctx as usize,
        },
    );
}

/// Whether `obj` is a live object of `kind`.
pub(crate) fn is<T>(kind: Kind, obj: *const T) -> bool {
    lock()
        .map()
        .get(&(obj as usize))
        .is_some_and(|e| e.kind == kind)
}

/// Takes `obj` (of `kind`) out of the table: false if it is not a live object of that kind
/// (already destroyed, or never made here), in which case nothing changes.
pub(crate) fn take<T>(kind: Kind, obj: *const T) -> bool {
    let mut live = lock();
    let map = live.map();
    if map.get(&(obj as usize)).is_some_and(|e| e.kind == kind) {
        map.remove(&(obj as usize));
        true
    } else {
        false
    }
}

/// How many live objects of `kind` this process has (for limits the library enforces).
pub(crate) fn count(kind: Kind) -> usize {
    lock().iter().filter(|(_, e)| e.kind == kind).count()
}

/// The objects context `ctx` still holds, in the order they are to be destroyed.
pub(crate) fn children(ctx: *mut IbvContext) -> Vec<(Kind, usize)> {
    let mut v: Vec<(Kind, usize)> = lock()
        .iter()
        .filter(|(p, e)| e.ctx == ctx as usize && *p != ctx as usize)
        .map(|(p, e)| (e.kind, p))
        .collect();
    v.sort();
    v
}

/// Refuses an object that is not a live one of `kind`: logs it, names the verb, and gives
/// the errno (EINVAL).
pub(crate) fn check<T>(kind: Kind, obj: *const T, verb: &str) -> Result<(), core::ffi::c_int> {
    if is(kind, obj) {
        Ok(())
    } else {
        log::error!("{verb}: {obj:p} is not a live {kind:?} of this library (destroyed already?)");
        Err(libc::EINVAL)
    }
}
