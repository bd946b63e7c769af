//! Memory regions: keys, the page-table allocator, and registration as a job that the
//! command queue completes. A registration pins the range, writes its page table (16
//! entries per UpdatePGT, several in flight, each in its own staging slot) and only after
//! every page-table update succeeded the MR table entry, so the card never sees an MR whose
//! pages are not there yet. [`Device::reg_mr_start`] submits and returns at once; `poll`
//! (or [`Device::reg_mr_poll`]) moves the job on; [`Device::reg_mr`] is the blocking helper.

use crate::addr::{DeviceAddr, VirtAddr};
use crate::desc::cmd::{CmdRequest, UpdateMrTable};
use crate::desc::pgt::{stage_pgt_update, DRIVER_ENTRIES_PER_UPDATE};
use crate::desc::AccessFlags;
use crate::keys::{MrKey, PGT_LEN};
use crate::platform::MemoryResolver;
use crate::time::Instant;

use super::command::Ticket;
use super::config::{PGT_STAGING_SLOT, PGT_STAGING_SLOTS};
use super::error::VerbsError;
use super::retire::DEREG_WAIT;
use super::wr::WcStatus;
use super::{Device, Platform, Storage};

/// Registrations in progress at once.
pub(crate) const MR_JOBS: usize = 4;

/// Where an MR table slot is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum MrState {
    #[default]
    Free,
    /// Its page table is being written: not usable yet.
    Registering,
    /// In the card's MR table.
    Valid,
}

/// A registered memory region.
#[derive(Clone, Copy, Debug, Default)]
pub struct MrSlot {
    pub(super) state: MrState,
    /// The key (lkey = rkey).
    pub(super) key: MrKey,
    pub(super) va: u64,
    pub(super) len: u64,
    pub(super) access: AccessFlags,
    pub(super) pd: u32,
    /// First page-table index and the number of entries.
    pub(super) pgt_offset: u32,
    pub(super) pages: u32,
    /// A memory window's entry (`mr_change.rs`): it pins nothing and owns no page table;
    /// `pgt_offset` points into its MR's.
    pub(super) window: bool,
    /// The MR a bound window is over.
    pub(super) parent: Option<MrKey>,
}

impl MrSlot {
    /// Whether the slot holds an MR (registered or being registered).
    #[inline]
    pub fn in_use(&self) -> bool {
        self.state != MrState::Free
    }

    /// The PD of a slot in use (registered or registering).
    #[inline]
    pub(crate) fn pd_in_use(&self) -> Option<u32> {
        (self.state != MrState::Free).then_some(self.pd)
    }

    /// Whether `[va, va + len)` lies in this valid MR of `key`, with `access` (and PD `pd`).
    #[inline]
    pub(crate) fn covers(
        &self,
        key: MrKey,
        va: u64,
        len: u32,
        access: AccessFlags,
        pd: Option<u32>,
    ) -> bool {
        let inside = va >= self.va
            && va
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.va + self.len);
        self.state == MrState::Valid
            && self.key == key
            && inside
            && self.access.contains(access)
            && pd.is_none_or(|p| p == self.pd)
    }
}

/// Which page-table entries are taken (first fit over a bitmap).
pub(crate) type PgtAllocator = super::ranges::RunMap<{ (PGT_LEN / 64) as usize }>;

/// The engine's window of the card's page table: offsets it hands out and takes back are
/// card offsets (`pgt_offset`), the bitmap counts from the window's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PgtWindow {
    map: PgtAllocator,
    base: u32,
}

impl PgtWindow {
    /// The entries of `window` (inside `0..PGT_LEN`: `TableWindows::validate`), all free.
    pub(crate) fn new(window: &core::ops::Range<u32>) -> Self {
        PgtWindow {
            map: PgtAllocator::new(window.end.saturating_sub(window.start)),
            base: window.start,
        }
    }

    /// Takes the first run of `n` free entries; its card offset.
    pub(crate) fn alloc(&mut self, n: u32) -> Option<u32> {
        self.map.alloc(n).map(|at| at + self.base)
    }

    /// Gives back `n` entries from card offset `offset` (nothing outside the window).
    pub(crate) fn free(&mut self, offset: u32, n: u32) {
        if let Some(at) = offset.checked_sub(self.base) {
            self.map.free(at, n);
        }
    }
}

/// A registration in progress, to ask about with [`Device::reg_mr_poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingMr {
    job: u8,
    key: MrKey,
}

/// The state of one registration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrJob {
    key: MrKey,
    /// Pages whose update was submitted.
    submitted: u32,
    /// Page-table updates in flight, with the staging slot each holds.
    in_flight: [Option<(Ticket, u8)>; PGT_STAGING_SLOTS],
    table: Option<Ticket>,
    failed: Option<VerbsError>,
    done: bool,
}

impl<P: Platform, S: Storage> Device<P, S> {
    /// Registers `[va, va + len)` and waits for the card (the blocking helper around
    /// [`Device::reg_mr_start`]). Returns the key (lkey = rkey).
    pub fn reg_mr(
        &mut self,
        pd: u32,
        va: VirtAddr,
        len: u64,
        access: AccessFlags,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<MrKey, VerbsError> {
        let pending = self.reg_mr_start(pd, va, len, access, clock())?;
        loop {
            if let Some(r) = self.reg_mr_poll(pending, clock()) {
                return r;
            }
            core::hint::spin_loop();
        }
    }

    /// Starts a registration: checks the arguments, takes an MR slot and page-table range,
    /// pins the memory and submits the first page-table updates. The MR is usable once
    /// [`Device::reg_mr_poll`] returns its key.
    pub fn reg_mr_start(
        &mut self,
        pd: u32,
        va: VirtAddr,
        len: u64,
        access: AccessFlags,
        now: Instant,
    ) -> Result<PendingMr, VerbsError> {
        self.check_pd(pd)?;
        check_mr_args(va, len, access)?;
        let remote_writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        let job = self
            .mr_jobs
            .iter()
            .position(Option::is_none)
            .ok_or(VerbsError::Busy {
                what: "MR registrations in progress",
            })?;
        let slot = self.free_mr_slot()?;
        let pages = self.cfg.page_size.pages_spanned(va.0, len) as u32;
        let pgt_offset = self
            .pgt
            .alloc(pages)
            .ok_or(VerbsError::OutOfResources { what: "page table" })?;
        let writes = access.intersects(AccessFlags::LOCAL_WRITE | remote_writes);
        if let Err(e) = self.mem.pin(va, len as usize, writes) {
            self.pgt.free(pgt_offset, pages);
            return Err(e.into());
        }
        let key8 = self.next_key();
        let Some(key) = self.cfg.windows.mr_key_of_slot(slot, key8) else {
            self.mem.unpin(va, len as usize);
            self.pgt.free(pgt_offset, pages);
            return Err(VerbsError::OutOfResources { what: "MR table" });
        };
        self.storage.slices().mrs[slot] = MrSlot {
            state: MrState::Registering,
            key,
            va: va.0,
            len,
            access,
            pd,
            pgt_offset,
            pages,
            window: false,
            parent: None,
        };
        self.mr_jobs[job] = Some(MrJob {
            key,
            submitted: 0,
            in_flight: [None; PGT_STAGING_SLOTS],
            table: None,
            failed: None,
            done: false,
        });
        self.advance_mr_job(job, now);
        Ok(PendingMr {
            job: job as u8,
            key,
        })
    }

    /// How a registration ended: `None` while the card works on it. Takes the card's
    /// command responses first. A failed registration has released everything it took.
    pub fn reg_mr_poll(&mut self, p: PendingMr, now: Instant) -> Option<Result<MrKey, VerbsError>> {
        self.commands.poll(&self.regs);
        let j = p.job as usize;
        match self.mr_jobs.get(j).copied().flatten() {
            Some(job) if job.key == p.key => {}
            _ => {
                return Some(Err(VerbsError::NoSuchObject {
                    what: "MR registration",
                    handle: p.key.get(),
                }))
            }
        }
        self.advance_mr_job(j, now);
        let job = self.mr_jobs[j]?;
        if !job.done {
            return None;
        }
        self.mr_jobs[j] = None;
        let Some(m) = self.mr_entry(job.key).map(|m| *m) else {
            // The job's key names a slot of this engine (it made the key): not reached.
            return Some(Err(VerbsError::NoSuchObject {
                what: "MR registration",
                handle: p.key.get(),
            }));
        };
        Some(match job.failed {
            None => {
                self.set_mr_entry(
                    job.key,
                    MrSlot {
                        state: MrState::Valid,
                        ..m
                    },
                );
                Ok(job.key)
            }
            Some(e) => {
                self.mem.unpin(VirtAddr(m.va), m.len as usize);
                self.pgt.free(m.pgt_offset, m.pages);
                self.set_mr_entry(job.key, MrSlot::default());
                Err(e)
            }
        })
    }

    /// Moves every registration on (from `poll`).
    pub(crate) fn advance_mr_jobs(&mut self, now: Instant) -> bool {
        let mut any = false;
        for j in 0..MR_JOBS {
            if self.mr_jobs[j].is_some_and(|job| !job.done) {
                any |= self.advance_mr_job(j, now);
            }
        }
        any
    }

    /// Collects the job's finished commands and submits what may go next; returns whether
    /// anything changed.
    fn advance_mr_job(&mut self, j: usize, now: Instant) -> bool {
        // A finished job waits for its `reg_mr_poll`; its tickets are spent (checking the
        // table update's again failed the registration when the progress thread finished
        // the job between two polls of the caller).
        let Some(mut job) = self.mr_jobs[j].filter(|job| !job.done) else {
            return false;
        };
        let mut changed = false;
        for f in job.in_flight.iter_mut() {
            let Some((t, slot)) = *f else { continue };
            let Some(r) = self.commands.check(t, now) else {
                continue;
            };
            changed = true;
            *f = None;
            self.staging_free |= 1 << slot;
            if let Err(e) = r {
                job.failed.get_or_insert(e);
            }
        }
        let Some(m) = self.mr_entry(job.key).map(|m| *m) else {
            // Not reached: the job's key is one this engine made, in its MR window.
            job.failed.get_or_insert(VerbsError::NoSuchObject {
                what: "MR registration",
                handle: job.key.get(),
            });
            job.done = job.in_flight.iter().all(Option::is_none);
            self.mr_jobs[j] = Some(job);
            return true;
        };
        while job.failed.is_none() && job.submitted < m.pages {
            let Some(slot) =
                (0..PGT_STAGING_SLOTS as u8).find(|s| self.staging_free & (1 << s) != 0)
            else {
                break;
            };
            match self.submit_pgt_update(&m, job.submitted, slot, now) {
                Ok((t, n)) => {
                    self.staging_free &= !(1 << slot);
                    if let Some(f) = job.in_flight.iter_mut().find(|f| f.is_none()) {
                        *f = Some((t, slot));
                    }
                    job.submitted += n;
                    changed = true;
                }
                Err(VerbsError::Busy { .. }) => break,
                Err(e) => job.failed = Some(e),
            }
        }
        let idle = job.in_flight.iter().all(Option::is_none);
        if job.failed.is_none() && idle && job.submitted >= m.pages {
            match job.table {
                None => match self.commands.submit(&self.regs, mr_table_entry(&m), now) {
                    Ok(t) => {
                        job.table = Some(t);
                        changed = true;
                    }
                    Err(VerbsError::Busy { .. }) => {}
                    Err(e) => job.failed = Some(e),
                },
                Some(t) => {
                    if let Some(r) = self.commands.check(t, now) {
                        changed = true;
                        job.failed = r.err();
                        job.done = true;
                    }
                }
            }
        }
        if job.failed.is_some() && idle {
            job.done = true;
        }
        self.mr_jobs[j] = Some(job);
        changed
    }

    /// Translates and stages the page-table entries of `m` from page `done` into staging
    /// slot `slot` and submits their UpdatePGT; returns the ticket and the entry count.
    pub(super) fn submit_pgt_update(
        &mut self,
        m: &MrSlot,
        done: u32,
        slot: u8,
        now: Instant,
    ) -> Result<(Ticket, u32), VerbsError> {
        let page = self.cfg.page_size;
        let n = (m.pages - done).min(DRIVER_ENTRIES_PER_UPDATE as u32) as usize;
        let mut entries = [DeviceAddr(0); DRIVER_ENTRIES_PER_UPDATE];
        let first = VirtAddr(page.base_of(m.va) + done as u64 * page.bytes());
        self.mem.translate(first, page, &mut entries[..n])?;
        let staging = self.staging.as_mut().ok_or(VerbsError::Unsupported {
            what: "closed device",
        })?;
        let at = slot as usize * PGT_STAGING_SLOT;
        let dev = DeviceAddr(staging.device_addr().0 + at as u64);
        let bytes = staging
            .as_mut_slice()
            .get_mut(at..at + PGT_STAGING_SLOT)
            .ok_or(VerbsError::OutOfResources {
                what: "page-table staging",
            })?;
        let cmd = stage_pgt_update(bytes, dev, m.pgt_offset + done, &entries[..n])?;
        let t = self
            .commands
            .submit(&self.regs, CmdRequest::UpdatePgt(cmd), now)?;
        Ok((t, n as u32))
    }

    /// Deregisters an MR. Work still queued on it is retired first (below), so nothing
    /// naming it reaches the send ring any more; the card-side invalidation (mr_length 0)
    /// then waits until the card has fetched every send-ring descriptor posted before,
    /// which may name it (a WQE whose lkey has no valid MR entry stops the RTL: `retire`).
    /// Then the memory is unpinned and the key and page-table range freed. A card that
    /// stops fetching or does not answer fails the call (CommandTimeout) and leaves the MR
    /// registered.
    pub fn dereg_mr(
        &mut self,
        key: MrKey,
        clock: &mut dyn FnMut() -> Instant,
    ) -> Result<(), VerbsError> {
        let slot = self.mr_slot(key)?;
        if slot.window {
            return Err(VerbsError::NoSuchObject {
                what: "MR (a memory window's key)",
                handle: key.get(),
            });
        }
        if self.windows_on(key) {
            return Err(VerbsError::Busy {
                what: "an MR with memory windows bound to it",
            });
        }
        self.retire_mr_users(key);
        let posted = self.send_mark();
        self.wait_send_fetched(posted, DEREG_WAIT, clock)?;
        self.commands.run(&self.regs, invalid_entry(key), clock)?;
        self.mem.unpin(VirtAddr(slot.va), slot.len as usize);
        self.pgt.free(slot.pgt_offset, slot.pages);
        self.set_mr_entry(key, MrSlot::default());
        Ok(())
    }

    /// Work still queued on an MR that is being deregistered must never reach the card (a
    /// WQE with an invalid lkey stops the RTL). Internal READ responses using it are dropped
    /// (the requester times out, as if the data were gone); an application request still
    /// using it fails its QP with LOC_PROT_ERR.
    pub(super) fn retire_mr_users(&mut self, key: MrKey) {
        for i in self.qp_indices() {
            let mut app_user = false;
            self.sq(i).for_each(|w| {
                if w.lkey() != key || w.is_done() {
                    return;
                }
                if w.is_internal() {
                    w.state = super::wqe::WqeState::Acked;
                } else {
                    app_user = true;
                }
            });
            if app_user {
                self.fail_qp(i, WcStatus::LocProtErr);
            } else {
                self.complete_head(i);
            }
        }
    }

    /// A free MR storage slot with an index in the MR window (`TableWindows`: its key is
    /// `mr_key_of_slot`).
    pub(super) fn free_mr_slot(&mut self) -> Result<usize, VerbsError> {
        let s = self.storage.slices();
        let n = self.cfg.windows.mr_slots(s.mrs.len());
        s.mrs[..n]
            .iter()
            .position(|m| m.state == MrState::Free)
            .ok_or(VerbsError::OutOfResources { what: "MR table" })
    }

    /// The storage entry of the MR table index of `key` (any key byte, any state); `None`
    /// outside this engine's window or storage.
    pub(super) fn mr_entry(&mut self, key: MrKey) -> Option<&mut MrSlot> {
        let slot = self.cfg.windows.mr_slot(key)?;
        let mrs = self.storage.slices().mrs;
        mrs.get_mut(slot)
    }

    /// Sets the storage entry of the MR table index of `key` (one of this engine's keys).
    pub(super) fn set_mr_entry(&mut self, key: MrKey, m: MrSlot) {
        if let Some(e) = self.mr_entry(key) {
            *e = m;
        }
    }

    /// The valid MR of `key`.
    pub(crate) fn mr_slot(&mut self, key: MrKey) -> Result<MrSlot, VerbsError> {
        match self.mr_entry(key) {
            Some(m) if m.state == MrState::Valid && m.key == key => Ok(*m),
            _ => Err(VerbsError::NoSuchObject {
                what: "MR",
                handle: key.get(),
            }),
        }
    }

    /// Whether `[va, va + len)` lies in the MR of `key` with `access` (and PD `pd`).
    pub(crate) fn mr_covers(
        &mut self,
        key: MrKey,
        va: u64,
        len: u32,
        access: AccessFlags,
        pd: Option<u32>,
    ) -> bool {
        self.mr_entry(key)
            .is_some_and(|m| m.covers(key, va, len, access, pd))
    }
}

/// The checks of a registration's range and access (ibv_reg_mr(3)).
pub(super) fn check_mr_args(va: VirtAddr, len: u64, access: AccessFlags) -> Result<(), VerbsError> {
    if len == 0 || len > u32::MAX as u64 {
        return Err(VerbsError::InvalidArgument {
            what: "MR length must be 1..=4 GiB-1 (the card's field is 32 bits)",
        });
    }
    if va.0.checked_add(len).is_none() {
        return Err(VerbsError::InvalidArgument {
            what: "MR range wraps the address space",
        });
    }
    let remote_writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(remote_writes) && !access.contains(AccessFlags::LOCAL_WRITE) {
        // A remote peer may not write what the local side may not.
        return Err(VerbsError::InvalidArgument {
            what: "MR access REMOTE_WRITE or REMOTE_ATOMIC needs LOCAL_WRITE",
        });
    }
    Ok(())
}

/// The MR table entry that makes the entry of `key` invalid (length 0).
#[inline]
pub(super) fn invalid_entry(key: MrKey) -> CmdRequest {
    CmdRequest::UpdateMrTable(UpdateMrTable {
        mr_base_va: VirtAddr(0),
        mr_length: 0,
        mr_key: key,
        pd: 0,
        acc_flags: AccessFlags::empty(),
        pgt_offset: 0,
    })
}

/// The MR table entry that makes `m` valid in the card.
#[inline]
pub(super) fn mr_table_entry(m: &MrSlot) -> CmdRequest {
    CmdRequest::UpdateMrTable(UpdateMrTable {
        mr_base_va: VirtAddr(m.va),
        mr_length: m.len as u32,
        mr_key: m.key,
        pd: m.pd,
        acc_flags: m.access,
        pgt_offset: m.pgt_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_table_is_allocated_first_fit_and_reused() {
        let mut p = PgtAllocator::new(PGT_LEN);
        assert_eq!(p.alloc(0), None);
        assert_eq!(p.alloc(10), Some(0));
        assert_eq!(p.alloc(5), Some(10));
        p.free(0, 10);
        assert_eq!(p.alloc(11), Some(15), "the hole of 10 is too small");
        assert_eq!(p.alloc(10), Some(0));
        assert_eq!(p.alloc(PGT_LEN), None);
    }

    #[test]
    fn a_page_table_window_hands_out_card_offsets_inside_it_only() {
        let mut p = PgtWindow::new(&(1000..1100));
        assert_eq!(p.alloc(60), Some(1000));
        assert_eq!(p.alloc(41), None, "40 left");
        assert_eq!(p.alloc(40), Some(1060));
        p.free(1000, 60);
        // An offset below the window frees nothing.
        p.free(10, 5);
        assert_eq!(p.alloc(61), None);
        assert_eq!(p.alloc(60), Some(1000));
        let mut whole = PgtWindow::new(&(0..PGT_LEN));
        assert_eq!(whole.alloc(PGT_LEN), Some(0));
    }

    #[test]
    fn an_mr_covers_only_its_range_key_access_and_pd() {
        let key = MrKey::new(3, 0x42).unwrap();
        let m = MrSlot {
            state: MrState::Valid,
            key,
            va: 0x1000,
            len: 0x100,
            access: AccessFlags::LOCAL_WRITE,
            pd: 2,
            pgt_offset: 0,
            pages: 1,
            window: false,
            parent: None,
        };
        let lw = AccessFlags::LOCAL_WRITE;
        let none = AccessFlags::empty();
        assert!(m.covers(key, 0x1000, 0x100, lw, Some(2)));
        assert!(
            !m.covers(key, 0x1001, 0x100, lw, Some(2)),
            "one byte past the end"
        );
        assert!(!m.covers(key, 0xFFF, 1, none, None));
        assert!(
            !m.covers(MrKey::new(3, 0x43).unwrap(), 0x1000, 1, none, None),
            "stale key"
        );
        assert!(!m.covers(key, 0x1000, 1, AccessFlags::REMOTE_READ, None));
        assert!(!m.covers(key, 0x1000, 1, none, Some(3)), "another PD");
        assert!(!m.covers(key, u64::MAX, 2, none, None), "wrapping range");
        let registering = MrSlot {
            state: MrState::Registering,
            ..m
        };
        assert!(!registering.covers(key, 0x1000, 1, none, None));
        assert_eq!(registering.pd_in_use(), Some(2));
    }
}
