//! Changing a registration in place (`Mr::rereg`) and memory windows (`Mw`): the engine's
//! `rereg_mr` and window verbs (`bluerdma_core::engine`, `mr_change.rs`) behind the
//! device lock.

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::desc::AccessFlags;
use bluerdma_core::keys::MrKey;

use super::{err, Context, Error, Mr, Pd};

impl Mr {
    /// Re-registers the region in place on `pd` (a new PD, or this one), over
    /// `[addr, addr + len)` with `access`; the key stays unless the PD changes (see
    /// [`Mr::key`] after). On failure it is as it was.
    ///
    /// # Safety
    /// As [`Pd::reg_mr`] for the new range: it stays valid until the `Mr` is dropped (or
    /// re-registered again).
    pub unsafe fn rereg(
        &mut self,
        pd: &Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<(), Error> {
        if self.owned.is_some() && (addr as u64 != self.addr || len != self.len) {
            return Err(Error {
                op: "rereg_mr",
                kind: bluerdma_core::engine::VerbsError::InvalidArgument {
                    what: "a buffer the driver allocated keeps its translation",
                },
            });
        }
        let ctx = &pd.0.ctx;
        let mut clock = ctx.clock();
        self.key = ctx
            .lock()
            .rereg_mr(
                self.key,
                pd.0.pd,
                VirtAddr(addr as u64),
                len as u64,
                access,
                &mut clock,
            )
            .map_err(err("rereg_mr"))?;
        self.pd = pd.clone();
        self.addr = addr as u64;
        self.len = len;
        Ok(())
    }
}

/// A memory window: an MR-table entry of its own over a part of an MR, bound and
/// invalidated by the application. Dropping it frees it (invalidated first if bound).
pub struct Mw {
    pd: Pd,
    key: MrKey,
}

impl Pd {
    /// Allocates a memory window on this PD, bound to nothing.
    pub fn alloc_mw(&self) -> Result<Mw, Error> {
        let key = self
            .0
            .ctx
            .lock()
            .alloc_mw(self.0.pd)
            .map_err(err("alloc_mw"))?;
        Ok(Mw {
            pd: self.clone(),
            key,
        })
    }
}

impl Mw {
    /// Its key as allocated or last bound.
    pub fn key(&self) -> MrKey {
        self.key
    }

    /// Binds it under `new_key` (its index, any key byte) to `[va, va + len)` of `mr` with
    /// the remote rights `access`.
    pub fn bind(
        &mut self,
        new_key: MrKey,
        mr: &Mr,
        va: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(), Error> {
        let ctx = &self.pd.0.ctx;
        let mut clock = ctx.clock();
        ctx.lock()
            .bind_mw(self.key, new_key, mr.key, va, len, access, &mut clock)
            .map_err(err("bind_mw"))?;
        self.key = new_key;
        Ok(())
    }
}

impl Context {
    /// Invalidates the bound window of `key` (a local or remote invalidation names only
    /// the key); refused if no window is bound under it.
    pub fn invalidate_mw(&self, key: MrKey) -> Result<(), Error> {
        let mut clock = self.inner.clock();
        self.inner
            .lock()
            .invalidate_mw(key, &mut clock)
            .map_err(err("invalidate_mw"))
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let ctx = &self.pd.0.ctx;
        let mut clock = ctx.clock();
        if let Err(e) = ctx.lock().dealloc_mw(self.key, &mut clock) {
            log::error!("dealloc_mw({:#x}): {e}", self.key.get());
        }
    }
}
