//! Pinning that holds (issue E item 5).
//!
//! `mlock` keeps pages resident, but memory compaction still migrates mlocked pages to
//! a new frame unless `vm.compact_unevictable_allowed` is 0 (measured on this machine
//! kind: after one forced compaction, 96 to 4,377 of 65,536 mlocked 4 KiB pages had a new
//! frame; with the sysctl at 0, or with hugetlb pages, none moved). The card keeps using
//! the old frame, so a moved page is silent memory corruption.
//!
//! So a pin is accepted only when its frames cannot move:
//! - hugetlb memory: compaction never migrates hugetlb pages; the range is faulted in
//!   (`MADV_POPULATE_WRITE`) rather than mlocked, since `mlock` of a part of a hugetlb
//!   mapping fails unless it is aligned to the hugepage size;
//! - other memory: mlocked, and only while `vm.compact_unevictable_allowed` is 0 (the
//!   doctor checks it), unless the caller chose [`CompactionPolicy::Allow`].

use std::fmt;

use bluerdma_core::addr::VirtAddr;

use super::vma::{backing, Backing};
use super::UmemError;
use crate::paths::{read_trimmed, SystemPaths};

/// What to do when compaction could move a pinned range's frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompactionPolicy {
    /// Refuse the pin with [`UmemError::Movable`] (the default: a moved frame corrupts
    /// memory silently).
    #[default]
    Refuse,
    /// Pin anyway and log a warning (for tests and emulation, where no card reads frames).
    Allow,
}

/// Why a pinned range's frames stay where they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stability {
    /// Hugetlb pages, which compaction does not migrate.
    Hugetlb,
    /// Mlocked pages with `vm.compact_unevictable_allowed=0`.
    CompactionOff,
    /// Mlocked pages that compaction may move (allowed by [`CompactionPolicy::Allow`]).
    Unprotected,
}

impl fmt::Display for Stability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stability::Hugetlb => "hugetlb pages",
            Stability::CompactionOff => "mlocked, vm.compact_unevictable_allowed=0",
            Stability::Unprotected => "mlocked, but compaction may move the frames",
        })
    }
}

/// Whether memory compaction may migrate mlocked pages (`vm.compact_unevictable_allowed`).
/// A kernel without the sysctl (no compaction) reads as `false`.
pub fn compaction_moves_locked_pages(paths: &SystemPaths) -> Result<bool, UmemError> {
    let path = paths.vm_sysctl("compact_unevictable_allowed");
    match read_trimmed(&path) {
        Ok(v) => Ok(v != "0"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(UmemError::Proc {
            path,
            errno: e.raw_os_error().unwrap_or(0),
        }),
    }
}

/// The base-page-aligned range that covers `[va, va + len)`.
fn page_range(va: VirtAddr, len: u64) -> Result<(u64, u64), UmemError> {
    let page = super::pagemap::base_page_size();
    let end =
        va.0.checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(page))
            .ok_or(UmemError::BadRange { va, len })?;
    Ok((va.0 - va.0 % page, end))
}

/// The OS error number of the last failed call.
fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// mlocks `[start, end)`.
pub(crate) fn lock(va: VirtAddr, len: u64, start: u64, end: u64) -> Result<(), UmemError> {
    // SAFETY: mlock changes no memory contents; an unmapped range is an error, not UB.
    if unsafe { libc::mlock(start as *const libc::c_void, (end - start) as usize) } == 0 {
        return Ok(());
    }
    let errno = errno();
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let have_limit = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    if (errno == libc::ENOMEM || errno == libc::EPERM)
        && have_limit
        && limit.rlim_cur != libc::RLIM_INFINITY
    {
        return Err(UmemError::LockLimit {
            va,
            len,
            limit: limit.rlim_cur,
        });
    }
    Err(UmemError::Lock { va, len, errno })
}

/// munlocks `[start, end)`.
pub(crate) fn unlock(start: u64, end: u64) {
    // SAFETY: munlock changes no memory contents.
    if unsafe { libc::munlock(start as *const libc::c_void, (end - start) as usize) } != 0 {
        log::warn!(
            "munlock {start:#x}..{end:#x}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Faults in a hugetlb range (writable if possible) so that every page has its frame.
fn populate(va: VirtAddr, len: u64, start: u64, end: u64) -> Result<(), UmemError> {
    let n = (end - start) as usize;
    for advice in [libc::MADV_POPULATE_WRITE, libc::MADV_POPULATE_READ] {
        // SAFETY: populating faults pages in as an access would; it changes no contents.
        if unsafe { libc::madvise(start as *mut libc::c_void, n, advice) } == 0 {
            return Ok(());
        }
    }
    // Kernels before 5.14 lack MADV_POPULATE_*: fall back to mlock of whole hugepages.
    let huge = 2u64 << 20;
    let (s, e) = (start - start % huge, end.next_multiple_of(huge));
    lock(va, len, s, e)?;
    Ok(())
}

/// A pinned range: its frames cannot move until the guard is dropped.
#[derive(Debug)]
pub struct PinGuard {
    va: VirtAddr,
    len: u64,
    locked: Option<(u64, u64)>,
    backing: Backing,
    stability: Stability,
}

impl PinGuard {
    /// Pins `[va, va + len)`: checks that it is mapped, how it is backed, and that its
    /// frames will stay put under `policy`; then faults it in (hugetlb) or mlocks it.
    pub fn new(
        paths: &SystemPaths,
        va: VirtAddr,
        len: u64,
        policy: CompactionPolicy,
    ) -> Result<Self, UmemError> {
        let (start, end) = page_range(va, len)?;
        let backing = backing(paths, va, len)?;
        let stability = match backing {
            Backing::Hugetlb => Stability::Hugetlb,
            Backing::Ordinary if !compaction_moves_locked_pages(paths)? => Stability::CompactionOff,
            Backing::Ordinary => match policy {
                CompactionPolicy::Refuse => return Err(UmemError::Movable { va, len }),
                CompactionPolicy::Allow => {
                    log::warn!("{}", UmemError::Movable { va, len });
                    Stability::Unprotected
                }
            },
        };
        let locked = match backing {
            Backing::Hugetlb => {
                populate(va, len, start, end)?;
                None
            }
            Backing::Ordinary => {
                lock(va, len, start, end)?;
                Some((start, end))
            }
        };
        Ok(Self {
            va,
            len,
            locked,
            backing,
            stability,
        })
    }

    /// The pinned range's start.
    pub fn va(&self) -> VirtAddr {
        self.va
    }

    /// The pinned range's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What backs the range.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Why its frames stay put.
    pub fn stability(&self) -> Stability {
        self.stability
    }

    /// Gives up the guard without unlocking (the caller unlocks what no other pin needs).
    pub(crate) fn into_locked(self) -> Option<(u64, u64)> {
        let locked = self.locked;
        std::mem::forget(self);
        locked
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some((s, e)) = self.locked {
            unlock(s, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_range_rounds_outwards_and_rejects_wrapping() {
        let p = super::super::pagemap::base_page_size();
        assert_eq!(page_range(VirtAddr(p + 1), 2), Ok((p, 2 * p)));
        assert_eq!(page_range(VirtAddr(p), p), Ok((p, 2 * p)));
        assert!(matches!(
            page_range(VirtAddr(u64::MAX - 1), 10),
            Err(UmemError::BadRange { .. })
        ));
    }

    #[test]
    fn the_sysctl_decides_whether_locked_pages_move() {
        let dir = tempfile::tempdir().unwrap();
        let paths = SystemPaths::under(dir.path());
        // No such sysctl: a kernel without compaction.
        assert_eq!(compaction_moves_locked_pages(&paths), Ok(false));
        std::fs::create_dir_all(paths.vm_sysctl("")).unwrap();
        std::fs::write(paths.vm_sysctl("compact_unevictable_allowed"), "1\n").unwrap();
        assert_eq!(compaction_moves_locked_pages(&paths), Ok(true));
        std::fs::write(paths.vm_sysctl("compact_unevictable_allowed"), "0\n").unwrap();
        assert_eq!(compaction_moves_locked_pages(&paths), Ok(false));
    }
}
