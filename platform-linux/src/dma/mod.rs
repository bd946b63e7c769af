//! DMA memory for the card's rings and buffers (reference-driver.md section 4;
//! hardware-contract.md correction 1 for the 2 MiB receive buffer).
//!
//! Two sources, both physically contiguous and both [`DmaAllocator`]s:
//! - [`UdmaBuf`]: the u-dma-buf kernel module's buffer, `/dev/udmabufN`, whose physical
//!   address and size are in `/sys/class/u-dma-buf/udmabufN/{phys_addr,size}`;
//! - [`HugePageDma`]: anonymous 2 MiB hugepages (`MAP_HUGETLB`, mlocked), whose physical
//!   address comes from the page map and whose contiguity is checked entry by entry.
//!
//! Buffers are carved from each contiguous block first-fit and go back on `free`.
//! [`CardDma`] is either, so a platform has one DMA type.

mod arena;
mod hugepage;
mod udmabuf;

pub use arena::MAX_ALIGN;
pub(crate) use hugepage::map_hugetlb;
pub use hugepage::{HugePageDma, HUGEPAGE};
pub use udmabuf::{UdmaBuf, UdmaBufConfig};

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::ptr::NonNull;

use bluerdma_core::engine::OPEN_BUFFERS;
use bluerdma_core::platform::{DmaAllocator, DmaBuffer, PlatformError};

use crate::umem::UmemError;

/// Whether the buffers the engine allocates when it opens a device
/// ([`bluerdma_core::engine::OPEN_BUFFERS`]) fit, first-fit, in a contiguous block of `len` bytes at device
/// address `base`.
pub fn open_buffers_fit(base: u64, len: usize) -> bool {
    let mut free = arena::Extents::new(len);
    OPEN_BUFFERS
        .iter()
        .all(|need| free.take(base, need.len, need.align).is_some())
}

/// Why DMA memory could not be set up. The text says what to run.
#[derive(Debug)]
pub enum DmaError {
    /// A u-dma-buf sysfs attribute cannot be read (the module is not loaded, or no such
    /// buffer).
    Attribute {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An attribute holds something unexpected.
    Malformed {
        /// The file.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
    /// The device node cannot be opened.
    Open {
        /// The node.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `mmap` failed.
    Map {
        /// What was mapped.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// No free hugepage in the pool.
    NoHugepages,
    /// Reading the physical address failed.
    Umem(UmemError),
    /// A hugepage is not one contiguous, aligned physical block.
    NotContiguous {
        /// The hugepage's virtual address.
        va: u64,
    },
}

impl fmt::Display for DmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaError::Attribute { path, source } => write!(
                f,
                "cannot read {}: {source}; is the u-dma-buf module loaded with a buffer? \
                 `sudo modprobe u-dma-buf udmabuf0=4194304` creates a 4 MiB one",
                path.display()
            ),
            DmaError::Malformed { path, text } => {
                write!(f, "{}: unexpected content `{text}`", path.display())
            }
            DmaError::Open { path, source } => {
                write!(f, "cannot open {}: {source}", path.display())?;
                if source.kind() == io::ErrorKind::PermissionDenied {
                    write!(
                        f,
                        " (run as root, or `sudo chmod 0666 {}` for this boot)",
                        path.display()
                    )?;
                }
                Ok(())
            }
            DmaError::Map { what, source } => write!(f, "cannot mmap {what}: {source}"),
            DmaError::NoHugepages => write!(
                f,
                "no free 2 MiB hugepage for DMA memory: reserve some with \
                 `echo 16 | sudo tee /proc/sys/vm/nr_hugepages`"
            ),
            DmaError::Umem(e) => write!(f, "{e}"),
            DmaError::NotContiguous { va } => write!(
                f,
                "the hugepage at {va:#x} is not one contiguous physical block (is the pool \
                 really 2 MiB pages?)"
            ),
        }
    }
}

impl std::error::Error for DmaError {}

impl From<UmemError> for DmaError {
    fn from(e: UmemError) -> Self {
        DmaError::Umem(e)
    }
}

/// A memory mapping this crate made, unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned memory, not tied to a thread.
unsafe impl Send for Mapping {}
// SAFETY: the mapping itself is only unmapped on drop; access to its bytes goes through
// the arena, which never hands out overlapping buffers.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Takes ownership of `len` mapped bytes at `ptr`, or of nothing if mmap failed.
    pub(crate) fn from_mmap(
        ptr: *mut libc::c_void,
        len: usize,
        what: &str,
    ) -> Result<Self, DmaError> {
        if ptr == libc::MAP_FAILED {
            return Err(DmaError::Map {
                what: what.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| DmaError::Map {
            what: what.to_owned(),
            source: io::Error::from_raw_os_error(libc::EFAULT),
        })?;
        Ok(Self { ptr, len })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region this value owns; its arena is dropped first or
        // together, and DmaBuffers must be freed before their allocator goes away.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The card's DMA memory: a u-dma-buf buffer or hugepages.
pub enum CardDma {
    /// From `/dev/udmabufN`.
    Udmabuf(UdmaBuf),
    /// From the hugepage pool.
    HugePages(HugePageDma),
}

// SAFETY: forwards to the variant, which upholds the obligations.
unsafe impl DmaAllocator for CardDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        match self {
            CardDma::Udmabuf(d) => d.alloc(len, align),
            CardDma::HugePages(d) => d.alloc(len, align),
        }
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        match self {
            // SAFETY: the caller's promise, passed on to the allocator that made `buf`.
            CardDma::Udmabuf(d) => unsafe { d.free(buf) },
            // SAFETY: as above.
            CardDma::HugePages(d) => unsafe { d.free(buf) },
        }
    }
}
