//! Typed addresses and the page size the card and the driver agree on.
//!
//! A [`VirtAddr`] is an address in the driver's (or application's) address space; a
//! [`DeviceAddr`] is what the card puts on the bus (a physical or IOVA address). The two
//! never convert into each other implicitly: only a platform's translation does that.

use core::fmt;

/// A virtual address in the address space of the process (or firmware) running the driver.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct VirtAddr(pub u64);

/// An address as the card sees it on the bus (physical address or IOVA).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct DeviceAddr(pub u64);

impl VirtAddr {
    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
    /// This address plus `off` bytes, or `None` on overflow.
    pub const fn checked_add(self, off: u64) -> Option<Self> {
        match self.0.checked_add(off) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }
}

impl DeviceAddr {
    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
    /// This address plus `off` bytes, or `None` on overflow.
    pub const fn checked_add(self, off: u64) -> Option<Self> {
        match self.0.checked_add(off) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }
}

impl fmt::Debug for VirtAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VirtAddr({:#x})", self.0)
    }
}

impl fmt::Debug for DeviceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceAddr({:#x})", self.0)
    }
}

// The firmware's log lines (defmt) show addresses as `Debug` does.
#[cfg(feature = "defmt")]
impl defmt::Format for VirtAddr {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "VirtAddr({=u64:#x})", self.0)
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for DeviceAddr {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "DeviceAddr({=u64:#x})", self.0)
    }
}

/// The translation page size (hardware-contract.md correction 8: the RTL has 2 MiB fixed;
/// 64 KiB and 4 KiB are options for future card builds and the emulated NIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PageSize {
    /// 4 KiB pages (ordinary memory; emulated NIC only today).
    Size4K,
    /// 64 KiB pages (GPU memory; emulated NIC only today).
    Size64K,
    /// 2 MiB pages: the only size the current RTL implements.
    #[default]
    Size2M,
}

impl PageSize {
    /// log2 of the page size.
    pub const fn shift(self) -> u32 {
        match self {
            PageSize::Size4K => 12,
            PageSize::Size64K => 16,
            PageSize::Size2M => 21,
        }
    }
    /// The page size in bytes.
    pub const fn bytes(self) -> u64 {
        1 << self.shift()
    }
    /// `addr` rounded down to its page base.
    pub const fn base_of(self, addr: u64) -> u64 {
        addr & !(self.bytes() - 1)
    }
    /// Number of pages that the byte range `[start, start + len)` touches (0 for `len == 0`).
    pub const fn pages_spanned(self, start: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let last = start.saturating_add(len - 1);
        (last >> self.shift()) - (start >> self.shift()) + 1
    }
    /// The bases of the pages from the one that contains `addr` on, in order; `None` where
    /// a base would pass the end of the address space (every page walk of a
    /// `MemoryResolver::translate` goes through this).
    pub fn bases_from(self, addr: u64) -> impl Iterator<Item = Option<VirtAddr>> {
        let first = self.base_of(addr);
        (0u64..).map(move |i| {
            i.checked_mul(self.bytes())
                .and_then(|off| first.checked_add(off))
                .map(VirtAddr)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_spanned_counts_unaligned_starts() {
        let p = PageSize::Size2M;
        assert_eq!(p.pages_spanned(0, 0), 0);
        assert_eq!(p.pages_spanned(0, 1), 1);
        assert_eq!(p.pages_spanned(0, 2 << 20), 1);
        assert_eq!(p.pages_spanned(1, 2 << 20), 2);
        assert_eq!(p.pages_spanned((2 << 20) - 1, 2), 2);
        assert_eq!(PageSize::Size4K.pages_spanned(4095, 4097), 2);
    }

    #[test]
    fn base_of_masks_low_bits() {
        assert_eq!(PageSize::Size2M.base_of(0x7f12_3460_0040), 0x7f12_3460_0000);
        assert_eq!(PageSize::Size64K.base_of(0x1_2345), 0x1_0000);
    }

    #[test]
    fn page_bases_start_at_the_page_of_addr_and_stop_at_the_end_of_memory() {
        let p = PageSize::Size4K;
        let got: heapless::Vec<Option<u64>, 3> = p
            .bases_from(0x1234)
            .take(3)
            .map(|b| b.map(|v| v.0))
            .collect();
        assert_eq!(got.as_slice(), [Some(0x1000), Some(0x2000), Some(0x3000)]);
        let mut top = p.bases_from(u64::MAX - 10);
        assert_eq!(top.next(), Some(Some(VirtAddr(!0xFFF))));
        assert_eq!(top.next(), Some(None), "no page past the end");
    }
}
