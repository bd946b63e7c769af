//! The u-dma-buf kernel module's buffer as DMA memory.
//!
//! The module allocates one physically contiguous buffer per `udmabufN=<size>` parameter
//! and publishes it as `/dev/udmabufN`, with its bus address and size in
//! `/sys/class/u-dma-buf/udmabufN/{phys_addr,size}`. The whole buffer is mapped once, at a
//! CPU address congruent to its physical address modulo 2 MiB, and carved into buffers.
//!
//! Opened with `O_SYNC` (the default), the module maps the buffer uncached unless its
//! `sync_mode` says otherwise; that is always right, even on hosts whose DMA does not
//! snoop CPU caches. On x86 hosts, where PCIe DMA is cache coherent, `sync: false` gives a
//! cached mapping, which makes polling rings cheaper.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bluerdma_core::addr::DeviceAddr;
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, PlatformError};

use super::arena::{Arena, MAX_ALIGN};
use super::{DmaError, Mapping};
use crate::paths::{parse_number, read_trimmed, SystemPaths};

/// Which u-dma-buf buffer to use and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdmaBufConfig {
    /// The buffer's name (`udmabuf0`).
    pub name: String,
    /// Open with `O_SYNC` (uncached mapping, per the module's `sync_mode`).
    pub sync: bool,
}

impl Default for UdmaBufConfig {
    fn default() -> Self {
        Self {
            name: "udmabuf0".into(),
            sync: true,
        }
    }
}

/// A u-dma-buf buffer, mapped and carved into DMA buffers.
pub struct UdmaBuf {
    // Field order: the arena goes before the mapping it describes.
    arena: Arena,
    _map: Mapping,
    node: PathBuf,
}

fn attribute(path: &Path) -> Result<u64, DmaError> {
    let text = read_trimmed(path).map_err(|source| DmaError::Attribute {
        path: path.to_owned(),
        source,
    })?;
    parse_number(&text).ok_or(DmaError::Malformed {
        path: path.to_owned(),
        text,
    })
}

/// Maps `len` bytes of `fd` at a CPU address congruent to `phys` modulo [`MAX_ALIGN`].
fn map_congruent(fd: i32, len: usize, phys: u64, what: &str) -> Result<Mapping, DmaError> {
    let reserve_len = len + MAX_ALIGN;
    // SAFETY: a fresh inaccessible anonymous mapping at an address the kernel picks; it
    // only reserves address space.
    let reserve = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserve_len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    let reserve = Mapping::from_mmap(reserve, reserve_len, "address space")?;
    let r = reserve.ptr().as_ptr() as u64;
    let m = MAX_ALIGN as u64;
    let skip = ((phys % m) + m - r % m) % m;
    let cpu = (r + skip) as *mut libc::c_void;
    // SAFETY: `[cpu, cpu + len)` lies inside the reservation this function owns (skip <
    // MAX_ALIGN), so MAP_FIXED replaces only our own inaccessible pages.
    let mapped = unsafe {
        libc::mmap(
            cpu,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if mapped == libc::MAP_FAILED {
        return Err(DmaError::Map {
            what: what.to_owned(),
            source: std::io::Error::last_os_error(),
        });
    }
    // The reservation's pages before and after the buffer go back; the buffer's pages now
    // belong to the returned mapping.
    std::mem::forget(reserve);
    let tail = reserve_len as u64 - skip - len as u64;
    // SAFETY: both pieces are parts of the reservation outside the buffer, owned by no one
    // else; unmapping an empty piece is skipped.
    unsafe {
        if skip > 0 {
            libc::munmap(r as *mut libc::c_void, skip as usize);
        }
        if tail > 0 {
            libc::munmap((r + skip + len as u64) as *mut libc::c_void, tail as usize);
        }
    }
    Mapping::from_mmap(mapped, len, what)
}

impl UdmaBuf {
    /// Opens and maps the buffer `cfg.name` (`/dev/<name>` under `paths.dev`, attributes
    /// under `paths.sys`).
    pub fn open(paths: &SystemPaths, cfg: &UdmaBufConfig) -> Result<Self, DmaError> {
        let class = paths.udmabuf_class().join(&cfg.name);
        let phys = attribute(&class.join("phys_addr"))?;
        let size = attribute(&class.join("size"))?;
        let len = usize::try_from(size).map_err(|_| DmaError::Malformed {
            path: class.join("size"),
            text: size.to_string(),
        })?;
        if len == 0 {
            return Err(DmaError::Malformed {
                path: class.join("size"),
                text: "0".into(),
            });
        }
        let node = paths.dev.join(&cfg.name);
        let mut flags = libc::O_CLOEXEC;
        if cfg.sync {
            flags |= libc::O_SYNC;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(&node)
            .map_err(|source| DmaError::Open {
                path: node.clone(),
                source,
            })?;
        let map = map_congruent(file.as_raw_fd(), len, phys, &node.display().to_string())?;
        // SAFETY: the mapping is `len` bytes of the buffer, which the card reaches at
        // `phys` (the module's promise), congruent by construction; it lives as long as
        // the arena (both are fields of `self`, the arena dropped first).
        let arena = unsafe { Arena::new(map.ptr(), DeviceAddr(phys), len) };
        debug_assert_eq!(map.len(), len);
        Ok(Self {
            arena,
            _map: map,
            node,
        })
    }

    /// The buffer's bus address.
    pub fn device_addr(&self) -> DeviceAddr {
        self.arena.device_addr()
    }

    /// The buffer's size.
    pub fn len(&self) -> usize {
        self.arena.len()
    }

    /// Whether the buffer is empty (never: `open` refuses a zero size).
    pub fn is_empty(&self) -> bool {
        self.arena.len() == 0
    }

    /// Bytes not handed out.
    pub fn free_bytes(&self) -> usize {
        self.arena.free_bytes()
    }

    /// The device node.
    pub fn node(&self) -> &Path {
        &self.node
    }
}

// SAFETY: buffers come from the arena: zeroed, aligned on both sides, inside the mapped
// u-dma-buf buffer (which the card reaches at its physical address) until freed, and never
// overlapping.
unsafe impl DmaAllocator for UdmaBuf {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        self.arena.alloc(len, align).inspect_err(|_| {
            log::error!(
                "{}: no room for {len} bytes aligned to {align} ({} of {} bytes free)",
                self.node.display(),
                self.arena.free_bytes(),
                self.arena.len()
            )
        })
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        if self.arena.holds(&buf) {
            self.arena.free(&buf);
        } else {
            log::error!(
                "free of a buffer at {:?} that {} did not allocate",
                buf.device_addr(),
                self.node.display()
            );
        }
    }
}
