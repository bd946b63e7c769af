//! `/proc/self/pagemap`: one 64-bit entry per base page of the address space, at byte
//! offset `8 * (va / base_page)` (the kernel's `Documentation/admin-guide/mm/pagemap.rst`).
//! Bit 63: present; bit 62: swapped; bits 0..=54: the frame number (PFN), which the kernel
//! shows only to a reader with CAP_SYS_ADMIN and reports as 0 otherwise.
//!
//! The file is opened once and read with one `pread` per run of consecutive entries, not
//! one open per page as the reference driver does (reference-driver.md section 4).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bluerdma_core::addr::{DeviceAddr, VirtAddr};

use super::UmemError;

/// One page-map entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct PagemapEntry(pub u64);

impl PagemapEntry {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const PFN_MASK: u64 = (1 << 55) - 1;

    /// The page has a frame in memory.
    pub const fn present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }

    /// The page is in swap.
    pub const fn swapped(self) -> bool {
        self.0 & Self::SWAPPED != 0
    }

    /// The frame number (0 when hidden or not present).
    pub const fn pfn(self) -> u64 {
        if self.present() {
            self.0 & Self::PFN_MASK
        } else {
            0
        }
    }

    /// The device (physical) address of the frame of the page that holds `va`, whose
    /// entry this is.
    pub fn frame(self, va: VirtAddr, base_page: u64) -> Result<DeviceAddr, UmemError> {
        if !self.present() {
            return Err(UmemError::NotPresent { va });
        }
        match self.pfn() {
            0 => Err(UmemError::PfnHidden { va }),
            pfn => Ok(DeviceAddr(pfn * base_page)),
        }
    }
}

/// This process's page map, open for reading.
pub struct Pagemap {
    file: File,
    path: PathBuf,
    base_page: u64,
}

/// The kernel's base page size.
pub fn base_page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the running kernel; it has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

impl Pagemap {
    /// Opens the page map at `path` (`/proc/self/pagemap`, or a file standing in for it).
    pub fn open(path: &Path) -> Result<Self, UmemError> {
        let file = File::open(path).map_err(|e| UmemError::Proc {
            path: path.to_owned(),
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        Ok(Self {
            file,
            path: path.to_owned(),
            base_page: base_page_size(),
        })
    }

    /// The base page size the entries describe.
    pub fn base_page(&self) -> u64 {
        self.base_page
    }

    /// Reads the entries of `out.len()` consecutive base pages, the first holding `va`,
    /// with one `pread` (repeated only if the kernel returns fewer bytes).
    pub fn read(&self, va: VirtAddr, out: &mut [PagemapEntry]) -> Result<(), UmemError> {
        let offset = va.0 / self.base_page * 8;
        // SAFETY: PagemapEntry is a transparent u64, for which every byte pattern is valid;
        // the byte view covers exactly `out` and lives no longer than this borrow of it.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        self.file
            .read_exact_at(bytes, offset)
            .map_err(|e| UmemError::Proc {
                path: self.path.clone(),
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            })?;
        if cfg!(target_endian = "big") {
            for e in out.iter_mut() {
                e.0 = u64::from_le(e.0);
            }
        }
        Ok(())
    }

    /// The entry of the base page holding `va`.
    pub fn entry(&self, va: VirtAddr) -> Result<PagemapEntry, UmemError> {
        let mut e = [PagemapEntry(0)];
        self.read(va, &mut e)?;
        Ok(e[0])
    }

    /// The device address of the byte at `va` (frame plus offset in the base page).
    pub fn device_addr(&self, va: VirtAddr) -> Result<DeviceAddr, UmemError> {
        let frame = self.entry(va)?.frame(va, self.base_page)?;
        Ok(DeviceAddr(frame.0 + va.0 % self.base_page))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_bits_decode() {
        let e = PagemapEntry((1 << 63) | 0x1_2345);
        assert!(e.present() && !e.swapped());
        assert_eq!(e.pfn(), 0x1_2345);
        assert_eq!(e.frame(VirtAddr(0x7000), 4096), Ok(DeviceAddr(0x1234_5000)));
        // Soft-dirty and exclusive bits (55, 56) are not part of the PFN.
        assert_eq!(PagemapEntry((1 << 63) | (3 << 55) | 7).pfn(), 7);
    }

    #[test]
    fn hidden_and_absent_frames_are_errors() {
        let va = VirtAddr(0x7000);
        assert_eq!(
            PagemapEntry(1 << 63).frame(va, 4096),
            Err(UmemError::PfnHidden { va })
        );
        assert_eq!(
            PagemapEntry(1 << 62).frame(va, 4096),
            Err(UmemError::NotPresent { va })
        );
        assert_eq!(PagemapEntry(0x55).pfn(), 0);
    }

    #[test]
    fn a_regular_file_stands_in_for_the_page_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pagemap");
        let mut bytes = vec![0u8; 8 * 16];
        for i in 0..16u64 {
            let e = (1u64 << 63) | (0x500 + i);
            bytes[i as usize * 8..][..8].copy_from_slice(&e.to_le_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        let pm = Pagemap::open(&path).unwrap();
        let bp = pm.base_page();
        let mut out = [PagemapEntry(0); 4];
        pm.read(VirtAddr(3 * bp + 5), &mut out).unwrap();
        assert_eq!(out.map(|e| e.pfn()), [0x503, 0x504, 0x505, 0x506]);
        assert_eq!(
            pm.device_addr(VirtAddr(2 * bp + 5)).unwrap(),
            DeviceAddr(0x502 * bp + 5)
        );
        // Past the end of the stand-in: an error that names the file.
        let e = pm.entry(VirtAddr(100 * bp)).unwrap_err();
        assert!(e.to_string().contains("pagemap"), "{e}");
    }
}
