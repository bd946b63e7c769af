//! The memory of an owned MR ([`Pd::alloc_mr`](super::Pd::alloc_mr)): page-aligned heap
//! memory for backends that register any memory, 2 MiB hugetlb pages for the card, which
//! translates 2 MiB pages that must each be physically contiguous.

use bluerdma_core::engine::VerbsError;

use crate::backend::BufferKind;
use crate::dma::{map_hugetlb, Mapping, HUGEPAGE};

/// Zeroed memory owned by an MR.
pub(super) enum OwnedBuf {
    /// From the heap.
    Heap {
        ptr: *mut u8,
        layout: std::alloc::Layout,
    },
    /// A private mapping of hugetlb pages (unmapped when dropped).
    Huge(Mapping),
}

// SAFETY: the buffer is plain bytes owned by this value.
unsafe impl Send for OwnedBuf {}
// SAFETY: shared access only hands out the pointer; the verbs contract governs its use.
unsafe impl Sync for OwnedBuf {}

impl OwnedBuf {
    /// `len` zeroed bytes (at least one) of the kind the backend registers.
    pub(super) fn new(len: usize, kind: BufferKind) -> Result<Self, VerbsError> {
        let len = len.max(1);
        match kind {
            BufferKind::Heap => {
                let layout =
                    std::alloc::Layout::from_size_align(len, 4096).map_err(|_| too_large())?;
                // SAFETY: the layout has a non-zero size.
                let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
                if ptr.is_null() {
                    return Err(VerbsError::OutOfResources { what: "memory" });
                }
                Ok(OwnedBuf::Heap { ptr, layout })
            }
            BufferKind::HugePages => {
                let len = len
                    .checked_next_multiple_of(HUGEPAGE)
                    .ok_or_else(too_large)?;
                let map = map_hugetlb(len).map_err(|e| {
                    log::error!("alloc_mr: {len} bytes: {e}");
                    VerbsError::OutOfResources {
                        what: "2 MiB hugepages (reserve some: \
                               echo 16 | sudo tee /proc/sys/vm/nr_hugepages)",
                    }
                })?;
                Ok(OwnedBuf::Huge(map))
            }
        }
    }

    /// The first byte.
    pub(super) fn ptr(&self) -> *mut u8 {
        match self {
            OwnedBuf::Heap { ptr, .. } => *ptr,
            OwnedBuf::Huge(map) => map.ptr().as_ptr(),
        }
    }
}

fn too_large() -> VerbsError {
    VerbsError::InvalidArgument {
        what: "buffer length",
    }
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        if let OwnedBuf::Heap { ptr, layout } = *self {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(ptr, layout) }
        }
        // A mapping unmaps itself.
    }
}
