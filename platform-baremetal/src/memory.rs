//! User memory on the soft-core: physical, never swapped or moved, so pinning only checks
//! that the range lies in memory the card may reach, and translation is the identity. The
//! soft-core has no memory protection: inside the window every byte may be written.

use core::ops::Range;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::oob::AtomicOp;
use bluerdma_core::platform::{
    atomic_in_place, pinned_at, write_in_place, MemoryResolver, PlatformError,
};

/// Identity translation over a window of physical memory the card may reach.
#[derive(Clone, Debug)]
pub struct IdentityMemory {
    window: Range<u64>,
}

impl IdentityMemory {
    /// Memory regions must lie inside `window` (e.g. the RAM the FPGA design maps for the
    /// card); anything else is refused at registration with [`PlatformError::NotMapped`].
    pub const fn new(window: Range<u64>) -> Self {
        Self { window }
    }
}

impl IdentityMemory {
    /// `[va, va + len)` lies in the window (every byte of it may be written).
    fn writable(&self, va: VirtAddr, len: u64) -> Result<(), PlatformError> {
        let w = &self.window;
        pinned_at([(w.start, w.end.saturating_sub(w.start))], va, len).map(|_| ())
    }
}

impl MemoryResolver for IdentityMemory {
    fn pin(&mut self, va: VirtAddr, len: usize, _write: bool) -> Result<(), PlatformError> {
        if va.0 < self.window.start {
            return Err(PlatformError::NotMapped { va });
        }
        match va.0.checked_add(len as u64) {
            Some(end) if end <= self.window.end => Ok(()),
            _ => Err(PlatformError::NotMapped {
                va: VirtAddr(self.window.end.max(va.0)),
            }),
        }
    }

    fn unpin(&mut self, _va: VirtAddr, _len: usize) {}

    fn atomic(&mut self, va: VirtAddr, op: AtomicOp) -> Result<u64, PlatformError> {
        self.writable(va, 8)?;
        if va.0 % 8 != 0 {
            return Err(PlatformError::NotMapped { va });
        }
        // SAFETY: aligned, and inside the window: physical memory the soft-core reaches at
        // its own address (no memory protection, nothing unmapped).
        Ok(unsafe { atomic_in_place(va, op) })
    }

    fn write(&mut self, va: VirtAddr, bytes: &[u8]) -> Result<(), PlatformError> {
        self.writable(va, bytes.len() as u64)?;
        // SAFETY: inside the window, as for `atomic`.
        unsafe { write_in_place(va, bytes) };
        Ok(())
    }

    fn translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), PlatformError> {
        for (slot, base) in out.iter_mut().zip(page.bases_from(va.0)) {
            *slot = DeviceAddr(base.ok_or(PlatformError::NotMapped { va })?.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_translate_to_their_own_bases() {
        let mut m = IdentityMemory::new(0..u64::MAX);
        let mut out = [DeviceAddr(0); 3];
        m.translate(VirtAddr(0x8030_0040), PageSize::Size2M, &mut out)
            .unwrap();
        assert_eq!(
            out,
            [
                DeviceAddr(0x8020_0000),
                DeviceAddr(0x8040_0000),
                DeviceAddr(0x8060_0000)
            ]
        );
    }

    #[test]
    fn ranges_outside_the_window_are_refused_with_the_first_bad_address() {
        let mut m = IdentityMemory::new(0x8000_0000..0x8100_0000);
        assert!(m.pin(VirtAddr(0x8000_0000), 0x100_0000, true).is_ok());
        assert_eq!(
            m.pin(VirtAddr(0x7FFF_FFFF), 2, false),
            Err(PlatformError::NotMapped {
                va: VirtAddr(0x7FFF_FFFF)
            })
        );
        assert_eq!(
            m.pin(VirtAddr(0x80FF_FFFF), 2, false),
            Err(PlatformError::NotMapped {
                va: VirtAddr(0x8100_0000)
            })
        );
        assert!(m.pin(VirtAddr(u64::MAX), 2, false).is_err());
        let mut top = [DeviceAddr(0); 2];
        assert!(m
            .translate(VirtAddr(u64::MAX), PageSize::Size4K, &mut top)
            .is_err());
        assert!(m
            .translate(VirtAddr(u64::MAX), PageSize::Size4K, &mut top[..1])
            .is_ok());
    }
}
