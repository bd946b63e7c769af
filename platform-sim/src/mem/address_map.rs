//! The map of host memory the card may reach, keyed by device address.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::platform::PlatformError;

use super::remote::{RemoteRegion, RemoteRegions};
use super::DmaPort;

/// A DMA access that fell outside every region the driver handed to the card, or that hit a
/// region of another process whose memory could not take it (unmapped there, or the
/// process gone: a warning names the reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaFault {
    /// The device address of the access.
    pub addr: DeviceAddr,
    /// Its length in bytes.
    pub len: usize,
    /// Whether it was a write.
    pub is_write: bool,
}

impl fmt::Display for DmaFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DMA {} of {} bytes at {:#x} outside every mapped region",
            if self.is_write { "write" } else { "read" },
            self.len,
            self.addr.0
        )
    }
}

impl std::error::Error for DmaFault {}

/// One mapped region: `len` bytes at device address `dev`, reachable by the CPU at `cpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Device address of the first byte.
    pub dev: u64,
    /// CPU address of the first byte.
    pub cpu: usize,
    /// Length in bytes.
    pub len: usize,
}

/// The regions of host memory the card may reach. Cloning shares the map.
///
/// Regions may overlap (an application may register the same buffer twice); an access is
/// allowed when one region covers all of it.
///
/// Besides this process's memory ([`AddressMap::insert`]) the map may hold regions of other
/// processes ([`AddressMap::insert_remote`], see [`RemoteRegion`]). Local regions are
/// looked up first, exactly as when there are no remote ones; the remote ones only when no
/// local region covers an access. The map serves reads and writes only: atomics are the
/// driver's (`MemoryResolver::atomic`), and there are none on remote regions.
#[derive(Clone, Default)]
pub struct AddressMap {
    inner: Arc<RwLock<Regions>>,
}

#[derive(Default)]
struct Regions {
    by_start: BTreeMap<u64, Vec<Region>>,
    /// The longest region ever mapped: bounds the backward search of a lookup.
    max_len: u64,
    /// Regions of other processes.
    remote: RemoteRegions,
}

impl fmt::Debug for AddressMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, remote) = self
            .inner
            .read()
            .map(|r| {
                (
                    r.by_start.values().map(Vec::len).sum::<usize>(),
                    r.remote.count(),
                )
            })
            .unwrap_or((0, 0));
        write!(f, "AddressMap({n} regions, {remote} remote)")
    }
}

impl AddressMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `len` bytes at device address `dev` to CPU address `cpu`.
    ///
    /// # Safety
    /// `cpu .. cpu + len` must stay valid for reads and writes (from any thread) until
    /// [`AddressMap::remove`] is called for `dev`; the card may access it at any time.
    pub unsafe fn insert(&self, dev: DeviceAddr, cpu: *mut u8, len: usize) {
        let region = Region {
            dev: dev.0,
            cpu: cpu as usize,
            len,
        };
        if let Ok(mut map) = self.inner.write() {
            map.max_len = map.max_len.max(len as u64);
            map.by_start.entry(dev.0).or_default().push(region);
        }
    }

    /// Unmaps the most recently mapped region that starts at `dev`; returns it if there was one.
    pub fn remove(&self, dev: DeviceAddr) -> Option<Region> {
        let mut map = self.inner.write().ok()?;
        let list = map.by_start.get_mut(&dev.0)?;
        let r = list.pop();
        if list.is_empty() {
            map.by_start.remove(&dev.0);
        }
        r
    }

    /// Maps `len` bytes at `va` in process `pid` (its pid, not a thread's) at device
    /// address `dev`: the card's accesses to them are `process_vm_readv`/`process_vm_writev`
    /// calls on that process, and fail (a [`DmaFault`]) where it has no readable (writable)
    /// memory, or once it has exited.
    ///
    /// Errors: `Os(EINVAL)` for a pid that is not positive or a range that wraps,
    /// `Os(ESRCH)` when there is no such process.
    pub fn insert_remote(
        &self,
        dev: DeviceAddr,
        pid: i32,
        va: u64,
        len: usize,
    ) -> Result<(), PlatformError> {
        let mut map = self
            .inner
            .write()
            .map_err(|_| PlatformError::Os(libc::EIO))?;
        map.remote.insert(RemoteRegion {
            dev: dev.0,
            pid,
            va,
            len,
        })
    }

    /// Unmaps the most recently mapped remote region that starts at `dev`; returns it if
    /// there was one. An access to it in progress finishes before this returns.
    pub fn remove_remote(&self, dev: DeviceAddr) -> Option<RemoteRegion> {
        self.inner.write().ok()?.remote.remove(dev.0)
    }

    /// The remote region that contains all of `[addr, addr + len)`, if any.
    pub fn lookup_remote(&self, addr: DeviceAddr, len: usize) -> Option<RemoteRegion> {
        self.inner.read().ok()?.remote.lookup(addr.0, len)
    }

    /// The local region that contains all of `[addr, addr + len)`, if any.
    pub fn lookup(&self, addr: DeviceAddr, len: usize) -> Option<Region> {
        let map = self.inner.read().ok()?;
        Self::find(&map, addr, len)
    }

    fn find(map: &Regions, addr: DeviceAddr, len: usize) -> Option<Region> {
        let end = addr.0.checked_add(len as u64)?;
        let lowest = addr.0.saturating_sub(map.max_len);
        map.by_start
            .range(lowest..=addr.0)
            .rev()
            .flat_map(|(_, list)| list.iter())
            .find(|r| end <= r.dev + r.len as u64)
            .copied()
    }

    /// Runs `f` on where device address `addr` is, holding the map so that the region cannot
    /// be removed meanwhile: the CPU address in a local region that covers the access, or
    /// else the remote regions (if there are any). `f` says whether it made the access.
    #[inline(always)]
    fn with_cpu(
        &self,
        addr: DeviceAddr,
        len: usize,
        is_write: bool,
        f: impl FnOnce(Target<'_>) -> bool,
    ) -> Result<(), DmaFault> {
        let fault = DmaFault {
            addr,
            len,
            is_write,
        };
        let map = self.inner.read().map_err(|_| fault)?;
        let done = match Self::find(&map, addr, len) {
            Some(r) => f(Target::Local(r.cpu + (addr.0 - r.dev) as usize)),
            None => !map.remote.is_empty() && f(Target::Remote(&map.remote)),
        };
        done.then_some(()).ok_or(fault)
    }

    /// Copies `buf.len()` bytes from device address `addr`.
    pub fn read(&self, addr: DeviceAddr, buf: &mut [u8]) -> Result<(), DmaFault> {
        self.with_cpu(addr, buf.len(), false, |at| match at {
            Target::Local(src) => {
                // SAFETY: `with_cpu` proved the range lies inside a region whose owner
                // promised (at `insert`) that it stays valid until removed, and holds the map
                // so it cannot be removed during the copy. Card and driver may touch the
                // bytes concurrently, as with real DMA; they are plain data.
                unsafe {
                    std::ptr::copy_nonoverlapping(src as *const u8, buf.as_mut_ptr(), buf.len())
                };
                true
            }
            Target::Remote(remote) => remote.read(addr, buf),
        })
    }

    /// Copies `data` to device address `addr`.
    pub fn write(&self, addr: DeviceAddr, data: &[u8]) -> Result<(), DmaFault> {
        self.with_cpu(addr, data.len(), true, |at| match at {
            Target::Local(dst) => {
                // SAFETY: as in `read`: the range is inside a live region valid for writes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
                true
            }
            Target::Remote(remote) => remote.write(addr, data),
        })
    }
}

/// Where an access goes.
enum Target<'a> {
    /// This CPU address.
    Local(usize),
    /// Into the remote region that covers it, if any.
    Remote(&'a RemoteRegions),
}

impl DmaPort for AddressMap {
    fn read(&mut self, addr: DeviceAddr, buf: &mut [u8]) -> Result<(), DmaFault> {
        AddressMap::read(self, addr, buf)
    }
    fn write(&mut self, addr: DeviceAddr, data: &[u8]) -> Result<(), DmaFault> {
        AddressMap::write(self, addr, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_outside_regions_fault_instead_of_crashing() {
        let map = AddressMap::new();
        let mut backing = vec![0u8; 64];
        // SAFETY: `backing` outlives every access below and is removed before it drops.
        unsafe { map.insert(DeviceAddr(0x1000), backing.as_mut_ptr(), backing.len()) };
        map.write(DeviceAddr(0x1010), &[1, 2, 3]).unwrap();
        let mut out = [0u8; 3];
        map.read(DeviceAddr(0x1010), &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        let err = map.write(DeviceAddr(0x103F), &[0, 0]).unwrap_err();
        assert_eq!(err.len, 2);
        assert!(err.to_string().contains("0x103f"), "{err}");
        assert!(map.read(DeviceAddr(0xFFF), &mut out).is_err());
        assert!(map.read(DeviceAddr(u64::MAX), &mut out).is_err());
        map.remove(DeviceAddr(0x1000));
        assert!(map.read(DeviceAddr(0x1010), &mut out).is_err());
        assert_eq!(&backing[0x10..0x13], &[1, 2, 3]);
    }

    #[test]
    fn overlapping_regions_each_cover_their_range() {
        let map = AddressMap::new();
        let mut big = vec![0u8; 0x1000];
        let p = big.as_mut_ptr();
        // SAFETY: `big` outlives the map's use in this test; the regions lie inside it.
        unsafe {
            map.insert(DeviceAddr(0x10_000), p, 0x1000);
            map.insert(DeviceAddr(0x10_100), p.add(0x100), 0x10);
            map.insert(DeviceAddr(0x10_100), p.add(0x100), 0x20);
        }
        // Covered by the big region although a smaller one starts closer.
        map.write(DeviceAddr(0x10_100), &[7u8; 0x200]).unwrap();
        map.remove(DeviceAddr(0x10_000));
        assert!(map.write(DeviceAddr(0x10_100), &[1u8; 0x20]).is_ok());
        map.remove(DeviceAddr(0x10_100));
        assert!(map.write(DeviceAddr(0x10_100), &[1u8; 0x20]).is_err());
        assert!(map.write(DeviceAddr(0x10_100), &[1u8; 0x10]).is_ok());
        drop(big);
    }
}
