//! Changing what an MR-table entry says after registration: re-registering an MR in place
//! (ibv_rereg_mr: new PD, access or translation under the same key) and memory windows
//! (a window is an MR-table entry of its own, with its own key, over a subrange of an MR).
//!
//! **Re-registration** keeps the key, so a peer holding the rkey keeps using it, unless the
//! PD changes: the card does not check PDs (hardware-contract.md 10), so an MR moved to
//! another PD takes a new key byte, and what was handed out under the old PD (a receive WR
//! posted on a QP of it, an rkey a peer of it holds) is refused from then on, as a PD
//! check would refuse it. A new
//! translation gets a new page-table range, written completely before the one
//! UpdateMrTable that switches the entry to it; the old range and pin go after. Work queued
//! on the MR is retired first and the card must have fetched every descriptor posted
//! before (`retire.rs`), as for dereg_mr. An MR with windows bound to it is not changed.
//!
//! **Windows.** [`Device::alloc_mw`] takes an MR-table slot (no card entry yet);
//! [`Device::bind_mw`] writes the card entry {window key, window range, remote access,
//! page-table offset into its MR's table}: the card checks key, access and bounds of a
//! WRITE (and the driver of a READ or an atomic) against the window exactly as against an
//! MR, and translates through the MR's pages. [`Device::invalidate_mw`] (unbind, local or
//! remote invalidation) writes the entry invalid (length 0) once the card has fetched every
//! descriptor posted before: the engine's READ responses name the key they were read
//! through, and an entry invalidated under an unfetched WQE stops the RTL.

use crate::addr::VirtAddr;
use crate::desc::AccessFlags;
use crate::keys::MrKey;
use crate::platform::MemoryResolver;
use crate::time::Instant;

use super::config::PGT_STAGING_SLOTS;
use super::error::VerbsError;
use super::mr::{check_mr_args, invalid_entry, mr_table_entry, MrSlot, MrState};
use super::{Device, Platform, Storage};

/// What rereg_mr waits for.
const REREG_WAIT: &str = "the send-ring fetch rereg_mr waits for";
/// What a window's invalidation waits for.
const INVALIDATE_WAIT: &str = "the send-ring fetch a memory window's invalidation waits for";

/// The remote rights a window can grant.
const WINDOW_ACCESS: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

impl<P: Platform, S: Storage> Device<P, S> {
    /// Re-registers the MR of `key` in place with PD `pd`, range `[va, va + len)` and
    /// `access`; returns its key, the same one unless the PD changed (then a new key byte).
    /// Blocks until the card has the new entry. On failure the MR is as it was (unless the
    /// card stopped answering the table update).
    pub fn rereg_mr(
        &mut self,
        key: MrKey,
        pd: u32,
        va: VirtAddr,
        len: u64,
        access: AccessFlags,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<MrKey, VerbsError> {
        let old = self.mr_slot(key)?;
        if old.window {
            return Err(VerbsError::NoSuchObject {
                what: "MR (a memory window's key)",
                handle: key.get(),
            });
        }
        self.check_pd(pd)?;
        check_mr_args(va, len, access)?;
        if self.windows_on(key) {
            return Err(VerbsError::Busy {
                what: "an MR with memory windows bound to it",
            });
        }
        let writes = |a: AccessFlags| {
            a.intersects(
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
            )
        };
        let same_range = old.va == va.0 && old.len == len;
        let new_key = if pd == old.pd {
            key
        } else {
            MrKey::new(key.index(), self.next_key())
                .filter(|k| *k != key)
                .or_else(|| MrKey::new(key.index(), key.key().wrapping_add(1)))
                .ok_or(VerbsError::OutOfResources { what: "MR table" })?
        };
        if !same_range || new_key != key {
            // Queued requests name addresses of the old translation.
            self.retire_mr_users(key);
        }
        let posted = self.send_mark();
        self.wait_send_fetched(posted, REREG_WAIT, clock)?;
        let mut new = MrSlot {
            key: new_key,
            va: va.0,
            len,
            access,
            pd,
            ..old
        };
        if same_range {
            if writes(access) != writes(old.access) {
                // The pin records whether the card may write: take it again.
                self.mem.unpin(va, len as usize);
                if let Err(e) = self.mem.pin(va, len as usize, writes(access)) {
                    // Undo: the old registration's pin (which succeeded before).
                    let _ = self.mem.pin(va, len as usize, writes(old.access));
                    return Err(e.into());
                }
            }
            self.commands.run(&self.regs, mr_table_entry(&new), clock)?;
        } else {
            let pages = self.cfg.page_size.pages_spanned(va.0, len) as u32;
            new.pages = pages;
            new.pgt_offset = self
                .pgt
                .alloc(pages)
                .ok_or(VerbsError::OutOfResources { what: "page table" })?;
            let done = self
                .mem
                .pin(va, len as usize, writes(access))
                .map_err(VerbsError::from)
                .and_then(|()| {
                    self.write_pgt(&new, clock)?;
                    self.commands.run(&self.regs, mr_table_entry(&new), clock)
                });
            if let Err(e) = done {
                // The card still has the old entry (or, if the table update itself failed,
                // an unknown one: the MR is then unusable, as the man page allows).
                self.mem.unpin(va, len as usize);
                self.pgt.free(new.pgt_offset, pages);
                return Err(e);
            }
            self.mem.unpin(VirtAddr(old.va), old.len as usize);
            self.pgt.free(old.pgt_offset, old.pages);
        }
        self.set_mr_entry(key, new);
        Ok(new_key)
    }

    /// Writes the page-table entries of `m` (blocking, one staging slot at a time).
    fn write_pgt(
        &mut self,
        m: &MrSlot,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let mut done = 0;
        while done < m.pages {
            let now = clock();
            self.commands.poll(&self.regs);
            // Registrations in progress hand their staging slots back as they go.
            self.advance_mr_jobs(now);
            let Some(slot) =
                (0..PGT_STAGING_SLOTS as u8).find(|s| self.staging_free & (1 << s) != 0)
            else {
                core::hint::spin_loop();
                continue;
            };
            match self.submit_pgt_update(m, done, slot, now) {
                Ok((t, n)) => {
                    self.staging_free &= !(1 << slot);
                    let r = self.commands.wait(&self.regs, t, clock);
                    self.staging_free |= 1 << slot;
                    r?;
                    done += n;
                }
                Err(VerbsError::Busy { .. }) => core::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether a window is bound to the MR of `key`.
    pub(crate) fn windows_on(&mut self, key: MrKey) -> bool {
        let s = self.storage.slices();
        s.mrs
            .iter()
            .any(|w| w.window && w.state == MrState::Valid && w.parent == Some(key))
    }

    /// Whether a window is bound under exactly `key` on PD `pd` (what a peer's
    /// SEND_WITH_INV may invalidate).
    pub(crate) fn window_bound_in(&mut self, key: MrKey, pd: u32) -> bool {
        self.mr_entry(key)
            .is_some_and(|w| w.window && w.state == MrState::Valid && w.key == key && w.pd == pd)
    }

    /// Allocates a memory window on PD `pd`: an MR-table slot and its key, bound to nothing
    /// (the card has no entry for it).
    pub fn alloc_mw(&mut self, pd: u32) -> Result<MrKey, VerbsError> {
        self.check_pd(pd)?;
        let slot = self.free_mr_slot()?;
        let key8 = self.next_key();
        let key = self
            .cfg
            .windows
            .mr_key_of_slot(slot, key8)
            .ok_or(VerbsError::OutOfResources { what: "MR table" })?;
        self.storage.slices().mrs[slot] = MrSlot {
            state: MrState::Registering,
            key,
            pd,
            window: true,
            ..MrSlot::default()
        };
        Ok(key)
    }

    /// The window slot of `mw` (any key byte: a bind changes it).
    fn window_slot(&mut self, mw: MrKey) -> Result<MrSlot, VerbsError> {
        match self.mr_entry(mw) {
            Some(w) if w.window && w.state != MrState::Free => Ok(*w),
            _ => Err(VerbsError::NoSuchObject {
                what: "memory window",
                handle: mw.get(),
            }),
        }
    }

    /// Binds the window `mw` under the key `new_key` (same index, any key byte) to
    /// `[va, va + len)` of the MR of `mr` with the remote rights `access`, replacing what it
    /// was bound to. The MR must be valid, on the window's PD, registered with MW_BIND and
    /// cover the range; REMOTE_WRITE or REMOTE_ATOMIC need its LOCAL_WRITE. Blocks until
    /// the card has the entry.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &mut self,
        mw: MrKey,
        new_key: MrKey,
        mr: MrKey,
        va: u64,
        len: u64,
        access: AccessFlags,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let w = self.window_slot(mw)?;
        if new_key.index() != mw.index() {
            return Err(VerbsError::InvalidArgument {
                what: "a window's new rkey must keep its index (only the key byte changes)",
            });
        }
        let m = self.mr_slot(mr)?;
        let bad = |what| Err(VerbsError::InvalidArgument { what });
        if m.window {
            return bad("a window binds to an MR, not to another window");
        }
        if m.pd != w.pd {
            return bad("the MR is on another PD than the window");
        }
        if !m.access.contains(AccessFlags::MW_BIND) {
            return bad("the MR was not registered with MW_BIND");
        }
        if !WINDOW_ACCESS.contains(access - AccessFlags::LOCAL_WRITE) {
            return bad("a window grants REMOTE_WRITE, REMOTE_READ and REMOTE_ATOMIC only");
        }
        let remote_writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if access.intersects(remote_writes) && !m.access.contains(AccessFlags::LOCAL_WRITE) {
            return bad("a window with REMOTE_WRITE or REMOTE_ATOMIC needs LOCAL_WRITE on its MR");
        }
        let inside =
            len > 0 && va >= m.va && va.checked_add(len).is_some_and(|end| end <= m.va + m.len);
        if !inside {
            return bad("the window's range is not inside its MR");
        }
        if w.state == MrState::Valid {
            self.retire_window(w.key, clock)?;
        }
        let page = self.cfg.page_size;
        let skip = ((page.base_of(va) - page.base_of(m.va)) / page.bytes()) as u32;
        let entry = MrSlot {
            state: MrState::Valid,
            key: new_key,
            va,
            len,
            access: access & WINDOW_ACCESS,
            pd: w.pd,
            pgt_offset: m.pgt_offset + skip,
            pages: 0,
            window: true,
            parent: Some(mr),
        };
        // Until the card has it, the slot is allocated and unbound.
        self.set_mr_entry(
            mw,
            MrSlot {
                state: MrState::Registering,
                key: new_key,
                ..w
            },
        );
        self.commands
            .run(&self.regs, mr_table_entry(&entry), clock)?;
        self.set_mr_entry(mw, entry);
        Ok(())
    }

    /// Invalidates the window bound under `key` (IBV_WR_LOCAL_INV, a SEND_WITH_INV from the
    /// peer, a zero-length bind): the card entry goes, the window stays allocated under the
    /// same key. An unbound window, or another key byte, is refused.
    pub fn invalidate_mw(
        &mut self,
        key: MrKey,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        match self.window_slot(key) {
            Ok(w) if w.state == MrState::Valid && w.key == key => {}
            _ => {
                return Err(VerbsError::NoSuchObject {
                    what: "bound memory window",
                    handle: key.get(),
                })
            }
        }
        self.retire_window(key, clock)
    }

    /// Frees the window `mw` (invalidated first if bound).
    pub fn dealloc_mw(
        &mut self,
        mw: MrKey,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let w = self.window_slot(mw)?;
        if w.state == MrState::Valid {
            self.retire_window(w.key, clock)?;
        }
        self.set_mr_entry(mw, MrSlot::default());
        Ok(())
    }

    /// Writes the bound window of `key` invalid in the card once nothing unfetched names
    /// it; its slot stays allocated, unbound.
    fn retire_window(
        &mut self,
        key: MrKey,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        self.retire_mr_users(key);
        let posted = self.send_mark();
        self.wait_send_fetched(posted, INVALIDATE_WAIT, clock)?;
        self.commands.run(&self.regs, invalid_entry(key), clock)?;
        if let Some(slot) = self.mr_entry(key) {
            *slot = MrSlot {
                state: MrState::Registering,
                key,
                pd: slot.pd,
                window: true,
                ..MrSlot::default()
            };
        }
        Ok(())
    }
}
