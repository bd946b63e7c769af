//! PCI discovery over a fake sysfs tree: by IDs (default and configured), by address,
//! ambiguity, BAR0's resource line, and the command register's bus-master bit.

mod common;

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::Counter;
use bluerdma_linux::bar::Bar0;
use bluerdma_linux::pci::{
    PciAddress, PciDevice, PciError, PciId, PciSelector, COMMAND_BUS_MASTER, COMMAND_MEMORY,
};
use common::fake_sysfs::FakeSystem;

#[test]
fn the_card_is_found_by_its_ids_among_other_devices() {
    let sys = FakeSystem::new();
    sys.pci_device("0000:00:00.0", 0x8086, 0x1237, 0x0007);
    sys.pci_device("0000:00:01.0", 0x1af4, 0x1000, 0x0007);
    sys.pci_device("0000:3b:00.0", 0x1172, 0x0000, 0x0000);
    let dev = PciDevice::open(&sys.paths, PciSelector::default()).unwrap();
    assert_eq!(dev.address().to_string(), "0000:3b:00.0");
    assert_eq!(dev.id(), PciId::BLUE_RDMA);
    assert_eq!(dev.resource0(), dev.dir().join("resource0"));
    let bar = dev.bar(0).unwrap();
    assert_eq!((bar.start, bar.len), (0xfe00_0000, 0x1_0000));
    assert_eq!(dev.bar(1).unwrap().len, 0);
    assert!(dev.is_enabled().unwrap());
    // The BAR maps and answers.
    let regs = Bar0::map(&dev.resource0()).unwrap();
    assert_eq!(regs.read32(Counter::EthRdma.reg()), 0);

    // Configured IDs and an explicit address.
    let other = PciDevice::open(&sys.paths, PciSelector::Id("1af4:1000".parse().unwrap())).unwrap();
    assert_eq!(other.address().to_string(), "0000:00:01.0");
    let at: PciAddress = "00:00.0".parse().unwrap();
    let host = PciDevice::open(&sys.paths, PciSelector::Address(at)).unwrap();
    assert_eq!(
        host.id(),
        PciId {
            vendor: 0x8086,
            device: 0x1237
        }
    );
}

#[test]
fn missing_and_ambiguous_cards_say_what_to_do() {
    let sys = FakeSystem::new();
    sys.pci_device("0000:00:00.0", 0x8086, 0x1237, 0x0007);
    let e = PciDevice::open(&sys.paths, PciSelector::default()).unwrap_err();
    assert!(matches!(e, PciError::NotFound { .. }));
    let text = e.to_string();
    assert!(
        text.contains("1172:0000") && text.contains("lspci -nn -d 1172:"),
        "{text}"
    );

    sys.pci_device("0000:3b:00.0", 0x1172, 0x0000, 0);
    sys.pci_device("0000:af:00.0", 0x1172, 0x0000, 0);
    let text = PciDevice::open(&sys.paths, PciSelector::default())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("0000:3b:00.0, 0000:af:00.0") && text.contains("--bdf"),
        "{text}"
    );

    let nowhere: PciAddress = "0000:99:00.0".parse().unwrap();
    let text = PciDevice::open(&sys.paths, PciSelector::Address(nowhere))
        .unwrap_err()
        .to_string();
    assert!(text.contains("no PCI device at 0000:99:00.0"), "{text}");
}

#[test]
fn bus_mastering_is_switched_on_without_touching_other_bits() {
    let sys = FakeSystem::new();
    sys.pci_device("0000:3b:00.0", 0x1172, 0x0000, 0x0400); // INTx disabled, nothing else
    let dev = PciDevice::open(&sys.paths, PciSelector::default()).unwrap();
    assert_eq!(dev.command().unwrap(), 0x0400);
    let cmd = dev.enable_bus_master().unwrap();
    assert_eq!(cmd, 0x0400 | COMMAND_MEMORY | COMMAND_BUS_MASTER);
    assert_eq!(dev.command().unwrap(), cmd);
    let config = std::fs::read(dev.dir().join("config")).unwrap();
    assert_eq!(&config[0..4], &[0x72, 0x11, 0x00, 0x00], "IDs untouched");
    assert_eq!(config.len(), 256);
}

#[test]
fn a_device_without_iommu_group_uses_physical_addresses() {
    let sys = FakeSystem::new();
    let d = sys.pci_device("0000:3b:00.0", 0x1172, 0x0000, 0);
    let dev = PciDevice::open(&sys.paths, PciSelector::default()).unwrap();
    assert_eq!(dev.iommu_group_type(), None);
    std::fs::create_dir_all(d.join("iommu_group")).unwrap();
    std::fs::write(d.join("iommu_group/type"), "DMA-FQ\n").unwrap();
    assert_eq!(dev.iommu_group_type().as_deref(), Some("DMA-FQ"));
    assert!(!PciDevice::iommu_passes_physical(
        dev.iommu_group_type().as_deref()
    ));
}
