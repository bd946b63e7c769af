//! The PCI card as a backend: [`crate::card::open_card`] (sysfs discovery, enable and bus
//! master, BAR0 mmap with barriers, u-dma-buf or hugepage DMA, mlock + pagemap), a check
//! that BAR0 answers, and each failure turned into the errno and the fix a card owner can
//! act on. The same code drives the fake card of `bluerdma-sim pci-serve` (a sysfs tree
//! under a root directory whose BAR and DMA another process serves).
//!
//! A process that shares the card through its daemon (which opened it with [`open`]) takes
//! only the memory parts, [`client_memory`].

use std::path::PathBuf;
use std::sync::Arc;

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::Counter;

use super::{
    register_counters, Backend, BackendHandle, BackendKind, BufferKind, DynDma, DynMem, DynRegs,
    OpenError, Tuning,
};
use crate::bar::BarError;
use crate::card::{open_card, CardConfig, CardError, DmaSource};
use crate::dma::{DmaError, HugePageDma, UdmaBufConfig};
use crate::paths::SystemPaths;
use crate::pci::{PciDevice, PciError, PciSelector};
use crate::umem::{CompactionPolicy, HostUmem, UmemError};

/// How to open the card of one device entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciConfig {
    /// Which PCI function (`None`: the only one with the card's IDs).
    pub selector: Option<PciSelector>,
    /// The u-dma-buf buffer for DMA memory (`None` with no `hugepages`: `udmabuf0` if it
    /// exists, else hugepages).
    pub udmabuf: Option<String>,
    /// Take DMA memory from up to this many 2 MiB hugepages instead.
    pub hugepages: Option<usize>,
    /// A directory holding `sys`, `proc` and `dev` to use instead of the real ones (the
    /// fake card of `bluerdma-sim pci-serve`).
    pub root: Option<PathBuf>,
}

impl PciConfig {
    /// The card configuration of `open_card`.
    pub fn card_config(&self) -> CardConfig {
        CardConfig {
            paths: self
                .root
                .as_deref()
                .map(SystemPaths::under)
                .unwrap_or_default(),
            selector: self.selector.unwrap_or_default(),
            dma: match (&self.udmabuf, self.hugepages) {
                (Some(name), _) => DmaSource::Udmabuf(UdmaBufConfig {
                    name: name.clone(),
                    ..UdmaBufConfig::default()
                }),
                (None, Some(n)) => DmaSource::HugePages(n),
                (None, None) => DmaSource::Auto,
            },
            compaction: CompactionPolicy::Refuse,
        }
    }
}

/// Keeps the PCI device and reads its counters.
struct Handle {
    device: PciDevice,
    regs: DynRegs,
}

impl BackendHandle for Handle {
    fn card_stats(&self) -> String {
        format!(
            "{} {}",
            self.device.address(),
            register_counters(self.regs.0.as_ref())
        )
    }
}

/// Opens the card for device `name`.
pub fn open(name: &str, cfg: &PciConfig) -> Result<Backend, OpenError> {
    open_with(name, &cfg.card_config())
}

/// Opens the card `card` describes for device `name` (what `bluerdma-doctor` checks too).
pub fn open_with(name: &str, card: &CardConfig) -> Result<Backend, OpenError> {
    let parts = open_card(card).map_err(|e| classify(name, card, &e))?;
    // A card that is not there (bitstream not loaded, link down) answers every read with
    // all ones: say so now rather than time out on the first command.
    let probe = parts.regs.read32(Counter::EthRdma.reg());
    if probe == u32::MAX {
        return Err(OpenError::new(
            name,
            libc::ENODEV,
            format!(
                "BAR0 of {} reads 0xFFFFFFFF: the card does not answer (bitstream not loaded, \
                 PCIe link down, or memory decoding off); reload the bitstream, then \
                 `echo 1 | sudo tee {}/remove && echo 1 | sudo tee /sys/bus/pci/rescan`, \
                 and run `bluerdma-doctor`",
                parts.device.address(),
                parts.device.dir().display()
            ),
        ));
    }
    let regs = DynRegs(Arc::new(parts.regs));
    Ok(Backend {
        kind: BackendKind::Pci,
        regs: regs.clone(),
        dma: DynDma(Box::new(parts.dma)),
        mem: DynMem(Box::new(parts.mem)),
        tuning: Tuning::CARD,
        buffers: BufferKind::HugePages,
        handle: Box::new(Handle {
            device: parts.device,
            regs,
        }),
        inline: None,
    })
}

/// Hugepages a process sharing the card takes for its engine's DMA buffers unless the entry
/// says `hugepages=N` (it needs two or three; they are mapped as needed).
pub const SHARED_DMA_PAGES: usize = 4;

/// The memory parts of a process that shares the card through its daemon, which owns BAR0:
/// DMA buffers from this process's own 2 MiB hugepages (`hugepages=N` of the entry, else
/// [`SHARED_DMA_PAGES`]; never the u-dma-buf buffer, which the daemon holds and which every
/// process that can open its node could map) and the resolver that pins user memory and
/// translates it through this process's page map. Both give bus addresses, which the
/// client claims ([`crate::shared::proto::Request::Claim`]).
pub fn client_memory(name: &str, cfg: &PciConfig) -> Result<(HugePageDma, HostUmem), OpenError> {
    let card = cfg.card_config();
    if cfg.udmabuf.is_some() {
        log::info!(
            "{name}: a process sharing the card takes hugepages for its DMA buffers, not the \
             u-dma-buf buffer (the daemon's)"
        );
    }
    let dma = HugePageDma::new(&card.paths, cfg.hugepages.unwrap_or(SHARED_DMA_PAGES))
        .map_err(|e| classify(name, &card, &CardError::Dma(e)))?;
    let mem = HostUmem::with(card.paths.clone(), card.compaction)
        .map_err(|e| classify(name, &card, &CardError::Umem(e)))?;
    Ok((dma, mem))
}

/// The errno of an I/O error: EACCES for a missing privilege, else the OS's own.
fn io_errno(e: &std::io::Error, otherwise: i32) -> i32 {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => libc::EACCES,
        std::io::ErrorKind::NotFound => libc::ENODEV,
        _ => e.raw_os_error().unwrap_or(otherwise),
    }
}

fn umem_errno(e: &UmemError) -> i32 {
    match e {
        UmemError::PfnHidden { .. } => libc::EACCES,
        UmemError::Proc { errno, .. } if *errno == libc::EPERM => libc::EACCES,
        UmemError::Proc { errno, .. } => *errno,
        UmemError::LockLimit { .. } => libc::ENOMEM,
        _ => libc::EIO,
    }
}

/// The errno and message of a failed `open_card`.
pub fn classify(name: &str, cfg: &CardConfig, e: &CardError) -> OpenError {
    let errno = match e {
        CardError::Pci(p) => match p {
            PciError::NoPciBus { .. } | PciError::NotFound { .. } => libc::ENODEV,
            PciError::NoSuchAddress { .. } => libc::ENODEV,
            PciError::Ambiguous { .. } => libc::EINVAL,
            PciError::Attribute { source, .. } => io_errno(source, libc::EIO),
            PciError::Malformed { .. } => libc::EIO,
        },
        // The card cannot reach the physical addresses the driver programs.
        CardError::Iommu { .. } => libc::ENODEV,
        CardError::Bar(b) => match b {
            BarError::Open { source, .. } => io_errno(source, libc::EIO),
            BarError::TooSmall { .. } => libc::ENODEV,
            BarError::Map { source, .. } if source.raw_os_error() == Some(libc::EPERM) => {
                libc::EACCES
            }
            BarError::Map { source, .. } => io_errno(source, libc::EIO),
        },
        CardError::Dma(d) => match d {
            DmaError::Attribute { .. } => libc::ENODEV,
            DmaError::Open { source, .. } => io_errno(source, libc::EIO),
            DmaError::NoHugepages | DmaError::NotContiguous { .. } => libc::ENOMEM,
            DmaError::Map { source, .. } => source.raw_os_error().unwrap_or(libc::ENOMEM),
            DmaError::Umem(u) => umem_errno(u),
            DmaError::Malformed { .. } => libc::EIO,
        },
        CardError::Umem(u) => umem_errno(u),
    };
    let mut message = format!("the PCI card: {e}");
    if matches!(
        (&cfg.dma, e),
        (DmaSource::Auto, CardError::Dma(DmaError::NoHugepages))
    ) {
        message.push_str(&format!(
            "; nor is there a u-dma-buf buffer ({}): load the module with one \
             (`sudo modprobe u-dma-buf udmabuf0=4194304`) or reserve hugepages",
            cfg.paths.udmabuf_class().join("udmabuf0").display()
        ));
    }
    OpenError::new(name, errno, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::path::Path;

    fn err(e: CardError) -> OpenError {
        classify("blue0", &CardConfig::default(), &e)
    }

    #[test]
    fn each_failure_has_the_errno_a_card_owner_can_act_on() {
        let denied = || io::Error::from_raw_os_error(libc::EACCES);
        let cases: Vec<(CardError, i32, &str)> = vec![
            (
                CardError::Bar(BarError::Open {
                    path: "/sys/bus/pci/devices/0000:3b:00.0/resource0".into(),
                    source: denied(),
                }),
                libc::EACCES,
                "needs root",
            ),
            (
                CardError::Pci(PciError::NotFound {
                    id: crate::pci::PciId::BLUE_RDMA,
                    path: "/sys/bus/pci/devices".into(),
                }),
                libc::ENODEV,
                "bitstream loaded",
            ),
            (
                CardError::Pci(PciError::Attribute {
                    path: "/sys/bus/pci/devices/0000:3b:00.0/enable".into(),
                    source: denied(),
                }),
                libc::EACCES,
                "run as root",
            ),
            (
                CardError::Iommu {
                    group_type: "DMA-FQ".into(),
                },
                libc::ENODEV,
                "iommu=pt",
            ),
            (
                CardError::Dma(DmaError::NoHugepages),
                libc::ENOMEM,
                "modprobe u-dma-buf",
            ),
            (
                CardError::Dma(DmaError::Open {
                    path: "/dev/udmabuf0".into(),
                    source: denied(),
                }),
                libc::EACCES,
                "chmod 0666",
            ),
            (
                CardError::Dma(DmaError::Attribute {
                    path: "/sys/class/u-dma-buf/udmabuf1/phys_addr".into(),
                    source: io::Error::from_raw_os_error(libc::ENOENT),
                }),
                libc::ENODEV,
                "u-dma-buf module loaded",
            ),
            (
                CardError::Dma(DmaError::Umem(UmemError::PfnHidden {
                    va: bluerdma_core::addr::VirtAddr(0x7000),
                })),
                libc::EACCES,
                "CAP_SYS_ADMIN",
            ),
        ];
        for (e, errno, fix) in cases {
            let o = err(e);
            assert_eq!(o.errno, errno, "{o}");
            assert!(o.message.contains(fix), "`{fix}` not in: {o}");
            assert!(o.to_string().starts_with("blue0: the PCI card: "), "{o}");
        }
    }

    #[test]
    fn a_missing_card_in_a_tree_is_enodev_naming_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
        let cfg = PciConfig {
            root: Some(dir.path().to_owned()),
            ..PciConfig::default()
        };
        let e = open("blue1", &cfg).unwrap_err();
        assert_eq!(e.errno, libc::ENODEV, "{e}");
        assert!(
            e.message.contains(
                &Path::new(dir.path())
                    .join("sys/bus/pci/devices")
                    .display()
                    .to_string()
            ),
            "{e}"
        );
    }
}
