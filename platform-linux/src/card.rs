//! The real card's platform: BAR0 registers, DMA memory and host user memory, found and
//! set up in one call ([`open_card`]) for the core's `Device::open`.
//!
//! Opening follows reference-driver.md 1.5 steps 2 and 4, with the checks the reference
//! lacks: the device must not sit behind a translating IOMMU (the card would see I/O
//! virtual addresses, not the physical ones the driver programs), and memory decoding and
//! bus mastering are switched on, since no kernel driver does it for the card.

use std::fmt;

use bluerdma_core::platform::{NoOob, Platform};

use crate::bar::{Bar0, BarError};
use crate::dma::{CardDma, DmaError, HugePageDma, UdmaBuf, UdmaBufConfig};
use crate::paths::SystemPaths;
use crate::pci::{PciDevice, PciError, PciSelector};
use crate::umem::{CompactionPolicy, HostUmem, UmemError};

/// The platform of the real card.
pub struct CardPlatform;

impl Platform for CardPlatform {
    type Regs = Bar0;
    type Dma = CardDma;
    type Mem = HostUmem;
    type Oob = NoOob;
}

/// Where the rings' DMA memory comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DmaSource {
    /// The u-dma-buf buffer.
    Udmabuf(UdmaBufConfig),
    /// Up to this many 2 MiB hugepages.
    HugePages(usize),
    /// The default u-dma-buf buffer if there is one, else up to 4 hugepages.
    Auto,
}

/// How to open the card.
#[derive(Clone, Debug)]
pub struct CardConfig {
    /// Where sysfs, procfs and /dev are.
    pub paths: SystemPaths,
    /// Which PCI device.
    pub selector: PciSelector,
    /// DMA memory for rings and buffers.
    pub dma: DmaSource,
    /// What to do with registrations whose frames compaction could move.
    pub compaction: CompactionPolicy,
}

impl Default for CardConfig {
    fn default() -> Self {
        Self {
            paths: SystemPaths::default(),
            selector: PciSelector::default(),
            dma: DmaSource::Auto,
            compaction: CompactionPolicy::Refuse,
        }
    }
}

/// Everything the core's `Device::open` needs from this platform, and the device.
pub struct CardParts {
    /// The PCI device.
    pub device: PciDevice,
    /// BAR0.
    pub regs: Bar0,
    /// DMA memory.
    pub dma: CardDma,
    /// User memory.
    pub mem: HostUmem,
}

/// Why the card could not be opened.
#[derive(Debug)]
pub enum CardError {
    /// Finding or setting up the PCI device.
    Pci(PciError),
    /// The device is behind a translating IOMMU.
    Iommu {
        /// The IOMMU group type.
        group_type: String,
    },
    /// Mapping BAR0.
    Bar(BarError),
    /// Setting up DMA memory.
    Dma(DmaError),
    /// Opening the page map.
    Umem(UmemError),
}

impl fmt::Display for CardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CardError::Pci(e) => write!(f, "{e}"),
            CardError::Iommu { group_type } => write!(
                f,
                "the card is behind an IOMMU in translating mode ({group_type}); the driver \
                 programs physical addresses: boot with `iommu=pt`, or set the group type to \
                 identity (run `bluerdma-doctor`)"
            ),
            CardError::Bar(e) => write!(f, "{e}"),
            CardError::Dma(e) => write!(f, "{e}"),
            CardError::Umem(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CardError {}

/// Finds the card, enables it and its bus mastering, maps BAR0, and sets up DMA and user
/// memory.
pub fn open_card(cfg: &CardConfig) -> Result<CardParts, CardError> {
    let device = PciDevice::open(&cfg.paths, cfg.selector).map_err(CardError::Pci)?;
    let group = device.iommu_group_type();
    if !PciDevice::iommu_passes_physical(group.as_deref()) {
        return Err(CardError::Iommu {
            group_type: group.unwrap_or_default(),
        });
    }
    if !device.is_enabled().map_err(CardError::Pci)? {
        device.enable().map_err(CardError::Pci)?;
    }
    device.enable_bus_master().map_err(CardError::Pci)?;
    let regs = Bar0::map(&device.resource0()).map_err(CardError::Bar)?;
    let dma = match &cfg.dma {
        DmaSource::Udmabuf(u) => {
            CardDma::Udmabuf(UdmaBuf::open(&cfg.paths, u).map_err(CardError::Dma)?)
        }
        DmaSource::HugePages(n) => {
            CardDma::HugePages(HugePageDma::new(&cfg.paths, *n).map_err(CardError::Dma)?)
        }
        DmaSource::Auto => match UdmaBuf::open(&cfg.paths, &UdmaBufConfig::default()) {
            Ok(u) => CardDma::Udmabuf(u),
            Err(e) => {
                log::info!("{e}; using hugepages for DMA memory");
                CardDma::HugePages(HugePageDma::new(&cfg.paths, 4).map_err(CardError::Dma)?)
            }
        },
    };
    let mem = HostUmem::with(cfg.paths.clone(), cfg.compaction).map_err(CardError::Umem)?;
    Ok(CardParts {
        device,
        regs,
        dma,
        mem,
    })
}
