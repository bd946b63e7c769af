//! BAR0 of the card, mapped from its sysfs `resource0` file, as the core's
//! [`RegisterAccess`] (hardware-contract.md "Registers": 32-bit little-endian registers).
//!
//! Each access is one aligned 32-bit volatile load or store through the mapping. The core
//! issues `fence(Release)` before a doorbell; that orders memory for other CPUs but not
//! necessarily for a device, so each store here is preceded by the barrier the
//! architecture needs between ordinary memory writes and a device write (and each load is
//! followed by the one between a device read and later memory accesses), as Linux's
//! `writel`/`readl` do:
//! - x86-64: none beyond the compiler's; stores to uncached (UC) memory are not reordered
//!   with older stores, and UC loads are not reordered with younger ones.
//! - AArch64: `dmb oshst` before the store, `dmb oshld` after the load.
//! - elsewhere: a sequentially consistent fence (untested there).
//!
//! The mapping path is a parameter, so a regular file can stand in for `resource0`.

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::Reg;

/// Every register the card decodes lies below this offset (the counters end at 0x48C), so
/// a mapping this long holds them all; real BARs are at least this large.
pub const MIN_BAR0_LEN: usize = 0x1000;

/// Why BAR0 could not be mapped.
#[derive(Debug)]
pub enum BarError {
    /// The file cannot be opened.
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The file is shorter than the register map.
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// `mmap` failed.
    Map {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl fmt::Display for BarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BarError::Open { path, source } => {
                write!(f, "cannot open BAR0 {}: {source}", path.display())?;
                match source.kind() {
                    io::ErrorKind::PermissionDenied => {
                        write!(
                            f,
                            " (mapping a PCI BAR needs root: run as root, with `sudo`)"
                        )
                    }
                    io::ErrorKind::NotFound => {
                        write!(f, " (no such device or BAR; run `bluerdma-doctor`)")
                    }
                    _ => Ok(()),
                }
            }
            BarError::TooSmall { path, len } => write!(
                f,
                "BAR0 {} is {len} bytes, smaller than the register map ({MIN_BAR0_LEN} bytes): \
                 wrong device or BAR",
                path.display()
            ),
            BarError::Map { path, source } => {
                write!(f, "cannot mmap BAR0 {}: {source}", path.display())?;
                if source.raw_os_error() == Some(libc::EPERM) {
                    write!(
                        f,
                        " (the kernel's lockdown or iomem=strict forbids mapping device memory)"
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for BarError {}

/// BAR0 mapped into this process.
pub struct Bar0 {
    base: NonNull<u8>,
    len: usize,
    path: PathBuf,
}

// SAFETY: the mapping is owned by this value and lives until it is dropped; every access
// through it is a single aligned 32-bit volatile load or store, which the device (or the
// file standing in for it) handles from any thread.
unsafe impl Send for Bar0 {}
// SAFETY: as for Send: shared references only issue independent 32-bit accesses.
unsafe impl Sync for Bar0 {}

impl Bar0 {
    /// Maps the whole of `path` (a `resource0` file, or a regular file standing in for one).
    pub fn map(path: &Path) -> Result<Self, BarError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_SYNC | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| BarError::Open {
                path: path.to_owned(),
                source,
            })?;
        let len = file
            .metadata()
            .map_err(|source| BarError::Open {
                path: path.to_owned(),
                source,
            })?
            .len();
        if len < MIN_BAR0_LEN as u64 {
            return Err(BarError::TooSmall {
                path: path.to_owned(),
                len,
            });
        }
        let len = usize::try_from(len).map_err(|_| BarError::TooSmall {
            path: path.to_owned(),
            len,
        })?;
        // SAFETY: a fresh shared mapping of an open file at an address the kernel picks; it
        // aliases no Rust object. The descriptor may be closed afterwards.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(BarError::Map {
                path: path.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| BarError::Map {
            path: path.to_owned(),
            source: io::Error::from_raw_os_error(libc::EFAULT),
        })?;
        Ok(Self {
            base,
            len,
            path: path.to_owned(),
        })
    }

    /// The mapped length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: [`Bar0::map`] refuses short files).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapped file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The register's address in the mapping, if it lies inside.
    fn register(&self, reg: Reg) -> Option<*mut u32> {
        let off = usize::from(reg.offset());
        if off % 4 != 0 || off + 4 > self.len {
            return None;
        }
        // SAFETY: `off + 4 <= len`, so the pointer stays inside the mapping.
        Some(unsafe { self.base.as_ptr().add(off) }.cast::<u32>())
    }
}

impl RegisterAccess for Bar0 {
    fn read32(&self, reg: Reg) -> u32 {
        let Some(p) = self.register(reg) else {
            log::error!("BAR0 read at {:#x} outside the mapping", reg.offset());
            return u32::MAX;
        };
        // SAFETY: `p` is 4-byte aligned (page-aligned base, offset multiple of 4) and inside
        // the live mapping; volatile because the device changes the value.
        let v = unsafe { p.read_volatile() };
        after_device_read();
        u32::from_le(v)
    }

    fn write32(&self, reg: Reg, value: u32) {
        let Some(p) = self.register(reg) else {
            log::error!("BAR0 write at {:#x} outside the mapping", reg.offset());
            return;
        };
        before_device_write();
        // SAFETY: as in `read32`; the store has a side effect on the device, hence volatile.
        unsafe { p.write_volatile(value.to_le()) };
    }
}

impl Drop for Bar0 {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no pointer into it outlives
        // `self` (accesses never hand one out).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Orders earlier memory writes before the next device write (Linux's `__iowmb`).
#[inline(always)]
fn before_device_write() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; it accesses no memory.
    unsafe {
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Orders a device read before later memory accesses (Linux's `__iormb`).
#[inline(always)]
fn after_device_read() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; it accesses no memory.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
