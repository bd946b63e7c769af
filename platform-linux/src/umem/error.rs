//! Why user memory cannot be pinned or translated. Each message names the missing
//! privilege or setting and the command that fixes it; the core only sees the
//! [`PlatformError`] each maps to, so the resolver logs the full text and keeps it.

use std::fmt;
use std::path::PathBuf;

use bluerdma_core::addr::{PageSize, VirtAddr};
use bluerdma_core::platform::PlatformError;

/// A user-memory failure with what it takes to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UmemError {
    /// The range wraps around the address space.
    BadRange {
        /// Start.
        va: VirtAddr,
        /// Length.
        len: u64,
    },
    /// A procfs file (pagemap, maps) cannot be opened or read.
    Proc {
        /// The file.
        path: PathBuf,
        /// The OS error number.
        errno: i32,
    },
    /// No mapping at this address.
    NotMapped {
        /// The first unmapped address.
        va: VirtAddr,
    },
    /// The process may not write this address, and the registration lets the card write
    /// the range.
    ReadOnly {
        /// The first read-only address.
        va: VirtAddr,
    },
    /// The page has no frame (never touched, or swapped out): it was not pinned.
    NotPresent {
        /// An address in the page.
        va: VirtAddr,
    },
    /// The page is present but its frame number reads as 0: the process lacks
    /// CAP_SYS_ADMIN, without which the kernel hides frame numbers.
    PfnHidden {
        /// An address in the page.
        va: VirtAddr,
    },
    /// A translation page is not one physically contiguous, aligned block, so the card
    /// cannot reach it through a single page-table entry.
    NotContiguous {
        /// The translation page's first address.
        va: VirtAddr,
        /// The translation page size.
        page: PageSize,
    },
    /// The range is ordinary memory and `vm.compact_unevictable_allowed` is 1: memory
    /// compaction may move its frames while the card uses them.
    Movable {
        /// Start.
        va: VirtAddr,
        /// Length.
        len: u64,
    },
    /// `mlock` refused: the range exceeds RLIMIT_MEMLOCK and the process lacks
    /// CAP_IPC_LOCK.
    LockLimit {
        /// Start.
        va: VirtAddr,
        /// Length.
        len: u64,
        /// RLIMIT_MEMLOCK in bytes.
        limit: u64,
    },
    /// `mlock` failed for another reason.
    Lock {
        /// Start.
        va: VirtAddr,
        /// Length.
        len: u64,
        /// The OS error number.
        errno: i32,
    },
}

/// How an unmodified program that mallocs its buffers gets hugetlb memory.
pub const HUGEALLOC_HINT: &str = "an unmodified program that mallocs its buffers runs with the \
    workspace's hugepage allocator: `LD_PRELOAD=target/release/libbluerdma_hugealloc.so` \
    (`cargo build --release -p bluerdma-hugealloc`)";

/// The command that grants a program the two capabilities registration needs.
const SETCAP: &str = "sudo setcap cap_sys_admin,cap_ipc_lock+ep <program>";

impl fmt::Display for UmemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UmemError::BadRange { va, len } => {
                write!(f, "range {:#x}+{len:#x} wraps the address space", va.0)
            }
            UmemError::Proc { path, errno } => write!(
                f,
                "cannot read {}: {}",
                path.display(),
                std::io::Error::from_raw_os_error(*errno)
            ),
            UmemError::NotMapped { va } => {
                write!(f, "address {:#x} is not mapped in this process", va.0)
            }
            UmemError::ReadOnly { va } => write!(
                f,
                "address {:#x} is read-only in this process, and the registration lets the \
                 card write it (LOCAL_WRITE, REMOTE_WRITE or REMOTE_ATOMIC)",
                va.0
            ),
            UmemError::NotPresent { va } => write!(
                f,
                "the page at {:#x} has no frame (not touched or swapped out); pin it first",
                va.0
            ),
            UmemError::PfnHidden { va } => write!(
                f,
                "the frame number of {:#x} reads as 0 in /proc/self/pagemap: reading physical \
                 addresses needs CAP_SYS_ADMIN; run as root or `{SETCAP}`",
                va.0
            ),
            UmemError::NotContiguous { va, page } => write!(
                f,
                "the {} KiB page at {:#x} is not physically contiguous: with {} KiB translation \
                 pages register hugetlb memory (mmap with MAP_HUGETLB, or a file on hugetlbfs; \
                 `echo 512 > /proc/sys/vm/nr_hugepages` reserves 1 GiB); {HUGEALLOC_HINT}",
                page.bytes() / 1024,
                va.0,
                page.bytes() / 1024
            ),
            UmemError::Movable { va, len } => write!(
                f,
                "cannot pin {len:#x} bytes at {:#x} so that they stay put: it is not hugetlb \
                 memory and vm.compact_unevictable_allowed is 1, so memory compaction may move \
                 its frames under the card; run `sudo sysctl -w vm.compact_unevictable_allowed=0` \
                 or register hugetlb memory ({HUGEALLOC_HINT})",
                va.0
            ),
            UmemError::LockLimit { va, len, limit } => write!(
                f,
                "cannot pin {len:#x} bytes at {:#x}: RLIMIT_MEMLOCK is {limit} bytes and the \
                 process lacks CAP_IPC_LOCK; raise the limit (`ulimit -l unlimited`, or \
                 `* - memlock unlimited` in /etc/security/limits.conf), run as root, or \
                 `{SETCAP}`",
                va.0
            ),
            UmemError::Lock { va, len, errno } => write!(
                f,
                "mlock of {len:#x} bytes at {:#x} failed: {}",
                va.0,
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

impl std::error::Error for UmemError {}

impl From<&UmemError> for PlatformError {
    fn from(e: &UmemError) -> Self {
        match *e {
            UmemError::BadRange { va, .. } | UmemError::NotMapped { va } => {
                PlatformError::NotMapped { va }
            }
            UmemError::ReadOnly { va } => PlatformError::ReadOnly { va },
            UmemError::NotPresent { va } => PlatformError::NotMapped { va },
            UmemError::PfnHidden { .. } => PlatformError::NotPermitted,
            UmemError::NotContiguous { .. } => PlatformError::Unsupported,
            UmemError::Movable { va, .. } | UmemError::LockLimit { va, .. } => {
                PlatformError::PinFailed { va }
            }
            UmemError::Lock { errno, .. } | UmemError::Proc { errno, .. } => {
                PlatformError::Os(errno)
            }
        }
    }
}

impl From<UmemError> for PlatformError {
    fn from(e: UmemError) -> Self {
        PlatformError::from(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privilege_errors_name_the_capability_and_the_fix() {
        let pfn = UmemError::PfnHidden {
            va: VirtAddr(0x7000),
        }
        .to_string();
        assert!(pfn.contains("CAP_SYS_ADMIN"), "{pfn}");
        assert!(pfn.contains("setcap cap_sys_admin"), "{pfn}");
        let lock = UmemError::LockLimit {
            va: VirtAddr(0x7000),
            len: 1 << 26,
            limit: 8 << 20,
        }
        .to_string();
        assert!(lock.contains("RLIMIT_MEMLOCK is 8388608 bytes"), "{lock}");
        assert!(lock.contains("CAP_IPC_LOCK") && lock.contains("ulimit -l unlimited"));
        let moving = UmemError::Movable {
            va: VirtAddr(0x7000),
            len: 4096,
        }
        .to_string();
        assert!(moving.contains("sysctl -w vm.compact_unevictable_allowed=0"));
        assert!(moving.contains("LD_PRELOAD=target/release/libbluerdma_hugealloc.so"));
        let scattered = UmemError::NotContiguous {
            va: VirtAddr(0x20_0000),
            page: PageSize::Size2M,
        }
        .to_string();
        assert!(scattered.contains("MAP_HUGETLB"), "{scattered}");
        assert!(
            scattered.contains("libbluerdma_hugealloc.so"),
            "{scattered}"
        );
    }

    #[test]
    fn platform_errors_keep_the_address_where_they_can() {
        let va = VirtAddr(0x1234_5000);
        assert_eq!(
            PlatformError::from(UmemError::PfnHidden { va }),
            PlatformError::NotPermitted
        );
        assert_eq!(
            PlatformError::from(UmemError::NotPresent { va }),
            PlatformError::NotMapped { va }
        );
        assert_eq!(
            PlatformError::from(UmemError::Movable { va, len: 1 }),
            PlatformError::PinFailed { va }
        );
    }
}
