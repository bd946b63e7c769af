//! A fake PCI card served to another process (`bluerdma-sim pci-serve --root DIR`): the
//! driver's unchanged production code for the real card (PCI discovery in sysfs, enable
//! and bus master, BAR0 mmap with barriers, u-dma-buf, mlock + pagemap translation) runs
//! against it, with the emulated NIC behind the BAR and doing the DMA.
//!
//! - [`tree`]: the sysfs tree under the root the driver is pointed at (`+pci;root=DIR`).
//! - [`bar`]: `resource0`, a file both processes map, mirrored to the model's registers.
//! - [`phys`]: DMA by physical address: the u-dma-buf window from its shared file, the
//!   memory of the driver (or of a shared device's daemon and each of its clients)
//!   through their page maps and `process_vm_readv`/`writev`.
//!
//! What it proves: the driver's real-card path end to end (sysfs, BAR access and its
//! barriers, DMA memory at bus addresses, pinning, frame translation, 2 MiB contiguity)
//! with the same engine and the same card model as every other test. What it does not:
//! PCIe itself (posted-write ordering, read completions, the link), the IOMMU, the real
//! card's timing, or cache coherence of a non-x86 host; and the BAR is polled (up to
//! 200 us per doorbell when idle), so its latency is not the card's. It needs root (page
//! map frame numbers, `/proc/iomem`, another process's memory).

pub mod bar;
pub mod phys;
pub mod tree;

use std::fs::OpenOptions;
use std::io;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::link::LinkPort;
use crate::model::regs::RegisterFile;
use crate::model::{Nic, NicConfig};

pub use tree::FakeTree;

/// Maps `len` bytes of `file` shared with the other processes that map it (the driver).
/// The caller owns the mapping and unmaps it.
fn map_shared(file: &std::fs::File, len: usize) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of an open file at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap: null"))
}

/// How to serve a fake card.
#[derive(Clone, Debug)]
pub struct FakePciConfig {
    /// The root of the fake tree.
    pub root: PathBuf,
    /// The PCI function's address.
    pub bdf: String,
    /// The u-dma-buf buffer's length (the engine's rings and buffers need about 4 MiB).
    pub udmabuf_len: u64,
    /// The card model.
    pub nic: NicConfig,
}

impl FakePciConfig {
    /// A card at 0000:3b:00.0 under `root` with an 8 MiB u-dma-buf buffer.
    pub fn new(root: PathBuf) -> Self {
        FakePciConfig {
            root,
            bdf: "0000:3b:00.0".into(),
            udmabuf_len: 8 << 20,
            nic: NicConfig::default(),
        }
    }
}

/// A served fake card; dropping it stops the mirror and the model (the tree stays).
pub struct FakePciCard {
    // Field order: the mirror stops before the model.
    _mirror: bar::BarMirror,
    nic: Nic,
    tree: FakeTree,
}

impl FakePciCard {
    /// Builds the tree and starts the model on `link`.
    pub fn start(cfg: &FakePciConfig, link: Box<dyn LinkPort>) -> io::Result<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "pci-serve needs root: it reads /proc/iomem, the driver's page map and the \
                 driver's memory",
            ));
        }
        let phys = tree::fake_phys_base()?;
        let tree = tree::build(&cfg.root, &cfg.bdf, phys, cfg.udmabuf_len)?;
        let open = |path: &std::path::Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        };
        let regs = Arc::new(RegisterFile::new());
        let bar = bar::SharedBar::map(&open(&tree.resource0)?, tree::BAR0_LEN as usize)?;
        let len = usize::try_from(tree.udmabuf_len).map_err(io::Error::other)?;
        let window = Arc::new(phys::Window::map(&open(&tree.udmabuf)?, len, phys)?);
        // As the driver's `/proc/PID/maps` names them.
        let card_files = [
            std::fs::canonicalize(&tree.resource0)?,
            std::fs::canonicalize(&tree.udmabuf)?,
        ];
        let owners = Arc::new(std::sync::RwLock::new(phys::Owners::default()));
        let port = || {
            Box::new(phys::PhysDma::new(
                Arc::clone(&window),
                &card_files,
                Arc::clone(&owners),
            ))
        };
        let nic = Nic::spawn(cfg.nic.clone(), Arc::clone(&regs), port(), port(), link)?;
        let mirror = bar::BarMirror::start(bar, regs, &cfg.nic.name)?;
        log::info!(
            "{}: fake PCI card {} under {}, u-dma-buf at {phys:#x}",
            cfg.nic.name,
            tree.bdf,
            tree.root.display()
        );
        Ok(FakePciCard {
            _mirror: mirror,
            nic,
            tree,
        })
    }

    /// The tree the driver reads.
    pub fn tree(&self) -> &FakeTree {
        &self.tree
    }

    /// The running model.
    pub fn nic(&self) -> &Nic {
        &self.nic
    }
}
