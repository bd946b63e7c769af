//! Whether a range of this process's memory is mapped, and writable, from
//! `/proc/self/maps`: what a registration checks before it lets a card (emulated in this
//! process, or real) read or write the range. The kernel's pinning refuses such a range
//! with EFAULT; without the check an emulated card's access to it would kill the process.

use bluerdma_core::addr::VirtAddr;
use bluerdma_core::platform::PlatformError;

/// One mapping: `[start, end)` and whether it may be read and written.
pub use bluerdma_core::platform::MappedRange as Mapping;

/// The mappings of a `maps` file's text, in its order (ascending); lines that do not parse
/// are skipped.
pub fn parse(text: &str) -> impl Iterator<Item = Mapping> + '_ {
    text.lines().filter_map(|line| {
        let mut cols = line.split_ascii_whitespace();
        let (s, e) = cols.next()?.split_once('-')?;
        let perms = cols.next()?.as_bytes();
        Some(Mapping {
            start: u64::from_str_radix(s, 16).ok()?,
            end: u64::from_str_radix(e, 16).ok()?,
            read: perms.first() == Some(&b'r'),
            write: perms.get(1) == Some(&b'w'),
        })
    })
}

/// Checks that every byte of `[va, va + len)` is mapped readable (and writable with
/// `write`) in `maps`: `NotMapped` names the first byte that is not mapped or not
/// readable, `ReadOnly` the first that is not writable
/// ([`bluerdma_core::platform::check_mapped`]).
pub fn check_in(
    maps: impl Iterator<Item = Mapping>,
    va: u64,
    len: u64,
    write: bool,
) -> Result<(), PlatformError> {
    bluerdma_core::platform::check_mapped(maps, VirtAddr(va), len, write)
}

/// [`check_in`] against this process's mappings now.
pub fn check(va: VirtAddr, len: usize, write: bool) -> Result<(), PlatformError> {
    let text = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| PlatformError::Os(e.raw_os_error().unwrap_or(libc::EIO)))?;
    check_in(parse(&text), va.0, len as u64, write)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/dbus-daemon
00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/dbus-daemon
00655000-00656000 ---p 00000000 00:00 0
00656000-00660000 rw-p 00000000 00:00 0           [heap]
7fff00000000-7fff00001000 rw-p 00000000 00:00 0
";

    fn check(va: u64, len: u64, write: bool) -> Result<(), PlatformError> {
        check_in(parse(MAPS), va, len, write)
    }

    #[test]
    fn a_range_across_adjacent_writable_mappings_passes() {
        assert_eq!(check(0x652000, 0x3000, true), Ok(()));
        assert_eq!(check(0x400100, 0x10, false), Ok(()));
        assert_eq!(
            check(0x651000, 0x2000, false),
            Ok(()),
            "r-- then rw-, read only"
        );
    }

    #[test]
    fn read_only_memory_refuses_a_writable_registration() {
        assert_eq!(
            check(0x651800, 0x1000, true),
            Err(PlatformError::ReadOnly {
                va: VirtAddr(0x651800)
            })
        );
    }

    #[test]
    fn holes_and_guard_pages_are_not_mapped() {
        let not = |va| Err(PlatformError::NotMapped { va: VirtAddr(va) });
        assert_eq!(
            check(0x654000, 0x2000, false),
            not(0x655000),
            "a ---p guard page"
        );
        assert_eq!(
            check(0x65f000, 0x2000, false),
            not(0x660000),
            "past the heap"
        );
        assert_eq!(check(0x1000, 1, false), not(0x1000), "below every mapping");
        assert_eq!(check(u64::MAX, 2, false), not(u64::MAX), "wraps");
    }

    #[test]
    fn this_process_has_its_own_stack_and_not_page_zero() {
        let x = [0u8; 64];
        assert_eq!(super::check(VirtAddr(x.as_ptr() as u64), 64, true), Ok(()));
        assert!(super::check(VirtAddr(0), 4096, false).is_err());
    }
}
