//! What backs a range of this process's memory, from `/proc/self/maps`.
//!
//! Registration needs three facts the page map does not give: whether the whole range is
//! mapped, whether the process may write it (the kernel's pinning refuses read-only memory
//! for a registration that lets the card write, with EFAULT, and so does
//! [`check_access`]), and whether it is hugetlb memory. Hugetlb pages are never moved by compaction
//! and each is physically contiguous (at least 2 MiB on x86-64), so their frames can be
//! read once per 2 MiB; any other memory must be read page by page and needs
//! `vm.compact_unevictable_allowed=0` to stay put (issue E item 5).
//!
//! Anonymous `MAP_HUGETLB` mappings show as `/anon_hugepage`, files on a hugetlbfs mount by
//! their path; for a hugetlb memfd or SysV segment (`/memfd:...`, `/SYSV...`) the VMA's
//! `KernelPageSize` in `/proc/self/smaps` decides.

use std::fs;
use std::path::Path;

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::platform::{check_mapped, MappedRange, PlatformError};

use super::UmemError;
use crate::paths::SystemPaths;

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// `r` in the permissions.
    pub read: bool,
    /// `w` in the permissions.
    pub write: bool,
    /// The path column (empty for anonymous memory).
    pub path: String,
}

/// Parses the text of a `maps` file; lines that do not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<Vma> {
    text.lines()
        .filter_map(|line| {
            let mut cols = line.splitn(6, ' ');
            let range = cols.next()?;
            let (s, e) = range.split_once('-')?;
            let start = u64::from_str_radix(s, 16).ok()?;
            let end = u64::from_str_radix(e, 16).ok()?;
            let perms = cols.next()?.as_bytes();
            // offset, dev, inode, then the path after padding.
            let path = cols.nth(3).unwrap_or("").trim().to_owned();
            Some(Vma {
                start,
                end,
                read: perms.first() == Some(&b'r'),
                write: perms.get(1) == Some(&b'w'),
                path,
            })
        })
        .collect()
}

/// What kind of memory backs a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Hugetlb pages throughout.
    Hugetlb,
    /// Ordinary (4 KiB, possibly transparent-huge) pages somewhere in the range.
    Ordinary,
}

/// The mount points of hugetlbfs file systems in a `mounts` file's text.
fn hugetlbfs_mounts(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let (_dev, point, fstype) = (cols.next()?, cols.next()?, cols.next()?);
            (fstype == "hugetlbfs").then(|| point.to_owned())
        })
        .collect()
}

fn is_hugetlb_path(path: &str, mounts: &[String]) -> bool {
    let path = path.trim_end_matches(" (deleted)");
    path == "/anon_hugepage"
        || mounts
            .iter()
            .any(|m| Path::new(path).starts_with(m) && path.len() > m.len())
}

/// `KernelPageSize` of the VMA starting at `start`, from an `smaps` file's text, in bytes.
fn smaps_page_size(text: &str, start: u64) -> Option<u64> {
    let mut inside = false;
    for line in text.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((s, _)) = range.split_once('-') {
                if let Ok(s) = u64::from_str_radix(s, 16) {
                    inside = s == start;
                    continue;
                }
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("KernelPageSize:") {
                let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(kb * 1024);
            }
        }
    }
    None
}

/// Checks that every byte of `[va, va + len)` is mapped readable in `vmas` (ascending, as
/// `maps` lists them), and writable with `write`
/// ([`bluerdma_core::platform::check_mapped`]): [`UmemError::NotMapped`] names the first
/// byte that is not mapped or not readable, [`UmemError::ReadOnly`] the first that is not
/// writable.
pub fn check_access_in(vmas: &[Vma], va: VirtAddr, len: u64, write: bool) -> Result<(), UmemError> {
    if va.0.checked_add(len).is_none() {
        return Err(UmemError::BadRange { va, len });
    }
    let ranges = vmas.iter().map(|v| MappedRange {
        start: v.start,
        end: v.end,
        read: v.read,
        write: v.write,
    });
    check_mapped(ranges, va, len, write).map_err(|e| match e {
        PlatformError::ReadOnly { va } => UmemError::ReadOnly { va },
        PlatformError::NotMapped { va } => UmemError::NotMapped { va },
        // check_mapped fails with nothing else.
        _ => UmemError::NotMapped { va },
    })
}

/// [`check_access_in`] against the process's `maps` now.
pub fn check_access(
    paths: &SystemPaths,
    va: VirtAddr,
    len: u64,
    write: bool,
) -> Result<(), UmemError> {
    let p = paths.maps();
    let text = fs::read_to_string(&p).map_err(|e| UmemError::Proc {
        path: p.clone(),
        errno: e.raw_os_error().unwrap_or(0),
    })?;
    check_access_in(&parse_maps(&text), va, len, write)
}

/// Whether `[va, va + len)` is mapped throughout, and by what.
pub fn backing(paths: &SystemPaths, va: VirtAddr, len: u64) -> Result<Backing, UmemError> {
    let end =
        va.0.checked_add(len)
            .ok_or(UmemError::BadRange { va, len })?;
    let read = |p: &Path| {
        fs::read_to_string(p).map_err(|e| UmemError::Proc {
            path: p.to_owned(),
            errno: e.raw_os_error().unwrap_or(0),
        })
    };
    let vmas = parse_maps(&read(&paths.maps())?);
    let mut mounts: Option<Vec<String>> = None;
    let mut smaps: Option<String> = None;
    let mut at = va.0;
    let mut all_hugetlb = true;
    while at < end {
        let vma = vmas
            .iter()
            .find(|v| v.start <= at && at < v.end)
            .ok_or(UmemError::NotMapped { va: VirtAddr(at) })?;
        if all_hugetlb {
            let mounts = match &mounts {
                Some(m) => m,
                None => mounts.insert(hugetlbfs_mounts(
                    &fs::read_to_string(paths.mounts()).unwrap_or_default(),
                )),
            };
            let mut huge = is_hugetlb_path(&vma.path, mounts);
            if !huge && (vma.path.starts_with("/memfd:") || vma.path.starts_with("/SYSV")) {
                let text = match &smaps {
                    Some(t) => t,
                    None => smaps.insert(read(&paths.proc.join("self/smaps"))?),
                };
                huge = smaps_page_size(text, vma.start).is_some_and(|s| s >= 2 << 20);
            }
            all_hugetlb = huge;
        }
        at = vma.end;
    }
    Ok(if all_hugetlb {
        Backing::Hugetlb
    } else {
        Backing::Ordinary
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55fb48238000-55fb4823a000 r--p 00000000 fe:00 247282                     /usr/bin/head
7f0000000000-7f0000400000 rw-p 00000000 00:10 1234                       /anon_hugepage (deleted)
7f0000400000-7f0000600000 rw-p 00000000 00:00 0 
7f0000600000-7f0000800000 rw-s 00000000 00:2a 77                         /mnt/huge/buf
7f0000800000-7f0000a00000 rw-s 00000000 00:01 78                         /memfd:ring (deleted)
";

    #[test]
    fn maps_lines_parse_with_and_without_paths() {
        let v = parse_maps(MAPS);
        assert_eq!(v.len(), 5);
        assert_eq!(v[1].start, 0x7f00_0000_0000);
        assert_eq!(v[1].end, 0x7f00_0040_0000);
        assert_eq!(v[1].path, "/anon_hugepage (deleted)");
        assert_eq!(v[2].path, "");
        assert!(v[0].read && !v[0].write);
        assert!(v[2].read && v[2].write);
    }

    #[test]
    fn access_is_checked_byte_for_byte_across_mappings() {
        let v = parse_maps(MAPS);
        let va = VirtAddr;
        // Three adjacent writable mappings, read and written.
        assert_eq!(
            check_access_in(&v, va(0x7f00_0000_0000), 0xa0_0000, true),
            Ok(())
        );
        // Read-only text: fine to read, refused for writing at its first byte.
        assert_eq!(
            check_access_in(&v, va(0x55fb_4823_8000), 0x2000, false),
            Ok(())
        );
        assert_eq!(
            check_access_in(&v, va(0x55fb_4823_9000), 0x10, true),
            Err(UmemError::ReadOnly {
                va: va(0x55fb_4823_9000)
            })
        );
        // Running off the end names the first unmapped byte; so does a hole.
        assert_eq!(
            check_access_in(&v, va(0x7f00_009f_f000), 0x2000, false),
            Err(UmemError::NotMapped {
                va: va(0x7f00_00a0_0000)
            })
        );
        assert_eq!(
            check_access_in(&v, va(0x55fb_4823_9000), 0x2000, false),
            Err(UmemError::NotMapped {
                va: va(0x55fb_4823_a000)
            })
        );
        let guard = parse_maps(
            "7f0000000000-7f0000001000 ---p 00000000 00:00 0
",
        );
        assert_eq!(
            check_access_in(&guard, va(0x7f00_0000_0000), 1, false),
            Err(UmemError::NotMapped {
                va: va(0x7f00_0000_0000)
            })
        );
        assert!(matches!(
            check_access_in(&v, va(u64::MAX), 2, false),
            Err(UmemError::BadRange { .. })
        ));
    }

    #[test]
    fn hugetlb_is_recognised_by_path_and_mount() {
        let mounts = hugetlbfs_mounts("none /mnt/huge hugetlbfs rw,pagesize=2M 0 0\n");
        assert_eq!(mounts, ["/mnt/huge"]);
        assert!(is_hugetlb_path("/anon_hugepage (deleted)", &mounts));
        assert!(is_hugetlb_path("/mnt/huge/buf", &mounts));
        assert!(!is_hugetlb_path("/mnt/hugepages/buf", &mounts));
        assert!(!is_hugetlb_path("", &mounts));
    }

    #[test]
    fn smaps_page_size_is_read_for_the_right_vma() {
        let smaps = "\
7f0000800000-7f0000a00000 rw-s 00000000 00:01 78 /memfd:ring (deleted)
Size:               2048 kB
KernelPageSize:     2048 kB
7f0000a00000-7f0000a01000 rw-p 00000000 00:00 0
KernelPageSize:        4 kB
";
        assert_eq!(smaps_page_size(smaps, 0x7f00_0080_0000), Some(2 << 20));
        assert_eq!(smaps_page_size(smaps, 0x7f00_00a0_0000), Some(4096));
        assert_eq!(smaps_page_size(smaps, 0x1000), None);
    }

    #[test]
    fn backing_of_a_fake_process() {
        let dir = tempfile::tempdir().unwrap();
        let paths = SystemPaths::under(dir.path());
        fs::create_dir_all(paths.proc.join("self")).unwrap();
        fs::write(paths.maps(), MAPS).unwrap();
        fs::write(paths.mounts(), "none /mnt/huge hugetlbfs rw 0 0\n").unwrap();
        fs::write(
            paths.proc.join("self/smaps"),
            "7f0000800000-7f0000a00000 rw-s 0 0 0 /memfd:ring\nKernelPageSize: 2048 kB\n",
        )
        .unwrap();
        let b = |va: u64, len: u64| backing(&paths, VirtAddr(va), len);
        assert_eq!(b(0x7f00_0010_0000, 0x20_0000), Ok(Backing::Hugetlb));
        assert_eq!(b(0x7f00_0030_0000, 0x20_0000), Ok(Backing::Ordinary));
        assert_eq!(b(0x7f00_0060_0000, 0x40_0000), Ok(Backing::Hugetlb));
        assert_eq!(
            b(0x7f00_0090_0000, 0x20_0000),
            Err(UmemError::NotMapped {
                va: VirtAddr(0x7f00_00a0_0000)
            })
        );
    }
}
